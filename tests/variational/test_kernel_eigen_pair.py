"""KernelEigenPairStrategy (q(u), the SVGP pair, the KL) against dense references (float64)."""

import pytest
import torch
from gpytorch.distributions import MultivariateNormal
from linear_operator.operators import (
    CholLinearOperator,
    DiagLinearOperator,
    LowRankRootLinearOperator,
    TriangularLinearOperator,
)

from gpattn_ppl.distributions import SharedScaleMVN
from gpattn_ppl.features import KernelEigenFeatures
from gpattn_ppl.variational import KernelEigenPairStrategy
from tests.reference.kep_svgp import (
    branch_posterior,
    dense_svgp_posterior,
    kl_reference,
    low_rank_feature_maps,
    set_exact_ksvd,
)

H, P_DIM, N, S = 2, 6, 7, 3


def _strategy(heads=H, head_dim=P_DIM, s=S, seed=0, feature_map="linear"):
    torch.manual_seed(seed)
    feats = KernelEigenFeatures(heads * head_dim, heads, s, feature_map=feature_map).double()
    return KernelEigenPairStrategy(feats).double()


def _randomise_q(strat, seed=1, negative_diag=False):
    """A non-trivial q(u): random means and full lower-triangular Cholesky factors."""
    g = torch.Generator().manual_seed(seed)
    q = strat.q_u
    Hh, s = strat.heads, strat.rank
    with torch.no_grad():
        q.variational_mean.copy_(torch.randn(Hh, s, s, generator=g, dtype=torch.float64))
        L = torch.randn(Hh, s, s, s, generator=g, dtype=torch.float64).tril()
        d = 0.5 + torch.rand(Hh, s, s, generator=g, dtype=torch.float64)
        if negative_diag:
            d[..., 0] = -d[..., 0]
        L = L - torch.diag_embed(L.diagonal(dim1=-2, dim2=-1)) + torch.diag_embed(d)
        q.chol_variational_covar.copy_(L)


def _low_rank_features(rank):
    return low_rank_feature_maps(rank, H, P_DIM, N)


def _dense_cov(dist):
    return dist.lazy_covariance_matrix.to_dense()


def _S(strat):
    L = strat.q_u.chol_variational_covar.detach().tril()
    return L @ L.mT                                                           # [H, s, s, s]


# -- posterior against dense Gaussian conditioning ------------------------------------------------


def test_posterior_pair_equals_dense_conditioning_of_rank_s_joint_prior():
    """K_att of rank s: the residual of Remark 3.1 is 0, so eq. 16 is exact conditioning."""
    strat = _strategy()
    _randomise_q(strat)
    phi_q, phi_k = _low_rank_features(S)
    svd = set_exact_ksvd(strat.features, phi_q, phi_k)
    E, R = strat.features.project(phi_q[None], phi_k[None])
    q_e, q_r = (branch_posterior(strat, E), branch_posterior(strat, R))
    K, lam2 = svd["K"], svd["lam"].square()
    m, Su = strat.q_u.variational_mean.detach(), _S(strat)
    K_uu = torch.diag_embed(lam2)[:, None]                                   # [H, 1, s, s]
    for q_f, K_ff, Hx in ((q_e, K @ K.mT, svd["H_e"]), (q_r, K.mT @ K, svd["H_r"])):
        K_fu = (Hx * lam2[:, None, :])[:, None]                              # H Λ², [H, 1, n, s]
        mean, cov = dense_svgp_posterior(K_ff[:, None], K_fu, K_uu, m, Su)
        torch.testing.assert_close(q_f.mean[0], mean, rtol=1e-8, atol=1e-10)
        torch.testing.assert_close(_dense_cov(q_f)[0], cov, rtol=1e-8, atol=1e-10)


