"""Multi-seed comparison of configurations: the mean ± std results table (Markdown and CSV).

A comparison checks everything before it writes anything (:func:`plan_compare`), then trains
(:func:`execute_plan`); its ``--out`` folder gets a manifest, ``compare.json``
(:data:`COMPARE_MANIFEST`), listing what it wrote, so that a rerun may overwrite its own tables
and figures but never a user's file of the same name.
"""

from __future__ import annotations

import csv
import json
import statistics
import warnings
from dataclasses import dataclass, field
from pathlib import Path

import torch

__all__ = ["TABLE_COLUMNS", "BEST_DETECTOR", "COMPARE_MANIFEST", "significantly_better",
           "run_compare", "plan_compare", "execute_plan", "ComparePlan", "PlannedRun",
           "summarise", "with_posthoc_rows", "format_markdown", "write_table", "ensemble_results", "block_ensembles"]

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


def with_posthoc_rows(runs: dict[str, list[dict]]) -> dict[str, list[dict]]:
    """Each method's runs, followed by ``"<method> + TS"`` and ``"<method> + LLA"`` where every
    run has ``"ts"`` / ``"laplace"`` results (each run's dict with those results laid over it)."""
    out: dict[str, list[dict]] = {}
    for method, results in runs.items():
        out[method] = results
        for key, name in (("ts", "TS"), ("laplace", "LLA")):
            if results and all(key in r for r in results):
                out[f"{method} + {name}"] = [{**r, **r[key]} for r in results]
    return out


def summarise(runs: dict[str, list[dict]]) -> list[dict]:
    """Per method: mean and sample std (ddof 1) of every table column over its runs.

    Runs evaluated with temperature scaling (``eval.temperature_scaling``) add a row
    ``"<method> + TS"`` right after their method's row, computed from their ``"ts"`` results
    (same runs, tempered predictive; the cost columns are the method's own); runs evaluated
    with last-layer Laplace (``eval.laplace``) add a row ``"<method> + LLA"`` after those, from
    their ``"laplace"`` results, in the same way.

    Each row maps every column title to ``(mean, std)``; ``"values"`` holds the per-run values
    (for significance tests) and ``"best detector"`` names the detector of
    :data:`BEST_DETECTOR`.
    """
    rows = []
    for method, results in with_posthoc_rows(runs).items():
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
    import io

    from ..safe_files import write_atomic

    out_dir = Path(out_dir)
    md = write_atomic(out_dir / "results.md", format_markdown(rows) + "\n")
    fh = io.StringIO(newline="")
    w = csv.writer(fh)
    titles = [t for t, _, _ in TABLE_COLUMNS]
    w.writerow(["method", "runs"] + [f"{t} {s}" for t in titles for s in ("mean", "std")]
               + ["best detector"])
    for r in rows:
        w.writerow([r["method"], r["runs"]] + [v for t in titles for v in r[t]]
                   + [r.get("best detector")])
    return md, write_atomic(out_dir / "results.csv", fh.getvalue())


def ensemble_results(run_dirs: list[Path], cfg: dict) -> dict:
    """Metrics of the deep ensemble of ``run_dirs``: their per-pass probabilities pooled (the
    ensemble's predictive is the average over members and their MC passes)."""
    from ..infer.checkpoint import load_predictions
    from ..metrics import classification_report
    from ..ood import ood_report

    preds = [load_predictions(Path(d) / "predictions.pt") for d in run_dirs]
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


#: the manifest ``compare`` (and ``demo``) writes into its ``--out`` folder: the methods, seeds,
#: run folders and output files it wrote. Output files no manifest lists are never overwritten
#: without ``force``.
COMPARE_MANIFEST = "compare.json"

#: the tables a comparison writes into its ``--out`` folder
_TABLES = ("results.md", "results.csv")
#: names a method may not have: they are the comparison's own outputs or caches
_RESERVED = {"plots", "features", COMPARE_MANIFEST, *_TABLES}


def _is_figure(name: str) -> bool:
    """Whether ``name`` is a file name :func:`~gpattn_ppl.run.plotting.plot_compare` (or
    :func:`~gpattn_ppl.run.plotting.plot_runs`) writes."""
    return name in ("reliability.png", "risk_coverage.png") or (
        name.startswith(("ood_", "rejection")) and name.endswith(".png"))


