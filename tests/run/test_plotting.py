"""Plots: PNG files are written, and what they draw matches the metric definitions."""

from __future__ import annotations

import sys

import numpy as np
import pytest
import torch
from PIL import Image

from gpattn_ppl.infer import CheckpointError
from gpattn_ppl.metrics import (
    aurc,
    calibration_bins,
    expected_calibration_error,
    fit_temperature,
)
from gpattn_ppl.ood import kl_matching_templates, ood_report, ood_score
from gpattn_ppl.run import plotting

DPI = 120


@pytest.fixture
def results():
    g = torch.Generator().manual_seed(0)
    out = {}
    for name, scale in (("softmax", 4.0), ("kep_svgp", 1.5)):
        probs = torch.softmax(scale * torch.randn(3, 120, 4, generator=g, dtype=torch.float64), -1)
        labels = torch.randint(0, 4, (120,), generator=g)
        out[name] = (probs, labels)
    return out


def _png_size(path) -> tuple[int, int]:
    with Image.open(path) as im:
        assert im.format == "PNG"
        return im.size


def _expected_size(fig) -> tuple[int, int]:
    w, h = fig.get_size_inches()
    return round(w * DPI), round(h * DPI)


def _split(t: int, n: int, k: int, seed: int, scale: float = 3.0) -> dict:
    g = torch.Generator().manual_seed(seed)
    logits = scale * torch.randn(1, n, k, generator=g) + torch.randn(t, n, k, generator=g)
    labels = torch.multinomial(torch.softmax(logits.mean(0) / 2, -1), 1, generator=g).squeeze(-1)
    return {"probs": torch.softmax(logits.double(), -1), "logits": logits, "labels": labels}


def _run(path, t: int, k: int = 3, seed: int = 0, ood=("ood_a",)):
    path.mkdir(parents=True)
    preds = {"test": _split(t, 90, k, seed), "val": _split(t, 60, k, seed + 1)}
    for j, name in enumerate(ood):
        preds[name] = _split(t, 70, k, seed + 2 + j, scale=1.0)
    torch.save(preds, path / "predictions.pt")
    return path


# ---------------------------------------------------------------- reliability diagram


def test_reliability_diagram_writes_png(results, tmp_path):
    out = plotting.reliability_diagram(results, tmp_path / "sub" / "rel.png")
    assert out == tmp_path / "sub" / "rel.png"
    assert _png_size(out) == _expected_size(plotting._reliability_figure(results))
    out2 = plotting.reliability_diagram(results, tmp_path / "rel_overlay.png", overlay=True)
    assert _png_size(out2) == _expected_size(plotting._reliability_figure(results, overlay=True))


def test_reliability_bars_title_and_counts_match_metrics(results):
    fig = plotting._reliability_figure(results, n_bins=15)
    assert len(fig.axes) == 4  # [reliability, counts] per method
    for i, (name, (probs, labels)) in enumerate(results.items()):
        ax, hx = fig.axes[2 * i], fig.axes[2 * i + 1]
        ece = expected_calibration_error(probs, labels)
        assert ax.get_title() == f"{name} — ECE {ece:.4f}"
        bins = calibration_bins(probs, labels)
        heights = np.array([b.get_height() for b in ax.containers[0]])  # accuracy bars
        np.testing.assert_allclose(heights, bins["accuracy"].nan_to_num(0.0).numpy())
        gaps = np.array([b.get_height() for b in ax.containers[1]])
        want = (bins["accuracy"] - bins["confidence"]).abs().nan_to_num(0.0).numpy()
        np.testing.assert_allclose(gaps, want)
        counts = np.array([b.get_height() for b in hx.containers[0]])  # non-empty bins only
        np.testing.assert_array_equal(counts, bins["count"][bins["count"] > 0].numpy())
        assert hx.get_yscale() == "log" and hx.get_shared_x_axes().joined(ax, hx)
        lo, hi = ax.get_xlim()
        assert 0.25 - 1 / 15 - 1e-12 <= lo <= 0.25 and hi == 1.0  # K = 4


