"""swap_attention on every host family x every registered kind (tiny random configs).

Each cell swaps the last attention layer with ``init="pretrained"`` and a calibration batch,
then checks the forward (shape, finite), the backward (gradients reach the unit and the host
below it), the padding (changing padded tokens leaves real-token outputs unchanged) and the
gap report. Softmax is exact on every host that is not refused (the weights, scale and mask
are read right); the decoders are refused with their reason. Runs on the newest transformers
and at the floor of ``pyproject.toml`` (``.ci/run``), where ViT's attention has another layout
and ModernBERT does not exist (it is swapped from transformers 5 on).
"""

import math

import pytest
import torch

from gpattn_ppl import settings
from gpattn_ppl.attention import ATTENTION
from gpattn_ppl.models.swap import find_attention_layers, swap_attention

transformers = pytest.importorskip("transformers")

C, H, V, L = 16, 4, 60, 2
ALL_KINDS = sorted(ATTENTION)
#: small options so every unit runs on the tiny hosts
SMALL = {"sgpa": {"num_inducing": 3}, "kep_svgp": {"rank": 3}, "scgpt": {"num_inducing": 3},
         "h_gumbel": {"num_centroids": 3}}
_BERTISH = dict(vocab_size=V, hidden_size=C, num_hidden_layers=L, num_attention_heads=H,
                intermediate_size=32, max_position_embeddings=32)


def _bert():
    return transformers.BertModel(transformers.BertConfig(**_BERTISH))


def _roberta():
    return transformers.RobertaModel(transformers.RobertaConfig(**_BERTISH, pad_token_id=0))


def _electra():
    return transformers.ElectraModel(transformers.ElectraConfig(**_BERTISH, embedding_size=C))


def _albert():
    return transformers.AlbertModel(transformers.AlbertConfig(**_BERTISH, embedding_size=C))


def _deberta(relative=False):
    # relative: weights large enough that the relative terms move the attention visibly
    extra = dict(relative_attention=True, pos_att_type=["c2p", "p2c"], position_buckets=8,
                 position_biased_input=False, initializer_range=0.5) if relative else {}
    return transformers.DebertaV2Model(transformers.DebertaV2Config(**_BERTISH, **extra))


def _deberta_v1(relative=False):
    extra = dict(relative_attention=True, pos_att_type=["c2p", "p2c"],
                 position_biased_input=False, initializer_range=0.5) if relative else {}
    return transformers.DebertaModel(transformers.DebertaConfig(**_BERTISH, **extra))


def _mpnet(bias=False):
    """MPNet; ``bias``: keep its (random) relative-position bias, else zero it, so that a softmax
    swap is exact (the unit drops the bias) and checks the rest of the layer."""
    model = transformers.MPNetModel(transformers.MPNetConfig(
        **_BERTISH, pad_token_id=0, bos_token_id=1, eos_token_id=1,
        initializer_range=0.5 if bias else 0.02))
    if not bias:
        torch.nn.init.zeros_(model.encoder.relative_attention_bias.weight)
    return model


def _modernbert(sliding=False, impl=None, init=0.02):
    """ModernBERT (transformers >= 5): a local (sliding-window, +-2 tokens: it cuts the test's
    7-token rows) layer, then a global one; ``sliding``: the global one local too; ``impl``:
    the attention implementation (masks: bool for sdpa, additive for eager)."""
    cfg = transformers.ModernBertConfig(
        vocab_size=V, hidden_size=C, num_hidden_layers=L, num_attention_heads=H,
        intermediate_size=32, max_position_embeddings=32, local_attention=4,
        initializer_range=init,
        layer_types=["sliding_attention", "sliding_attention" if sliding else "full_attention"],
        pad_token_id=0, bos_token_id=1, eos_token_id=1, cls_token_id=1, sep_token_id=1)
    if impl is not None:
        cfg._attn_implementation = impl
    return transformers.ModernBertModel(cfg)


#: whether ModernBERT's attention has the layout a unit stands in for (transformers >= 5)
MODERNBERT = (hasattr(transformers, "ModernBertModel")
              and int(transformers.__version__.split(".")[0]) >= 5)


def _distilbert():
    return transformers.DistilBertModel(transformers.DistilBertConfig(
        vocab_size=V, dim=C, n_layers=L, n_heads=H, hidden_dim=32, max_position_embeddings=32))


