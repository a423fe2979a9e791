import math

import pyro
import pyro.poutine as poutine
import pytest
import torch
import torch.nn.functional as F
from pyro.infer import SVI, TraceMeanField_ELBO

from gpattn_ppl.attention import AttentionUnit, build_attention, register_attention
from gpattn_ppl.attention.registry import ATTENTION
from gpattn_ppl.infer import fit_epoch
from gpattn_ppl.infer.program import PyroProgram
from gpattn_ppl.models import AttentionHost, build_model
from gpattn_ppl.ppl import build_schedule


@pytest.fixture(scope="module")
def toy_unit():
    """A minimal stochastic unit: a Gaussian global site and a local one, both with KL terms."""

    class _Toy(AttentionUnit):
        stochastic = True

        def __init__(self, dim, heads, *, attn_dropout=0.0, proj_dropout=0.0):
            super().__init__(dim, heads)
            self.loc = torch.nn.Parameter(torch.zeros(dim))

        def attend(self, x, mask):
            q_g = torch.distributions.Normal(self.loc, torch.ones(self.dim))
            g = self.sample("g", q_g, torch.distributions.Normal(0.0, 2.0 * torch.ones(self.dim)),
                            local=False)
            q_l = torch.distributions.Normal(x.mean(1), torch.ones_like(x.mean(1)))
            loc_ = self.sample("l", q_l, torch.distributions.Normal(torch.zeros_like(x.mean(1)), 1.0),
                               local=True)
            self.add_term("ksvd_loss", x.square().mean((1, 2)))
            return x + g + loc_.unsqueeze(1)

    register_attention("_toy")(_Toy)
    yield _Toy
    ATTENTION.pop("_toy")


def _model(kind="softmax"):
    torch.manual_seed(0)
    return build_model({"dim": 8, "heads": 2, "depth": 1, "mlp_dim": 8, "dropout": 0.0,
                        "attention": {"kind": kind}}, num_classes=3, vocab_size=20).double()


def _batch(B=4, N=5):
    g = torch.Generator().manual_seed(0)
    x = torch.randint(1, 20, (B, N), generator=g)
    mask = torch.ones(B, N, dtype=torch.bool)
    mask[0, 3:] = False
    return x, mask, torch.randint(0, 3, (B,), generator=g), torch.tensor([3, 10, 11, 40])


def test_deterministic_loss_is_mean_cross_entropy():
    net = _model()
    prog = PyroProgram(net, num_data=100)
    x, mask, y, idx = _batch()
    expected = F.cross_entropy(net(x, mask), y)
    torch.testing.assert_close(prog.loss(x, mask, y, idx), expected)


def test_terms_are_placed_in_and_out_of_the_plate_with_weights(toy_unit):
    net = _model("_toy")
    N_data = 100
    prog = PyroProgram(net, num_data=N_data, objective={"kl_weight": 0.5, "ksvd_weight": 2.0})
    x, mask, y, idx = _batch()
    torch.manual_seed(1)
    tr = poutine.trace(prog.model).get_trace(x, mask, y, idx)
    tr.compute_log_prob()
    unit_terms = net.objective_terms()
    # the local KL [B] sits inside the plate, the global one (0-d) outside: never summed together
    assert unit_terms["blocks.0.attn.kl"].shape == (4,)
    assert unit_terms["blocks.0.attn.kl_global"].dim() == 0
    site = tr.nodes["blocks.0.attn.kl"]
    assert [f.name for f in site["cond_indep_stack"]] == ["data"]
    assert tr.nodes["blocks.0.attn.kl_global"]["cond_indep_stack"] == ()
    # each term is pyro.factor(name, -value) under poutine.scale(w) (times the plate's N/B)
    for name, w, plate_scale in (("blocks.0.attn.kl", 0.5, N_data / 4),
                                 ("blocks.0.attn.kl_global", 0.5, 1.0),
                                 ("blocks.0.attn.ksvd_loss", 2.0, N_data / 4)):
        node = tr.nodes[name]
        torch.testing.assert_close(node["fn"].log_prob(node["value"]), -unit_terms[name])
        assert node["scale"] == pytest.approx(w * plate_scale), name
    torch.manual_seed(1)
    loss = prog.loss(x, mask, y, idx)
    torch.manual_seed(1)
    logits = net(x, mask)
    terms = net.objective_terms()
    ce = F.cross_entropy(logits, y, reduction="none")
    per_datum = (ce + 0.5 * terms["blocks.0.attn.kl"] + 2.0 * terms["blocks.0.attn.ksvd_loss"]).mean()
    per_datum = per_datum + 0.5 * terms["blocks.0.attn.kl_global"] / N_data
    torch.testing.assert_close(loss, per_datum)


