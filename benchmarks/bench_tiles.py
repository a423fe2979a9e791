"""Tiled against untiled attention over keys: time and peak memory of one train step.

For each unit of ``--units`` and N of ``--ns`` (batch ``--tokens // N``, C = 128, H = 4), one
train step (forward + backward, objective terms; :func:`~gpattn_ppl.run.benchmarking.train_step`)
with :class:`~gpattn_ppl.settings.attention_tiles` ``"off"`` and ``"on"`` on the same unit and
input, timed in interleaved rounds in one process (ratio tiled / untiled per round, median and
spread), and the peak tensor memory of one step of each
(:func:`~gpattn_ppl.run.benchmarking.peak_memory`). The tiled output is checked against the
untiled one (max abs difference of the step's output, recorded; for the Gumbel units under
``posterior_mean``, as their draws differ with more than one tile). Writes
``benchmarks/results/item4_tiles_cpu.json``; nothing is asserted.

    python benchmarks/bench_tiles.py --threads 1
    python benchmarks/bench_tiles.py --smoke
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
from pathlib import Path

import torch

from gpattn_ppl import settings
from gpattn_ppl.run.benchmarking import (
    bench_device,
    build_unit,
    layer_inputs,
    peak_memory,
    provenance,
    time_fn,
    train_step,
    write_json,
)

SPECS = {"kernel_asym": {"kind": "kernel"}, "kernel_sym": {"kind": "kernel", "symmetric": True},
         "kernel_raw": {"kind": "kernel", "normalize": False, "kernel": "canonical"},
         "gumbel": {"kind": "gumbel"}, "h_gumbel": {"kind": "h_gumbel", "num_centroids": 16}}


def _with(mode: str, step):
    def run():
        with settings.attention_tiles(mode):
            step()
    return run


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--units", nargs="+", choices=list(SPECS), default=["kernel_asym", "gumbel"])
    p.add_argument("--ns", type=int, nargs="+", default=[256, 512, 1024])
    p.add_argument("--tokens", type=int, default=2048, help="B * N")
    p.add_argument("--C", type=int, default=128)
    p.add_argument("--H", type=int, default=4)
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--device", choices=["cpu", "cuda"], default="cpu")
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--smoke", action="store_true")
    p.add_argument("--out", default=None)
    a = p.parse_args(argv)
    if a.smoke:
        a.ns, a.tokens, a.C, a.H, a.rounds, a.repeats = [16, 32], 64, 16, 2, 1, 1
    out = a.out or (str(Path(tempfile.gettempdir()) / "tiles_smoke.json") if a.smoke
                    else "benchmarks/results/item4_tiles_cpu.json")
    device = bench_device(a)
    rows = []
    for u in a.units:
        for n in a.ns:
            B = max(1, a.tokens // n)
            torch.manual_seed(0)
            unit = build_unit(SPECS[u], a.C, a.H, device=device)
            x, mask = layer_inputs(B, n, a.C, device=device)
            with torch.no_grad(), settings.posterior_mean():
                outs = {}
                for mode in ("off", "on"):
                    with settings.attention_tiles(mode):
                        outs[mode] = unit(x, mask)
            steps = {m: _with(m, train_step(unit, x, mask)) for m in ("off", "on")}
            times = {m: [] for m in steps}
            for _ in range(a.rounds):
                for m, f in steps.items():
                    times[m].append(time_fn(f, repeats=a.repeats, warmup=1,
                                            device=device)["median_s"])
            ratio = [t / f for t, f in zip(times["on"], times["off"])]
            peaks = {m: peak_memory(f, device)["peak_bytes"] for m, f in steps.items()}
            row = {"unit": u, "spec": SPECS[u], "N": n, "B": B,
                   "untiled_s": statistics.median(times["off"]),
                   "tiled_s": statistics.median(times["on"]),
                   "tiled_over_untiled": {"median": statistics.median(ratio), "min": min(ratio),
                                          "max": max(ratio)},
                   "peak_mib": {m: v / 2**20 for m, v in peaks.items()},
                   "max_abs_diff": float((outs["on"] - outs["off"]).abs().max())}
            rows.append(row)
            print(f"{u:12s} N={n:5d} B={B:3d} untiled {row['untiled_s'] * 1e3:8.1f} ms tiled "
                  f"{row['tiled_s'] * 1e3:8.1f} ms ratio {row['tiled_over_untiled']['median']:.2f}"
                  f"  peak MiB {row['peak_mib']['off']:.1f} -> {row['peak_mib']['on']:.1f}"
                  f"  |diff| {row['max_abs_diff']:.1e}", flush=True)
    res = {**provenance(argv, Path(__file__).resolve().parents[1]), "device": str(device),
           "threads": torch.get_num_threads(), "rounds": a.rounds, "repeats": a.repeats,
           "rows": rows}
    print(f"wrote {write_json(res, out)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