def _vit():
    return transformers.ViTModel(transformers.ViTConfig(
        image_size=8, patch_size=4, hidden_size=C, num_hidden_layers=L, num_attention_heads=H,
        intermediate_size=32))


def _gpt2():
    return transformers.GPT2Model(transformers.GPT2Config(
        vocab_size=V, n_embd=C, n_layer=L, n_head=H, n_positions=32, bos_token_id=1,
        eos_token_id=1))


def _llama():
    return transformers.LlamaModel(transformers.LlamaConfig(
        vocab_size=V, hidden_size=C, num_hidden_layers=L, num_attention_heads=H,
        num_key_value_heads=H, intermediate_size=32, max_position_embeddings=32,
        bos_token_id=1, eos_token_id=1, pad_token_id=0))


#: host family -> tiny random model (the swappable ones)
HOSTS = {"bert": _bert, "roberta": _roberta, "electra": _electra, "albert": _albert,
         "deberta": _deberta_v1, "deberta_v2": _deberta, "distilbert": _distilbert,
         "mpnet": _mpnet, "vit": _vit, **({"modernbert": _modernbert} if MODERNBERT else {})}
#: decoder-style hosts used as encoders: recognised and refused (causal attention)
DECODERS = {"gpt2": _gpt2, "llama": _llama}
#: the hosts with their position terms that a unit drops (warned), as the table shows them
RELATIVE = {"deberta_relative": lambda: _deberta_v1(True),
            "deberta_v2_relative": lambda: _deberta(True), "mpnet_relative": lambda: _mpnet(True)}
#: host -> the terms every swap of it drops (and warns about)
DROPS = {"mpnet": ["position_bias"], "mpnet_relative": ["position_bias"],
         "deberta_relative": ["c2p", "p2c"], "deberta_v2_relative": ["c2p", "p2c"]}


def make(host, seed=0):
    torch.manual_seed(seed)
    return {**HOSTS, **DECODERS, **RELATIVE}[host]().eval()


def swap(host, model, kind, **kwargs):
    """:func:`swap_attention`, expecting the warning of the terms ``host`` drops (if any)."""
    if host not in DROPS:
        return swap_attention(model, kind, **kwargs)
    with pytest.warns(UserWarning, match=rf"{DROPS[host][0]}: "):
        return swap_attention(model, kind, **kwargs)


def swappable(model):
    """The indices of the layers of ``model`` that are not refused (ModernBERT's global ones)."""
    return [i for i, layer in enumerate(find_attention_layers(model)) if layer.refusal() is None]


def inputs(host, B=3, N=7, seed=1):
    """Keyword inputs of the host: token ids with a padding mask (rows of 7, 5 and 3 real
    tokens), or pixels for ViT."""
    g = torch.Generator().manual_seed(seed)
    if host == "vit":
        return {"pixel_values": torch.randn(B, 3, 8, 8, generator=g)}
    ids = torch.randint(2, V, (B, N), generator=g)
    mask = torch.arange(N)[None] < torch.tensor([N, N - 2, 3])[:B, None]
    return {"input_ids": ids.masked_fill(~mask, 0), "attention_mask": mask.long()}


def real_tokens(enc, out):
    if "attention_mask" in enc:
        return enc["attention_mask"].bool()
    return torch.ones(out.shape[:2], dtype=torch.bool)


def hidden(model, enc):
    with torch.no_grad(), settings.posterior_mean():
        return model(**enc).last_hidden_state


@pytest.mark.parametrize("host", sorted(HOSTS))
def test_softmax_swap_is_exact_on_every_host(host):
    """Softmax for softmax with init='pretrained' changes nothing: projections, logit scale,
    residual/LayerNorm placement and the host's mask are read right."""
    model, enc = make(host), inputs(host)
    ref = hidden(model, enc)
    records = swap(host, model, "softmax", layers=swappable(model), calibration=enc)
    out = hidden(model, enc)
    real = real_tokens(enc, out)
    torch.testing.assert_close(out[real], ref[real], atol=1e-5, rtol=1e-5)
    assert all(r["gap_mean"] < 1e-5 and r["dropped"] == DROPS.get(host, []) for r in records)


