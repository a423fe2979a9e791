r"""Evaluation figures: reliability diagram, risk-coverage curve, OOD score histograms, metric vs
corruption severity, and :func:`plot_runs` that draws the first three for finished run folders.

Figures are built with matplotlib's object-oriented API on an Agg canvas
(:class:`matplotlib.figure.Figure` + ``FigureCanvasAgg``), never through ``pyplot``: nothing
changes the global backend or pyplot's figure registry, so the functions are safe on headless
machines, in worker processes and inside notebooks. Each function writes a PNG (creating the
parent folder) and returns its path.

``results`` arguments map a method name to ``(probs, labels)`` with ``probs`` ``[n, K]`` or
``[T, n, K]`` (averaged over ``T``) and ``labels`` ``[n]``; the plotted quantities use exactly
the definitions of :mod:`gpattn_ppl.metrics` (top-label bins :math:`((m-1)/M, m/M]`, stable
sort by confidence) and the numbers printed on a figure are those of the metric functions.
"""

from __future__ import annotations

import math
import os
import re
import warnings
from collections.abc import Mapping, Sequence
from pathlib import Path

import numpy as np
import torch
from matplotlib import colormaps
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.colors import to_rgba
from matplotlib.figure import Figure
from matplotlib.lines import Line2D
from matplotlib.patches import Patch
from matplotlib.ticker import MaxNLocator

from ..metrics import ood_auroc
from ..metrics.calibration import bin_index, calibration_bins, expected_calibration_error
from ..metrics.inputs import as_probs, as_scores
from ..metrics.report import METRIC_NAMES
from ..metrics.selective import aurc, risk_coverage_curve
from ..metrics.temperature import apply_temperature
from ..ood import OOD_DETECTORS, kl_matching_templates, ood_score

