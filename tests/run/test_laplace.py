"""Last-layer Laplace (``eval.laplace``, gpattn_ppl/run/laplace.py): the fit on a trained run,
its predictives, the MAP limit, the results / compare plumbing, the install (no torchvision)
and the missing extra."""

import json
import math
import subprocess
import sys
import textwrap

import pytest
import torch
from torch import nn

from gpattn_ppl.data import ArrayDataset
from gpattn_ppl.run.compare import format_markdown, summarise
from gpattn_ppl.run.config import SCHEMA, ConfigError, load_config

from .conftest import TINY

pytest.importorskip("laplace", reason="laplace-torch is not installed (the 'laplace' extra: "
                    "README, pip install -e '.[laplace]' and its --no-deps line)")

from gpattn_ppl.run.laplace import (  # noqa: E402
    fit_last_layer_laplace,
    head_features,
)


def _tiny(**eval_options) -> dict:
    cfg = json.loads(json.dumps(TINY))
    cfg["eval"].update(eval_options)
    return cfg


@pytest.fixture(scope="module")
def lla_run(tmp_path_factory):
    """A tiny CoLA run trained and evaluated with temperature scaling and probit Laplace."""
    from gpattn_ppl.run.experiment import Trainer

    run = tmp_path_factory.mktemp("lla") / "run"
    results = Trainer(_tiny(laplace="probit", temperature_scaling=True), run).fit()
    return run, results


@pytest.fixture(scope="module")
def trained(lla_run):
    """The trained network of ``lla_run`` (``best.pt``) and its data."""
    from gpattn_ppl.run.assembly import load_bundle, model_and_program
    from gpattn_ppl.run.runfolder import open_run

    run, _ = lla_run
    folder = open_run(run)
    cfg = dict(folder.config)
    bundle = load_bundle(cfg)
    net, _, program = model_and_program(cfg, bundle, len(bundle.train), torch.device("cpu"), 1,
                                        warm_start=False)
    folder.load_weights(net, "best.pt", map_location="cpu")
    return net, program, bundle


def test_the_fit_on_a_trained_run_is_reported_like_ts(lla_run):
    run, res = lla_run
    la = res["laplace"]
    assert math.isfinite(la["prior_precision"]) and la["prior_precision"] > 0
    assert (la["link"], la["samples"], la["hessian"], la["fitted_on"]) == \
        ("probit", 1, "kron", "train")
    assert la["n_train"] == TINY["data"]["limit_train"]
    # the same metrics and OOD sets as the network's own report and "ts"
    assert set(la["test"]) == set(res["test"]) == set(res["ts"]["test"])
    assert set(la["ood"]) == set(res["ood"]) == {"cola_ood"}
    assert set(la["ood"]["cola_ood"]["detection"]) == set(res["ood"]["cola_ood"]["detection"])
    assert 0 < la["test"]["nll"] < 5 and math.isfinite(la["val_nll"])
    assert json.loads((run / "results.json").read_text())["laplace"] == la
    # predictions.pt holds the network's own predictions only (plots and ensembles read every
    # other entry as an OOD set)
    preds = torch.load(run / "predictions.pt", weights_only=True)
    assert set(preds) == {"val", "test", "cola_ood"}


