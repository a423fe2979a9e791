"""Per-layer forward + backward time of CGPT and SCGPT attention against softmax, and scaling in N.

Setting of issue 5: B = 32, N = 64, C = 128, H = 4 (targets: CGPT at most 6x our softmax layer,
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

import argparse
import statistics
import sys

import torch

from gpattn_ppl.attention import build_attention
from gpattn_ppl.benchmarking import loglog_slope, time_fn, write_json

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


def _step_fn(unit, x, mask):
    def step():
        out = unit(x, mask)
        loss = out.square().mean() + sum(v.sum() for v in unit.objective_terms().values())
        loss.backward()
        unit.zero_grad(set_to_none=True)
        x.grad = None

    return step


def _build(spec: dict, C: int, H: int, device):
    opts = {k: v for k, v in spec.items() if k != "kind"}
    return build_attention(spec["kind"], C, H, **opts).to(device).train()


def _inputs(B: int, N: int, C: int, device):
    g = torch.Generator().manual_seed(0)
    x = torch.randn(B, N, C, generator=g).to(device).requires_grad_(True)
    return x, torch.ones(B, N, dtype=torch.bool, device=device)


def ratio_table(a, device) -> dict:
    x, mask = _inputs(a.B, a.N, a.C, device)
    specs = [{"kind": "softmax"}] + RATIO_SPECS
    torch.manual_seed(0)
    steps = [_step_fn(_build(spec, a.C, a.H, device), x, mask) for spec in specs]
    times = [[] for _ in specs]
    for _ in range(a.rounds):
        for i, step in enumerate(steps):
            times[i].append(time_fn(step, repeats=a.repeats, warmup=2, device=device)["median_s"])
    rows = []
    for spec, ts in zip(specs, times):
        ratios = [t / b for t, b in zip(ts, times[0])]
        rows.append({"kind": spec["kind"], "options": {k: v for k, v in spec.items() if k != "kind"},
                     "median_s": statistics.median(ts), "round_medians_s": ts,
                     "ratio_to_softmax": statistics.median(ratios)})
    return {"B": a.B, "N": a.N, "C": a.C, "H": a.H, "rounds": a.rounds, "repeats": a.repeats,
            "layers": rows}


def scaling_table(a, device) -> dict:
    out = {}
    for name, spec in SCALING_SPECS.items():
        ns, times = list(a.scaling_ns), []
        for n in ns:
            torch.manual_seed(0)
            x, mask = _inputs(a.scaling_B, n, a.C, device)
            unit = _build(spec, a.C, a.H, device)
            reps = max(2, min(a.repeats, int(a.repeats * 64 / n)))
            times.append(time_fn(_step_fn(unit, x, mask), repeats=reps, warmup=1,
                                 device=device)["median_s"])
            del unit, x, mask
        out[name] = {"N": ns, "median_s": times,
                     "loglog_slope": loglog_slope(ns, times) if len(ns) > 1 else None,
                     "loglog_slope_last_two": (loglog_slope(ns[-2:], times[-2:])
                                               if len(ns) > 2 else None)}
    return {"B": a.scaling_B, "C": a.C, "H": a.H, "series": out}


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--B", type=int, default=32)
    p.add_argument("--N", type=int, default=64)
    p.add_argument("--C", type=int, default=128)
    p.add_argument("--H", type=int, default=4)
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--scaling-ns", type=int, nargs="+", default=[64, 256, 1024])
    p.add_argument("--scaling-B", type=int, default=4)
    p.add_argument("--device", default="cpu")
    p.add_argument("--threads", type=int, default=1,
                   help="torch intra-op threads (1 keeps timings stable on a shared machine)")
    p.add_argument("--no-scaling", action="store_true", help="only the ratio table")
    p.add_argument("--smoke", action="store_true")
    p.add_argument("--out", default="benchmarks/results/cgpt.json")
    a = p.parse_args(argv)
    if a.smoke:
        a.B, a.N, a.C, a.H, a.rounds, a.repeats = 2, 8, 16, 2, 1, 2
        a.scaling_ns, a.scaling_B = [8, 16, 32], 2
    if a.threads > 0:
        torch.set_num_threads(a.threads)
    device = torch.device(a.device)
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
