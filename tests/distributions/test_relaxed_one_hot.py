"""Brute-force tests of the log-space relaxed one-hot categorical (the Pyro test habits).

Monte-Carlo checks use >= 1e5 draws and a 5-sigma bound from the sample standard deviation.
"""

import math

import pyro
import pyro.distributions as pdist
import pyro.poutine as poutine
import pytest
import torch
from scipy import stats
from torch.distributions import RelaxedOneHotCategorical

from gpattn_ppl.distributions import SafeRelaxedOneHotCategorical, relaxed_scores, sample_gumbel

D64 = torch.float64
NEG_INF = float("-inf")


def _naive_log_density(x, logits, tau):
    """Maddison et al. (2017) eq. for the Concrete density, written literally (float64)."""
    K = x.shape[-1]
    alpha = logits.exp()
    return (math.lgamma(K) + (K - 1) * math.log(tau) + alpha.log().sum(-1)
            - (tau + 1) * x.log().sum(-1) - K * (alpha * x.pow(-tau)).sum(-1).log())


def _binary_quadrature(delta, tau, n=200_001, span=60.0):
    """Grid and weights for E[f(x_1)], x_1 = sigmoid((delta + L)/tau), L ~ Logistic(0, 1)."""
    t = torch.linspace(-span, span, n, dtype=D64)
    w = torch.sigmoid(t) * torch.sigmoid(-t) * (t[1] - t[0])        # logistic pdf dt
    return torch.sigmoid((delta + t) / tau), w


# -- density --------------------------------------------------------------------------------------
@pytest.mark.parametrize("tau", [0.3, 1.0, 2.5])
def test_log_prob_matches_torch_where_torch_is_finite(tau):
    torch.manual_seed(0)
    logits = torch.randn(4, 3, 6, dtype=D64)
    d = SafeRelaxedOneHotCategorical(tau, logits=logits)
    x = d.rsample((5,))
    ref = RelaxedOneHotCategorical(torch.tensor(tau, dtype=D64), logits=logits).log_prob(x)
    torch.testing.assert_close(d.log_prob(x), ref, rtol=1e-10, atol=1e-8)


def test_log_prob_matches_naive_formula_without_cached_scores():
    torch.manual_seed(1)
    logits = torch.randn(7, 4, dtype=D64)
    d = SafeRelaxedOneHotCategorical(0.7, logits=logits)
    x = d.rsample().detach().clone()                     # plain tensor: no cached scores
    assert not hasattr(x, "_relaxed_scores")
    torch.testing.assert_close(d.log_prob(x), _naive_log_density(x, logits, 0.7))


@pytest.mark.parametrize("tau", [0.5, 1.0])
def test_binary_density_integrates_to_one_with_the_right_mean(tau):
    logits = torch.tensor([0.8, -0.4], dtype=D64)
    d = SafeRelaxedOneHotCategorical(tau, logits=logits)
    # substitute x_1 = sigmoid(u) (the density is singular at the edges for tau < 1)
    u = torch.linspace(-80, 80, 400_001, dtype=D64)
    x1 = torch.sigmoid(u)
    jac = x1 * torch.sigmoid(-u) * (u[1] - u[0])
    dens = d.log_prob(torch.stack([x1, torch.sigmoid(-u)], -1)).exp() * jac
    assert abs(float(dens.sum()) - 1) < 1e-8
    # the mean from the density equals the mean from the Gumbel representation
    xs, w = _binary_quadrature(1.2, tau)
    torch.testing.assert_close(dens @ x1, (xs * w).sum(), rtol=1e-8, atol=0)


def test_three_category_density_integrates_to_one():
    logits = torch.tensor([0.5, -0.3, 0.1], dtype=D64)
    d = SafeRelaxedOneHotCategorical(1.0, logits=logits)
    n = 1500
    g = (torch.arange(n, dtype=D64) + 0.5) / n
    x1, x2 = torch.meshgrid(g, g, indexing="ij")
    inside = x1 + x2 < 1
    pts = torch.stack([x1[inside], x2[inside], 1 - x1[inside] - x2[inside]], -1)
    mass = float(d.log_prob(pts).exp().sum() / n**2)
    assert abs(mass - 1) < 5e-3


