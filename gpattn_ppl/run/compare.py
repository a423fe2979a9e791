"""Multi-seed comparison of configurations: the mean ± std results table (Markdown and CSV)."""

from __future__ import annotations

import csv
import json
import statistics
import warnings
from pathlib import Path

import torch

__all__ = ["TABLE_COLUMNS", "BEST_DETECTOR", "significantly_better", "run_compare", "summarise",
           "format_markdown", "write_table", "ensemble_results", "block_ensembles"]

#: title of the computed column: the OOD AUROC of the detector with the best mean over a
#: method's runs (first OOD set), named in the cell
BEST_DETECTOR = "OOD AUROC (best)"

#: (column title, path into results.json, number format); the path ``None`` marks the computed
#: column :data:`BEST_DETECTOR`
TABLE_COLUMNS: list[tuple[str, tuple, str]] = [
    ("MCC ID", ("test", "mcc"), "{:.3f}"),
    ("MCC OOD", ("ood", "*", "classification", "mcc"), "{:.3f}"),
    ("Acc ID", ("test", "acc"), "{:.3f}"),
    ("NLL", ("test", "nll"), "{:.3f}"),
    ("ECE", ("test", "ece"), "{:.3f}"),
    ("MCE", ("test", "mce"), "{:.3f}"),
    ("Brier", ("test", "brier"), "{:.3f}"),
    ("AURC", ("test", "aurc"), "{:.3f}"),
    ("MI", ("test", "mutual_info"), "{:.1e}"),
    ("OOD AUROC (MSP)", ("ood", "*", "detection", "max_softmax", "auroc"), "{:.3f}"),
    (BEST_DETECTOR, None, "{:.3f}"),
    ("s/epoch", ("cost", "sec_per_epoch"), "{:.2f}"),
    ("peak MB", ("cost", "peak_mem_mb"), "{:.0f}"),
    ("params", ("cost", "params"), "{:.0f}"),
]


def _node(results: dict, path: tuple):
    """The entry at ``path`` (``"*"``: the first OOD set), or ``None``."""
    node = results
    for key in path:
        if not isinstance(node, dict) or not node:
            return None
        node = next(iter(node.values())) if key == "*" else node.get(key)
    return node


def _get(results: dict, path: tuple):
    node = _node(results, path)
    return node if isinstance(node, (int, float)) and not isinstance(node, bool) else None


def summarise(runs: dict[str, list[dict]]) -> list[dict]:
    """Per method: mean and sample std (ddof 1) of every table column over its runs.

    Runs evaluated with temperature scaling (``eval.temperature_scaling``) add a row
    ``"<method> + TS"`` right after their method's row, computed from their ``"ts"`` results
    (same runs, tempered predictive; the cost columns are the method's own).

    Each row maps every column title to ``(mean, std)``; ``"values"`` holds the per-run values
    (for significance tests) and ``"best detector"`` names the detector of
    :data:`BEST_DETECTOR`.
    """
    with_ts: dict[str, list[dict]] = {}
    for method, results in runs.items():
        with_ts[method] = results
        if results and all("ts" in r for r in results):
            with_ts[f"{method} + TS"] = [{**r, **r["ts"]} for r in results]
    rows = []
    for method, results in with_ts.items():
        row = {"method": method, "runs": len(results)}
        row["values"] = {}
        for title, path, _ in TABLE_COLUMNS:
            if path is not None:
                vals = [v for v in (_get(r, path) for r in results) if v is not None]
                row[title], row["values"][title] = _mean_std(vals), vals
        (row[BEST_DETECTOR], row["best detector"],
         row["values"][BEST_DETECTOR]) = _best_detector(results)
        rows.append(row)
    return rows


def _mean_std(vals: list[float]) -> tuple[float | None, float | None]:
    return (statistics.fmean(vals) if vals else None,
            statistics.stdev(vals) if len(vals) > 1 else None)


def _best_detector(results: list[dict]) -> tuple[tuple, str | None, list[float]]:
    """The OOD detector with the highest mean AUROC over the runs (first OOD set): its
    (mean, std), name and per-run values; detectors missing from any run are not candidates."""
    per: dict[str, list[float]] = {}
    for r in results:
        detection = _node(r, ("ood", "*", "detection"))
        for name, det in (detection if isinstance(detection, dict) else {}).items():
            if isinstance(det, dict) and isinstance(det.get("auroc"), (int, float)):
                per.setdefault(name, []).append(det["auroc"])
    per = {k: v for k, v in per.items() if len(v) == len(results)}
    if not per:
        return (None, None), None, []
    best = max(per, key=lambda k: statistics.fmean(per[k]))
    return _mean_std(per[best]), best, per[best]


