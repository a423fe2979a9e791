"""GumbelAttention (sto-trans): the inherited contract checks plus brute-force properties."""

import pyro
import pyro.poutine as poutine
import pytest
import torch
from scipy import stats

import gpattn_ppl.distributions.relaxed_one_hot as roh
from gpattn_ppl.attention import ATTENTION, GumbelAttention, build_attention
from gpattn_ppl.distributions import sample_gumbel
from gpattn_ppl.ppl import SiteContext, apply_schedules, site_context
from gpattn_ppl.settings import posterior_mean
from gpattn_ppl.testing import AttentionUnitTestCase

D64 = torch.float64


def gumbel_attention_reference(x, mask, unit, gumbels, tau, mean=False):
    """Explicit per-head Gumbel-softmax attention (float64, loop over heads), before W_O."""
    B, N, C = x.shape
    H, D = unit.heads, C // unit.heads
    qkv = x @ unit.qkv.weight.T + unit.qkv.bias
    q, k, v = qkv[..., :C], qkv[..., C:2 * C], qkv[..., 2 * C:]
    outs = []
    for h in range(H):
        sl = slice(h * D, (h + 1) * D)
        logits = q[..., sl] @ k[..., sl].transpose(1, 2)
        z = logits if mean else logits + gumbels[:, h]
        w = torch.exp(z / tau - (z / tau).amax(-1, keepdim=True))
        if mask is not None:
            w = w * mask[:, None, :]
        A = w / w.sum(-1, keepdim=True)
        outs.append(A @ v[..., sl])
    return torch.cat(outs, -1) @ unit.out.weight.T + unit.out.bias


class _PatchedNoise:
    """Replace the Gumbel sampler by a queue of given tensors (shared noise for comparisons)."""

    def __init__(self, monkeypatch, *tensors):
        self.queue = list(tensors)
        monkeypatch.setattr(roh, "sample_gumbel", self)

    def __call__(self, shape, dtype=None, device=None):
        g = self.queue.pop(0)
        assert tuple(g.shape) == tuple(shape), (g.shape, shape)
        return g.to(dtype).clone()    # the unit may overwrite fresh noise in place


class TestGumbelAttention(AttentionUnitTestCase):
    mean_is_expectation = False  # the posterior-mean mode is the noise-free (modal) value

    def make_unit(self, dim, heads):
        return GumbelAttention(dim, heads, temperature=0.7)


class TestGumbelAttentionUniformPrior(AttentionUnitTestCase):
    mean_is_expectation = False  # the posterior-mean mode is the noise-free (modal) value

    def make_unit(self, dim, heads):
        return GumbelAttention(dim, heads, temperature=0.5, prior="uniform", prior_temperature=1.0)


class TestGumbelAttentionStraightThrough(AttentionUnitTestCase):
    mean_is_expectation = False  # the posterior-mean mode is the noise-free (modal) value

    def make_unit(self, dim, heads):
        return GumbelAttention(dim, heads, temperature=2.0, straight_through=True)


def _unit(**kw):
    torch.manual_seed(0)
    return GumbelAttention(8, 2, **kw).double().eval()


def _inputs(B=3, N=6, seed=1):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(B, N, 8, generator=g, dtype=D64)
    mask = torch.ones(B, N, dtype=torch.bool)
    mask[0, N - 2:] = False
    mask[-1, 2:] = False
    return x, mask


def test_registered_with_keyword_options():
    assert ATTENTION["gumbel"] is GumbelAttention
    unit = build_attention("gumbel", 8, 2, temperature=40.0, prior="uniform")
    assert unit.temperature == 40.0 and unit.prior_temperature == 40.0
    with pytest.raises(ValueError, match="prior"):
        GumbelAttention(8, 2, prior="gaussian")
    with pytest.raises(ValueError, match="temperature"):
        GumbelAttention(8, 2, temperature=0.0)