def test_masked_categories_give_the_density_of_the_reduced_distribution():
    torch.manual_seed(2)
    logits = torch.randn(5, 6, dtype=D64)
    keep = torch.tensor([True, False, True, True, False, True])
    masked = logits.masked_fill(~keep, NEG_INF)
    g = sample_gumbel((3, 5, 6), dtype=D64)
    full = SafeRelaxedOneHotCategorical(0.4, logits=masked)
    red = SafeRelaxedOneHotCategorical(0.4, logits=logits[:, keep])
    x, xr = full.relax(g), red.relax(g[..., keep])
    assert torch.all(x[..., ~keep] == 0)
    torch.testing.assert_close(x[..., keep], xr)
    torch.testing.assert_close(full.log_prob(x), red.log_prob(xr))
    # without the cache too, and weight on a removed category is rejected
    torch.testing.assert_close(full.log_prob(x.detach().clone()), red.log_prob(xr))
    bad = x.detach().clone()
    bad[..., 1] = 1e-3
    bad = bad / bad.sum(-1, keepdim=True)
    with pytest.raises(ValueError, match="-inf"):
        full.log_prob(bad)


# -- sampling -------------------------------------------------------------------------------------
def test_gumbel_noise_moments():
    torch.manual_seed(3)
    g = sample_gumbel((200_000,), dtype=D64)
    assert torch.isfinite(g).all()
    se = g.std() / math.sqrt(g.numel())
    assert abs(g.mean() - 0.5772156649015329) < 5 * se
    var_se = math.sqrt((stats.gumbel_r.moment(4) - (math.pi**2 / 6) ** 2) / g.numel())
    assert abs(g.var() - math.pi**2 / 6) < 5 * var_se


@pytest.mark.parametrize("tau", [0.1, 0.7, 5.0])
def test_gumbel_max_frequencies_are_softmax_of_the_logits(tau):
    """argmax of a relaxed draw ~ Categorical(softmax(logits)) at any temperature (chi-square)."""
    torch.manual_seed(4)
    logits = torch.tensor([1.0, 0.0, -0.5, 2.0, NEG_INF], dtype=D64)
    n = 100_000
    x = SafeRelaxedOneHotCategorical(tau, logits=logits).sample((n,))
    counts = torch.bincount(x.argmax(-1), minlength=5).to(D64)
    assert counts[4] == 0
    expected = n * torch.softmax(logits, -1)[:4]
    chi2 = float(((counts[:4] - expected) ** 2 / expected).sum())
    assert chi2 < stats.chi2.ppf(1 - 1e-6, df=3), chi2


@pytest.mark.parametrize("tau", [0.5, 2.0])
def test_sample_mean_matches_quadrature(tau):
    torch.manual_seed(5)
    delta = 0.9
    d = SafeRelaxedOneHotCategorical(tau, logits=torch.tensor([delta, 0.0], dtype=D64))
    x1 = d.sample((200_000,))[:, 0]
    xs, w = _binary_quadrature(delta, tau)
    for f in (lambda v: v, lambda v: v**2):
        mc, ref = f(x1).mean(), (f(xs) * w).sum()
        assert abs(mc - ref) < 5 * f(x1).std() / math.sqrt(x1.numel())


def test_reparameterised_gradient_matches_quadrature_gradient():
    torch.manual_seed(6)
    tau, n = 0.6, 200_000
    logits = torch.tensor([0.3, -0.2], dtype=D64).expand(n, 2).clone().requires_grad_(True)
    x = SafeRelaxedOneHotCategorical(tau, logits=logits).rsample()
    (x[:, 0] ** 2).sum().backward()
    per_sample = logits.grad[:, 0]
    delta = torch.tensor(0.5, dtype=D64, requires_grad=True)
    xs, w = _binary_quadrature(delta, tau)
    ref = torch.autograd.grad(((xs**2) * w).sum(), delta)[0]
    se = per_sample.std() / math.sqrt(n)
    assert abs(per_sample.mean() - ref) < 5 * se
    # d/d l_1 = - d/d l_2 (shift invariance)
    torch.testing.assert_close(logits.grad.sum(-1), torch.zeros(n, dtype=D64), atol=1e-12, rtol=0)


