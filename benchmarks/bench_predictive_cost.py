"""Test cost of trained runs: the MC predictive against the posterior-mean predictive.

For each run folder (``NAME=RUN_DIR``), its network (``best.pt``) predicts the first
``--examples`` examples of its test split twice: with ``eval.mc_samples`` sampled passes (the
deterministic prefix cached, :class:`~gpattn_ppl.models.host.PrefixCache`; a deterministic
network runs once) and with one pass at the units' posterior means (``eval.predictive: mean``);
the run named by ``--laplace`` also with its last-layer Laplace predictive (probit; the head
features of one deterministic pass, then the closed-form Kron predictive of
:class:`~gpattn_ppl.run.laplace.LastLayerLaplace`), fitted for the timing on the first
``--laplace-fit`` training examples with a fixed prior precision (the predictive's cost does
not depend on either).
Every (run, predictive) pair is timed once per round, all of them interleaved in each round, so
that machine load affects them alike. The JSON has, per pair, the median, min and max of the
ms per example over the rounds and the ratio of its median to the reference's (the first run's
MC predictive: put softmax first).

    python benchmarks/bench_predictive_cost.py --runs softmax=runs/finetune_clinc150/softmax/seed0 \\
        sgpa=runs/finetune_clinc150/sgpa/seed0 --laplace softmax --examples 500 --rounds 3 \\
        --out benchmarks/results/predictive_cost_clinc150.json
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch

from gpattn_ppl.infer import predict
from gpattn_ppl.run.assembly import load_bundle
from gpattn_ppl.run.benchmarking import write_json
from gpattn_ppl.run.predictor import load_run


def load(run_dir: str):
    """The run's Pyro program (``best.pt`` weights, :func:`~gpattn_ppl.run.predictor.load_run`),
    its data bundle, ``eval.mc_samples`` and evaluation batch size."""
    predictor = load_run(run_dir, temperature=False)
    cfg = predictor.config
    return (predictor.program, load_bundle(cfg), cfg["eval"]["mc_samples"],
            cfg["data"]["eval_batch_size"])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--runs", nargs="+", required=True, metavar="NAME=RUN_DIR")
    ap.add_argument("--examples", type=int, default=500)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--laplace", default=None, metavar="NAME",
                    help="also time the last-layer Laplace predictive of this run")
    ap.add_argument("--laplace-fit", type=int, default=2000, metavar="N")
    ap.add_argument("--out", required=True)
    args = ap.parse_args()
    pairs = [r.split("=", 1) for r in args.runs]
    if any(len(p) != 2 for p in pairs):
        ap.error("--runs takes NAME=RUN_DIR")
    if args.laplace is not None and args.laplace not in dict(pairs):
        ap.error(f"--laplace {args.laplace}: not one of the --runs names")
    loaded = {name: load(path) for name, path in pairs}
    jobs = {}
    for name, (program, bundle, T, bs) in loaded.items():
        n = min(args.examples, len(bundle.test))
        test = bundle.test.subset(torch.arange(n))
        for mode in ("mc", "mean"):
            if mode == "mean" and not program.net.stochastic:
                continue   # a deterministic network has one predictive
            jobs[(name, mode)] = (program, test, T, bs, mode)      # T: MC passes
        if name == args.laplace:
            from gpattn_ppl.run.laplace import fit_last_layer_laplace

            fit = bundle.train.subset(torch.arange(min(args.laplace_fit, len(bundle.train))))
            lla = fit_last_layer_laplace(program.net, fit, prior=1.0, batch_size=bs)
            jobs[(name, "lla")] = (program, test, lla, bs, "lla")  # the fitted predictive

    def run(job) -> float:
        from gpattn_ppl.run.laplace import head_features

        program, test, arg, bs, mode = job
        t0 = time.perf_counter()
        with torch.random.fork_rng():
            torch.manual_seed(0)
            if mode == "lla":
                arg.predict(*head_features(program.net, test, batch_size=bs), batch_size=bs)
            else:
                predict(program, test, num_samples=arg, batch_size=bs, mean=mode == "mean")
        return 1e3 * (time.perf_counter() - t0) / len(test)

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
        row = {"passes": T if mode == "mc" and program.net.stochastic else 1,
               "ms_per_example_median": statistics.median(ts), "ms_min": min(ts),
               "ms_max": max(ts), "ratio_to_reference": statistics.median(ts) / ref}
        res["rows"][f"{name}/{mode}"] = row
        print(f"{name:>12} {mode:>4}: {row['ms_per_example_median']:.2f} ms/example "
              f"[{row['ms_min']:.2f}, {row['ms_max']:.2f}], {row['ratio_to_reference']:.2f}x")
    print(f"wrote {write_json(res, args.out)}")


if __name__ == "__main__":
    main()