@pytest.mark.parametrize("k, lower", [(2, 7 / 15), (4, 3 / 15), (10, 1 / 15)])
def test_reliability_x_axis_starts_at_the_chance_bin(k, lower):
    # confident predictions only (conf > 0.9): the axis still starts at the bin holding 1/K
    g = torch.Generator().manual_seed(k)
    logits = torch.randn(200, k, generator=g, dtype=torch.float64)
    logits[:, 0] += 12.0
    probs = torch.softmax(logits, -1)
    labels = torch.randint(0, k, (200,), generator=g)
    for overlay in (False, True):
        fig = plotting._reliability_figure({"m": (probs, labels)}, overlay=overlay)
        lo = fig.axes[0].get_xlim()[0]
        assert lo == pytest.approx(lower)
        assert lo <= float(probs.max(-1).values.min())  # no confidence is cut off


def test_reliability_overlay_legend_has_the_ece(results):
    fig = plotting._reliability_figure(results, overlay=True)
    assert len(fig.axes) == 2
    texts = [t.get_text() for t in fig.axes[0].get_legend().get_texts()]
    for name, (probs, labels) in results.items():
        assert f"{name} — ECE {expected_calibration_error(probs, labels):.4f}" in texts


# ---------------------------------------------------------------- risk-coverage


def _oracle_brute_force(correct: np.ndarray) -> np.ndarray:
    ranked = np.sort(correct)[::-1]  # every correct sample first
    return np.cumsum(1 - ranked) / np.arange(1, len(ranked) + 1)


def test_risk_coverage_plot(results, tmp_path):
    out = plotting.risk_coverage_plot(results, tmp_path / "rc.png")
    fig = plotting._risk_coverage_figure(results)
    assert _png_size(out) == _expected_size(fig)
    ax = fig.axes[0]
    texts = [t.get_text() for t in fig.legends[0].get_texts()]
    lines = ax.get_lines()
    n_methods = len(results)
    # the two methods have different error counts: references per method, in its colour
    assert len(lines) == 3 * n_methods
    assert texts[n_methods:] == ["Oracle ranking, one per method",
                                 "Random ranking (error rate), one per method"]
    for i, (name, (probs, y)) in enumerate(results.items()):
        curve = lines[i]
        assert texts[i] == f"{name} (AURC = {aurc(probs, y):.4f})"
        assert np.mean(curve.get_ydata()) == pytest.approx(aurc(probs, y))  # mean risk = AURC
        assert curve.get_xdata()[-1] == pytest.approx(1.0)
        correct = (probs.mean(0).argmax(-1) == y).numpy().astype(float)
        oracle, random = lines[n_methods + 2 * i], lines[n_methods + 2 * i + 1]
        np.testing.assert_allclose(oracle.get_ydata(), _oracle_brute_force(correct))
        np.testing.assert_allclose(oracle.get_xdata(), curve.get_xdata())
        np.testing.assert_allclose(random.get_ydata(), 1 - correct.mean())
        assert oracle.get_color() == curve.get_color() == random.get_color()


def test_risk_coverage_references_drawn_once_when_errors_agree(results):
    probs, labels = results["softmax"]
    fig = plotting._risk_coverage_figure({"a": (probs, labels), "b": (probs.flip(0), labels)})
    lines = fig.axes[0].get_lines()
    assert len(lines) == 4  # two curves, one oracle, one random
    assert lines[2].get_color() == lines[3].get_color() == "0.35"
    texts = [t.get_text() for t in fig.legends[0].get_texts()]
    assert texts[2:] == ["Oracle ranking", "Random ranking (error rate)"]


# ---------------------------------------------------------------- OOD histograms


def _polygon_area(xy: np.ndarray) -> float:
    x, y = xy[:, 0], xy[:, 1]
    return 0.5 * abs(np.dot(x, np.roll(y, 1)) - np.dot(y, np.roll(x, 1)))