def test_gradcheck_of_sample_and_log_prob():
    torch.manual_seed(7)
    logits = torch.randn(2, 4, dtype=D64).masked_fill(torch.tensor([False, True, False, False]),
                                                        NEG_INF).requires_grad_(True)
    tau = torch.tensor(0.8, dtype=D64, requires_grad=True)
    g = sample_gumbel((2, 4), dtype=D64)

    def f(logits, tau):
        d = SafeRelaxedOneHotCategorical(tau, logits=logits)
        x = d.relax(g)
        return x, d.log_prob(x)

    def finite(logits, tau):  # gradcheck cannot perturb -inf entries: feed the finite ones
        pad = torch.full((2, 1), NEG_INF, dtype=D64)
        return f(torch.cat([logits[:, :1], pad, logits[:, 1:]], -1), tau)

    assert torch.autograd.gradcheck(finite, (logits.detach()[:, [0, 2, 3]].requires_grad_(),
                                             tau))
    x, lp = f(logits, tau)
    (x.sum() + lp.sum()).backward()
    assert torch.isfinite(logits.grad).all() and torch.isfinite(tau.grad).all()
    assert torch.all(logits.grad[:, 1] == 0)


def test_temperature_limits():
    torch.manual_seed(8)
    logits = torch.randn(50, 7, dtype=D64).masked_fill(torch.arange(7) >= 5, NEG_INF)
    g = sample_gumbel((50, 7), dtype=D64)
    # tau -> 0: one-hot at argmax(l + g); 1 - max <= (K - 1) exp(-gap / tau)
    tau = 1e-3
    x = SafeRelaxedOneHotCategorical(tau, logits=logits).relax(g)
    top2 = (logits + g).topk(2, -1).values
    bound = 4 * torch.exp(-(top2[:, 0] - top2[:, 1]) / tau)
    hard = torch.nn.functional.one_hot((logits + g).argmax(-1), 7).to(D64)
    assert torch.all((x - hard).abs().amax(-1) <= bound + 1e-15)
    assert (x.amax(-1) > 1 - 1e-6).double().mean() > 0.95
    # tau -> infinity: uniform over the 5 finite categories
    x = SafeRelaxedOneHotCategorical(1e8, logits=logits).relax(g)
    torch.testing.assert_close(x[:, :5], torch.full((50, 5), 0.2, dtype=D64), atol=1e-6, rtol=0)
    assert torch.all(x[:, 5:] == 0)


# -- numerics -------------------------------------------------------------------------------------
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_no_nan_at_small_temperature_with_extreme_logits(dtype):
    torch.manual_seed(9)
    logits = torch.tensor([[1e4, 0.0, -1e4, NEG_INF], [30.0, 29.9, -50.0, 0.0]], dtype=dtype)
    logits = logits.expand(1000, 2, 4).clone().requires_grad_(True)
    d = SafeRelaxedOneHotCategorical(0.05, logits=logits)
    x = d.rsample()
    lp = d.log_prob(x)
    assert torch.isfinite(x).all() and torch.isfinite(lp).all()
    assert d.support.check(x).all()
    (lp.sum() + (x * torch.arange(4, dtype=dtype)).sum()).backward()
    assert torch.isfinite(logits.grad).all()
    # torch's relaxed categorical underflows here (the reason this class exists)
    ref = RelaxedOneHotCategorical(torch.tensor(0.05, dtype=dtype),
                                   logits=logits.detach()[:, :, :3]).log_prob(
        x.detach()[:, :, :3] / x.detach()[:, :, :3].sum(-1, keepdim=True))
    assert not torch.isfinite(ref).all()


def test_float32_log_prob_agrees_with_float64_at_small_temperature():
    torch.manual_seed(10)
    logits = 20 * torch.randn(200, 8, dtype=D64)
    g = sample_gumbel((200, 8), dtype=D64)
    d64 = SafeRelaxedOneHotCategorical(0.05, logits=logits)
    d32 = SafeRelaxedOneHotCategorical(0.05, logits=logits.float())
    lp64, lp32 = d64.log_prob(d64.relax(g)), d32.log_prob(d32.relax(g.float()))
    assert torch.isfinite(lp32).all()
    torch.testing.assert_close(lp32.double(), lp64, rtol=1e-5, atol=1e-2)


