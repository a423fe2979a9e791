"""Evidence tables: every unit with its default recipe beside the baselines, and every unit
swapped into a fine-tuned pretrained encoder (task ``cola_finetune``).

Rows: ``softmax``, ``softmax + TS`` (temperature scaled on the validation split), ``mc_dropout``,
``deep ensemble (K)`` (K softmax members; one ensemble per block of K seeds, so 3 seeds of
ensembles train 3 K softmax runs) and every GP / stochastic unit; columns as ``gpattn-ppl compare``
(``gpattn_ppl.run.compare.TABLE_COLUMNS``), mean ± sample std over seeds. Cells significantly
better than ``softmax + TS`` (Welch's one-sided t-test over seeds, p < 0.05) are bold.

Finished runs in ``--out`` are reused and interrupted ones resumed (as ``compare`` does), so the
command can be re-run after an interruption.

Usage::

    python experiments/evidence.py cola --out runs/evidence_cola30
    python experiments/evidence.py cola_minilm --out runs/evidence_cola_minilm
    python experiments/evidence.py imdb_cr --out runs/evidence_imdb_cr     # from the repository root
    python experiments/evidence.py cola_finetune --out runs/finetune_cola
    python experiments/evidence.py clinc150_finetune --out runs/finetune_clinc150 --seeds 0
    python experiments/evidence.py clinc150_near_ood_finetune --out runs/near_ood_clinc150 --seeds 0
    python experiments/evidence.py imdb_finetune --out runs/finetune_imdb --seeds 0
    python experiments/evidence.py cifar10 --out runs/evidence_cifar10
    python experiments/evidence.py cola --out /tmp/ev --seeds 0 --ensemble 0 --set train.epochs=1
"""

from __future__ import annotations

import argparse
import csv
import itertools
import json
import shutil
import statistics
from pathlib import Path

from gpattn_ppl.run.compare import (
    block_ensembles,
    format_markdown,
    run_compare,
    summarise,
    with_posthoc_rows,
    write_table,
)
from gpattn_ppl.run.config import load_config
from gpattn_ppl.run.rundir import RUN_FILES
from gpattn_ppl.run.shift_report import (
    format_ood_markdown,
    format_paired_markdown,
    format_shift_markdown,
    ood_rows,
    paired_rows,
    severity_plots,
    shift_rows,
)

ROOT = Path(__file__).resolve().parent
TOLERANCE = 0.03   # the per-seed "learns" criterion: within 0.03 of softmax's metric
COLA = ROOT / "configs" / "cola"
IMDB = ROOT / "configs" / "imdb"
FINETUNE = ROOT / "configs" / "cola_finetune"
CIFAR = ROOT / "configs" / "cifar10"
CLINC_FT = ROOT / "configs" / "clinc150_finetune"
IMDB_FT = ROOT / "configs" / "imdb_finetune"

#: the CLINC150 fine-tuning methods (both protocols); *_last2: the unit in the last two layers
CLINC_FT_METHODS = {m: CLINC_FT / f"{m}.yaml" for m in (
    "softmax", "mc_dropout", "sngp", "kep_svgp", "sgpa", "cgpt", "scgpt", "h_gumbel",
    "cgpt_last2", "scgpt_last2")}

