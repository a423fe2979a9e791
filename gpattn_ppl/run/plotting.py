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
    "planned_plot_names",
    "plot_runs",
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


def _save(fig: Figure, path: str | os.PathLike) -> Path:
    out = Path(path)
    out.parent.mkdir(parents=True, exist_ok=True)
    FigureCanvasAgg(fig)
    fig.savefig(out, format="png", dpi=120)
    return out


def _zoom_lower(bins: dict, num_classes: int) -> float:
    """Lower x-limit: the lower edge of the lowest non-empty bin, at most the lower edge of the
    bin holding the chance level ``1/K`` (top-label confidences are ``>= 1/K``)."""
    edges, count = bins["edges"], bins["count"]
    chance = float(edges[bin_index(torch.tensor([1.0 / num_classes], dtype=torch.float64),
                                    len(count))])
    lowest = float(edges[int(torch.nonzero(count > 0)[0])])
    return min(lowest, chance)


def _reliability_figure(results, n_bins: int = 15, overlay: bool = False) -> Figure:
    """Figure whose axes are ``[reliability, counts]`` per panel (one panel if ``overlay``)."""
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
    return fig


def reliability_diagram(
    results, path: str | os.PathLike, n_bins: int = 15, overlay: bool = False
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
    :returns: the written path.

    >>> import torch, tempfile, os
    >>> p = torch.tensor([[0.9, 0.1], [0.3, 0.7]])
    >>> out = reliability_diagram({"msp": (p, torch.tensor([0, 0]))},
    ...                           os.path.join(tempfile.mkdtemp(), "rel.png"))
    >>> out.suffix
    '.png'
    """
    return _save(_reliability_figure(results, n_bins, overlay), path)


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


def _draw_ood_hist(ax, id_scores, ood_scores, bins: int = 40) -> None:
    """Overlaid density histograms on shared bins; AUROC (ID positive) per OOD set."""
    if not isinstance(ood_scores, Mapping) or len(ood_scores) == 0:
        raise ValueError("ood_scores must be a non-empty dict {ood set: scores [n_out]}")
    s_in = as_scores(id_scores, "id_scores").cpu()
    s_out = {str(k): as_scores(v, f"ood_scores[{k!r}]").cpu() for k, v in ood_scores.items()}
    every = torch.cat([s_in, *s_out.values()])
    lo, hi = float(every.min()), float(every.max())
    if hi - lo < 1e-12:
        lo, hi = lo - 0.5, hi + 0.5
    edges = np.linspace(lo, hi, bins + 1)
    handles, labels = [], []
    sets = [(f"ID (n = {s_in.numel()})", s_in, "tab:blue")]
    for j, (name, s) in enumerate(s_out.items()):
        label = f"{name} (n = {s.numel()}) — AUROC {ood_auroc(s_in, s):.4f}"
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
    ax.legend(handles, labels, loc="upper left", fontsize="small")


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
        _draw_ood_hist(ax, id_scores, ood_scores)
        ax.set_xlabel(_score_label(score_name) + " (higher = more ID)")
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
    names = ["reliability.png", "risk_coverage.png"]
    for run_dir in run_dirs:
        for split in _load_predictions(Path(run_dir)):
            if split not in ("test", "val"):
                names += [f"ood_{_file_part(split)}_{det}.png" for det in detectors]
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


def plot_runs(
    run_dirs: Sequence[str | os.PathLike],
    out_dir: str | os.PathLike,
    *,
    names: Sequence[str] | None = None,
    detectors: Sequence[str] = ("max_softmax", "entropy", "mutual_info"),
    temperature: Mapping[str, float] | None = None,
) -> list[Path]:
    r"""Evaluation figures of finished runs from their ``predictions.pt``.

    Each run folder holds ``predictions.pt`` (written by training or ``gpattn-ppl evaluate``):
    ``{"test": {"probs": [T, n, K], "logits": [T, n, K], "labels": [n]}, "val": {...},
    <ood set>: {...}}``. Written into ``out_dir``:

    * ``reliability.png`` -- :func:`reliability_diagram` of the test sets, one panel per run;
    * ``risk_coverage.png`` -- :func:`risk_coverage_plot` of every run's test set;
    * ``ood_<set>_<detector>.png`` per OOD set and detector -- :func:`ood_score_histogram`
      panels (test set vs that OOD set), one per run, in one figure. A run without that OOD set
      is left out, and so is a run with ``T = 1`` pass for ``mutual_info`` / ``pred_variance``
      (constant there) or any detector registered as needing ``"passes"``; a figure with no run
      left is not written. ``kl_matching`` (and any detector needing ``"templates"``) uses
      templates from the run's ``val`` predictions. The axis label is the one the detector was
      registered with (:func:`gpattn_ppl.ood.register_ood_detector`).

    With ``temperature={name: tau}`` the run's predictive is the tempered one,
    :math:`\bar p_i = \frac1T\sum_t \mathrm{softmax}(\ell_{t,i}/\tau)` (for every split), and
    its label gets ``(τ = ...)``; runs not in the dict are left as they are.

    :param run_dirs: run folders.
    :param out_dir: output folder (created).
    :param names: display names, one per run (default: the folder names, or the last two path
        parts when two folders share a name, e.g. ``softmax/seed0`` and ``kernel/seed0``).
    :param detectors: names from :data:`gpattn_ppl.ood.SCORE_NAMES` (the registered detectors,
        yours included, :func:`gpattn_ppl.ood.register_ood_detector`).
    :param temperature: optional ``{name: tau}`` (e.g. from
        :func:`gpattn_ppl.metrics.fit_temperature` on the validation logits).
    :returns: the written paths, in the order above.
    :raises FileNotFoundError: a run folder without ``predictions.pt``.
    :raises ValueError: no runs, bad names, unknown detectors or temperature keys.
    """
    dirs = [Path(d) for d in run_dirs]
    if not dirs:
        raise ValueError("run_dirs is empty; pass at least one run folder")
    labels = _run_names(dirs, names)
    if isinstance(detectors, str):
        raise ValueError(f"detectors must be a sequence of names, got the string {detectors!r}")
    unknown = [d for d in detectors if d not in OOD_DETECTORS]
    if unknown:
        raise ValueError(f"unknown detector(s) {unknown}; allowed: {', '.join(OOD_DETECTORS)}")
    temperature = dict(temperature or {})
    stray = [k for k in temperature if k not in labels]
    if stray:
        raise ValueError(f"temperature has run name(s) {stray} that are not among {labels}")
    runs: dict[str, dict] = {}
    for name, run_dir in zip(labels, dirs):
        preds = _load_predictions(run_dir)
        tau = temperature.get(name)
        if tau is not None:
            apply_temperature(torch.zeros(1), tau)  # validates tau
            name = f"{name} (τ = {float(tau):.2f})"
        runs[name] = {split: _tempered(entry, tau) for split, entry in preds.items()}
    out = Path(out_dir)
    test = {name: (r["test"]["probs"], r["test"]["labels"]) for name, r in runs.items()}
    written = [reliability_diagram(test, out / "reliability.png"),
               risk_coverage_plot(test, out / "risk_coverage.png")]
    ood_sets = list(dict.fromkeys(k for r in runs.values() for k in r if k not in ("test", "val")))
    for ood_set in ood_sets:
        for det in detectors:
            panels = {}
            for name, r in runs.items():
                if ood_set not in r:
                    continue
                t_in, t_out = as_probs(r["test"]["probs"]), as_probs(r[ood_set]["probs"])
                spec = OOD_DETECTORS[det]
                if spec.multi_pass and min(t_in.shape[0], t_out.shape[0]) < 2:
                    continue
                templates = None
                if "templates" in spec.needs:
                    if "val" not in r:
                        raise ValueError(f"run {name!r}: {det} needs 'val' predictions")
                    templates = kl_matching_templates(r["val"]["probs"])
                s_in = ood_score(det, t_in, r["test"].get("logits"), templates)
                s_out = ood_score(det, t_out, r[ood_set].get("logits"), templates)
                panels[name] = (s_in, {ood_set: s_out})
            if panels:
                fig = _ood_histogram_figure(
                    panels, det, title=f"ID test vs OOD set {ood_set} — score {det}")
                written.append(_save(fig, out / f"ood_{_file_part(ood_set)}_{det}.png"))
    return written
