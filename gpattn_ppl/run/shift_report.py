"""Tables and plots of many runs under shift and OOD (CIFAR-10-C, the image OOD sets).

``runs`` maps a method to the ``results.json`` of its runs (one per seed), as in
:mod:`gpattn_ppl.run.compare`. Every cell is the mean ± sample std (ddof 1) over the runs of a
per-run summary:

* :func:`shift_rows` / :func:`format_shift_markdown`: the KEP-SVGP summary (each metric averaged
  over the 15 benchmark types x 5 severities, its Table 2) and CGPT's category means (over its
  18 types and the 5 severities, its Table II), from :func:`~gpattn_ppl.ood.shift_summary`;
  methods evaluated with temperature scaling add a ``+ TS`` row.
* :func:`ood_rows` / :func:`format_ood_markdown`: every OOD detector's AUROC, AUPR-in, AUPR-out
  and FPR95 averaged over the given OOD sets (CGPT's Table III), and each set's AUROC.
* :func:`severity_plots`: metric against severity (0 = the clean test set), one line per method.
* :func:`paired_rows` / :func:`format_paired_markdown`: each method against a reference
  (softmax, and softmax + TS) seed by seed, on the clean test set and the 15 x 5 mean: with
  three seeds, a difference that holds on every seed says more than two overlapping mean ± std.
"""

from __future__ import annotations

import fnmatch
import statistics
from pathlib import Path

from ..ood.shift import CGPT_CATEGORIES, shift_summary

__all__ = ["LOWER_IS_BETTER", "OOD_METRICS", "format_ood_markdown", "format_paired_markdown",
           "format_shift_markdown", "ood_rows", "paired_rows", "severity_plots", "shift_rows"]

#: detection metrics of the OOD table (keys of a detection report)
OOD_METRICS = ("auroc", "aupr_in", "aupr_out", "fpr95")

#: classification metrics where lower is better (for the others, higher is)
LOWER_IS_BETTER = frozenset({"nll", "ece", "mce", "brier", "aurc", "eaurc"})


def _stat(vals: list) -> tuple[float | None, float | None]:
    vals = [v for v in vals if v is not None]
    return (statistics.fmean(vals) if vals else None,
            statistics.stdev(vals) if len(vals) > 1 else None)


def _cell(ms: tuple, fmt: str = "{:.3f}") -> str:
    mean, std = ms
    if mean is None:
        return "–"
    return fmt.format(mean) + ("" if std is None else " ± " + fmt.format(std))


def _with_ts(runs: dict[str, list[dict]]) -> dict[str, list[dict]]:
    out = {}
    for method, results in runs.items():
        out[method] = results
        if results and all("ts" in r for r in results):
            out[f"{method} + TS"] = [{**r, **r["ts"]} for r in results]
    return out


def shift_rows(runs: dict[str, list[dict]]) -> list[dict]:
    """One row per method (and per ``+ TS`` row of a temperature-scaled method), a dict with

    * ``method``, ``runs``;
    * ``mean``: metric -> (mean, std) of the 15 x 5 mean;
    * ``categories``: CGPT category (and ``avg`` over its 18 types) -> metric -> (mean, std);
    * ``by_severity``: severity (0 = clean test) -> metric -> (mean, std);
    * ``missing``: the benchmark (name, severity) pairs some run lacks.
    """
    rows = []
    for method, results in _with_ts(runs).items():
        kep = [shift_summary(r) for r in results]
        cgpt = [shift_summary(r, categories=CGPT_CATEGORIES) for r in results]
        metrics = list(kep[0]["mean"])
        row = {"method": method, "runs": len(results),
               "mean": {m: _stat([k["mean"][m] for k in kep]) for m in metrics},
               "categories": {c: {m: _stat([g["categories"].get(c, {}).get(m) for g in cgpt])
                                  for m in metrics} for c in CGPT_CATEGORIES},
               "by_severity": {s: {m: _stat([k["by_severity"].get(s, {}).get(m) for k in kep])
                                   for m in metrics} for s in range(6)},
               "missing": sorted({p for k in kep for p in k["missing"]})}
        row["categories"]["avg"] = {m: _stat([g["mean"][m] for g in cgpt]) for m in metrics}
        rows.append(row)
    return rows