@pytest.mark.parametrize("kind", ALL_KINDS)
@pytest.mark.parametrize("host", sorted(HOSTS))
def test_every_kind_on_every_host(host, kind):
    """Forward, backward, padding and the gap report of ``kind`` swapped into ``host``."""
    model, enc = make(host), inputs(host)
    rec = swap(host, model, kind, layers=[-1], calibration=enc, **SMALL.get(kind, {}))[0]
    unit = model.get_submodule(rec["path"])
    assert type(unit).kind == kind and rec["kind"] == kind
    assert math.isfinite(rec["gap_mean"]) and math.isfinite(rec["gap_sample"])
    if kind in ("softmax", "gumbel"):        # exact (gumbel at its modal noise)
        assert rec["gap_mean"] < 1e-5
    out = hidden(model, enc)
    assert out.shape[-1] == C and torch.isfinite(out).all()
    real = real_tokens(enc, out)
    if "attention_mask" in enc:              # padded tokens do not reach the real ones
        other = dict(enc, input_ids=enc["input_ids"].masked_fill(~real, 5))
        torch.testing.assert_close(hidden(model, other)[real], out[real], atol=1e-4, rtol=1e-4)
    model.train()
    model.zero_grad()
    model(**enc).last_hidden_state[real].square().mean().backward()
    grads = [p.grad for p in unit.parameters() if p.requires_grad]
    assert grads and any(g is not None and g.abs().sum() > 0 for g in grads)
    first = next(p for n, p in model.named_parameters() if "embed" in n)
    assert first.grad is not None and first.grad.abs().sum() > 0


@pytest.mark.parametrize("host", sorted(HOSTS))
def test_state_dict_round_trip_on_every_host(host):
    """A swapped host's state dict loads strictly into the same host swapped with
    init='random': the same outputs at the posterior mean and the same draws per seed."""
    model, enc = make(host), inputs(host)
    layers = swappable(model)
    swap(host, model, "sgpa", layers=layers, calibration=enc, num_inducing=3)
    fresh = make(host, seed=1)
    swap(host, fresh, "sgpa", layers=layers, init="random", num_inducing=3)
    fresh.load_state_dict(model.state_dict(), strict=True)
    fresh.eval()
    torch.testing.assert_close(hidden(fresh, enc), hidden(model, enc), atol=0, rtol=0)
    with torch.no_grad():
        torch.manual_seed(3)
        draw = model(**enc).last_hidden_state
        torch.manual_seed(3)
        torch.testing.assert_close(fresh(**enc).last_hidden_state, draw, atol=0, rtol=0)


def test_albert_swaps_its_one_shared_layer():
    """ALBERT's one layer runs at every depth: one attention layer is found, and the unit runs
    L times per forward pass; the record says so."""
    model, enc = make("albert"), inputs("albert")
    assert len(find_attention_layers(model)) == 1
    with pytest.raises(ValueError, match="ALBERT's shared layers count once"):
        swap_attention(model, "softmax", layers=[1])
    rec = swap_attention(model, "kep_svgp", layers=[-1], rank=3)[0]
    assert rec["host"] == "albert" and "runs at 2 of the 2 depths" in rec["notes"][0]
    calls = []
    model.get_submodule(rec["path"]).register_forward_hook(lambda *a: calls.append(1))
    hidden(model, enc)
    assert len(calls) == L


@pytest.mark.parametrize("host, message", [
    ("deberta_relative", "c2p: DeBERTa's disentangled content-to-position"),
    ("deberta_v2_relative", "c2p: DeBERTa's disentangled content-to-position"),
    ("mpnet_relative", "position_bias: MPNet's relative-position bias")])
def test_relative_position_terms_are_dropped_with_a_warning(host, message):
    """DeBERTa (v1, v2) with c2p/p2c, MPNet with its relative-position bias: swapped with
    content-only attention; the warning and the record name the dropped terms, and the gap
    measures against the content part of the layer."""
    model, enc = make(host), inputs(host)
    ref = hidden(model, enc)
    with pytest.warns(UserWarning, match=message):
        rec = swap_attention(model, "softmax", layers=[-1], calibration=enc)[0]
    assert rec["dropped"] == DROPS[host] and set(DROPS[host]) <= set(rec["not_carried"])
    assert rec["gap_mean"] < 1e-5      # content-only softmax (DeBERTa: its sqrt(3 D) scale)
    out = hidden(model, enc)
    real = enc["attention_mask"].bool()
    assert torch.isfinite(out).all()
    assert (out[real] - ref[real]).abs().max() > 1e-2      # the relative terms did matter


