"""Per-layer forward + backward time of h-sto-trans (and sto-trans) against softmax attention.

Setting: B = 32, N = 64, C = 128, H = 4 (target: h_gumbel at most 1.5x softmax).
The machine may be shared, so the units are timed in interleaved rounds (softmax, then each
unit, ``--repeats`` steps each) and the reported ratio is the median over rounds of the per-round
ratio of medians; raw medians over all rounds are reported too. Writes JSON into
``benchmarks/results/``. Nothing here is asserted by tests.

    python benchmarks/bench_h_gumbel.py                   # full setting
    python benchmarks/bench_h_gumbel.py --smoke           # tiny sizes (CI)
"""

from __future__ import annotations

import sys

from gpattn_ppl.run.benchmarking import (
    bench_arg_parser,
    bench_device,
    round_summary,
    time_against_softmax,
    write_json,
)

SPECS = [
    {"kind": "h_gumbel", "temperature": 20.0, "centroid_temperature": 1.0, "num_centroids": 16},
    {"kind": "h_gumbel", "temperature": 20.0, "centroid_temperature": 1.0, "num_centroids": 128},
    {"kind": "h_gumbel", "temperature": 20.0, "centroid_temperature": 1.0, "num_centroids": 16,
     "centroids_per_head": True},
    {"kind": "gumbel", "temperature": 1.0},
]


def main(argv=None) -> int:
    p = bench_arg_parser(__doc__.splitlines()[0], rounds=7, repeats=10,
                         out="benchmarks/results/h_gumbel.json")
    a = p.parse_args(argv)
    if a.smoke:
        a.B, a.N, a.C, a.H, a.rounds, a.repeats = 2, 8, 16, 2, 1, 2
    device = bench_device(a)
    rows = []
    for r in time_against_softmax(SPECS, B=a.B, N=a.N, dim=a.C, heads=a.H, rounds=a.rounds,
                                  repeats=a.repeats, device=device):
        ratios = r["ratios"]["median_s"]
        rows.append({**round_summary(r), "ratio_min_max": [min(ratios), max(ratios)]})
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
