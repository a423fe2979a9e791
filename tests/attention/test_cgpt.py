"""CGPT: the inherited unit contract plus brute-force checks of the CGP algebra."""

import json
import math

import pytest
import torch
import torch.nn.functional as F

from gpattn_ppl import settings
from gpattn_ppl.attention import CGPTAttention, KernelAttention, build_attention
from gpattn_ppl.settings import posterior_mean
from gpattn_ppl.testing import AttentionUnitTestCase
from tests.reference.cgpt import CGPReference, se

DT = torch.float64


def _unit(dim=8, heads=2, seed=0, **kw):
    torch.manual_seed(seed)
    return CGPTAttention(dim, heads, **kw).to(DT).eval()


def _x(B=2, N=5, C=8, seed=1):
    return torch.randn(B, N, C, generator=torch.Generator().manual_seed(seed), dtype=DT)


def _refs(unit, x):
    """CGPReference per (b, h) and the projected values."""
    q, k, v, xo = (t.detach() for t in unit.project(x))
    sq, sk = unit.gp.scale_q.detach(), unit.gp.scale_k.detach()
    sq = sq.expand(unit.heads) if sq.numel() == 1 else sq
    sk = sk.expand(unit.heads) if sk.numel() == 1 else sk
    s2 = unit.gp.noise**2
    refs = {(b, h): CGPReference(q[b, h], k[b, h], xo[b, h], sq[h], sk[h], s2)
            for b in range(x.shape[0]) for h in range(unit.heads)}
    return refs, q, k, v, xo


def _five_sigma(samples, target, what):
    """|mean(samples) - target| <= 5 * std / sqrt(S) elementwise (std from the sample itself)."""
    S = samples.shape[0]
    err = (samples.mean(0) - target).abs()
    bound = 5 * samples.std(0) / S**0.5 + 1e-12
    worst = (err / bound).max().item()
    assert worst <= 1.0, f"{what}: worst deviation {worst:.2f} x the 5-sigma bound"


class TestCGPTAttention(AttentionUnitTestCase):
    def make_unit(self, dim, heads):
        return CGPTAttention(dim, heads, noise=0.1)


class TestCGPTAttentionVariants(AttentionUnitTestCase):
    """Per-head scales, W_o = W_k + offset, the marginal regulariser."""

    def make_unit(self, dim, heads):
        return CGPTAttention(dim, heads, noise=0.1, per_head_scales=True, latent="key_offset",
                             cgp_loss="marginal")


# -- predictive mean and covariance -----------------------------------------------------------
@settings.cholesky_jitter(float64=1e-15)
def test_mean_is_eq25_with_one_solve_and_the_unit_returns_it():
    unit = _unit(noise=0.3)
    with torch.no_grad():
        unit.gp.raw_scale_q.fill_(0.4)
        unit.gp.raw_scale_k.fill_(-0.3)
    x = _x()
    refs, q, k, v, xo = _refs(unit, x)
    t = unit.gp.prepare(q, k, v, xo)
    nu = unit.gp.mean(t, v)
    for (b, h), r in refs.items():
        torch.testing.assert_close(nu[b, h], r.mean(v[b, h]), rtol=1e-9, atol=1e-10)
    with posterior_mean():
        out = unit(x)
    torch.testing.assert_close(out, unit.out(unit.merge_heads(nu)), rtol=1e-12, atol=1e-12)
    # the attention matrix is K_qo P_o K_ok and nu = K V
    torch.testing.assert_close(unit.attention_matrix(x) @ v, nu, rtol=1e-9, atol=1e-10)


@settings.cholesky_jitter(float64=1e-15)
def test_covariance_equals_second_moment_route_and_ignores_values():
    unit = _unit(noise=0.3)
    x = _x()
    refs, q, k, v, xo = _refs(unit, x)
    gp = unit.gp
    dist = gp.posterior(gp.prepare(q, k, v, xo), v)
    cov = dist.covariance_matrix
    for (b, h), r in refs.items():
        for a in range(v.shape[-1]):  # same Sigma_post for every column
            torch.testing.assert_close(cov[b, h], r.cov_second_moment(v[b, h], a),
                                       rtol=1e-7, atol=1e-9)
    other = gp.posterior(gp.prepare(q, k, v, xo), 10 * torch.randn_like(v)).covariance_matrix
    torch.testing.assert_close(other, cov, rtol=1e-10, atol=1e-12)
    assert torch.linalg.eigvalsh(cov).min() > 0
    torch.testing.assert_close(dist.variance[..., 0], cov.diagonal(dim1=-2, dim2=-1))


