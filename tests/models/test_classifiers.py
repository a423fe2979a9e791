import pytest
import torch

from gpattn_ppl.models import TextClassifier, ViTClassifier, build_model
from gpattn_ppl.settings import posterior_mean

SPEC = {"dim": 16, "heads": 2, "depth": 2, "mlp_dim": 16, "dropout": 0.1}


@pytest.fixture(params=["softmax", "kernel"])
def text_model(request):
    torch.manual_seed(0)
    return build_model({**SPEC, "attention": {"kind": request.param}}, num_classes=3,
                       vocab_size=30).double().eval()


def _tokens():
    g = torch.Generator().manual_seed(0)
    x = torch.randint(1, 30, (3, 7), generator=g)
    lengths = torch.tensor([7, 4, 1])
    mask = torch.arange(7)[None] < lengths[:, None]
    return x.masked_fill(~mask, 0), mask


def test_padding_changes_nothing(text_model):
    x, mask = _tokens()
    out = text_model(x, mask)
    x2 = x.clone()
    x2[~mask] = 17  # any token id in the pads
    torch.testing.assert_close(text_model(x2, mask), out)
    # the same sequence without its padding gives the same logits (pooling divides by n_b)
    torch.testing.assert_close(text_model(x[1:2, :4], None), out[1:2])
    torch.testing.assert_close(text_model(x[2:3, :1], None), out[2:3])


def test_bad_text_inputs_are_named(text_model):
    x, mask = _tokens()
    with pytest.raises(ValueError, match="all-padding"):
        text_model(x, torch.zeros_like(mask))
    with pytest.raises(ValueError, match=r"token ids must lie in \[0, 30\)"):
        text_model(x + 100, mask)
    with pytest.raises(ValueError, match="mask must be bool"):
        text_model(x, mask.long())
    with pytest.raises(ValueError, match="expected token ids"):
        text_model(x.double(), mask)
    with pytest.raises(ValueError, match="exceeds max_len"):
        text_model(torch.ones(1, 80, dtype=torch.long), None)


def test_feature_inputs_and_nan():
    torch.manual_seed(0)
    m = TextClassifier(num_classes=2, feature_dim=5, dim=8, heads=2, depth=1, mlp_dim=8).eval()
    f = torch.randn(2, 4, 5)
    assert m(f, torch.ones(2, 4, dtype=torch.bool)).shape == (2, 2)
    f[0, 1, 2] = float("nan")
    with pytest.raises(ValueError, match="NaN"):
        m(f, None)
    with pytest.raises(ValueError, match="exactly one of vocab_size"):
        TextClassifier(num_classes=2, vocab_size=3, feature_dim=5)


def test_vit_shapes_and_errors():
    torch.manual_seed(0)
    m = ViTClassifier(num_classes=10, image_size=8, patch_size=4, dim=8, heads=2, depth=1,
                      mlp_dim=8).eval()
    x = torch.randn(2, 3, 8, 8)
    assert m(x).shape == (2, 10)
    with pytest.raises(ValueError, match=r"expected images \[B, 3, 8, 8\]"):
        m(torch.randn(2, 3, 16, 16))
    with pytest.raises(ValueError, match="take no mask"):
        m(x, torch.ones(2, 4, dtype=torch.bool))
    with pytest.raises(ValueError, match="not a multiple"):
        ViTClassifier(num_classes=2, image_size=10, patch_size=4)


def test_mc_dropout_makes_the_model_stochastic_at_eval():
    torch.manual_seed(0)
    m = build_model({**SPEC, "mc_dropout": True}, num_classes=3, vocab_size=30).double().eval()
    x, mask = _tokens()
    assert m.stochastic
    assert not torch.allclose(m(x, mask), m(x, mask))
    m.set_mc_dropout(False)
    assert not m.stochastic
    torch.testing.assert_close(m(x, mask), m(x, mask))


def test_deterministic_model_ignores_posterior_mean_context(text_model):
    x, mask = _tokens()
    with posterior_mean():
        a = text_model(x, mask)
    torch.testing.assert_close(a, text_model(x, mask))
    assert not text_model.stochastic and text_model.objective_terms() == {}
