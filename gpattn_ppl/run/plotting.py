r"""Evaluation figures: reliability diagram, risk-coverage curve, metric vs corruption severity.

Figures are built with matplotlib's object-oriented API on an Agg canvas
(:class:`matplotlib.figure.Figure` + ``FigureCanvasAgg``), never through ``pyplot``: nothing
changes the global backend or pyplot's figure registry, so the functions are safe on headless
machines, in worker processes and inside notebooks. Each function writes a PNG (creating the
parent folder) and returns its path.

``results`` arguments map a method name to ``(probs, labels)`` with ``probs`` ``[n, K]`` or
``[T, n, K]`` (averaged over ``T``) and ``labels`` ``[n]``; the plotted quantities use exactly
the definitions of :mod:`gpattn_ppl.metrics` (top-label bins :math:`((m-1)/M, m/M]`, stable
sort by confidence).
"""

from __future__ import annotations

import math
import os
from collections.abc import Mapping
from pathlib import Path

from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure

from ..metrics.calibration import calibration_bins, expected_calibration_error
from ..metrics.report import METRIC_NAMES
from ..metrics.selective import aurc, risk_coverage_curve

__all__ = ["reliability_diagram", "risk_coverage_plot", "metric_vs_severity_plot"]


def _check_results(results) -> None:
    if not isinstance(results, Mapping) or len(results) == 0:
        raise ValueError("results must be a non-empty dict {method: (probs, labels)}")
    for name, value in results.items():
        if not isinstance(value, (tuple, list)) or len(value) != 2:
            raise ValueError(f"results[{name!r}] must be a (probs, labels) pair")


def _save(fig: Figure, path: str | os.PathLike) -> Path:
    out = Path(path)
    out.parent.mkdir(parents=True, exist_ok=True)
    FigureCanvasAgg(fig)
    fig.savefig(out, format="png", dpi=120)
    return out


def _reliability_figure(results, n_bins: int = 15, overlay: bool = False) -> Figure:
    _check_results(results)
    n = len(results)
    ncols = 1 if overlay else min(n, 3)
    nrows = 1 if overlay else math.ceil(n / ncols)
    fig = Figure(figsize=(4.2 * ncols, 4.0 * nrows), layout="constrained")
    axes = fig.subplots(nrows, ncols, squeeze=False).ravel()
    for i, (name, (probs, labels)) in enumerate(results.items()):
        bins = calibration_bins(probs, labels, n_bins)
        ece = expected_calibration_error(probs, labels, n_bins)
        edges = bins["edges"].cpu().numpy()
        acc = bins["accuracy"].cpu().nan_to_num(0.0).numpy()
        conf = bins["confidence"].cpu().numpy()
        nonempty = bins["count"].cpu().numpy() > 0
        label = f"{name} (ECE = {ece:.4f})"
        ax = axes[0] if overlay else axes[i]
        if overlay:
            ax.plot(conf[nonempty], acc[nonempty], marker="o", label=label)
        else:
            width = edges[1:] - edges[:-1]
            ax.bar(
                edges[:-1],
                acc,
                width=width,
                align="edge",
                color="tab:blue",
                edgecolor="black",
                linewidth=0.5,
                label=label,
            )
            lo = [min(a, c) if m else 0.0 for a, c, m in zip(acc, conf, nonempty)]
            gap = [abs(a - c) if m else 0.0 for a, c, m in zip(acc, conf, nonempty)]
            ax.bar(
                edges[:-1],
                gap,
                bottom=lo,
                width=width,
                align="edge",
                color="tab:red",
                alpha=0.35,
                hatch="//",
                edgecolor="tab:red",
                linewidth=0.5,
                label="Gap |acc - conf|",
            )
            ax.set_title(str(name))
    for j, ax in enumerate(axes):
        if not overlay and j >= n:
            ax.set_visible(False)
            continue
        ax.plot([0, 1], [0, 1], linestyle="--", color="gray", label="Perfect calibration")
        ax.set_xlim(0, 1)
        ax.set_ylim(0, 1)
        ax.set_xlabel("Confidence")
        ax.set_ylabel("Accuracy")
        ax.legend(loc="upper left", fontsize="small")
    return fig