def test_mean_and_covariance_match_a_monte_carlo_chain_of_the_nested_expectation():
    """z_o ~ p(z_o | z_k), then z_q ~ p(z_q | z_o): 20,000 draws, 5-sigma bounds."""
    S = 20_000
    unit = _unit(dim=4, heads=1, noise=0.3)
    x = _x(B=1, N=4, C=4)
    refs, q, k, v, xo = _refs(unit, x)
    dist = unit.gp.posterior(unit.gp.prepare(q, k, v, xo), v)
    nu, cov = dist.mean[0, 0].detach(), dist.covariance_matrix[0, 0].detach()
    gen = torch.Generator().manual_seed(0)
    draws = refs[(0, 0)].chain(v[0, 0], S, gen)                      # [S, n, D]
    _five_sigma(draws, nu, "chain mean")
    r = draws - nu
    prods = torch.einsum("sia,sja->saij", r, r)                     # per column
    for a in range(prods.shape[1]):
        _five_sigma(prods[:, a], cov, f"chain covariance, column {a}")
    # and the unit's own sampler (one joint Cholesky sample per (b, h))
    torch.manual_seed(1)
    own = dist.rsample((S,))[:, 0, 0].detach()
    _five_sigma(own, nu, "sampler mean")
    r = own - nu
    _five_sigma(torch.einsum("sia,sja->sij", r, r) / r.shape[-1], cov, "sampler covariance")


# -- limits and (a)symmetry ---------------------------------------------------------------------
@settings.cholesky_jitter(float64=1e-15)
def test_symmetric_limit_is_symmetric_kernel_attention():
    """W_q = W_k = W_o, sigma_q = sigma_k = 1, sigma^2 -> 0: K V with K = k(q, q) symmetric PSD,
    Sigma_post -> 0 (CGPT §2.5, eqs. 10-12)."""
    unit = _unit(dim=4, heads=1, noise=1e-5)  # sigma^2 = 1e-10
    with torch.no_grad():
        W = unit.proj.weight[:4].clone()
        unit.proj.weight[4:8] = W
        unit.latent.weight.copy_(W)
    x = 3 * _x(B=2, N=5, C=4)  # well separated tokens: K_o well conditioned
    q, k, v, xo = unit.project(x)
    t = unit.gp.prepare(q, k, v, xo)
    A = unit.attention_matrix(x)
    K = se(q[0, 0], q[0, 0])
    assert torch.linalg.eigvalsh(K).min() > 1e-3
    torch.testing.assert_close(A, A.mT, atol=1e-8, rtol=0)
    torch.testing.assert_close(A[0, 0], K, atol=1e-7, rtol=0)
    torch.testing.assert_close(unit.gp.mean(t, v)[0, 0], K @ v[0, 0], atol=1e-7, rtol=0)
    assert t.sigma_post.abs().max() < 1e-8


@settings.cholesky_jitter(float64=1e-15)
def test_latent_inputs_equal_keys_give_asymmetric_kernel_attention():
    """W_o = W_k (the ``key_offset`` start), sigma^2 -> 0: the unit *is* the unnormalised canonical
    kernel attention with the same weights (the model CGPT is warm-started from)."""
    unit = _unit(dim=8, heads=2, noise=1e-5, latent="key_offset")
    torch.manual_seed(3)
    ker = KernelAttention(8, 2, kernel="canonical", normalize=False).to(DT).eval()
    ker.proj.weight.data.copy_(unit.proj.weight)
    ker.out.load_state_dict(unit.out.state_dict())
    x = 3 * _x()
    with posterior_mean():
        torch.testing.assert_close(unit(x), ker(x), atol=1e-6, rtol=0)
    A = unit.attention_matrix(x)
    assert (A - A.mT).abs().max() > 1e-2  # W_q != W_k: asymmetric


