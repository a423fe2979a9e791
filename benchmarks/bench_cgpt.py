"""Per-layer forward + backward time of CGPT and SCGPT attention against softmax, and scaling in N.

Setting: B = 32, N = 64, C = 128, H = 4 (targets: CGPT at most 6x our softmax layer,
SCGPT with m = l = 16 inducing inputs at most 3x), then time against N in {64, 256, 1024} with
log-log slopes (target: SCGPT below 3; CGPT is O(N^3)). Each step is ``unit(x, mask)`` ->
``mean(out^2) + sum(terms)`` -> ``backward`` in train mode: one joint sample per (b, h) and the
CGP regulariser included (``cgp_loss`` as configured). The machine may be shared, so the units of
the ratio table are timed in interleaved rounds (softmax, then each unit, ``--repeats`` steps
each) and the reported ratio is the median over rounds of the per-round ratio of medians. The
scaling series use a smaller batch (``--scaling-B``, default 4) so that CGPT's
``[B, H, N, N]`` factors fit at N = 1024. Writes JSON into ``benchmarks/results/``; nothing here
is asserted by tests.

    python benchmarks/bench_cgpt.py                 # full setting
    python benchmarks/bench_cgpt.py --smoke         # tiny sizes (CI)
"""

from __future__ import annotations

import sys

from gpattn_ppl.run.benchmarking import (
    bench_arg_parser,
    bench_device,
    loglog_slope,
    round_summary,
    spec_step_time,
    time_against_softmax,
    write_json,
)

RATIO_SPECS = [
    {"kind": "cgpt"},                                   # jensen regulariser (paper)
    {"kind": "cgpt", "cgp_loss": "none"},               # predictive only
    {"kind": "scgpt", "num_inducing": 16},              # exact K_o in the regulariser
    {"kind": "scgpt", "num_inducing": 16, "k_o": "nystrom"},
    {"kind": "scgpt", "num_inducing": 16, "cgp_loss": "none"},
]

SCALING_SPECS = {
    "softmax": {"kind": "softmax"},
    "cgpt": {"kind": "cgpt"},
    "scgpt_m16": {"kind": "scgpt", "num_inducing": 16},
    "scgpt_m16_nystrom": {"kind": "scgpt", "num_inducing": 16, "k_o": "nystrom"},
}


def ratio_table(a, device) -> dict:
    rows = time_against_softmax(RATIO_SPECS, B=a.B, N=a.N, dim=a.C, heads=a.H, rounds=a.rounds,
                                repeats=a.repeats, device=device)
    return {"B": a.B, "N": a.N, "C": a.C, "H": a.H, "rounds": a.rounds, "repeats": a.repeats,
            "layers": [round_summary(r) for r in rows]}


def scaling_table(a, device) -> dict:
    out = {}
    for name, spec in SCALING_SPECS.items():
        ns = list(a.scaling_ns)
        times = [spec_step_time(spec, a.scaling_B, n, a.C, a.H, warmup=1, device=device,
                                repeats=max(2, min(a.repeats, int(a.repeats * 64 / n))))["median_s"]
                 for n in ns]
        out[name] = {"N": ns, "median_s": times,
                     "loglog_slope": loglog_slope(ns, times) if len(ns) > 1 else None,
                     "loglog_slope_last_two": (loglog_slope(ns[-2:], times[-2:])
                                               if len(ns) > 2 else None)}
    return {"B": a.scaling_B, "C": a.C, "H": a.H, "series": out}


def main(argv=None) -> int:
    p = bench_arg_parser(__doc__.splitlines()[0], rounds=5, repeats=5,
                         out="benchmarks/results/cgpt.json")
    p.add_argument("--scaling-ns", type=int, nargs="+", default=[64, 256, 1024])
    p.add_argument("--scaling-B", type=int, default=4)
    p.add_argument("--no-scaling", action="store_true", help="only the ratio table")
    a = p.parse_args(argv)
    if a.smoke:
        a.B, a.N, a.C, a.H, a.rounds, a.repeats = 2, 8, 16, 2, 1, 2
        a.scaling_ns, a.scaling_B = [8, 16, 32], 2
    device = bench_device(a)
    res = {"ratio": ratio_table(a, device),
           "scaling": None if a.no_scaling else scaling_table(a, device),
           "targets": {"cgpt_ratio_max": 6.0, "scgpt_m16_ratio_max": 3.0,
                       "scgpt_loglog_slope_max": 3.0},
           "smoke": a.smoke}
    path = write_json(res, a.out)
    for r in res["ratio"]["layers"]:
        print(f"{r['kind']:8s} {str(r['options']):45s} median {r['median_s'] * 1e3:9.2f} ms  "
              f"ratio {r['ratio_to_softmax']:.2f}")
    for name, ser in (res["scaling"] or {"series": {}})["series"].items():
        print(f"{name:20s} N={ser['N']} s={[round(t, 4) for t in ser['median_s']]} "
              f"slope {ser['loglog_slope']:.2f}")
    print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
