"""Stability soak: every demo method x seeds x steps on CoLA at demo size, at the default learning
rate and at 10x, counting what goes wrong.

Per run it records the steps done, non-finite losses, the failure (a named library error, e.g.
divergence or a Cholesky failure), the Cholesky jitter escalations and the largest jitter
(:func:`gpattn_ppl.linalg.numerics_stats`), the mean loss of the last 20 steps and the median
seconds per step. The model, data and schedule are the demo's (``gpattn_ppl.run.sweep``: width
64, 2 blocks, CoLA official split, batch 32, Adam with its cosine schedule; 300 steps is about
1.25 epochs). Writes JSON (strict: non-finite values are ``null``) and prints a table.

    python benchmarks/soak.py [--seeds 5] [--steps 300] [--lr-factors 1 10] [--methods ...]
        [--out benchmarks/results/soak.json]
"""

from __future__ import annotations

import argparse
import math
import statistics
import time

import torch

from gpattn_ppl import linalg
from gpattn_ppl.errors import GpattnError
from gpattn_ppl.infer import PyroProgram, epoch_clock, fit_epoch, lr_lambda
from gpattn_ppl.run.assembly import build_net, load_bundle
from gpattn_ppl.run.benchmarking import write_json
from gpattn_ppl.run.config import load_config
from gpattn_ppl.run.sweep import _BASE, _merge, demo_methods


def soak_run(cfg: dict, bundle, steps: int) -> dict:
    """``steps`` optimiser steps of one config; the record of what happened."""
    t = cfg["train"]
    torch.manual_seed(t["seed"])
    net = build_net(cfg, bundle)
    program = PyroProgram(net, len(bundle.train), t["objective"], mode=t["mode"],
                          total_epochs=t["epochs"])
    optimizer = torch.optim.Adam([p for p in net.parameters() if p.requires_grad], lr=t["lr"])
    bs = cfg["data"]["batch_size"]
    per_epoch = math.ceil(len(bundle.train) / bs)
    scheduler = torch.optim.lr_scheduler.LambdaLR(
        optimizer, lr_lambda(t["schedule"], per_epoch * t["epochs"],
                             int(round(t["warmup_epochs"] * per_epoch)), t["min_lr"] / t["lr"]))
    gen = torch.Generator().manual_seed(t["seed"])

    def batches():
        done = 0
        while done < steps:
            order = torch.randperm(len(bundle.train), generator=gen)
            for start in range(0, len(order) - bs + 1, bs):
                if done == steps:
                    return
                yield bundle.train.batch(order[start:start + bs], train=True, generator=gen)
                done += 1

    losses: list[float] = []
    times: list[float] = []
    linalg.reset_numerics_stats()
    failure = None

    class Timer:  # fit_epoch calls update(1) after each step
        last = time.perf_counter()

        def update(self, _n):
            now = time.perf_counter()
            times.append(now - Timer.last)
            Timer.last = now

    try:
        fit_epoch(program, optimizer, batches(), scheduler=scheduler, grad_clip=t["grad_clip"],
                  clock=epoch_clock(0, per_epoch), progress=Timer(), step_losses=losses,
                  epoch=0)
    except (GpattnError, FloatingPointError, RuntimeError) as err:
        failure = f"{type(err).__name__}: {str(err).splitlines()[0]}"
    stats = linalg.numerics_stats()
    finite = [v for v in losses if math.isfinite(v)]
    return {"steps": len(times), "nonfinite_losses": len(losses) - len(finite),
            "failure": failure, "escalations": stats["escalations"],
            "max_jitter": stats["max_jitter"],
            "final_loss": statistics.fmean(finite[-20:]) if finite else None,
            "sec_per_step": statistics.median(times) if times else None}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seeds", type=int, default=5)
    ap.add_argument("--steps", type=int, default=300)
    ap.add_argument("--lr-factors", type=float, nargs="+", default=[1.0, 10.0])
    ap.add_argument("--methods", nargs="+", default=None)
    ap.add_argument("--out", default="benchmarks/results/soak.json")
    args = ap.parse_args()
    methods = demo_methods()
    chosen = args.methods or list(methods)
    base = load_config(_merge(_BASE, {"train": {"progress": False}}))
    bundle = load_bundle(base)
    runs = []
    for name in chosen:
        for factor in args.lr_factors:
            for seed in range(args.seeds):
                cfg = dict(load_config(_merge(_BASE, {
                    "model": _merge(_BASE["model"], methods[name]),
                    "train": {"seed": seed, "lr": _BASE["train"]["lr"] * factor,
                              "min_lr": _BASE["train"]["min_lr"] * factor,
                              "progress": False}})))
                rec = {"method": name, "lr_factor": factor, "seed": seed,
                       **soak_run(cfg, bundle, args.steps)}
                runs.append(rec)
                print(f"{name:>12} lr x{factor:g} seed {seed}: {rec['steps']} steps, "
                      f"nonfinite {rec['nonfinite_losses']}, escalations {rec['escalations']}, "
                      f"final loss {rec['final_loss']}, failure {rec['failure']}", flush=True)
    table = []
    for name in chosen:
        for factor in args.lr_factors:
            rs = [r for r in runs if r["method"] == name and r["lr_factor"] == factor]
            finals = [r["final_loss"] for r in rs if r["final_loss"] is not None]
            table.append({
                "method": name, "lr_factor": factor, "runs": len(rs),
                "failures": sum(r["failure"] is not None for r in rs),
                "nonfinite_losses": sum(r["nonfinite_losses"] for r in rs),
                "escalations": sum(r["escalations"] for r in rs),
                "max_jitter": max((r["max_jitter"] or 0.0) for r in rs),
                "final_loss_mean": statistics.fmean(finals) if finals else None,
                "final_loss_std": statistics.stdev(finals) if len(finals) > 1 else None,
                "sec_per_step_median": statistics.median(
                    [r["sec_per_step"] for r in rs if r["sec_per_step"] is not None] or [math.nan]),
            })
    path = write_json({"command": "python benchmarks/soak.py " + " ".join(
        f"--{k.replace('_', '-')} {' '.join(map(str, v)) if isinstance(v, list) else v}"
        for k, v in vars(args).items() if v is not None), "steps": args.steps,
        "table": table, "runs": runs}, args.out)
    print("\n| method | lr x | runs | failures | non-finite losses | escalations | max jitter | "
          "final loss | s/step |\n|---|---|---|---|---|---|---|---|---|")
    for r in table:
        fl = ("–" if r["final_loss_mean"] is None else f"{r['final_loss_mean']:.3f}"
              + ("" if r["final_loss_std"] is None else f" ± {r['final_loss_std']:.3f}"))
        print(f"| {r['method']} | {r['lr_factor']:g} | {r['runs']} | {r['failures']} | "
              f"{r['nonfinite_losses']} | {r['escalations']} | {r['max_jitter']:.0e} | {fl} | "
              f"{r['sec_per_step_median']:.3f} |")
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
