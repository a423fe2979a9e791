"""SGPA strategies against dense Gaussian conditioning, torch KLs and Monte-Carlo (float64)."""

import warnings

import pytest
import torch
from gpytorch.kernels import ScaleKernel
from torch.distributions import MultivariateNormal, kl_divergence

from gpattn_ppl import settings
from gpattn_ppl.distributions import StandardNormalMVN, TokenNormal
from gpattn_ppl.kernels import gram, make_attention_kernel
from gpattn_ppl.linalg import block_mask, free_cholesky
from gpattn_ppl.variational import DecoupledSGPAStrategy, SGPAStrategy
from tests.reference.sgpa import (
    PositiveFeatureKernel,
    decoupled_kl_beta,
    decoupled_sgpa_reference,
    dense_conditional,
    dense_joint_conditional,
)

H, D = 2, 3
JIT = settings.cholesky_jitter.value(torch.float64)


def _g(seed):
    return torch.Generator().manual_seed(seed)


def _kernel(name="exponential", seed=0):
    torch.manual_seed(seed)
    k = make_attention_kernel(name, H, D).double()
    k.outputscale = torch.tensor([0.7, 1.4], dtype=torch.float64)
    k.base_kernel.lengthscale = 1.0 + torch.rand(H, 1, D, dtype=torch.float64)
    return k


def _nugget(K):
    """K + ε diag(K): the relative nugget of ``scaled_cholesky``."""
    return K + JIT * torch.diag_embed(K.diagonal(dim1=-2, dim2=-1))


def _dense(kernel, a, b):
    """Kernel matrix of one head from the gpytorch evaluation path (not the library's gram)."""
    return kernel(a, b).to_dense()


def _standard(mean_param="dual", seed=0, max_len=8):
    strat = SGPAStrategy(_kernel(seed=seed), H, max_len, mean_param=mean_param).double()
    with torch.no_grad():
        strat.raw_chol.normal_(0.0, 0.3, generator=_g(seed + 1))
    return strat


def _decoupled(M=3, seed=0, kernel=None, dim=4):
    torch.manual_seed(seed)
    strat = DecoupledSGPAStrategy(kernel or _kernel(seed=seed), H, D, dim, M).double()
    with torch.no_grad():
        strat.raw_chol.normal_(0.0, 0.3, generator=_g(seed + 1))
        strat.inducing_weights.normal_(0.0, 0.5, generator=_g(seed + 2))
    return strat


def _tokens(B=2, N=5, seed=3, scale=0.7):
    g = _g(seed)
    return (scale * torch.randn(B, H, N, D, generator=g, dtype=torch.float64),
            torch.randn(B, H, N, D, generator=g, dtype=torch.float64))


# -- helpers ---------------------------------------------------------------------------------------
def test_free_cholesky_and_block_mask():
    raw = torch.randn(2, 4, 4, dtype=torch.float64)
    R = free_cholesky(raw)
    assert torch.equal(R, R.tril()) and (R.diagonal(dim1=-2, dim2=-1) > 0).all()
    torch.testing.assert_close(free_cholesky(torch.zeros(3, 3)), torch.eye(3))
    A = torch.randn(2, 1, 4, 4, dtype=torch.float64)
    mask = torch.tensor([[True, False, True, True], [True, True, True, True]])
    Ab = block_mask(A, mask)
    assert (Ab[0, 0, 1] == torch.tensor([0.0, 1.0, 0.0, 0.0], dtype=torch.float64)).all()
    assert (Ab[0, 0, :, 1] == torch.tensor([0.0, 1.0, 0.0, 0.0], dtype=torch.float64)).all()
    torch.testing.assert_close(Ab[1], A[1])


def test_standard_normal_kl_matches_torch_generic_formula():
    g = _g(0)
    L = torch.randn(4, 3, 5, 5, generator=g, dtype=torch.float64).tril()
    L.diagonal(dim1=-2, dim2=-1).copy_(torch.rand(4, 3, 5, generator=g, dtype=torch.float64) + 0.3)
    q = MultivariateNormal(torch.randn(4, 3, 5, generator=g, dtype=torch.float64), scale_tril=L)
    p = StandardNormalMVN.like(q)
    generic = MultivariateNormal(torch.zeros(4, 3, 5, dtype=torch.float64),
                                 scale_tril=torch.eye(5, dtype=torch.float64))
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no ambiguous-dispatch warning
        ours = kl_divergence(q, p)
    assert p.batch_shape == q.batch_shape
    torch.testing.assert_close(ours, kl_divergence(q, generic), rtol=1e-12, atol=1e-12)


