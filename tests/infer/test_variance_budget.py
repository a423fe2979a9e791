"""The variance budget: q(u) at the prior, closed forms against brute force, the network's
spread against the predictive's own passes, and no effect on the random state."""

import pytest
import torch

from gpattn_ppl.attention import KEPSVGPAttention, SGPAttention
from gpattn_ppl.data import ArrayDataset
from gpattn_ppl.infer import PyroProgram, predict, q_at_prior, stochastic_units, variance_budget
from gpattn_ppl.metrics import classification_report
from gpattn_ppl.models import build_model
from tests.infer.test_predict import _data as _predict_data
from tests.infer.test_predict import _net

UNITS = {
    "softmax": {"kind": "softmax"},
    "sgpa": {"kind": "sgpa", "num_inducing": 3},
    "sgpa_standard": {"kind": "sgpa", "variant": "standard", "max_len": 7},
    "kep_svgp": {"kind": "kep_svgp", "rank": 3},
    "cgpt": {"kind": "cgpt"},
    "gumbel": {"kind": "gumbel", "prior": "uniform", "temperature": 0.7},
}


def _data(n=12, N=7):
    return _predict_data(n, N)


def _kl(unit, x, mask):
    unit.train()
    torch.manual_seed(0)
    with torch.no_grad():
        unit(x, mask)
    return {k: v.detach() for k, v in unit.objective_terms().items() if "kl" in k}


@pytest.mark.parametrize("unit", [SGPAttention(8, 2, variant="decoupled", num_inducing=3),
                                  SGPAttention(8, 2, variant="standard", max_len=6),
                                  KEPSVGPAttention(8, 2, rank=3)],
                         ids=["sgpa_decoupled", "sgpa_standard", "kep_svgp"])
def test_q_at_prior_has_zero_kl_and_leaves_the_unit_alone(unit):
    unit = unit.double()
    with torch.no_grad():                     # move q(u) away from its initialisation
        for p in unit.parameters():
            p.add_(0.1 * torch.randn_like(p))
    before = {k: v.clone() for k, v in unit.state_dict().items()}
    x = torch.randn(3, 6, 8, dtype=torch.float64)
    mask = torch.ones(3, 6, dtype=torch.bool)
    mask[0, 4:] = False
    kl = _kl(unit, x, mask)
    assert kl and sum(float(v.abs().sum()) for v in kl.values()) > 1e-6
    prior = q_at_prior(unit)
    for name, v in _kl(prior, x, mask).items():
        torch.testing.assert_close(v, torch.zeros_like(v), atol=1e-9, rtol=0, msg=name)
    assert all(torch.equal(before[k], v) for k, v in unit.state_dict().items())


def test_units_without_a_variational_q_have_no_prior_copy():
    assert q_at_prior(build_model({"arch": "text", "dim": 8, "heads": 2, "depth": 1,
                                   "mlp_dim": 16, "attention": {"kind": "cgpt"}},
                                  num_classes=2, vocab_size=30).blocks[0].attn) is None


def test_deterministic_network_has_an_empty_budget():
    net, ds = _net(UNITS["softmax"]), _data()
    b = variance_budget(PyroProgram(net, num_data=len(ds)), ds, num_samples=4)
    assert b["units"] == {} and b["num_samples"] == 1
    assert b["mutual_info"] == b["logit_std"] == b["features_rel_var"] == 0.0


@pytest.mark.parametrize("unit", ["sgpa", "sgpa_standard", "kep_svgp", "cgpt", "gumbel"])
def test_budget_matches_brute_force(unit):
    """The closed forms against the unit's predictive computed here, the MC rows against
    ``predict``'s passes under the same seed, and MI against the metrics' definition."""
    net, ds = _net(UNITS[unit]), _data()
    program = PyroProgram(net, num_data=len(ds))
    (path, u), = stochastic_units(net).items()
    b = variance_budget(program, ds, num_samples=6, limit=10, seed=3)
    row = b["units"][path]
    assert b["num_samples"] == 6 and b["examples"] == 10
    assert row["output_rel_var"] > 0 and row["block_rel_var"] > 0 and b["features_rel_var"] > 0
    # the same passes through predict: the same logits, so the same MI and logit spread
    torch.manual_seed(3)
    from gpattn_ppl.settings import posterior_mean
    batch = ds.batch(torch.arange(10))
    net.eval()
    seen = []
    h = u.register_forward_hook(lambda m, a, o: seen.append(a))
    with torch.no_grad(), posterior_mean(True):
        from gpattn_ppl.infer import program_pass
        program_pass(program, batch.x, batch.mask)
    h.remove()
    pred = predict(program, ArrayDataset(*_subset(ds, 10)), num_samples=6, batch_size=10)
    logits = pred["logits"].double()
    mi = classification_report(pred["probs"], pred["labels"], metrics=["mutual_info"])
    assert b["mutual_info"] == pytest.approx(mi["mutual_info"], rel=1e-4, abs=1e-12)
    assert b["logit_std"] == pytest.approx(float(logits.std(0).mean()), rel=1e-4)
    x, mask = seen[0][0], seen[0][1]
    # the MC rows by hand: the same passes, their unit and block outputs on real tokens
    outs, held = [], []
    h1 = u.register_forward_hook(lambda m, a, o: outs.append(o))
    h2 = net.blocks[-1].register_forward_hook(lambda m, a, o: held.append(o))
    torch.manual_seed(3)
    with torch.no_grad():
        with posterior_mean(True):
            program_pass(program, batch.x, batch.mask)
        outs.clear(), held.clear()
        for _ in range(6):
            program_pass(program, batch.x, batch.mask)
    h1.remove(), h2.remove()
    real = batch.mask[None, :, :, None].double()
    for key, draws in (("output_rel_var", outs), ("block_rel_var", held)):
        d = torch.stack(draws).double() * real
        spread = (d - d.mean(0)).square().sum((1, 2, 3)).mean() / d.mean(0).square().sum()
        assert row[key] == pytest.approx(float(spread), rel=1e-9), key
    with torch.no_grad():
        p = u.predictive(x, mask)
        w = mask[:, None, :, None].double()
        snr = (p.variance * w).sum() / (p.mean.square() * w).sum()
        assert row["head_snr"] == pytest.approx(float(snr), rel=1e-9)
        prior = q_at_prior(u)
        if prior is None:
            assert "head_var_ratio" not in row
        else:
            ratio = (p.variance * w).sum() / (prior.predictive(x, mask).variance * w).sum()
            assert row["head_var_ratio"] == pytest.approx(float(ratio), rel=1e-9)
            assert 0 < row["head_var_ratio"]