def test_remark_3_1_dropped_residual_beyond_rank_s():
    """Full-rank K_att: dense conditioning - ours = K K^T - H_e Λ² H_e^T, ||.||_F² = Σ_{i>s} λ_i⁴."""
    strat = _strategy()
    _randomise_q(strat)
    phi_q, phi_k = _low_rank_features(P_DIM)                                 # rank 6 > s = 3
    svd = set_exact_ksvd(strat.features, phi_q, phi_k)
    E, _ = strat.features.project(phi_q[None], phi_k[None])
    q_e = branch_posterior(strat, E)
    K, lam2 = svd["K"], svd["lam"].square()
    K_fu = (svd["H_e"] * lam2[:, None, :])[:, None]
    _, cov = dense_svgp_posterior((K @ K.mT)[:, None], K_fu, torch.diag_embed(lam2)[:, None],
                                  strat.q_u.variational_mean.detach(),
                                  _S(strat))
    residual = cov - _dense_cov(q_e)[0]
    expected = (svd["all_sv"][:, S:] ** 4).sum(-1)                          # [H]
    torch.testing.assert_close(residual.square().sum((-2, -1)), expected[:, None].expand(H, S),
                               rtol=1e-8, atol=1e-10)
    assert (expected > 1e-3).all()


def test_posterior_of_sum_is_linear_in_projections():
    """The add merge uses one q(u) for both branches: q(f^e + f^r) = posterior(E + R)."""
    strat = _strategy()
    _randomise_q(strat)
    g = torch.Generator().manual_seed(3)
    E, R = torch.randn(2, 2, H, N, S, generator=g, dtype=torch.float64)
    q_sum = branch_posterior(strat, E + R)
    q_e, q_r = branch_posterior(strat, E), branch_posterior(strat, R)
    torch.testing.assert_close(q_sum.mean, q_e.mean + q_r.mean)
    lam = strat.features.lambda_.detach()
    A = (E + R) / lam[:, None, :]
    expected = A[:, :, None] @ _S(strat) @ A[:, :, None].mT
    torch.testing.assert_close(_dense_cov(q_sum), expected)


def test_covariance_is_symmetric_low_rank_and_not_the_shorthand():
    """Regression: nobody may "simplify" to the paper's E Λ^-2 S E^T (asymmetric for full S)."""
    strat = _strategy()
    _randomise_q(strat)
    E = torch.randn(1, H, N, S, generator=torch.Generator().manual_seed(4), dtype=torch.float64)
    q_e = branch_posterior(strat, E)
    assert isinstance(q_e.lazy_covariance_matrix, LowRankRootLinearOperator)
    assert q_e.lazy_covariance_matrix.root.shape[-1] == S                    # rank-s root
    cov = _dense_cov(q_e)
    torch.testing.assert_close(cov, cov.mT, rtol=0, atol=1e-12)
    lam = strat.features.lambda_.detach()
    Su = _S(strat)
    shorthand = (E / lam.square()[:, None, :])[:, :, None] @ Su @ E[:, :, None].mT
    assert (shorthand - shorthand.mT).abs().max() > 1e-2                    # not symmetric
    assert (shorthand - cov).abs().max() > 1e-2
    # ... but both agree when S_d is diagonal (S_d commutes with Λ)
    with torch.no_grad():
        Ld = strat.q_u.chol_variational_covar
        Ld.copy_(torch.diag_embed(Ld.diagonal(dim1=-2, dim2=-1)))
    cov_d = _dense_cov(branch_posterior(strat, E))
    Sd = _S(strat)
    shorthand_d = (E / lam.square()[:, None, :])[:, :, None] @ Sd @ E[:, :, None].mT
    torch.testing.assert_close(cov_d, shorthand_d)


