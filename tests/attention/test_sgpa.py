"""SGPAttention: the inherited contract checks plus SGPA's brute-force checks (float64)."""

import pyro
import pyro.poutine as poutine
import pytest
import torch

from gpattn_ppl import settings
from gpattn_ppl.attention import KernelAttention, SGPAttention, attention_options, build_attention
from gpattn_ppl.errors import NumericsWarning
from gpattn_ppl.infer.program import PyroProgram
from gpattn_ppl.linalg import CholeskyError, NonFiniteError, free_cholesky, numerics_stats
from gpattn_ppl.models import build_model
from gpattn_ppl.ppl import SiteContext, site_context
from gpattn_ppl.settings import posterior_mean
from gpattn_ppl.testing import AttentionUnitTestCase
from tests.reference.sgpa import decoupled_sgpa_reference, standard_sgpa_reference

JIT = settings.cholesky_jitter.value(torch.float64)


class TestSGPAStandard(AttentionUnitTestCase):
    def make_unit(self, dim, heads):
        return SGPAttention(dim, heads, variant="standard", max_len=8)


class TestSGPADecoupled(AttentionUnitTestCase):
    def make_unit(self, dim, heads):
        return SGPAttention(dim, heads, variant="decoupled", num_inducing=3)


class TestSGPADecoupledDiagRBF(AttentionUnitTestCase):
    def make_unit(self, dim, heads):
        return SGPAttention(dim, heads, variant="decoupled", num_inducing=3, cov="diag",
                            kernel="rbf")


def _x(B=2, N=5, C=8, seed=0, scale=1.0):
    g = torch.Generator().manual_seed(seed)
    return scale * torch.randn(B, N, C, generator=g, dtype=torch.float64)


def _unit(variant, seed=0, **kw):
    torch.manual_seed(seed)
    unit = SGPAttention(8, 2, variant=variant, **kw).double()
    with torch.no_grad():
        unit.strategy.raw_chol.normal_(0.0, 0.3)
    return unit


def _identity_out(unit):
    with torch.no_grad():
        unit.out.weight.copy_(torch.eye(unit.dim))
        unit.out.bias.zero_()


# -- options ---------------------------------------------------------------------------------------
def test_options_are_keyword_only_and_validated():
    opts = attention_options("sgpa")
    assert {"variant", "num_inducing", "kernel", "cov", "max_len"} <= set(opts)
    with pytest.raises(ValueError, match="variant"):
        SGPAttention(8, 2, variant="nope")
    with pytest.raises(ValueError, match="decoupled"):
        SGPAttention(8, 2, variant="standard", cov="diag")
    with pytest.raises(ValueError, match="kernel"):
        SGPAttention(8, 2, kernel="laplace")
    with pytest.raises(ValueError, match="max_len"):
        SGPAttention(8, 2, variant="standard", max_len=4)(_x(N=5).float())
    with pytest.raises(ValueError, match="outputscale_init"):
        SGPAttention(8, 2, outputscale_init=0.0)
    # [ref] init log sigma_f^2 = -4: the unit starts near zero so the residual stream dominates
    torch.testing.assert_close(SGPAttention(8, 2).kernel.outputscale, torch.full((2,), 0.0183),
                               atol=1e-4, rtol=0)
    assert {"outputscale_init"} <= set(opts)
    assert "attn_dropout" not in opts                          # no attention weights to drop
    with pytest.raises(ValueError, match="attn_dropout"):
        build_attention("sgpa", 8, 2, attn_dropout=0.1)


# -- standard: references --------------------------------------------------------------------------
def test_standard_mean_is_unnormalised_symmetric_kernel_attention():
    """Posterior mean = L Lᵀ v = (K + εI) v: symmetric kernel attention (CGPT eq. 6-7)."""
    unit = _unit("standard", max_len=8)
    ref = _kernel_attention_twin(unit)
    x = _x()
    mask = torch.tensor([[True] * 5, [True, True, True, False, False]])
    with posterior_mean():
        out = unit(x, mask)
    torch.testing.assert_close(out[mask], ref(x, mask)[mask], rtol=1e-6, atol=1e-6)


def _kernel_attention_twin(unit):
    ref = KernelAttention(8, 2, kernel="exponential", symmetric=True, normalize=False).double()
    ref.proj.load_state_dict(unit.proj.state_dict())
    ref.kernel.load_state_dict(unit.kernel.state_dict())
    ref.out.load_state_dict(unit.out.state_dict())
    return ref