def test_ood_score_histogram(tmp_path):
    test, ood_a, ood_b = _split(4, 90, 3, 0), _split(4, 70, 3, 2, 1.0), _split(4, 50, 3, 3, 0.3)
    s_in = ood_score("entropy", test["probs"])
    s_out = {"a": ood_score("entropy", ood_a["probs"]), "b": ood_score("entropy", ood_b["probs"])}
    out = plotting.ood_score_histogram(s_in, s_out, tmp_path / "h.png", score_name="entropy",
                                       title="entropy")
    fig = plotting._ood_histogram_figure({"": (s_in, s_out)}, "entropy", "entropy")
    assert _png_size(out) == _expected_size(fig)
    ax = fig.axes[0]
    assert ax.get_title() == "entropy" and ax.get_xlabel().startswith("Negative predictive")
    texts = [t.get_text() for t in ax.get_legend().get_texts()]
    assert texts[0] == "ID (n = 90)"
    for text, (name, data) in zip(texts[1:], (("a", ood_a), ("b", ood_b))):
        report = ood_report(test["probs"], None, data["probs"], None, detectors=["entropy"])
        assert text == f"{name} (n = {len(data['labels'])}) — AUROC " \
                       f"{report['entropy']['auroc']:.4f}"
    # filled + outline per set, all on the same bins, each a density (area 1)
    filled = ax.patches[0::2]
    assert len(ax.patches) == 6
    every = torch.cat([s_in, *s_out.values()])
    edges = np.linspace(float(every.min()), float(every.max()), 41)
    for p in ax.patches:
        np.testing.assert_allclose(np.unique(p.get_xy()[:, 0]), edges, atol=1e-12)
    for p in filled:
        assert _polygon_area(p.get_xy()) == pytest.approx(1.0)


def test_ood_score_histogram_bad_input(tmp_path):
    s = torch.rand(10)
    with pytest.raises(ValueError, match="non-empty dict"):
        plotting.ood_score_histogram(s, {}, tmp_path / "x.png", score_name="entropy")
    with pytest.raises(ValueError, match="NaN"):
        plotting.ood_score_histogram(s, {"a": torch.tensor([float("nan")])}, tmp_path / "x.png",
                                     score_name="entropy")
    # a constant score still gets a bin range
    assert _png_size(plotting.ood_score_histogram(torch.ones(5), {"a": torch.ones(3)},
                                                  tmp_path / "c.png", score_name="m"))[0] > 0


# ---------------------------------------------------------------- plot_runs


def test_plot_runs(tmp_path, drawn):
    soft = _run(tmp_path / "softmax" / "seed0", t=1, seed=0)
    kern = _run(tmp_path / "kernel" / "seed0", t=4, seed=10)
    out = tmp_path / "plots"
    paths = plotting.plot_runs([soft, kern], out)
    names = ["reliability.png", "risk_coverage.png", "rejection.png",
             "ood_ood_a_max_softmax.png", "ood_ood_a_entropy.png", "ood_ood_a_mutual_info.png",
             "ood_ood_a_roc.png"]
    assert paths == [out / n for n in names]
    for p in paths:
        assert _png_size(p) == _expected_size(drawn[p.name])
    # names: the folders share "seed0", so the last two path parts are used
    rel = drawn["reliability.png"]
    for i, (name, run) in enumerate((("softmax/seed0", soft), ("kernel/seed0", kern))):
        test = torch.load(run / "predictions.pt")["test"]
        ece = expected_calibration_error(test["probs"], test["labels"])
        assert rel.axes[2 * i].get_title() == f"{name} — ECE {ece:.4f}"
    # mutual information: only the T = 4 run has a panel
    mi = drawn["ood_ood_a_mutual_info.png"]
    assert [ax.get_title() for ax in mi.axes] == ["kernel/seed0"]
    preds = torch.load(kern / "predictions.pt")
    report = ood_report(preds["test"]["probs"], None, preds["ood_a"]["probs"], None,
                        detectors=["mutual_info"])
    legend = [t.get_text() for t in mi.axes[0].get_legend().get_texts()]
    assert legend[1].endswith(f"AUROC {report['mutual_info']['auroc']:.4f}")
    # explicit names, other detectors (energy uses logits, kl_matching the val templates)
    drawn.clear()
    paths = plotting.plot_runs([soft, kern], out, names=["A", "B"],
                               detectors=["energy", "kl_matching"])
    assert [p.name for p in paths[3:]] == ["ood_ood_a_energy.png", "ood_ood_a_kl_matching.png",
                                           "ood_ood_a_roc.png"]
    kl = drawn["ood_ood_a_kl_matching.png"]
    templates = kl_matching_templates(preds["val"]["probs"])
    want = ood_report(preds["test"]["probs"], None, preds["ood_a"]["probs"], None,
                      detectors=["kl_matching"], templates=templates)["kl_matching"]["auroc"]
    assert [ax.get_title() for ax in kl.axes] == ["A", "B"]
    assert kl.axes[1].get_legend().get_texts()[1].get_text().endswith(f"AUROC {want:.4f}")