@dataclass
class PlannedRun:
    """One run of a comparison: its validated config, folder and what training does there."""

    method: str
    seed: int
    cfg: dict
    run_dir: Path
    #: ``"new"``, ``"resume"`` or ``"fresh"`` (:func:`~gpattn_ppl.run.rundir.check_run_folder`)
    action: str
    #: ``results.json`` of a finished run that is reused (not trained again)
    results: dict | None = None


@dataclass
class ComparePlan:
    """Everything a comparison will do, checked before anything is written
    (:func:`plan_compare`)."""

    out_dir: Path
    methods: list[str]
    seeds: list[int]
    #: method -> its runs, one per seed, in seed order
    runs: dict[str, list[PlannedRun]]
    ensemble: int = 0
    #: folder of the figures, relative to ``out_dir`` (``""``: ``out_dir`` itself); ``None``:
    #: no figures
    plots_dir: str | None = None
    #: output files (relative to ``out_dir``) an earlier comparison's manifest lists
    owned: set[str] = field(default_factory=set)
    #: run folders (relative to ``out_dir``) an earlier comparison's manifest lists
    owned_runs: set[str] = field(default_factory=set)
    command: str = "compare"


def _fail(message: str):
    from .rundir import RunFolderError

    raise RunFolderError(message)


def _check_seeds(seeds) -> list[int]:
    from ..schema import ConfigError
    from .config import MAX_SEED

    seeds = list(seeds)
    if not seeds:
        raise ConfigError("seeds: none given; give at least one, e.g. --seeds 0 1 2")
    for s in seeds:
        if not isinstance(s, int) or isinstance(s, bool):
            raise ConfigError(f"seeds: {s!r} is not an integer")
        if not 0 <= s <= MAX_SEED:
            raise ConfigError(f"seeds: {s} is out of range; a seed (train.seed) is an integer "
                              f"from 0 to {MAX_SEED}")
    dup = sorted({s for s in seeds if seeds.count(s) > 1})
    if dup:
        counts = ", ".join(f"{s} ({seeds.count(s)} times)" for s in dup)
        raise ConfigError(f"seeds: given more than once: {counts}; each seed is one run, and "
                          "a repeated seed would count one run several times (give distinct "
                          "seeds, e.g. --seeds 0 1 2)")
    return seeds


def _check_ensemble(ensemble, n_seeds: int) -> int:
    from ..schema import ConfigError

    if not isinstance(ensemble, int) or isinstance(ensemble, bool):
        raise ConfigError(f"ensemble: {ensemble!r} is not an integer")
    if ensemble == 0:
        return 0
    if ensemble < 2:
        raise ConfigError(f"ensemble: {ensemble} members; a deep ensemble needs at least 2 "
                          "(or 0 for none)")
    if ensemble > n_seeds:
        raise ConfigError(f"ensemble: {ensemble} members need at least {ensemble} seeds; "
                          f"{n_seeds} given")
    return ensemble


def _method_names(configs: list, names: list[str] | None) -> list[str]:
    """The method name of every config (``names``, else the file stem, else ``config<i>``);
    refuses names that are not one plain folder name, reserved names and collisions."""
    from ..schema import ConfigError

    if names is not None:
        names = list(names)
        if len(names) != len(configs):
            raise ConfigError(f"names: {len(names)} names for {len(configs)} configs")
    methods = []
    for i, config in enumerate(configs):
        if names is not None:
            m = names[i]
        elif isinstance(config, dict):
            m = f"config{i}"
        else:
            m = Path(config).stem
        if (not isinstance(m, str) or m in ("", ".", "..") or "/" in m or "\\" in m
                or "\0" in m):
            raise ConfigError(f"method name {m!r} (config {i}) must be a plain folder name")
        if m.casefold() in _RESERVED or _is_figure(m.casefold()):
            raise ConfigError(f"method name {m!r} (config {i}) is one of the comparison's own "
                              f"outputs ({', '.join(sorted(_RESERVED))}, figures); "
                              + ("choose another name" if names is not None
                                 else "rename the config file"))
        methods.append(m)
    seen: dict[str, int] = {}
    for i, m in enumerate(methods):
        j = seen.setdefault(m.casefold(), i)
        if j == i:
            continue
        if names is not None:
            raise ConfigError(f"names: {methods[j]!r} (config {j}) and {m!r} (config {i}) name "
                              "the same method (one run folder <out>/<method>/seed<k>); give "
                              "distinct names")
        a, b = configs[j], configs[i]
        if not isinstance(a, dict) and not isinstance(b, dict) \
                and Path(a).resolve() == Path(b).resolve():
            raise ConfigError(f"{b} is given twice; each config is one method")
        raise ConfigError(f"{a} and {b} would both be method {m!r} (methods are named by file "
                          f"name; one would overwrite the other's run folders "
                          f"<out>/{m}/seed<k>); rename one of the files")
    return methods


