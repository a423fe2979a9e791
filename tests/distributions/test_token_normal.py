"""TokenNormal: the token-correlated matrix normal (dense and low-rank), and its KL."""


import pyro
import pyro.poutine as poutine
import pytest
import torch

from gpattn_ppl.distributions import TokenNormal

DT = torch.float64


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


def test_kl_of_dense_token_normals_equals_the_sum_of_per_column_mvn_kls():
    """KL(TokenNormal || TokenNormal) is the sum over the D columns of torch's MVN KL; 0 for
    identical arguments; the standard prior has N(0, I) columns."""
    g = torch.Generator().manual_seed(3)
    B, H, N, D = 2, 3, 5, 4
    Lq = torch.randn(B, H, N, N, generator=g, dtype=DT).tril()
    Lq.diagonal(dim1=-2, dim2=-1).copy_(Lq.diagonal(dim1=-2, dim2=-1).abs() + 0.5)
    Lp = torch.randn(B, H, N, N, generator=g, dtype=DT).tril()
    Lp.diagonal(dim1=-2, dim2=-1).copy_(Lp.diagonal(dim1=-2, dim2=-1).abs() + 0.5)
    mq, mp = torch.randn(2, B, H, N, D, generator=g, dtype=DT).unbind(0)
    q, p = TokenNormal(mq, scale_tril=Lq), TokenNormal(mp, scale_tril=Lp)
    kl = torch.distributions.kl_divergence(q, p)
    ref = sum(torch.distributions.kl_divergence(
        torch.distributions.MultivariateNormal(mq[..., d], scale_tril=Lq),
        torch.distributions.MultivariateNormal(mp[..., d], scale_tril=Lp)) for d in range(D))
    assert kl.shape == (B, H)
    torch.testing.assert_close(kl, ref)
    torch.testing.assert_close(torch.distributions.kl_divergence(q, q), torch.zeros(B, H, dtype=DT))
    std = TokenNormal.standard(q)
    assert std.batch_shape == q.batch_shape and std.event_shape == q.event_shape
    torch.testing.assert_close(std.covariance_matrix, torch.eye(N, dtype=DT).expand(B, H, N, N))
    with pytest.raises(NotImplementedError):
        torch.distributions.kl_divergence(
            TokenNormal(mq, cov_root=Lq[..., :2], noise_var=0.1), p)