#: task -> (method -> config file), the settings every run of the task gets, and a description
TASKS: dict[str, dict] = {
    "cola": {
        "methods": {"softmax": COLA / "softmax.yaml", "mc_dropout": COLA / "mc_dropout.yaml",
                    "kernel_asym": COLA / "kernel_asym.yaml",
                    "kernel_sym": COLA / "kernel_sym.yaml", "sgpa": COLA / "sgpa.yaml",
                    "kep_svgp": COLA / "kep_svgp.yaml", "cgpt": COLA / "cgpt.yaml",
                    "scgpt": COLA / "scgpt.yaml", "sto_trans": COLA / "sto_trans.yaml",
                    "h_sto_trans": COLA / "h_sto_trans.yaml"},
        "settings": ["train.epochs=30", "train.warmup_epochs=2", "train.patience=5"],
        "about": "CoLA official protocol, learned word embeddings, up to 30 epochs (2 warm-up), "
                 "stopped after 5 epochs without a better validation MCC",
        "metric": "mcc",
    },
    "imdb_cr": {
        "methods": {m: IMDB / f"{m}.yaml" for m in (
            "softmax", "mc_dropout", "kernel_asym", "kernel_sym", "sgpa", "kep_svgp", "cgpt",
            "scgpt", "sto_trans", "h_sto_trans")},
        "settings": ["data.limit_train=5000", "data.limit_eval=2000", "data.max_len=128",
                     "model.max_len=128", "train.epochs=5"],
        "about": "IMDB (ID) -> CR (OOD), reduced for 2 CPU cores: 1 block, C = 128, 8 heads, "
                 "5,000 training reviews, 128 tokens, 5 epochs, 2,000-review validation and test "
                 "subsets",
        "metric": "acc",
        "ood_accuracy": True,   # the sto-trans paper's Table 1 compares accuracy on CR
    },
    "cola_minilm": {
        "methods": None,  # the cola methods
        "settings": ["data.encoder=minilm", "data.cache_dir=runs/cache", "model.dim=64",
                     "model.mlp_dim=128", "data.batch_size=64", "train.epochs=6",
                     "train.warmup_epochs=0.5", "train.lr=2e-3"],
        "about": "CoLA official protocol, frozen all-MiniLM-L6-v2 token features (text extra), "
                 "the demo's backbone (C = 64, MLP 128, batch 64, Adam 2e-3) for 6 epochs "
                 "(0.5 warm-up)",
        "metric": "mcc",
    },
    "cifar10": {   # the CPU preset (experiments/configs/cifar10/<method>.yaml)
        "methods": {m: CIFAR / f"{m}.yaml" for m in (
            "softmax", "mc_dropout", "kernel_asym", "kernel_sym", "sgpa", "kep_svgp", "cgpt",
            "scgpt", "gumbel", "h_gumbel")},
        "settings": [],
        "about": "CIFAR-10, CPU preset: ViT 3 blocks (patch 4, C = 128, 4 heads, MLP 128), a "
                 "10,000-image training subset, 6 epochs, batch 128; SGPA, KEP-SVGP, CGPT and "
                 "SCGPT in the last block, kernel, Gumbel and h-Gumbel in every block; test = "
                 "the 10,000 official test images",
        "metric": "acc",
        # shift and OOD tables (shift.md, ood.md) and the metric-vs-severity plots
        "ood_sets": ["digits", "photo_patches", "gaussian_noise", "uniform_noise",
                     "cifar10c:*:5"],
    },
    "clinc150_finetune": {   # intents + out-of-scope detection, pretrained encoder
        "methods": CLINC_FT_METHODS,
        "settings": [],
        "ensemble": 0,
        "about": "CLINC150 standard protocol (150 intents; OOS = the 1,000 out-of-scope test "
                 "queries), all-MiniLM-L6-v2 fine-tuned end to end (max 32 word pieces, batch 32, "
                 "3 epochs, AdamW: units and head 5e-4, encoder 3e-5); each unit swapped into "
                 "the last layer (*_last2: the last two), initialised from it; softmax also with "
                 "last-layer Laplace "
                 "(+ LLA: Kron, probit, prior precision by validation NLL)",
        "metric": "acc",
        "ood_set": "oos",
        "baselines": ["softmax + TS", "softmax + LLA", "sngp", "sngp + TS"],
    },
    "clinc150_near_ood_finetune": {   # CLINC150 with two whole domains held out (near OOD)
        "methods": CLINC_FT_METHODS,
        "settings": ["data.protocol=near_ood", "data.split_seed=0"],
        "ensemble": 0,
        "about": "CLINC150 near-OOD protocol (split_seed 0: the banking and kitchen_and_dining "
                 "domains held out whole; 120 intents, train / val / test 12,000 / 2,400 / 3,600; "
                 "near OOD = the held-out intents' 900 test queries, far OOD = the 1,000 "
                 "out-of-scope ones), the recipe of clinc150_finetune",
        "metric": "acc",
        "ood_set": "held_out_domains",
        "ood_report": ["held_out_domains", "oos"],   # ood_sets.md: near and far OOD side by side
        "baselines": ["softmax + TS", "softmax + LLA", "sngp", "sngp + TS"],
    },
    "imdb_finetune": {   # IMDB -> CR, pretrained encoder
        "methods": {m: IMDB_FT / f"{m}.yaml" for m in (
            "softmax", "mc_dropout", "sngp", "kep_svgp", "sgpa", "cgpt", "scgpt", "h_gumbel",
            "cgpt_last2")},   # cgpt_last2: CGPT in the last two layers
        "settings": [],
        "ensemble": 0,
        "about": "IMDB (ID) -> CR (OOD), all-MiniLM-L6-v2 fine-tuned end to end, reduced for 2 "
                 "CPU cores: 5,000 training reviews, 2,000-review validation and test subsets, "
                 "128 word pieces, batch 32, 2 epochs (AdamW: units and head 5e-4, encoder "
                 "3e-5); each unit swapped into the last layer (cgpt_last2: the last two); "
                 "softmax also + LLA",
        "metric": "acc",
        "ood_set": "cr",
        "ood_accuracy": True,
        "baselines": ["softmax + TS", "softmax + LLA", "sngp", "sngp + TS"],
    },
    "cola_finetune": {   # units swapped into a pretrained encoder
        "methods": {m: FINETUNE / f"{m}.yaml" for m in (
            "softmax", "mc_dropout", "sngp", "kep_svgp", "sgpa", "cgpt", "scgpt", "h_gumbel",
            "cgpt_last2", "cgpt_last2_per_layer")},   # CGPT in the last two layers;
        # *_per_layer: the fifth layer's CGP term with its own weight
        "ood_set": "cola_ood",
        "baselines": ["softmax + TS", "softmax + LLA", "sngp", "sngp + TS"],
        "settings": [],
        "ensemble": 0,
        "match_epochs": True,   # epochs each unit needs to reach the host's validation MCC
        "about": "CoLA official protocol, all-MiniLM-L6-v2 fine-tuned end to end (max 64 word "
                 "pieces, batch 32, 3 epochs, AdamW: units and head 5e-4, encoder 3e-5); each "
                 "unit swapped into the last layer (cgpt_last2: the last two), initialised from it",
        "metric": "mcc",
    },
}


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("task", choices=sorted(TASKS))
    p.add_argument("--out", required=True, help="output folder (run folders and the table)")
    p.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    p.add_argument("--ensemble", type=int, default=None, metavar="K",
                   help="members per deep ensemble (0: no ensemble rows; default 3, "
                        "cola_finetune 0)")
    p.add_argument("--ensemble-seeds", type=int, default=None, metavar="N",
                   help="the softmax seeds 0..N-1 whose disjoint blocks of K form the deep "
                        "ensembles (default: K x the number of --seeds, one ensemble per seed; "
                        "N = K: one ensemble of the first K seeds, no std)")
    p.add_argument("--methods", nargs="+", help="a subset of the task's methods")
    p.add_argument("--set", nargs="+", default=[], dest="overrides", metavar="KEY=VALUE",
                   help="extra config overrides for every run")
    p.add_argument("--mean-predictive", action="store_true",
                   help="also evaluate every stochastic method's finished runs with one pass at "
                        "the posterior mean (eval.predictive=mean, on copies under "
                        "OUT/_mean/) and add their rows as '<method> (mean)'")
    p.add_argument("--mean-trained", nargs="+", default=[], metavar="METHOD",
                   help="methods trained with eval.predictive=mean (their validation and test "
                        "predictive the one pass at the posterior mean, for a third of the MC "
                        "evaluation's time; training is the same): their runs are reused with "
                        "that setting and their rows are '<method> (mean)'")
    p.add_argument("--cost-json", default=None, metavar="PATH",
                   help="test costs for the goal table from one run of "
                        "benchmarks/bench_predictive_cost.py (default: each run's recorded "
                        "cost)")
    args = p.parse_args(argv)
    task = TASKS[args.task]
    if args.ensemble is None:
        args.ensemble = task.get("ensemble", 3)
    methods = task["methods"] or TASKS["cola"]["methods"]
    if args.methods:
        unknown = sorted(set(args.methods) - set(methods))
        if unknown:
            p.error(f"unknown method(s) {unknown}; allowed: {', '.join(methods)}")
        methods = {m: methods[m] for m in args.methods}
    if bad := sorted(set(args.mean_trained) - (set(methods) - {"softmax", "sngp"})):
        p.error(f"--mean-trained {bad}: not among this run's stochastic methods")
    out = Path(args.out)
    overrides = task["settings"] + args.overrides

    def config(method: str, extra: list[str] = ()) -> dict:
        spec = methods[method]
        path, own = (spec, []) if isinstance(spec, Path) else spec
        return load_config(path, own + overrides + list(extra))

    runs: dict[str, list[dict]] = {}
    replicas: list[dict] = []
    if "softmax" in methods:
        k = args.ensemble
        n = len(args.seeds) * k if args.ensemble_seeds is None else args.ensemble_seeds
        if k and n < k:
            p.error(f"--ensemble-seeds {n} is fewer than the {k} members of one ensemble")
        seeds = sorted(set(args.seeds) | set(range(n if k else 0)))
        cfg = config("softmax", ["eval.temperature_scaling=true"])
        run_compare([cfg], seeds, out, names=["softmax"], progress=False)
        dirs = [out / "softmax" / f"seed{s}" for s in seeds]
        results = {s: json.loads((d / "results.json").read_text()) for s, d in zip(seeds, dirs)}
        runs["softmax"] = [results[s] for s in args.seeds]
        replicas = [results[s] for s in seeds if s not in args.seeds]
        if k:
            runs[f"deep ensemble ({k})"] = block_ensembles(
                dirs, [results[s] for s in seeds], cfg, k)[:len(args.seeds)]
    others = [m for m in methods if m != "softmax"]
    if others:
        mean = ["eval.predictive=mean"]
        run_compare([config(m, mean if m in args.mean_trained else []) for m in others],
                    args.seeds, out, names=others, progress=False)
        for m in others:
            runs[m + (" (mean)" if m in args.mean_trained else "")] = [
                json.loads((out / m / f"seed{s}" / "results.json").read_text())
                for s in args.seeds]
    if args.mean_predictive:
        for m in [m for m in runs if m not in ("softmax", "sngp")
                  and not m.startswith("deep ensemble") and not m.endswith(" (mean)")]:
            runs[f"{m} (mean)"] = mean_predictive_runs(out, m, args.seeds)
    order = ["softmax", f"deep ensemble ({args.ensemble})", "mc_dropout"]
    runs = {m: runs[m] for m in order if m in runs} | {m: r for m, r in runs.items()
                                                       if m not in order}
    rows = summarise(runs)
    write_table(rows, out)
    print(f"{task['about']}; seeds {' '.join(map(str, args.seeds))}\n")
    print(format_markdown(rows))
    cost = cost_table(runs)
    (out / "cost.md").write_text(cost + "\n")
    print(f"\n{cost}")
    if task.get("match_epochs") and "softmax" in runs:
        # the (mean) rows share their runs' curves; an ensemble has no training curve
        match = epochs_to_match(out, [m for m in runs if m != "softmax"
                                      and not m.endswith(" (mean)")
                                      and not m.startswith("deep ensemble")], args.seeds)
        (out / "epochs_to_match.md").write_text(match + "\n")
        print(f"\n{match}")
    if task.get("ood_accuracy"):
        acc = ood_accuracy_table(runs)
        (out / "ood_accuracy.md").write_text(acc + "\n")
        print(f"\n{acc}")
    if task.get("ood_sets"):
        shift_and_ood_tables(runs, task["ood_sets"], out)
    if task.get("ood_report"):
        by_set = ood_sets_table(runs, task["ood_report"])
        (out / "ood_sets.md").write_text(by_set + "\n")
        print(f"\nOOD detection per set\n\n{by_set}")
    if task.get("baselines"):
        paired = paired_baselines_table(runs, task["baselines"], task["metric"],
                                        task.get("ood_set"))
        (out / "paired_baselines.md").write_text(paired + "\n")
        print(f"\n{paired}")
    cost = benchmark_costs(args.cost_json) if args.cost_json else None
    if task.get("ood_set") and task.get("baselines"):
        refs = [b for b in ("softmax + TS", "softmax + LLA") if b in task["baselines"]]
        goal = goal_table(runs, refs, task["metric"], task["ood_set"], cost=cost)
        (out / "goal.md").write_text(goal + "\n")
        print(f"\n{goal}")
    if task.get("ood_set"):
        points = figure_points(pareto_points(runs, task["ood_set"], cost))
        if points:
            print(f"\nPareto figure: {pareto_figure(points, out / 'pareto.png', args.task)}")
    if "softmax" in runs:
        per_seed = per_seed_table(runs, args.seeds, task["metric"], replicas)
        (out / "per_seed.md").write_text(per_seed + "\n")
        print(f"\n{per_seed}")


