"""Top operators by self CPU time of one unit's training step (torch.profiler).

The step is the fit loop's fast path (argument checks off, factorisations deferred), B = 32,
C = 128, H = 4, N = ``--N``, with the allocator keeping freed memory as the CLI does; 3 warm-up
steps, then ``--steps`` profiled steps. Writes ``benchmarks/results/profile_<unit>.txt``.
Profiler overhead inflates small ops; read the shares and the call counts, not absolute times.

    python benchmarks/profile_step.py cgpt
    python benchmarks/profile_step.py scgpt --options '{"num_inducing": 8}'
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import torch
from torch.profiler import ProfilerActivity, profile

from gpattn_ppl.attention import build_attention
from gpattn_ppl.run.allocator import keep_freed_memory
from gpattn_ppl.run.benchmarking import train_step


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("kind")
    p.add_argument("--options", default="{}", help="unit options as JSON")
    p.add_argument("--N", type=int, default=64)
    p.add_argument("--steps", type=int, default=5)
    p.add_argument("--rows", type=int, default=25)
    p.add_argument("--out", default=None)
    a = p.parse_args()
    keep_freed_memory()
    torch.set_num_threads(2)
    torch.manual_seed(0)
    unit = build_attention(a.kind, 128, 4, **json.loads(a.options)).train()
    x = torch.randn(32, a.N, 128, requires_grad=True)
    mask = torch.ones(32, a.N, dtype=torch.bool)

    step = train_step(unit, x, mask, fast_path=True)
    for _ in range(3):
        step()
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        for _ in range(a.steps):
            step()
    table = prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=a.rows)
    head = (f"{a.kind} {a.options}: one training step, B = 32, N = {a.N}, C = 128, H = 4; "
            f"{a.steps} profiled steps (divide totals and call counts by {a.steps})\n")
    out = Path(a.out or f"benchmarks/results/profile_{a.kind}.txt")
    out.write_text(head + table + "\n")
    print(head + table)
    return 0


if __name__ == "__main__":
    sys.exit(main())