def test_zero_weight_terms_place_no_factor(toy_unit):
    net = _model("_toy")
    prog = PyroProgram(net, num_data=100, objective={"kl_weight": 0.0, "ksvd_weight": 1.0})
    x, mask, y, idx = _batch()
    tr = poutine.trace(prog.model).get_trace(x, mask, y, idx)
    assert "blocks.0.attn.kl" not in tr.nodes and "blocks.0.attn.kl_global" not in tr.nodes
    assert "blocks.0.attn.ksvd_loss" in tr.nodes
    assert {"blocks.0.attn.kl", "blocks.0.attn.kl_global"} <= set(prog.last_terms)


def test_global_terms_are_divided_by_num_data():
    class Fixed(torch.nn.Module):
        stochastic = False

        def forward(self, x, mask):
            return torch.zeros(x.shape[0], 2, dtype=torch.float64)

        def objective_terms(self):
            return {"a.kl": torch.tensor(7.0, dtype=torch.float64),
                    "a.ksvd_loss": torch.full((4,), 3.0, dtype=torch.float64)}

    prog = PyroProgram(Fixed(), num_data=50, objective={"ksvd_weight": 0.1})
    x, mask, y, idx = _batch()
    y = y % 2
    loss = prog.loss(x, mask, y, idx)
    expected = torch.log(torch.tensor(2.0, dtype=torch.float64)) + 0.1 * 3.0 + 7.0 / 50
    torch.testing.assert_close(loss, expected)


def test_sites_mode_gives_pyro_sample_sites_and_same_objective_in_expectation(toy_unit):
    net = _model("_toy")
    prog = PyroProgram(net, num_data=100, mode="sites")
    x, mask, y, idx = _batch()
    guide_tr = poutine.trace(prog.guide).get_trace(x, mask, y, idx)
    names = {n for n, s in guide_tr.nodes.items() if s["type"] == "sample" and n != "data"}
    assert names == {"blocks.0.attn.g", "blocks.0.attn.l"}
    model_tr = poutine.trace(poutine.replay(prog.model, trace=guide_tr)).get_trace(x, mask, y, idx)
    assert "blocks.0.attn.kl" not in model_tr.nodes  # the ELBO computes the KL from the sites
    thin = PyroProgram(net, num_data=100, mode="thin")
    with torch.no_grad():
        torch.manual_seed(0)
        a = torch.stack([thin.loss(x, mask, y, idx) for _ in range(300)])
        torch.manual_seed(0)
        b = torch.stack([prog.loss(x, mask, y, idx) for _ in range(300)])
    # same objective: the means agree within 5 standard errors of the difference
    se = (a.var() / len(a) + b.var() / len(b)).sqrt()
    assert abs(float(a.mean() - b.mean())) < 5 * float(se)


def test_plain_pyro_svi_trains_a_deterministic_model():
    pyro.clear_param_store()
    net = _model()
    prog = PyroProgram(net, num_data=4, use_param_store=True)
    svi = SVI(prog.model, prog.guide, pyro.optim.Adam({"lr": 0.01}), TraceMeanField_ELBO())
    x, mask, y, _ = _batch()
    idx = torch.arange(4)
    losses = [svi.step(x, mask, y, idx) for _ in range(30)]
    assert losses[-1] < 0.7 * losses[0]
    assert any(k.startswith("net$$$") for k in pyro.get_param_store().keys())
    pyro.clear_param_store()


def test_unregistered_term_is_an_error():
    class Bad(torch.nn.Module):
        stochastic = False

        def forward(self, x, mask):
            return torch.zeros(x.shape[0], 2)

        def objective_terms(self):
            return {"a.mystery": torch.tensor(1.0)}

    x, mask, y, idx = _batch()
    with pytest.raises(KeyError, match="register_objective_term"):
        PyroProgram(Bad(), 10).loss(x, mask, y, idx)


