"""The main job: every registered attention unit trained and evaluated on the bundled CoLA data."""

from __future__ import annotations

import time
from pathlib import Path

__all__ = ["DEMO_PRESETS", "demo_methods", "run_demo"]

#: model-section patches for the demo, per method name. Kinds registered later that are not
#: listed here run with their defaults in every block.
DEMO_PRESETS: dict[str, dict] = {
    "softmax": {"attention": {"kind": "softmax"}},
    "mc_dropout": {"attention": {"kind": "softmax"}, "mc_dropout": True},
    "kernel_asym": {"attention": {"kind": "kernel", "symmetric": False}},
    "kernel_sym": {"attention": {"kind": "kernel", "symmetric": True}},
    # the KEP-SVGP paper's setting: only the last block is replaced
    "kep_svgp": {"attention": {"kind": "softmax"},
                 "overrides": [{"blocks": [-1], "attention": {"kind": "kep_svgp"}}]},
    # the CoLA settings of experiments/configs/cola/{cgpt,scgpt}.yaml: sigma = 0.5, the CGP bound
    # per entry (and with observation noise for CGPT; the paper's summed bound collapses CoLA)
    "cgpt": {"attention": {"kind": "cgpt", "noise": 0.5, "cgp_reduction": "mean",
                           "cgp_observation_noise": True}},
    "scgpt": {"attention": {"kind": "scgpt", "num_inducing": 5, "noise": 0.5,
                            "cgp_reduction": "mean"}},
}

_BASE = {
    "model": {"arch": "text", "dim": 64, "depth": 2, "heads": 4, "mlp_dim": 128, "dropout": 0.1,
              "max_len": 40},
    "data": {"name": "cola", "protocol": "official", "max_len": 40, "batch_size": 32},
    "train": {"epochs": 5, "lr": 1e-3, "min_lr": 1e-5, "warmup_epochs": 1, "schedule": "cosine"},
    "eval": {"mc_samples": 5},
}
_SMOKE = {"data": {"limit_train": 192, "limit_eval": 96}, "train": {"epochs": 1, "warmup_epochs": 0},
          "eval": {"mc_samples": 2}}


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


def run_demo(out_dir: str | Path = "demo_out", *, smoke: bool = False, seed: int = 0,
             methods: list[str] | None = None, progress: bool = True,
             resume: bool = False) -> str:
    """Train and evaluate each method; write the table (with a ``softmax + TS`` row), a
    reliability diagram, a risk-coverage plot and OOD score histograms under ``out_dir``;
    return the Markdown table.

    :param resume: re-use finished runs and resume interrupted ones found in ``out_dir``
        (as ``compare`` does). By default every chosen method's run folder
        ``out_dir/<method>/seed<seed>`` is removed first, so a table never mixes in results of an
        earlier version or setting.
    """
    import shutil

    from .compare import format_markdown, run_compare
    from .plotting import plot_runs

    out_dir = Path(out_dir)
    available = demo_methods()
    chosen = methods or list(available)
    unknown = [m for m in chosen if m not in available]
    if unknown:
        raise ValueError(f"unknown demo method(s) {unknown}; available: {', '.join(available)}")
    base = _merge(_BASE, _SMOKE) if smoke else _BASE
    configs = [_merge(base, {"model": _merge(base["model"], available[m])}) for m in chosen]
    for m, cfg in zip(chosen, configs):
        if m == "softmax":  # the baseline every reviewer asks for: softmax + temperature scaling
            cfg["eval"] = _merge(cfg["eval"], {"temperature_scaling": True})
    if not resume:
        for m in chosen:
            shutil.rmtree(out_dir / m / f"seed{seed}", ignore_errors=True)
    start = time.perf_counter()
    rows = run_compare(configs, [seed], out_dir, names=chosen, progress=progress)
    table = format_markdown(rows)
    pngs = plot_runs([out_dir / m / f"seed{seed}" for m in chosen], out_dir, names=chosen)
    minutes = (time.perf_counter() - start) / 60
    return (f"CoLA (official protocol: test = in_domain_dev, OOD = out_of_domain_dev), seed {seed}"
            f"{' [smoke]' if smoke else ''}\n\n{table}\n\nwrote {out_dir}/results.md, results.csv, "
            f"{', '.join(p.name for p in pngs)} ({minutes:.1f} min)")
