"""SGPA swapped into the last layer of all-MiniLM-L6-v2 (text extra): its per-sequence KL at
step 0, after the pretrained initialisation and calibration, against a rescaling f of the
calibrated W_qk (why fine-tuning SGPA with its KL collapses to the majority class).

Usage (from the repository root; about a minute on one core)::

    python experiments/sgpa_kl_at_init.py --out experiments/results/finetune_cola/sgpa_kl_at_init.json
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import torch

from gpattn_ppl.data.cola import read_cola
from gpattn_ppl.data.encoders import HFTokenEncoder
from gpattn_ppl.models import HFClassifier
from gpattn_ppl.ppl.sites import SiteContext, site_context


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", required=True)
    p.add_argument("--sentences", type=int, default=32)
    a = p.parse_args(argv)
    torch.manual_seed(0)
    texts = read_cola()["in_domain_train"][0][:a.sentences]
    x, lengths = HFTokenEncoder("all-MiniLM-L6-v2", 64).encode(texts)
    mask = torch.arange(x.shape[1])[None] < lengths[:, None]
    net = HFClassifier(num_classes=2, checkpoint="all-MiniLM-L6-v2",
                       swap=[{"layers": [-1], "attention": {"kind": "sgpa"}}])
    record = net.calibrate(x, mask)
    net.train()
    unit = next(iter(net.attention_units().values()))
    w0 = unit.proj.weight[:unit.dim].detach().clone()          # the calibrated W_qk
    rows = []
    for f in (8.0, 4.0, 2.0, 1.0, 0.5, 0.25):
        with torch.no_grad():
            unit.proj.weight[:unit.dim].copy_(w0 * f)
            with site_context(SiteContext(mode="thin")):
                net(x, mask)
        terms = {k.rsplit(".", 1)[-1]: float(v.mean()) for k, v in net.objective_terms().items()}
        rows.append({"w_qk_factor": f, **terms})
        print(rows[-1], flush=True)
    Path(a.out).parent.mkdir(parents=True, exist_ok=True)
    Path(a.out).write_text(json.dumps({"calibration": record, "rows": rows}, indent=1) + "\n")


if __name__ == "__main__":
    main()