def _load(config, overrides: list[str], method: str, i: int) -> dict:
    """:func:`~gpattn_ppl.run.config.load_config` with the config file named in its error."""
    from ..schema import ConfigError
    from .config import load_config

    try:
        return load_config(config, overrides)
    except ConfigError as err:
        where = f"config {i} ({method})" if isinstance(config, dict) else str(config)
        if where in str(err):
            raise
        raise ConfigError(f"{where}: {err}") from None


def _read_compare_manifest(out_dir: Path, force: bool) -> dict:
    """The manifest of an earlier comparison in ``out_dir`` (``{}`` when there is none; also
    with ``force`` when the file is not one)."""
    path = out_dir / COMPARE_MANIFEST
    if path.is_symlink():  # dangling or not: written at the end, never through a link
        _fail(f"{path} is a symbolic link (compare writes its manifest there, never through a "
              "link, --force included); move it away or use another --out folder")
    if not path.exists():
        return {}
    if not path.is_file():
        _fail(f"{path} exists and is not a file; use another --out folder")
    try:
        data = json.loads(path.read_text())
    except (OSError, UnicodeDecodeError, ValueError) as err:
        data, why = None, f"not valid JSON ({err})"
    else:
        why = "not a compare manifest"
    if (isinstance(data, dict) and isinstance(data.get("files"), list)
            and all(isinstance(f, str) for f in data["files"])
            and isinstance(data.get("runs", []), list)
            and all(isinstance(r, str) for r in data.get("runs", []))):
        return data
    if force:
        return {}
    _fail(f"{path} is {why}; compare will not overwrite it: move it away, use another --out "
          "folder, or --force to overwrite it")


def _check_outputs(out_dir: Path, plots_dir: str | None, owned: set[str], force: bool,
                   command: str) -> None:
    """Refuse to overwrite output files no comparison wrote (unless ``force``), and any path
    that is in the way of one (a folder where a file goes, a file where a folder goes)."""
    targets = [out_dir / t for t in _TABLES]
    if plots_dir is not None:
        folder = out_dir / plots_dir
        if folder.is_symlink():
            _fail(f"{folder} is a symbolic link ({command} writes its figures there, never "
                  "through a link, --force included); move it away or use another --out folder")
        if folder.exists() and not folder.is_dir():
            _fail(f"{folder} exists and is not a folder (the figures go there); move it away or "
                  "use another --out folder")
        if folder.is_dir():
            targets += sorted(p for p in folder.iterdir() if _is_figure(p.name))
    foreign = []
    for path in targets:
        if not path.exists() and not path.is_symlink():
            continue
        if path.is_symlink() or not path.is_file():  # replaced are regular files only
            from ..safe_files import path_kind

            _fail(f"{path} exists and is {path_kind(path.lstat().st_mode)}, not a regular file "
                  f"({command} writes a file there, never through a link, --force included); "
                  "move it away or use another --out folder")
        rel = path.relative_to(out_dir).as_posix()
        if rel not in owned:
            foreign.append(rel)
    if foreign and not force:
        _fail(f"{out_dir} holds {', '.join(foreign)}, which {command} did not write (no "
              f"{COMPARE_MANIFEST} there lists {'it' if len(foreign) == 1 else 'them'}) and may "
              "overwrite; move them away, use another --out folder, or --force to overwrite "
              "them (and retrain every run there)")