def test_plot_runs_temperature(tmp_path, drawn):
    run = _run(tmp_path / "kernel" / "seed0", t=4)
    preds = torch.load(run / "predictions.pt")
    tau = fit_temperature(preds["val"]["logits"], preds["val"]["labels"])
    assert tau != 1.0
    plotting.plot_runs([run], tmp_path / "ts", temperature={"seed0": tau})
    tempered = torch.softmax(preds["test"]["logits"].double() / tau, -1)  # per pass, then mean
    ece = expected_calibration_error(tempered, preds["test"]["labels"])
    title = drawn["reliability.png"].axes[0].get_title()
    assert title == f"seed0 + TS (τ = {tau:.2f}) — ECE {ece:.4f}"
    assert ece != expected_calibration_error(preds["test"]["probs"], preds["test"]["labels"])
    msp = drawn["ood_ood_a_max_softmax.png"].axes[0].get_legend().get_texts()[1].get_text()
    ood_t = torch.softmax(preds["ood_a"]["logits"].double() / tau, -1)
    auroc = ood_report(tempered, None, ood_t, None, detectors=["max_softmax"])
    assert msp.endswith(f"AUROC {auroc['max_softmax']['auroc']:.4f}")


def test_plot_runs_errors(tmp_path):
    run = _run(tmp_path / "a" / "seed0", t=2)
    empty = tmp_path / "b" / "seed0"
    empty.mkdir(parents=True)
    with pytest.raises(FileNotFoundError, match=r"b/seed0.*gpattn-ppl evaluate"):
        plotting.plot_runs([run, empty], tmp_path / "out")
    with pytest.raises(ValueError, match="empty"):
        plotting.plot_runs([], tmp_path / "out")
    with pytest.raises(ValueError, match="unknown detector"):
        plotting.plot_runs([run], tmp_path / "out", detectors=["msp"])
    with pytest.raises(ValueError, match="string"):
        plotting.plot_runs([run], tmp_path / "out", detectors="entropy")
    with pytest.raises(ValueError, match="one per run"):
        plotting.plot_runs([run], tmp_path / "out", names=["x", "y"])
    with pytest.raises(ValueError, match="unique"):
        plotting.plot_runs([run, run], tmp_path / "out")
    with pytest.raises(ValueError, match="not among"):
        plotting.plot_runs([run], tmp_path / "out", temperature={"softmax": 2.0})
    with pytest.raises(ValueError, match="temperature"):
        plotting.plot_runs([run], tmp_path / "out", temperature={"seed0": -1.0})
    bad = tmp_path / "c"
    bad.mkdir()
    torch.save({"val": {}}, bad / "predictions.pt")
    with pytest.raises(CheckpointError, match="entry 'val': 'probs' is not a 3-d tensor"):
        plotting.plot_runs([bad], tmp_path / "out")
    torch.save({"val": _split(2, 10, 3, 0)}, bad / "predictions.pt")
    with pytest.raises(ValueError, match="'test' entry"):
        plotting.plot_runs([bad], tmp_path / "out")


