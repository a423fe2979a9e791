"""The canonical SE kernel, the TokenNormal predictive and the (sparse) correlated-GP strategies."""

import math

import pyro
import pyro.poutine as poutine
import pytest
import torch
from gpytorch.kernels import RBFKernel

from gpattn_ppl import settings
from gpattn_ppl.attention import KernelAttention
from gpattn_ppl.kernels import CanonicalSEKernel, canonical_projection_init_, gram
from gpattn_ppl.linalg import CholeskyError
from gpattn_ppl.variational import CorrelatedGP, SparseCorrelatedGP, TokenNormal

DT = torch.float64


def _qkvx(B=2, H=3, N=5, D=4, scale=0.6, seed=0):
    g = torch.Generator().manual_seed(seed)
    return (scale * torch.randn(4, B, H, N, D, generator=g, dtype=DT)).unbind(0)


# -- kernel ---------------------------------------------------------------------------------------
def test_canonical_kernel_is_unit_rbf_without_parameters():
    k = CanonicalSEKernel()
    assert list(k.parameters()) == []
    a, b = torch.randn(2, 6, 3, dtype=DT), torch.randn(2, 4, 3, dtype=DT)
    rbf = RBFKernel().double()
    rbf.lengthscale = 1.0
    torch.testing.assert_close(k(a, b).to_dense(), rbf(a, b).to_dense())
    torch.testing.assert_close(k(a, a, diag=True), torch.ones(2, 6, dtype=DT))
    torch.testing.assert_close(k.log_forward(a, b).exp(), k.forward(a, b))
    far = torch.tensor([[0.0], [1e3]], dtype=DT)
    assert k.forward(far, far)[0, 1] == 0 and torch.isfinite(k.log_forward(far, far)).all()


def test_canonical_projection_init_hits_the_target_distance_and_kernel_attention_uses_it():
    torch.manual_seed(0)
    C, D = 128, 32
    W = canonical_projection_init_(torch.empty(D, C), D)
    x = torch.randn(400, C)
    sq = torch.pdist(x @ W.T).square()
    # E||(x - y) W^T||^2 = 2 ||W||_F^2 = 2 D C s^2, which the init sets to 1.5
    assert 2 * W.square().sum().item() == pytest.approx(1.5, rel=0.05)
    assert sq.mean().item() == pytest.approx(1.5, rel=0.05)
    att = KernelAttention(C, 4, kernel="canonical", normalize=False)
    assert not att.kernel.raw_outputscale.requires_grad
    q, k, _ = att.project(torch.randn(2, 10, C))
    K = gram(att.kernel, q, k)
    torch.testing.assert_close(K, CanonicalSEKernel().forward(q, k))
    assert K.mean() > 0.1  # informative at init (default Linear init gives ~1e-5)


# -- TokenNormal ----------------------------------------------------------------------------------
def _low_rank(B=2, H=2, N=5, r=3, D=4, seed=0):
    g = torch.Generator().manual_seed(seed)
    loc = torch.randn(B, H, N, D, generator=g, dtype=DT)
    R = torch.randn(B, H, N, r, generator=g, dtype=DT)
    return TokenNormal(loc, cov_root=R, noise_var=0.3), loc, R


def test_token_normal_log_prob_is_a_sum_of_column_mvns():
    d, loc, R = _low_rank()
    cov = 0.3 * torch.eye(5, dtype=DT) + R @ R.mT
    dense = TokenNormal(loc, scale_tril=torch.linalg.cholesky(cov))
    torch.testing.assert_close(d.covariance_matrix, cov)
    torch.testing.assert_close(dense.covariance_matrix, cov)
    torch.testing.assert_close(d.variance, dense.variance)
    value = torch.randn(2, 2, 5, 4, dtype=DT)
    ref = torch.distributions.MultivariateNormal(loc.mT, covariance_matrix=cov[:, :, None])
    expect = ref.log_prob(value.mT).sum(-1)
    torch.testing.assert_close(d.log_prob(value), expect)
    torch.testing.assert_close(dense.log_prob(value), expect)
    assert d.batch_shape == (2, 2) and d.event_shape == (5, 4)


def test_token_normal_low_rank_samples_have_the_stated_moments():
    S = 20_000
    d, loc, R = _low_rank(B=1, H=1, N=4, r=2, D=2)
    torch.manual_seed(0)
    z = d.rsample((S,))[:, 0, 0]
    assert z.shape == (S, 4, 2)
    for a in range(2):
        r = z[:, :, a] - loc[0, 0, :, a]
        prods = r[:, :, None] * r[:, None, :]
        err = (prods.mean(0) - d.covariance_matrix[0, 0]).abs()
        assert (err <= 5 * prods.std(0) / S**0.5).all()


