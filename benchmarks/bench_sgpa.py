"""SGPA speed: per-layer forward + backward against softmax, and time against sequence length.

Writes ``benchmarks/results/sgpa.json`` with

* ``layer``: B = 32, N = 64, C = 128, H = 4, M = 16: softmax, decoupled SGPA (full and diagonal
  covariance) and standard SGPA, each as a ratio to the softmax layer of the same run (the
  target: decoupled at most 3x softmax);
* ``scaling``: time against N in {64, 256, 1024} (batch ``--sweep-batch``, default 4 so that
  the standard form's ``[B, H, N, N]`` factorisations fit in memory at N = 1024) for both forms
  and softmax, with least-squares log-log slopes.

Ratios use medians and minima of ``--repeats`` timed steps after warm-up (minima are the robust
statistic on a shared machine). Nothing here is asserted by tests.

Usage::

    python benchmarks/bench_sgpa.py                 # full run
    python benchmarks/bench_sgpa.py --smoke         # seconds: tiny sizes, no JSON written
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

import torch

from gpattn_ppl.run.benchmarking import loglog_slope, spec_step_time, write_json

FORMS = {
    "softmax": {"kind": "softmax"},
    "sgpa_decoupled": {"kind": "sgpa", "variant": "decoupled", "num_inducing": 16},
    "sgpa_decoupled_diag": {"kind": "sgpa", "variant": "decoupled", "num_inducing": 16,
                            "cov": "diag"},
    "sgpa_standard": {"kind": "sgpa", "variant": "standard"},
}


def _time(spec: dict, B: int, N: int, C: int, H: int, repeats: int) -> dict:
    if spec["kind"] == "sgpa" and spec.get("variant") == "standard":
        spec = {**spec, "max_len": max(N, 128)}
    return spec_step_time(spec, B, N, C, H, repeats=repeats)


def run(B: int, N: int, C: int, H: int, ns: list[int], sweep_batch: int, repeats: int,
        sweep_repeats: int) -> dict:
    layer = {name: _time(spec, B, N, C, H, repeats) for name, spec in FORMS.items()}
    base = layer["softmax"]
    for r in layer.values():
        r["ratio_to_softmax_median"] = r["median_s"] / base["median_s"]
        r["ratio_to_softmax_min"] = r["min_s"] / base["min_s"]
    scaling = {}
    for name in ("softmax", "sgpa_decoupled", "sgpa_standard"):
        rows = []
        for n in ns:
            t0 = time.perf_counter()
            rows.append({"N": n, **_time(FORMS[name], sweep_batch, n, C, H, sweep_repeats)})
            print(f"{name:>16s} N={n:5d}: {rows[-1]['min_s']:.4f} s "
                  f"({time.perf_counter() - t0:.0f} s wall)", flush=True)
        scaling[name] = {
            "rows": rows,
            "loglog_slope_median": loglog_slope(ns, [r["median_s"] for r in rows]),
            "loglog_slope_min": loglog_slope(ns, [r["min_s"] for r in rows]),
            # local slopes between consecutive N (the last one shows the asymptotic order)
            "segment_slopes_min": [loglog_slope(ns[i:i + 2], [rows[i]["min_s"], rows[i + 1]["min_s"]])
                                   for i in range(len(ns) - 1)],
        }
    return {"B": B, "N": N, "C": C, "H": H, "M": 16, "threads": torch.get_num_threads(),
            "layer": layer, "scaling": {"B": sweep_batch, "N": ns, "forms": scaling}}


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeats", type=int, default=20)
    ap.add_argument("--sweep-repeats", type=int, default=3)
    ap.add_argument("--sweep-batch", type=int, default=4)
    ap.add_argument("--ns", type=int, nargs="+", default=[64, 256, 1024])
    ap.add_argument("--threads", type=int, default=None, help="torch.set_num_threads")
    ap.add_argument("--out", default=str(Path(__file__).parent / "results" / "sgpa.json"))
    ap.add_argument("--smoke", action="store_true", help="tiny sizes, print only")
    args = ap.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    if args.smoke:
        res = run(4, 16, 32, 4, [8, 16, 32], 2, 2, 1)
        for name, r in res["layer"].items():
            print(f"{name:>20s} {r['median_s']:.4f} s  x{r['ratio_to_softmax_median']:.2f}")
        return
    res = run(32, 64, 128, 4, args.ns, args.sweep_batch, args.repeats, args.sweep_repeats)
    path = write_json(res, args.out)
    for name, r in res["layer"].items():
        print(f"{name:>20s} median {r['median_s']:.4f} s (x{r['ratio_to_softmax_median']:.2f}), "
              f"min {r['min_s']:.4f} s (x{r['ratio_to_softmax_min']:.2f})")
    for name, s in res["scaling"]["forms"].items():
        seg = ", ".join(f"{v:.2f}" for v in s["segment_slopes_min"])
        print(f"{name:>20s} log-log slope {s['loglog_slope_min']:.2f} (min) "
              f"{s['loglog_slope_median']:.2f} (median); segments {seg}")
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