# ---------------------------------------------------------------- severity, API


def test_metric_vs_severity(tmp_path):
    table = {
        "softmax": {3: 0.5, 1: 0.8, 5: 0.3},
        "kep_svgp": {1: {"acc": 0.85, "ece": 0.1}, 3: {"acc": 0.6, "ece": 0.2}},
    }
    with pytest.raises(ValueError, match="no metric 'acc'"):
        plotting.metric_vs_severity_plot({"m": {1: {"ece": 0.1}}}, "acc", tmp_path / "x.png")
    out = plotting.metric_vs_severity_plot(table, "acc", tmp_path / "sev.png")
    fig = plotting._severity_figure(table, "acc")
    assert _png_size(out) == _expected_size(fig)
    lines = fig.axes[0].get_lines()
    assert list(lines[0].get_xdata()) == [1, 3, 5]  # sorted severities
    assert list(lines[0].get_ydata()) == [0.8, 0.5, 0.3]
    assert list(lines[1].get_ydata()) == [0.85, 0.6]
    assert fig.axes[0].get_ylabel() == "Accuracy"


def test_bad_results():
    with pytest.raises(ValueError, match="non-empty dict"):
        plotting.reliability_diagram({}, "x.png")
    with pytest.raises(ValueError, match=r"\(probs, labels\) pair"):
        plotting.risk_coverage_plot({"m": torch.zeros(3, 2)}, "x.png")


def test_does_not_touch_pyplot():
    assert plotting.__all__ == [
        "reliability_diagram",
        "risk_coverage_plot",
        "ood_score_histogram",
        "metric_vs_severity_plot",
        "rejection_curve_plot",
        "ood_roc_plot",
        "planned_plot_names",
        "plot_runs",
        "plot_compare",
    ]
    if "matplotlib.pyplot" in sys.modules:  # imported by someone else: no figures left open
        import matplotlib.pyplot as plt

        before = len(plt.get_fignums())
        plotting._risk_coverage_figure({"m": (torch.tensor([[0.7, 0.3]]), torch.tensor([0]))})
        assert len(plt.get_fignums()) == before


# ---------------------------------------------------------------- rejection, ROC, TS, compare


def test_rejection_curve_plot(results, tmp_path, drawn):
    probs, labels = results["kep_svgp"]
    one_pass = (probs.mean(0), labels)
    out = plotting.rejection_curve_plot({"mc": (probs, labels), "det": one_pass},
                                        tmp_path / "rej.png")
    fig = drawn["rej.png"]
    assert _png_size(out) == _expected_size(fig)
    mc, det = fig.axes[:2]
    legend = [t.get_text() for t in mc.get_legend().get_texts()]
    assert [t.split(" (")[0] for t in legend] == ["by MI", "by entropy", "by MSP", "oracle",
                                                 "random"]
    assert "no MI" in det.get_title() and len(det.get_lines()) == 4  # entropy, MSP, 2 refs
    # brute force: keep the k samples of lowest MI, accuracy among them
    mi = -ood_score("mutual_info", probs)
    correct = (probs.mean(0).argmax(-1) == labels).double()
    rej, acc = mc.get_lines()[0].get_data()
    n = len(labels)
    for k in (n, 90, 30, 1):
        keep = torch.argsort(mi, stable=True)[:k]
        assert acc[n - k] == pytest.approx(float(correct[keep].mean()), abs=1e-12)
        assert rej[n - k] == pytest.approx(1 - k / n)
    with pytest.raises(ValueError, match="scores must be among"):
        plotting.rejection_curve_plot(results, tmp_path / "x.png", scores=["energy"])


