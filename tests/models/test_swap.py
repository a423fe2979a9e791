"""swap_attention: hosts, masks, pretrained initialisation, gaps, errors."""

import math

import pytest
import torch
from torch import nn

from gpattn_ppl import settings
from gpattn_ppl.attention import ATTENTION, SoftmaxWeights, init_from_softmax
from gpattn_ppl.models import TextClassifier
from gpattn_ppl.models.swap import find_attention_layers, key_mask, swap_attention

transformers = pytest.importorskip("transformers")

C, H, V = 16, 4, 60
ALL_KINDS = sorted(ATTENTION)
#: small options so every unit runs on the tiny hosts
SMALL = {"sgpa": {"num_inducing": 3}, "kep_svgp": {"rank": 3}, "scgpt": {"num_inducing": 3},
         "h_gumbel": {"num_centroids": 3}}


def tiny_bert(attn=None, seed=0):
    """A tiny random BERT; ``attn``: its attention implementation (default: transformers')."""
    torch.manual_seed(seed)
    cfg = transformers.BertConfig(vocab_size=V, hidden_size=C, num_hidden_layers=2,
                                  num_attention_heads=H, intermediate_size=32,
                                  max_position_embeddings=32, attn_implementation=attn)
    return transformers.BertModel(cfg).eval()


def _version(text: str) -> tuple[int, int]:
    major, minor = text.split(".")[:2]
    return int(major), int(minor)


#: BERT's attention implementations in the installed transformers (sdpa from 4.41 on)
BERT_ATTN = (["sdpa"] if _version(transformers.__version__) >= (4, 41) else []) + ["eager"]


def test_bert_sdpa_exists_exactly_from_transformers_4_41():
    """The version boundary BERT_ATTN assumes: before 4.41 BertModel refuses sdpa."""
    if "sdpa" in BERT_ATTN:
        assert tiny_bert("sdpa").config._attn_implementation == "sdpa"
    else:
        with pytest.raises(ValueError, match="does not support"):
            tiny_bert("sdpa")


def tiny_distilbert(seed=0):
    torch.manual_seed(seed)
    cfg = transformers.DistilBertConfig(vocab_size=V, dim=C, n_layers=2, n_heads=H,
                                        hidden_dim=32, max_position_embeddings=32)
    return transformers.DistilBertModel(cfg).eval()


def batch(B=3, N=7, seed=1):
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(1, V, (B, N), generator=g)
    lengths = torch.tensor([N, N - 2, 3])[:B]
    mask = torch.arange(N)[None] < lengths[:, None]
    ids = ids.masked_fill(~mask, 0)
    return {"input_ids": ids, "attention_mask": mask.long()}


def hidden(model, enc):
    with torch.no_grad(), settings.posterior_mean():
        return model(**enc).last_hidden_state


@pytest.mark.parametrize("attn", BERT_ATTN)
def test_softmax_swap_reproduces_bert_exactly(attn):
    """Swapping softmax for softmax with init='pretrained' changes nothing: the weights are read
    right and the host's 4-D mask (bool for sdpa, additive for eager) becomes the key mask."""
    model, enc = tiny_bert(attn), batch()
    ref = hidden(model, enc)
    records = swap_attention(model, "softmax", layers=[0, 1], calibration=enc)
    out = hidden(model, enc)
    real = enc["attention_mask"].bool()
    torch.testing.assert_close(out[real], ref[real], atol=1e-5, rtol=1e-5)
    assert [r["path"] for r in records] == ["encoder.layer.0.attention.unit",
                                            "encoder.layer.1.attention.unit"]
    assert all(r["gap_mean"] < 1e-5 and r["host"] == "bert" for r in records)


def test_softmax_weights_output_matches_bert_attention():
    model, enc = tiny_bert(), batch()
    layer = find_attention_layers(model)[-1]
    seen = {}
    layer.module.register_forward_pre_hook(
        lambda m, a, k: seen.update(x=a[0], m=a[1] if len(a) > 1 else k.get("attention_mask")),
        with_kwargs=True)
    with torch.no_grad():
        full = model(**enc)
        x = seen["x"]
        mask = key_mask(seen["m"], *x.shape[:2], "test")
        ref = layer.module(x, seen["m"])[0]
        mine = layer.module.output.LayerNorm(x + layer.weights().output(x, mask))
    assert full is not None
    real = enc["attention_mask"].bool()
    torch.testing.assert_close(mine[real], ref[real], atol=1e-5, rtol=1e-5)


