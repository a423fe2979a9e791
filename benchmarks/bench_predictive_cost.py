"""Test cost of trained runs: the MC predictive against the posterior-mean predictive.

For each run folder (``NAME=RUN_DIR``), its network (``best.pt``) predicts the first
``--examples`` examples of its test split twice: with ``eval.mc_samples`` sampled passes (the
deterministic prefix cached, :class:`~gpattn_ppl.models.host.PrefixCache`; a deterministic
network runs once) and with one pass at the units' posterior means (``eval.predictive: mean``).
Every (run, predictive) pair is timed once per round, all of them interleaved in each round, so
that machine load affects them alike. The JSON has, per pair, the median, min and max of the
ms per example over the rounds and the ratio of its median to the reference's (the first run's
MC predictive: put softmax first).

    python benchmarks/bench_predictive_cost.py --runs softmax=runs/finetune_clinc150/softmax/seed0 \\
        sgpa=runs/finetune_clinc150/sgpa/seed0 --examples 500 --rounds 3 \\
        --out benchmarks/results/predictive_cost_clinc150.json
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch

from gpattn_ppl.infer import PyroProgram, predict
from gpattn_ppl.run.assembly import build_net, load_bundle
from gpattn_ppl.run.benchmarking import write_json
from gpattn_ppl.run.runfolder import open_run


def load(run_dir: str):
    """The run's Pyro program (``best.pt`` weights), its test split and ``eval.mc_samples``."""
    folder = open_run(run_dir)
    cfg = dict(folder.config)
    net = build_net(cfg, folder.manifest["sizes"])
    folder.load_weights(net, "best.pt", map_location="cpu")
    net.eval()
    program = PyroProgram(net, 1, cfg["train"]["objective"], mode=cfg["train"]["mode"],
                          total_epochs=cfg["train"]["epochs"])
    return program, load_bundle(cfg).test, cfg["eval"]["mc_samples"], cfg["data"]["eval_batch_size"]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--runs", nargs="+", required=True, metavar="NAME=RUN_DIR")
    ap.add_argument("--examples", type=int, default=500)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--out", required=True)
    args = ap.parse_args()
    pairs = [r.split("=", 1) for r in args.runs]
    if any(len(p) != 2 for p in pairs):
        ap.error("--runs takes NAME=RUN_DIR")
    loaded = {name: load(path) for name, path in pairs}
    jobs = {}
    for name, (program, test, T, bs) in loaded.items():
        n = min(args.examples, len(test))
        for mode in ("mc", "mean"):
            if mode == "mean" and not program.net.stochastic:
                continue   # a deterministic network has one predictive
            jobs[(name, mode)] = (program, test, T, bs, n, mode == "mean")

    def run(job) -> float:
        program, test, T, bs, n, mean = job
        t0 = time.perf_counter()
        with torch.random.fork_rng():
            torch.manual_seed(0)
            predict(program, test, num_samples=T, batch_size=bs, limit=n, mean=mean)
        return 1e3 * (time.perf_counter() - t0) / n

    for job in jobs.values():     # warm-up
        run(job)
    times = {key: [] for key in jobs}
    for _ in range(args.rounds):
        for key, job in jobs.items():
            times[key].append(run(job))
    ref = statistics.median(times[next(iter(jobs))])
    res = {"examples": args.examples, "rounds": args.rounds,
           "reference": "/".join(next(iter(jobs))), "runs": dict(pairs), "rows": {}}
    for (name, mode), ts in times.items():
        program, _, T, *_ = jobs[(name, mode)]
        row = {"passes": 1 if mode == "mean" or not program.net.stochastic else T,
               "ms_per_example_median": statistics.median(ts), "ms_min": min(ts),
               "ms_max": max(ts), "ratio_to_reference": statistics.median(ts) / ref}
        res["rows"][f"{name}/{mode}"] = row
        print(f"{name:>12} {mode:>4}: {row['ms_per_example_median']:.2f} ms/example "
              f"[{row['ms_min']:.2f}, {row['ms_max']:.2f}], {row['ratio_to_reference']:.2f}x")
    print(f"wrote {write_json(res, args.out)}")


if __name__ == "__main__":
    main()