def plan_compare(configs: list[str | Path | dict], seeds: list[int], out_dir: str | Path, *,
                 overrides: list[str] | None = None, ensemble: int = 0,
                 names: list[str] | None = None, progress: bool = True, force: bool = False,
                 plots: bool = False, plots_dir: str = "plots", command: str = "compare"
                 ) -> ComparePlan:
    """Check everything a comparison needs and decide what it does; writes nothing.

    Checked, in this order: the seeds (integers in ``0 .. 2**32-1``, none repeated), the
    ensemble size (0, or 2 to the number of seeds), the method names (one plain folder name
    each, none reserved, no two alike -- case-insensitively, as ``a/m.yaml`` and ``b/m.yaml``
    would share ``<out>/m``), every config with every seed
    (:func:`~gpattn_ppl.run.config.load_config`, the config file named in an error) and its
    device, every run folder (:func:`~gpattn_ppl.run.rundir.check_run_folder`; a finished run
    that is reused has its ``results.json`` read), and the output files
    (:data:`COMPARE_MANIFEST`: ``results.md``, ``results.csv`` and figures that no comparison
    wrote are not overwritten without ``force``).

    :param plots_dir: folder of the figures relative to ``out_dir`` (``""``: ``out_dir``).
    :raises ConfigError: a bad seed, ensemble size, method name or config value.
    :raises RunFolderError: a run folder or an output file that may not be written.
    :raises FileNotFoundError: a config file that does not exist.
    """
    from .config import check_device_available
    from .rundir import check_run_folder

    out_dir = Path(out_dir)
    configs = list(configs)
    if not configs:
        from ..schema import ConfigError

        raise ConfigError("configs: none given; give at least one config file")
    seeds = _check_seeds(seeds)
    ensemble = _check_ensemble(ensemble, len(seeds))
    methods = _method_names(configs, names)
    if out_dir.exists() and not out_dir.is_dir():
        _fail(f"{out_dir} exists and is not a folder; use another --out folder")
    runs: dict[str, list[PlannedRun]] = {}
    for i, (config, method) in enumerate(zip(configs, methods)):
        runs[method] = []
        for seed in seeds:
            ov = list(overrides or []) + [f"train.seed={seed}", f"train.progress={progress}"]
            runs[method].append(PlannedRun(method, seed, _load(config, ov, method, i),
                                           out_dir / method / f"seed{seed}", "new"))
    for method, planned in runs.items():
        if (out_dir / method).exists() and not (out_dir / method).is_dir():
            _fail(f"{out_dir / method} exists and is not a folder (the runs of method "
                  f"{method!r} go there); move it away or use another --out folder")
        for link in [out_dir / method] + [run.run_dir for run in planned]:
            if link.is_symlink():  # the runs are written inside --out, never through a link
                _fail(f"{link} is a symbolic link (the runs of method {method!r} go there, "
                      "never through a link, --force included); move it away or use another "
                      "--out folder")
        for run in planned:
            check_device_available(run.cfg["train"]["device"])
            run.action = check_run_folder(run.run_dir, run.cfg, resume=not force, force=force)
            path = run.run_dir / "results.json"
            if run.action == "resume" and path.exists():
                from .rundir import RunFolderError
                from .runfolder import written_run

                try:  # the folder check found config.yaml equal to this config
                    run.results = written_run(run.run_dir, run.cfg).results()
                except RunFolderError as err:
                    _fail(f"{str(err).splitlines()[0]}; use --force to retrain the runs in "
                          "--out, or another --out folder")
    manifest = _read_compare_manifest(out_dir, force)
    owned = set(manifest.get("files", []))
    plots_at = plots_dir if plots else None
    _check_outputs(out_dir, plots_at, owned, force, command)
    return ComparePlan(out_dir, methods, seeds, runs, ensemble, plots_at, owned,
                       set(manifest.get("runs", [])), command)


def _write_manifest(plan: ComparePlan, files: set[str]) -> None:
    from .._version import __version__
    from .rundir import write_json_atomic

    plan.owned |= files
    runs = plan.owned_runs | {r.run_dir.relative_to(plan.out_dir).as_posix()
                              for planned in plan.runs.values() for r in planned}
    write_json_atomic({"command": plan.command, "version": __version__, "methods": plan.methods,
                       "seeds": plan.seeds, "runs": sorted(runs), "files": sorted(plan.owned)},
                      plan.out_dir / COMPARE_MANIFEST)


def _check_data(plan: ComparePlan, bundle_cache: bool) -> dict:
    """Load the data of every run still to train and check its OOD set names, before the first
    run trains; returns the bundle cache (the last data loaded)."""
    from .assembly import load_bundle
    from .evaluate import check_ood_names

    bundles: dict[str, object] = {}
    for planned in plan.runs.values():
        for run in planned:
            if run.results is not None:
                continue
            key = json.dumps(run.cfg["data"], sort_keys=True)
            if key not in bundles:
                bundles = {key: load_bundle(run.cfg)}  # one bundle in memory at a time
            check_ood_names(run.cfg["eval"]["ood"], bundles[key])
    return bundles if bundle_cache else {}