def test_empirical_covariance_of_20000_draws_through_u():
    """F = P Λ^-1 u with u ~ q(u): mean and covariance match posterior() within 5 sigma."""
    strat = _strategy()
    _randomise_q(strat)
    P = torch.randn(1, H, 4, S, generator=torch.Generator().manual_seed(5), dtype=torch.float64)
    q_f = branch_posterior(strat, P)
    T = 20_000
    torch.manual_seed(11)
    u = strat.variational_distribution.rsample(torch.Size([T])).detach()     # [T, H, s, s]
    F = strat.function_values(P.expand(T, -1, -1, -1), u)                    # [T, H, n, d]
    F = F.permute(0, 1, 3, 2)                                                # [T, H, d, n]
    mean = F.mean(0)
    se_mean = F.std(0) / T ** 0.5
    assert ((mean - q_f.mean[0].detach()).abs() <= 5 * se_mean + 1e-12).all()
    Fc = F - mean
    prods = Fc.unsqueeze(-1) * Fc.unsqueeze(-2)                              # [T, H, d, n, n]
    emp = prods.sum(0) / (T - 1)
    se_cov = prods.std(0) / T ** 0.5
    analytic = _dense_cov(q_f)[0].detach()
    assert ((emp - analytic).abs() <= 5 * se_cov + 1e-12).all()
    assert analytic.abs().max() > 0.1                                        # a non-trivial check


# -- KL -------------------------------------------------------------------------------------------
@pytest.mark.parametrize("negative_diag", [False, True])
def test_kl_eq21_matches_gpytorch_torch_and_dense(negative_diag):
    strat = _strategy()
    _randomise_q(strat, negative_diag=negative_diag)
    strat.features.lambda_ = torch.tensor([[0.3, 1.2, 2.0], [0.7, 0.9, 1.5]], dtype=torch.float64)
    kl = strat.kl_divergence()
    assert kl.shape == (H, S)
    m = strat.q_u.variational_mean.detach()
    L = strat.q_u.chol_variational_covar.detach().tril()
    lam = strat.features.lambda_.detach()
    # gpytorch's registered KL of its own MVNs, built from the parameters as gpytorch's
    # CholeskyVariationalDistribution and a diagonal prior would be (any diagonal sign)
    q_gp = MultivariateNormal(m, CholLinearOperator(TriangularLinearOperator(L)))
    p_gp = MultivariateNormal(torch.zeros_like(m),
                              DiagLinearOperator(lam.square()[:, None].expand(H, S, S)))
    gp = torch.distributions.kl_divergence(q_gp, p_gp)
    assert gp.shape == (H, S)
    torch.testing.assert_close(kl, gp, rtol=1e-10, atol=1e-10)
    prior_cov = torch.diag_embed(lam.square())[:, None].expand(H, S, S, S)
    torch.testing.assert_close(kl, kl_reference(m, L @ L.mT, prior_cov), rtol=1e-10, atol=1e-10)
    if not negative_diag:                                                    # torch needs diag > 0
        q = torch.distributions.MultivariateNormal(m, scale_tril=L)
        p = torch.distributions.MultivariateNormal(torch.zeros_like(m),
                                                   scale_tril=torch.diag_embed(lam)[:, None])
        torch.testing.assert_close(kl, torch.distributions.kl_divergence(q, p),
                                   rtol=1e-10, atol=1e-10)
    # and the pair the unit hands to its Pyro site (SharedScaleMVNs; the ELBO's KL in sites
    # mode), for any sign of the free Cholesky diagonal like gpytorch's
    torch.testing.assert_close(
        kl, torch.distributions.kl_divergence(strat.variational_distribution,
                                              strat.prior_distribution), rtol=1e-10, atol=1e-10)


def test_kl_at_initialisation_is_half_s_squared_per_head_on_average():
    torch.manual_seed(0)
    feats = KernelEigenFeatures(64 * 8, 64, 8).double()
    kl = KernelEigenPairStrategy(feats).double().kl_divergence().detach()     # m_d ~ N(0, Λ²), S = Λ²
    assert kl.sum(-1).mean().item() == pytest.approx(8 * 8 / 2, rel=0.1)


def test_prior_matches_q_batch_shape_and_is_diagonal():
    strat = _strategy()
    p, q = strat.prior_distribution, strat.variational_distribution
    assert p.batch_shape == q.batch_shape == (H, S) and p.event_shape == q.event_shape == (S,)
    assert isinstance(p, SharedScaleMVN) and isinstance(q, SharedScaleMVN)
    assert isinstance(p, torch.distributions.MultivariateNormal)
    scale = p.scale_tril                                                     # diagonal Λ
    assert torch.equal(scale, torch.diag_embed(scale.diagonal(dim1=-2, dim2=-1)))
    torch.testing.assert_close(p.covariance_matrix,
                               torch.diag_embed(p.variance))                 # diagonal covariance
    assert (p.mean == 0).all()
    torch.testing.assert_close(p.variance, strat.features.lambda_.square()[:, None].expand(H, S, S))


