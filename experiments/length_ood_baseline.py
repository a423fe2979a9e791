"""How far does sequence length alone separate a text task's test set from its OOD sets?

A detector that reads only the number of real tokens (no model): score ``s = length`` (ID
positive), evaluated like every other detector (:func:`gpattn_ppl.metrics.ood_detection_metrics`:
AUROC, AUPR-in, AUPR-out, FPR95), in both directions (``longer = ID`` and ``shorter = ID``). When
one direction is near 1, the OOD AUROCs of the evidence table mostly say how sensitive a model's
confidence is to length, not whether it notices a change of domain.

Usage (the data settings of ``experiments/evidence.py imdb_cr``, so the same 2,000-review test
subset and 128-token truncation)::

    python experiments/length_ood_baseline.py experiments/configs/imdb/softmax.yaml \\
        --set data.limit_train=5000 data.limit_eval=2000 data.max_len=128 model.max_len=128
"""

from __future__ import annotations

import argparse
import json
import statistics

from gpattn_ppl.metrics import ood_detection_metrics
from gpattn_ppl.run.config import load_config
from gpattn_ppl.run.experiment import load_bundle


def length_baseline(bundle) -> dict:
    """Per OOD set: mean / median length of both sets and the metrics of both directions."""
    if bundle.test.lengths is None:
        raise ValueError(f"dataset {bundle.name!r} has no token lengths (not a text dataset)")
    test = bundle.test.lengths.float()
    out = {}
    for name, ood in bundle.ood.items():
        lengths = ood.lengths.float()
        out[name] = {
            "n_test": len(test), "n_ood": len(lengths),
            "mean_length_test": test.mean().item(), "mean_length_ood": lengths.mean().item(),
            "median_length_test": statistics.median(test.tolist()),
            "median_length_ood": statistics.median(lengths.tolist()),
            "longer_is_id": ood_detection_metrics(test, lengths),
            "shorter_is_id": ood_detection_metrics(-test, -lengths),
        }
    return out


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("config", help="a text config (its data section is used)")
    p.add_argument("--set", nargs="+", default=[], dest="overrides", metavar="KEY=VALUE")
    p.add_argument("--out", help="write the result as JSON here")
    args = p.parse_args(argv)
    result = length_baseline(load_bundle(load_config(args.config, args.overrides)))
    for name, r in result.items():
        print(f"{name}: {r['n_test']} test / {r['n_ood']} OOD; mean length "
              f"{r['mean_length_test']:.1f} / {r['mean_length_ood']:.1f} tokens")
        for direction in ("longer_is_id", "shorter_is_id"):
            m = r[direction]
            print(f"  {direction}: AUROC {m['auroc']:.3f}, AUPR-in {m['aupr_in']:.3f}, "
                  f"AUPR-out {m['aupr_out']:.3f}, FPR95 {m['fpr95']:.3f}")
    if args.out:
        with open(args.out, "w") as fh:
            json.dump(result, fh, indent=2)


if __name__ == "__main__":
    main()