def test_standard_sample_with_vanishing_S_is_kernel_attention():
    """S̃ -> 0: a sample equals the mean, i.e. kernel attention K_qk K_kk⁻¹ (K v) = K v."""
    unit = _unit("standard", max_len=8)
    ref = _kernel_attention_twin(unit)
    x = _x()
    assert not torch.allclose(unit(x), ref(x), rtol=1e-3, atol=1e-3)
    with torch.no_grad():
        unit.strategy.raw_chol.zero_().diagonal(dim1=-2, dim2=-1).fill_(-40.0)
    torch.testing.assert_close(unit(x), ref(x), rtol=1e-6, atol=1e-6)


def test_standard_matches_naive_reference():
    """Mean, per-head covariance and KL against a head-by-head dense reference."""
    unit = _unit("standard", max_len=8).eval()
    _identity_out(unit)
    x = _x(B=1)
    unit(x)
    kl = unit.objective_terms()["kl"]
    post = unit.predictive(x).mvn
    W = unit.proj.weight
    refs = standard_sgpa_reference(x[0], W[:8], W[8:], unit.kernel.outputscale,
                                   unit.kernel.base_kernel.lengthscale,
                                   free_cholesky(unit.strategy.raw_chol), 2, JIT)
    for h, r in enumerate(refs):
        torch.testing.assert_close(post.mean[0, h], r["mean"].T, rtol=1e-8, atol=1e-10)
        torch.testing.assert_close(post.covariance_matrix[0, h, 1], r["cov"], rtol=1e-8,
                                   atol=1e-10)
    torch.testing.assert_close(kl[0], sum(r["kl"] for r in refs), rtol=1e-8, atol=1e-8)


# -- decoupled: references -------------------------------------------------------------------------
def test_decoupled_matches_naive_reference_with_per_head_inducing_keys():
    """Each head projects its inducing keys with ITS OWN rows of W_qk (a pitfall of the reference code)."""
    unit = _unit("decoupled", num_inducing=3).eval()
    with torch.no_grad():
        unit.strategy.inducing_weights.normal_(0.0, 0.5)
    _identity_out(unit)
    x = _x(B=1)
    unit(x)
    post, terms = unit.predictive(x).mvn, unit.objective_terms()
    W = unit.proj.weight
    kern = unit.kernel
    R = free_cholesky(unit.strategy.raw_chol)
    kl_beta = 0.0
    for h in range(2):
        sl = slice(4 * h, 4 * h + 4)
        q, v = x[0] @ W[sl].T, x[0] @ W[8:][sl].T
        k_beta = unit.strategy.inducing.inducing_inputs[h] @ W[sl].T
        mean, covs, kb, kg = decoupled_sgpa_reference(
            q, v, k_beta, unit.strategy.inducing_weights[h], R[h],
            lambda a, b, h=h: kern(a, b).to_dense()[h], JIT)
        torch.testing.assert_close(post.mean[0, h], mean.T, rtol=1e-8, atol=1e-10)
        torch.testing.assert_close(post.covariance_matrix[0, h], covs, rtol=1e-8, atol=1e-10)
        kl_beta = kl_beta + kb.sum()
        if h == 0:
            kl_gamma = kg.sum()
        else:
            kl_gamma = kl_gamma + kg.sum()
    torch.testing.assert_close(terms["kl"][0], kl_gamma, rtol=1e-8, atol=1e-10)
    torch.testing.assert_close(terms["kl_global"], kl_beta, rtol=1e-8, atol=1e-10)
    with posterior_mean():
        out = unit(x)
    torch.testing.assert_close(out, unit.merge_heads(post.mean.mT), rtol=1e-10, atol=1e-10)


def test_decoupled_gamma_term_vanishes_when_global_keys_are_the_tokens():
    unit = _unit("decoupled", num_inducing=5)
    x = _x(B=1, N=5, scale=0.5)
    with torch.no_grad():
        unit.strategy.inducing.inducing_inputs.copy_(x[0].expand(2, 5, 8))
    with posterior_mean():
        unit(x)
    kl_gamma = unit.objective_terms()["kl"]
    state = unit.prepare(x, None)
    vKv = 0.5 * (state.v * state.Kv).sum()
    assert kl_gamma.abs().item() < 1e-6 * vKv.item()


