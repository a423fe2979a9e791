"""Does ``torch.compile`` speed up a unit's training step? Eager against compiled, per unit.

Each unit runs in its own process (a compile that does not finish within ``--timeout`` seconds is
recorded as such): one training step as the fit loop's fast path runs it (argument checks off,
factorisations deferred), B = 32, C = 128, H = 4, N = ``--N``; eager median over ``--repeats``
steps, then ``torch.compile(unit)`` (first call timed separately: the compilation), its median,
and eager again. Writes ``benchmarks/results/compile.json``. Nothing here is asserted by tests.

    python benchmarks/bench_compile.py --units gumbel h_gumbel kep_svgp scgpt cgpt
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys

from gpattn_ppl.run.benchmarking import write_json

CODE = r'''
import json, statistics, sys, time, torch
from gpattn_ppl.run.allocator import keep_freed_memory
from gpattn_ppl.attention import build_attention
from gpattn_ppl.run.benchmarking import train_step
keep_freed_memory()
torch.set_num_threads(2)
kind, N, repeats = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
torch.manual_seed(0)
unit = build_attention(kind, 128, 4).train()
x = torch.randn(32, N, 128, requires_grad=True)
mask = torch.ones(32, N, dtype=torch.bool)

def make(f):
    return train_step(f, x, mask, fast_path=True)

def median_ms(step):
    for _ in range(2):
        step()
    ts = []
    for _ in range(repeats):
        t0 = time.perf_counter(); step(); ts.append(time.perf_counter() - t0)
    return 1e3 * statistics.median(ts)

out = {"eager_ms": median_ms(make(unit))}
compiled = torch.compile(unit, dynamic=False)
t0 = time.perf_counter()
make(compiled)()
out["compile_s"] = time.perf_counter() - t0
out["compiled_ms"] = median_ms(make(compiled))
out["eager_again_ms"] = median_ms(make(unit))
print(json.dumps(out))
'''


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--units", nargs="+", default=["gumbel", "h_gumbel", "kep_svgp", "scgpt",
                                                   "cgpt"])
    p.add_argument("--N", type=int, default=64)
    p.add_argument("--repeats", type=int, default=10)
    p.add_argument("--timeout", type=float, default=240.0)
    p.add_argument("--out", default="benchmarks/results/compile.json")
    a = p.parse_args()
    res = {"N": a.N, "B": 32, "C": 128, "H": 4, "timeout_s": a.timeout, "units": {}}
    for kind in a.units:
        try:
            proc = subprocess.run([sys.executable, "-c", CODE, kind, str(a.N), str(a.repeats)],
                                  capture_output=True, text=True, timeout=a.timeout)
        except subprocess.TimeoutExpired:
            res["units"][kind] = {"error": f"did not finish within {a.timeout:.0f} s"}
        else:
            if proc.returncode:
                last = (proc.stderr.strip().splitlines() or [""])[-1][:300]
                res["units"][kind] = {"error": f"exit status {proc.returncode}: {last}".strip()}
            else:
                row = json.loads(proc.stdout.strip().splitlines()[-1])
                row["compiled/eager"] = row["compiled_ms"] / (0.5 * (row["eager_ms"]
                                                                     + row["eager_again_ms"]))
                res["units"][kind] = row
        print(kind, res["units"][kind], flush=True)
    print(f"wrote {write_json(res, a.out)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