def test_cross_covariance_is_asymmetric_iff_projections_differ():
    """K_qk = s_q s_k k(q_a, k_b) differs from K_kq^T... read entrywise: K_qk is not symmetric
    (kappa_qk(x, x') != kappa_qk(x', x)) when W_q != W_k, and is when W_q = W_k (eq. 16)."""
    unit = _unit()
    x = _x()
    q, k, _, _ = unit.project(x)
    K_qk = se(q[0, 0], k[0, 0])
    assert (K_qk - K_qk.T).abs().max() > 1e-3
    torch.testing.assert_close(se(k[0, 0], q[0, 0]).T, K_qk)  # K_kq^T = K_qk (same pair)
    A = unit.attention_matrix(x)
    assert (A - A.mT).abs().max() > 1e-3
    with torch.no_grad():
        unit.proj.weight[8:16] = unit.proj.weight[:8]
    q, k, _, _ = unit.project(x)
    K_qk = se(q[0, 0], k[0, 0])
    torch.testing.assert_close(K_qk, K_qk.T)


# -- the CGP regulariser ------------------------------------------------------------------------
@settings.cholesky_jitter(float64=1e-15)
def test_jensen_closed_form_matches_the_papers_monte_carlo_estimator():
    S = 20_000
    unit = _unit(dim=4, heads=2, noise=0.3)
    x = _x(B=1, N=4, C=4)
    refs, q, k, v, xo = _refs(unit, x)
    t = unit.gp.prepare(q, k, v, xo)
    nu = unit.gp.mean(t, v)
    closed = unit.gp.lower_bound(t, nu, v, "jensen").detach()
    gen = torch.Generator().manual_seed(0)
    per_draw = sum(refs[(0, h)].jensen_mc_terms(nu[0, h].detach(), v[0, h], S, gen)
                   for h in range(2))
    _five_sigma(per_draw[:, None], closed, "Jensen bound vs eqs. 42-43")
    # the unit's own "mc" option converges to the same value
    torch.manual_seed(2)
    mc = unit.gp.lower_bound(t, nu, v, "mc", samples=S).detach()
    assert (mc - closed).abs().item() <= 5 * per_draw.std().item() / S**0.5


@settings.cholesky_jitter(float64=1e-15)
def test_marginal_is_the_exact_log_marginal_and_bounds_jensen():
    unit = _unit(noise=0.2)
    x = _x()
    refs, q, k, v, xo = _refs(unit, x)
    t = unit.gp.prepare(q, k, v, xo)
    nu = unit.gp.mean(t, v)
    marg = unit.gp.lower_bound(t, nu, v, "marginal").detach()
    jen = unit.gp.lower_bound(t, nu, v, "jensen").detach()
    assert (marg >= jen).all()
    for b in range(x.shape[0]):
        ref = sum(refs[(b, h)].marginal(nu[b, h].detach(), v[b, h]) for h in range(unit.heads))
        torch.testing.assert_close(marg[b], ref, rtol=1e-8, atol=1e-8)


@settings.cholesky_jitter(float64=1e-15)
def test_observation_noise_regulariser_matches_references_and_is_bounded():
    S = 20_000
    unit = _unit(dim=4, heads=2, noise=0.3)
    x = _x(B=1, N=4, C=4)
    refs, q, k, v, xo = _refs(unit, x)
    s2 = unit.gp.noise**2
    t = unit.gp.prepare(q, k, v, xo)
    nu = unit.gp.mean(t, v)
    marg = unit.gp.lower_bound(t, nu, v, "marginal", observation_noise=True).detach()
    ref = sum(refs[(0, h)].marginal(nu[0, h].detach(), v[0, h], obs_var=s2) for h in range(2))
    torch.testing.assert_close(marg[0], ref, rtol=1e-8, atol=1e-8)
    closed = unit.gp.lower_bound(t, nu, v, "jensen", observation_noise=True).detach()
    gen = torch.Generator().manual_seed(0)
    per_draw = sum(refs[(0, h)].jensen_mc_terms(nu[0, h].detach(), v[0, h], S, gen, obs_var=s2)
                   for h in range(2))
    _five_sigma(per_draw[:, None], closed, "noisy Jensen bound vs MC")
    assert (marg >= closed).all()
    # with zero values the paper's bound is unbounded above: scaling sigma_q, sigma_k by c scales
    # Sigma_q, X_q, Sigma_k, X_k by c^2, so the bound moves by exactly -2 H D n log c (the
    # collapse direction seen on CoLA); the noisy one stays below -n D log(2 pi sigma^2) per head
    small = _unit(dim=4, heads=2, noise=1e-2)
    q, k, xo = torch.randn(3, 1, 2, 4, 2, dtype=DT, generator=torch.Generator().manual_seed(3))
    v = torch.zeros(1, 2, 4, 2, dtype=DT)
    cap = -2 * 2 * 4 * 2 * 0.5 * math.log(2 * math.pi * small.gp.noise**2)  # H sides n D / 2
    paper, noisy = [], []
    for c in (1e-1, 1e-3):
        with torch.no_grad():
            raw = small.gp.raw_scale_q_constraint.inverse_transform(torch.tensor(c, dtype=DT))
            small.gp.raw_scale_q.fill_(raw)
            small.gp.raw_scale_k.fill_(raw)
        t = small.gp.prepare(q, k, v, xo)
        nu = small.gp.mean(t, v)
        paper.append(small.gp.lower_bound(t, nu, v, "jensen").item())
        noisy.append(small.gp.lower_bound(t, nu, v, "jensen", observation_noise=True).item())
    assert paper[1] - paper[0] == pytest.approx(-2 * 2 * 2 * 4 * math.log(1e-2), rel=1e-6)
    assert max(noisy) <= cap