def test_ood_roc_plot(tmp_path, drawn):
    from gpattn_ppl.metrics import ood_auroc

    g = torch.Generator().manual_seed(3)
    s_in = torch.randn(200, generator=g, dtype=torch.float64) + 1.0
    s_out = torch.randn(150, generator=g, dtype=torch.float64).round(decimals=1)  # ties
    plotting.ood_roc_plot({"m": {"entropy": (s_in, s_out), "max_softmax": (s_out, s_in)}},
                          tmp_path / "roc.png", title="t")
    ax = drawn["roc.png"].axes[0]
    lines = ax.get_lines()
    assert len(lines) == 3  # two scores, then the chance diagonal
    for line, (a, b) in zip(lines, [(s_in, s_out), (s_out, s_in)]):
        fpr, tpr = line.get_data()
        assert fpr[0] == 0 and fpr[-1] == 1 and np.all(np.diff(fpr) >= 0)
        # the area under the drawn curve is the AUROC of the tables (ties count one half)
        assert np.trapezoid(tpr, fpr) == pytest.approx(ood_auroc(a, b), abs=1e-12)
        assert line.get_label().endswith(f"AUROC {ood_auroc(a, b):.4f}")
    assert ood_auroc(s_in, s_out) > 0.7 > ood_auroc(s_out, s_in)


def test_mutual_information_histogram_is_legible(tmp_path, drawn):
    g = torch.Generator().manual_seed(0)
    s_in = -1e-4 * torch.rand(300, generator=g, dtype=torch.float64)  # MI ~1e-4 nats
    s_out = -4e-4 * torch.rand(100, generator=g, dtype=torch.float64)
    plotting.ood_score_histogram(s_in, {"o": s_out}, tmp_path / "mi.png",
                                 score_name="mutual_info")
    ax = drawn["mi.png"].axes[0]
    assert r"in units of $10^{-4}$" in ax.get_xlabel()
    lo, hi = ax.get_xlim()
    assert -10 < lo < -1 and -1 < hi <= 1  # drawn in units of 1e-4: short tick labels
    assert len([t for t in ax.get_xticks() if lo <= t <= hi]) <= 6


def test_plot_runs_temperature_scaled(tmp_path, drawn, monkeypatch):
    a = _run(tmp_path / "a", t=3, seed=1)
    b = _run(tmp_path / "b", t=3, seed=2)
    monkeypatch.setattr(plotting, "_fitted_temperature", lambda d: 1.7 if d.name == "a" else None)
    test = torch.load(a / "predictions.pt")["test"]
    ece = expected_calibration_error(test["probs"], test["labels"])
    ece_ts = expected_calibration_error(torch.softmax(test["logits"].double() / 1.7, -1),
                                        test["labels"])
    plotting.plot_runs([a, b], tmp_path / "both", predictive="both")
    fig = drawn["reliability.png"]
    test_b = torch.load(b / "predictions.pt")["test"]
    ece_b = expected_calibration_error(test_b["probs"], test_b["labels"])
    assert [ax.get_title() for ax in fig.axes[::2]] == [
        f"a (raw) — ECE {ece:.4f}", f"a + TS (τ = 1.70) — ECE {ece_ts:.4f}",
        f"b (raw, no TS fitted) — ECE {ece_b:.4f}"]
    assert "raw predictive and temperature-scaled" in fig.get_suptitle()
    plotting.plot_runs([a, b], tmp_path / "ts", predictive="ts")
    fig = drawn["reliability.png"]
    titles = [ax.get_title() for ax in fig.axes[::2]]
    assert titles[0] == f"a + TS (τ = 1.70) — ECE {ece_ts:.4f}"
    assert titles[1].startswith("b (raw, no TS fitted) — ECE")
    plotting.plot_runs([a], tmp_path / "raw")
    assert drawn["reliability.png"].get_suptitle().endswith("— raw predictive")
    with pytest.raises(ValueError, match="predictive must be one of"):
        plotting.plot_runs([a], tmp_path / "x", predictive="scaled")


def _seed_runs(root, methods, seeds=2, t=3):
    return {m: [_run(root / m / f"seed{s}", t=1 if m == "softmax" else t, seed=10 * i + s)
                for s in range(seeds)] for i, m in enumerate(methods)}


