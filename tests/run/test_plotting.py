"""Plots: PNG files are written, and what they draw matches the metric definitions."""

from __future__ import annotations

import sys

import numpy as np
import pytest
import torch

from gpattn_ppl.metrics import aurc, calibration_bins, expected_calibration_error
from gpattn_ppl.run import plotting

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


@pytest.fixture
def results():
    g = torch.Generator().manual_seed(0)
    out = {}
    for name, scale in (("softmax", 4.0), ("kep_svgp", 1.5)):
        probs = torch.softmax(scale * torch.randn(3, 120, 4, generator=g, dtype=torch.float64), -1)
        labels = torch.randint(0, 4, (120,), generator=g)
        out[name] = (probs, labels)
    return out


def _is_png(path) -> bool:
    with open(path, "rb") as fh:
        return fh.read(8) == PNG_MAGIC


def test_reliability_diagram_writes_png(results, tmp_path):
    out = plotting.reliability_diagram(results, tmp_path / "sub" / "rel.png")
    assert out == tmp_path / "sub" / "rel.png" and _is_png(out)
    out2 = plotting.reliability_diagram(results, tmp_path / "rel_overlay.png", overlay=True)
    assert _is_png(out2)


def test_reliability_bars_and_legend_match_metrics(results):
    fig = plotting._reliability_figure(results, n_bins=15)
    axes = [ax for ax in fig.axes if ax.get_visible()]
    assert len(axes) == 2
    for ax, (name, (probs, labels)) in zip(axes, results.items()):
        ece = expected_calibration_error(probs, labels)
        texts = [t.get_text() for t in ax.get_legend().get_texts()]
        assert f"{name} (ECE = {ece:.4f})" in texts
        bars = ax.containers[0]  # accuracy bars
        heights = np.array([b.get_height() for b in bars])
        expected = calibration_bins(probs, labels)["accuracy"].nan_to_num(0.0).numpy()
        np.testing.assert_allclose(heights, expected)
        gaps = np.array([b.get_height() for b in ax.containers[1]])
        bins = calibration_bins(probs, labels)
        want = (bins["accuracy"] - bins["confidence"]).abs().nan_to_num(0.0).numpy()
        np.testing.assert_allclose(gaps, want)


def test_risk_coverage_plot(results, tmp_path):
    assert _is_png(plotting.risk_coverage_plot(results, tmp_path / "rc.png"))
    fig = plotting._risk_coverage_figure(results)
    ax = fig.axes[0]
    labels = [t.get_text() for t in ax.get_legend().get_texts()]
    for (name, (probs, y)), line, label in zip(results.items(), ax.get_lines(), labels):
        assert label == f"{name} (AURC = {aurc(probs, y):.4f})"
        # the curve's mean risk is the AURC
        assert np.mean(line.get_ydata()) == pytest.approx(aurc(probs, y))
        assert line.get_xdata()[-1] == pytest.approx(1.0)


def test_metric_vs_severity(tmp_path):
    table = {
        "softmax": {3: 0.5, 1: 0.8, 5: 0.3},
        "kep_svgp": {1: {"acc": 0.85, "ece": 0.1}, 3: {"acc": 0.6, "ece": 0.2}},
    }
    with pytest.raises(ValueError, match="no metric 'acc'"):
        plotting.metric_vs_severity_plot({"m": {1: {"ece": 0.1}}}, "acc", tmp_path / "x.png")
    assert _is_png(plotting.metric_vs_severity_plot(table, "acc", tmp_path / "sev.png"))
    fig = plotting._severity_figure(table, "acc")
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
        "metric_vs_severity_plot",
    ]
    if "matplotlib.pyplot" in sys.modules:  # imported by someone else: no figures left open
        import matplotlib.pyplot as plt

        before = len(plt.get_fignums())
        plotting._risk_coverage_figure({"m": (torch.tensor([[0.7, 0.3]]), torch.tensor([0]))})
        assert len(plt.get_fignums()) == before