@pytest.mark.parametrize("spec, t, expected", [
    (0.7, 3.0, 0.7),
    ({"kind": "linear", "start": 0.0, "end": 1.0, "epochs": 10}, 2.5, 0.25),
    ({"kind": "linear", "start": 0.0, "end": 1.0, "epochs": 10}, 20.0, 1.0),
    ({"kind": "switch", "value": 1.0, "after": 5}, 4.9, 0.0),
    ({"kind": "switch", "value": 1.0, "after": 5}, 5.0, 1.0),
    ({"kind": "exponential", "start": 1.0, "end": 0.01, "epochs": 2}, 1.0, 0.1),
])
def test_schedules(spec, t, expected):
    assert build_schedule(spec)(t) == pytest.approx(expected)


def test_linear_schedule_defaults_to_the_whole_run():
    prog = PyroProgram(_model(), 10, objective={"kl_weight": {"start": 0.0, "end": 1.0}},
                       total_epochs=4)
    assert prog.weight("blocks.0.attn.kl") == pytest.approx(0.0)
    prog.set_epoch(1.0)                                      # the clock stays where it is set
    assert prog.epoch == 1.0
    assert prog.weight("blocks.0.attn.kl") == pytest.approx(0.25)
    assert prog.weight("blocks.0.attn.kl_global") == pytest.approx(0.25)


def test_fraction_schedules_end_at_a_share_of_the_run():
    sched = build_schedule({"kind": "linear", "start": 0.0, "end": 1.0, "fraction": 0.5})
    assert sched(1.0, total_epochs=8) == pytest.approx(0.25)
    assert sched(4.0, total_epochs=8) == pytest.approx(1.0)
    assert sched(7.0, total_epochs=8) == pytest.approx(1.0)
    assert sched(1.0) == pytest.approx(1.0)          # no run length: the end value
    with pytest.raises(ValueError, match="not both"):
        build_schedule({"kind": "linear", "start": 0, "end": 1, "epochs": 3, "fraction": 0.5})
    with pytest.raises(ValueError, match=r"fraction: must be in \(0, 1\]"):
        build_schedule({"kind": "linear", "start": 0, "end": 1, "fraction": 1.5})


def test_default_recipe_warms_up_the_kl_and_ramps_the_cgp_weight():
    """Without a train.objective entry the KL weight rises 0 -> 1 over the first half of the
    run and CGPT's alpha 0 -> 1 over the whole run; explicit weights (the papers' recipes)
    replace them."""
    prog = PyroProgram(_model(), 10, total_epochs=10)
    assert prog.weight("blocks.0.attn.kl") == pytest.approx(0.0)
    assert prog.weight("blocks.0.attn.cgp_loss") == pytest.approx(0.0)
    prog.set_epoch(2.5)
    assert prog.weight("blocks.0.attn.kl") == pytest.approx(0.5)
    assert prog.weight("blocks.0.attn.cgp_loss") == pytest.approx(0.25)
    prog.set_epoch(6.0)
    assert prog.weight("blocks.0.attn.kl") == pytest.approx(1.0)
    assert prog.weight("blocks.0.attn.ksvd_loss") == pytest.approx(1.0)
    paper = PyroProgram(_model(), 10, objective={"kl_weight": 1.0, "cgp_alpha": 1.0},
                        total_epochs=10)
    assert paper.weight("blocks.0.attn.kl") == paper.weight("blocks.0.attn.cgp_loss") == 1.0


class _OwnNet(AttentionHost):
    """The network of docs/architecture.rst, 'Your own network'."""

    def __init__(self):
        super().__init__()
        self.embed = torch.nn.Embedding(20, 8)
        self.attn = build_attention("kep_svgp", dim=8, heads=2, rank=3)
        self.out = torch.nn.Linear(8, 3)

    def forward(self, x, mask=None):
        h = self.embed(x)
        h = h + self.attn(h, mask)
        return self.out(h.mean(1))


def test_an_own_network_with_the_host_mixin_trains_with_its_terms():
    from tests.infer.test_fit import _batches

    torch.manual_seed(0)
    net = _OwnNet()
    program = PyroProgram(net, num_data=12)
    out = fit_epoch(program, torch.optim.Adam(net.parameters(), lr=1e-3), _batches())
    assert net.stochastic and math.isfinite(out["loss"])
    assert set(out) >= {"term/attn.kl", "term/attn.ksvd_loss"}


def test_a_network_without_the_host_mixin_is_refused_naming_the_contract():
    class Plain(torch.nn.Module):
        def forward(self, x, mask=None):
            return x

    with pytest.raises(TypeError, match=r"Plain lacks objective_terms, stochastic: .*mix in "
                                        r"gpattn_ppl\.models\.AttentionHost"):
        PyroProgram(Plain(), num_data=3)
