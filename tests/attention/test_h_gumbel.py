"""HierarchicalGumbelAttention (h-sto-trans): contract checks plus brute-force properties."""

import pyro
import pyro.poutine as poutine
import pytest
import torch

import gpattn_ppl.distributions.relaxed_one_hot as roh
from gpattn_ppl.attention import (
    ATTENTION,
    GumbelAttention,
    HierarchicalGumbelAttention,
    build_attention,
)
from gpattn_ppl.distributions import SafeRelaxedOneHotCategorical, sample_gumbel
from gpattn_ppl.ppl import SiteContext, apply_schedules, site_context
from gpattn_ppl.settings import posterior_mean
from gpattn_ppl.testing import AttentionUnitTestCase

D64 = torch.float64


def h_gumbel_reference(x, mask, unit, g_c, g_v, tau1, tau2, mean=False):
    """Algorithm 1 written per head with explicit exp/normalise (float64), including W_O."""
    B, N, C = x.shape
    H, D = unit.heads, C // unit.heads
    qkv = x @ unit.qkv.weight.T + unit.qkv.bias
    q, k, v = qkv[..., :C], qkv[..., C:2 * C], qkv[..., 2 * C:]

    def gumbel_softmax(logits, g, tau, col_mask=None):
        z = (logits if mean else logits + g) / tau
        w = torch.exp(z - z.amax(-1, keepdim=True))
        if col_mask is not None:
            w = w * col_mask
        return w / w.sum(-1, keepdim=True)

    outs = []
    for h in range(H):
        sl = slice(h * D, (h + 1) * D)
        Ch = unit.centroids[h] if unit.centroids_per_head else unit.centroids      # [D, c]
        a_c = gumbel_softmax(k[..., sl] @ Ch, None if mean else g_c[:, h], tau1)    # eq. 14
        k_hat = a_c @ Ch.T                                                          # eq. 15
        cm = None if mask is None else mask[:, None, :]
        a_v = gumbel_softmax(q[..., sl] @ k_hat.transpose(1, 2),
                             None if mean else g_v[:, h], tau2, cm)                 # eq. 16
        outs.append(a_v @ v[..., sl])                                               # eq. 17
    return torch.cat(outs, -1) @ unit.out.weight.T + unit.out.bias


class _PatchedNoise:
    def __init__(self, monkeypatch, *tensors):
        self.queue = list(tensors)
        monkeypatch.setattr(roh, "sample_gumbel", self)

    def __call__(self, shape, dtype=None, device=None):
        g = self.queue.pop(0)
        assert tuple(g.shape) == tuple(shape), (g.shape, shape)
        return g.to(dtype).clone()    # the unit may overwrite fresh noise in place


class TestHierarchicalGumbelAttention(AttentionUnitTestCase):
    mean_is_expectation = False  # the posterior-mean mode is the noise-free (modal) value

    def make_unit(self, dim, heads):
        return HierarchicalGumbelAttention(dim, heads, temperature=2.0, centroid_temperature=1.0,
                                           num_centroids=5)


class TestHierarchicalGumbelUniformPerHead(AttentionUnitTestCase):
    mean_is_expectation = False  # the posterior-mean mode is the noise-free (modal) value

    def make_unit(self, dim, heads):
        return HierarchicalGumbelAttention(dim, heads, temperature=0.5, centroid_temperature=0.3,
                                           num_centroids=3, centroids_per_head=True,
                                           prior="uniform")


def _unit(**kw):
    torch.manual_seed(0)
    kw.setdefault("num_centroids", 5)
    return HierarchicalGumbelAttention(8, 2, **kw).double().eval()


def _inputs(B=3, N=6, seed=1):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(B, N, 8, generator=g, dtype=D64)
    mask = torch.ones(B, N, dtype=torch.bool)
    mask[0, N - 2:] = False
    mask[-1, 2:] = False
    return x, mask


def test_registered_with_keyword_options():
    assert ATTENTION["h_gumbel"] is HierarchicalGumbelAttention
    unit = build_attention("h_gumbel", 16, 4, temperature=20.0, centroid_temperature=1.0,
                           num_centroids=7)
    assert unit.centroids.shape == (4, 7)
    assert build_attention("h_gumbel", 16, 4, num_centroids=7,
                           centroids_per_head=True).centroids.shape == (4, 4, 7)
    with pytest.raises(ValueError, match="centroid_init"):
        HierarchicalGumbelAttention(8, 2, centroid_init="random")
    with pytest.raises(ValueError, match="num_centroids"):
        HierarchicalGumbelAttention(8, 2, num_centroids=0)