# -- standard SGPA ---------------------------------------------------------------------------------
@pytest.mark.parametrize("mean_param", ["dual", "direct"])
def test_standard_posterior_equals_dense_gaussian_conditioning(mean_param):
    """q(f(x_q)) = ∫ p(f | u) q(u) du from the dense joint of [f(x_q); u = f(k)]."""
    strat = _standard(mean_param)
    k, v = _tokens()
    xq = 0.7 * torch.randn(2, H, 4, D, generator=_g(9), dtype=torch.float64)
    state = strat.prepare(k, v)
    post = strat(state, xq)
    for b in range(2):
        for h in range(H):
            X = torch.cat([xq[b, h], k[b, h]])
            Kj = _dense(strat.kernel, X, X)[h]
            Kj[4:, 4:] = _nugget(Kj[4:, 4:].clone())                  # the nugget of the u prior
            Kuu = Kj[4:, 4:]
            m_u = Kuu @ v[b, h] if mean_param == "dual" else v[b, h]
            R = free_cholesky(strat.raw_chol[h, :5, :5])
            L = torch.linalg.cholesky(Kuu)
            mean, cov = dense_joint_conditional(Kj, 4, m_u, L @ R @ R.T @ L.T)
            torch.testing.assert_close(post.mean[b, h], mean.T, rtol=1e-7, atol=1e-8)
            for c in range(D):
                torch.testing.assert_close(post.covariance_matrix[b, h, c], cov,
                                           rtol=1e-7, atol=1e-8)


def test_standard_tied_posterior_is_q_of_u():
    """Queries = keys: f = u, so q(f) = q(u) = N(L Lᵀ v, L S̃ Lᵀ) (dual mean)."""
    strat = _standard()
    k, v = _tokens()
    state = strat.prepare(k, v)
    post = strat(state)
    K = _nugget(gram(strat.kernel, k, k))
    L = torch.linalg.cholesky(K)
    R = free_cholesky(strat.raw_chol[:, :5, :5])
    torch.testing.assert_close(post.mean, (K @ v).mT, rtol=1e-10, atol=1e-10)
    torch.testing.assert_close(post.covariance_matrix[:, :, 0], L @ R @ R.mT @ L.mT)
    # q(u_w): a TokenNormal, batch [B, H], event (N, D), mean m_w, row covariance R Rᵀ
    q_u = strat.variational_distribution(state)
    assert isinstance(q_u, TokenNormal)
    assert q_u.batch_shape == (2, H) and q_u.event_shape == (5, D)
    torch.testing.assert_close(q_u.mean, state.q_mu)
    torch.testing.assert_close(q_u.covariance_matrix.expand(2, H, 5, 5),
                               (R @ R.mT).expand(2, H, 5, 5))
    p_u = strat.prior_distribution(q_u)
    assert p_u.batch_shape == q_u.batch_shape and p_u.event_shape == q_u.event_shape
    # a function sample is L u_w, u_w [B, H, N, D]
    u_w = q_u.rsample()
    assert u_w.shape == (2, H, 5, D)
    torch.testing.assert_close(strat.propagate(state, u_w), L @ u_w)


def test_standard_small_S_mean_is_kernel_attention_with_K_qk_K_kk_inverse():
    """S -> 0: q(f) collapses to the mean K_qk K_kk⁻¹ v (direct) and K_qk v (dual); the covariance
    to the Nyström residual K_qq - K_qk K_kk⁻¹ K_kq."""
    for mean_param in ("direct", "dual"):
        strat = _standard(mean_param)
        with torch.no_grad():
            strat.raw_chol.diagonal(dim1=-2, dim2=-1).fill_(-40.0)
            strat.raw_chol.tril_(0).triu_(0)
        k, v = _tokens()
        xq = 0.7 * torch.randn(2, H, 4, D, generator=_g(9), dtype=torch.float64)
        post = strat(strat.prepare(k, v), xq)
        K_qk = gram(strat.kernel, xq, k)
        K_kk = _nugget(gram(strat.kernel, k, k))
        attn = torch.linalg.solve(K_kk, K_qk.mT).mT                    # K_qk K_kk⁻¹
        expected = attn @ v if mean_param == "direct" else K_qk @ v
        torch.testing.assert_close(post.mean, expected.mT, rtol=1e-7, atol=1e-9)
        resid = gram(strat.kernel, xq, xq) - attn @ K_qk.mT
        torch.testing.assert_close(post.covariance_matrix[:, :, 1], resid, rtol=1e-6, atol=1e-9)