__all__ = [
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

#: Oracle and random reference styles of the risk-coverage plot.
_ORACLE = {"linestyle": ":", "linewidth": 1.6}
_RANDOM = {"linestyle": "--", "linewidth": 1.0}


def _check_results(results) -> None:
    if not isinstance(results, Mapping) or len(results) == 0:
        raise ValueError("results must be a non-empty dict {method: (probs, labels)}")
    for name, value in results.items():
        if not isinstance(value, (tuple, list)) or len(value) != 2:
            raise ValueError(f"results[{name!r}] must be a (probs, labels) pair")


def _save(fig: Figure, path: str | os.PathLike, root: str | os.PathLike | None = None, *,
          overwrite: bool = True) -> Path:
    """Render ``fig`` as PNG and write it atomically (:func:`gpattn_ppl.safe_files.write_atomic`:
    never through a link, the folders below ``root`` real folders; an existing file replaced
    only with ``overwrite``)."""
    import io

    from ..safe_files import write_atomic

    buf = io.BytesIO()
    FigureCanvasAgg(fig)
    fig.savefig(buf, format="png", dpi=120)
    return write_atomic(path, buf.getvalue(), root=root, overwrite=overwrite)


def _zoom_lower(bins: dict, num_classes: int) -> float:
    """Lower x-limit: the lower edge of the lowest non-empty bin, at most the lower edge of the
    bin holding the chance level ``1/K`` (top-label confidences are ``>= 1/K``)."""
    edges, count = bins["edges"], bins["count"]
    chance = float(edges[bin_index(torch.tensor([1.0 / num_classes], dtype=torch.float64),
                                    len(count))])
    lowest = float(edges[int(torch.nonzero(count > 0)[0])])
    return min(lowest, chance)


def _reliability_figure(results, n_bins: int = 15, overlay: bool = False,
                        title: str | None = None) -> Figure:
    """Figure whose axes are ``[reliability, counts]`` per panel (one panel if ``overlay``);
    ``title`` is the figure's."""
    _check_results(results)
    n = len(results)
    ncols = 1 if overlay else min(n, 3)
    nrows = 1 if overlay else math.ceil(n / ncols)
    fig = Figure(figsize=(4.3 * ncols + (1.2 if overlay else 0.0), 5.0 * nrows),
                 layout="constrained")
    grid = fig.add_gridspec(2 * nrows, ncols, height_ratios=[3.3, 1.0] * nrows)
    panels: list[tuple] = []
    lower = 1.0
    for i, (name, (probs, labels)) in enumerate(results.items()):
        bins = calibration_bins(probs, labels, n_bins)
        ece = expected_calibration_error(probs, labels, n_bins)
        lower = min(lower, _zoom_lower(bins, as_probs(probs).shape[-1]))
        if overlay and i > 0:
            ax, hx = panels[0]
        else:
            r, c = divmod(i, ncols)
            ax = fig.add_subplot(grid[2 * r, c])
            hx = fig.add_subplot(grid[2 * r + 1, c], sharex=ax)
        panels.append((ax, hx))
        edges = bins["edges"].cpu().numpy()
        count = bins["count"].cpu().numpy()
        acc = bins["accuracy"].cpu().nan_to_num(0.0).numpy()
        conf = bins["confidence"].cpu().numpy()
        nonempty = count > 0
        width = edges[1:] - edges[:-1]
        if overlay:
            line = ax.plot(conf[nonempty], acc[nonempty], marker="o", markersize=4,
                           label=f"{name} — ECE {ece:.4f}")[0]
            hx.stairs(count, edges, color=line.get_color(), linewidth=1.2)
        else:
            ax.bar(edges[:-1], acc, width=width, align="edge", color="tab:blue",
                   edgecolor="black", linewidth=0.5, label="Accuracy")
            lo = np.where(nonempty, np.minimum(acc, np.nan_to_num(conf)), 0.0)
            gap = np.where(nonempty, np.abs(acc - np.nan_to_num(conf)), 0.0)
            ax.bar(edges[:-1], gap, bottom=lo, width=width, align="edge", color="tab:red",
                   alpha=0.35, hatch="//", edgecolor="tab:red", linewidth=0.5,
                   label="Gap to confidence")
            ax.set_title(f"{name} — ECE {ece:.4f}")
            hx.bar(edges[:-1][nonempty], count[nonempty], width=width[nonempty], align="edge",
                   color="0.55", edgecolor="black", linewidth=0.5)
    for ax, hx in panels[: 1 if overlay else n]:
        ax.plot([lower, 1], [lower, 1], linestyle="--", color="gray",
                label="Perfect calibration")
        ax.set_xlim(lower, 1)
        ax.set_ylim(0, 1)
        ax.set_ylabel("Accuracy")
        ax.tick_params(labelbottom=False)
        ax.legend(loc="upper left", fontsize="small")
        hx.set_yscale("log")
        hx.set_ylim(bottom=0.7)
        hx.set_ylabel("Count")
        hx.set_xlabel("Confidence")
        if overlay:
            ax.set_title("Reliability")
    if title:
        fig.suptitle(title)
    return fig


def reliability_diagram(
    results, path: str | os.PathLike, n_bins: int = 15, overlay: bool = False,
    title: str | None = None,
) -> Path:
    r"""Top-label reliability diagram with a count histogram, one panel per method (or overlaid).

    Each panel shows, for bins :math:`B_m = \{i : \mathrm{conf}_i \in ((m-1)/M, m/M]\}` (the
    bins of :func:`gpattn_ppl.metrics.expected_calibration_error`), a bar of
    :math:`\mathrm{acc}(B_m)`, a hatched bar spanning the gap to :math:`\mathrm{conf}(B_m)`,
    the diagonal of perfect calibration, and in the title

    .. math::

        \mathrm{ECE} = \sum_m \frac{|B_m|}{n} \bigl|\mathrm{acc}(B_m) - \mathrm{conf}(B_m)\bigr|.

    Under it, on a shared x-axis, a shorter axes gives :math:`|B_m|` on a **log** scale (an
    overconfident model puts most samples in the top bin; a linear scale would hide the rest).
    The x-axis starts at the lower edge of the lowest non-empty bin, at most at the edge of the
    bin that holds :math:`1/K` (the smallest possible top-label confidence for :math:`K`
    classes), the same for every panel so that they compare. With ``overlay=True`` all methods share one axes as accuracy-vs-confidence lines
    over the non-empty bins (ECE in the legend) and one step histogram of counts each.

    :param results: ``{method: (probs [n, K] or [T, n, K], labels [n])}``.
    :param path: output PNG path.
    :param n_bins: number ``M`` of equal-width bins (default 15).
    :param overlay: one shared axes instead of one panel per method.
    :param title: figure title (e.g. which predictive, raw or temperature-scaled).
    :returns: the written path.

    >>> import torch, tempfile, os
    >>> p = torch.tensor([[0.9, 0.1], [0.3, 0.7]])
    >>> out = reliability_diagram({"msp": (p, torch.tensor([0, 0]))},
    ...                           os.path.join(tempfile.mkdtemp(), "rel.png"))
    >>> out.suffix
    '.png'
    """
    return _save(_reliability_figure(results, n_bins, overlay, title), path)


def _oracle_risk(n: int, n_correct: int) -> np.ndarray:
    """Risk of the oracle ranking (correct samples first): ``max(0, k - n_correct) / k``."""
    k = np.arange(1, n + 1, dtype=np.float64)
    return np.maximum(k - n_correct, 0.0) / k


def _risk_coverage_figure(results) -> Figure:
    """Axes lines: per method its curve, then the references (see :func:`risk_coverage_plot`);
    the legend is the figure's, under the axes."""
    _check_results(results)
    fig = Figure(figsize=(6.0, 4.8), layout="constrained")
    ax = fig.subplots()
    curves = []
    for name, (probs, labels) in results.items():
        coverage, risk = risk_coverage_curve(probs, labels)
        n = coverage.numel()
        n_err = round(float(risk[-1]) * n)
        line = ax.plot(coverage.cpu().numpy(), risk.cpu().numpy(), linewidth=1.6,
                       label=f"{name} (AURC = {aurc(probs, labels):.4f})")[0]
        curves.append((n, n_err, coverage.cpu().numpy(), line.get_color()))
    shared = len({(n, e) for n, e, _, _ in curves}) == 1
    for n, n_err, cov, color in curves[:1] if shared else curves:
        col = "0.35" if shared else color
        ax.plot(cov, _oracle_risk(n, n - n_err), color=col, label="_oracle", **_ORACLE)
        ax.plot([cov[0], 1.0], [n_err / n] * 2, color=col, label="_random", **_RANDOM)
    handles = [Line2D([], [], color="0.35", **_ORACLE), Line2D([], [], color="0.35", **_RANDOM)]
    per = "" if shared else ", one per method"
    ax.set_xlim(0, 1)
    peak = max(float(np.max(line.get_ydata())) for line in ax.get_lines())
    ax.set_ylim(0, max(1.04 * peak, 0.05))  # 0.05: every prediction correct
    ax.set_xlabel("Coverage")
    ax.set_ylabel("Selective risk")
    method_handles, method_labels = ax.get_legend_handles_labels()
    fig.legend(method_handles + handles,
               method_labels + [f"Oracle ranking{per}", f"Random ranking (error rate){per}"],
               loc="outside lower center", ncols=2, fontsize="small", frameon=False)
    return fig


def risk_coverage_plot(results, path: str | os.PathLike) -> Path:
    r"""Selective risk against coverage for each method, AURC in the legend, with references.

    .. math::

        \mathrm{risk}_k = \frac1k \sum_{j \le k} (1 - c_{(j)}), \quad
        \mathrm{coverage}_k = \frac kn, \quad
        \mathrm{AURC} = \frac1n \sum_k \mathrm{risk}_k

    (samples sorted by confidence, descending, stable). Two references, dotted and dashed:
    the **oracle** ranking, which accepts every correct sample first,
    :math:`\mathrm{risk}^\star_k = \max(0, k - n_\mathrm{correct}) / k`, and the **random**
    ranking, whose expected risk is the error rate :math:`r` at every coverage. They are drawn
    once in grey when every method has the same :math:`n` and number of errors, otherwise once
    per method in its colour (the legend, under the axes, keys the line styles in grey).

    :param results: ``{method: (probs [n, K] or [T, n, K], labels [n])}``.
    :param path: output PNG path.
    :returns: the written path.
    """
    return _save(_risk_coverage_figure(results), path)


def _draw_ood_hist(ax, id_scores, ood_scores, bins: int = 40) -> str:
    """Overlaid density histograms on shared bins; AUROC (ID positive) per OOD set.

    Scores whose largest magnitude is below ``1e-2`` or from ``1e4`` are drawn divided by
    ``10^e`` (``e`` its exponent) so that tick labels stay short; returns the axis-label
    suffix naming the factor (``""`` when unscaled)."""
    if not isinstance(ood_scores, Mapping) or len(ood_scores) == 0:
        raise ValueError("ood_scores must be a non-empty dict {ood set: scores [n_out]}")
    s_in = as_scores(id_scores, "id_scores").cpu()
    s_out = {str(k): as_scores(v, f"ood_scores[{k!r}]").cpu() for k, v in ood_scores.items()}
    every = torch.cat([s_in, *s_out.values()])
    lo, hi = float(every.min()), float(every.max())
    span = max(abs(lo), abs(hi))
    exp = math.floor(math.log10(span)) if span > 0 else 0
    scale = 10.0 ** exp if exp < -2 or exp > 3 else 1.0  # e.g. MI ~1e-4 nats: plot MI / 1e-4
    s_in, lo, hi = s_in / scale, lo / scale, hi / scale
    s_out = {k: v / scale for k, v in s_out.items()}
    if hi - lo < 1e-12:
        lo, hi = lo - 0.5, hi + 0.5
    edges = np.linspace(lo, hi, bins + 1)
    handles, labels = [], []
    sets = [(f"ID (n = {s_in.numel()})", s_in, "tab:blue")]
    for j, (name, s) in enumerate(s_out.items()):
        label = f"{name} (n = {s.numel()}) — AUROC {ood_auroc(s_in, s):.4f}"  # scale-free
        sets.append((label, s, f"C{(j + 1) % 10}"))
    for label, s, color in sets:
        ax.hist(s.numpy(), bins=edges, density=True, histtype="stepfilled", color=color,
                alpha=0.22, linewidth=0)
        ax.hist(s.numpy(), bins=edges, density=True, histtype="step", color=color, linewidth=1.3)
        handles.append(Patch(facecolor=to_rgba(color, 0.22), edgecolor=color, linewidth=1.3))
        labels.append(label)
    top = ax.get_ylim()[1]
    ax.set_ylim(0, top / (0.95 - 0.075 * len(sets)))  # headroom for the legend
    ax.set_ylabel("Density")
    _legible_ticks(ax)
    ax.legend(handles, labels, loc="upper left", fontsize="small")
    return "" if scale == 1.0 else rf" in units of $10^{{{exp}}}$"


def _legible_ticks(ax, axes: str = "both") -> None:
    """At most 5 major ticks and short labels: values outside ``[1e-2, 1e3)`` (e.g. mutual
    information ``~1e-4`` nats, or densities ``~1e4`` of such a score) get a common
    ``×10^k`` offset instead of long overlapping decimals."""
    for axis in (("x", "y") if axes == "both" else (axes,)):
        getattr(ax, f"{axis}axis").set_major_locator(MaxNLocator(nbins=5))
        ax.ticklabel_format(axis=axis, style="sci", scilimits=(-2, 3), useMathText=True)


def _score_label(name: str) -> str:
    """The axis label a detector registered with (its name for an unregistered one)."""
    det = OOD_DETECTORS.get(name)
    return name if det is None else det.label


def _ood_histogram_figure(panels: Mapping, score_name: str, title: str | None = None) -> Figure:
    """One axes per panel ``{panel title: (id_scores, {ood set: scores})}``; ``title`` is the
    figure's title (the axes title if the only panel title is empty)."""
    n = len(panels)
    ncols = min(n, 3)
    nrows = math.ceil(n / ncols)
    fig = Figure(figsize=(5.0 * ncols, 3.8 * nrows), layout="constrained")
    axes = fig.subplots(nrows, ncols, squeeze=False).ravel()
    for ax, (name, (id_scores, ood_scores)) in zip(axes, panels.items()):
        factor = _draw_ood_hist(ax, id_scores, ood_scores)
        ax.set_xlabel(f"{_score_label(score_name)}{factor}{chr(10) if factor else ' '}"
                      "(higher = more ID)")
        if name:
            ax.set_title(str(name))
    for ax in axes[n:]:
        ax.set_visible(False)
    if title and any(panels):
        fig.suptitle(title)
    elif title:
        axes[0].set_title(title)
    return fig


def ood_score_histogram(
    id_scores,
    ood_scores: Mapping,
    path: str | os.PathLike,
    *,
    score_name: str,
    title: str | None = None,
) -> Path:
    r"""Normalised histograms of one OOD detector score: ID test set vs each OOD set.

    All sets share 40 equal-width bins over the range of every score; each histogram is a
    density (area 1). The legend gives per OOD set the AUROC with ID as the positive class,
    :func:`gpattn_ppl.metrics.ood_auroc`, the number in :func:`gpattn_ppl.ood.ood_report`:

    .. math::

        \mathrm{AUROC} = P(s_\mathrm{in} > s_\mathrm{out})
        + \tfrac12 P(s_\mathrm{in} = s_\mathrm{out}).

    :param id_scores: scores of the ID samples ``[n_in]`` (higher = more in-distribution, e.g.
        :func:`gpattn_ppl.ood.ood_score`).
    :param ood_scores: ``{ood set name: scores [n_out]}``.
    :param path: output PNG path.
    :param score_name: the detector's name (a registered one, :data:`gpattn_ppl.ood.SCORE_NAMES`,
        gives the axis label it was registered with; any other string is used as it is).
    :param title: figure title (default none).
    :returns: the written path.
    :raises ValueError: empty ``ood_scores`` or malformed scores.
    """
    return _save(_ood_histogram_figure({"": (id_scores, ood_scores)}, score_name, title), path)


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
    # one colour per method (tab20 past 10), its "+ TS" row dashed in the same colour, and the
    # legend beside the axes so that it hides no line
    base = [m for m in series if not m.endswith(" + TS")]
    cmap = colormaps["tab10" if len(base) <= 10 else "tab20"]
    colours = {m: cmap(i % cmap.N) for i, m in enumerate(base)}
    fig = Figure(figsize=(7.0, 4.0), layout="constrained")
    ax = fig.subplots()
    for method, (xs, ys) in series.items():
        root = method.removesuffix(" + TS")
        ax.plot(xs, ys, marker="o", markersize=3, label=method, color=colours.get(root),
                linestyle="-" if method == root else "--")
    ax.set_xlabel("Corruption severity")
    ax.set_ylabel(METRIC_NAMES.get(metric, metric))
    ax.legend(fontsize="x-small", loc="center left", bbox_to_anchor=(1.02, 0.5))
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


# ---------------------------------------------------------------- rejection and ROC curves

#: scores a rejection curve ranks by (higher = more certain, :func:`gpattn_ppl.ood.ood_score`),
#: in drawing order, with their legend names and colours
_REJECTION = {"mutual_info": ("MI", "tab:purple"), "entropy": ("entropy", "tab:blue"),
              "max_softmax": ("MSP", "tab:orange")}
_REF_GREY = "0.45"


def _correct(probs, labels) -> np.ndarray:
    """``1[argmax_k p̄_ik = y_i]`` as a bool array ``[n]`` (``p̄`` the mean over passes)."""
    p = as_probs(probs)
    y = torch.as_tensor(labels).reshape(-1).cpu()
    if y.numel() != p.shape[1]:
        raise ValueError(f"labels has {y.numel()} entries for {p.shape[1]} predictions")
    return (p.mean(0).argmax(-1).cpu() == y).numpy()


def _rejection_curve(probs, labels, score: str) -> tuple[np.ndarray, np.ndarray]:
    r"""``(rejected [n], accuracy [n])``, rejected fraction increasing.

    Samples sorted by ``ood_score(score)`` descending (most certain first, stable: ties by
    index); keeping the first :math:`k` gives
    :math:`\mathrm{rejected}_k = 1 - k/n` and :math:`\mathrm{acc}_k = \frac1k\sum_{j\le k}c_{(j)}`.
    """
    s = ood_score(score, probs).cpu().numpy()
    c = _correct(probs, labels)
    order = np.argsort(-s, kind="stable")
    k = np.arange(1, len(s) + 1)
    acc = np.cumsum(c[order]) / k
    return (1.0 - k / len(s))[::-1], acc[::-1]


def _rejection_figure(results, scores: Sequence[str] = tuple(_REJECTION)) -> Figure:
    """One axes per method; per axes one line per score, then the oracle and random
    references in grey (in that order)."""
    _check_results(results)
    unknown = [s for s in scores if s not in _REJECTION]
    if unknown or not scores:
        raise ValueError(f"scores must be among {list(_REJECTION)}, got {list(scores)}")
    n = len(results)
    ncols = min(n, 3)
    nrows = math.ceil(n / ncols)
    fig = Figure(figsize=(4.6 * ncols, 3.9 * nrows), layout="constrained")
    axes = fig.subplots(nrows, ncols, squeeze=False, sharey=True).ravel()
    for ax, (name, (probs, labels)) in zip(axes, results.items()):
        passes = as_probs(probs).shape[0]
        skipped = []
        for score in scores:
            short, colour = _REJECTION[score]
            if OOD_DETECTORS[score].multi_pass and passes < 2:
                skipped.append(short)
                continue
            rej, acc = _rejection_curve(probs, labels, score)
            ax.plot(rej, acc, color=colour, linewidth=1.6,
                    label=f"by {short} (mean acc. {acc.mean():.3f})")
        c = _correct(probs, labels)
        k = np.arange(len(c), 0, -1)
        rej = 1.0 - k / len(c)
        ax.plot(rej, np.minimum(1.0, c.sum() / k), color=_REF_GREY, label="oracle", **_ORACLE)
        ax.plot([0, 1], [c.mean()] * 2, color=_REF_GREY, label="random", **_RANDOM)
        note = f" (T = 1: no {', '.join(skipped)})" if skipped else ""
        ax.set_title(f"{name}{note}", fontsize="medium")
        ax.set_xlim(0, 1)
        ax.set_xlabel("Fraction rejected (most uncertain first)")
        ax.legend(loc="lower right", fontsize="x-small")
    for ax in axes[n:]:
        ax.set_visible(False)
    for ax in axes[::ncols]:
        ax.set_ylabel("Accuracy of retained")
    return fig


def rejection_curve_plot(results, path: str | os.PathLike,
                         scores: Sequence[str] = ("mutual_info", "entropy", "max_softmax")
                         ) -> Path:
    r"""Accuracy of the retained predictions as the most uncertain ones are rejected.

    For each score :math:`s` (``mutual_info``, ``entropy``, ``max_softmax`` of
    :func:`gpattn_ppl.ood.ood_score`: higher = more certain) the samples are sorted by
    :math:`s` descending (stable) and, keeping the first :math:`k`,

    .. math::

        \mathrm{rejected}_k = 1 - \frac kn, \qquad
        \mathrm{acc}_k = \frac1k \sum_{j \le k} c_{(j)}

    with :math:`c_i = 1[\hat y_i = y_i]`. One panel per method, one line per score (the legend
    gives the mean of :math:`\mathrm{acc}_k` over :math:`k`, the area under the curve in
    coverage); MI is left out for ``T = 1`` pass (it is 0). Grey references: the **oracle**
    (errors rejected first, :math:`\min(1, n_\mathrm{correct}/k)`) and **random** rejection
    (the accuracy at every fraction).

    :param results: ``{method: (probs [n, K] or [T, n, K], labels [n])}``.
    :param path: output PNG path.
    :param scores: a subset of ``("mutual_info", "entropy", "max_softmax")``.
    :returns: the written path.
    """
    return _save(_rejection_figure(results, scores), path)


def _roc(s_in, s_out) -> tuple[np.ndarray, np.ndarray]:
    """``(fpr, tpr)`` of ``sklearn.metrics.roc_curve`` with ID as the positive class."""
    from sklearn.metrics import roc_curve

    a, b = as_scores(s_in, "id_scores").cpu(), as_scores(s_out, "ood_scores").cpu()
    y = np.r_[np.ones(a.numel()), np.zeros(b.numel())]
    fpr, tpr, _ = roc_curve(y, torch.cat([a, b]).numpy())
    return fpr, tpr


def _roc_figure(panels: Mapping, title: str | None = None) -> Figure:
    """One axes per panel ``{panel title: {score name: (id_scores, ood_scores)}}``; per axes
    one line per score, then the chance diagonal."""
    if not isinstance(panels, Mapping) or not panels:
        raise ValueError("panels must be a non-empty dict {panel: {score: (id, ood)}}")
    n = len(panels)
    ncols = min(n, 3)
    nrows = math.ceil(n / ncols)
    fig = Figure(figsize=(4.3 * ncols, 4.2 * nrows), layout="constrained")
    axes = fig.subplots(nrows, ncols, squeeze=False).ravel()
    for ax, (name, curves) in zip(axes, panels.items()):
        if not isinstance(curves, Mapping) or not curves:
            raise ValueError(f"panels[{name!r}] must be a non-empty dict {{score: (id, ood)}}")
        for j, (score, (s_in, s_out)) in enumerate(curves.items()):
            fpr, tpr = _roc(s_in, s_out)
            colour = _REJECTION.get(score, (None, f"C{j % 10}"))[1]
            ax.plot(fpr, tpr, color=colour, linewidth=1.6,
                    label=f"{_score_label(score)} — AUROC {ood_auroc(s_in, s_out):.4f}")
        ax.plot([0, 1], [0, 1], color=_REF_GREY, label="chance", **_RANDOM)
        ax.set_xlim(0, 1)
        ax.set_ylim(0, 1.01)
        ax.set_aspect("equal")
        ax.set_xlabel("False positive rate (OOD taken for ID)")
        ax.set_ylabel("True positive rate (ID kept)")
        ax.legend(loc="lower right", fontsize="x-small")
        if name:
            ax.set_title(str(name), fontsize="medium")
    for ax in axes[n:]:
        ax.set_visible(False)
    if title:
        fig.suptitle(title)
    return fig


def ood_roc_plot(panels: Mapping, path: str | os.PathLike, *, title: str | None = None) -> Path:
    r"""ROC curves of OOD detector scores, ID as the positive class, AUROC in the legend.

    Each curve is ``sklearn.metrics.roc_curve`` of the scores (higher = more ID) of the ID
    test set (label 1) and one OOD set (label 0): true positive rate (ID kept) against false
    positive rate (OOD taken for ID) as the threshold falls. The AUROC in the legend is
    :func:`gpattn_ppl.metrics.ood_auroc`, :math:`P(s_\mathrm{in} > s_\mathrm{out}) +
    \tfrac12 P(s_\mathrm{in} = s_\mathrm{out})`, the number of the tables.

    :param panels: ``{panel title: {score name: (id_scores [n_in], ood_scores [n_out])}}``, one
        panel per method (score names label the lines through
        :data:`gpattn_ppl.ood.OOD_DETECTORS` when registered).
    :param path: output PNG path.
    :param title: figure title.
    :returns: the written path.
    """
    return _save(_roc_figure(panels, title), path)


# ---------------------------------------------------------------- seed-pooled comparison


def _band(ys: np.ndarray) -> tuple[np.ndarray, np.ndarray | None]:
    """Mean over seeds (rows, NaN ignored) and the sample standard deviation (ddof 1; ``None``
    for one seed)."""
    ys = np.atleast_2d(ys)
    with np.errstate(all="ignore"), warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)  # an all-NaN column (an empty bin)
        mean = np.nanmean(ys, 0)
        sd = np.nanstd(ys, 0, ddof=1) if ys.shape[0] > 1 else None
    return mean, sd