def test_mean_reduction_is_the_sum_per_entry():
    torch.manual_seed(0)
    x = _x(B=2, N=6)
    mask = torch.ones(2, 6, dtype=torch.bool)
    mask[0, 4:] = False
    terms = {}
    for red in ("sum", "mean"):
        unit = _unit(noise=0.1, cgp_reduction=red).train()
        torch.manual_seed(1)
        unit(x, mask)
        terms[red] = unit.objective_terms()["cgp_loss"]
    n_b = mask.sum(-1).to(DT)
    torch.testing.assert_close(terms["mean"], terms["sum"] / (2 * 4 * n_b))
    with pytest.raises(ValueError, match="cgp_reduction"):
        CGPTAttention(8, 2, cgp_reduction="avg")


def test_regulariser_is_padding_invariant_and_reported_only_in_training():
    unit = _unit(noise=0.1).train()
    x = _x(B=2, N=6)
    mask = torch.ones(2, 6, dtype=torch.bool)
    mask[0, 4:] = False
    x[0, 4:] = 50 * torch.randn(2, 8, dtype=DT)
    unit(x, mask)
    padded = unit.objective_terms()["cgp_loss"]
    unit(x[:1, :4])
    alone = unit.objective_terms()["cgp_loss"]
    torch.testing.assert_close(padded[0], alone[0], rtol=1e-9, atol=1e-8)
    unit.eval()
    unit(x, mask)
    assert unit.objective_terms() == {}


def test_float32_runs_in_gp_dtype_and_agrees_with_float64():
    unit = _unit(dim=16, heads=2, noise=0.05).train()
    x = _x(B=3, N=12, C=16)
    with posterior_mean():
        ref = unit(x)
    f32 = unit.float()
    with posterior_mean():
        out = f32(x.float())
    assert out.dtype == torch.float32
    torch.testing.assert_close(out.double(), ref, atol=1e-4, rtol=1e-3)
    f32(x.float())
    assert torch.isfinite(f32.objective_terms()["cgp_loss"]).all()


def test_options_are_validated_and_registered():
    assert isinstance(build_attention("cgpt", 8, 2, noise=0.5, cgp_loss="mc", cgp_samples=4),
                      CGPTAttention)
    with pytest.raises(ValueError, match="cgp_loss"):
        CGPTAttention(8, 2, cgp_loss="elbo")
    with pytest.raises(ValueError, match="latent"):
        CGPTAttention(8, 2, latent="tied")
    with pytest.raises(ValueError, match="noise"):
        CGPTAttention(8, 2, noise=0.0)
    with pytest.raises(ValueError, match="attn_dropout"):      # no attention weights to drop
        build_attention("cgpt", 8, 2, attn_dropout=0.1)