def _subset(ds, n):
    b = ds.batch(torch.arange(n))
    return b.x, b.y, b.mask.sum(1)


def test_budget_at_the_prior_has_variance_ratio_one():
    net, ds = _net(UNITS["sgpa"]), _data()
    (path, u), = stochastic_units(net).items()
    parent = net.blocks[-1]
    parent.attn = q_at_prior(u)
    b = variance_budget(PyroProgram(net, num_data=len(ds)), ds, num_samples=3)
    assert b["units"][path]["head_var_ratio"] == pytest.approx(1.0, rel=1e-12)


def test_budget_leaves_the_random_state_and_the_mode_alone():
    net, ds = _net(UNITS["sgpa"]), _data()
    net.train()
    torch.manual_seed(5)
    expected = torch.rand(3)
    torch.manual_seed(5)
    variance_budget(PyroProgram(net, num_data=len(ds)), ds, num_samples=3)
    assert torch.equal(torch.rand(3), expected) and net.training


def test_bad_arguments_are_refused():
    net, ds = _net(UNITS["sgpa"]), _data()
    with pytest.raises(ValueError, match="num_samples >= 2"):
        variance_budget(PyroProgram(net, num_data=len(ds)), ds, num_samples=1)


def test_mutual_info_is_second_order_in_the_logit_spread():
    """docs/derivations/uncertainty_budget.rst: MI ~ 1/2 tr(F Cov[l]) for a small spread, with
    F the softmax Fisher information at the mean logits (checked on 2,000 draws, and the
    binary example of the page: logit std 0.015 at p = (0.7, 0.3) gives ~5e-5)."""
    from gpattn_ppl.metrics import mutual_information

    def _mutual_info(logits):
        return mutual_information(torch.softmax(logits, -1))

    g = torch.Generator().manual_seed(0)
    base = torch.tensor([0.4, -0.3, 1.1], dtype=torch.float64)
    for s in (1e-3, 1e-2, 3e-2):
        d = s * torch.randn(2000, 1, 3, generator=g, dtype=torch.float64)
        logits = base + d - d.mean(0)
        p = torch.softmax(logits.mean(0)[0], -1)
        F = torch.diag(p) - torch.outer(p, p)
        cov = torch.cov(logits[:, 0].T, correction=0)
        approx = 0.5 * torch.trace(F @ cov)
        assert float(_mutual_info(logits)[0]) == pytest.approx(float(approx), rel=0.05 + 2 * s)
    l0 = torch.log(torch.tensor([0.7, 0.3], dtype=torch.float64))
    d = 0.015 * torch.randn(4000, 1, 2, generator=g, dtype=torch.float64)
    assert float(_mutual_info(l0 + d - d.mean(0))[0]) == pytest.approx(4.7e-5, rel=0.1)


def test_a_unit_called_twice_per_pass_is_measured_per_call():
    """A shared layer (ALBERT's: one module at every depth) is called k times per pass: its
    spread is taken per call over the passes, not across calls."""
    from gpattn_ppl.attention import build_attention
    from gpattn_ppl.infer import program_pass
    from gpattn_ppl.models import AttentionHost
    from gpattn_ppl.settings import posterior_mean

    class Shared(AttentionHost):
        def __init__(self):
            super().__init__()
            self.embed = torch.nn.Embedding(30, 8)
            self.attn = build_attention("kep_svgp", dim=8, heads=2, rank=3)
            self.head = torch.nn.Linear(8, 3)

        def forward(self, x, mask=None):
            h = self.embed(x)
            h = h + self.attn(h, mask)
            h = h + self.attn(h, mask)
            return self.head(h.mean(1))

    torch.manual_seed(0)
    net, ds = Shared().double(), _data()
    program = PyroProgram(net, num_data=len(ds))
    b = variance_budget(program, ds, num_samples=5, limit=8, seed=2)
    outs = []
    h = net.attn.register_forward_hook(lambda m, a, o: outs.append(o))
    batch = ds.batch(torch.arange(8))
    torch.manual_seed(2)
    net.eval()
    with torch.no_grad():
        with posterior_mean(True):
            program_pass(program, batch.x, batch.mask)
        outs.clear()
        for _ in range(5):
            program_pass(program, batch.x, batch.mask)
    h.remove()
    d = torch.stack(outs).reshape(5, 2, 8, 7, 8).double() * batch.mask[None, None, :, :, None]
    spread = (d - d.mean(0)).square().sum((1, 2, 3, 4)).mean() / d.mean(0).square().sum()
    assert b["units"]["attn"]["output_rel_var"] == pytest.approx(float(spread), rel=1e-9)
    assert "block_rel_var" not in b["units"]["attn"]      # held by the network itself