def _pm(values: Sequence[float], fmt: str = ".3f") -> str:
    """``mean ± sd`` (sample sd) of per-seed numbers, the mean alone for one seed."""
    m, sd = _band(np.asarray(values, dtype=np.float64)[:, None])
    return f"{m[0]:{fmt}}" if sd is None else f"{m[0]:{fmt}} ± {sd[0]:{fmt}}"


def _pooled_figure(curves: Mapping[str, dict], *, reference: dict | None, xlabel: str,
                   ylabel: str, title: str, shared: Sequence[tuple] = (),
                   xlim=(0, 1), ylim=None, legend_loc: str = "best") -> Figure:
    r"""Seed-pooled curves: one axes with every method (at most 4 methods) or small multiples.

    :param curves: ``{method: {"x": [G], "ys": [S, G], "summary": str, "refs": [(x, y, kw)]}}``
        (``refs``: the method's own references, e.g. its oracle; drawn grey in its panel, in
        its colour and faint on a shared axes).
    :param reference: ``{"x", "ys", "label"}`` drawn grey in every panel, or ``None``.
    :param shared: ``(x, y, kw, label)`` references that hold for every method (a diagonal),
        drawn once per axes.
    """
    methods = list(curves)
    many = len(methods) > 4
    seeds = sorted({np.atleast_2d(c["ys"]).shape[0] for c in curves.values()})
    pooled = ("one seed" if seeds == [1] else f"mean ± 1 s.d. over {seeds[0]} seeds"
              if len(seeds) == 1 else f"mean ± 1 s.d. over {seeds[0]}–{seeds[-1]} seeds")
    if many:
        ncols = 4 if len(methods) > 6 else 3
        nrows = math.ceil(len(methods) / ncols)
        fig = Figure(figsize=(3.3 * ncols, 3.0 * nrows + 0.9), layout="constrained")
        axes = list(fig.subplots(nrows, ncols, squeeze=False, sharex=True, sharey=True).ravel())
    else:
        fig = Figure(figsize=(6.4, 5.0), layout="constrained")
        axes = [fig.subplots()] * len(methods)
    fig.suptitle(f"{title}\n{pooled}", fontsize="medium")

    def draw(ax, c, colour, label, **kw):
        mean, sd = _band(c["ys"])
        line = ax.plot(c["x"], mean, color=colour, label=label, **kw)[0]
        if sd is not None:
            ax.fill_between(c["x"], mean - sd, mean + sd, color=colour, alpha=0.2, linewidth=0)
        return line

    done: set[int] = set()
    for i, (ax, method) in enumerate(zip(axes, methods)):
        c = curves[method]
        colour = "C0" if many else f"C{i % 10}"
        first = id(ax) not in done
        if first:
            for x, y, kw, label in shared:
                ax.plot(x, y, color=_REF_GREY, label=label, **kw)
            if reference is not None:
                draw(ax, reference, _REF_GREY, reference["label"], linewidth=1.3)
            done.add(id(ax))
        for x, y, kw in c.get("refs", ()):
            ax.plot(x, y, color=_REF_GREY if many else colour, alpha=1.0 if many else 0.55,
                    **kw)
        summary = f" — {c['summary']}" if c.get("summary") else ""
        draw(ax, c, colour, f"{method}{summary}", linewidth=1.7,
             marker=c.get("marker"), markersize=3.5)
        if many:
            ax.set_title(method, fontsize="medium")
            ax.legend(loc=legend_loc, fontsize="x-small")
    for ax in axes[len(methods):] if many else []:
        ax.set_visible(False)
    for ax in {id(a): a for a in axes[:len(methods)]}.values():
        ax.set_xlim(*xlim)
        if ylim is not None:
            ax.set_ylim(*ylim)
        if not many:
            ax.set_xlabel(xlabel)
            ax.set_ylabel(ylabel)
            ax.legend(loc=legend_loc, fontsize="small")
    if many:  # labels on the outer panels (a figure legend may go under them)
        ncols = axes[0].get_gridspec().ncols
        for i, ax in enumerate(axes[:len(methods)]):
            if i + ncols >= len(methods):
                ax.set_xlabel(xlabel)
                ax.tick_params(labelbottom=True)
            if i % ncols == 0:
                ax.set_ylabel(ylabel)
    return fig


