"""Per-layer forward + backward time of h-sto-trans (and sto-trans) against softmax attention.

Setting of issue 6: B = 32, N = 64, C = 128, H = 4 (target: h_gumbel at most 1.5x softmax).
The machine may be shared, so the units are timed in interleaved rounds (softmax, then each
unit, ``--repeats`` steps each) and the reported ratio is the median over rounds of the per-round
ratio of medians; raw medians over all rounds are reported too. Writes JSON into
``benchmarks/results/``. Nothing here is asserted by tests.

    python benchmarks/bench_h_gumbel.py                   # full setting
    python benchmarks/bench_h_gumbel.py --smoke           # tiny sizes (CI)
"""

from __future__ import annotations

import argparse
import statistics
import sys

import torch

from gpattn_ppl.attention import build_attention
from gpattn_ppl.benchmarking import time_fn, write_json

SPECS = [
    {"kind": "h_gumbel", "temperature": 20.0, "centroid_temperature": 1.0, "num_centroids": 16},
    {"kind": "h_gumbel", "temperature": 20.0, "centroid_temperature": 1.0, "num_centroids": 128},
    {"kind": "h_gumbel", "temperature": 20.0, "centroid_temperature": 1.0, "num_centroids": 16,
     "centroids_per_head": True},
    {"kind": "gumbel", "temperature": 1.0},
]


def _step_fn(unit, x, mask):
    def step():
        out = unit(x, mask)
        loss = out.square().mean() + sum(v.sum() for v in unit.objective_terms().values())
        loss.backward()
        unit.zero_grad(set_to_none=True)
        x.grad = None

    return step


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--B", type=int, default=32)
    p.add_argument("--N", type=int, default=64)
    p.add_argument("--C", type=int, default=128)
    p.add_argument("--H", type=int, default=4)
    p.add_argument("--rounds", type=int, default=7)
    p.add_argument("--repeats", type=int, default=10)
    p.add_argument("--device", default="cpu")
    p.add_argument("--threads", type=int, default=1,
                   help="torch intra-op threads (1 keeps timings stable on a shared machine)")
    p.add_argument("--smoke", action="store_true")
    p.add_argument("--out", default="benchmarks/results/h_gumbel.json")
    a = p.parse_args(argv)
    if a.smoke:
        a.B, a.N, a.C, a.H, a.rounds, a.repeats = 2, 8, 16, 2, 1, 2
    if a.threads > 0:
        torch.set_num_threads(a.threads)
    device = torch.device(a.device)
    torch.manual_seed(0)
    x = torch.randn(a.B, a.N, a.C, device=device, requires_grad=True)
    mask = torch.ones(a.B, a.N, dtype=torch.bool, device=device)
    specs = [{"kind": "softmax"}] + SPECS
    steps = []
    for spec in specs:
        opts = {k: v for k, v in spec.items() if k != "kind"}
        unit = build_attention(spec["kind"], a.C, a.H, **opts).to(device).train()
        steps.append(_step_fn(unit, x, mask))
    times = [[] for _ in specs]
    for _ in range(a.rounds):
        for i, step in enumerate(steps):
            times[i].append(time_fn(step, repeats=a.repeats, warmup=2, device=device)["median_s"])
    rows = []
    for spec, ts in zip(specs, times):
        ratios = [t / s for t, s in zip(ts, times[0])]
        rows.append({"kind": spec["kind"], "options": {k: v for k, v in spec.items() if k != "kind"},
                     "median_s": statistics.median(ts), "round_medians_s": ts,
                     "ratio_to_softmax": statistics.median(ratios),
                     "ratio_min_max": [min(ratios), max(ratios)]})
    res = {"B": a.B, "N": a.N, "C": a.C, "H": a.H, "rounds": a.rounds, "repeats": a.repeats,
           "target_ratio_h_gumbel": 1.5, "layers": rows}
    path = write_json(res, a.out)
    for r in rows:
        print(f"{r['kind']:>9} {r['options']}  {1e3 * r['median_s']:.2f} ms  "
              f"x{r['ratio_to_softmax']:.2f} softmax (rounds {r['ratio_min_max'][0]:.2f}-"
              f"{r['ratio_min_max'][1]:.2f})")
    print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