# -- integration: the Pyro program and the warm start ---------------------------------------------
def test_program_weights_cgp_loss_with_alpha_schedule():
    from gpattn_ppl.infer.program import PyroProgram
    from gpattn_ppl.models import build_model

    net = build_model({"arch": "text", "dim": 8, "heads": 2, "depth": 1, "mlp_dim": 8,
                       "dropout": 0.0, "attention": {"kind": "cgpt", "noise": 0.1}},
                      num_classes=2, vocab_size=20).to(DT)
    g = torch.Generator().manual_seed(0)
    x = torch.randint(1, 20, (4, 6), generator=g)
    mask = torch.ones(4, 6, dtype=torch.bool)
    y = torch.tensor([0, 1, 1, 0])
    prog = PyroProgram(net, num_data=100, objective={"cgp_alpha": {"kind": "linear", "start": 0.0,
                                                                   "end": 1.0}},
                       total_epochs=10)
    net.train()
    for epoch, alpha in ((0.0, 0.0), (5.0, 0.5), (10.0, 1.0)):
        prog.set_epoch(epoch)
        torch.manual_seed(0)
        loss = prog.loss(x, mask, y, torch.arange(4))
        torch.manual_seed(0)
        logits = net(x, mask)
        cgp = net.objective_terms()["blocks.0.attn.cgp_loss"]
        manual = F.cross_entropy(logits, y) + alpha * cgp.mean()
        torch.testing.assert_close(loss, manual, rtol=1e-10, atol=1e-10)


def test_warm_start_from_asymmetric_kernel_attention_uses_the_loaded_weights(tmp_path):
    """The paper's recipe: train canonical asymmetric kernel attention, then start CGPT from it
    (``train.init_from``). The loaded tensors are the ones the CGPT network computes with: with
    W_o = W_k + 0 and sigma^2 -> 0 its posterior mean reproduces the kernel model's logits."""
    from gpattn_ppl.infer.checkpoint import save_atomic
    from gpattn_ppl.run.experiment import Trainer
    from tests.run.conftest import TINY

    cfg = json.loads(json.dumps(TINY))
    cfg["train"]["epochs"] = 1
    cfg["model"]["attention"] = {"kind": "kernel", "kernel": "canonical", "normalize": False}
    src = Trainer(cfg, tmp_path / "kernel")
    src.train_epoch()  # one epoch of the kernel model, saved as the run's best checkpoint
    save_atomic({"model": src.net.state_dict(), "epoch": 1, "config": src.cfg},
                tmp_path / "kernel" / "best.pt")
    warm_cfg = json.loads(json.dumps(cfg))
    warm_cfg["model"]["attention"] = {"kind": "cgpt", "noise": 1e-4, "latent": "key_offset"}
    warm_cfg["train"]["init_from"] = str(tmp_path / "kernel")
    warm_cfg["train"]["seed"] = 7
    warm = Trainer(warm_cfg, tmp_path / "cgpt", bundle=src.bundle)
    loaded = set(warm.warm_start["loaded"])
    best = torch.load(tmp_path / "kernel" / "best.pt", weights_only=False)["model"]
    # every tensor but the kernel-attention amplitude loads; CGPT's own ones keep their init
    assert loaded == {n for n in best if ".attn.kernel." not in n}
    assert {"blocks.0.attn.proj.weight", "blocks.0.attn.out.weight"} <= loaded
    assert not warm.warm_start["shape_mismatch"]
    assert {"blocks.0.attn.gp.raw_scale_q", "blocks.0.attn.latent_offset"} <= set(
        warm.warm_start["missing"])
    state = warm.net.state_dict()
    for name in loaded:
        torch.testing.assert_close(state[name], best[name])
    cold_cfg = json.loads(json.dumps(warm_cfg))
    cold_cfg["train"]["init_from"] = None
    cold = Trainer(cold_cfg, tmp_path / "cold", bundle=src.bundle)
    b = warm.bundle.val.batch(torch.arange(16))
    src.net.load_state_dict(best)
    for net in (src.net, warm.net, cold.net):
        net.eval()
    with torch.no_grad(), posterior_mean(), settings.gp_dtype(torch.float64), \
            settings.cholesky_jitter(float64=1e-14):
        ref, got, fresh = (n(b.x, b.mask) for n in (src.net, warm.net, cold.net))
    torch.testing.assert_close(got, ref, atol=2e-4, rtol=1e-4)
    assert (fresh - ref).abs().max() > 1e-2