def test_plot_compare_overlay(tmp_path, drawn, monkeypatch):
    runs = _seed_runs(tmp_path, ["softmax", "sgpa", "kep_svgp"])
    monkeypatch.setattr(plotting, "_fitted_temperature",
                        lambda d: 1.5 if d.parent.name == "softmax" else None)
    paths = plotting.plot_compare(runs, tmp_path / "plots")
    assert [p.name for p in paths] == [
        "reliability.png", "risk_coverage.png", "rejection_mutual_info.png",
        "rejection_entropy.png", "ood_ood_a_max_softmax_roc.png", "ood_ood_a_max_softmax.png",
        "ood_ood_a_entropy_roc.png", "ood_ood_a_entropy.png", "ood_ood_a_mutual_info_roc.png",
        "ood_ood_a_mutual_info.png"]
    for p in paths:
        assert _png_size(p) == _expected_size(drawn[p.name])
    rc = drawn["risk_coverage.png"]
    assert len(rc.axes) == 1 and "over 2 seeds" in rc.get_suptitle()
    ax = rc.axes[0]
    legend = [t.get_text() for t in ax.get_legend().get_texts()]
    assert legend[0] == "softmax + TS (reference)"
    assert [t.split(" — ")[0] for t in legend[1:]] == ["softmax", "sgpa", "kep_svgp"]
    sgpa = [torch.load(d / "predictions.pt")["test"] for d in runs["sgpa"]]
    aurcs = [aurc(p["probs"], p["labels"]) for p in sgpa]
    assert legend[2] == (f"sgpa — AURC {np.mean(aurcs):.4f} ± "
                         f"{np.std(aurcs, ddof=1):.4f}")
    # the drawn mean ends at the mean error rate; a band (one per method and the reference)
    line = next(x for x in ax.get_lines() if x.get_label().startswith("sgpa"))
    err = [1 - float((p["probs"].mean(0).argmax(-1) == p["labels"]).double().mean())
           for p in sgpa]
    assert line.get_ydata()[-1] == pytest.approx(np.mean(err), abs=1e-12)
    assert len(ax.collections) == 4
    # MI: softmax (T = 1) is left out and named; its reference falls back to entropy
    mi = drawn["rejection_mutual_info.png"]
    assert "no MI: softmax" in mi.get_suptitle()
    texts = [t.get_text() for t in mi.axes[0].get_legend().get_texts()]
    assert texts[0] == "softmax + TS, by entropy (reference)"
    assert [t.split(" — ")[0] for t in texts[1:]] == ["sgpa", "kep_svgp"]
    roc = drawn["ood_ood_a_entropy_roc.png"].axes[0]
    assert "AUROC" in roc.get_legend().get_texts()[-1].get_text()


def test_plot_compare_small_multiples(tmp_path, drawn):
    methods = ["softmax", "a", "b", "c", "d"]
    plotting.plot_compare(_seed_runs(tmp_path, methods, seeds=3), tmp_path / "plots",
                          detectors=["entropy"])
    fig = drawn["reliability.png"]
    panels = [ax for ax in fig.axes if ax.get_visible()]
    assert [ax.get_title() for ax in panels] == methods
    for ax in panels:
        labels = [t.get_text() for t in ax.get_legend().get_texts()]
        # the diagonal once, the grey reference, the method (with its ECE over 3 seeds)
        assert labels[:2] == ["perfect calibration", "softmax (reference)"]
        assert len(labels) == 3 and " ± " in labels[2]
        assert len(ax.collections) == 2  # the reference's band and the method's
    assert "over 3 seeds" in fig.get_suptitle()
    rc = drawn["risk_coverage.png"]
    assert len([ax for ax in rc.axes if ax.get_visible()]) == 5
    assert [t.get_text() for t in rc.legends[0].get_texts()] == [
        "oracle ranking", "random ranking (error rate)"]
    with pytest.raises(ValueError, match="non-empty dict"):
        plotting.plot_compare({"a": []}, tmp_path / "x")