@pytest.mark.parametrize("per_head", [False, True])
def test_sample_matches_algorithm_1_with_shared_noise(monkeypatch, per_head):
    unit = _unit(temperature=1.5, centroid_temperature=0.7, centroids_per_head=per_head)
    x, mask = _inputs()
    g_c, g_v = sample_gumbel((3, 2, 6, 5), dtype=D64), sample_gumbel((3, 2, 6, 6), dtype=D64)
    _PatchedNoise(monkeypatch, g_c, g_v)
    out = unit(x, mask)
    ref = h_gumbel_reference(x, mask, unit, g_c, g_v, 0.7, 1.5)
    torch.testing.assert_close(out[mask], ref[mask])


def test_posterior_mean_is_the_noise_free_pass():
    unit = _unit(temperature=20.0, centroid_temperature=1.0)
    x, mask = _inputs()
    with posterior_mean():
        out = unit(x, mask)
    ref = h_gumbel_reference(x, mask, unit, None, None, 1.0, 20.0, mean=True)
    torch.testing.assert_close(out[mask], ref[mask])


def test_reduces_to_sto_trans_when_centroids_are_the_keys(monkeypatch):
    """c = N, C = k^T per head, equal-norm orthogonal keys with gaps >> Gumbel spread: k_hat = k."""
    N, r = 4, 12.0
    hier = _unit(num_centroids=N, centroids_per_head=True, centroid_temperature=1.0,
                 temperature=0.9)
    flat = GumbelAttention(8, 2, temperature=0.9).double().eval()
    with torch.no_grad():
        flat.qkv.load_state_dict(hier.qkv.state_dict())
        flat.out.load_state_dict(hier.out.state_dict())
        # keys = x: W_k = I, b_k = 0 on the key block
        for u in (hier, flat):
            u.qkv.weight[8:16] = torch.eye(8, dtype=D64)
            u.qkv.bias[8:16] = 0
    # per head, tokens are r * the 4 standard basis vectors (equal norm, orthogonal)
    x = r * torch.eye(4, dtype=D64).repeat(1, 2)[None]                        # [1, N, 8]
    with torch.no_grad():
        k = hier.split_heads(x)[0]                                            # [H, N, D]
        hier.centroids.copy_(k.transpose(-1, -2))                             # C_h = k_h^T
    g_c = sample_gumbel((1, 2, N, N), dtype=D64).clamp(-20, 20)               # spread << r^2
    g_v = sample_gumbel((1, 2, N, N), dtype=D64)
    _PatchedNoise(monkeypatch, g_c, g_v, g_v)
    torch.testing.assert_close(hier(x), flat(x))
    with posterior_mean():
        torch.testing.assert_close(hier(x), flat(x))


def test_proposition_3_1_bound_on_random_keys():
    r"""||G((k_i C + g)/tau) - G((k_j C + g)/tau)|| <= ||k_i - k_j|| ||C||_2 / tau, shared g
    (and the factor 1/2 of the docs' proof: softmax is 1/2-Lipschitz)."""
    torch.manual_seed(7)
    D, c, P = 16, 12, 4000
    C = torch.randn(D, c, dtype=D64) * torch.rand(1, c, dtype=D64) * 3
    spec = torch.linalg.matrix_norm(C, ord=2)
    ki = torch.randn(P, D, dtype=D64) * torch.rand(P, 1, dtype=D64) * 5
    kj = ki + torch.randn(P, D, dtype=D64) * torch.rand(P, 1, dtype=D64)
    tau = torch.rand(P, dtype=D64) * 3 + 0.05
    g = sample_gumbel((P, c), dtype=D64)
    ai = SafeRelaxedOneHotCategorical(tau, logits=ki @ C).relax(g)
    aj = SafeRelaxedOneHotCategorical(tau, logits=kj @ C).relax(g)
    lhs = (ai - aj).norm(dim=-1)
    mid = ((ki - kj) @ C).norm(dim=-1) / tau              # softmax is 1/2-Lipschitz
    rhs = (ki - kj).norm(dim=-1) * spec / tau             # the paper's bound
    assert torch.all(lhs <= 0.5 * mid + 1e-12) and torch.all(mid <= rhs + 1e-12)
    assert (lhs / rhs).max() > 0.05                       # not vacuous on these draws


