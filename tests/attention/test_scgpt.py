"""SCGPT: the inherited unit contract plus brute-force checks of the DTC algebra."""

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

from gpattn_ppl import settings
from gpattn_ppl.attention import CGPTAttention, SCGPTAttention, build_attention
from gpattn_ppl.settings import posterior_mean
from gpattn_ppl.testing import AttentionUnitTestCase
from tests.reference.cgpt import SCGPReference, conditional_mean

DT = torch.float64


def _unit(dim=8, heads=2, seed=0, **kw):
    torch.manual_seed(seed)
    kw.setdefault("inducing_init", "random")
    return SCGPTAttention(dim, heads, **kw).to(DT).eval()


def _x(B=2, N=5, C=8, seed=1):
    return torch.randn(B, N, C, generator=torch.Generator().manual_seed(seed), dtype=DT)


def _refs(unit, x):
    q, k, v, xo = (t.detach() for t in unit.project(x))
    sq, sk = unit.gp.scale_q.detach(), unit.gp.scale_k.detach()
    sq = sq.expand(unit.heads) if sq.numel() == 1 else sq
    sk = sk.expand(unit.heads) if sk.numel() == 1 else sk
    sm, sl = unit.gp.inducing_m.detach(), unit.gp.inducing_l.detach()
    refs = {(b, h): SCGPReference(q[b, h], k[b, h], xo[b, h], sm[h], sl[h], sq[h], sk[h],
                                  unit.gp.noise**2)
            for b in range(x.shape[0]) for h in range(unit.heads)}
    return refs, q, k, v, xo


def _five_sigma(samples, target, what):
    S = samples.shape[0]
    err = (samples.mean(0) - target).abs()
    bound = 5 * samples.std(0) / S**0.5 + 1e-12
    worst = (err / bound).max().item()
    assert worst <= 1.0, f"{what}: worst deviation {worst:.2f} x the 5-sigma bound"


class TestSCGPTAttention(AttentionUnitTestCase):
    def make_unit(self, dim, heads):
        return SCGPTAttention(dim, heads, num_inducing=3, noise=0.3)


class TestSCGPTAttentionVariants(AttentionUnitTestCase):
    """m != l, Nyström K_o, W_o = W_k + offset, per-head scales, Gaussian inducing init."""

    def make_unit(self, dim, heads):
        return SCGPTAttention(dim, heads, num_inducing=4, num_inducing_keys=2, noise=0.3,
                              k_o="nystrom", latent="key_offset", per_head_scales=True,
                              inducing_init="random", cgp_reduction="mean")


# -- mean --------------------------------------------------------------------------------------
@settings.cholesky_jitter(float64=1e-15)
def test_mean_is_eq33_evaluated_right_to_left():
    unit = _unit(num_inducing=3, num_inducing_keys=4, noise=0.3, per_head_scales=True)
    with torch.no_grad():
        unit.gp.raw_scale_q.normal_()
        unit.gp.raw_scale_k.normal_()
    x = _x()
    refs, q, k, v, xo = _refs(unit, x)
    nu = unit.gp.mean(unit.gp.prepare(q, k, v, xo), v)
    for (b, h), r in refs.items():
        torch.testing.assert_close(nu[b, h], r.mean(v[b, h]), rtol=1e-8, atol=1e-10)
    with posterior_mean():
        out = unit(x)
    torch.testing.assert_close(out, unit.out(unit.merge_heads(nu)))
    torch.testing.assert_close(unit.attention_matrix(x) @ v, nu, rtol=1e-8, atol=1e-10)


@settings.cholesky_jitter(float64=1e-15)
def test_full_inducing_sets_recover_the_cgpt_operator():
    """s_m = x_o, s_l = k (m = l = N): DTC is exact for the mean, so SCGPT's mean is CGPT's
    eq. 22 operator applied to Z = V; it approaches it continuously as s -> (x_o, k)."""
    N, C, H = 5, 8, 2
    torch.manual_seed(0)
    cg = CGPTAttention(C, H, noise=0.4).to(DT)
    sc = SCGPTAttention(C, H, num_inducing=N, noise=0.4, inducing_init="random").to(DT)
    sc.load_state_dict(cg.state_dict(), strict=False)
    x = 2 * _x(B=1, N=N, C=C)
    q, k, v, xo = (t.detach() for t in sc.project(x))
    t_cg = cg.gp.prepare(q, k, v, xo)
    target = conditional_mean(t_cg, v)
    errors = []
    for eps in (0.0, 1e-2, 1e-1):
        with torch.no_grad():
            g = torch.Generator().manual_seed(1)
            sc.gp.inducing_m.copy_(xo[0] + eps * torch.randn(xo[0].shape, generator=g, dtype=DT))
            sc.gp.inducing_l.copy_(k[0] + eps * torch.randn(k[0].shape, generator=g, dtype=DT))
        errors.append((sc.gp.mean(sc.gp.prepare(q, k, v, xo), v) - target).abs().max().item())
    assert errors[0] < 1e-10, errors
    assert errors[0] < errors[1] < errors[2], errors


