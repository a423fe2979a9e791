"""Seconds per CIFAR-10 ViT training step of each unit in every block and in the last block
only, over softmax's, in one run (which units the CPU preset confines to the last block).

The model is the CPU preset's ViT (``experiments/configs/cifar10/softmax.yaml``: 3 blocks,
patch 4 so N = 64, C = 128, 4 heads, MLP 128) with each unit's options from its CPU-preset
config. One step = the Pyro program's loss (forward, objective terms) -> ``backward`` -> Adam,
on ``--B`` random images (default 128, the preset's batch), in train mode. The models are timed
in interleaved rounds (softmax first, then every unit in every block, then in the last block,
``--repeats`` steps each) and a ratio is the median over rounds of the per-round ratio of
medians, so a change of load on a shared machine hits all alike. Writes JSON into
``benchmarks/results/``; nothing here is asserted by tests.

    python benchmarks/bench_vit_blocks.py --threads 2      # as reported in experiments/README.md
    python benchmarks/bench_vit_blocks.py --smoke          # 1 block, 4 images (CI)
"""

from __future__ import annotations

import statistics
import sys
from pathlib import Path

import torch

from gpattn_ppl.infer.program import PyroProgram
from gpattn_ppl.models import build_model
from gpattn_ppl.run.benchmarking import bench_arg_parser, bench_device, time_fn, write_json
from gpattn_ppl.run.config import load_config

CONFIGS = Path(__file__).resolve().parents[1] / "experiments" / "configs" / "cifar10"
METHODS = ("kernel_asym", "sgpa", "kep_svgp", "cgpt", "scgpt", "gumbel", "h_gumbel")


def unit_spec(method: str) -> dict:
    """The attention spec of ``method``'s CPU-preset config (the last block's when it has one)."""
    model = load_config(CONFIGS / f"{method}.yaml", extras=False)["model"]  # model only
    return dict(model["overrides"][-1]["attention"] if model["overrides"]
                else model["attention"])


def build(spec: dict, where: str, depth: int, device) -> torch.nn.Module:
    model = dict(load_config(CONFIGS / "softmax.yaml", extras=False)["model"], depth=depth)
    if where == "every":
        model["attention"] = spec
    else:
        model["overrides"] = [{"blocks": [-1], "attention": spec}]
    torch.manual_seed(0)
    return build_model(model, num_classes=10).to(device)


def make_step(net, x, y, device):
    net.train()
    program = PyroProgram(net, num_data=15000, objective={}, total_epochs=8)
    program.set_epoch(1.0)
    opt = torch.optim.Adam(net.parameters(), lr=1e-3)
    index = torch.arange(x.shape[0], device=device)

    def step():
        opt.zero_grad(set_to_none=True)
        program.loss(x, None, y, index).backward()
        opt.step()

    return step


def main(argv=None) -> int:
    p = bench_arg_parser(__doc__.splitlines()[0], rounds=3, repeats=5,
                         out="benchmarks/results/vit_blocks.json")
    p.set_defaults(B=128)
    a = p.parse_args(argv)
    depth = 3
    if a.smoke:
        a.B, a.rounds, a.repeats, depth = 4, 1, 1, 1
    device = bench_device(a)
    g = torch.Generator().manual_seed(0)
    x = torch.randn(a.B, 3, 32, 32, generator=g).to(device)
    y = torch.randint(0, 10, (a.B,), generator=g).to(device)
    cases = [("softmax", "every", {"kind": "softmax"})]
    cases += [(m, w, unit_spec(m)) for w in ("every", "last") for m in METHODS]
    steps = [make_step(build(spec, w, depth, device), x, y, device) for _, w, spec in cases]
    times = [[] for _ in cases]
    for _ in range(a.rounds):
        for step, t in zip(steps, times):
            t.append(time_fn(step, repeats=a.repeats, warmup=1, device=device)["median_s"])
    rows = []
    for (method, where, spec), t in zip(cases, times):
        ratios = [u / b for u, b in zip(t, times[0])]
        rows.append({"method": method, "blocks": where, "attention": spec,
                     "median_s": statistics.median(t), "round_medians_s": t,
                     "ratio_to_softmax": statistics.median(ratios),
                     "ratio_spread": [min(ratios), max(ratios)]})
    res = {"model": f"ViT {depth} blocks, N = 64, C = 128, 4 heads, MLP 128", "B": a.B,
           "threads": a.threads, "rounds": a.rounds, "repeats": a.repeats, "rows": rows,
           "smoke": a.smoke}
    path = write_json(res, a.out)
    for r in rows:
        print(f"{r['method']:12s} {r['blocks']:6s} median {r['median_s'] * 1e3:8.1f} ms  ratio "
              f"{r['ratio_to_softmax']:.2f} [{r['ratio_spread'][0]:.2f}, "
              f"{r['ratio_spread'][1]:.2f}]")
    print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