def test_probit_and_mc_predictives_are_distributions(trained):
    net, _, bundle = trained
    phi, y = head_features(net, bundle.train)
    test_phi, test_y = head_features(net, bundle.test)
    for link, passes in (("probit", 1), ("mc", 7)):
        lla = fit_last_layer_laplace(net, bundle.train, link=link, samples=7, features=(phi, y))
        gen = torch.Generator().manual_seed(3)
        pred = lla.predict(test_phi, test_y, generator=gen)
        n, K = len(bundle.test), net.head.out_features
        assert pred["probs"].shape == pred["logits"].shape == (passes, n, K)
        assert (pred["probs"] >= 0).all() and torch.isfinite(pred["logits"]).all()
        torch.testing.assert_close(pred["probs"].sum(-1), torch.ones(passes, n, dtype=torch.float64))
        # laplace-torch's own predictive: the same draws for mc; for probit its formula on the
        # centred covariance (its own reads the raw one: less confident, see the next test)
        with torch.enable_grad():
            if link == "probit":
                from gpattn_ppl.run.laplace import centred_covariance

                f_mu, f_var = lla.la._glm_predictive_distribution(test_phi)
                v = centred_covariance(f_var).diagonal(dim1=1, dim2=2)
                own = torch.softmax(f_mu * torch.rsqrt(1 + torch.pi / 8 * v), -1).unsqueeze(0)
                raw = lla.la(test_phi, pred_type="glm", link_approx="probit")
                assert float(raw.max(-1).values.mean()) <= float(own.max(-1).values.mean())
            else:
                own = lla.la.predictive_samples(test_phi, n_samples=7,
                                                generator=torch.Generator().manual_seed(3))
        torch.testing.assert_close(pred["probs"].float(), own.detach(), atol=1e-5, rtol=0)
    assert pred["probs"].std(0).max() > 0  # the mc draws differ


def test_a_huge_prior_precision_gives_the_map_softmax(trained):
    """As the prior precision grows the posterior shrinks onto the MAP head: the Laplace
    predictive becomes the softmax of the network's own (posterior-mean) logits."""
    from gpattn_ppl.infer import predict

    net, program, bundle = trained
    own = predict(program, bundle.test, mean=True)["probs"][0]   # the network's MAP pass
    phi, y = head_features(net, bundle.test)
    for link in ("probit", "mc"):
        lla = fit_last_layer_laplace(net, bundle.train, prior=1e12, link=link, samples=5)
        assert lla.prior_precision == pytest.approx(1e12)
        probs = lla.predict(phi, y, generator=torch.Generator().manual_seed(0))["probs"]
        torch.testing.assert_close(probs, own.expand_as(probs), atol=1e-5, rtol=0)
    # and a small prior moves it (the limit is not the identity)
    loose = fit_last_layer_laplace(net, bundle.train, prior=1e-3).predict(phi, y)["probs"][0]
    assert (loose - own).abs().max() > 1e-3


def test_features_are_those_of_the_deterministic_pass():
    """MC dropout off and stochastic units at their posterior mean while the features are read;
    the network's modes are restored."""
    from gpattn_ppl.models import build_model
    from gpattn_ppl.settings import posterior_mean

    torch.manual_seed(0)
    net = build_model({"arch": "text", "dim": 8, "heads": 2, "depth": 1, "mlp_dim": 8,
                       "dropout": 0.3, "mc_dropout": True,
                       "attention": {"kind": "kep_svgp", "rank": 3}},
                      num_classes=3, vocab_size=20)
    net.train()
    x = torch.randint(1, 20, (10, 6))
    data = ArrayDataset(x, torch.randint(0, 3, (10,)), lengths=torch.full((10,), 6))
    a, y = head_features(net, data, batch_size=4)
    b, _ = head_features(net, data, batch_size=3)
    torch.testing.assert_close(a, b)
    assert a.shape == (10, 8) and torch.equal(y, data.y)
    assert net.training and net.mc_dropout
    net.eval()
    net.set_mc_dropout(False)
    with posterior_mean(), torch.no_grad():
        torch.testing.assert_close(net.head(a), net(x, torch.ones_like(x, dtype=torch.bool)))


