"""gpattn_ppl.ppl.sites: the one way a unit draws a latent, in the mean, thin and sites modes."""

import pyro
import pyro.distributions as pdist
import pyro.poutine as poutine
import pytest
import torch

from gpattn_ppl.ppl import MODES, SiteContext, current_mode, draw, needs_site, site_context
from gpattn_ppl.settings import posterior_mean

DT = torch.float64


def _q_p(B=3, n=4):
    g = torch.Generator().manual_seed(0)
    q = pdist.Normal(torch.randn(B, n, generator=g, dtype=DT), torch.rand(B, n, generator=g, dtype=DT) + 0.5)
    p = pdist.Normal(torch.zeros(B, n, dtype=DT), 2 * torch.ones(B, n, dtype=DT))
    return q, p


def _trace(fn, role="guide", weight=None, B=3, num_data=30):
    plate = pyro.plate("data", num_data, subsample=torch.arange(B))
    with site_context(SiteContext("sites", role, plate, weight)):
        return poutine.trace(fn).get_trace()


def test_modes_default_thin_sites_in_context_mean_wins():
    assert MODES == ("mean", "thin", "sites")
    assert current_mode() == "thin" and needs_site(True) and not needs_site(False)
    with site_context(SiteContext("sites", "guide")):
        assert current_mode() == "sites" and needs_site(False)
        with posterior_mean():
            assert current_mode() == "mean" and not needs_site(True)
    assert current_mode() == "thin"


def test_thin_draw_is_q_rsample_and_analytic_kl():
    q, p = _q_p()
    torch.manual_seed(5)
    value, kl = draw("u", q, p, local=True)
    torch.manual_seed(5)
    torch.testing.assert_close(value, q.rsample())
    torch.testing.assert_close(kl, torch.distributions.kl_divergence(q, p))
    _, none = draw("u", q, None, local=True)
    assert none is None


def test_thin_draw_falls_back_to_the_one_sample_kl_estimate():
    logits = torch.randn(3, 5, dtype=DT)
    q = pdist.RelaxedOneHotCategorical(torch.tensor(0.7, dtype=DT), logits=logits)
    p = pdist.RelaxedOneHotCategorical(torch.tensor(0.7, dtype=DT), logits=torch.zeros_like(logits))
    value, kl = draw("w", q, p, local=True)
    torch.testing.assert_close(kl, q.log_prob(value) - p.log_prob(value))


def test_mean_mode_returns_the_mean_without_building_q_when_overridden():
    q, p = _q_p()
    with posterior_mean():
        value, kl = draw("u", q, p, local=True)
        torch.testing.assert_close(value, q.mean)
        torch.testing.assert_close(kl, torch.distributions.kl_divergence(q, p))

        def never():
            raise AssertionError("q must not be built")

        v2, kl2 = draw("u", never, None, local=True, mean=lambda: torch.ones(2))
        torch.testing.assert_close(v2, torch.ones(2))
        assert kl2 is None


def test_per_sequence_global_draw_counts_the_kl_once():
    q, p = _q_p(B=1)
    q1 = pdist.Normal(q.loc[0], q.scale[0])
    p1 = pdist.Normal(p.loc[0], p.scale[0])
    torch.manual_seed(1)
    value, kl = draw("u", q1, p1, local=False, per_sequence=6)
    assert value.shape == (6, 4)
    torch.manual_seed(1)
    torch.testing.assert_close(value, q1.expand(torch.Size([6, 4])).rsample())
    torch.testing.assert_close(kl, torch.distributions.kl_divergence(q1, p1))


@pytest.mark.parametrize("w", [1.0, 0.5])
def test_sites_mode_local_site_in_plate_scaled_by_the_kl_weight(w):
    q, p = _q_p()
    seen = []

    def weight(term):
        seen.append(term)
        return w

    tr = _trace(lambda: draw("blocks.0.attn.u", q, p, local=True), weight=weight)
    site = tr.nodes["blocks.0.attn.u"]
    assert seen == ["blocks.0.attn.kl"]          # the unit's KL weight (its own or the global)
    assert site["fn"].batch_shape == (3,) and site["fn"].event_shape == (4,)
    assert site["scale"] == pytest.approx(w * 30 / 3)          # KL weight x plate scale
    assert any(f.name == "data" for f in site["cond_indep_stack"])
    tr_model = _trace(lambda: draw("blocks.0.attn.u", q, p, local=True), role="model")
    base = tr_model.nodes["blocks.0.attn.u"]["fn"].base_dist          # the prior in the model
    assert torch.equal(base.loc, p.loc) and torch.equal(base.scale, p.scale)


def test_sites_mode_per_sequence_site_is_scaled_by_one_over_b_and_weight_zero_masks():
    q, p = _q_p(B=1)
    q1, p1 = pdist.Normal(q.loc[0], q.scale[0]), pdist.Normal(p.loc[0], p.scale[0])
    tr = _trace(lambda: draw("u", q1, p1, local=False, per_sequence=5), weight=lambda t: 0.5)
    site = tr.nodes["u"]
    assert site["value"].shape == (5, 4) and site["fn"].event_shape == (5, 4)
    assert site["scale"] == pytest.approx(0.5 / 5)
    assert not any(f.name == "data" for f in site["cond_indep_stack"])
    tr0 = _trace(lambda: draw("u", q1, p1, local=False), weight=lambda t: 0.0)
    assert tr0.nodes["u"]["mask"] is False


def test_sites_elbo_equals_thin_factor_with_weight():
    """For a toy program the ELBO of the sites mode, scaled by w, equals the thin mode's factor
    -w KL: the two modes train one objective (float tolerance; same draws by construction)."""
    from pyro.infer import TraceMeanField_ELBO

    q, p = _q_p()
    y = torch.randn(3, dtype=DT)
    w = 0.37

    def body(mode, role):
        plate = pyro.plate("data", 30, subsample=torch.arange(3))
        with site_context(SiteContext(mode, role, plate, lambda t: w)):
            value, kl = draw("u", q, p, local=True)
        if role == "guide":
            return
        if kl is not None:
            with plate, poutine.scale(scale=w):
                pyro.factor("kl", -kl.sum(-1))
        with plate:
            pyro.sample("y", pdist.Normal(value.sum(-1), 1.0), obs=y)

    elbo = TraceMeanField_ELBO()
    torch.manual_seed(0)
    thin = elbo.differentiable_loss(lambda: body("thin", "model"), lambda: None)
    torch.manual_seed(0)
    sites = elbo.differentiable_loss(lambda: body("sites", "model"), lambda: body("sites", "guide"))
    torch.testing.assert_close(thin, sites)