def _pooled_reliability(runs: Mapping[str, list], reference, n_bins: int = 15) -> Figure:
    def bins(preds):
        accs, confs, eces = [], [], []
        for p, y in preds:
            b = calibration_bins(p, y, n_bins)
            empty = b["count"].cpu().numpy() == 0  # NaN: not averaged, not drawn
            accs.append(np.where(empty, np.nan, b["accuracy"].cpu().numpy()))
            confs.append(np.where(empty, np.nan, b["confidence"].cpu().numpy()))
            eces.append(expected_calibration_error(p, y, n_bins))
        conf, _ = _band(np.stack(confs))
        return {"x": conf, "ys": np.stack(accs), "eces": eces}

    curves = {}
    for m, preds in runs.items():
        b = bins(preds)
        curves[m] = {**b, "summary": f"ECE {_pm(b['eces'])}", "marker": "o"}
    ref = None
    if reference is not None:
        name, preds = reference
        ref = {**bins(preds), "label": f"{name} (reference)"}
    diag = ([0, 1], [0, 1], {"linestyle": "--", "linewidth": 1.0}, "perfect calibration")
    lower = np.floor(10 * np.nanmin([np.nanmin(c["x"]) for c in curves.values()])) / 10
    return _pooled_figure(curves, reference=ref, xlabel="Confidence (bin mean)",
                          ylabel="Accuracy", title="Reliability (test set)", shared=[diag],
                          xlim=(lower, 1), ylim=(0, 1.01), legend_loc="upper left")