def test_the_pretrained_backbone_head():
    """HFClassifier (a tiny random BERT with a swapped stochastic unit and MC dropout): the
    features are those after its pre-head dropout, deterministic, and the fit runs."""
    transformers = pytest.importorskip("transformers", reason="the 'text' extra")
    from gpattn_ppl.models import HFClassifier
    from gpattn_ppl.settings import posterior_mean

    torch.manual_seed(0)
    bert = transformers.BertModel(transformers.BertConfig(
        vocab_size=30, hidden_size=16, num_hidden_layers=1, num_attention_heads=2,
        intermediate_size=16, max_position_embeddings=16))
    net = HFClassifier(num_classes=3, encoder=bert, mc_dropout=True,
                       swap=[{"layers": [-1], "attention": {"kind": "kep_svgp", "rank": 3}}])
    x = torch.randint(1, 30, (12, 5))
    data = ArrayDataset(x, torch.randint(0, 3, (12,)), lengths=torch.full((12,), 5))
    a, y = head_features(net, data, batch_size=5)
    torch.testing.assert_close(a, head_features(net, data, batch_size=12)[0])
    net.eval()
    net.set_mc_dropout(False)
    with posterior_mean(), torch.no_grad():
        torch.testing.assert_close(net.head(a), net(x, torch.ones_like(x, dtype=torch.bool)))
    net.set_mc_dropout(True)
    lla = fit_last_layer_laplace(net, data, link="mc", samples=4)
    assert lla.prior_precision > 0
    assert lla.predict(a, y)["probs"].shape == (4, 12, 3)


def test_a_network_without_a_linear_head_is_refused():
    class Net(nn.Module):
        def __init__(self):
            super().__init__()
            self.head = nn.Sequential(nn.Linear(3, 2))

        def forward(self, x, mask=None):
            return self.head(x.mean(1))

    data = ArrayDataset(torch.randn(4, 2, 3), torch.tensor([0, 1, 0, 1]))
    with pytest.raises(ConfigError, match="eval.laplace: .*linear head.*Sequential"):
        fit_last_layer_laplace(Net(), data)


def test_compare_adds_an_lla_row(lla_run):
    _, res = lla_run
    rows = summarise({"softmax": [res, res]})
    assert [r["method"] for r in rows] == ["softmax", "softmax + TS", "softmax + LLA"]
    lla = rows[2]
    assert lla["NLL"] == (pytest.approx(res["laplace"]["test"]["nll"]), 0.0)
    assert lla["OOD AUROC (MSP)"][0] == pytest.approx(
        res["laplace"]["ood"]["cola_ood"]["detection"]["max_softmax"]["auroc"])
    assert lla["params"] == rows[0]["params"]  # the cost columns are the method's own
    assert "| softmax + LLA | 2 |" in format_markdown(rows)
    # a method whose runs were not all evaluated with Laplace has no such row
    plain = {k: v for k, v in res.items() if k != "laplace"}
    assert [r["method"] for r in summarise({"m": [res, plain]})] == ["m", "m + TS"]


def test_evaluate_refits_with_the_mc_link(lla_run, tmp_path):
    import shutil

    from gpattn_ppl.run.experiment import evaluate_run

    run = tmp_path / "run"
    shutil.copytree(lla_run[0], run)
    res = evaluate_run(run, overrides=["eval.laplace=mc", "eval.laplace_samples=8"])
    la = res["laplace"]
    assert (la["link"], la["samples"]) == ("mc", 8)
    # the prior precision: the grid value of lowest validation NLL of this predictive
    from gpattn_ppl.run.laplace import PRIOR_GRID

    assert la["prior_method"] == "val" and la["prior_precision"] in PRIOR_GRID
    assert lla_run[1]["laplace"]["prior_precision"] in PRIOR_GRID
    assert la["test"]["mutual_info"] > 0       # several passes: MI is defined
    assert "mutual_info" in la["ood"]["cola_ood"]["detection"]
    again = evaluate_run(run, overrides=["eval.laplace=mc", "eval.laplace_samples=8"])
    assert again["laplace"]["test"] == la["test"]   # seeded draws
    off = evaluate_run(run, overrides=["eval.laplace=null"])
    assert "laplace" not in off


