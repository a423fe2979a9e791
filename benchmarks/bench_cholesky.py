"""Blocked Cholesky against LAPACK: the crossover behind ``settings.blocked_cholesky("auto")``.

For each dtype, matrix size n and batch, times (interleaved rounds, one process) the two ways
:func:`gpattn_ppl.linalg.cholesky_factors` can form ``(L, L^{-1})`` of ``[batch, n, n]`` SPD
matrices:

* ``lapack``: ``torch.linalg.cholesky_ex`` (one LAPACK call per matrix) and one triangular
  solve against I (the library's path with ``blocked_cholesky("off")``);
* ``blocked@b``: :func:`gpattn_ppl.linalg._blocked` with base case ``b`` (recursive 2 x 2 blocks,
  batched products around LAPACK base cases), for each ``b`` of ``--bases`` below n;

and ``lapack_chol`` (the factor alone, what :func:`~gpattn_ppl.linalg.cholesky` costs when no
inverse is needed). A row's ``speedup`` is LAPACK's median time over the blocked one's (> 1:
blocked faster), median over rounds of the per-round ratio. Writes
``benchmarks/results/item4_cholesky_cpu.json``; prints a table. Nothing here is asserted.

    python benchmarks/bench_cholesky.py --threads 1
    python benchmarks/bench_cholesky.py --smoke
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
from pathlib import Path

import torch

from gpattn_ppl import linalg
from gpattn_ppl.run.benchmarking import bench_device, provenance, time_fn, write_json

#: (n, batches) of the default grid: what the units factorise (CGPT / SGPA [B, H, N, N] at
#: N = 64-256 with B H = 8-512, and B H = 8 at N = 1024)
GRID = [(64, [8, 128, 512]), (128, [8, 128, 512]), (256, [8, 32, 128]), (512, [8, 32]),
        (1024, [8])]


def _spd(batch: int, n: int, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    g = torch.Generator().manual_seed(0)
    X = torch.randn(batch, n, n, generator=g, dtype=dtype)
    return (X @ X.mT / n + 0.1 * torch.eye(n, dtype=dtype)).to(device)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--dtypes", nargs="+", choices=["float32", "float64"],
                   default=["float32", "float64"])
    p.add_argument("--bases", type=int, nargs="+", default=[64, 128, 256])
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--device", choices=["cpu", "cuda"], default="cpu")
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--smoke", action="store_true", help="n in 16 32, batch 4, one round")
    p.add_argument("--out", default=None)
    a = p.parse_args(argv)
    grid = [(16, [4]), (32, [4])] if a.smoke else GRID
    bases = [8] if a.smoke else a.bases
    rounds = 1 if a.smoke else a.rounds
    out = a.out or (str(Path(tempfile.gettempdir()) / "cholesky_smoke.json") if a.smoke
                    else "benchmarks/results/item4_cholesky_cpu.json")
    device = bench_device(a)
    rows = []
    for dt in a.dtypes:
        dtype = getattr(torch, dt)
        for n, batches in grid:
            for batch in batches:
                A = _spd(batch, n, dtype, device)
                fns = {"lapack": lambda A=A: linalg._triangular_inverse(
                           torch.linalg.cholesky_ex(A)[0]),
                       "lapack_chol": lambda A=A: torch.linalg.cholesky_ex(A)}
                for b in bases:
                    if b < n:
                        fns[f"blocked@{b}"] = lambda A=A, b=b: linalg._blocked(A, b)
                repeats = max(2, min(10, int(3e8 / (batch * n ** 3))))
                times = {k: [] for k in fns}
                for _ in range(rounds):
                    for k, f in fns.items():
                        times[k].append(time_fn(f, repeats=repeats, warmup=1,
                                                device=device)["median_s"])
                row = {"dtype": dt, "n": n, "batch": batch, "repeats": repeats,
                       "median_s": {k: statistics.median(v) for k, v in times.items()},
                       "speedup": {k: statistics.median(x / y for x, y in
                                                        zip(times["lapack"], v))
                                   for k, v in times.items() if k.startswith("blocked")}}
                best = max(row["speedup"].items(), key=lambda kv: kv[1], default=(None, None))
                row["best"], row["best_speedup"] = best
                rows.append(row)
                sp = " ".join(f"{k}={v:.2f}x" for k, v in row["speedup"].items())
                print(f"{dt:8s} n={n:5d} batch={batch:4d} lapack "
                      f"{row['median_s']['lapack'] * 1e3:9.2f} ms  {sp}", flush=True)
    res = {**provenance(argv, Path(__file__).resolve().parents[1]), "device": str(device),
           "threads": torch.get_num_threads(), "rounds": rounds, "rows": rows,
           "rule": {"BLOCK": linalg.BLOCK, "CPU_BLOCKED_MIN_N": linalg.CPU_BLOCKED_MIN_N}}
    print(f"wrote {write_json(res, out)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