def test_standard_kl_matches_torch_unwhitened_and_whitened():
    strat = _standard()
    k, v = _tokens()
    state = strat.prepare(k, v)
    ours = strat.kl_divergence(state)
    assert ours.shape == (2, H, D)
    L, R, m_w = state.L, state.q_sqrt, state.q_mu
    # unwhitened: KL(N(L m_w, L S̃ Lᵀ) || N(0, L Lᵀ)), plain torch MVNs
    q = MultivariateNormal((L @ m_w).mT, scale_tril=(L @ R).unsqueeze(2).expand(2, H, D, 5, 5))
    p = MultivariateNormal(torch.zeros(2, H, D, 5, dtype=torch.float64),
                           scale_tril=L.unsqueeze(2).expand(2, H, D, 5, 5))
    torch.testing.assert_close(ours, kl_divergence(q, p), rtol=1e-9, atol=1e-9)
    # whitened twin
    qw = MultivariateNormal(m_w.mT, scale_tril=R.unsqueeze(2).expand(2, H, D, 5, 5))
    pw = MultivariateNormal(torch.zeros(2, H, D, 5, dtype=torch.float64),
                            scale_tril=torch.eye(5, dtype=torch.float64))
    torch.testing.assert_close(ours, kl_divergence(qw, pw), rtol=1e-10, atol=1e-10)


def test_standard_padding_block_trick():
    """The real block of a padded sequence equals the unpadded computation; pads add no KL."""
    strat = _standard()
    k, v = _tokens(B=1, N=6)
    mask = torch.tensor([[True, True, True, True, False, False]])
    k2, v2 = k.clone(), v.clone()
    k2[:, :, 4:] = 50.0
    v2[:, :, 4:] = -7.0
    sp, so = strat.prepare(k2, v2, mask), strat.prepare(k[:, :, :4], v[:, :, :4])
    pp, po = strat(sp), strat(so)
    torch.testing.assert_close(pp.mean[..., :4], po.mean)
    torch.testing.assert_close(pp.covariance_matrix[..., :4, :4], po.covariance_matrix)
    torch.testing.assert_close(strat.kl_divergence(sp), strat.kl_divergence(so))
    u = strat.variational_distribution(sp).rsample()                      # [B, H, N, D]
    f = strat.propagate(sp, u)
    f_real = strat.propagate(so, u[:, :, :4])
    torch.testing.assert_close(f[:, :, :4], f_real)


def test_standard_max_len_is_checked():
    strat = _standard(max_len=4)
    k, v = _tokens(N=5)
    with pytest.raises(ValueError, match="max_len"):
        strat.prepare(k, v)


def _mc_check(samples, mean, cov):
    """5-sigma check of the sample mean and covariance ``samples [S, ..., N]`` against the
    analytic ``mean [..., N]`` and ``cov [..., N, N]``, sigma from the sample variance."""
    S = samples.shape[0]
    d = samples - mean
    se_mean = (cov.diagonal(dim1=-2, dim2=-1) / S).sqrt()
    assert ((d.mean(0)).abs() <= 5 * se_mean + 1e-12).all()
    prod = d.unsqueeze(-1) * d.unsqueeze(-2)                             # [S, ..., N, N]
    emp, se = prod.mean(0), prod.std(0) / S ** 0.5
    assert ((emp - cov).abs() <= 5 * se + 1e-12).all(), ((emp - cov).abs() / se).max()


def test_standard_sample_covariance_matches_analytic():
    strat = _standard()
    k, v = _tokens(B=1, N=4)
    state = strat.prepare(k, v)
    post = strat(state)
    S = 100_000
    torch.manual_seed(0)
    u = strat.variational_distribution(state).rsample(torch.Size([S]))[:, 0]   # [S, H, N, D]
    f = strat.propagate(state, u).mT.detach()                            # [S, H, D, N]
    _mc_check(f, post.mean[0].detach(), post.covariance_matrix[0].detach())


# -- decoupled SGPA --------------------------------------------------------------------------------
def _weight(dim=4, seed=5):
    return torch.randn(H, D, dim, generator=_g(seed), dtype=torch.float64) / dim ** 0.5


