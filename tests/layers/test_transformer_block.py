"""TransformerBlock (one deep-GP layer) and MCDropout: the pre-LN residual equations, masks
passed through, and dropout that stays on at evaluation only under MC dropout."""

import torch

from gpattn_ppl.attention import MCDropout, SGPAttention, SoftmaxAttention
from gpattn_ppl.layers import TransformerBlock
from gpattn_ppl.settings import posterior_mean

DT = torch.float64


def _x():
    g = torch.Generator().manual_seed(0)
    x = torch.randn(3, 6, 8, generator=g, dtype=DT)
    mask = torch.ones(3, 6, dtype=torch.bool)
    mask[1, 4:] = False
    return x, mask


def test_block_is_pre_ln_attention_then_mlp_with_residuals():
    torch.manual_seed(0)
    block = TransformerBlock(SoftmaxAttention(8, 2), mlp_dim=16, dropout=0.0).to(DT).eval()
    x, mask = _x()
    h = x + block.attn(block.norm1(x), mask)
    expected = h + block.mlp(block.norm2(h))
    torch.testing.assert_close(block(x, mask), expected)


def test_block_passes_the_mask_so_pads_do_not_reach_real_tokens():
    torch.manual_seed(0)
    block = TransformerBlock(SGPAttention(8, 2, num_inducing=3), mlp_dim=16).to(DT).eval()
    x, mask = _x()
    x2 = x.clone()
    x2[~mask] = 50.0
    with posterior_mean():
        a, b = block(x, mask), block(x2, mask)
    torch.testing.assert_close(a[mask], b[mask])


def test_mc_dropout_is_active_in_training_and_only_under_mc_at_evaluation():
    d = MCDropout(0.5)
    x = torch.ones(1000, dtype=DT)
    d.train()
    assert d.active and (d(x) == 0).any()
    d.eval()
    assert not d.active and torch.equal(d(x), x)
    d.mc = True
    assert d.active and (d(x) == 0).any()
    assert not MCDropout(0.0, mc=True).active        # p = 0 is never stochastic
