"""How far does sequence length alone separate a text task's test set from its OOD sets?

A detector that reads only the number of real tokens (no model): score ``s = length`` (ID
positive), evaluated like every other detector (:func:`gpattn_ppl.metrics.ood_detection_metrics`:
AUROC, AUPR-in, AUPR-out, FPR95), in both directions (``longer = ID`` and ``shorter = ID``). When
one direction is near 1, the OOD AUROCs of the evidence table mostly say how sensitive a model's
confidence is to length, not whether it notices a change of domain.

``--runs`` then re-scores finished runs from their ``predictions.pt`` (T test passes): the AUROC
of max-softmax, energy and (T > 1) mutual information with every test example, and with only the
test examples of at most ``--max-lengths`` tokens, against the whole OOD set. A detector whose
AUROC falls toward 0.5 as the test set is restricted to short examples was reading length.

Usage (the data settings of ``experiments/evidence.py imdb_cr``, so the same 2,000-review test
subset and 128-token truncation)::

    python experiments/length_ood_baseline.py experiments/configs/imdb/softmax.yaml \\
        --set data.limit_train=5000 data.limit_eval=2000 data.max_len=128 model.max_len=128 \\
        --runs runs/evidence_imdb_cr/*/seed* --max-lengths 89 64
"""

from __future__ import annotations

import argparse
import json
import statistics
from pathlib import Path

import torch

from gpattn_ppl.metrics import ood_detection_metrics
from gpattn_ppl.ood import ood_score
from gpattn_ppl.run.assembly import load_bundle
from gpattn_ppl.run.config import load_config


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


def restricted_auroc(run_dir: Path, test_lengths: torch.Tensor, ood_set: str,
                     max_lengths: list[int]) -> dict:
    """Detector AUROCs of one run (its ``predictions.pt``) on the whole test set and on its
    examples of at most each of ``max_lengths`` tokens: ``{detector: {"all" | L: auroc}}``."""
    pred = torch.load(run_dir / "predictions.pt", map_location="cpu", weights_only=True)
    test, ood = pred["test"], pred[ood_set]
    if test["probs"].shape[-2] != len(test_lengths):
        raise ValueError(f"{run_dir}: {test['probs'].shape[-2]} test predictions but "
                         f"{len(test_lengths)} test lengths (a different data setting?)")
    detectors = ["max_softmax", "energy"] + (["mutual_info"] if test["probs"].shape[0] > 1 else [])
    out = {}
    for name in detectors:
        s_test = ood_score(name, test["probs"], test["logits"])
        s_ood = ood_score(name, ood["probs"], ood["logits"])
        out[name] = {"all": ood_detection_metrics(s_test, s_ood)["auroc"]}
        for length in max_lengths:
            keep = test_lengths <= length
            out[name][length] = ood_detection_metrics(s_test[keep], s_ood)["auroc"]
    return out


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("config", help="a text config (its data section is used)")
    p.add_argument("--set", nargs="+", default=[], dest="overrides", metavar="KEY=VALUE")
    p.add_argument("--runs", nargs="+", default=[], type=Path,
                   help="run folders (with predictions.pt) trained on this data setting")
    p.add_argument("--max-lengths", nargs="+", type=int, default=[89, 64],
                   help="restrict the test set to examples of at most this many tokens")
    p.add_argument("--out", help="write the result as JSON here")
    args = p.parse_args(argv)
    unfinished = [str(d) for d in args.runs if not (d / "predictions.pt").is_file()]
    if unfinished:   # checked before the data loads: a run still training has no predictions
        p.error(f"no predictions.pt in {', '.join(unfinished)} (an unfinished run, or not a run "
                "folder?)")
    bundle = load_bundle(load_config(args.config, args.overrides))
    result = length_baseline(bundle)
    for name, r in result.items():
        print(f"{name}: {r['n_test']} test / {r['n_ood']} OOD; mean length "
              f"{r['mean_length_test']:.1f} / {r['mean_length_ood']:.1f} tokens")
        for direction in ("longer_is_id", "shorter_is_id"):
            m = r[direction]
            print(f"  {direction}: AUROC {m['auroc']:.3f}, AUPR-in {m['aupr_in']:.3f}, "
                  f"AUPR-out {m['aupr_out']:.3f}, FPR95 {m['fpr95']:.3f}")
    keep = {length: int((bundle.test.lengths <= length).sum()) for length in args.max_lengths}
    for name in result:
        result[name]["test_examples_up_to"] = keep
        runs = {str(d): restricted_auroc(d, bundle.test.lengths, name, args.max_lengths)
                for d in args.runs}
        result[name]["runs"] = runs
        if runs:
            cols = ["all"] + args.max_lengths
            print(f"\n{name}: detector AUROC, test restricted to <= L tokens "
                  f"(examples kept: {keep})")
            print("| run | detector | " + " | ".join(f"L = {c}" for c in cols) + " |")
            print("|---|---|" + "---|" * len(cols))
            for d, per in runs.items():
                for det, vals in per.items():
                    print(f"| {d} | {det} | " + " | ".join(f"{vals[c]:.3f}" for c in cols) + " |")
    if args.out:
        with open(args.out, "w") as fh:
            json.dump(result, fh, indent=2)


if __name__ == "__main__":
    main()