def test_decoupled_matches_textbook_reference():
    strat = _decoupled()
    q, v = _tokens()
    W = _weight()
    state = strat.prepare(q, v, W)
    post = strat(state)
    kl_b, kl_g = decoupled_kl_beta(strat, state), strat.kl_gamma(state)
    k_beta = torch.einsum("hmc,hdc->hmd", strat.inducing.inducing_inputs, W)
    R = free_cholesky(strat.raw_chol)
    for b in range(2):
        for h in range(H):
            mean, covs, rkb, rkg = decoupled_sgpa_reference(
                q[b, h], v[b, h], k_beta[h], strat.inducing_weights[h], R[h],
                lambda a, c, h=h: _dense(strat.kernel, a, c)[h], JIT)
            torch.testing.assert_close(post.mean[b, h], mean.mT, rtol=1e-7, atol=1e-9)
            torch.testing.assert_close(post.covariance_matrix[b, h], covs, rtol=1e-7, atol=1e-9)
            torch.testing.assert_close(kl_b[h], rkb, rtol=1e-7, atol=1e-9)
            torch.testing.assert_close(kl_g[b, h], rkg, rtol=1e-7, atol=1e-9)


def test_decoupled_without_global_keys_is_the_amortised_part():
    """M = 0: N(K_qq v, K_qq) with KL ½ vᵀ K_qq v, i.e. standard SGPA at S̃ = I (up to the nugget)."""
    strat = _decoupled(M=0)
    q, v = _tokens()
    state = strat.prepare(q, v, _weight())
    post = strat(state)
    K = gram(strat.kernel, q, q)
    torch.testing.assert_close(post.mean, (K @ v).mT)
    torch.testing.assert_close(post.covariance_matrix[:, :, 2], K)
    torch.testing.assert_close(strat.kl_gamma(state), 0.5 * (v * (K @ v)).sum(-2))
    assert torch.equal(decoupled_kl_beta(strat, state), torch.zeros(H, D, dtype=torch.float64))
    torch.manual_seed(1)
    f = strat.propagate(state, None)                                     # no conditional noise
    torch.testing.assert_close(f, K @ v)
    # ... the standard strategy with R = I on the same tokens agrees
    std = SGPAStrategy(strat.kernel, H, 8).double()
    s_state = std.prepare(q, v)
    s_post = std(s_state)
    torch.testing.assert_close(s_post.mean, post.mean, rtol=1e-6, atol=1e-6)
    torch.testing.assert_close(s_post.covariance_matrix, post.covariance_matrix, rtol=1e-6,
                               atol=1e-6)
    torch.testing.assert_close(std.kl_divergence(s_state), strat.kl_gamma(state), rtol=1e-6,
                               atol=1e-6)


def test_decoupled_with_zero_token_weights_is_whitened_svgp_on_global_keys():
    """a_γ = v = 0: a standard whitened SVGP with inducing inputs k_β (dense conditioning) and
    the β KL equals kl_divergence(q(u_β), N(0, K_ββ))."""
    strat = _decoupled(M=3)
    q, _ = _tokens()
    v = torch.zeros_like(q)
    W = _weight()
    state = strat.prepare(q, v, W)
    post = strat(state)
    k_beta = torch.einsum("hmc,hdc->hmd", strat.inducing.inducing_inputs, W)
    R = free_cholesky(strat.raw_chol)
    for h in range(H):
        Kbb = _nugget(_dense(strat.kernel, k_beta[h], k_beta[h])[h])
        L = torch.linalg.cholesky(Kbb)
        m_u = Kbb @ strat.inducing_weights[h]                             # dual weights a_β
        for c in range(D):
            S_u = L @ R[h, c] @ R[h, c].T @ L.T
            for b in range(2):
                mean, cov = dense_conditional(_dense(strat.kernel, q[b, h], q[b, h])[h],
                                              _dense(strat.kernel, q[b, h], k_beta[h])[h],
                                              Kbb, m_u, S_u)
                torch.testing.assert_close(post.mean[b, h, c], mean[:, c], rtol=1e-7, atol=1e-9)
                torch.testing.assert_close(post.covariance_matrix[b, h, c], cov, rtol=1e-7,
                                           atol=1e-9)
            kl = kl_divergence(MultivariateNormal(m_u[:, c], S_u),
                               MultivariateNormal(torch.zeros(3, dtype=torch.float64), Kbb))
            torch.testing.assert_close(decoupled_kl_beta(strat, state)[h, c], kl, rtol=1e-7, atol=1e-9)
    assert torch.equal(strat.kl_gamma(state), torch.zeros(2, H, D, dtype=torch.float64))