def test_softmax_swap_reproduces_distilbert_exactly():
    model, enc = tiny_distilbert(), batch()
    ref = hidden(model, enc)
    records = swap_attention(model, "softmax", layers=[-1], calibration=enc)
    out = hidden(model, enc)
    real = enc["attention_mask"].bool()
    torch.testing.assert_close(out[real], ref[real], atol=1e-5, rtol=1e-5)
    assert records[0]["host"] == "distilbert"


def test_softmax_swap_reproduces_vit_exactly():
    """HF ViT (no mask; q_proj/k_proj/v_proj/o_proj on transformers >= 5, attention.query/key/
    value + output.dense before): exact for softmax, runs for a GP unit."""
    torch.manual_seed(0)
    cfg = transformers.ViTConfig(image_size=8, patch_size=4, hidden_size=C, num_hidden_layers=2,
                                 num_attention_heads=H, intermediate_size=32)
    model = transformers.ViTModel(cfg).eval()
    pixels = torch.randn(2, 3, 8, 8)
    with torch.no_grad():
        ref = model(pixel_values=pixels).last_hidden_state
    rec = swap_attention(model, "softmax", layers=[0, -1], calibration={"pixel_values": pixels})
    assert rec[0]["host"] in ("qkvo", "vit") and rec[0]["gap_mean"] < 1e-5
    with torch.no_grad():
        torch.testing.assert_close(model(pixel_values=pixels).last_hidden_state, ref,
                                   atol=1e-5, rtol=1e-5)
    rec = swap_attention(model, "kep_svgp", layers=[-1], init="random", rank=3)
    with torch.no_grad(), settings.posterior_mean():
        assert model(pixel_values=pixels).last_hidden_state.shape == ref.shape


@pytest.mark.filterwarnings("ignore:The PyTorch API of nested tensors")  # the unswapped reference
@pytest.mark.parametrize("batch_first", [True, False])
def test_softmax_swap_reproduces_torch_encoder(batch_first):
    torch.manual_seed(0)
    layer = nn.TransformerEncoderLayer(C, H, 32, dropout=0.0, batch_first=batch_first)
    # the default, nested tensors enabled (batch-first only: torch warns otherwise)
    enc = nn.TransformerEncoder(layer, 2, enable_nested_tensor=batch_first).eval()
    x = torch.randn(3, 7, C)
    pad = torch.zeros(3, 7, dtype=torch.bool)
    pad[1, 5:] = True
    xin = x if batch_first else x.transpose(0, 1)
    with torch.no_grad():
        ref = enc(xin, src_key_padding_mask=pad)
    records = swap_attention(enc, "softmax", layers=[0, -1],
                             calibration=lambda m: m(xin, src_key_padding_mask=pad))
    with torch.no_grad():
        out = enc(xin, src_key_padding_mask=pad)
    real = ~pad if batch_first else (~pad).T
    torch.testing.assert_close(out[real], ref[real], atol=1e-5, rtol=1e-5)
    assert records[0]["host"] == "torch" and records[0]["gap_mean"] < 1e-5


def test_softmax_swap_in_library_classifier():
    torch.manual_seed(0)
    net = TextClassifier(num_classes=2, vocab_size=V, dim=C, depth=2, heads=H, mlp_dim=32,
                         dropout=0.0).eval()
    x = torch.randint(1, V, (3, 6))
    mask = torch.ones(3, 6, dtype=torch.bool)
    mask[2, 4:] = False
    with torch.no_grad():
        ref = net(x, mask)
    records = swap_attention(net, "softmax", layers=[-1], calibration=(x, mask))
    with torch.no_grad():
        torch.testing.assert_close(net(x, mask), ref)
    assert records[0]["path"] == "blocks.1.attn"
    net2 = TextClassifier(num_classes=2, vocab_size=V, dim=C, depth=2, heads=H, mlp_dim=32)
    swap_attention(net2, "sgpa", layers=[-1], num_inducing=3)
    assert type(net2.blocks[1].attn).__name__ == "SGPAttention"
    assert net2.blocks[1].attn.site_prefix == "blocks.1.attn"
    assert "blocks.1.attn" in net2.attention_units()