def test_the_config_keys():
    e = load_config({"eval": {"laplace": "mc"}})["eval"]
    assert (e["laplace"], e["laplace_hessian"], e["laplace_prior"], e["laplace_samples"]) == \
        ("mc", "kron", "val", 100)
    assert load_config({})["eval"]["laplace"] is None
    assert load_config({"eval": {"laplace": "probit", "laplace_prior": 1e8}})["eval"][
        "laplace_prior"] == 1e8
    for bad, match in (({"laplace": "sample"}, "eval.laplace: 'sample' is not a link"),
                       ({"laplace": True}, "eval.laplace: expected str/NoneType"),
                       ({"laplace_prior": "ml"}, "eval.laplace_prior: 'ml' is not allowed"),
                       ({"laplace_prior": 0}, "eval.laplace_prior: 0 is out of range"),
                       ({"laplace_hessian": "lowrank"}, "eval.laplace_hessian: 'lowrank'"),
                       ({"laplace_samples": 0}, "eval.laplace_samples: 0 is out of range")):
        with pytest.raises(ConfigError, match=match):
            load_config({"eval": bad})
    if "head" in SCHEMA["model"]:
        with pytest.raises(ConfigError, match="eval.laplace: .*linear head; model.head is 'sngp'"):
            load_config({"model": {"head": "sngp"}, "eval": {"laplace": "probit"}})


def test_a_missing_laplace_package_names_the_extra(monkeypatch, lla_run):
    from gpattn_ppl.run.experiment import evaluate_run

    monkeypatch.setitem(sys.modules, "laplace", None)   # as if laplace-torch were not installed
    line = ("needs the 'laplace' extra: pip install 'gpattn-ppl[laplace]' && pip install "
            "--no-deps laplace-torch==0.3 backpack-for-pytorch==1.7.1 "
            "curvlinops-for-pytorch==3.0.1 (package laplace-torch not installed)")
    with pytest.raises(ConfigError) as err:
        load_config({"eval": {"laplace": "probit"}})
    assert str(err.value) == f"eval.laplace: last-layer Laplace {line}"
    load_config({})  # a config without eval.laplace needs no extra
    with pytest.raises(ConfigError, match="needs the 'laplace' extra"):
        evaluate_run(lla_run[0], overrides=["eval.laplace=mc"])
    data = ArrayDataset(torch.randn(4, 2, 3), torch.tensor([0, 1, 0, 1]))
    with pytest.raises(ConfigError, match=r"needs the 'laplace' extra: pip install "):
        fit_last_layer_laplace(nn.Linear(3, 2), data)


def test_the_library_and_a_fit_never_import_torchvision():
    """In a fresh interpreter: importing gpattn_ppl (and the Laplace module) imports neither
    laplace-torch nor torchvision; a fit and both predictives import laplace-torch only."""
    code = textwrap.dedent("""
        import sys, warnings
        import torch
        from torch import nn
        import gpattn_ppl, gpattn_ppl.run, gpattn_ppl.run.laplace
        from gpattn_ppl.data import ArrayDataset
        from gpattn_ppl.run.laplace import fit_last_layer_laplace, head_features
        assert "laplace" not in sys.modules and "torchvision" not in sys.modules
        class Net(nn.Module):
            def __init__(self):
                super().__init__()
                self.head = nn.Linear(3, 2)
            def forward(self, x, mask=None):
                return self.head(x.mean(1))
        torch.manual_seed(0)
        data = ArrayDataset(torch.randn(20, 2, 3), torch.randint(0, 2, (20,)))
        net = Net()
        phi, y = head_features(net, data)
        for link in ("probit", "mc"):
            lla = fit_last_layer_laplace(net, data, link=link, samples=4)
            lla.predict(phi, y)
        assert "laplace" in sys.modules and "backpack" in sys.modules
        assert "torchvision" not in sys.modules, "torchvision imported"
        print("ok")
    """)
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         timeout=1800)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.strip() == "ok"