_GRID = np.linspace(0.0, 1.0, 201)


def _pooled_risk_coverage(runs: Mapping[str, list], reference) -> Figure:
    grid = _GRID[1:]

    def pool(preds):
        ys, errs = [], []
        for p, y in preds:
            cov, risk = risk_coverage_curve(p, y)
            ys.append(np.interp(grid, cov.cpu().numpy(), risk.cpu().numpy()))
            errs.append(float(risk[-1]))
        return {"x": grid, "ys": np.stack(ys), "errs": errs}

    curves = {}
    for m, preds in runs.items():
        c = pool(preds)
        err = float(np.mean(c["errs"]))
        refs = [(grid, np.maximum(grid - (1 - err), 0) / grid, _ORACLE),
                ([0, 1], [err, err], _RANDOM)]
        curves[m] = {**c, "refs": refs,
                     "summary": f"AURC {_pm([aurc(p, y) for p, y in preds], '.4f')}"}
    ref = None if reference is None else {**pool(reference[1]),
                                          "label": f"{reference[0]} (reference)"}
    fig = _pooled_figure(curves, reference=ref, xlabel="Coverage", ylabel="Selective risk",
                         title="Risk–coverage (test set)", legend_loc="upper left")
    for ax in fig.axes:
        ax.set_ylim(bottom=0)
    _style_key(fig, ["oracle ranking", "random ranking (error rate)"], [_ORACLE, _RANDOM])
    return fig


