"""Prediction cost: ``gpattn_ppl.infer.predict`` against :class:`pyro.infer.Predictive`.

``predict`` runs T passes per batch (guide traced, model replayed). ``Predictive`` with
``parallel=False`` does the same T passes but first runs the model twice more per call (to
guess the plate nesting and read the site shapes), which is what ``predict`` used before.
The model is the CIFAR-10 CPU preset's ViT (patch 4, N = 64, C = 128, 4 heads, MLP 128, 3
blocks) on random images, eval batch 128; three networks: softmax (deterministic, T = 1), MC
dropout (every block stochastic, T = 5) and SGPA in the last block (T = 5, the deterministic
prefix cached). The two predictions are timed *interleaved* in rounds, so machine load affects
both alike; the JSON has each one's median, min and max and the ratio of medians.

    python benchmarks/bench_predict.py [--images 1000] [--rounds 5] [--device cpu]
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import statistics
import time

import torch
from pyro.infer import Predictive

from gpattn_ppl.data import ArrayDataset
from gpattn_ppl.infer import PyroProgram, predict
from gpattn_ppl.models import build_model
from gpattn_ppl.run.benchmarking import write_json

NETS = {
    "softmax": ({"attention": {"kind": "softmax"}}, 1),
    "mc_dropout": ({"attention": {"kind": "softmax"}, "mc_dropout": True}, 5),
    "sgpa_last_block": ({"attention": {"kind": "softmax"},
                         "overrides": [{"blocks": [-1], "attention": {
                             "kind": "sgpa", "variant": "decoupled", "num_inducing": 16}}]}, 5),
}


@torch.no_grad()
def predictive_reference(program: PyroProgram, dataset, T: int, batch_size: int, device):
    """The former ``predict``: ``pyro.infer.Predictive`` over the batches (same prefix cache)."""
    net = program.net
    net.eval()
    predictive = Predictive(program.model, guide=program.guide, num_samples=T,
                            return_sites=["logits"], parallel=False)
    out = []
    for start in range(0, len(dataset), batch_size):
        b = dataset.batch(torch.arange(start, min(start + batch_size, len(dataset)))).to(device)
        reuse = net.prefix_cache() if T > 1 else contextlib.nullcontext()
        with reuse:
            out.append(predictive(b.x, b.mask, None, None)["logits"])
    return torch.cat(out, -2)


def timed(fn, device: torch.device) -> float:
    """Wall seconds of ``fn()`` (waiting for the GPU on CUDA)."""
    t0 = time.perf_counter()
    fn()
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    return time.perf_counter() - t0


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--images", type=int, default=1000)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--batch-size", type=int, default=128)
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--out", default="benchmarks/results/predict.json")
    args = ap.parse_args()
    device = torch.device(args.device)
    g = torch.Generator().manual_seed(0)
    data = ArrayDataset(torch.randn(args.images, 3, 32, 32, generator=g),
                        torch.randint(0, 10, (args.images,), generator=g), name="random")
    res = {"images": args.images, "batch_size": args.batch_size, "rounds": args.rounds,
           "model": "ViT, patch 4 (N = 64), C = 128, 4 heads, MLP 128, 3 blocks", "nets": {}}
    for name, (spec, T) in NETS.items():
        torch.manual_seed(0)
        net = build_model({"arch": "vit", "image_size": 32, "patch_size": 4, "dim": 128,
                           "depth": 3, "heads": 4, "mlp_dim": 128, "dropout": 0.1, **spec},
                          num_classes=10).to(device)
        program = PyroProgram(net, num_data=45000)

        ours = functools.partial(predict, program, data, num_samples=T,
                                 batch_size=args.batch_size, device=device)
        reference = functools.partial(predictive_reference, program, data, T, args.batch_size,
                                      device)

        ours(), reference()                      # warm-up
        times = {"predict": [], "predictive": []}
        for _ in range(args.rounds):
            times["predict"].append(timed(ours, device))
            times["predictive"].append(timed(reference, device))
        row = {"T": T}
        for key, ts in times.items():
            row[f"{key}_median_s"] = statistics.median(ts)
            row[f"{key}_min_s"], row[f"{key}_max_s"] = min(ts), max(ts)
        row["speedup_of_medians"] = row["predictive_median_s"] / row["predict_median_s"]
        res["nets"][name] = row
        print(name, {k: round(v, 3) for k, v in row.items()})
    print(f"wrote {write_json(res, args.out)}")


if __name__ == "__main__":
    main()