def test_probit_reads_the_centred_covariance_and_matches_monte_carlo():
    """softmax(f + c 1) = softmax(f): the covariance along 1 changes nothing, yet a full
    posterior keeps the prior's variance there. The probit link on the centred covariance
    agrees with many MC samples of the raw one; on the raw diagonal it is underconfident."""
    from laplace import Laplace
    from torch.utils.data import DataLoader, TensorDataset

    from gpattn_ppl.run.laplace import centred_covariance

    g = torch.Generator().manual_seed(0)
    n, C, K = 2000, 6, 5
    W = torch.randn(K, C, generator=g) * 1.5
    X, Xt = torch.randn(n, C, generator=g), torch.randn(400, C, generator=g)
    y = torch.multinomial(torch.softmax(X @ W.T, -1), 1, generator=g).squeeze(1)
    yt = torch.multinomial(torch.softmax(Xt @ W.T, -1), 1, generator=g).squeeze(1)
    head = nn.Linear(C, K)
    opt = torch.optim.LBFGS(head.parameters(), max_iter=100)

    def closure():
        opt.zero_grad()
        loss = nn.functional.cross_entropy(head(X), y, reduction="sum") \
            + 0.5 * sum((p ** 2).sum() for p in head.parameters())
        loss.backward()
        return loss

    opt.step(closure)
    la = Laplace(nn.Sequential(head), "classification", subset_of_weights="last_layer",
                 hessian_structure="full", last_layer_name="0", prior_precision=0.5)
    la.fit(DataLoader(TensorDataset(X, y), batch_size=500))
    with torch.no_grad():
        f_mu, f_var = (t.detach() for t in la._glm_predictive_distribution(Xt))
    centred = centred_covariance(f_var)
    P = torch.eye(K) - 1.0 / K
    assert torch.allclose(centred, P @ f_var @ P, atol=1e-5)
    assert torch.allclose(centred.sum(-1), torch.zeros(400, K), atol=1e-5)  # nothing along 1

    def nll(p):
        return float(-p.clamp_min(1e-12).log().gather(1, yt[:, None]).mean())

    def probit(v):
        return torch.softmax(torch.rsqrt(1 + torch.pi / 8 * v.diagonal(dim1=1, dim2=2)) * f_mu, -1)

    L = torch.linalg.cholesky(f_var + 1e-6 * torch.eye(K))
    z = torch.randn(4000, 400, K, 1, generator=g)
    mc = torch.softmax(f_mu + (L @ z).squeeze(-1), -1).mean(0)
    assert abs(nll(probit(centred)) - nll(mc)) < 0.01
    assert nll(probit(f_var)) > nll(mc) + 0.01