# -- covariance ---------------------------------------------------------------------------------
@settings.cholesky_jitter(float64=1e-15)
def test_covariance_equals_app_d_second_moment_route_and_ignores_values():
    unit = _unit(num_inducing=3, num_inducing_keys=4, noise=0.3)
    x = _x()
    refs, q, k, v, xo = _refs(unit, x)
    t = unit.gp.prepare(q, k, v, xo)
    dist = unit.gp.posterior(t, v)
    cov = dist.covariance_matrix
    for (b, h), r in refs.items():
        for a in range(v.shape[-1]):
            torch.testing.assert_close(cov[b, h], r.cov_second_moment(v[b, h], a),
                                       rtol=1e-7, atol=1e-9)
    other = unit.gp.posterior(t, 5 * torch.randn_like(v)).covariance_matrix
    torch.testing.assert_close(other, cov)
    torch.testing.assert_close(dist.variance[..., 0], cov.diagonal(dim1=-2, dim2=-1))
    assert dist.cov_root.shape[-1] == 3  # rank m: never an N x N factor


def test_mean_and_covariance_match_the_dtc_monte_carlo_chain():
    """z_l | z_k -> z_o | z_l -> z_m | z_o -> z_q | z_m through the DTC conditionals."""
    S = 20_000
    unit = _unit(dim=4, heads=1, num_inducing=3, num_inducing_keys=2, noise=0.4)
    x = _x(B=1, N=4, C=4)
    refs, q, k, v, xo = _refs(unit, x)
    dist = unit.gp.posterior(unit.gp.prepare(q, k, v, xo), v)
    nu, cov = dist.mean[0, 0].detach(), dist.covariance_matrix[0, 0].detach()
    draws = refs[(0, 0)].chain(v[0, 0], S, torch.Generator().manual_seed(0))
    _five_sigma(draws, nu, "DTC chain mean")
    r = draws - nu
    prods = torch.einsum("sia,sja->saij", r, r)
    for a in range(prods.shape[1]):
        _five_sigma(prods[:, a], cov, f"DTC chain covariance, column {a}")
    torch.manual_seed(1)
    own = dist.rsample((S,))[:, 0, 0].detach()
    _five_sigma(own, nu, "sampler mean")
    r = own - nu
    _five_sigma(torch.einsum("sia,sja->sij", r, r) / r.shape[-1], cov, "sampler covariance")


# -- the sparse CGP loss ------------------------------------------------------------------------
@settings.cholesky_jitter(float64=1e-15)
def test_loss_closed_form_matches_monte_carlo_over_z_o_and_z_m():
    S = 20_000
    unit = _unit(dim=4, heads=2, num_inducing=3, num_inducing_keys=2, noise=0.5)
    x = _x(B=1, N=4, C=4)
    refs, q, k, v, xo = _refs(unit, x)
    t = unit.gp.prepare(q, k, v, xo)
    nu = unit.gp.mean(t, v)
    closed = unit.gp.lower_bound(t, nu, v).detach()
    gen = torch.Generator().manual_seed(0)
    per_draw = sum(refs[(0, h)].loss_mc_terms(nu[0, h].detach(), v[0, h], S, gen) for h in range(2))
    _five_sigma(per_draw[:, None], closed, "App. E bound vs Monte Carlo")


@settings.cholesky_jitter(float64=1e-15)
def test_nystrom_is_exact_when_the_key_set_is_the_latent_inputs():
    unit = _unit(num_inducing=3, num_inducing_keys=5, noise=0.3)
    x = _x()
    q, k, v, xo = unit.project(x[:1])
    with torch.no_grad():
        unit.gp.inducing_l.copy_(xo[0].detach())
    t = unit.gp.prepare(q, k, v, xo)
    exact = unit.gp.lower_bound(t, unit.gp.mean(t, v), v)
    unit.gp.k_o = "nystrom"
    t = unit.gp.prepare(q, k, v, xo)
    ny = unit.gp.lower_bound(t, unit.gp.mean(t, v), v)
    torch.testing.assert_close(ny, exact, rtol=1e-8, atol=1e-7)


def test_loss_is_padding_invariant_and_reported_only_in_training():
    unit = _unit(num_inducing=3, noise=0.3).train()
    x = _x(B=2, N=6)
    mask = torch.ones(2, 6, dtype=torch.bool)
    mask[0, 4:] = False
    x[0, 4:] = 50 * torch.randn(2, 8, dtype=DT)
    unit(x, mask)
    padded = unit.objective_terms()["cgp_loss"]
    unit(x[:1, :4])
    torch.testing.assert_close(padded[0], unit.objective_terms()["cgp_loss"][0])
    unit.eval()
    unit(x, mask)
    assert unit.objective_terms() == {}