def test_sample_matches_naive_reference_with_shared_noise(monkeypatch):
    unit = _unit(temperature=0.6)
    x, mask = _inputs()
    g = sample_gumbel((3, 2, 6, 6), dtype=D64)
    _PatchedNoise(monkeypatch, g)
    out = unit(x, mask)
    ref = gumbel_attention_reference(x, mask, unit, g, 0.6)
    torch.testing.assert_close(out[mask], ref[mask])


def test_posterior_mean_is_tempered_softmax_attention():
    unit = _unit(temperature=3.0)
    x, mask = _inputs()
    with posterior_mean():
        out = unit(x, mask)
        again = unit(x, mask)
    torch.testing.assert_close(out, again, rtol=0, atol=0)
    ref = gumbel_attention_reference(x, mask, unit, None, 3.0, mean=True)
    torch.testing.assert_close(out[mask], ref[mask])


def test_gumbel_max_frequencies_through_the_unit():
    """argmax_j of the sampled weights is Categorical(softmax(q k^T)), whatever tau (chi-square)."""
    unit = _unit(temperature=0.5)
    S = 40_000
    x = torch.randn(1, 4, 8, dtype=D64).expand(S, 4, 8)
    mask = torch.tensor([True, True, True, False]).expand(S, 4)
    torch.manual_seed(3)
    with torch.no_grad():
        A = unit.attention_matrix(x, mask)                         # [S, H, N, N]
        q, k, _ = unit.project(x[:1])
        p = torch.softmax((q @ k.transpose(-1, -2))[0, :, :, :3], -1)   # [H, N, 3]
    counts = torch.nn.functional.one_hot(A.argmax(-1), 4).sum(0).to(D64)   # [H, N, 4]
    assert torch.all(counts[..., 3] == 0)
    chi2 = ((counts[..., :3] - S * p) ** 2 / (S * p)).sum(-1)
    assert torch.all(chi2 < stats.chi2.ppf(1 - 1e-6, df=2)), chi2


def test_temperature_limits_one_hot_and_uniform():
    x, mask = _inputs()
    torch.manual_seed(4)
    with torch.no_grad():
        A = _unit(temperature=1e-4).attention_matrix(x, mask)
    # one-hot rows: a single weight ~1, the rest ~0 (ties have probability 0)
    assert (A.amax(-1) > 1 - 1e-6).double().mean() > 0.97
    torch.testing.assert_close(A.sum(-1), torch.ones_like(A[..., 0]))
    with torch.no_grad():
        A = _unit(temperature=1e9).attention_matrix(x, mask)
    n = mask.sum(-1).to(D64)[:, None, None, None]
    uniform = mask[:, None, None, :] / n
    torch.testing.assert_close(A, uniform.expand_as(A), atol=1e-6, rtol=0)


@pytest.mark.parametrize("prior", ["same", "uniform"])
@pytest.mark.parametrize("mean", [False, True])
def test_padded_keys_never_receive_weight(mean, prior):
    unit = _unit(temperature=0.05, prior=prior)
    x, mask = _inputs()
    x = x.clone()
    x[~mask] = 1e3                                  # pads with huge logits
    with posterior_mean(mean), torch.no_grad():
        A = unit.attention_matrix(x, mask)
    assert torch.isfinite(A).all()
    assert torch.all(A.masked_select(~mask[:, None, None, :].expand_as(A)) == 0)


def test_no_nan_with_extreme_logits_in_float32():
    torch.manual_seed(0)
    unit = GumbelAttention(16, 4, temperature=0.05)
    with torch.no_grad():
        unit.qkv.weight.mul_(50.0)
    x = 10 * torch.randn(4, 9, 16)
    mask = torch.ones(4, 9, dtype=torch.bool)
    mask[1, 4:] = False
    out = unit(x, mask)
    out[mask].square().sum().backward()
    assert torch.isfinite(out).all()
    assert all(torch.isfinite(p.grad).all() for p in unit.parameters())


