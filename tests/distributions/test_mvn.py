"""SharedScaleMVN (draws without copying the factor) and StandardNormalMVN (O(n^2) KL)."""

import pytest
import torch
from torch.distributions import MultivariateNormal, kl_divergence

from gpattn_ppl.distributions import SharedScaleMVN, StandardNormalMVN

DT = torch.float64


def _params(seed=0, H=3, D=2, n=4):
    g = torch.Generator().manual_seed(seed)
    loc = torch.randn(H, D, n, generator=g, dtype=DT)
    L = torch.randn(H, D, n, n, generator=g, dtype=DT).tril()
    L.diagonal(dim1=-2, dim2=-1).copy_(L.diagonal(dim1=-2, dim2=-1).abs() + 0.3)
    return loc, L


def test_is_torch_mvn_with_the_same_density_moments_and_kl():
    loc, L = _params()
    q, ref = SharedScaleMVN(loc, scale_tril=L), MultivariateNormal(loc, scale_tril=L)
    assert q.batch_shape == ref.batch_shape and q.event_shape == ref.event_shape
    x = torch.randn(5, *loc.shape, dtype=DT)
    torch.testing.assert_close(q.log_prob(x), ref.log_prob(x))
    torch.testing.assert_close(q.covariance_matrix, ref.covariance_matrix)
    p = SharedScaleMVN(torch.zeros_like(loc), scale_tril=torch.eye(4, dtype=DT).expand_as(L))
    torch.testing.assert_close(kl_divergence(q, p), kl_divergence(ref, MultivariateNormal(
        torch.zeros_like(loc), scale_tril=torch.eye(4, dtype=DT).expand_as(L))))
    torch.testing.assert_close(kl_divergence(q, StandardNormalMVN.like(q)), kl_divergence(q, p))


def test_expanded_draw_is_loc_plus_factor_times_noise_and_never_copies_the_factor():
    loc, L = _params()
    q = SharedScaleMVN(loc, scale_tril=L).expand(torch.Size([6, 3, 2]))
    assert q._unbroadcasted_scale_tril is L and q.batch_shape == (6, 3, 2)
    torch.manual_seed(4)
    v = q.rsample()
    torch.manual_seed(4)
    eps = torch.randn(6, 3, 2, 4, dtype=DT)
    torch.testing.assert_close(v, loc + (L @ eps.unsqueeze(-1)).squeeze(-1))
    assert q.rsample(torch.Size([7])).shape == (7, 6, 3, 2, 4)


def test_moments_of_many_draws():
    loc, L = _params(H=1, D=1)
    q = SharedScaleMVN(loc[0, 0], scale_tril=L[0, 0])
    torch.manual_seed(0)
    draws = q.rsample(torch.Size([40000]))
    torch.testing.assert_close(draws.mean(0), loc[0, 0], atol=0.05, rtol=0)
    torch.testing.assert_close(torch.cov(draws.T), L[0, 0] @ L[0, 0].T, atol=0.1, rtol=0.05)


def test_shapes_that_do_not_broadcast_are_refused():
    loc, L = _params()
    with pytest.raises(ValueError, match="broadcast"):
        SharedScaleMVN(loc[:2], scale_tril=L)