def test_token_normal_is_a_pyro_site_and_validates_its_arguments():
    d, _, _ = _low_rank()
    tr = poutine.trace(lambda: pyro.sample("z", d.to_event(2))).get_trace()
    assert tr.nodes["z"]["value"].shape == (2, 2, 5, 4)
    with pytest.raises(ValueError, match="exactly one"):
        TokenNormal(torch.zeros(2, 3, 1))
    with pytest.raises(ValueError, match="noise_var"):
        TokenNormal(torch.zeros(2, 3, 1), cov_root=torch.zeros(2, 3, 1))


# -- CorrelatedGP ---------------------------------------------------------------------------------
def test_scales_are_positive_shared_or_per_head_and_receive_gradients():
    q, k, xo, v = _qkvx()
    for per_head, n in ((False, 1), (True, 3)):
        gp = CorrelatedGP(3, noise=0.2, per_head_scales=per_head).double()
        assert gp.scale_q.shape == (n,) and torch.allclose(gp.scale_q, torch.ones(n, dtype=DT))
        t = gp.terms(q, k, xo)
        nu = gp.mean(t, v)
        loss = gp.predictive(t, v, nu).rsample().sum() + gp.lower_bound(t, nu, v).sum()
        loss.backward()
        assert gp.raw_scale_q.grad.abs().min() > 0 and gp.raw_scale_k.grad.abs().min() > 0
    with pytest.raises(ValueError, match="noise"):
        CorrelatedGP(2, noise=-0.1)


@settings.cholesky_jitter(float64=1e-15)
def test_posterior_covariance_is_psd_value_free_and_below_the_prior():
    """Sigma_post = Sigma_q + A_q Sigma_o A_q^T lies between Sigma_q and K_q (conditioning on z_k
    through z_o can only reduce the prior covariance of z_q)."""
    q, k, xo, v = _qkvx()
    gp = CorrelatedGP(3, noise=0.2).double()
    t = gp.terms(q, k, xo)
    post = t.sigma_post
    assert torch.linalg.eigvalsh(post).min() > 0
    assert torch.linalg.eigvalsh(t.K_q - post).min() > -1e-10
    assert torch.linalg.eigvalsh(post - t.sigma_q).min() > -1e-10
    torch.testing.assert_close(gp.conditional_mean(t, t.K_k @ v + 0.04 * v), gp.mean(t, v))


def test_the_regulariser_bound_order_and_mc_option():
    q, k, xo, v = _qkvx()
    gp = CorrelatedGP(3, noise=0.3).double()
    t = gp.terms(q, k, xo)
    nu = gp.mean(t, v)
    jen, marg = gp.lower_bound(t, nu, v, "jensen"), gp.lower_bound(t, nu, v, "marginal")
    assert jen.shape == (2,) and (marg >= jen).all()
    torch.manual_seed(0)
    mc = gp.lower_bound(t, nu, v, "mc", samples=4)
    assert mc.shape == (2,) and torch.isfinite(mc).all()
    with pytest.raises(ValueError, match="kind"):
        gp.lower_bound(t, nu, v, "none")


def test_cholesky_failures_name_the_layer():
    q, k, xo, v = _qkvx(N=4)
    gp = CorrelatedGP(3, noise=0.1).double()
    t = gp.terms(q, k, xo * float("nan"), where="blocks.1.attn")
    with pytest.raises(CholeskyError, match="blocks.1.attn"):
        gp.mean(t, v)


# -- SparseCorrelatedGP --------------------------------------------------------------------------
def test_sparse_gp_shapes_scales_and_constant_term():
    q, k, xo, v = _qkvx(B=2, H=3, N=6, D=4)
    gp = SparseCorrelatedGP(3, 4, num_inducing=5, num_inducing_keys=2, noise=0.5).double()
    assert gp.inducing_m.shape == (3, 5, 4) and gp.inducing_l.shape == (3, 2, 4)
    t = gp.terms(q, k, xo)
    nu = gp.mean(t, v)
    d = gp.predictive(t, v, nu)
    assert nu.shape == v.shape and d.cov_root.shape == (2, 3, 6, 5)
    torch.testing.assert_close(d.variance.min(), d.variance.min().clamp_min(0.25))  # >= sigma^2
    # with V = 0 and far-away inducing inputs only the constant D n log(2 pi sigma^2) and the
    # sigma^2 tr(...) term (-> 0) remain
    with torch.no_grad():
        gp.inducing_m.fill_(1e3)
        gp.inducing_l.fill_(1e3)
    t = gp.terms(q, k, xo)
    zero = torch.zeros_like(v)
    bound = gp.lower_bound(t, gp.mean(t, zero), zero)
    torch.testing.assert_close(bound, torch.full((2,), -3 * 4 * 6 * math.log(2 * math.pi * 0.25),
                                                 dtype=DT))