@pytest.mark.parametrize("kind", ALL_KINDS)
def test_every_kind_swaps_into_bert(kind):
    """Shapes kept, padded keys have no influence on real tokens, the report has a finite gap."""
    model, enc = tiny_bert(), batch()
    records = swap_attention(model, kind, layers=[-1], calibration=enc, **SMALL.get(kind, {}))
    out = hidden(model, enc)
    assert out.shape == (3, 7, C) and torch.isfinite(out).all()
    assert math.isfinite(records[0]["gap_mean"]) and math.isfinite(records[0]["gap_sample"])
    other = dict(enc)
    other["input_ids"] = enc["input_ids"].masked_fill(~enc["attention_mask"].bool(), 5)
    real = enc["attention_mask"].bool()
    torch.testing.assert_close(hidden(model, other)[real], out[real], atol=1e-4, rtol=1e-4)
    unit = model.encoder.layer[1].attention.unit
    assert unit.site_prefix == "encoder.layer.1.attention.unit"


def test_pretrained_init_copies_projections():
    model = tiny_bert()
    w = find_attention_layers(model)[-1].weights()
    D = C // H
    swap_attention(model, "cgpt", layers=[-1])
    u = model.encoder.layer[1].attention.unit
    r = math.sqrt(1 / math.sqrt(D))
    torch.testing.assert_close(u.proj.weight[:C], w.q_weight * r)
    torch.testing.assert_close(u.proj.weight[C:2 * C], w.k_weight * r)
    torch.testing.assert_close(u.proj.weight[2 * C:], w.v_weight)
    torch.testing.assert_close(u.latent.weight, w.k_weight * r)
    torch.testing.assert_close(u.out.weight, w.out_weight)
    torch.testing.assert_close(u.out.bias, w.out_bias + w.out_weight @ w.v_bias)

    model = tiny_bert()
    w = find_attention_layers(model)[0].weights()
    swap_attention(model, "kep_svgp", layers=[0], rank=3)
    feats = model.encoder.layer[0].attention.unit.features
    torch.testing.assert_close(feats.qk.weight, torch.cat([w.q_weight, w.k_weight]))

    model = tiny_bert()
    w = find_attention_layers(model)[0].weights()
    swap_attention(model, "gumbel", layers=[0])
    u = model.encoder.layer[0].attention.unit
    torch.testing.assert_close(u.qkv.weight[:C], w.q_weight / math.sqrt(D))
    torch.testing.assert_close(u.qkv.bias[C:2 * C], w.k_bias)

    model = tiny_bert()
    w = find_attention_layers(model)[0].weights()
    swap_attention(model, "sgpa", layers=[0], num_inducing=3)
    u = model.encoder.layer[0].attention.unit
    torch.testing.assert_close(u.proj.weight[:C], w.q_weight)
    assert u.strategy.inducing_weights.abs().max() == 0


def test_init_random_keeps_the_units_own_init():
    model = tiny_bert()
    w = find_attention_layers(model)[0].weights()
    rec = swap_attention(model, "softmax", layers=[0], init="random")[0]
    u = model.encoder.layer[0].attention.unit
    assert not torch.allclose(u.qkv.weight[:C], w.q_weight)
    assert "copied" not in rec and "gap_mean" not in rec


def test_gumbel_is_exact_at_its_mode_and_kernel_close():
    model, enc = tiny_bert(), batch()
    rec = swap_attention(model, "gumbel", layers=[-1], calibration=enc)[0]
    assert rec["gap_mean"] < 1e-5 and rec["gap_sample"] > 1e-3
    model = tiny_bert()
    with torch.no_grad():       # no q/k biases: the exponential kernel attention is then exact
        for layer in model.encoder.layer:
            layer.attention.self.query.bias.zero_()
            layer.attention.self.key.bias.zero_()
    rec = swap_attention(model, "kernel", layers=[-1], calibration=enc)[0]
    assert rec["gap_mean"] < 1e-5