#: table columns where a larger value is better (the others with a direction: smaller is better)
HIGHER_IS_BETTER = ("MCC ID", "MCC OOD", "Acc ID", "OOD AUROC (MSP)", BEST_DETECTOR)
LOWER_IS_BETTER = ("NLL", "ECE", "MCE", "Brier", "AURC")


def significantly_better(values: list[float], reference: list[float], title: str,
                         level: float = 0.05) -> bool:
    """Whether ``values`` (one per seed) are better than ``reference`` in column ``title`` by
    Welch's one-sided t-test at ``level`` (unequal variances; needs two runs on each side)."""
    if title not in HIGHER_IS_BETTER + LOWER_IS_BETTER or len(values) < 2 or len(reference) < 2:
        return False
    from scipy.stats import ttest_ind

    side = "greater" if title in HIGHER_IS_BETTER else "less"
    if statistics.pvariance(values) == 0 and statistics.pvariance(reference) == 0:
        diff = statistics.fmean(values) - statistics.fmean(reference)
        return diff > 0 if side == "greater" else diff < 0
    with warnings.catch_warnings():   # scipy warns when one side's runs are (nearly) equal
        warnings.simplefilter("ignore", RuntimeWarning)
        p = ttest_ind(values, reference, equal_var=False, alternative=side).pvalue
    return bool(p < level)