# -- caching ----------------------------------------------------------------------------------------
@pytest.mark.parametrize("training", [True, False])
def test_no_cache_survives_new_inputs_or_parameters(training):
    strat = _strategy()
    strat.train(training)
    g = torch.Generator().manual_seed(6)
    E1, R1, E2, R2 = torch.randn(4, 2, H, N, S, generator=g, dtype=torch.float64)
    a, _ = (branch_posterior(strat, E1), branch_posterior(strat, R1))
    b, _ = (branch_posterior(strat, E2), branch_posterior(strat, R2))
    fresh = branch_posterior(strat, E2)
    torch.testing.assert_close(b.mean, fresh.mean)
    assert not torch.allclose(a.mean, b.mean)
    kl0 = strat.kl_divergence().detach().clone()
    with torch.no_grad():
        strat.q_u.variational_mean.add_(1.0)
        strat.features.raw_lambda.add_(0.1)
    c, _ = (branch_posterior(strat, E2), branch_posterior(strat, R2))
    assert not torch.allclose(c.mean, b.mean)
    assert not torch.allclose(strat.kl_divergence(), kl0)
    torch.testing.assert_close(strat.prior_distribution.variance[:, 0],
                               strat.features.lambda_.square())


# -- KSVD -------------------------------------------------------------------------------------------






# -- gradients, shapes, vectorisation -----------------------------------------------------------------
def test_gradients_reach_W_e_W_r_lambda_m_and_S():
    strat = _strategy(feature_map="cosine")
    _randomise_q(strat)
    x = torch.randn(3, N, H * P_DIM, dtype=torch.float64)
    E, R = strat.features(x)
    torch.manual_seed(0)
    u = strat.variational_distribution.rsample(torch.Size([3]))
    F = strat.function_values(E + R, u)
    loss = F.square().sum() + strat.kl_divergence().sum() + strat.features.ksvd_loss(E, R).sum()
    loss.backward()
    named = dict(strat.named_parameters())
    for name in ("features.W_e", "features.W_r", "features.raw_lambda", "features.qk.weight",
                 "q_u.variational_mean", "q_u.chol_variational_covar"):
        g = named[name].grad
        assert g is not None and torch.isfinite(g).all() and g.abs().sum() > 0, name


def test_state_dict_round_trip():
    a, b = _strategy(seed=0), _strategy(seed=1)
    assert {"q_u.variational_mean", "q_u.chol_variational_covar"} <= set(a.state_dict())
    b.load_state_dict(a.state_dict())
    E = torch.randn(2, H, N, S, dtype=torch.float64)
    torch.testing.assert_close(branch_posterior(a, E).mean, branch_posterior(b, E).mean)
    torch.testing.assert_close(a.kl_divergence(), b.kl_divergence())


def _count_ops(fn):
    calls = []

    class Count(torch.overrides.TorchFunctionMode):
        def __torch_function__(self, func, types, args=(), kwargs=None):
            calls.append(func)
            return func(*args, **(kwargs or {}))

    with Count():
        fn()
    return len(calls)


def test_vectorised_over_batch_heads_and_dims():
    """The number of torch calls does not grow with B, H or s: no Python loop over them."""
    def run(B, heads, s):
        strat = _strategy(heads=heads, head_dim=4, s=s)
        x = torch.randn(B, 5, heads * 4, dtype=torch.float64)

        def fn():
            E, R = strat.features(x)
            u = strat.variational_distribution.rsample(torch.Size([B]))
            strat.function_values(E + R, u)
            _ = branch_posterior(strat, E).mean
            strat.kl_divergence()
            strat.features.ksvd_loss(E, R)
        return _count_ops(fn)

    assert run(2, 1, 2) == run(5, 4, 6)