def _pooled_rejection(runs: Mapping[str, list], reference, score: str) -> Figure | None:
    grid = np.linspace(0.0, 0.95, 96)  # past 95 %, a handful of samples is left: noise

    def pool(preds, by):
        ys = []
        for p, y in preds:
            rej, acc = _rejection_curve(p, y, by)
            ys.append(np.interp(grid, rej, acc))
        return {"x": grid, "ys": np.stack(ys)}

    curves, left_out = {}, []
    for m, preds in runs.items():
        if OOD_DETECTORS[score].multi_pass and min(as_probs(p).shape[0] for p, _ in preds) < 2:
            left_out.append(m)
            continue
        c = pool(preds, score)
        acc = float(np.mean([_correct(p, y).mean() for p, y in preds]))
        refs = [(grid, np.minimum(1.0, acc / (1 - grid)), _ORACLE), ([0, 1], [acc, acc], _RANDOM)]
        curves[m] = {**c, "refs": refs, "summary": f"mean acc. {_pm(c['ys'].mean(1))}"}
    if not curves:
        return None
    ref = None
    if reference is not None:
        name, preds = reference
        by = score if not OOD_DETECTORS[score].multi_pass or min(
            as_probs(p).shape[0] for p, _ in preds) > 1 else "entropy"
        ref = {**pool(preds, by), "label": f"{name}, by {_REJECTION[by][0]} (reference)"}
    short = _REJECTION[score][0]
    title = f"Accuracy vs rejection by {short} (test set)"
    if left_out:
        title += f"\n(T = 1 pass, no {short}: {', '.join(left_out)})"
    fig = _pooled_figure(curves, reference=ref, xlabel=f"Fraction rejected (highest {short} "
                         "first)", ylabel="Accuracy of retained", title=title,
                         legend_loc="lower right")
    _style_key(fig, ["oracle rejection", "random rejection (accuracy)"], [_ORACLE, _RANDOM])
    return fig


def _pooled_roc(runs: Mapping[str, list], reference, det: str, ood_set: str) -> Figure:
    def pool(pairs):
        ys = []
        for s_in, s_out in pairs:
            fpr, tpr = _roc(s_in, s_out)
            ys.append(np.interp(_GRID, fpr, tpr))
        return {"x": _GRID, "ys": np.stack(ys)}

    curves = {m: {**pool(pairs),
                  "summary": f"AUROC {_pm([ood_auroc(a, b) for a, b in pairs], '.4f')}"}
              for m, pairs in runs.items()}
    ref = None if reference is None else {**pool(reference[1]),
                                          "label": f"{reference[0]} (reference)"}
    chance = ([0, 1], [0, 1], _RANDOM, "chance")
    return _pooled_figure(curves, reference=ref, xlabel="False positive rate (OOD taken for ID)",
                          ylabel="True positive rate (ID kept)",
                          title=f"ROC, ID test vs {ood_set}, score {_score_label(det)}",
                          shared=[chance], ylim=(0, 1.01), legend_loc="lower right")


def _style_key(fig: Figure, labels: list[str], styles: list[dict]) -> None:
    """A figure legend under the axes keying reference line styles (grey)."""
    handles = [Line2D([], [], color=_REF_GREY, **kw) for kw in styles]
    fig.legend(handles, labels, loc="outside lower center", ncols=len(labels),
               fontsize="small", frameon=False)


