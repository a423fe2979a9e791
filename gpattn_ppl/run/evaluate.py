"""Evaluation of a trained program on a dataset bundle: test-set classification metrics and, per
OOD set, classification and detection metrics (as configured in the ``eval`` section)."""

from __future__ import annotations

import warnings

import torch

from ..infer import PyroProgram, predict
from ..metrics import classification_report
from ..ood import kl_matching_templates, ood_report

__all__ = ["evaluate_model"]


def evaluate_model(program: PyroProgram, bundle, cfg: dict, device, ood: list[str] | None = None
                   ) -> dict:
    """Test-set and OOD metrics (classification on every labelled set, detection vs test).

    KL-matching templates come from the validation predictions, never from test data.

    :param cfg: a validated config (its ``eval`` and ``data`` sections are read).
    :param ood: OOD set names (default: ``eval.ood``, else every OOD set of the bundle).
    :returns: ``{"warnings", "test", "ood": {name: {"classification", "detection"}},
        "_predictions": {"test", "val", <ood name>...}}``.
    :raises ValueError: an OOD set the bundle does not have.
    """
    e, d = cfg["eval"], cfg["data"]
    kw = dict(num_samples=e["mc_samples"], batch_size=d["eval_batch_size"], device=device,
              limit=d["limit_eval"])
    names = ood if ood is not None else (e["ood"] if e["ood"] is not None else list(bundle.ood))
    unknown = [n for n in names if n not in bundle.ood]
    if unknown:
        raise ValueError(f"eval.ood: unknown OOD set(s) {unknown}; this dataset has: "
                         f"{', '.join(bundle.ood) or 'none'}")
    val = predict(program, bundle.val, **kw)
    test = predict(program, bundle.test, **kw)
    mean = _average(test, e["average"])
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always", UserWarning)
        templates = kl_matching_templates(_average(val, e["average"])["probs"])
    out = {"warnings": [str(w.message) for w in caught],
           "test": classification_report(mean["probs"], test["labels"], logits=test["logits"],
                                         metrics=e["metrics"]),
           "ood": {}, "_predictions": {"test": test, "val": val}}
    for name in names:
        p = predict(program, bundle.ood[name], **kw)
        pm = _average(p, e["average"])
        out["_predictions"][name] = p
        out["ood"][name] = {
            "classification": classification_report(pm["probs"], p["labels"], logits=p["logits"],
                                                    metrics=e["metrics"]),
            "detection": ood_report(mean["probs"], test["logits"], pm["probs"], p["logits"],
                                    detectors=e["ood_detectors"], templates=templates),
        }
    return out


def _average(pred: dict, how: str) -> dict:
    """``probs``: keep the T passes (metrics average probabilities); ``logits``: average logits
    first (the KEP-SVGP reference's convention), giving one pass."""
    if how == "probs":
        return pred
    logits = pred["logits"].mean(0, keepdim=True)
    return {"logits": logits, "probs": torch.softmax(logits.double(), -1), "labels": pred["labels"]}