def reliability_diagram(
    results, path: str | os.PathLike, n_bins: int = 15, overlay: bool = False
) -> Path:
    r"""Top-label reliability diagram, one panel per method (or all overlaid).

    Each panel shows, for bins :math:`B_m = \{i : \mathrm{conf}_i \in ((m-1)/M, m/M]\}`, a bar of
    :math:`\mathrm{acc}(B_m)` and a hatched bar spanning the gap to :math:`\mathrm{conf}(B_m)`,
    with the diagonal of perfect calibration; the legend gives
    :math:`\mathrm{ECE} = \sum_m \frac{|B_m|}{n} |\mathrm{acc}(B_m) - \mathrm{conf}(B_m)|`.
    With ``overlay=True`` all methods share one axes as accuracy-vs-confidence lines over the
    non-empty bins.

    :param results: ``{method: (probs [n, K] or [T, n, K], labels [n])}``.
    :param path: output PNG path.
    :param n_bins: number ``M`` of equal-width bins (default 15).
    :param overlay: one shared axes instead of one panel per method.
    :returns: the written path.

    >>> import torch, tempfile, os
    >>> p = torch.tensor([[0.9, 0.1], [0.3, 0.7]])
    >>> out = reliability_diagram({"msp": (p, torch.tensor([0, 0]))},
    ...                           os.path.join(tempfile.mkdtemp(), "rel.png"))
    >>> out.suffix
    '.png'
    """
    return _save(_reliability_figure(results, n_bins, overlay), path)


def _risk_coverage_figure(results) -> Figure:
    _check_results(results)
    fig = Figure(figsize=(5.0, 4.0), layout="constrained")
    ax = fig.subplots()
    for name, (probs, labels) in results.items():
        coverage, risk = risk_coverage_curve(probs, labels)
        value = aurc(probs, labels)
        ax.plot(coverage.cpu().numpy(), risk.cpu().numpy(), label=f"{name} (AURC = {value:.4f})")
    ax.set_xlim(0, 1)
    ax.set_ylim(bottom=0)
    ax.set_xlabel("Coverage")
    ax.set_ylabel("Selective risk")
    ax.legend(loc="upper left", fontsize="small")
    return fig


def risk_coverage_plot(results, path: str | os.PathLike) -> Path:
    r"""Selective risk against coverage for each method, AURC in the legend.

    .. math::

        \mathrm{risk}_k = \frac1k \sum_{j \le k} (1 - c_{(j)}), \quad
        \mathrm{coverage}_k = \frac kn, \quad
        \mathrm{AURC} = \frac1n \sum_k \mathrm{risk}_k

    (samples sorted by confidence, descending, stable).

    :param results: ``{method: (probs [n, K] or [T, n, K], labels [n])}``.
    :param path: output PNG path.
    :returns: the written path.
    """
    return _save(_risk_coverage_figure(results), path)


def _severity_series(table, metric: str) -> dict[str, tuple[list, list[float]]]:
    if not isinstance(table, Mapping) or len(table) == 0:
        raise ValueError("table must be a non-empty dict {method: {severity: value}}")
    series = {}
    for method, row in table.items():
        if not isinstance(row, Mapping) or len(row) == 0:
            raise ValueError(f"table[{method!r}] must be a non-empty dict {{severity: value}}")
        xs, ys = [], []
        for severity in sorted(row):
            value = row[severity]
            if isinstance(value, Mapping):
                if metric not in value:
                    raise ValueError(
                        f"table[{method!r}][{severity!r}] has no metric {metric!r}; "
                        f"available: {sorted(value)}"
                    )
                value = value[metric]
            xs.append(severity)
            ys.append(float(value))
        series[str(method)] = (xs, ys)
    return series


def _severity_figure(table, metric: str) -> Figure:
    series = _severity_series(table, metric)
    fig = Figure(figsize=(5.0, 4.0), layout="constrained")
    ax = fig.subplots()
    for method, (xs, ys) in series.items():
        ax.plot(xs, ys, marker="o", label=method)
    ax.set_xlabel("Corruption severity")
    ax.set_ylabel(METRIC_NAMES.get(metric, metric))
    ax.legend(fontsize="small")
    return fig


def metric_vs_severity_plot(table, metric: str, path: str | os.PathLike) -> Path:
    """One metric against corruption severity (CIFAR-10-C style), one line per method.

    :param table: ``{method: {severity: value}}`` or ``{method: {severity: {metric: value}}}``
        (severity 0 may be the clean test set); severities are plotted in sorted order.
    :param metric: the metric key (used to pick from nested dicts and, through
        :data:`gpattn_ppl.metrics.METRIC_NAMES`, as the axis label).
    :param path: output PNG path.
    :returns: the written path.
    :raises ValueError: empty table or a nested row without ``metric``.
    """
    return _save(_severity_figure(table, metric), path)
