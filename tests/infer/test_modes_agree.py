"""The sites and thin modes of the Pyro program train one objective: the same loss (float
tolerance) with a KL weight other than 1 and with an annealed weight, for every unit that has a
KL (SGPA standard and decoupled, KEP-SVGP, Gumbel with a uniform prior)."""

import pytest
import torch

from gpattn_ppl.infer import PyroProgram
from gpattn_ppl.models import build_model

DT = torch.float64

UNITS = {
    "sgpa_standard": {"kind": "sgpa", "variant": "standard", "max_len": 8},
    "sgpa_decoupled": {"kind": "sgpa", "num_inducing": 3},
    "sgpa_decoupled_diag": {"kind": "sgpa", "num_inducing": 3, "cov": "diag"},
    "kep_svgp": {"kind": "kep_svgp", "rank": 3},
    "kep_svgp_batch_u": {"kind": "kep_svgp", "rank": 3, "u_draws": "batch"},
    "gumbel": {"kind": "gumbel", "prior": "uniform", "temperature": 0.7},
    "h_gumbel": {"kind": "h_gumbel", "prior": "uniform", "num_centroids": 3},
}

WEIGHTS = {
    "constant_0.5": ({"kl_weight": 0.5}, 1.0),
    "annealed": ({"kl_weight": {"kind": "linear", "start": 0.0, "end": 1.0, "epochs": 4}}, 1.3),
}


def _batch():
    g = torch.Generator().manual_seed(0)
    x = torch.randint(1, 30, (4, 7), generator=g)
    mask = torch.ones(4, 7, dtype=torch.bool)
    mask[1, 5:] = False
    mask[3, 2:4] = False                      # a pad in the middle too
    return x, mask, torch.tensor([0, 1, 1, 0]), torch.tensor([3, 8, 11, 19])


def _loss(spec, objective, t, mode):
    torch.manual_seed(0)
    net = build_model({"arch": "text", "dim": 8, "heads": 2, "depth": 2, "mlp_dim": 16,
                       "dropout": 0.0, "attention": {"kind": "softmax"},
                       "overrides": [{"blocks": [-1], "attention": spec}]},
                      num_classes=2, vocab_size=30).to(DT).train()
    prog = PyroProgram(net, num_data=40, objective=objective, mode=mode, total_epochs=4)
    prog.set_epoch(t)
    torch.manual_seed(1)
    loss = prog.loss(*_batch())
    loss.backward()
    grads = torch.cat([p.grad.flatten() for p in net.parameters() if p.grad is not None])
    return loss.detach(), grads, prog.weight("blocks.1.attn.kl")


@pytest.mark.parametrize("weights", list(WEIGHTS))
@pytest.mark.parametrize("unit", list(UNITS))
def test_sites_and_thin_modes_give_the_same_loss_and_gradients(unit, weights):
    objective, t = WEIGHTS[weights]
    thin, g_thin, w = _loss(UNITS[unit], objective, t, "thin")
    sites, g_sites, _ = _loss(UNITS[unit], objective, t, "sites")
    assert w == pytest.approx(0.5 if weights == "constant_0.5" else 1.3 / 4)
    torch.testing.assert_close(sites, thin, rtol=1e-9, atol=1e-10)
    torch.testing.assert_close(g_sites, g_thin, rtol=1e-7, atol=1e-9)


def test_the_weight_matters():
    """Guard against a test that cannot fail: another KL weight changes the loss."""
    a, _, _ = _loss(UNITS["kep_svgp"], {"kl_weight": 0.5}, 1.0, "sites")
    b, _, _ = _loss(UNITS["kep_svgp"], {"kl_weight": 1.0}, 1.0, "sites")
    assert abs(float(a - b)) > 1e-3