def format_markdown(rows: list[dict], reference: str | None = "softmax + TS") -> str:
    """A Markdown table ``mean ± std`` (std omitted for single runs).

    :param reference: a row's method name (default ``"softmax + TS"``, the strongest simple
        baseline; ignored when no row has it): cells of other rows that are significantly better
        than it (:func:`significantly_better`) are set in bold.
    """
    titles = [t for t, _, _ in TABLE_COLUMNS if any(r[t][0] is not None for r in rows)]
    fmt = {t: f for t, _, f in TABLE_COLUMNS}
    ref = next((r for r in rows if r["method"] == reference), None)
    lines = ["| method | runs | " + " | ".join(titles) + " |",
             "|---|---|" + "---|" * len(titles)]
    for r in rows:
        cells = []
        for t in titles:
            mean, std = r[t]
            if mean is None:
                cells.append("–")
                continue
            cell = fmt[t].format(mean) + ("" if std is None else " ± " + fmt[t].format(std))
            if t == BEST_DETECTOR and r.get("best detector"):
                cell += f" ({r['best detector']})"
            if ref is not None and r is not ref and significantly_better(
                    r["values"].get(t, []), ref["values"].get(t, []), t):
                cell = f"**{cell}**"
            cells.append(cell)
        lines.append(f"| {r['method']} | {r['runs']} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def write_table(rows: list[dict], out_dir: str | Path) -> tuple[Path, Path]:
    """Write ``results.md`` and ``results.csv`` (mean and std columns) into ``out_dir``."""
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    md = out_dir / "results.md"
    md.write_text(format_markdown(rows) + "\n")
    path = out_dir / "results.csv"
    with open(path, "w", newline="") as fh:
        w = csv.writer(fh)
        titles = [t for t, _, _ in TABLE_COLUMNS]
        w.writerow(["method", "runs"] + [f"{t} {s}" for t in titles for s in ("mean", "std")]
                   + ["best detector"])
        for r in rows:
            w.writerow([r["method"], r["runs"]] + [v for t in titles for v in r[t]]
                       + [r.get("best detector")])
    return md, path


def ensemble_results(run_dirs: list[Path], cfg: dict) -> dict:
    """Metrics of the deep ensemble of ``run_dirs``: their per-pass probabilities pooled (the
    ensemble's predictive is the average over members and their MC passes)."""
    from ..metrics import classification_report
    from ..ood import ood_report

    preds = [torch.load(Path(d) / "predictions.pt", weights_only=False) for d in run_dirs]
    metrics = cfg["eval"]["metrics"]

    def pool(name):
        return (torch.cat([p[name]["probs"] for p in preds], 0),
                torch.cat([p[name]["logits"] for p in preds], 0), preds[0][name]["labels"])

    tp, tl, ty = pool("test")
    out = {"test": classification_report(tp, ty, logits=tl, metrics=metrics), "ood": {}}
    for name in preds[0]:
        if name in ("test", "val"):
            continue
        op, ol, oy = pool(name)
        labelled = bool((oy >= 0).all())          # unlabelled OOD sets: detection only
        out["ood"][name] = {"classification": (classification_report(op, oy, logits=ol,
                                                                     metrics=metrics)
                                               if labelled else None),
                            "detection": ood_report(tp, tl, op, ol,
                                                    detectors=["max_softmax", "entropy"])}
    return out


def block_ensembles(run_dirs: list[Path], members: list[dict], cfg: dict, k: int) -> list[dict]:
    """Deep ensembles of ``k`` members, one per disjoint block of consecutive runs
    (:func:`ensemble_results`); each one's cost is its members' summed seconds per epoch and
    parameters.

    :param members: the ``results.json`` of each of ``run_dirs``, in the same order.
    """
    groups = []
    for g in range(len(run_dirs) // k):
        block = slice(g * k, (g + 1) * k)
        ens = ensemble_results(run_dirs[block], cfg)
        ens["cost"] = {"params": members[0]["cost"]["params"] * k,
                       "sec_per_epoch": sum(r["cost"]["sec_per_epoch"] for r in members[block])}
        groups.append(ens)
    return groups


def run_compare(configs: list[str | Path | dict], seeds: list[int], out_dir: str | Path, *,
                overrides: list[str] | None = None, ensemble: int = 0,
                names: list[str] | None = None, bundle_cache: bool = True,
                progress: bool = True, force: bool = False, plots: bool = False
                ) -> list[dict]:
    """Train every config with every seed into ``out_dir/<method>/seed<k>`` and tabulate.

    Each run folder is checked as ``train`` checks it
    (:func:`~gpattn_ppl.run.rundir.check_run_folder`): a run with the same config is reused when
    finished (``results.json`` present) and resumed when interrupted; a run with a different
    config is refused, naming the keys, unless ``force`` (then it is trained afresh).

    :param ensemble: also report deep ensembles of ``ensemble`` members per method: one per
        disjoint block of consecutive seeds (seeds 0-8 with ``ensemble=3`` give three ensembles,
        tabulated as mean ± std; fewer than ``2 * ensemble`` seeds give one). Their cost is the
        members' summed seconds per epoch and parameters.
    :param force: retrain run folders that hold a different config instead of refusing.
    :param plots: also draw the plots of the first seed of every method into ``out_dir/plots``
        (:func:`~gpattn_ppl.run.plotting.plot_runs`).
    :returns: the summary rows (also written as ``results.md`` / ``results.csv``).
    """
    from .config import load_config
    from .experiment import Trainer, load_bundle
    from .rundir import check_run_folder

    out_dir = Path(out_dir)
    runs: dict[str, list[dict]] = {}
    runs_dirs: dict[str, list[Path]] = {}
    bundles: dict[str, object] = {}
    for i, config in enumerate(configs):
        method = names[i] if names else (Path(config).stem if not isinstance(config, dict)
                                         else f"config{i}")
        runs[method] = []
        dirs = runs_dirs[method] = []
        for seed in seeds:
            run_dir = out_dir / method / f"seed{seed}"
            dirs.append(run_dir)
            ov = list(overrides or []) + [f"train.seed={seed}", f"train.progress={progress}"]
            cfg = load_config(config, ov)
            action = check_run_folder(run_dir, cfg, resume=not force, force=force)
            if action == "resume" and (run_dir / "results.json").exists():
                runs[method].append(json.loads((run_dir / "results.json").read_text()))
                continue
            key = json.dumps(cfg["data"], sort_keys=True)
            if key not in bundles or not bundle_cache:
                bundles = {key: load_bundle(cfg)}  # keep one bundle in memory at a time
            res = Trainer(cfg, run_dir, bundle=bundles[key], resume=action == "resume",
                          force=action == "fresh", label=f"{method}/seed{seed}").fit()
            runs[method].append(res)
        if ensemble and len(dirs) >= ensemble:
            runs[f"{method} (ensemble of {ensemble})"] = block_ensembles(
                dirs, runs[method], cfg, ensemble)  # the seeds share the eval section
    rows = summarise(runs)
    write_table(rows, out_dir)
    if plots:
        from .plotting import plot_runs

        methods = list(runs_dirs)
        plot_runs([runs_dirs[m][0] for m in methods], out_dir / "plots", names=methods)
    return rows