def test_decoupled_without_global_keys_equals_standard_at_identity_covariance():
    dec = _unit("decoupled", num_inducing=0).eval()
    std = _unit("standard", max_len=8).eval()
    with torch.no_grad():
        std.strategy.raw_chol.zero_()
    std.proj.load_state_dict(dec.proj.state_dict())
    std.kernel.load_state_dict(dec.kernel.state_dict())
    std.out.load_state_dict(dec.out.state_dict())
    x = _x()
    for unit in (dec, std):
        with posterior_mean():
            unit(x)
    p_dec, p_std = dec.predictive(x).mvn, std.predictive(x).mvn
    torch.testing.assert_close(p_dec.mean, p_std.mean, rtol=1e-6, atol=1e-6)
    torch.testing.assert_close(p_dec.covariance_matrix, p_std.covariance_matrix, rtol=1e-6,
                               atol=1e-6)
    torch.testing.assert_close(dec.objective_terms()["kl"], std.objective_terms()["kl"],
                               rtol=1e-6, atol=1e-6)
    assert "kl_global" not in dec.objective_terms()


# -- sampling --------------------------------------------------------------------------------------
@pytest.mark.parametrize("variant,cov", [("standard", "full"), ("decoupled", "full"),
                                         ("decoupled", "diag")])
def test_unit_sample_covariance_matches_analytic(variant, cov):
    """Output samples (W_O = I) of one sequence repeated S = 1e5 times: mean and per-head joint
    covariance over tokens -> the unit's predictive (5 sigma; diag: marginal variances only)."""
    kw = {"max_len": 8} if variant == "standard" else {"num_inducing": 2, "cov": cov}
    unit = _unit(variant, **kw).eval()
    _identity_out(unit)
    S, N = 100_000, 3
    x = _x(B=1, N=N).expand(S, N, 8)
    torch.manual_seed(0)
    with torch.no_grad():
        f = unit(x).view(S, N, 2, 4).permute(0, 2, 3, 1)                # [S, H, D, N]
        post = unit.predictive(x[:1]).mvn                               # the one sequence
    mean, Sigma = post.mean[0], post.covariance_matrix[0]
    d = f - mean
    se_mean = (Sigma.diagonal(dim1=-2, dim2=-1) / S).sqrt()
    assert (d.mean(0).abs() <= 5 * se_mean).all()
    prod = d.unsqueeze(-1) * d.unsqueeze(-2)
    emp, se = prod.mean(0), prod.std(0) / S ** 0.5
    if cov == "diag":
        emp, se = emp.diagonal(dim1=-2, dim2=-1), se.diagonal(dim1=-2, dim2=-1)
        Sigma = Sigma.diagonal(dim1=-2, dim2=-1)
    assert ((emp - Sigma).abs() <= 5 * se).all(), ((emp - Sigma).abs() / se).max()


def test_decoupled_thin_mode_draws_global_values_per_sequence():
    """Thin mode: independent β draws per sequence (lower variance), KL once."""
    unit = _unit("decoupled", num_inducing=2, cov="diag")
    _identity_out(unit)
    x = _x(B=1).expand(2, 5, 8)
    out = unit(x)
    assert not torch.allclose(out[0], out[1])
    assert unit.objective_terms()["kl_global"].dim() == 0


# -- numerics ----------------------------------------------------------------------------------
def _count_cholesky(monkeypatch):
    calls = []
    real = torch.linalg.cholesky_ex

    def counting(A, *a, **k):
        calls.append(A.shape)
        return real(A, *a, **k)

    monkeypatch.setattr(torch.linalg, "cholesky_ex", counting)
    return calls


def _singular_head_1(variant):
    """Head 1's kernel matrix is exactly σ² 11ᵀ (σ² = 64, so its equilibrated form is exactly
    11ᵀ): standard -- head 1's W_qk rows are 0, so all its keys coincide; decoupled -- head 1's
    global inducing inputs coincide (K_bb). Head 0 is non-singular."""
    unit = _unit(variant, kernel="rbf", max_len=8, num_inducing=4)
    unit.site_prefix = "blocks.1.attn"
    with torch.no_grad():
        unit.kernel.raw_outputscale.fill_(64.0)             # softplus(x) = x exactly for x > 20
        if variant == "standard":
            unit.proj.weight[4:8].zero_()
        else:
            unit.strategy.inducing.inducing_inputs[1] = 0.3
    assert torch.equal(unit.kernel.outputscale, torch.full((2,), 64.0, dtype=torch.float64))
    return unit