#: the files of a finished run an evaluation reads (every run file but these two)
_EVAL_FILES = tuple(f for f in RUN_FILES if f not in ("last.pt", "predictions.pt"))


def mean_predictive_runs(out: Path, method: str, seeds: list[int]) -> list[dict]:
    """The results of ``method``'s finished runs (``out/<method>/seed<s>``) re-evaluated with
    one pass at the units' posterior means (``eval.predictive=mean``, MC dropout off), each on
    a copy of its folder at ``out/_mean/<method>/seed<s>`` (an evaluation rewrites
    ``results.json``); a copy already evaluated that way is reused."""
    from gpattn_ppl.run.results import evaluate_run

    results = []
    for s in seeds:
        src, dst = out / method / f"seed{s}", out / "_mean" / method / f"seed{s}"
        done = json.loads((dst / "results.json").read_text()) \
            if (dst / "results.json").exists() else {}
        if done.get("eval", {}).get("predictive") == "mean":
            results.append(done)
            continue
        dst.mkdir(parents=True, exist_ok=True)
        for name in _EVAL_FILES:
            if (src / name).exists():
                shutil.copy2(src / name, dst / name)
        results.append(evaluate_run(dst, overrides=["eval.predictive=mean"]))
    return results


def _cell(vals: list, fmt: str = ".3f", std: bool = True) -> str:
    """``mean ± sample std`` of the numbers among ``vals`` (std only for two or more, and only
    with ``std``); ``–`` when there are none (runs of versions that did not record the value)."""
    vals = [v for v in vals if isinstance(v, (int, float))]
    if not vals:
        return "–"
    spread = f" ± {statistics.stdev(vals):{fmt}}" if std and len(vals) > 1 else ""
    return f"{statistics.fmean(vals):{fmt}}" + spread


