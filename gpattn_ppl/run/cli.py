"""Command line: ``gpattn-ppl train | evaluate | compare | bench | demo``."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

__all__ = ["main"]


def _train(args) -> int:
    from .config import load_config
    from .experiment import Trainer

    out = Path(args.out) if args.out else Path("runs") / Path(args.config).stem
    results = Trainer(load_config(args.config, args.set), out).fit()
    print(json.dumps({"run_dir": str(out), "test": results["test"],
                      "ood": {k: v["classification"] for k, v in results["ood"].items()},
                      "cost": results["cost"]}, indent=1))
    return 0


def _evaluate(args) -> int:
    from .experiment import evaluate_run

    results = evaluate_run(args.run_dir, ood=args.ood)
    print(json.dumps({"test": results["test"], "ood": results["ood"]}, indent=1))
    return 0


def _compare(args) -> int:
    from .compare import format_markdown, run_compare

    rows = run_compare(args.configs, args.seeds, args.out, overrides=args.set,
                       ensemble=args.ensemble, progress=not args.no_progress)
    print(format_markdown(rows))
    print(f"\nwrote {args.out}/results.md and results.csv")
    return 0


def _bench(args) -> int:
    from .benchmarking import bench_layers, write_json

    kinds = [json.loads(k) if k.startswith("{") else {"kind": k} for k in args.kinds]
    res = bench_layers(kinds, B=args.B, N=args.N, dim=args.C, heads=args.H, repeats=args.repeats,
                       device=args.device)
    path = write_json(res, args.out)
    for r in res["layers"]:
        print(f"{r['kind']:>12} {r['options']}  {1e3 * r['median_s']:.2f} ms  "
              f"x{r['ratio_to_softmax']:.2f} softmax")
    print(f"wrote {path}")
    return 0


def _demo(args) -> int:
    from .demo import run_demo

    print(run_demo(args.out, smoke=args.smoke, seed=args.seed, methods=args.methods,
                   progress=not args.no_progress, resume=args.resume))
    return 0


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="gpattn-ppl", description=__doc__)
    sub = p.add_subparsers(dest="command", required=True)

    t = sub.add_parser("train", help="train one config into a run directory (resumes if present)")
    t.add_argument("config")
    t.add_argument("--set", nargs="*", default=[], metavar="KEY.PATH=VALUE")
    t.add_argument("--out", default=None)
    t.set_defaults(fn=_train)

    e = sub.add_parser("evaluate", help="re-evaluate a run directory's best checkpoint")
    e.add_argument("run_dir")
    e.add_argument("--ood", nargs="*", default=None)
    e.set_defaults(fn=_evaluate)

    c = sub.add_parser("compare", help="train configs x seeds, write a mean ± std table")
    c.add_argument("configs", nargs="+")
    c.add_argument("--seeds", nargs="+", type=int, default=[0, 1, 2])
    c.add_argument("--set", nargs="*", default=[], metavar="KEY.PATH=VALUE")
    c.add_argument("--out", default="compare_out")
    c.add_argument("--ensemble", type=int, default=0, help="also report the ensemble of K seeds")
    c.add_argument("--no-progress", action="store_true")
    c.set_defaults(fn=_compare)

    b = sub.add_parser("bench", help="forward+backward time of attention units vs softmax (JSON)")
    b.add_argument("kinds", nargs="*", default=["softmax", "kernel"],
                   help="kinds, or JSON specs like '{\"kind\": \"kernel\", \"symmetric\": true}'")
    b.add_argument("--B", type=int, default=32)
    b.add_argument("--N", type=int, default=64)
    b.add_argument("--C", type=int, default=128)
    b.add_argument("--H", type=int, default=4)
    b.add_argument("--repeats", type=int, default=20)
    b.add_argument("--device", default="cpu")
    b.add_argument("--out", default="benchmarks/results/layers.json")
    b.set_defaults(fn=_bench)

    d = sub.add_parser("demo", help="train + evaluate every registered unit on bundled CoLA")
    d.add_argument("--out", default="demo_out")
    d.add_argument("--smoke", action="store_true", help="tiny run (CI)")
    d.add_argument("--seed", type=int, default=0)
    d.add_argument("--methods", nargs="*", default=None)
    d.add_argument("--no-progress", action="store_true")
    d.add_argument("--resume", action="store_true",
                   help="re-use finished / resume interrupted runs in --out (default: start afresh)")
    d.set_defaults(fn=_demo)
    return p


def main(argv: list[str] | None = None) -> int:
    """Entry point of the ``gpattn-ppl`` console script.

    :param argv: arguments (default: ``sys.argv[1:]``).
    :returns: the exit status; 2 on a user error (bad config, missing file, ...), whose message
        is printed to stderr.
    """
    args = build_parser().parse_args(argv)
    try:
        return args.fn(args)
    except (ValueError, FileNotFoundError, RuntimeError) as err:
        print(f"gpattn-ppl {args.command}: error: {err}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
