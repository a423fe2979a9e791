r"""Evaluation of a trained program on a dataset bundle: test-set classification metrics and, per
OOD set, classification and detection metrics (as configured in the ``eval`` section).

With ``eval.temperature_scaling`` one temperature :math:`\tau` is fitted on the validation split
(:func:`gpattn_ppl.metrics.fit_temperature`: NLL, LBFGS on :math:`\log\tau`) and every metric is
reported a second time, under ``"ts"``, for the tempered predictive
:math:`\frac1T\sum_t \mathrm{softmax}(\ell_t/\tau)`: for stochastic units the temperature
scales each pass's logits before the passes are averaged.

With ``eval.laplace`` (``probit`` or ``mc``) a last-layer Laplace approximation of the
classifier head is fitted on the training split (:mod:`gpattn_ppl.run.laplace`; the prior
precision by marginal likelihood unless ``eval.laplace_prior`` fixes it) and every metric is
reported a third time, under ``"laplace"``, for its predictive, by the same report as ``"ts"``.
"""

from __future__ import annotations

import time
import warnings

import torch

from ..infer import PyroProgram, predict
from ..metrics import apply_temperature, classification_report, fit_temperature
from ..metrics.classification import negative_log_likelihood
from ..metrics.temperature import TemperatureWarning
from ..ood import kl_matching_templates, ood_report
from ..schema import ConfigError

__all__ = ["check_ood_names", "evaluate_laplace", "evaluate_model", "evaluate_predictions",
           "temper"]


def evaluate_model(program: PyroProgram, bundle, cfg: dict, device, ood: list[str] | None = None
                   ) -> dict:
    """Test-set and OOD metrics (classification on every labelled set, detection vs test).

    KL-matching templates and the temperature come from the validation predictions, never from
    test data.

    :param cfg: a validated config (its ``eval`` and ``data`` sections are read).
    :param ood: OOD set names (default: ``eval.ood``, else every OOD set of the bundle).
    :returns: ``{"warnings", "test", "ood": {name: {"classification", "detection"}},
        ["temperature_scaling", "ts": {"test", "ood"}], ["laplace": {..., "test", "ood"}],
        "_predictions": {"test", "val", <ood name>...}}``; ``classification`` is ``None`` for
        an OOD set without labels. The Laplace predictive's predictions are not among
        ``_predictions`` (``predictions.pt`` holds the network's own).
    :raises ValueError: an OOD set the bundle does not have.
    """
    e, d = cfg["eval"], cfg["data"]
    kw = dict(num_samples=e["mc_samples"], batch_size=d["eval_batch_size"], device=device,
              precision=cfg["train"]["precision"], mean=e["predictive"] == "mean")
    names = ood if ood is not None else (e["ood"] if e["ood"] is not None else list(bundle.ood))
    check_ood_names(names, bundle)
    start = time.perf_counter()
    preds = {"val": predict(program, bundle.val, **kw), "test": predict(program, bundle.test, **kw)}
    for name in names:
        preds[name] = predict(program, bundle.ood[name], **kw)
    predict_s = time.perf_counter() - start
    out = evaluate_predictions(preds, cfg, names)
    # the test cost of the method: every MC pass of every example predicted, per example
    out["predict_ms_per_example"] = 1e3 * predict_s / sum(len(p["labels"]) for p in preds.values())
    if e["laplace"] is not None:
        out["laplace"], caught = evaluate_laplace(program.net, bundle, cfg, device, names)
        out["warnings"] += caught
    out["_predictions"] = preds
    return out


def evaluate_laplace(net, bundle, cfg: dict, device, names: list[str]) -> tuple[dict, list[str]]:
    """Fit the last-layer Laplace approximation of ``net`` on the training split and report
    its predictive (:func:`gpattn_ppl.run.laplace.laplace_predictions`, options from
    ``cfg["eval"]``) on the test and OOD sets ``names``, as :func:`evaluate_predictions`
    reports ``"ts"``.

    :returns: ``({"prior_precision", "prior_method", "val_nll_by_prior", "link", "samples",
        "hessian", "fitted_on": "train", "features": "posterior_mean", "n_train",
        "fit_seconds", "predict_seconds", "predict_ms_per_example", "val_nll_map", "val_nll",
        "test", "ood"}, warnings)``; ``val_nll_map`` is the NLL on the validation split of the
        softmax of the same (posterior-mean) network's head.
    """
    from .laplace import laplace_predictions

    lla, preds, info = laplace_predictions(net, bundle, cfg, device, names)
    report = _report(preds, cfg["eval"], names)
    val = preds["val"]
    out = {**lla.summary(), **info,
           "val_nll": negative_log_likelihood(val["probs"].mean(0), val["labels"]),
           "test": report["test"], "ood": report["ood"]}
    return out, lla.warnings


def check_ood_names(names: list[str] | None, bundle, where: str = "eval.ood") -> None:
    """Raise :class:`~gpattn_ppl.schema.ConfigError` when an OOD set name is not one of
    ``bundle.ood``."""
    reserved = [n for n in names or [] if n in ("train", "val", "test")]
    if reserved:
        raise ConfigError(f"{where}: an OOD set may not be named {reserved[0]!r} (the name of a "
                          "split of the dataset); rename it")
    unknown = [n for n in names or [] if n not in bundle.ood]
    if unknown:
        raise ConfigError(f"{where}: unknown OOD set(s) {', '.join(map(repr, unknown))} of "
                          f"dataset {bundle.name!r}; it has: {', '.join(bundle.ood) or 'none'}")


def temper(pred: dict, temperature: float) -> dict:
    """Predictions with every pass's logits divided by ``temperature`` (probabilities anew)."""
    logits = apply_temperature(pred["logits"], temperature)
    return {"logits": logits, "probs": torch.softmax(logits.double(), -1), "labels": pred["labels"]}


def evaluate_predictions(preds: dict, cfg: dict, names: list[str]) -> dict:
    """Metrics from per-pass predictions ``{"val", "test", <ood>...}`` (see
    :func:`evaluate_model`); fits and applies the temperature when the config asks for it."""
    e = cfg["eval"]
    out = _report(preds, e, names)
    if e["temperature_scaling"]:
        val = preds["val"]
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always", TemperatureWarning)
            tau = fit_temperature(val["logits"], val["labels"])
        out["warnings"] += [str(w.message) for w in caught]
        tempered = {k: temper(p, tau) for k, p in preds.items()}
        out["temperature_scaling"] = {
            "temperature": tau, "fitted_on": "val",
            "val_nll_before": negative_log_likelihood(val["probs"].mean(0), val["labels"]),
            "val_nll_after": negative_log_likelihood(tempered["val"]["probs"].mean(0),
                                                     val["labels"])}
        ts = _report(tempered, e, names)
        out["ts"] = {"test": ts["test"], "ood": ts["ood"]}
    return out


def _report(preds: dict, e: dict, names: list[str]) -> dict:
    test = preds["test"]
    mean = _average(test, e["average"])
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always", UserWarning)
        templates = kl_matching_templates(_average(preds["val"], e["average"])["probs"])
    out = {"warnings": [str(w.message) for w in caught],
           "test": classification_report(mean["probs"], test["labels"], logits=test["logits"],
                                         metrics=e["metrics"]),
           "ood": {}}
    for name in names:
        p = preds[name]
        pm = _average(p, e["average"])
        labelled = bool((p["labels"] >= 0).all())
        out["ood"][name] = {
            "classification": (classification_report(pm["probs"], p["labels"],
                                                     logits=p["logits"], metrics=e["metrics"])
                               if labelled else None),
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
