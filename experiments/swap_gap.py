"""The step-0 gap of every unit swapped into the last layer of all-MiniLM-L6-v2.

For each unit: swap it into the last layer (``init="pretrained"``), calibrate it on one seeded
batch of CoLA training sentences (as the trainer does), and measure on other training sentences
the relative error of the layer's attention output against the pretrained softmax layer's,
:math:`\\lVert o - o^\\text{ref}\\rVert_F / \\lVert o^\\text{ref}\\rVert_F` over real tokens, at the
posterior mean and for one draw; and the same for the copies alone (no calibration) and for a
random init. Also the relative change of the encoder's last hidden states. Needs the ``text``
extra.

    python experiments/swap_gap.py --out experiments/results/swap_gap
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import torch

from gpattn_ppl import settings
from gpattn_ppl.attention.pretrained import relative_error
from gpattn_ppl.data import HFTokenEncoder, read_cola
from gpattn_ppl.models import calibrate_swapped, find_attention_layers, swap_attention
from gpattn_ppl.models.hf import load_hf_encoder

UNITS = [("softmax", {}), ("gumbel", {}), ("h_gumbel", {}), ("kernel", {}),
         ("kernel", {"symmetric": True}), ("sgpa", {"variant": "decoupled"}), ("kep_svgp", {}),
         ("cgpt", {}), ("scgpt", {})]


def batch(enc: HFTokenEncoder, texts: list[str]) -> dict:
    x, lengths = enc.encode(texts)
    mask = torch.arange(x.shape[1])[None] < lengths[:, None]
    return {"input_ids": x, "attention_mask": mask.long()}


@torch.no_grad()
def last_hidden(model, b) -> torch.Tensor:
    with settings.posterior_mean():
        return model(**b).last_hidden_state


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", required=True)
    p.add_argument("--calibration", type=int, default=32, help="sentences (the trainer's batch)")
    p.add_argument("--held-out", type=int, default=256, help="sentences the gap is measured on")
    p.add_argument("--seed", type=int, default=0)
    a = p.parse_args(argv)
    texts = read_cola()["in_domain_train"][0]
    g = torch.Generator().manual_seed(a.seed)
    order = torch.randperm(len(texts), generator=g).tolist()
    enc = HFTokenEncoder("all-MiniLM-L6-v2", 64)
    cal = batch(enc, [texts[i] for i in order[:a.calibration]])
    held = batch(enc, [texts[i] for i in order[a.calibration:a.calibration + a.held_out]])
    real = held["attention_mask"].bool()
    ref_model = load_hf_encoder("all-MiniLM-L6-v2").eval()
    ref_hidden = last_hidden(ref_model, held)
    rows = []
    for kind, opts in UNITS:
        name = kind + ("_sym" if opts.get("symmetric") else "")
        row = {"unit": name, "options": opts}
        for mode in ("calibrated", "copies", "random"):
            torch.manual_seed(a.seed)
            model = load_hf_encoder("all-MiniLM-L6-v2").eval()
            init = "random" if mode == "random" else "pretrained"
            rec = swap_attention(model, kind, layers=[-1], init=init,
                                 calibration=cal if mode == "calibrated" else None, **opts)[0]
            w = find_attention_layers(ref_model)[-1].weights()      # the replaced layer
            gap = calibrate_swapped(model, {rec["path"]: w}, held, fit=False)[rec["path"]]
            row[mode] = {"gap_mean": round(gap["gap_mean"], 4),
                         "gap_sample": round(gap["gap_sample"], 4),
                         "hidden_rel_change": round(relative_error(
                             last_hidden(model, held), ref_hidden, real), 4)}
            if mode == "calibrated":
                row["copied"], row["fitted"] = rec["copied"], rec["fitted"]
                row["not_carried"] = rec["not_carried"]
        rows.append(row)
        print(f"{name:10s} " + "  ".join(
            f"{m}: mean {row[m]['gap_mean']:.3f} draw {row[m]['gap_sample']:.3f} "
            f"hidden {row[m]['hidden_rel_change']:.3f}" for m in ("calibrated", "copies", "random")))
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "swap_gap.json").write_text(json.dumps(
        {"checkpoint": "all-MiniLM-L6-v2", "layer": -1, "calibration_sentences": a.calibration,
         "held_out_sentences": a.held_out, "seed": a.seed, "rows": rows}, indent=1) + "\n")
    lines = ["| unit | calibrated: mean | draw | last hidden | copies only: mean | draw | "
             "random init: mean | draw |", "|---|---|---|---|---|---|---|---|"]
    for r in rows:
        c, o, z = r["calibrated"], r["copies"], r["random"]
        lines.append(f"| {r['unit']} | {c['gap_mean']:.3f} | {c['gap_sample']:.3f} | "
                     f"{c['hidden_rel_change']:.3f} | {o['gap_mean']:.3f} | {o['gap_sample']:.3f} | "
                     f"{z['gap_mean']:.3f} | {z['gap_sample']:.3f} |")
    (out / "swap_gap.md").write_text("\n".join(lines) + "\n")
    rst = [".. list-table::", "   :header-rows: 1", "",
           *[f"   {'*' if i == 0 else ' '} - {h}" for i, h in enumerate(
               ["unit", "calibrated: mean", "draw", "last hidden", "copies only: mean", "draw",
                "random init: mean", "draw"])]]
    for r in rows:
        c, o, z = r["calibrated"], r["copies"], r["random"]
        cells = [r["unit"], *(f"{v:.3g}" for v in (
            c["gap_mean"], c["gap_sample"], c["hidden_rel_change"], o["gap_mean"],
            o["gap_sample"], z["gap_mean"], z["gap_sample"]))]
        rst += [f"   {'*' if i == 0 else ' '} - {cell}" for i, cell in enumerate(cells)]
    (out / "swap_gap.rst").write_text("\n".join(rst) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
