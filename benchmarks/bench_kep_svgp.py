"""Per-layer forward + backward time of KEP-SVGP attention against softmax, and its scaling in N.

Setting: B = 32, N = 64, C = 128, H = 4, s = 10 (target: add merge at most 1.2x our
softmax layer), then time against N in {64, 256, 1024, 4096} with the log-log slope (target at
most 1.15 for the add merge; softmax is O(N^2)). The machine may be shared, so the units of the
ratio are timed in interleaved rounds (softmax, then each unit, ``--repeats`` steps each) and the
reported ratio is the median over rounds of the per-round ratio of medians. On CPU the headline
numbers are this thread's CPU time (``time.thread_time``; the wall clock of a shared machine also
counts waiting for a core), with the wall-clock numbers beside them. Each step is
``unit(x, mask)`` -> ``mean(out^2) + sum(terms)`` -> ``backward`` in train mode (one u draw per
sequence, KL and KSVD terms included). Writes JSON into ``benchmarks/results/``; nothing here is
asserted by tests.

    python benchmarks/bench_kep_svgp.py               # full setting (~5-10 min on one core)
    python benchmarks/bench_kep_svgp.py --smoke       # tiny sizes (CI)
"""

from __future__ import annotations

import statistics
import sys
import time

import torch

from gpattn_ppl.run.benchmarking import (
    bench_arg_parser,
    bench_device,
    loglog_slope,
    spec_step_time,
    time_against_softmax,
    time_fn,
    write_json,
)


def _specs(s: int, N: int) -> list[dict]:
    return [
        {"kind": "kep_svgp", "rank": s, "merge": "add"},
        {"kind": "kep_svgp", "rank": s, "merge": "add", "u_draws": "batch"},
        {"kind": "kep_svgp", "rank": s, "merge": "concat_features"},
        {"kind": "kep_svgp", "rank": s, "merge": "concat", "seq_len": N, "token_mixing": "low_rank"},
        {"kind": "kep_svgp", "rank": s, "merge": "concat", "seq_len": N, "token_mixing": "dense"},
    ]


def _time(fn, *, repeats: int, warmup: int, device) -> dict[str, float]:
    """Wall-clock (shared helper) and, on CPU, this thread's CPU time per step (medians).

    On a machine shared by several processes the wall clock also counts the time the process
    waits for a core; the thread CPU time does not, so it is the stabler comparison on CPU.
    """
    wall = time_fn(fn, repeats=repeats, warmup=warmup, device=device)
    out = {"wall_median_s": wall["median_s"], "wall_min_s": wall["min_s"]}
    if torch.device(device).type == "cpu":
        ts = []
        for _ in range(repeats):
            t0 = time.thread_time()
            fn()
            ts.append(time.thread_time() - t0)
        out.update(cpu_median_s=statistics.median(ts), cpu_min_s=min(ts))
    return out


def ratio_table(a, device) -> dict:
    key = "cpu_median_s" if device.type == "cpu" else "wall_median_s"
    keys = tuple(dict.fromkeys(("wall_median_s", key)))
    rows = []
    for r in time_against_softmax(_specs(a.s, a.N), B=a.B, N=a.N, dim=a.C, heads=a.H,
                                  rounds=a.rounds, repeats=a.repeats, device=device, timer=_time,
                                  keys=keys):
        row = {"kind": r["kind"], "options": r["options"]}
        for k in keys:
            row[k] = statistics.median(r["rounds"][k])
            row[f"round_{k}"] = r["rounds"][k]
            row[f"ratio_to_softmax_{k.split('_')[0]}"] = statistics.median(r["ratios"][k])
        row["ratio_to_softmax"] = row[f"ratio_to_softmax_{key.split('_')[0]}"]
        rows.append(row)
    return {"B": a.B, "N": a.N, "C": a.C, "H": a.H, "s": a.s, "rounds": a.rounds,
            "repeats": a.repeats, "layers": rows}


def scaling_table(a, device) -> dict:
    out = {}
    for name, spec in (("kep_svgp_add", {"kind": "kep_svgp", "rank": a.s, "merge": "add"}),
                       ("kep_svgp_concat_features",
                        {"kind": "kep_svgp", "rank": a.s, "merge": "concat_features"}),
                       ("softmax", {"kind": "softmax"})):
        ns = [n for n in a.scaling_ns if name != "softmax" or n <= a.softmax_max_n]
        key = "cpu_median_s" if device.type == "cpu" else "wall_median_s"
        ts = [spec_step_time(spec, a.B, n, a.C, a.H, warmup=1, device=device, timer=_time,
                             repeats=max(3, min(a.repeats, int(a.repeats * 256 / n))))
              for n in ns]
        times, walls = [t[key] for t in ts], [t["wall_median_s"] for t in ts]
        half = len(ns) // 2
        out[name] = {"N": ns, key: times, "wall_median_s": walls,
                     "loglog_slope": loglog_slope(ns, times) if len(ns) > 1 else None,
                     "loglog_slope_wall": loglog_slope(ns, walls) if len(ns) > 1 else None,
                     "loglog_slope_upper_half": (loglog_slope(ns[half:], times[half:])
                                                 if len(ns) > 3 else None)}
    return {"B": a.B, "C": a.C, "H": a.H, "s": a.s, "series": out}


def main(argv=None) -> int:
    p = bench_arg_parser(__doc__.splitlines()[0], rounds=7, repeats=10,
                         out="benchmarks/results/kep_svgp.json")
    p.add_argument("--s", type=int, default=10)
    p.add_argument("--scaling-ns", type=int, nargs="+", default=[64, 256, 1024, 4096])
    p.add_argument("--softmax-max-n", type=int, default=1024,
                   help="largest N timed for the softmax series (its memory is O(B H N^2))")
    a = p.parse_args(argv)
    if a.smoke:
        a.B, a.N, a.C, a.H, a.s, a.rounds, a.repeats = 2, 8, 16, 2, 3, 1, 2
        a.scaling_ns, a.softmax_max_n = [8, 16], 16
    device = bench_device(a)
    res = {"ratio": ratio_table(a, device), "scaling": scaling_table(a, device),
           "targets": {"ratio_add_max": 1.2, "loglog_slope_add_max": 1.15}, "smoke": a.smoke}
    path = write_json(res, a.out)
    for r in res["ratio"]["layers"]:
        print(f"{r['kind']:10s} {r['options']} wall {r['wall_median_s'] * 1e3:8.2f} ms "
              f"(ratio {r['ratio_to_softmax_wall']:.3f})  headline ratio {r['ratio_to_softmax']:.3f}")
    for name, ser in res["scaling"]["series"].items():
        print(f"{name:26s} N={ser['N']} slope {ser['loglog_slope']:.3f} "
              f"(wall clock {ser['loglog_slope_wall']:.3f})")
    print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