def test_proposition_3_1_through_the_unit():
    """The unit's centroid logits and draws obey the bound for every key pair (shared noise)."""
    unit = _unit(centroid_temperature=0.4, num_centroids=6)
    x, _ = _inputs(B=1, N=8)
    with torch.no_grad():
        _, k, _ = unit.project(x)                                              # [1, H, N, D]
        logits = unit.centroid_logits(k)[0]                                    # [H, N, c]
        g = sample_gumbel((6,), dtype=D64)                                     # shared by all
        a = SafeRelaxedOneHotCategorical(0.4, logits=logits).relax(g.expand_as(logits))
    lhs = torch.cdist(a, a)                                                    # [H, N, N]
    rhs = torch.cdist(k[0], k[0]) * torch.linalg.matrix_norm(unit.centroids, ord=2) / 0.4
    assert torch.all(lhs <= rhs + 1e-12)


@pytest.mark.parametrize("mean", [False, True])
def test_padded_keys_never_receive_weight(mean):
    unit = _unit(temperature=0.05, centroid_temperature=0.05)
    x, mask = _inputs()
    x = x.clone()
    x[~mask] = 1e3
    with posterior_mean(mean), torch.no_grad():
        A = unit.attention_matrix(x, mask)
    assert torch.isfinite(A).all()
    assert torch.all(A.masked_select(~mask[:, None, None, :].expand_as(A)) == 0)


@pytest.mark.parametrize("prior", ["same", "uniform"])
@pytest.mark.parametrize("per_head", [False, True])
def test_gradients_reach_the_centroids(prior, per_head):
    unit = _unit(prior=prior, centroids_per_head=per_head, centroid_temperature=0.5).train()
    x, mask = _inputs()
    torch.manual_seed(0)
    out = unit(x, mask)
    loss = out[mask].square().sum() + sum(v.sum() for v in unit.objective_terms().values())
    loss.backward()
    g = unit.centroids.grad
    assert g is not None and torch.isfinite(g).all()
    # every centroid (and, per head, every head's matrix) gets a gradient
    assert torch.all(g.abs().sum(-2) > 0)


def test_same_prior_kl_is_exactly_zero_in_the_trace():
    unit = _unit(temperature=2.0, centroid_temperature=0.5)
    unit.site_prefix = "blocks.0.attn"
    x, mask = _inputs()
    unit(x, mask)
    assert "kl" not in unit.objective_terms()
    plate = pyro.plate("data", 50, subsample=torch.arange(3))
    with site_context(SiteContext("sites", "guide", plate)):
        gt = poutine.trace(lambda: unit(x, mask)).get_trace()
    with site_context(SiteContext("sites", "model", plate)):
        mt = poutine.trace(poutine.replay(lambda: unit(x, mask), trace=gt)).get_trace()
    gt.compute_log_prob()
    mt.compute_log_prob()
    names = [n for n, s in gt.nodes.items() if s["type"] == "sample"]
    assert names == ["blocks.0.attn.centroid_weights", "blocks.0.attn.weights"]
    assert gt.nodes[names[0]]["fn"].event_shape == (2, 6, 5)
    for n in names:
        assert torch.isfinite(gt.nodes[n]["log_prob"]).all()
        assert (gt.nodes[n]["log_prob_sum"] - mt.nodes[n]["log_prob_sum"]).item() == 0.0


def test_uniform_prior_kl_counts_both_levels_and_ignores_pads():
    unit = _unit(temperature=1.0, centroid_temperature=0.5, prior="uniform")
    unit.site_prefix = "b"
    x, mask = _inputs()
    torch.manual_seed(3)
    unit(x, mask)
    thin = unit.objective_terms()["kl"]
    torch.manual_seed(3)
    with site_context(SiteContext("sites", "guide", None)):
        gt = poutine.trace(lambda: unit(x, mask)).get_trace()
    with site_context(SiteContext("sites", "model", None)):
        mt = poutine.trace(poutine.replay(lambda: unit(x, mask), trace=gt)).get_trace()
    gt.compute_log_prob()
    mt.compute_log_prob()
    ref = sum(gt.nodes[n]["log_prob"] - mt.nodes[n]["log_prob"]
              for n in ("b.centroid_weights", "b.weights"))
    torch.testing.assert_close(thin, ref)
    x2 = x.clone()
    x2[~mask] = 5 * torch.randn_like(x2[~mask])
    torch.manual_seed(3)
    unit(x2, mask)
    torch.testing.assert_close(unit.objective_terms()["kl"], thin)