def execute_plan(plan: ComparePlan, *, bundle_cache: bool = True) -> tuple[list[dict], list[Path]]:
    """Train (or reuse) every run of ``plan``, write the tables, the figures and the manifest.

    :returns: the summary rows and the figure paths written.
    """
    from .assembly import load_bundle
    from .training import Trainer

    out_dir = plan.out_dir
    bundles = _check_data(plan, bundle_cache)
    results: dict[str, list[dict]] = {}
    for method, planned in plan.runs.items():
        res = results[method] = []
        for run in planned:
            if run.results is not None:
                res.append(run.results)
                continue
            key = json.dumps(run.cfg["data"], sort_keys=True)
            if key not in bundles:
                bundles = {key: load_bundle(run.cfg)}  # keep one bundle in memory at a time
            bundle = bundles[key]
            if not bundle_cache:
                bundles = {}
            res.append(Trainer(run.cfg, run.run_dir, bundle=bundle,
                               resume=run.action == "resume", force=run.action == "fresh",
                               label=f"{method}/seed{run.seed}").fit())
        if plan.ensemble:
            results[f"{method} (ensemble of {plan.ensemble})"] = block_ensembles(
                [r.run_dir for r in planned], res, planned[-1].cfg,
                plan.ensemble)  # the seeds share the eval section
    rows = summarise(results)
    _write_manifest(plan, set(_TABLES))  # claimed before written: a rerun may overwrite them
    write_table(rows, out_dir)
    figures: list[Path] = []
    if plan.plots_dir is not None:
        from .plotting import plot_compare

        # the methods' eval.ood_detectors when they agree (a plugin's detector drawn too)
        chosen = {tuple(plan.runs[m][0].cfg["eval"]["ood_detectors"] or ()) for m in plan.methods}
        kw = {"detectors": list(chosen.pop())} if len(chosen) == 1 and () not in chosen else {}
        figures = plot_compare({m: [r.run_dir for r in plan.runs[m]] for m in plan.methods},
                               out_dir / plan.plots_dir, root=out_dir, **kw)
        _write_manifest(plan, {p.relative_to(out_dir).as_posix() for p in figures})
    return rows, figures


def run_compare(configs: list[str | Path | dict], seeds: list[int], out_dir: str | Path, *,
                overrides: list[str] | None = None, ensemble: int = 0,
                names: list[str] | None = None, bundle_cache: bool = True,
                progress: bool = True, force: bool = False, plots: bool = False
                ) -> list[dict]:
    """Train every config with every seed into ``out_dir/<method>/seed<k>`` and tabulate.

    Everything is checked before anything is written (:func:`plan_compare`: seeds, ensemble
    size, method names, every config with every seed, every run folder, the output files), and
    the data of every run to train is loaded and its OOD sets checked before the first run
    trains. Each run folder is checked as ``train`` checks it
    (:func:`~gpattn_ppl.run.rundir.check_run_folder`): a run with the same config is reused when
    finished (``results.json`` present) and resumed when interrupted; a run with a different
    config is refused, naming the keys, unless ``force``. The methods, seeds, run folders and
    output files written are recorded in ``out_dir/compare.json`` (:data:`COMPARE_MANIFEST`); a
    ``results.md``, ``results.csv`` or figure in ``out_dir`` that no such manifest lists (a
    user's own file) is not overwritten without ``force``.

    :param ensemble: also report deep ensembles of ``ensemble`` members (2 to the number of
        seeds; 0: none) per method: one per disjoint block of consecutive seeds (seeds 0-8 with
        ``ensemble=3`` give three ensembles, tabulated as mean ± std; fewer than
        ``2 * ensemble`` seeds give one). Their cost is the members' summed seconds per epoch
        and parameters.
    :param names: method names, one per config (default: the config file's stem, or
        ``config<i>`` for a dict); they must differ (also in case).
    :param force: train every run folder in ``out_dir`` that holds a run afresh (the Trainer
        removes only that run's own files), also one with a different config, and overwrite
        output files no manifest lists.
    :param plots: also draw the seed-pooled figures of every method into ``out_dir/plots``
        (:func:`~gpattn_ppl.run.plotting.plot_compare`: mean ± s.d. bands over seeds, small
        multiples past 4 methods, softmax(+ TS) as the grey reference).
    :returns: the summary rows (also written as ``results.md`` / ``results.csv``).
    """
    plan = plan_compare(configs, seeds, out_dir, overrides=overrides, ensemble=ensemble,
                        names=names, progress=progress, force=force, plots=plots)
    return execute_plan(plan, bundle_cache=bundle_cache)[0]