def ood_accuracy_table(runs: dict[str, list[dict]]) -> str:
    """Accuracy in domain and on each labelled OOD set, and the mean mutual information of the
    test predictive on both, mean ± std over a method's runs (the sto-trans paper's comparison:
    does a unit keep in-domain accuracy while raising out-of-domain accuracy?)."""
    sets = sorted({name for results in runs.values() for r in results
                   for name, res in r.get("ood", {}).items() if "classification" in res})

    head = " | ".join(f"Acc OOD ({s}) | MI OOD ({s})" for s in sets)
    lines = [f"| method | runs | Acc ID | MI ID | {head} |", "|---|" + "---|" * (3 + 2 * len(sets))]
    for method, results in runs.items():
        cells = [_cell([r["test"].get("acc") for r in results]),
                 _cell([r["test"].get("mutual_info") for r in results], ".1e", std=False)]
        for name in sets:
            got = [r.get("ood", {}).get(name, {}).get("classification", {}) for r in results]
            cells += [_cell([g.get("acc") for g in got]),
                      _cell([g.get("mutual_info") for g in got], ".1e", std=False)]
        lines.append(f"| {method} | {len(results)} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def ood_sets_table(runs: dict[str, list[dict]], ood_sets: list[str]) -> str:
    """Per row of the table (``+ TS`` and ``+ LLA`` rows included) and OOD set: the AUROC of the
    maximum probability and of the mutual information (stochastic rows only) for detecting that
    set against the in-domain test set, mean ± std over the runs (a task with a near and a far
    OOD set reads both side by side)."""
    head = " | ".join(f"{s} AUROC (MSP) | {s} AUROC (MI)" for s in ood_sets)
    lines = [f"| method | runs | {head} |", "|---|---|" + "---|" * (2 * len(ood_sets))]
    for method, results in with_posthoc_rows(runs).items():
        cells = []
        for name in ood_sets:
            det = [_detection(r, name) for r in results]
            cells += [_cell([(d.get("max_softmax") or {}).get("auroc") for d in det]),
                      _cell([(d.get("mutual_info") or {}).get("auroc") for d in det])]
        lines.append(f"| {method} | {len(results)} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def cost_table(runs: dict[str, list[dict]]) -> str:
    """Cost per method, mean ± std over its runs: training seconds per epoch, the whole run
    (training, validation after every epoch, the final evaluation with every OOD / shift set),
    that evaluation alone, the test cost in ms per example with every MC pass (the predictive
    passes over validation, test and OOD sets, divided by their examples; for ``+ LLA`` the
    deterministic feature pass and the closed-form predictive), peak memory (MiB) and
    parameters; ``–`` for runs of versions that did not record them."""
    lines = ["| method | runs | s/epoch (training) | s per run (all) | s evaluation | "
             "test ms / example (all passes) | peak MiB | parameters |",
             "|---|---|---|---|---|---|---|---|"]
    for method, results in runs.items():
        if method.startswith("deep ensemble"):
            continue
        costs = [r.get("cost", {}) for r in results]
        cells = [_cell([c.get(k) for c in costs], ".0f") for k in
                 ("sec_per_epoch", "run_seconds", "eval_seconds")]
        cells += [_cell([c.get("predict_ms_per_example") for c in costs], ".2f"),
                  _cell([c.get("peak_mem_mb") for c in costs], ".0f"),
                  _cell([c.get("params") for c in costs], ".0f", std=False)]
        lines.append(f"| {method} | {len(results)} | " + " | ".join(cells) + " |")
        if all("laplace" in r for r in results) and results:
            ms = [r["laplace"].get("predict_ms_per_example") for r in results]
            lines.append(f"| {method} + LLA | {len(results)} | – | – | – | {_cell(ms, '.2f')} "
                         "| – | – |")
    return "\n".join(lines)


def _detection(r: dict, ood_set: str) -> dict:
    """The detectors' metrics of one run's results on ``ood_set`` (empty where it has none)."""
    return ((r.get("ood") or {}).get(ood_set) or {}).get("detection") or {}


def _paired_values(r: dict, metric: str, ood_set: str | None) -> dict[str, float | None]:
    test = r.get("test") or {}
    vals = {m: test.get(m) for m in (metric, "nll", "ece", "brier")}
    if ood_set is not None:
        det = _detection(r, ood_set)
        vals["OOD AUROC (MSP)"] = (det.get("max_softmax") or {}).get("auroc")
    return vals


def paired_baselines_table(runs: dict[str, list[dict]], baselines: list[str], metric: str,
                           ood_set: str | None) -> str:
    """Per method (the baselines themselves left out) and baseline: the mean over seeds of the
    paired difference method − baseline
    (the same seed: runs are listed in seed order) of the test ``metric``, NLL, ECE, Brier and
    the OOD AUROC of the maximum softmax probability on ``ood_set``, with the paired t-test's
    two-sided p-value (``scipy.stats.ttest_rel``; none with fewer than 2 seeds) and the number
    of seeds on which the method is better. Lower is better for NLL, ECE and Brier."""
    from scipy.stats import ttest_rel

    rows = with_posthoc_rows(runs)
    names = [metric, "nll", "ece", "brier"] + (["OOD AUROC (MSP)"] if ood_set else [])
    higher = {metric: True, "OOD AUROC (MSP)": True}
    lines = ["Paired differences method − baseline, mean over seeds [paired t-test p, seeds "
             "where the method is better]:", "",
             "| method | baseline | " + " | ".join(names) + " |",
             "|---|---|" + "---|" * len(names)]
    for base in baselines:
        if base not in rows:
            continue
        ref = [_paired_values(r, metric, ood_set) for r in rows[base]]
        for method, results in rows.items():
            if method in baselines or method.startswith("deep ensemble") or \
                    len(results) != len(ref):
                continue
            mine = [_paired_values(r, metric, ood_set) for r in results]
            cells = []
            for m in names:
                d = [a[m] - b[m] for a, b in zip(mine, ref)
                     if a[m] is not None and b[m] is not None]
                if not d:
                    cells.append("–")
                    continue
                better = sum((x > 0) if higher.get(m) else (x < 0) for x in d)
                p = ""
                if len(d) >= 2 and any(x != d[0] for x in d):
                    p = f"p={float(ttest_rel([a[m] for a in mine], [b[m] for b in ref]).pvalue):.3f}, "
                cells.append(f"{statistics.fmean(d):+.4f} [{p}{better}/{len(d)}]")
            lines.append(f"| {method} | {base} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def _test_ms(method: str, r: dict, cost: dict[str, float] | None = None) -> float | None:
    """Test ms per example with every MC pass of one run of a table row: a ``+ LLA`` run dict
    has the Laplace results laid over it, its own predictive's cost included; ``+ TS`` costs
    what its method does. With ``cost`` (one benchmark run's, :func:`benchmark_costs`) the
    row's benchmarked cost instead (None if it was not benchmarked)."""
    if cost is not None:
        return cost.get(method.removesuffix(" + TS"))
    if method.endswith(" + LLA"):
        return r.get("predict_ms_per_example")
    return (r.get("cost") or {}).get("predict_ms_per_example")


GOAL_COST_RATIO = 1.5


def goal_table(runs: dict[str, list[dict]], references: list[str], metric: str,
               ood_set: str, cost_ratio: float = GOAL_COST_RATIO,
               baselines: tuple[str, ...] = ("softmax", "mc_dropout", "sngp"),
               cost: dict[str, float] | None = None) -> str:
    """The issue's goal, row by row: is a method (its ``+ TS`` row too) Pareto-better than
    each reference on the means over seeds: ``metric`` at least the reference's, lower NLL and
    ECE, higher OOD AUROC (maximum probability on ``ood_set``), at most ``cost_ratio`` times
    the reference's test ms per example (every MC pass)? Rows of ``baselines`` (with their
    ``+ TS`` and ``(mean)`` rows), ``+ LLA`` rows and ensembles are left out. Each cell gives
    the difference (cost: the ratio) and ✓ / ✗; the last column says whether every criterion
    holds. Means only, not a test: the paired tests are in ``paired_baselines.md``.

    :param cost: test ms per example by row name (``+ TS`` rows cost what their method does),
        measured in one benchmark run (:func:`benchmark_costs`); default: each run's own
        recorded cost, which depends on the load of the machine when it ran."""
    rows = with_posthoc_rows(runs)
    names = [metric, "nll", "ece", "OOD AUROC (MSP)"]
    higher = {metric: True, "OOD AUROC (MSP)": True}

    def means(method):
        vals = [_paired_values(r, metric, ood_set) for r in rows[method]]
        out = {m: [v[m] for v in vals] for m in names}
        out["ms"] = [_test_ms(method, r, cost) for r in rows[method]]
        return {k: statistics.fmean(v) if v and None not in v else None for k, v in out.items()}

    source = "one benchmark run" if cost is not None else "each run's recorded cost"
    lines = [f"Goal check (means over seeds): {metric} ≥ the reference's, NLL and ECE lower, OOD "
             f"AUROC (MSP) higher, test cost ≤ {cost_ratio:g}× the reference's ({source}):", "",
             "| method | reference | " + " | ".join(names) + " | test cost ratio | goal |",
             "|---|---|" + "---|" * (len(names) + 2)]
    for ref in references:
        if ref not in rows:
            continue
        base = means(ref)
        for method in rows:
            if method.split(" + ")[0].removesuffix(" (mean)") in baselines or \
                    method.startswith("deep ensemble") or \
                    method.endswith(" + LLA") or len(rows[method]) != len(rows[ref]):
                continue
            mine, cells, ok = means(method), [], True
            for m in names:
                if mine[m] is None or base[m] is None:
                    cells.append("–")
                    ok = False
                    continue
                d = mine[m] - base[m]
                good = d >= 0 if m == metric else (d > 0 if higher.get(m) else d < 0)
                ok &= good
                cells.append(f"{d:+.4f} {'✓' if good else '✗'}")
            if mine["ms"] is None or not base["ms"]:
                cells.append("–")
                ok = False
            else:
                ratio = mine["ms"] / base["ms"]
                ok &= ratio <= cost_ratio
                cells.append(f"{ratio:.1f}× {'✓' if ratio <= cost_ratio else '✗'}")
            lines.append(f"| {method} | {ref} | " + " | ".join(cells) +
                         f" | {'**met**' if ok else 'not met'} |")
    return "\n".join(lines)


def benchmark_costs(path: str | Path) -> dict[str, float]:
    """Test ms per example by table row name from ``benchmarks/bench_predictive_cost.py``'s
    JSON: ``<name>/mc`` is row ``<name>``, ``<name>/mean`` row ``<name> (mean)`` and
    ``<name>/lla`` row ``<name> + LLA``."""
    rows = json.loads(Path(path).read_text())["rows"]
    suffix = {"mc": "", "mean": " (mean)", "lla": " + LLA"}
    return {name + suffix[mode]: row["ms_per_example_median"]
            for key, row in rows.items() for name, mode in [key.rsplit("/", 1)]}


def pareto_points(runs: dict[str, list[dict]], ood_set: str,
                  cost: dict[str, float] | None = None) -> list[dict]:
    """One point per row of the table (``+ TS`` and ``+ LLA`` rows included, ensembles left
    out): test cost in ms per example with every MC pass (``cost.predict_ms_per_example``; for
    ``+ LLA`` the Laplace predictive's own), the OOD AUROC of the maximum probability on
    ``ood_set`` and the test NLL, each mean and sample std over the runs. Rows without a
    recorded cost are left out. ``cost``: the costs of one benchmark run by row name
    (:func:`benchmark_costs`) instead; rows it lacks are left out."""
    points = []
    for method, results in with_posthoc_rows(runs).items():
        if method.startswith("deep ensemble"):
            continue
        ms = [_test_ms(method, r, cost) for r in results]
        vals = [_paired_values(r, "nll", ood_set) for r in results]
        auroc = [v.get("OOD AUROC (MSP)") for v in vals]
        nll = [v["nll"] for v in vals]
        if any(v is None for v in ms + auroc + nll):
            continue
        stat = [(statistics.fmean(v), statistics.stdev(v) if len(v) > 1 else 0.0)
                for v in (ms, auroc, nll)]
        points.append({"method": method, "ms": stat[0], "auroc": stat[1], "nll": stat[2]})
    return points


def figure_points(points: list[dict]) -> list[dict]:
    """The points the Pareto figure shows: a method with a ``+ TS`` row is drawn by that row
    only (softmax and SNGP by both), and ``mc_dropout (mean)`` (dropout off: the softmax
    network) is left out; the table keeps every row."""
    names = {p["method"] for p in points}
    return [p for p in points
            if not p["method"].startswith("mc_dropout (mean)")
            and (p["method"] in ("softmax", "sngp") or f"{p['method']} + TS" not in names)]


def pareto_front(points: list[dict], key: str, higher: bool) -> list[str]:
    """The methods no other point beats on both test cost (lower) and ``key`` (higher or lower
    is better), mean values."""
    def better(a, b):   # a at least as good as b on both, strictly on one
        ka, kb = a[key][0], b[key][0]
        good = ka >= kb if higher else ka <= kb
        strict = a["ms"][0] < b["ms"][0] or (ka > kb if higher else ka < kb)
        return a["ms"][0] <= b["ms"][0] and good and strict
    return [p["method"] for p in points if not any(better(q, p) for q in points if q is not p)]


def pareto_figure(points: list[dict], path: Path, title: str) -> Path:
    """Two panels, OOD AUROC (MSP) and test NLL against test ms per example (log scale), one
    point per method with its std over seeds; the Pareto front of each panel drawn as a step
    line and its methods' labels in bold. Written with matplotlib's object API (no pyplot)."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure
    from matplotlib.ticker import FuncFormatter, LogLocator, NullFormatter

    fig = Figure(figsize=(11, 4.4))
    FigureCanvasAgg(fig)
    for ax, (key, label, higher) in zip(fig.subplots(1, 2), (
            ("auroc", "OOD AUROC (max probability), higher is better", True),
            ("nll", "test NLL, lower is better", False))):
        front = pareto_front(points, key, higher)
        for p in points:
            on = p["method"] in front
            ax.errorbar(p["ms"][0], p[key][0], xerr=p["ms"][1], yerr=p[key][1], fmt="o",
                        ms=6 if on else 4, color="C3" if on else "C0", capsize=2)
            ax.annotate(p["method"], (p["ms"][0], p[key][0]), textcoords="offset points",
                        xytext=(4, 3), fontsize=7, fontweight="bold" if on else "normal")
        line = sorted((p for p in points if p["method"] in front), key=lambda p: p["ms"][0])
        ax.step([p["ms"][0] for p in line], [p[key][0] for p in line], where="post",
                color="C3", lw=1, alpha=0.6)
        ax.set_xscale("log")
        ax.xaxis.set_major_locator(LogLocator(subs=(1.0, 2.0, 5.0)))
        ax.xaxis.set_major_formatter(FuncFormatter(lambda x, _: f"{x:g}"))
        ax.xaxis.set_minor_formatter(NullFormatter())
        ax.set_xlabel("test ms per example, all MC passes (log)")
        ax.set_ylabel(label)
        ax.grid(alpha=0.3)
    fig.suptitle(f"{title}: uncertainty against test cost (red: Pareto front)", fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    return path


def _val_curve(run_dir: Path) -> list[float]:
    """Validation MCC after each epoch of one run (its ``log.csv``)."""
    with open(run_dir / "log.csv", newline="") as fh:
        return [float(row["val/mcc"]) for row in csv.DictReader(fh)]


def epochs_to_match(out: Path, methods: list[str], seeds: list[int]) -> str:
    """Per method and seed: the first epoch whose validation MCC reaches the best validation
    MCC of the unswapped host (``softmax``, same seed), or ``> E`` when none of its E epochs
    does; a markdown table."""
    head = " | ".join(f"seed {s}" for s in seeds)
    lines = [f"| method | {head} |", "|---|" + "---|" * len(seeds),
             "| softmax (best val MCC, its epoch) | " + " | ".join(
                 f"{max(c):.3f} (epoch {c.index(max(c)) + 1})"
                 for c in (_val_curve(out / "softmax" / f"seed{s}") for s in seeds)) + " |"]
    for m in methods:
        cells = []
        for s in seeds:
            target = max(_val_curve(out / "softmax" / f"seed{s}"))
            curve = _val_curve(out / m / f"seed{s}")
            hit = next((e + 1 for e, v in enumerate(curve) if v >= target), None)
            cells.append(f"{hit} ({curve[hit - 1]:.3f})" if hit else
                         f"> {len(curve)} (best {max(curve):.3f})")
        lines.append(f"| {m} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def shift_and_ood_tables(runs: dict[str, list[dict]], ood_sets: list[str], out: Path) -> None:
    """``shift.md`` (CIFAR-10-C: the 15 x 5 means and CGPT's category means), ``ood.md`` (every
    detector over ``ood_sets``), ``paired.md`` (each method against softmax and softmax + TS,
    seed by seed) and ``<metric>_vs_severity.png`` under ``out``; printed too."""
    rows = shift_rows(runs)
    shift = format_shift_markdown(rows)
    ood = format_ood_markdown(ood_rows(runs, ood_sets))
    (out / "shift.md").write_text(shift + "\n")
    (out / "ood.md").write_text(ood + "\n")
    plots = severity_plots(rows, out)
    print(f"\nCIFAR-10-C (regenerated)\n\n{shift}\n\nOOD detection (mean over "
          f"{', '.join(ood_sets)})\n\n{ood}\n\nplots: {', '.join(str(p) for p in plots)}")
    if "softmax" in runs:
        paired = ("Against softmax seed by seed (method − softmax with the same seed: mean "
                  "[min, max] over the seeds; k/n: the seeds on which the method is better; "
                  "C10-C: the 15 x 5 mean)\n\n" + format_paired_markdown(paired_rows(runs)))
        (out / "paired.md").write_text(paired + "\n")
        print(f"\n{paired}")


def per_seed_table(runs: dict[str, list[dict]], seeds: list[int], metric: str,
                   replicas: list[dict] = ()) -> str:
    """Test ``metric`` per seed and its difference to softmax's run with the same seed (the
    "learns" criterion: within ``TOLERANCE`` of softmax for every seed).

    ``replicas``: softmax runs with other seeds (the ensemble members). The closing line says how
    often softmax itself meets the criterion: over every ordered choice of ``len(seeds)``
    replicas set against seeds ``seeds``, the fraction whose worst difference stays within
    ``TOLERANCE``, and the sample std of softmax's metric over all its seeds."""
    ref = [r["test"][metric] for r in runs["softmax"]]
    head = " | ".join(f"seed {s}" for s in seeds)
    lines = [f"| method | {head} | worst seed − softmax's | mean − softmax's mean |",
             "|---|" + "---|" * (len(seeds) + 2)]
    for method, results in runs.items():
        if method == "softmax" or len(results) != len(seeds):
            continue
        vals = [r["test"][metric] for r in results]
        diffs = [v - s for v, s in zip(vals, ref)]
        cells = " | ".join(f"{v:.3f} ({d:+.3f})" for v, d in zip(vals, diffs))
        lines.append(f"| {method} | {cells} | {min(diffs):+.3f} | "
                     f"{sum(vals) / len(vals) - sum(ref) / len(ref):+.3f} |")
    other = [r["test"][metric] for r in replicas]
    if len(other) >= len(ref):
        choices = list(itertools.permutations(other, len(ref)))
        met = sum(min(o - s for o, s in zip(pick, ref)) >= -TOLERANCE for pick in choices)
        lines.append(
            f"\nSoftmax against itself: over its {len(ref) + len(other)} seeds its test {metric} "
            f"has std {statistics.stdev(ref + other):.3f}; of the {len(choices)} ordered "
            f"choices of {len(ref)} of its other seeds set against seeds "
            f"{', '.join(map(str, seeds))}: {met} ({met / len(choices):.0%}) stay within "
            f"{TOLERANCE} of softmax on every seed.")
    return "\n".join(lines)


if __name__ == "__main__":
    main()
