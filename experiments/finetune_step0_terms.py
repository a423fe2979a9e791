"""Each unit swapped into the last layer of all-MiniLM-L6-v2 (text extra): the cross-entropy and
the unweighted objective terms (``kl``, ``cgp_loss``, ``ksvd_loss``) at step 0, after the
pretrained initialisation and calibration, on one training batch of CoLA.

The ratio term / cross-entropy says how far a weight of 1 lets a term dominate the first steps;
``balanced_weight`` = ``--share`` x CE / term is the weight at which the term starts at that share
of the cross-entropy (the fine-tuning recipes' ``train.objective`` weights, see
``docs/derivations/pretrained_init.rst``). Averaged over ``--draws`` forward passes.

Usage (from the repository root; about two minutes on one core)::

    python experiments/finetune_step0_terms.py --out experiments/results/finetune_cola/step0_terms.json
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import torch

from gpattn_ppl.data.cola import read_cola
from gpattn_ppl.data.encoders import HFTokenEncoder
from gpattn_ppl.models import HFClassifier
from gpattn_ppl.run import step0_terms

KINDS = {"sgpa": {"kind": "sgpa", "variant": "decoupled"}, "cgpt": {"kind": "cgpt"},
         "scgpt": {"kind": "scgpt"}, "kep_svgp": {"kind": "kep_svgp"},
         "h_gumbel": {"kind": "h_gumbel"}}


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", required=True)
    p.add_argument("--kinds", nargs="+", default=list(KINDS), choices=list(KINDS))
    p.add_argument("--sentences", type=int, default=32)
    p.add_argument("--draws", type=int, default=4)
    p.add_argument("--share", type=float, default=0.1)
    a = p.parse_args(argv)
    texts, labels = read_cola()["in_domain_train"][:2]
    texts, y = texts[:a.sentences], torch.as_tensor(labels[:a.sentences])
    x, lengths = HFTokenEncoder("all-MiniLM-L6-v2", 64).encode(texts)
    mask = torch.arange(x.shape[1])[None] < lengths[:, None]
    rows = []
    for kind in a.kinds:
        torch.manual_seed(0)
        net = HFClassifier(num_classes=2, checkpoint="all-MiniLM-L6-v2",
                           swap=[{"layers": [-1], "attention": KINDS[kind]}])
        record = net.calibrate(x, mask)[0]
        ce0, terms = step0_terms(net, x, mask, y, draws=a.draws)
        row = {"kind": kind, "gap_mean": record.get("gap_mean"), "ce": ce0, "terms": {}}
        for path, t in terms.items():
            row["terms"][path.rsplit(".", 1)[-1]] = {
                "value": t, "ratio_to_ce": t / ce0,
                "balanced_weight": a.share * ce0 / t if t > 0 else None}
        rows.append(row)
        print(json.dumps(row), flush=True)
    Path(a.out).parent.mkdir(parents=True, exist_ok=True)
    Path(a.out).write_text(json.dumps({"share": a.share, "sentences": a.sentences,
                                       "draws": a.draws, "rows": rows}, indent=1) + "\n")


if __name__ == "__main__":
    main()
