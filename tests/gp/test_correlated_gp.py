"""The exact and sparse correlated GPs of CGPT / SCGPT."""

import math

import pytest
import torch

from gpattn_ppl import settings
from gpattn_ppl.gp import CorrelatedGP, SparseCorrelatedGP
from gpattn_ppl.linalg import CholeskyError
from tests.reference.cgpt import conditional_mean

DT = torch.float64


def _qkvx(B=2, H=3, N=5, D=4, scale=0.6, seed=0):
    g = torch.Generator().manual_seed(seed)
    return (scale * torch.randn(4, B, H, N, D, generator=g, dtype=DT)).unbind(0)


# -- CorrelatedGP ---------------------------------------------------------------------------------
def test_scales_are_positive_shared_or_per_head_and_receive_gradients():
    q, k, xo, v = _qkvx()
    for per_head, n in ((False, 1), (True, 3)):
        gp = CorrelatedGP(3, noise=0.2, per_head_scales=per_head).double()
        assert gp.scale_q.shape == (n,) and torch.allclose(gp.scale_q, torch.ones(n, dtype=DT))
        t = gp.prepare(q, k, v, xo)
        nu = gp.mean(t, v)
        loss = gp.posterior(t, v, nu).rsample().sum() + gp.lower_bound(t, nu, v).sum()
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
    t = gp.prepare(q, k, v, xo)
    post = t.sigma_post
    assert torch.linalg.eigvalsh(post).min() > 0
    assert torch.linalg.eigvalsh(t.K_q - post).min() > -1e-10
    assert torch.linalg.eigvalsh(post - t.sigma_q).min() > -1e-10
    torch.testing.assert_close(conditional_mean(t, t.K_k @ v + 0.04 * v), gp.mean(t, v))


def test_the_regulariser_bound_order_and_mc_option():
    q, k, xo, v = _qkvx()
    gp = CorrelatedGP(3, noise=0.3).double()
    t = gp.prepare(q, k, v, xo)
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
    t = gp.prepare(q, k, v, xo * float("nan"), where="blocks.1.attn")
    with pytest.raises(CholeskyError, match="blocks.1.attn"):
        gp.mean(t, v)


# -- SparseCorrelatedGP --------------------------------------------------------------------------
def test_sparse_gp_shapes_scales_and_constant_term():
    q, k, xo, v = _qkvx(B=2, H=3, N=6, D=4)
    gp = SparseCorrelatedGP(3, 4, num_inducing=5, num_inducing_keys=2, noise=0.5).double()
    assert gp.inducing_m.shape == (3, 5, 4) and gp.inducing_l.shape == (3, 2, 4)
    t = gp.prepare(q, k, v, xo)
    nu = gp.mean(t, v)
    d = gp.posterior(t, v, nu)
    assert nu.shape == v.shape and d.cov_root.shape == (2, 3, 6, 5)
    torch.testing.assert_close(d.variance.min(), d.variance.min().clamp_min(0.25))  # >= sigma^2
    # with V = 0 and far-away inducing inputs only the constant D n log(2 pi sigma^2) and the
    # sigma^2 tr(...) term (-> 0) remain
    with torch.no_grad():
        gp.inducing_m.fill_(1e3)
        gp.inducing_l.fill_(1e3)
    t = gp.prepare(q, k, v, xo)
    zero = torch.zeros_like(v)
    bound = gp.lower_bound(t, gp.mean(t, zero), zero)
    torch.testing.assert_close(bound, torch.full((2,), -3 * 4 * 6 * math.log(2 * math.pi * 0.25),
                                                 dtype=DT))
