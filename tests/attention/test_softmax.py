import torch
import torch.nn.functional as F

from gpattn_ppl.attention import SoftmaxAttention
from gpattn_ppl.testing import AttentionUnitTestCase
from tests.reference.attention import softmax_attention_reference


class TestSoftmaxAttention(AttentionUnitTestCase):
    def make_unit(self, dim, heads):
        return SoftmaxAttention(dim, heads)

    def test_matches_naive_reference(self):
        unit = self._unit()
        x, mask = self._inputs()
        out = unit(x, mask)
        W = unit.qkv.weight
        b = unit.qkv.bias
        ref = softmax_attention_reference(x, mask, W, b, unit.heads)
        ref = F.linear(ref, unit.out.weight, unit.out.bias)
        torch.testing.assert_close(out[mask], ref[mask])

    def test_attention_dropout_stays_on_under_mc(self):
        unit = SoftmaxAttention(8, 2, attn_dropout=0.5).double().eval()
        x, mask = self._inputs()
        torch.testing.assert_close(unit(x, mask), unit(x, mask))
        unit.attn_dropout.mc = True
        assert not torch.allclose(unit(x, mask), unit(x, mask))