# -- straight-through -----------------------------------------------------------------------------
def test_straight_through_is_hard_forward_relaxed_backward():
    torch.manual_seed(11)
    logits = torch.randn(6, 5, dtype=D64, requires_grad=True)
    g = sample_gumbel((6, 5), dtype=D64)
    st = SafeRelaxedOneHotCategorical(0.5, logits=logits, straight_through=True)
    soft = SafeRelaxedOneHotCategorical(0.5, logits=logits)
    h, x = st.relax(g), soft.relax(g)
    torch.testing.assert_close(h, torch.nn.functional.one_hot(x.argmax(-1), 5).to(D64))
    assert st.support.check(h).all()
    # the density is that of the relaxed sample behind the hard one
    torch.testing.assert_close(st.log_prob(h), soft.log_prob(x))
    w = torch.randn(5, dtype=D64)
    g_st = torch.autograd.grad((h * w).sum(), logits)[0]
    g_soft = torch.autograd.grad((x * w).sum(), logits)[0]
    torch.testing.assert_close(g_st, g_soft)


# -- shapes and API -------------------------------------------------------------------------------
def test_batch_shapes_expand_and_parameters():
    logits = torch.randn(2, 3, 5)
    d = SafeRelaxedOneHotCategorical(torch.tensor([0.5, 1.0, 2.0]), logits=logits)
    assert d.batch_shape == (2, 3) and d.event_shape == (5,)
    x = d.rsample((4,))
    assert x.shape == (4, 2, 3, 5) and d.log_prob(x).shape == (4, 2, 3)
    torch.testing.assert_close(x.sum(-1), torch.ones(4, 2, 3))
    e = d.expand((7, 2, 3))
    assert e.batch_shape == (7, 2, 3) and e.rsample().shape == (7, 2, 3, 5)
    assert e.log_prob(e.rsample()).shape == (7, 2, 3)
    p = SafeRelaxedOneHotCategorical(1.0, probs=torch.softmax(logits, -1))
    torch.testing.assert_close(p.probs, torch.softmax(logits, -1))
    torch.testing.assert_close(d.tempered_probs,
                               torch.softmax(logits / torch.tensor([0.5, 1.0, 2.0])[:, None], -1))
    assert d.has_rsample and isinstance(d, pdist.TorchDistribution)


def test_invalid_arguments_raise():
    with pytest.raises(ValueError, match="exactly one"):
        SafeRelaxedOneHotCategorical(1.0)
    with pytest.raises(ValueError):
        SafeRelaxedOneHotCategorical(-1.0, logits=torch.zeros(3), validate_args=True)
    with pytest.raises(ValueError, match="finite"):
        SafeRelaxedOneHotCategorical(1.0, logits=torch.full((2, 3), NEG_INF), validate_args=True)
    d = SafeRelaxedOneHotCategorical(1.0, logits=torch.zeros(3), validate_args=True)
    with pytest.raises(ValueError):
        d.log_prob(torch.tensor([0.5, 0.6, 0.1]))


def test_relaxed_scores_broadcasts_a_batch_temperature():
    logits, g = torch.zeros(2, 3), torch.ones(2, 3)
    z = relaxed_scores(logits, torch.tensor([1.0, 2.0]), g)
    torch.testing.assert_close(z, torch.tensor([[1.0] * 3, [0.5] * 3]))


# -- in Pyro --------------------------------------------------------------------------------------
def test_pyro_site_log_prob_and_monte_carlo_kl():
    torch.manual_seed(12)
    logits = torch.randn(3, 4, dtype=D64).masked_fill(torch.tensor([False, False, True, False]),
                                                        NEG_INF)
    q = SafeRelaxedOneHotCategorical(0.1, logits=logits)
    p = SafeRelaxedOneHotCategorical(0.1, logits=torch.zeros_like(logits).masked_fill(
        logits == NEG_INF, NEG_INF))

    def guide():
        with pyro.plate("data", 3):
            pyro.sample("w", q)

    def model():
        with pyro.plate("data", 3):
            pyro.sample("w", p)

    with pyro.validation_enabled(True):
        gt = poutine.trace(guide).get_trace()
        mt = poutine.trace(poutine.replay(model, trace=gt)).get_trace()
        gt.compute_log_prob()
        mt.compute_log_prob()
    kl = gt.nodes["w"]["log_prob"] - mt.nodes["w"]["log_prob"]
    assert torch.isfinite(kl).all()
    # the MC KL averages to a positive number; it is exactly 0 against itself
    x = q.sample((100_000,))
    mc = q.log_prob(x) - p.log_prob(x)
    assert torch.all(mc.mean(0) > 5 * mc.std(0) / math.sqrt(x.shape[0]))
    assert torch.all(q.log_prob(x) - q.log_prob(x) == 0)