def test_kmeans_initialisation_finds_separated_clusters():
    torch.manual_seed(0)
    unit = HierarchicalGumbelAttention(8, 2, num_centroids=3, centroid_init="kmeans").double()
    with torch.no_grad():                                  # keys = x on the key block
        unit.qkv.weight[8:16] = torch.eye(8, dtype=D64)
        unit.qkv.bias[8:16] = 0
    centres = 10 * torch.eye(4, dtype=D64)[:3]             # 3 well separated 4-d centres
    lab = torch.arange(60) % 3
    pts = centres[lab] + 0.1 * torch.randn(60, 4, dtype=D64)
    x = pts.reshape(2, 15, 2, 4).reshape(2, 15, 8)         # both heads see the same cloud
    mask = torch.ones(2, 15, dtype=torch.bool)
    assert bool(unit.centroids_pending)
    unit.train()(x, mask)                                  # first training call initialises
    assert not bool(unit.centroids_pending)
    found = unit.centroids.detach().T                      # [3, 4]
    d = torch.cdist(found, centres)
    assert torch.all(d.amin(-1) < 0.2) and d.argmin(-1).unique().numel() == 3
    # not re-initialised on later calls, and the flag survives a state-dict round trip
    before = unit.centroids.detach().clone()
    unit(x, mask)
    torch.testing.assert_close(unit.centroids.detach(), before)
    other = HierarchicalGumbelAttention(8, 2, num_centroids=3, centroid_init="kmeans").double()
    other.load_state_dict(unit.state_dict())
    assert not bool(other.centroids_pending)


def test_temperature_schedules_for_both_levels():
    unit = HierarchicalGumbelAttention(8, 2, temperature=30.0, centroid_temperature=1.0,
                                       temperature_schedule={"start": 30.0, "end": 20.0,
                                                             "epochs": 10},
                                       centroid_temperature_schedule={"kind": "switch",
                                                                      "before": 2.0,
                                                                      "value": 1.0, "after": 4})
    out = apply_schedules(torch.nn.Sequential(unit), 2.0, 10)
    assert out == {"0.temperature": pytest.approx(28.0), "0.centroid_temperature": 2.0}
    unit.apply_schedules(5.0, 10)
    assert unit.temperature == pytest.approx(25.0) and unit.centroid_temperature == 1.0


def test_no_nan_with_extreme_inputs_in_float32():
    torch.manual_seed(0)
    unit = HierarchicalGumbelAttention(16, 4, temperature=0.05, centroid_temperature=0.05,
                                       num_centroids=8)
    with torch.no_grad():
        unit.qkv.weight.mul_(50.0)
        unit.centroids.mul_(50.0)
    x = 10 * torch.randn(4, 9, 16)
    mask = torch.ones(4, 9, dtype=torch.bool)
    mask[2, 3:] = False
    out = unit(x, mask)
    out[mask].square().sum().backward()
    assert torch.isfinite(out).all()
    assert all(torch.isfinite(p.grad).all() for p in unit.parameters())


@pytest.mark.parametrize("mean", [False, True])
def test_fused_thin_path_equals_the_materialised_site_path(mean):
    unit = _unit(temperature=3.0, centroid_temperature=0.5)
    unit.site_prefix = "blocks.0.attn"
    x, mask = _inputs()
    torch.manual_seed(11)
    with posterior_mean(mean):
        thin = unit(x, mask)
    torch.manual_seed(11)
    with site_context(SiteContext("sites", "guide", None)), posterior_mean(mean):
        sites = unit(x, mask)
    torch.testing.assert_close(thin[mask], sites[mask])


def test_annealed_temperatures_travel_with_the_state_dict():
    unit = HierarchicalGumbelAttention(8, 2, temperature=30.0, centroid_temperature=2.0,
                                       temperature_schedule={"start": 30.0, "end": 20.0,
                                                             "epochs": 10})
    unit.apply_schedules(10.0)
    unit.centroid_temperature = 0.5
    other = HierarchicalGumbelAttention(8, 2, temperature=30.0, centroid_temperature=2.0)
    other.load_state_dict(unit.state_dict())
    assert other.temperature == pytest.approx(20.0) and other.centroid_temperature == 0.5
