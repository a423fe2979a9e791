"""``predict``: one network pass per MC sample (no hidden extra passes), the deterministic pass is
the network's output, and in sites mode the model is replayed on the guide's draws."""

import pytest
import torch

from gpattn_ppl.data import ArrayDataset
from gpattn_ppl.infer import PyroProgram, predict
from gpattn_ppl.models import build_model

UNITS = {
    "softmax": {"kind": "softmax"},
    "sgpa": {"kind": "sgpa", "num_inducing": 3},
    "kep_svgp": {"kind": "kep_svgp", "rank": 3},
    "gumbel": {"kind": "gumbel", "prior": "uniform", "temperature": 0.7},
}


def _net(spec, depth=2):
    torch.manual_seed(0)
    return build_model({"arch": "text", "dim": 8, "heads": 2, "depth": depth, "mlp_dim": 16,
                        "dropout": 0.0, "attention": {"kind": "softmax"},
                        "overrides": [{"blocks": [-1], "attention": spec}]},
                       num_classes=3, vocab_size=30).to(torch.float64)


def _data(n=10, N=7):
    g = torch.Generator().manual_seed(0)
    x = torch.randint(1, 30, (n, N), generator=g)
    lengths = torch.randint(2, N + 1, (n,), generator=g)
    return ArrayDataset(x, torch.randint(0, 3, (n,), generator=g), lengths)


@pytest.mark.parametrize("unit", sorted(UNITS))
def test_each_sample_is_one_pass_of_the_network(unit):
    """T passes per batch, nothing more (pyro's Predictive ran the model T + 2 times)."""
    net, ds = _net(UNITS[unit], depth=1), _data()
    calls = {"n": 0}
    net.blocks[-1].register_forward_hook(lambda *a: calls.__setitem__("n", calls["n"] + 1))
    out = predict(PyroProgram(net, num_data=len(ds)), ds, num_samples=4, batch_size=4)
    T = 4 if net.stochastic else 1
    assert out["logits"].shape == (T, len(ds), 3)
    assert calls["n"] == 3 * T                       # 3 batches (4 + 4 + 2 examples)


def test_deterministic_prediction_is_the_network_output():
    net, ds = _net(UNITS["softmax"]), _data()
    out = predict(PyroProgram(net, num_data=len(ds)), ds, num_samples=5, batch_size=4)
    b = ds.batch(torch.arange(len(ds)))
    net.eval()
    with torch.no_grad():
        expected = net(b.x, b.mask)
    torch.testing.assert_close(out["logits"][0], expected.float(), rtol=0, atol=0)
    torch.testing.assert_close(out["probs"], torch.softmax(out["logits"].double(), -1))
    assert torch.equal(out["labels"], b.y)


@pytest.mark.parametrize("unit", ["sgpa", "kep_svgp", "gumbel"])
def test_sites_mode_replays_the_guide_draws(unit):
    """In sites mode the variational draws come from the guide; the model must be replayed on
    them (drawing its latent sites from the prior instead would change every pass). With the
    same seed, sites-mode passes equal thin-mode passes, which draw from q inside the model."""
    ds = _data()
    got = {}
    for mode in ("thin", "sites"):
        net = _net(UNITS[unit])
        torch.manual_seed(3)
        got[mode] = predict(PyroProgram(net, num_data=len(ds), mode=mode), ds, num_samples=3,
                            batch_size=4)["logits"]
    assert not torch.allclose(got["thin"][0], got["thin"][1])     # the passes do differ
    torch.testing.assert_close(got["sites"], got["thin"])


@pytest.mark.parametrize("unit", ["sgpa", "kep_svgp"])
def test_mean_predictive_is_one_pass_at_the_posterior_mean(unit):
    """``mean=True``: one pass, the network under ``posterior_mean`` (two calls agree
    exactly), where the sampled passes differ from one another."""
    from gpattn_ppl.settings import posterior_mean

    net, ds = _net(UNITS[unit], depth=1), _data()
    program = PyroProgram(net, num_data=len(ds))
    out = predict(program, ds, num_samples=5, batch_size=4, mean=True)
    assert out["logits"].shape == (1, len(ds), 3)
    again = predict(program, ds, num_samples=5, batch_size=4, mean=True)
    assert torch.equal(out["logits"], again["logits"])
    b = ds.batch(torch.arange(len(ds)))
    net.eval()
    with torch.no_grad(), posterior_mean():
        expected = net(b.x, b.mask)
    torch.testing.assert_close(out["logits"][0], expected.float())
    sampled = predict(program, ds, num_samples=5, batch_size=4)["logits"]
    assert sampled.shape[0] == 5 and not torch.equal(sampled[0], sampled[1])


def test_mean_predictive_turns_mc_dropout_off_and_back_on():
    torch.manual_seed(0)
    net = build_model({"arch": "text", "dim": 8, "heads": 2, "depth": 1, "mlp_dim": 16,
                       "dropout": 0.3, "attention": {"kind": "softmax"}, "mc_dropout": True},
                      num_classes=3, vocab_size=30).to(torch.float64)
    ds = _data()
    program = PyroProgram(net, num_data=len(ds))
    assert net.stochastic
    out = predict(program, ds, num_samples=4, batch_size=4, mean=True)
    assert out["logits"].shape == (1, len(ds), 3)
    assert net.mc_dropout and net.stochastic                  # restored
    net.set_mc_dropout(False)
    plain = predict(program, ds, num_samples=4, batch_size=4)   # dropout off: deterministic
    torch.testing.assert_close(out["logits"], plain["logits"], rtol=0, atol=0)