def test_same_prior_kl_is_exactly_zero_in_the_trace():
    unit = _unit(temperature=0.5)
    unit.site_prefix = "blocks.0.attn"
    x, mask = _inputs()
    torch.manual_seed(0)
    unit(x, mask)
    assert "kl" not in unit.objective_terms()
    plate = pyro.plate("data", 50, subsample=torch.arange(3))
    with site_context(SiteContext("sites", "guide", plate)):
        gt = poutine.trace(lambda: unit(x, mask)).get_trace()
    with site_context(SiteContext("sites", "model", plate)):
        mt = poutine.trace(poutine.replay(lambda: unit(x, mask), trace=gt)).get_trace()
    gt.compute_log_prob()
    mt.compute_log_prob()
    site = gt.nodes["blocks.0.attn.weights"]
    assert site["fn"].batch_shape == (3,) and site["fn"].event_shape == (2, 6, 6)
    assert torch.isfinite(site["log_prob"]).all()
    kl = site["log_prob_sum"] - mt.nodes["blocks.0.attn.weights"]["log_prob_sum"]
    assert kl.item() == 0.0


def test_uniform_prior_thin_kl_equals_trace_kl_and_ignores_padded_queries():
    unit = _unit(temperature=0.5, prior="uniform", prior_temperature=1.0)
    unit.site_prefix = "blocks.0.attn"
    x, mask = _inputs()
    torch.manual_seed(5)
    unit(x, mask)
    thin = unit.objective_terms()["kl"]
    assert thin.shape == (3,) and torch.isfinite(thin).all()
    torch.manual_seed(5)
    with site_context(SiteContext("sites", "guide", None)):
        gt = poutine.trace(lambda: unit(x, mask)).get_trace()
    with site_context(SiteContext("sites", "model", None)):
        mt = poutine.trace(poutine.replay(lambda: unit(x, mask), trace=gt)).get_trace()
    gt.compute_log_prob()
    mt.compute_log_prob()
    name = "blocks.0.attn.weights"
    torch.testing.assert_close(gt.nodes[name]["log_prob"] - mt.nodes[name]["log_prob"], thin)
    # padded query rows carry no KL: changing pad tokens leaves the term unchanged (same noise)
    x2 = x.clone()
    x2[~mask] = 5 * torch.randn_like(x2[~mask])
    torch.manual_seed(5)
    unit(x2, mask)
    torch.testing.assert_close(unit.objective_terms()["kl"], thin)


def test_uniform_prior_kl_is_positive_on_average():
    unit = _unit(temperature=0.3, prior="uniform", prior_temperature=1.0)
    x, mask = _inputs()
    torch.manual_seed(6)
    kls = []
    with torch.no_grad():
        for _ in range(200):
            unit(x, mask)
            kls.append(unit.objective_terms()["kl"])
    kls = torch.stack(kls)
    assert torch.all(kls.mean(0) > 5 * kls.std(0) / 200**0.5)


def test_temperature_schedule_and_hook():
    net = torch.nn.ModuleDict({"a": GumbelAttention(8, 2, temperature=5.0, temperature_schedule={
        "kind": "exponential", "start": 5.0, "end": 0.5, "epochs": 10}),
        "b": GumbelAttention(8, 2, temperature=2.0)})
    set_ = apply_schedules(net, 5.0, 20)
    assert set_ == {"a.temperature": pytest.approx(5.0 * 0.1**0.5)}
    assert net["a"].temperature == pytest.approx(5.0 * 0.1**0.5) and net["b"].temperature == 2.0
    apply_schedules(net, 30.0)
    assert net["a"].temperature == pytest.approx(0.5)
    # the trainer's per-unit hook is the same method
    net["a"].apply_schedules(0.0, 10)
    assert net["a"].temperature == pytest.approx(5.0)
    with pytest.raises(ValueError, match="temperature"):
        GumbelAttention(8, 2, temperature_schedule={"kind": "bogus"})


