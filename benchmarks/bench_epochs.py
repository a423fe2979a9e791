"""Seconds per CoLA training epoch of every method over softmax's, in one run.

Each method is a shipped config of ``experiments/configs/cola/`` trained as ``gpattn-ppl
train`` does (:class:`~gpattn_ppl.run.experiment.Trainer` with ``--set`` style overrides:
``train.epochs=--epochs``, ``eval.mc_samples=1``, ``train.progress=false``, ``train.device``)
into a temporary run folder. The seconds of an epoch are the trainer's own (``seconds`` of each
``history`` row, averaged in ``results.json`` ``cost.sec_per_epoch``): the training pass only,
without validation and evaluation; with more than one epoch the first is left out (one-off
costs of the process and of the run). The configs share one data section, so the data is loaded
once. Softmax is always run first and, with other methods, again last; the reference is the
mean of the two (the machine's speed drifts over a run of several minutes).

Per method: seconds per epoch, ratio to softmax, steps per epoch, and the peak memory
(:func:`~gpattn_ppl.run.benchmarking.peak_memory`) of one training step -- the program's loss
on the first training batch and its backward, on the fast path of the fit loop -- measured
before training with the RNG state restored, so the timed run is the CLI's. Targets: every
method at most 2x softmax per epoch, CGPT at most 4x. Writes ``benchmarks/results/epochs.json``
(git revision and command line included). Nothing here is asserted by tests.

    python benchmarks/bench_epochs.py --epochs 2                   # every method (as reported)
    python benchmarks/bench_epochs.py --methods cgpt scgpt --epochs 2
    python benchmarks/bench_epochs.py --smoke                      # softmax + scgpt, 64 examples
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

import pyro
import torch

from gpattn_ppl import linalg, settings
from gpattn_ppl.run.allocator import apply_default_policy
from gpattn_ppl.run.assembly import load_bundle
from gpattn_ppl.run.benchmarking import peak_memory, provenance, write_json
from gpattn_ppl.run.config import load_config
from gpattn_ppl.run.training import Trainer

ROOT = Path(__file__).resolve().parents[1]
CONFIGS = ROOT / "experiments" / "configs" / "cola"
METHODS = ["softmax", "mc_dropout", "kernel_asym", "kernel_sym", "kep_svgp", "sgpa_decoupled",
           "sgpa", "cgpt", "scgpt", "sto_trans", "h_sto_trans"]
#: method -> the largest seconds-per-epoch ratio to softmax (default :data:`DEFAULT_TARGET`)
TARGETS = {"cgpt": 4.0}
DEFAULT_TARGET = 2.0


def step_memory(trainer: Trainer) -> dict:
    """:func:`peak_memory` of one training step (loss on the first batch of a fixed permutation,
    backward; checks off as in the fit loop's fast path), leaving the RNG and gradients as they
    were."""
    devices = [trainer.device] if trainer.device.type == "cuda" else []
    gen = torch.Generator().manual_seed(0)
    bs = trainer.cfg["data"]["batch_size"]
    index = torch.randperm(trainer.num_data, generator=gen)[:bs]
    batch = trainer.bundle.train.batch(index, train=True, generator=gen).to(trainer.device)
    program, net = trainer.program, trainer.net

    def step():
        with linalg.deferred_checks(), settings.validate_args(False), \
                pyro.validation_enabled(False):
            loss = program.loss(batch.x, batch.mask, batch.y, batch.index)
        loss.backward()

    net.train()
    net.zero_grad(set_to_none=True)
    with torch.random.fork_rng(devices=devices):
        if trainer.device.type == "cuda":
            step()  # lazy allocations (library workspaces) before the measured step
            net.zero_grad(set_to_none=True)
        r = peak_memory(step, trainer.device)
    net.zero_grad(set_to_none=True)
    return {"peak_bytes": r["peak_bytes"], "peak_mib": r["peak_bytes"] / 2**20,
            "largest_tensor": r["largest_tensor"], "batch_shape": list(batch.x.shape)}


def run_method(method: str, overrides: list[str], run_dir: Path, bundles: dict) -> dict:
    """Train ``method`` for the configured epochs into ``run_dir``; its cost."""
    path = CONFIGS / f"{method}.yaml"
    cfg = load_config(path, overrides)
    key = json.dumps(cfg["data"], sort_keys=True)
    if key not in bundles:
        bundles[key] = load_bundle(dict(cfg))
    trainer = Trainer(cfg, run_dir, bundle=bundles[key], label=method, force=True)
    memory = step_memory(trainer)
    start = time.perf_counter()
    trainer.fit()
    wall = time.perf_counter() - start
    seconds = [row["seconds"] for row in trainer.history]
    # steady state: the first epoch of a run (and of the process) pays one-off costs (lazy
    # initialisation, allocator warm-up, data-dependent inducing / centroid set-up)
    steady = seconds[1:] if len(seconds) > 1 else seconds
    return {"config": str(path.relative_to(ROOT)), "attention": dict(cfg["model"]["attention"]),
            "sec_per_epoch": sum(steady) / len(steady), "epoch_seconds": seconds,
            "first_epoch_excluded": len(seconds) > 1,
            "steps_per_epoch": trainer.steps_per_epoch, "num_train": trainer.num_data,
            "fit_wall_s": wall, "device": str(trainer.device), "step_memory": memory}


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--methods", nargs="+", choices=METHODS, default=METHODS, metavar="METHOD",
                   help=f"a subset of: {', '.join(METHODS)} (softmax is always run)")
    p.add_argument("--epochs", type=int, default=1)
    p.add_argument("--limit-train", type=int, default=None,
                   help="train on this many examples (data.limit_train; default: all of CoLA)")
    p.add_argument("--device", choices=["auto", "cpu", "cuda"], default="auto")
    p.add_argument("--threads", type=int, default=2,
                   help="torch intra-op threads (0: leave torch's default)")
    p.add_argument("--run-root", default=None,
                   help="keep the run folders here (default: a temporary folder, deleted)")
    p.add_argument("--smoke", action="store_true",
                   help="softmax and scgpt, 64 training examples, 1 epoch")
    p.add_argument("--out", default="benchmarks/results/epochs.json")
    return p


def main(argv: list[str] | None = None) -> int:
    a = build_parser().parse_args(argv)
    if a.smoke:
        a.methods, a.epochs, a.limit_train = ["softmax", "scgpt"], 1, 64
    if a.threads > 0:
        torch.set_num_threads(a.threads)
    malloc = apply_default_policy()  # as the command line does (GPATTN_PPL_MALLOC=system: off)
    methods = list(dict.fromkeys(["softmax", *a.methods]))
    overrides = [f"train.epochs={a.epochs}", "eval.mc_samples=1", "train.progress=false",
                 f"train.device={a.device}"]
    if a.limit_train is not None:
        overrides.append(f"data.limit_train={a.limit_train}")
    if a.smoke:
        overrides.append("data.limit_eval=64")
    res = {**provenance(argv, ROOT), "smoke": a.smoke, "epochs": a.epochs, "overrides": overrides,
           "malloc_keep_freed_memory": malloc,
           "targets": {m: TARGETS.get(m, DEFAULT_TARGET) for m in methods if m != "softmax"},
           "methods": {}}
    bundles: dict = {}
    with tempfile.TemporaryDirectory(prefix="bench_epochs_") as tmp:
        root = Path(a.run_root) if a.run_root else Path(tmp)
        for m in methods:
            print(f"{m} ...", flush=True)
            res["methods"][m] = run_method(m, overrides, root / m, bundles)
        if len(methods) > 1:  # softmax again at the end: the machine drifts over a long run
            print("softmax (again) ...", flush=True)
            again = run_method("softmax", overrides, root / "softmax_again", bundles)
            res["softmax_again_sec_per_epoch"] = again["sec_per_epoch"]
    first = res["methods"]["softmax"]["sec_per_epoch"]
    base = 0.5 * (first + res.get("softmax_again_sec_per_epoch", first))
    res["softmax_base_sec_per_epoch"] = base
    for m, row in res["methods"].items():
        row["ratio_to_softmax"] = row["sec_per_epoch"] / base
        row["memory_ratio_to_softmax"] = (
            row["step_memory"]["peak_bytes"] / res["methods"]["softmax"]["step_memory"]["peak_bytes"])
        target = None if m == "softmax" else TARGETS.get(m, DEFAULT_TARGET)
        row["target_ratio_max"] = target
        row["pass"] = None if target is None else row["ratio_to_softmax"] <= target
    path = write_json(res, a.out)
    print(f"{'method':15s} {'s/epoch':>9s} {'ratio':>6s} {'steps':>6s} {'step MiB':>9s}  target")
    for m, row in res["methods"].items():
        verdict = "-" if row["pass"] is None else ("PASS" if row["pass"] else "FAIL")
        print(f"{m:15s} {row['sec_per_epoch']:9.2f} {row['ratio_to_softmax']:6.2f} "
              f"{row['steps_per_epoch']:6d} {row['step_memory']['peak_mib']:9.1f}  {verdict}")
    print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