@pytest.mark.parametrize("bias", [True, False])
def test_the_kron_closed_form_is_laplace_torchs_jacobian_path(bias):
    """Sigma_f of the Kronecker posterior in closed form equals J Sigma J^T of laplace-torch."""
    from gpattn_ppl.run.laplace import LastLayerLaplace

    g = torch.Generator().manual_seed(1)
    C, K = 9, 7
    ds = ArrayDataset(torch.randn(300, 4, C, generator=g), torch.randint(0, K, (300,),
                                                                       generator=g),
                      torch.full((300,), 4))

    class Net(nn.Module):
        def __init__(self):
            super().__init__()
            self.head = nn.Linear(C, K, bias=bias)

        def forward(self, x, mask):
            return self.head(x.mean(1))

    lla = fit_last_layer_laplace(Net(), ds, prior=0.3, link="probit")
    assert isinstance(lla, LastLayerLaplace) and lla.hessian == "kron"
    phi = torch.randn(11, C, generator=g)
    mu, var = lla._kron_predictive(phi)
    with torch.enable_grad():
        mu_ref, var_ref = lla.la._glm_predictive_distribution(phi)
    torch.testing.assert_close(mu, mu_ref.detach(), rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(var, var_ref.detach(), rtol=1e-4, atol=1e-6)


def test_the_validation_prior_follows_a_falling_nll_past_the_grid(trained, monkeypatch):
    """Where the grid's best is one of its ends, the selection walks on in quarter decades
    until the validation NLL rises again: the chosen value is a local minimum of the NLL,
    whichever end of a grid too narrow the minimum lies beyond."""
    from gpattn_ppl.run import laplace

    net, _, bundle = trained
    tr, va = head_features(net, bundle.train), head_features(net, bundle.val)
    wide = fit_last_layer_laplace(net, bundle.train, prior="val", features=tr, val=va)
    star = wide.prior_precision
    assert star not in (laplace.PRIOR_GRID[0], laplace.PRIOR_GRID[-1])   # interior here
    step = 10.0 ** 0.25
    for grid in ((star * step ** 3, star * step ** 4), (star / step ** 4, star / step ** 3)):
        monkeypatch.setattr(laplace, "PRIOR_GRID", grid)
        lla = fit_last_layer_laplace(net, bundle.train, prior="val", features=tr, val=va)
        taus = sorted(lla.prior_scores)
        assert len(taus) > 2 and (min(taus) < min(grid) or max(taus) > max(grid))
        assert lla.prior_scores[lla.prior_precision] == min(lla.prior_scores.values())
        i = taus.index(lla.prior_precision)
        assert 0 < i < len(taus) - 1            # walked to a point with a worse one beyond
        assert lla.prior_precision == pytest.approx(star, rel=1e-6)



def test_a_selection_stopped_at_a_prior_bound_is_recorded_in_the_fit_warnings(trained,
                                                                              monkeypatch):
    """A validation NLL still falling at :data:`PRIOR_BOUNDS` stops the walk there with a
    warning that also lands in ``lla.warnings`` (what ``results.json`` records)."""
    from gpattn_ppl.run import laplace

    net, _, bundle = trained
    tr, va = head_features(net, bundle.train), head_features(net, bundle.val)
    star = fit_last_layer_laplace(net, bundle.train, prior="val", features=tr,
                                  val=va).prior_precision
    step = 10.0 ** 0.25
    grid = (star / step ** 8, star / step ** 7)          # both below the minimum
    bound = float(10.0 ** (round(4 * math.log10(grid[-1])) / 4 + 0.5))   # two steps on
    monkeypatch.setattr(laplace, "PRIOR_GRID", grid)
    monkeypatch.setattr(laplace, "PRIOR_BOUNDS", (1e-12, bound))
    with pytest.warns(UserWarning, match="still falls at the prior precision bound"):
        lla = fit_last_layer_laplace(net, bundle.train, prior="val", features=tr, val=va)
    assert lla.prior_precision == pytest.approx(bound, rel=1e-9)
    assert any("still falls at the prior precision bound" in w for w in lla.warnings)
    # an interior minimum leaves no such warning
    monkeypatch.setattr(laplace, "PRIOR_BOUNDS", (1e-12, 1e12))
    lla = fit_last_layer_laplace(net, bundle.train, prior="val", features=tr, val=va)
    assert not any("bound" in w for w in lla.warnings)

def test_the_validation_prior_is_the_grid_value_of_lowest_validation_nll(trained):
    from gpattn_ppl.run.laplace import PRIOR_GRID

    net, _, bundle = trained
    tr, va = head_features(net, bundle.train), head_features(net, bundle.val)
    lla = fit_last_layer_laplace(net, bundle.train, prior="val", features=tr, val=va)
    assert lla.prior_method == "val" and lla.summary()["prior_method"] == "val"
    assert set(lla.prior_scores) == set(PRIOR_GRID)
    assert lla.prior_scores[lla.prior_precision] == min(lla.prior_scores.values())
    # results.json records the selection's evidence, in ascending prior precision
    assert lla.summary()["val_nll_by_prior"] == sorted(map(list, lla.prior_scores.items()))
    marg = fit_last_layer_laplace(net, bundle.train, prior="marglik", features=tr)

    def nll(m):
        p = m.predict(*va)["probs"][0]
        return float(-p.log().gather(1, va[1][:, None]).mean())

    assert nll(lla) <= nll(marg) + 1e-9
    with pytest.raises(ValueError, match="prior='val' needs val"):
        fit_last_layer_laplace(net, bundle.train, prior="val", features=tr)