def test_sites_mode_weights_are_the_returned_attention(monkeypatch):
    """In sites mode the traced value is exactly the attention the unit used."""
    unit = _unit(temperature=0.8)
    unit.site_prefix = "blocks.2.attn"
    x, mask = _inputs()
    g = sample_gumbel((3, 2, 6, 6), dtype=D64)
    _PatchedNoise(monkeypatch, g, g)
    with site_context(SiteContext("sites", "guide", None)):
        tr = poutine.trace(lambda: unit(x, mask)).get_trace()
    A = tr.nodes["blocks.2.attn.weights"]["value"]
    torch.testing.assert_close(A, unit.attention_matrix(x, mask))


def test_straight_through_weights_are_one_hot_with_relaxed_gradients(monkeypatch):
    soft, hard = _unit(temperature=0.7), _unit(temperature=0.7, straight_through=True)
    x, mask = _inputs()
    g = sample_gumbel((3, 2, 6, 6), dtype=D64)
    _PatchedNoise(monkeypatch, g, g, g, g)
    A_hard, A_soft = hard.attention_matrix(x, mask), soft.attention_matrix(x, mask)
    torch.testing.assert_close(A_hard, torch.nn.functional.one_hot(A_soft.argmax(-1), 6).to(D64))
    assert torch.all(A_hard.masked_select(~mask[:, None, None, :].expand_as(A_hard)) == 0)
    w = torch.randn(6, dtype=D64)
    g_hard = torch.autograd.grad((hard.attention_matrix(x, mask) * w).sum(), hard.qkv.weight)[0]
    g_soft = torch.autograd.grad((soft.attention_matrix(x, mask) * w).sum(), soft.qkv.weight)[0]
    torch.testing.assert_close(g_hard, g_soft)


@pytest.mark.parametrize("unit_kw", [{}, {"prior": "uniform"}, {"straight_through": True}])
def test_fused_thin_path_equals_the_materialised_site_path(unit_kw):
    """Thin mode (fused SDPA when possible) and sites mode (explicit weights) give the same
    output for the same seed: both consume the same Gumbel draw."""
    unit = _unit(temperature=0.8, **unit_kw)
    unit.site_prefix = "blocks.0.attn"
    x, mask = _inputs()
    torch.manual_seed(11)
    thin = unit(x, mask)
    torch.manual_seed(11)
    with site_context(SiteContext("sites", "guide", None)):
        sites = unit(x, mask)
    torch.testing.assert_close(thin[mask], sites[mask])


@pytest.mark.parametrize("att", [{"kind": "gumbel", "prior": "uniform", "temperature": 0.5},
                                 {"kind": "h_gumbel", "prior": "uniform", "num_centroids": 4},
                                 {"kind": "h_gumbel"}])
def test_pyro_program_thin_and_sites_losses_agree(att):
    """The whole objective (CE + KL where the prior is uniform) is the same number from the fast
    thin path and from Pyro's TraceMeanField_ELBO over the named sites."""
    from gpattn_ppl.infer.program import PyroProgram
    from gpattn_ppl.models import build_model

    torch.manual_seed(0)
    net = build_model({"arch": "text", "dim": 16, "depth": 2, "heads": 2, "mlp_dim": 16,
                       "dropout": 0.0, "max_len": 10, "attention": att},
                      num_classes=2, vocab_size=50).double()
    x = torch.randint(1, 50, (4, 7))
    mask = torch.ones(4, 7, dtype=torch.bool)
    mask[0, 4:] = False
    y, idx = torch.randint(0, 2, (4,)), torch.arange(4)
    losses = []
    for mode in ("thin", "sites"):
        torch.manual_seed(5)
        losses.append(PyroProgram(net, 100, mode=mode).loss(x, mask, y, idx))
    torch.testing.assert_close(losses[0], losses[1])
    if att.get("prior", "same") == "same":     # KL exactly 0: the loss is the cross-entropy
        torch.manual_seed(5)
        ce = torch.nn.functional.cross_entropy(net(x, mask), y)
        torch.testing.assert_close(losses[0], ce)