@pytest.mark.parametrize("host", sorted(DECODERS))
def test_decoders_are_refused_with_the_reason(host):
    model = make(host)
    cls = type(find_attention_layers(model)[-1].module).__name__
    with pytest.raises(ValueError, match=rf"\({cls} in {type(model).__name__}\): causal"):
        swap_attention(model, "softmax", layers=[-1])
    with pytest.raises(ValueError, match="causal"):
        find_attention_layers(model)[0].weights()
    assert not any(type(m).__name__.endswith("Adapter") for m in model.modules())


def test_rotary_attention_is_refused_with_the_reason():
    """A bidirectional q/k/v/o attention that applies rotary embeddings inside (a Llama layer
    made non-causal): a unit cannot apply them."""
    model = make("llama")
    for layer in model.layers:
        layer.self_attn.is_causal = False
    with pytest.raises(ValueError, match="rotary position embeddings"):
        swap_attention(model, "kep_svgp", layers=[0], init="random", rank=3)


def test_unknown_host_names_its_attention_modules():
    class WeirdAttention(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.qkv_fused = torch.nn.Linear(C, 3 * C)

    model = torch.nn.Sequential(WeirdAttention())
    with pytest.raises(ValueError, match=r"in Sequential: its attention modules "
                                         r"\(WeirdAttention\) have none"):
        swap_attention(model, "softmax")


@pytest.mark.parametrize("host", ["distilbert", "deberta", "deberta_v2", "mpnet", "vit",
                                  *(["modernbert"] if MODERNBERT else [])])
def test_second_swap_and_attention_weights_output(host):
    """A swapped layer swaps again (random init) behind the same adapter, and the host's
    output_attentions path still runs (the unit reports no weights)."""
    model, enc = make(host), inputs(host)
    first = swap(host, model, "sgpa", layers=[-1], init="random", num_inducing=3)[0]
    second = swap_attention(model, "softmax", layers=[-1], init="random")[0]
    assert second["path"] == first["path"] and second["host_class"] == first["host_class"]
    with torch.no_grad():
        out = model(**enc, output_attentions=True)
    assert torch.isfinite(out.last_hidden_state).all()


def test_bert_relative_key_logits_are_dropped_with_a_warning():
    """BERT's relative_key position logits (transformers < 5): warned and recorded as dropped.
    transformers 5 builds no relative-position term for that config: nothing to drop, no
    warning."""
    import warnings

    torch.manual_seed(0)
    model = transformers.BertModel(transformers.BertConfig(
        **_BERTISH, position_embedding_type="relative_key", attn_implementation="eager"))
    if hasattr(model.encoder.layer[0].attention.self, "distance_embedding"):
        with pytest.warns(UserWarning, match="relative_key: the relative-position term"):
            rec = swap_attention(model, "kep_svgp", layers=[-1], rank=3)[0]
        assert rec["dropped"] == ["relative_key"] and "relative_key" in rec["not_carried"]
    else:
        assert int(transformers.__version__.split(".")[0]) >= 5
        with warnings.catch_warnings():
            warnings.simplefilter("error", UserWarning)
            rec = swap_attention(model, "kep_svgp", layers=[-1], rank=3)[0]
        assert not rec.get("dropped")


def test_deberta_talking_heads_are_refused():
    torch.manual_seed(0)
    model = transformers.DebertaModel(transformers.DebertaConfig(**_BERTISH, talking_head=True))
    with pytest.raises(ValueError, match=r"\(DebertaAttention in DebertaModel\): talking heads"):
        swap_attention(model, "softmax", layers=[-1])


needs_modernbert = pytest.mark.skipif(not MODERNBERT, reason="ModernBERT is swapped from "
                                      "transformers 5 on")


@needs_modernbert
@pytest.mark.parametrize("impl", ["sdpa", "eager"])
def test_modernbert_rotary_embeddings_are_applied_by_the_unit(impl, monkeypatch):
    """Softmax for ModernBERT's global layer is exact with either mask form (sdpa's bool, eager's
    additive) at weights large enough that the positions matter: without the rotation the
    swapped layer would compute something else."""
    torch.manual_seed(0)
    model, enc = _modernbert(impl=impl, init=0.5).eval(), inputs("modernbert")
    ref = hidden(model, enc)
    rec = swap_attention(model, "softmax", layers=[-1], calibration=enc)[0]
    assert rec["host"] == "modernbert" and rec["adapter"] == "RotaryAttentionAdapter"
    assert rec["gap_mean"] < 1e-5 and "rotary position embeddings" in rec["notes"][0]
    real = enc["attention_mask"].bool()
    torch.testing.assert_close(hidden(model, enc)[real], ref[real], atol=1e-5, rtol=1e-5)
    from gpattn_ppl.attention import RotaryPositions
    monkeypatch.setattr(RotaryPositions, "apply", lambda self, t, token_dim=-2, where="": t)
    assert (hidden(model, enc)[real] - ref[real]).abs().max() > 1e-2


@needs_modernbert
def test_modernbert_sliding_window_layers_are_refused():
    """A local layer is refused with the window and the way out; nothing is replaced."""
    model = make("modernbert")
    with pytest.raises(ValueError, match=r"layers.0.attn \(ModernBertAttention in "
                                         r"ModernBertModel\): local \(sliding-window\) "
                                         r"attention: .* within 2 positions.*full_attention"):
        swap_attention(model, "kep_svgp", layers=[0, 1], rank=3)
    assert not any(type(m).__name__.endswith("Adapter") for m in model.modules())
    torch.manual_seed(0)
    local = _modernbert(sliding=True)
    with pytest.raises(ValueError, match="sliding-window"):
        swap_attention(local, "softmax", layers=[-1])


@needs_modernbert
def test_modernbert_unit_needs_the_hosts_positions():
    """Outside its host the unit refuses to run position-blind; inside ``positions`` it runs.
    A 4-D mask that cuts a sequence (a window) and a unit kind that cannot rotate are refused."""
    from gpattn_ppl.attention import RotaryPositions, SoftmaxAttention
    model = make("modernbert")
    rec = swap_attention(model, "sgpa", layers=[-1], init="random", num_inducing=3)[0]
    unit, adapter = model.get_submodule(rec["path"]), model.layers[1].attn
    x = torch.randn(2, 5, C)
    with pytest.raises(ValueError, match="rotates its queries and keys by rotary"):
        unit(x)
    cos, sin = model.rotary_emb(x, torch.arange(5)[None], "full_attention")
    with unit.positions(RotaryPositions(cos, sin)):
        assert unit(x).shape == x.shape
    band = (torch.arange(5)[:, None] - torch.arange(5)[None]).abs() <= 1
    with pytest.raises(ValueError, match="only part of the real tokens"):
        adapter(x, position_embeddings=(cos, sin),
                attention_mask=band[None, None].expand(2, 1, 5, 5))
    out, weights = adapter(x, position_embeddings=(cos, sin),
                           attention_mask=torch.ones(2, 1, 5, 5, dtype=torch.bool))
    assert out.shape == x.shape and weights is None
    with pytest.raises(ValueError, match="no position_embeddings"):
        adapter(x)
    fresh = make("modernbert")
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(SoftmaxAttention, "rotary_capable", False)
        with pytest.raises(ValueError, match=r"SoftmaxAttention \(kind 'softmax'\) does not "
                                             "apply them"):
            swap_attention(fresh, "softmax", layers=[-1])


def test_modernbert_attention_of_transformers_4_is_refused():
    """The transformers 4.48-4.57 ModernBertAttention (rotary embeddings computed inside from
    position_ids) is recognised and refused with the reason."""
    class ModernBertAttention(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.Wqkv, self.Wo = torch.nn.Linear(C, 3 * C), torch.nn.Linear(C, C)
            self.rotary_emb = torch.nn.Identity()

        def forward(self, hidden_states, output_attentions=False, **kwargs):
            return (self.Wo(hidden_states),)

    model = torch.nn.Sequential(ModernBertAttention())
    assert find_attention_layers(model)[0].host == "modernbert"
    with pytest.raises(ValueError, match="ModernBertAttention of transformers < 5"):
        swap_attention(model, "softmax")
