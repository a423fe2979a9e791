"""Per-step cost of the Pyro program against a plain PyTorch cross-entropy step.

Same deterministic model (CoLA-sized text Transformer: 2 blocks, C = 128, H = 4, MLP 256), same
batch (B = 32, N = 24 tokens), same Adam optimiser. The two steps are timed *interleaved* in
rounds (Pyro, plain, Pyro, plain, ...) so machine load affects both alike; the ratio of medians
is reported. Writes ``benchmarks/results/pyro_overhead.json``.

    python benchmarks/bench_pyro_overhead.py [--rounds 30] [--steps 20] [--device cpu]
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch
import torch.nn.functional as F

from gpattn_ppl.infer.program import PyroProgram
from gpattn_ppl.models import build_model
from gpattn_ppl.run.benchmarking import write_json


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=30)
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--out", default="benchmarks/results/pyro_overhead.json")
    args = ap.parse_args()
    device = torch.device(args.device)
    torch.manual_seed(0)
    net = build_model({"dim": 128, "depth": 2, "heads": 4, "mlp_dim": 256, "dropout": 0.1},
                      num_classes=2, vocab_size=5000).to(device)
    B, N = 32, 24
    x = torch.randint(1, 5000, (B, N), device=device)
    mask = torch.ones(B, N, dtype=torch.bool, device=device)
    mask[::2, 18:] = False
    y = torch.randint(0, 2, (B,), device=device)
    idx = torch.arange(B, device=device)
    program = PyroProgram(net, num_data=7696)
    opt = torch.optim.Adam(net.parameters(), lr=1e-4)

    def pyro_step():
        opt.zero_grad(set_to_none=True)
        program.loss(x, mask, y, idx).backward()
        opt.step()

    def torch_step():
        opt.zero_grad(set_to_none=True)
        F.cross_entropy(net(x, mask), y).backward()
        opt.step()

    def timed(fn):
        t0 = time.perf_counter()
        for _ in range(args.steps):
            fn()
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        return (time.perf_counter() - t0) / args.steps

    for fn in (pyro_step, torch_step):
        timed(fn)  # warm-up
    pyro_t, torch_t = [], []
    for _ in range(args.rounds):
        pyro_t.append(timed(pyro_step))
        torch_t.append(timed(torch_step))
    ratios = [a / b for a, b in zip(pyro_t, torch_t)]
    res = {"B": B, "N": N, "model": "text, 2 blocks, C=128, H=4, MLP 256",
           "pyro_step_median_s": statistics.median(pyro_t),
           "torch_step_median_s": statistics.median(torch_t),
           "ratio_of_medians": statistics.median(pyro_t) / statistics.median(torch_t),
           "median_of_round_ratios": statistics.median(ratios), "target": 1.15,
           "rounds": args.rounds, "steps_per_round": args.steps}
    path = write_json(res, args.out)
    print({k: (round(v, 5) if isinstance(v, float) else v) for k, v in res.items()})
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