def plot_compare(
    runs: Mapping[str, Sequence[str | os.PathLike]],
    out_dir: str | os.PathLike,
    *,
    detectors: Sequence[str] = ("max_softmax", "entropy", "mutual_info"),
    reference: str | None = "softmax",
    root: str | os.PathLike | None = None,
) -> list[Path]:
    r"""Seed-pooled figures of a comparison: one figure per plot type, methods labelled.

    ``runs`` maps a method to its run folders, one per seed (each with ``predictions.pt``).
    Every curve is the mean over seeds on a common grid (curves interpolated linearly) with a
    band of :math:`\pm 1` sample standard deviation (ddof 1) across seeds; the legend gives the
    matching table number as mean ± s.d. With at most 4 methods they share one axes; with more,
    small multiples (one panel per method, shared axes). The ``reference`` method's curve
    (temperature-scaled when its runs fitted a temperature, ``+ TS`` in the label) is drawn in
    grey in every panel; references that hold for every method (the diagonal, chance) are
    drawn once per axes, a method's own (oracle, random) in grey in its panel. Written into
    ``out_dir``:

    * ``reliability.png`` -- per-bin accuracy against mean confidence (15 bins), ECE;
    * ``risk_coverage.png`` -- selective risk against coverage, AURC;
    * ``rejection_mutual_info.png`` / ``rejection_entropy.png`` -- accuracy of the retained
      predictions against the fraction rejected by MI / entropy (methods with ``T = 1`` pass
      are left out of the MI figure, named in its title; the grey reference falls back to
      entropy);
    * ``ood_<set>_<detector>_roc.png`` -- ROC curves (ID positive), AUROC;
    * ``ood_<set>_<detector>.png`` -- score histograms (:func:`ood_score_histogram` panels, one
      per method) of the scores of every seed pooled.

    :param runs: ``{method: [run folder per seed]}``.
    :param out_dir: output folder (created).
    :param detectors: OOD scores (:data:`gpattn_ppl.ood.SCORE_NAMES`).
    :param reference: the method drawn grey in every panel (``None`` or absent: none).
    :param root: the folder the user named, ``out_dir`` or above it (default ``out_dir``): the
        folders between it and the figures must be real folders, not links.
    :returns: the written paths, in the order above.
    """
    if not isinstance(runs, Mapping) or not runs or any(not list(v) for v in runs.values()):
        raise ValueError("runs must be a non-empty dict {method: [run folders]}")
    _check_detectors(detectors)
    loaded: dict[str, list[dict]] = {}
    ref_preds = None
    for method, dirs in runs.items():
        loaded[method] = [_load_predictions(Path(d)) for d in dirs]
        if method == reference:
            taus = [_fitted_temperature(Path(d)) for d in dirs]
            if all(t is not None for t in taus):
                ref_preds = (f"{method} + TS", [{k: _tempered(e, t) for k, e in p.items()}
                                                 for p, t in zip(loaded[method], taus)])
            else:
                ref_preds = (method, loaded[method])
    out = Path(out_dir)
    root = out if root is None else Path(root)
    test = {m: [(p["test"]["probs"], p["test"]["labels"]) for p in ps] for m, ps in loaded.items()}
    ref_test = None if ref_preds is None else (
        ref_preds[0], [(p["test"]["probs"], p["test"]["labels"]) for p in ref_preds[1]])
    written = [_save(_pooled_reliability(test, ref_test), out / "reliability.png", root),
               _save(_pooled_risk_coverage(test, ref_test), out / "risk_coverage.png",
                     root)]
    for score in ("mutual_info", "entropy"):
        fig = _pooled_rejection(test, ref_test, score)
        if fig is not None:
            written.append(_save(fig, out / f"rejection_{score}.png", root))
    ood_sets = list(dict.fromkeys(k for ps in loaded.values() for p in ps for k in p
                                  if k not in ("test", "val")))
    for ood_set in ood_sets:
        for det in detectors:
            pairs = {m: [s for s in (_scores(p, det, ood_set) for p in ps) if s is not None]
                     for m, ps in loaded.items()}
            pairs = {m: v for m, v in pairs.items() if v}
            if not pairs:
                continue
            ref = None
            if ref_preds is not None:
                ref_pairs = [s for s in (_scores(p, det, ood_set) for p in ref_preds[1])
                             if s is not None]
                ref = (ref_preds[0], ref_pairs) if ref_pairs else None
            stem = f"ood_{_file_part(ood_set)}_{det}"
            written.append(_save(_pooled_roc(pairs, ref, det, ood_set),
                                 out / f"{stem}_roc.png", root))
            panels = {f"{m} ({len(v)} seed{'s' if len(v) > 1 else ''})":
                      (torch.cat([a for a, _ in v]), {ood_set: torch.cat([b for _, b in v])})
                      for m, v in pairs.items()}
            fig = _ood_histogram_figure(
                panels, det, title=f"ID test vs OOD set {ood_set} — score {det}, seeds pooled")
            written.append(_save(fig, out / f"{stem}.png", root))
    return written


def _scores(preds: Mapping, det: str, ood_set: str):
    """``(id scores, ood scores)`` of detector ``det`` for one run's predictions, ``None`` when
    the run lacks ``ood_set`` or has one pass for a multi-pass detector."""
    if ood_set not in preds:
        return None
    t_in, t_out = as_probs(preds["test"]["probs"]), as_probs(preds[ood_set]["probs"])
    spec = OOD_DETECTORS[det]
    if spec.multi_pass and min(t_in.shape[0], t_out.shape[0]) < 2:
        return None
    templates = None
    if "templates" in spec.needs:
        if "val" not in preds:
            raise ValueError(f"{det} needs 'val' predictions")
        templates = kl_matching_templates(preds["val"]["probs"])
    return (ood_score(det, t_in, preds["test"].get("logits"), templates),
            ood_score(det, t_out, preds[ood_set].get("logits"), templates))


def _check_detectors(detectors) -> None:
    if isinstance(detectors, str):
        raise ValueError(f"detectors must be a sequence of names, got the string {detectors!r}")
    unknown = [d for d in detectors if d not in OOD_DETECTORS]
    if unknown:
        raise ValueError(f"unknown detector(s) {unknown}; allowed: {', '.join(OOD_DETECTORS)}")


def _fitted_temperature(run_dir: Path) -> float | None:
    """The temperature a run folder's evaluation fitted (``results.json``, checked against
    ``calibration.json`` by :meth:`~gpattn_ppl.run.runfolder.RunFolder.temperature`); ``None``
    for a folder that is not a run folder (only ``predictions.pt``) or fitted none."""
    if not (run_dir / "run.json").is_file():
        return None
    from .runfolder import open_run

    return open_run(run_dir).temperature()


def _run_names(dirs: list[Path], names) -> list[str]:
    if names is not None:
        if isinstance(names, str) or len(names) != len(dirs):
            raise ValueError(f"names must be a list of {len(dirs)} names, one per run, got "
                             f"{names!r}")
        out = [str(n) for n in names]
    else:
        out = [d.name for d in dirs]
        if len(set(out)) < len(out):  # e.g. softmax/seed0 and kernel/seed0
            out = ["/".join(d.parts[-2:]) for d in dirs]
    if len(set(out)) < len(out):
        raise ValueError(f"run names must be unique, got {out}; pass names=[...]")
    return out


def _load_predictions(run_dir: Path) -> dict:
    """``predictions.pt`` of a run folder, weights only and its layout checked
    (:func:`~gpattn_ppl.infer.checkpoint.load_predictions`), with a ``test`` entry."""
    from ..infer import load_predictions

    path = run_dir / "predictions.pt"
    if not path.is_file():
        raise FileNotFoundError(
            f"run folder {run_dir} has no predictions.pt; run `gpattn-ppl evaluate {run_dir}` "
            "first"
        )
    preds = load_predictions(path)
    if "test" not in preds:
        raise ValueError(f"{path} must hold a 'test' entry; rerun `gpattn-ppl evaluate`")
    return dict(preds)


def planned_plot_names(run_dirs: Sequence[str | Path],
                       detectors: Sequence[str] = ("max_softmax", "entropy", "mutual_info")
                       ) -> list[str]:
    """The file names :func:`plot_runs` may write for ``run_dirs`` (a superset: a figure with no
    run left is not written), so a run folder can list them before they exist."""
    names = ["reliability.png", "risk_coverage.png", "rejection.png"]
    for run_dir in run_dirs:
        for split in _load_predictions(Path(run_dir)):
            if split not in ("test", "val"):
                names += [f"ood_{_file_part(split)}_{det}.png" for det in detectors]
                names.append(f"ood_{_file_part(split)}_roc.png")
    return list(dict.fromkeys(names))


def _tempered(entry: Mapping, tau: float | None) -> dict:
    """Per-pass probabilities of ``softmax(logits / tau)`` (stored probabilities if no tau)."""
    if tau is None:
        return dict(entry)
    if entry.get("logits") is None:
        raise ValueError("temperature scaling needs the stored logits")
    logits = apply_temperature(torch.as_tensor(entry["logits"]).double(), tau)
    return {**entry, "logits": logits, "probs": torch.softmax(logits, -1)}


def _file_part(name: str) -> str:
    return re.sub(r"[^A-Za-z0-9_.-]+", "_", name)