def test_decoupled_gamma_kl_is_rkhs_norm_of_orthogonal_residual():
    r"""With an explicit feature map φ the γ term is ½‖r‖², r the least-squares residual of
    Φ_γᵀ v_c on the columns of Φ_βᵀ."""
    base = PositiveFeatureKernel(batch_shape=torch.Size([H]))
    kernel = ScaleKernel(base, batch_shape=torch.Size([H])).double()
    kernel.outputscale = torch.ones(H, dtype=torch.float64)
    strat = _decoupled(M=2, kernel=kernel, dim=D)
    q, v = _tokens(B=1, N=5)
    eye = torch.eye(D, dtype=torch.float64).expand(H, D, D)              # k_β = Z_β
    with settings.cholesky_jitter(float64=1e-14):
        state = strat.prepare(q, v, eye)
    kl_g = strat.kl_gamma(state)
    sf = kernel.outputscale.sqrt()
    for h in range(H):
        Phi_g = sf[h] * base.features(q[0, h])                          # [N, F]
        Phi_b = sf[h] * base.features(strat.inducing.inducing_inputs[h])  # [M, F]
        for c in range(D):
            g = Phi_g.T @ v[0, h, :, c]
            coef = torch.linalg.lstsq(Phi_b.T, g.unsqueeze(-1)).solution
            r = g - (Phi_b.T @ coef).squeeze(-1)
            torch.testing.assert_close(kl_g[0, h, c], 0.5 * r @ r, rtol=1e-7, atol=1e-10)


@pytest.mark.parametrize("cov", ["full", "diag"])
def test_decoupled_sample_moments_match_analytic(cov):
    """Full: sample covariance -> Σ_c; diag: marginal variances -> diag Σ_c (5 sigma)."""
    strat = _decoupled(M=2)
    q, v = _tokens(B=1, N=4)
    state = strat.prepare(q, v, _weight())
    post = strat(state)
    S = 100_000
    torch.manual_seed(0)
    u = strat.variational_distribution(state).expand(torch.Size([S, H, D])).rsample()
    xi = strat.conditional_noise(state, cov=cov).rsample(torch.Size([S]))[:, 0]  # [S, H, N, D]
    f = (strat.propagate(state, u) + xi).mT.detach()                    # [S, H, D, N]
    mean, Sigma = post.mean[0].detach(), post.covariance_matrix[0].detach()
    if cov == "full":
        _mc_check(f, mean, Sigma)
    else:
        _mc_check(f.unsqueeze(-1), mean.unsqueeze(-1),
                  Sigma.diagonal(dim1=-2, dim2=-1).unsqueeze(-1).unsqueeze(-1))


def test_decoupled_padding_block_trick():
    strat = _decoupled(M=3)
    q, v = _tokens(B=1, N=6)
    mask = torch.tensor([[True, True, False, True, True, False]])
    keep = mask[0]
    q2, v2 = q.clone(), v.clone()
    q2[:, :, ~keep] = 30.0
    v2[:, :, ~keep] = 9.0
    W = _weight()
    sp, so = strat.prepare(q2, v2, W, mask), strat.prepare(q[:, :, keep], v[:, :, keep], W)
    pp, po = strat(sp), strat(so)
    torch.testing.assert_close(pp.mean[..., keep], po.mean)
    torch.testing.assert_close(pp.covariance_matrix[..., keep, :][..., keep], po.covariance_matrix)
    torch.testing.assert_close(strat.kl_gamma(sp), strat.kl_gamma(so))


def test_strategies_have_no_stale_state():
    """Nothing is memoised: a second input gives its own posterior."""
    strat = _decoupled()
    W = _weight()
    q1, v1 = _tokens(seed=1)
    q2, v2 = _tokens(seed=2)
    m1 = strat(strat.prepare(q1, v1, W)).mean
    strat.eval()
    m2 = strat(strat.prepare(q2, v2, W)).mean
    m1b = strat(strat.prepare(q1, v1, W)).mean
    assert not torch.allclose(m1, m2)
    torch.testing.assert_close(m1, m1b)


def test_strategy_gradcheck_tiny():
    """float64 gradcheck of a full sample w.r.t. the token inputs (noise fixed by the seed)."""
    strat = _decoupled(M=2)
    W = _weight()

    def fn(q, v):
        state = strat.prepare(q, v, W)
        qu = strat.variational_distribution(state)
        torch.manual_seed(0)
        return (strat.propagate(state, qu.rsample().unsqueeze(0))
                + strat.conditional_noise(state, cov="full").rsample())

    q, v = _tokens(B=1, N=3)
    assert torch.autograd.gradcheck(fn, (q.requires_grad_(), v.requires_grad_()))
    std = _standard()

    def fn_std(k, v):
        state = std.prepare(k, v)
        torch.manual_seed(0)
        return std.propagate(state, std.variational_distribution(state).rsample())

    assert torch.autograd.gradcheck(fn_std, (q.detach().requires_grad_(), v.detach().requires_grad_()))