def format_shift_markdown(rows: list[dict]) -> str:
    """Two markdown tables: the 15 x 5 means (with the clean test accuracy) and CGPT's category
    means of accuracy, NLL and ECE."""
    lines = ["| method | runs | Acc clean | Acc | NLL | ECE | Brier | AURC |",
             "|---|---|---|---|---|---|---|---|"]
    for r in rows:
        m = r["mean"]
        lines.append(f"| {r['method']} | {r['runs']} | {_cell(r['by_severity'][0]['acc'])} | "
                     + " | ".join(_cell(m[k]) for k in ("acc", "nll", "ece", "brier", "aurc"))
                     + " |")
    cats = [*CGPT_CATEGORIES, "avg"]
    lines += ["", "| method | metric | " + " | ".join(cats) + " |",
              "|---|---|" + "---|" * len(cats)]
    for r in rows:
        for metric in ("acc", "nll", "ece"):
            lines.append(f"| {r['method']} | {metric} | "
                         + " | ".join(_cell(r["categories"][c][metric]) for c in cats) + " |")
    missing = sorted({p for r in rows for p in r["missing"]})
    if missing:
        lines += ["", "Missing sets (not in every run): "
                  + ", ".join(f"{n}:{s}" for n, s in missing)]
    return "\n".join(lines)


def _matching(results: dict, spec: str) -> list[str]:
    """The OOD sets of one run that ``spec`` names: itself, or every match of a pattern with
    ``*`` (e.g. ``cifar10c:*:5``)."""
    names = list(results.get("ood") or {})
    return [n for n in names if fnmatch.fnmatchcase(n, spec)] if "*" in spec else (
        [spec] if spec in names else [])


def ood_rows(runs: dict[str, list[dict]], sets: list[str]) -> list[dict]:
    """One row per method and detector (a detector present in every run and set), a dict with
    ``method``, ``detector``, ``runs``, each of :data:`OOD_METRICS` -> (mean, std) over runs of
    its mean over ``sets``, and ``per_set``: set -> AUROC (mean, std). A set given as a pattern
    with ``*`` (``cifar10c:*:5``) counts as one set whose value is the mean over its matches.

    :raises ValueError: a run without one of ``sets`` (or no match of a pattern).
    """
    rows = []
    for method, results in runs.items():
        detectors = None
        for r in results:
            for spec in sets:
                keys = _matching(r, spec)
                if not keys:
                    raise ValueError(f"{method}: a run has no OOD set {spec!r}")
                for k in keys:
                    names = set(r["ood"][k]["detection"])
                    detectors = names if detectors is None else detectors & names

        def value(r, spec, det, metric):
            return statistics.fmean(r["ood"][k]["detection"][det][metric]
                                    for k in _matching(r, spec))
        for det in sorted(detectors or ()):
            row = {"method": method, "detector": det, "runs": len(results)}
            for metric in OOD_METRICS:
                row[metric] = _stat([statistics.fmean(value(r, s, det, metric) for s in sets)
                                     for r in results])
            row["per_set"] = {s: _stat([value(r, s, det, "auroc") for r in results])
                              for s in sets}
            rows.append(row)
    return rows


def format_ood_markdown(rows: list[dict]) -> str:
    """A markdown table: method, detector, the four metrics averaged over the sets, then each
    set's AUROC."""
    if not rows:
        return "(no OOD detection results)"
    sets = list(rows[0]["per_set"])
    lines = ["| method | detector | AUROC | AUPR-in | AUPR-out | FPR95 | "
             + " | ".join(f"AUROC {s}" for s in sets) + " |",
             "|---|---|---|---|---|---|" + "---|" * len(sets)]
    for r in rows:
        lines.append(f"| {r['method']} | {r['detector']} | "
                     + " | ".join(_cell(r[m]) for m in OOD_METRICS) + " | "
                     + " | ".join(_cell(r["per_set"][s]) for s in sets) + " |")
    return "\n".join(lines)