#: what :func:`plot_runs` draws per run: the network's own predictive, the temperature-scaled
#: one, or both side by side
PREDICTIVES = ("raw", "ts", "both")


def plot_runs(
    run_dirs: Sequence[str | os.PathLike],
    out_dir: str | os.PathLike,
    *,
    names: Sequence[str] | None = None,
    detectors: Sequence[str] = ("max_softmax", "entropy", "mutual_info"),
    temperature: Mapping[str, float] | None = None,
    predictive: str = "raw",
    root: str | os.PathLike | None = None,
) -> list[Path]:
    r"""Evaluation figures of finished runs from their ``predictions.pt``.

    Each run folder holds ``predictions.pt`` (written by training or ``gpattn-ppl evaluate``):
    ``{"test": {"probs": [T, n, K], "logits": [T, n, K], "labels": [n]}, "val": {...},
    <ood set>: {...}}``. Written into ``out_dir``:

    * ``reliability.png`` -- :func:`reliability_diagram` of the test sets, one panel per run;
      its title says which predictive is drawn (raw, temperature-scaled, or both);
    * ``risk_coverage.png`` -- :func:`risk_coverage_plot` of every run's test set;
    * ``rejection.png`` -- :func:`rejection_curve_plot` of the test sets (accuracy against the
      fraction rejected by MI, entropy and MSP), one panel per run;
    * ``ood_<set>_<detector>.png`` per OOD set and detector -- :func:`ood_score_histogram`
      panels (test set vs that OOD set), one per run, in one figure. A run without that OOD set
      is left out, and so is a run with ``T = 1`` pass for ``mutual_info`` / ``pred_variance``
      (constant there) or any detector registered as needing ``"passes"``; a figure with no run
      left is not written. ``kl_matching`` (and any detector needing ``"templates"``) uses
      templates from the run's ``val`` predictions. The axis label is the one the detector was
      registered with (:func:`gpattn_ppl.ood.register_ood_detector`);
    * ``ood_<set>_roc.png`` per OOD set -- :func:`ood_roc_plot`, one panel per run, one ROC
      curve per detector (the same runs and detectors as the histograms).

    The temperature-scaled predictive of a run is
    :math:`\bar p_i = \frac1T\sum_t \mathrm{softmax}(\ell_{t,i}/\tau)` (for every split), labelled
    ``<name> + TS (τ = ...)``. ``predictive="ts"`` draws it instead of the raw one for every run
    whose evaluation fitted :math:`\tau` (``results.json``; a run without one is drawn raw and
    labelled ``(raw, no TS fitted)``), ``"both"`` draws the raw one (labelled ``(raw)``) and the
    tempered one side by side. ``temperature={name: tau}`` gives the temperature of a run
    explicitly (and draws it tempered also with ``predictive="raw"``).

    :param run_dirs: run folders.
    :param out_dir: output folder (created).
    :param names: display names, one per run (default: the folder names, or the last two path
        parts when two folders share a name, e.g. ``softmax/seed0`` and ``kernel/seed0``).
    :param detectors: names from :data:`gpattn_ppl.ood.SCORE_NAMES` (the registered detectors,
        yours included, :func:`gpattn_ppl.ood.register_ood_detector`).
    :param temperature: optional ``{name: tau}`` (e.g. from
        :func:`gpattn_ppl.metrics.fit_temperature` on the validation logits).
    :param predictive: ``"raw"``, ``"ts"`` or ``"both"`` (``PREDICTIVES``).
    :param root: the folder the user named, ``out_dir`` or above it (default ``out_dir``; a run
        folder for its ``plots/``): the folders between it and the figures must be real
        folders, not links.
    :returns: the written paths, in the order above (per OOD set: histograms, then ROC).
    :raises FileNotFoundError: a run folder without ``predictions.pt``.
    :raises ValueError: no runs, bad names, unknown detectors, temperature keys or predictive.
    """
    dirs = [Path(d) for d in run_dirs]
    if not dirs:
        raise ValueError("run_dirs is empty; pass at least one run folder")
    labels = _run_names(dirs, names)
    _check_detectors(detectors)
    if predictive not in PREDICTIVES:
        raise ValueError(f"predictive must be one of {PREDICTIVES}, got {predictive!r}")
    temperature = dict(temperature or {})
    stray = [k for k in temperature if k not in labels]
    if stray:
        raise ValueError(f"temperature has run name(s) {stray} that are not among {labels}")
    runs: dict[str, dict] = {}
    kinds = set()
    for name, run_dir in zip(labels, dirs):
        preds = _load_predictions(run_dir)
        tau = temperature.get(name)
        if tau is not None:
            apply_temperature(torch.zeros(1), tau)  # validates tau
        elif predictive != "raw":
            tau = _fitted_temperature(run_dir)
        if tau is None or predictive == "both":
            note = (" (raw)" if predictive == "both" and tau is not None else
                    " (raw, no TS fitted)" if predictive != "raw" else "")
            runs[name + note] = preds
            kinds.add("raw")
        if tau is not None:
            runs[f"{name} + TS (τ = {float(tau):.2f})"] = {
                split: _tempered(entry, tau) for split, entry in preds.items()}
            kinds.add("ts")
    which = {"raw": "raw predictive", "ts": "temperature-scaled predictive (+ TS)"}
    title = "Reliability (test set) — " + " and ".join(which[k] for k in sorted(kinds))
    out = Path(out_dir)
    root = out if root is None else Path(root)
    test = {name: (r["test"]["probs"], r["test"]["labels"]) for name, r in runs.items()}
    written = [_save(_reliability_figure(test, title=title), out / "reliability.png", root),
               _save(_risk_coverage_figure(test), out / "risk_coverage.png", root),
               _save(_rejection_figure(test, ("mutual_info", "entropy", "max_softmax")),
                     out / "rejection.png", root)]
    ood_sets = list(dict.fromkeys(k for r in runs.values() for k in r if k not in ("test", "val")))
    for ood_set in ood_sets:
        rocs: dict[str, dict] = {}
        for det in detectors:
            panels = {}
            for name, r in runs.items():
                try:
                    pair = _scores(r, det, ood_set)
                except ValueError as err:
                    raise ValueError(f"run {name!r}: {err}") from None
                if pair is not None:
                    panels[name] = (pair[0], {ood_set: pair[1]})
                    rocs.setdefault(name, {})[det] = pair
            if panels:
                fig = _ood_histogram_figure(
                    panels, det, title=f"ID test vs OOD set {ood_set} — score {det}")
                written.append(_save(fig, out / f"ood_{_file_part(ood_set)}_{det}.png",
                                     root))
        if rocs:
            fig = _roc_figure(rocs, title=f"ROC, ID test vs OOD set {ood_set}")
            written.append(_save(fig, out / f"ood_{_file_part(ood_set)}_roc.png", root))
    return written