@pytest.mark.parametrize("variant", ["standard", "decoupled"])
def test_singular_kernel_matrix_escalation_is_bounded_then_named_error(monkeypatch, variant):
    """A singular kernel matrix: jitter from 1e-30 fails while 1 + ε rounds to 1 and succeeds
    once it escalates past float64 resolution (warned, counted for head 1's matrices only);
    with too few escalations allowed, the error names the block, the matrix and the head,
    after exactly 1 + max_tries attempts."""
    unit = _singular_head_1(variant)
    x = _x()
    calls = _count_cholesky(monkeypatch)
    unit(x)                                                  # default jitter: one try suffices
    assert len(calls) == (1 if variant == "standard" else 2)
    calls.clear()
    matrix = "K_kk" if variant == "standard" else "K_bb"
    with settings.cholesky_jitter(float64=1e-30, max_tries=20):
        with pytest.warns(NumericsWarning, match=rf"blocks\.1\.attn {matrix}.*head 1"):
            out = unit(x)
    assert torch.isfinite(out).all()
    assert len(calls) >= 15                                  # 1e-30 ... ~1e-15 escalations
    stats = numerics_stats()                                 # head 1 of each sequence only
    assert stats["escalations"] == (x.shape[0] if variant == "standard" else 1)
    assert 1e-20 < stats["max_jitter"] < 1e-10
    assert set(stats["by_where"]) == {f"blocks.1.attn {matrix}"}
    calls.clear()
    with settings.cholesky_jitter(float64=1e-30, max_tries=5):
        with pytest.raises(CholeskyError, match=rf"blocks\.1\.attn {matrix}, head 1") as err:
            unit(x)
    assert len(calls) == 1 + 5
    assert "after 5 escalations" in str(err.value)


def test_overflowing_kernel_matrix_raises_named_overflow_without_escalation(monkeypatch):
    """An overflowing exponential kernel (inf entries) is never factorisable: named as the
    overflow it is at the first factorisation, without trying any jitter (no endless jitter
    loop, a pitfall of the reference code)."""
    unit = _unit("standard", max_len=8)
    unit.site_prefix = "blocks.0.attn"
    with torch.no_grad():
        unit.kernel.base_kernel.lengthscale = torch.full((2, 1, 4), 1e-3, dtype=torch.float64)
    calls = _count_cholesky(monkeypatch)
    with settings.cholesky_jitter(max_tries=3):
        with pytest.raises(NonFiniteError, match=r"blocks\.0\.attn K_kk, head 0.*inf.*overflow"):
            unit(_x())
    assert len(calls) == 1


def test_gp_dtype_float64_under_float32_inputs():
    unit = SGPAttention(8, 2, variant="decoupled", num_inducing=3)
    x = _x().float()
    with settings.gp_dtype(torch.float64):
        out = unit(x)
    assert out.dtype == torch.float32 and torch.isfinite(out).all()


# -- Pyro ------------------------------------------------------------------------------------------
@pytest.mark.parametrize("variant", ["standard", "decoupled"])
def test_sites_mode_sites_and_kl_match_thin_mode(variant):
    """Standard: u is local (inside the data plate); decoupled: u is global, drawn once per
    sequence (site batch [B, H, D] under poutine.scale(1/B)). The ELBO's analytic KL of the
    site (times the site's scale, as TraceMeanField_ELBO weights it) equals the thin-mode KL
    term: the global KL is counted once."""
    unit = _unit(variant, max_len=8, num_inducing=3)
    unit.site_prefix = "blocks.0.attn"
    x = _x(B=3)
    unit(x)
    thin = unit.objective_terms()
    plate = pyro.plate("data", 100, subsample=torch.arange(3))
    with site_context(SiteContext("sites", "guide", plate)):
        guide = poutine.trace(lambda: unit(x)).get_trace()
    with site_context(SiteContext("sites", "model", plate)):
        model = poutine.trace(poutine.replay(lambda: unit(x), trace=guide)).get_trace()
    site_g, site_m = guide.nodes["blocks.0.attn.u"], model.nodes["blocks.0.attn.u"]
    in_plate = any(f.name == "data" for f in site_g["cond_indep_stack"])
    assert in_plate == (variant == "standard")
    assert torch.equal(site_g["value"], site_m["value"])
    kl = torch.distributions.kl_divergence(site_g["fn"], site_m["fn"])
    if variant == "standard":
        assert site_g["value"].shape == (3, 2, 5, 4)                     # [B, H, N, D]
        assert kl.shape == (3,)
        torch.testing.assert_close(kl, thin["kl"])
        assert set(unit.objective_terms()) == set()
    else:
        assert site_g["value"].shape == (3, 2, 4, 3)                     # [B, H, D, M]
        assert site_g["scale"] == pytest.approx(1 / 3) and site_m["scale"] == site_g["scale"]
        assert kl.shape == ()
        torch.testing.assert_close(kl * site_g["scale"], thin["kl_global"])
        assert set(unit.objective_terms()) == {"kl"}          # the local γ part stays a term