def test_mean_reduction_is_the_sum_per_entry():
    x = _x(B=2, N=6)
    mask = torch.ones(2, 6, dtype=torch.bool)
    mask[0, 4:] = False
    terms = {}
    for red in ("sum", "mean"):
        unit = _unit(num_inducing=3, noise=0.3, cgp_reduction=red).train()
        torch.manual_seed(1)
        unit(x, mask)
        terms[red] = unit.objective_terms()["cgp_loss"]
    torch.testing.assert_close(terms["mean"], terms["sum"] / (2 * 4 * mask.sum(-1).to(DT)))


# -- structure: linear in N -----------------------------------------------------------------------
class _LargestTensor(TorchDispatchMode):
    """The most elements of any tensor allocated, and the largest ``min`` of a tensor's last two
    dimensions (N for an N x N matrix, the inducing set size for N x m)."""

    def __init__(self):
        super().__init__()
        self.largest, self.square = 0, 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        for t in out if isinstance(out, (tuple, list)) else (out,):
            if isinstance(t, torch.Tensor):
                self.largest = max(self.largest, t.numel())
                if t.dim() >= 2:
                    self.square = max(self.square, min(t.shape[-2:]))
        return out


@pytest.mark.parametrize("k_o", ["nystrom", "exact"])
def test_no_n_by_n_tensor_in_forward_loss_and_backward(k_o):
    """N = 1024, m = l = 8: with ``k_o="nystrom"`` nothing of size N² is ever allocated (forward,
    regulariser, backward); ``"exact"`` forms exactly the one K_o of the regulariser."""
    N = 1024
    unit = _unit(dim=8, heads=2, num_inducing=8, noise=0.3, k_o=k_o).float().train()
    x = torch.randn(1, N, 8)
    mode = _LargestTensor()
    with mode:
        out = unit(x)
        (out.square().sum() + unit.objective_terms()["cgp_loss"].sum()).backward()
    if k_o == "nystrom":  # O(N (m + l)) tensors only: the stacked [3N, m + l] Gram at most
        assert mode.square < N and mode.largest < N * N // 8, (mode.square, mode.largest)
    else:
        assert mode.largest >= N * N
    with _LargestTensor() as m2, torch.no_grad():
        unit.eval()
        unit(x)
    assert m2.square < N and m2.largest < N * N // 8, (m2.square, m2.largest)


# -- inducing inputs ------------------------------------------------------------------------------
def test_inducing_inputs_start_at_real_tokens_once_and_survive_state_dicts():
    torch.manual_seed(0)
    unit = SCGPTAttention(8, 2, num_inducing=3, num_inducing_keys=2, noise=0.3).to(DT)
    assert not bool(unit.gp.inducing_initialized)
    x = _x(B=2, N=6)
    mask = torch.ones(2, 6, dtype=torch.bool)
    mask[1, 2:] = False
    unit.eval()
    unit(x, mask)
    assert not bool(unit.gp.inducing_initialized)  # evaluation never initialises
    unit.train()
    unit(x, mask)
    assert bool(unit.gp.inducing_initialized)
    _, _, _, xo = unit.project(x)
    real = xo.detach().transpose(0, 1)[:, mask]                    # [H, n_real, D]
    d = torch.cdist(unit.gp.inducing_m.detach(), real).min(-1).values
    assert d.max() < 0.05 * real.std()
    before = unit.gp.inducing_m.detach().clone()
    unit(2 * x, mask)  # no second initialisation
    torch.testing.assert_close(unit.gp.inducing_m.detach(), before)
    torch.manual_seed(1)
    fresh = SCGPTAttention(8, 2, num_inducing=3, num_inducing_keys=2, noise=0.3).to(DT).train()
    fresh(x, mask)  # initialises from data ...
    fresh.load_state_dict(unit.state_dict())  # ... then a checkpoint wins
    fresh(3 * x, mask)
    torch.testing.assert_close(fresh.gp.inducing_m.detach(), before)
    # a state without initialised inducing inputs (e.g. a kernel-attention warm start)
    state = unit.state_dict()
    state["gp.inducing_initialized"] = torch.tensor(False)
    fresh.load_state_dict(state)
    fresh(3 * x, mask)
    assert not torch.allclose(fresh.gp.inducing_m.detach(), before)


def test_float32_agrees_with_float64_and_options_are_validated():
    unit = _unit(dim=16, heads=2, num_inducing=6, noise=0.2)
    x = _x(B=3, N=12, C=16)
    with posterior_mean():
        ref = unit(x)
        out = unit.float()(x.float())
    torch.testing.assert_close(out.double(), ref, atol=1e-4, rtol=1e-3)
    assert isinstance(build_attention("scgpt", 8, 2, num_inducing=5, noise=0.5), SCGPTAttention)
    for bad in ({"k_o": "svd"}, {"cgp_loss": "marginal"}, {"inducing_init": "kmeans"},
                {"num_inducing": 0}, {"noise": -1.0}):
        with pytest.raises(ValueError):
            SCGPTAttention(8, 2, **bad)
    with pytest.raises(ValueError, match="attn_dropout"):      # no attention weights to drop
        build_attention("scgpt", 8, 2, attn_dropout=0.1)