def test_calibration_shrinks_the_gap():
    """The fitted parameters bring each GP unit closer to the pretrained layer than the copies
    alone (same seed, same unit)."""
    enc = batch(B=3, N=7)
    for kind in ("kep_svgp", "sgpa", "cgpt"):
        opts = SMALL.get(kind, {})
        torch.manual_seed(3)
        m1 = tiny_bert()
        copied = swap_attention(m1, kind, layers=[-1], **opts)
        assert "gap_mean" not in copied[0]
        unit = m1.encoder.layer[1].attention.unit
        # the gap of the copies alone, measured on the same batch
        torch.manual_seed(3)
        m2 = tiny_bert()
        fitted = swap_attention(m2, kind, layers=[-1], calibration=enc, **opts)[0]
        m3 = tiny_bert()
        layer = find_attention_layers(m3)[-1]
        w = layer.weights()
        seen = {}
        layer.module.register_forward_pre_hook(lambda m, a, k, seen=seen: seen.update(a=a),
                                               with_kwargs=True)
        with torch.no_grad():
            m3(**enc)
        x = seen["a"][0]
        mask = key_mask(seen["a"][1], *x.shape[:2], "t")
        with torch.no_grad(), settings.posterior_mean():
            unit.eval()
            ref = w.output(x, mask)
            err = float((unit(x, mask) - ref)[mask].norm() / ref[mask].norm())
        assert fitted["gap_mean"] < err, kind


def test_errors_are_clear():
    model = tiny_bert()
    with pytest.raises(ValueError, match="out of range for 2 attention layers"):
        swap_attention(model, "softmax", layers=[2])
    with pytest.raises(ValueError, match="init must be"):
        swap_attention(model, "softmax", init="warm")
    with pytest.raises(ValueError, match="unknown attention kind|unknown"):
        swap_attention(model, "nope")
    swap_attention(model, "sgpa", layers=[0], num_inducing=3)
    with pytest.raises(ValueError, match="already swapped"):
        swap_attention(model, "kep_svgp", layers=[0])
    swap_attention(model, "softmax", layers=[0], init="random")   # a second swap, random init
    with pytest.raises(ValueError, match="no self-attention layer"):
        swap_attention(nn.Sequential(nn.Linear(3, 3)), "softmax")
    torch.manual_seed(0)
    enc = nn.TransformerEncoder(nn.TransformerEncoderLayer(C, H, 32, batch_first=True), 1,
                                enable_nested_tensor=False)
    swap_attention(enc, "softmax")
    causal = nn.Transformer.generate_square_subsequent_mask(5)
    with pytest.raises(ValueError, match="attn_mask"):
        enc(torch.randn(2, 5, C), mask=causal)
    with pytest.raises(ValueError, match="width"):
        from gpattn_ppl.attention import build_attention
        init_from_softmax(build_attention("softmax", 8, 2),
                          SoftmaxWeights(*(torch.zeros(C, C),) * 4, None, None, None, None,
                                         heads=H))


def test_dropouts_follow_the_host():
    torch.manual_seed(0)
    cfg = transformers.BertConfig(vocab_size=V, hidden_size=C, num_hidden_layers=1,
                                  num_attention_heads=H, intermediate_size=32,
                                  attention_probs_dropout_prob=0.3, hidden_dropout_prob=0.2)
    model = transformers.BertModel(cfg)
    swap_attention(model, "gumbel")
    u = model.encoder.layer[0].attention.unit
    assert u.attn_dropout.p == pytest.approx(0.3) and u.proj_dropout.p == pytest.approx(0.2)
    swap_attention(model, "kep_svgp", init="random", rank=3)
    assert model.encoder.layer[0].attention.unit.proj_dropout.p == pytest.approx(0.2)


@pytest.mark.parametrize("kind", ["sgpa", "cgpt", "scgpt"])
def test_calibration_shrinks_the_noise_of_a_draw(kind):
    """Values x a, W_O / a: the posterior mean is unchanged and one draw's noise is about
    NOISE_TARGET of the pretrained output (triangle inequality on the calibration batch)."""
    from gpattn_ppl.attention.pretrained import NOISE_TARGET

    model, enc = tiny_bert(), batch(B=3, N=7)
    rec = swap_attention(model, kind, layers=[-1], calibration=enc, **SMALL.get(kind, {}))[0]
    assert rec["gap_sample"] <= rec["gap_mean"] + 2 * NOISE_TARGET
    assert any(f.startswith("noise:") for f in rec["fitted"])


def test_a_swap_keeps_the_mode_of_the_model_also_when_swapped_twice():
    """An eval-mode model stays in eval mode: the adapter and the unit (also a second swap of
    the same layer, which replaces the first adapter) are not left training."""
    model = tiny_bert()
    swap_attention(model, "kep_svgp", init="random", **SMALL["kep_svgp"])
    swap_attention(model, "sgpa", init="random", **SMALL["sgpa"])
    assert not any(m.training for m in model.modules())
    model.train()
    swap_attention(model, "kep_svgp", init="random", **SMALL["kep_svgp"])
    assert all(m.training for m in model.modules())