def severity_plots(rows: list[dict], out_dir: str | Path,
                   metrics=("acc", "nll", "ece")) -> list[Path]:
    """``<metric>_vs_severity.png`` under ``out_dir`` for each metric: the mean over runs of
    the 15-type mean per severity (0 = clean), one line per row of :func:`shift_rows`."""
    from .plotting import metric_vs_severity_plot

    out = []
    for metric in metrics:
        table = {r["method"]: {s: v[metric][0] for s, v in r["by_severity"].items()
                               if v[metric][0] is not None} for r in rows}
        out.append(metric_vs_severity_plot(table, metric,
                                           Path(out_dir) / f"{metric}_vs_severity.png"))
    return out


def paired_rows(runs: dict[str, list[dict]], reference: str = "softmax",
                metrics=("acc", "nll", "ece")) -> list[dict]:
    """Each method's run i against the reference's run i (the same seed: evidence and compare
    list every method's runs in seed order), per metric on the clean test set and on the
    15 x 5 CIFAR-10-C mean: ``d_i = metric(method, seed i) - metric(reference, seed i)``.

    One row per method and reference (``reference``, and ``reference + TS`` when every run of
    it was temperature scaled), a dict with ``method``, ``reference``, ``runs`` and ``diffs``:
    ``("clean" | "shift", metric) -> [d_i]``. The methods are compared as they are (their own
    ``+ TS`` rows are in :func:`shift_rows`). Deep ensembles are skipped (a block of seeds pairs
    with no single reference run), as is a method whose number of runs is not the reference's.

    :raises ValueError: ``reference`` not in ``runs``.
    """
    if reference not in runs:
        raise ValueError(f"paired_rows: no runs of the reference {reference!r} "
                         f"(methods: {', '.join(runs) or 'none'})")
    refs = _with_ts({reference: runs[reference]})

    def values(r: dict) -> dict:
        kep = shift_summary(r)["mean"]
        return {**{("clean", m): (r.get("test") or {}).get(m) for m in metrics},
                **{("shift", m): kep.get(m) for m in metrics}}

    ref_values = {name: [values(r) for r in res] for name, res in refs.items()}
    rows = []
    for method, results in runs.items():
        if (method == reference or method.startswith("deep ensemble")
                or len(results) != len(runs[reference])):
            continue
        mine = [values(r) for r in results]
        for name, ref in ref_values.items():
            rows.append({"method": method, "reference": name, "runs": len(results),
                         "diffs": {k: [a[k] - b[k] for a, b in zip(mine, ref)]
                                   for k in mine[0]
                                   if all(a[k] is not None and b[k] is not None
                                          for a, b in zip(mine, ref))}})
    return rows


def format_paired_markdown(rows: list[dict], metrics=("acc", "nll", "ece")) -> str:
    """A markdown table: per method and reference, each paired difference as ``mean [min, max]
    k/n``, k = the seeds on which the method is better (higher accuracy, lower NLL / ECE)."""
    if not rows:
        return "(no paired comparison: no method has as many runs as the reference)"
    keys = [(where, m) for where in ("clean", "shift") for m in metrics]
    names = {"clean": "clean", "shift": "C10-C"}
    lines = ["| method | against | " + " | ".join(f"Δ{m.upper() if m != 'acc' else 'Acc'} "
                                                 f"{names[w]}" for w, m in keys) + " |",
             "|---|---|" + "---|" * len(keys)]
    for r in rows:
        cells = []
        for where, m in keys:
            d = r["diffs"].get((where, m))
            if not d:
                cells.append("–")
                continue
            wins = sum((x < 0) if m in LOWER_IS_BETTER else (x > 0) for x in d)
            cells.append(f"{statistics.fmean(d):+.3f} [{min(d):+.3f}, {max(d):+.3f}] "
                         f"{wins}/{len(d)}")
        lines.append(f"| {r['method']} | {r['reference']} | " + " | ".join(cells) + " |")
    return "\n".join(lines)