@pytest.mark.parametrize("mode", ["thin", "sites"])
@pytest.mark.parametrize("variant", ["standard", "decoupled"])
def test_program_places_local_kl_in_plate_and_global_outside(mode, variant):
    net = build_model({"arch": "text", "dim": 8, "heads": 2, "depth": 2, "mlp_dim": 8,
                       "dropout": 0.0, "attention": {"kind": "sgpa", "variant": variant,
                                                     "num_inducing": 3, "max_len": 8}},
                      num_classes=2, vocab_size=20).double()
    assert all(isinstance(b.attn, SGPAttention) for b in net.blocks)
    prog = PyroProgram(net, num_data=50, mode=mode)
    g = torch.Generator().manual_seed(0)
    tokens = torch.randint(1, 20, (4, 6), generator=g)
    mask = torch.ones(4, 6, dtype=torch.bool)
    mask[1, 4:] = False
    y, idx = torch.tensor([0, 1, 1, 0]), torch.tensor([3, 7, 11, 40])
    loss = prog.loss(tokens, mask, y, idx)
    assert torch.isfinite(loss)
    loss.backward()
    tr = poutine.trace(prog.model).get_trace(tokens, mask, y, idx)
    for name, site in tr.nodes.items():
        if name.endswith(".kl") or name.endswith(".kl_global"):
            in_plate = any(f.name == "data" for f in site["cond_indep_stack"])
            assert in_plate == name.endswith(".kl"), name


def test_samples_propagate_through_every_sgpa_block():
    net = build_model({"arch": "text", "dim": 8, "heads": 2, "depth": 2, "mlp_dim": 8,
                       "dropout": 0.0, "attention": {"kind": "sgpa", "num_inducing": 2}},
                      num_classes=2, vocab_size=20).double().eval()
    tokens = torch.randint(1, 20, (3, 5), generator=torch.Generator().manual_seed(0))
    torch.manual_seed(0)
    a, b = net(tokens), net(tokens)
    assert not torch.allclose(a, b)
    with posterior_mean():
        torch.testing.assert_close(net(tokens), net(tokens))
    # block 1 receives block 0's sample: its input differs between two passes
    seen = []
    net.blocks[1].attn.register_forward_hook(lambda m, args, out: seen.append(args[0]))
    net(tokens)
    net(tokens)
    assert not torch.allclose(seen[0], seen[1])


@pytest.mark.parametrize("variant", ["standard", "decoupled"])
def test_eval_mode_posterior_is_lazy(variant, monkeypatch):
    """The predictive never densifies the [B, H, D, N, N] covariances (a 20x eval slowdown
    when a dense + root sum was materialised), in evaluation and training mode alike; a forward
    pass never builds it (no cost in training or evaluation)."""
    from linear_operator.operators import DenseLinearOperator, LinearOperator

    unit = _unit(variant, max_len=8, num_inducing=3).eval()
    for training in (False, True):
        unit.train(training)
        post = unit.predictive(_x()).mvn
        cov = post.lazy_covariance_matrix
        assert isinstance(cov, LinearOperator) and not isinstance(cov, DenseLinearOperator)
        assert post.batch_shape == (2, 2, 4) and post.event_shape == (5,)
    built = []
    real = type(unit.strategy).forward
    monkeypatch.setattr(type(unit.strategy), "forward",
                        lambda self, *a, **k: built.append(1) or real(self, *a, **k))
    for training in (False, True):
        unit.train(training)
        unit(_x())
    assert not built                               # not built by a forward pass (no cost)
    unit.predictive(_x())
    assert len(built) == 1
