"""Seconds per fine-tuning step of all-MiniLM-L6-v2 with a unit swapped into its last layer,
over the unswapped model, per unit.

One step = the Pyro program's loss (``PyroProgram.loss``: forward, objective terms, ELBO) ->
``backward`` -> AdamW step with the two parameter groups, on a batch of ``--B`` sequences of
``--N`` word pieces (all real), in train mode, every parameter trained. Targets at N = 64: at most
1.10x for KEP-SVGP and h-Gumbel, 1.5x for SGPA and SCGPT, 3x for CGPT. The machine may be
shared, so the models are timed in interleaved rounds (unswapped first, then each unit,
``--repeats`` steps each) and the reported ratio is the median over rounds of the per-round
ratio of medians. Writes JSON into ``benchmarks/results/``; nothing here is asserted by tests.

    python benchmarks/bench_finetune.py                 # all-MiniLM-L6-v2 (text extra)
    python benchmarks/bench_finetune.py --smoke         # a tiny random BERT (CI)
"""

from __future__ import annotations

import statistics
import sys

import torch

from gpattn_ppl.infer.program import PyroProgram
from gpattn_ppl.models import HFClassifier
from gpattn_ppl.run.assembly import parameter_groups
from gpattn_ppl.run.benchmarking import bench_arg_parser, bench_device, time_fn, write_json

UNITS = [{"kind": "kep_svgp"}, {"kind": "h_gumbel"}, {"kind": "gumbel"},
         {"kind": "sgpa", "variant": "decoupled"}, {"kind": "scgpt"}, {"kind": "cgpt"}]
TARGETS = {"kep_svgp": 1.10, "h_gumbel": 1.10, "gumbel": 1.10, "sgpa": 1.5, "scgpt": 1.5,
           "cgpt": 3.0}


def tiny_encoder():
    import transformers

    torch.manual_seed(0)
    cfg = transformers.BertConfig(vocab_size=100, hidden_size=32, num_hidden_layers=2,
                                  num_attention_heads=4, intermediate_size=64,
                                  max_position_embeddings=64)
    return transformers.BertModel(cfg)


def build(spec: dict | None, smoke: bool, device) -> HFClassifier:
    torch.manual_seed(0)
    swap = [] if spec is None else [{"layers": [-1], "attention": dict(spec)}]
    src = {"encoder": tiny_encoder()} if smoke else {"checkpoint": "all-MiniLM-L6-v2"}
    return HFClassifier(num_classes=2, swap=swap, **src).to(device)


def make_step(net: HFClassifier, x, mask, y, device):
    net.calibrate(x, mask)
    net.train()
    program = PyroProgram(net, num_data=8551, objective={}, total_epochs=3)
    program.set_epoch(1.0)
    train = {"lr": 5e-4, "backbone_lr": 3e-5}
    opt = torch.optim.AdamW(parameter_groups(net, train), lr=5e-4, weight_decay=0.01)
    index = torch.arange(x.shape[0], device=device)

    def step():
        opt.zero_grad(set_to_none=True)
        program.loss(x, mask, y, index).backward()
        opt.step()

    return step


def main(argv=None) -> int:
    p = bench_arg_parser(__doc__.splitlines()[0], rounds=3, repeats=5,
                         out="benchmarks/results/finetune.json")
    p.set_defaults(threads=0)
    a = p.parse_args(argv)
    if a.smoke:
        a.B, a.N, a.rounds, a.repeats = 2, 8, 1, 2
    device = bench_device(a)
    g = torch.Generator().manual_seed(0)
    vocab = 100 if a.smoke else 30522
    x = torch.randint(1000 if not a.smoke else 5, vocab, (a.B, a.N), generator=g).to(device)
    x[:, 0] = 2 if a.smoke else 101                                   # [CLS]
    mask = torch.ones(a.B, a.N, dtype=torch.bool, device=device)
    y = torch.randint(0, 2, (a.B,), generator=g).to(device)
    specs = [None] + UNITS
    steps = [make_step(build(s, a.smoke, device), x, mask, y, device) for s in specs]
    times = [[] for _ in specs]
    for _ in range(a.rounds):
        for step, t in zip(steps, times):
            t.append(time_fn(step, repeats=a.repeats, warmup=1, device=device)["median_s"])
    rows = []
    for spec, t in zip(specs, times):
        ratios = [u / b for u, b in zip(t, times[0])]
        kind = "softmax (unswapped)" if spec is None else spec["kind"]
        rows.append({"kind": kind, "options": {} if spec is None else
                     {k: v for k, v in spec.items() if k != "kind"},
                     "median_s": statistics.median(t), "round_medians_s": t,
                     "ratio_to_unswapped": statistics.median(ratios),
                     "ratio_spread": [min(ratios), max(ratios)],
                     "target": TARGETS.get(None if spec is None else spec["kind"])})
    res = {"model": "tiny random BERT" if a.smoke else "all-MiniLM-L6-v2", "B": a.B, "N": a.N,
           "rounds": a.rounds, "repeats": a.repeats, "rows": rows, "smoke": a.smoke}
    path = write_json(res, a.out)
    for r in rows:
        target = "" if r["target"] is None else f"  (target <= {r['target']:.2f})"
        print(f"{r['kind']:20s} median {r['median_s'] * 1e3:8.1f} ms  ratio "
              f"{r['ratio_to_unswapped']:.3f} [{r['ratio_spread'][0]:.3f}, "
              f"{r['ratio_spread'][1]:.3f}]{target}")
    print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
