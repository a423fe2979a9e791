"""classification_report: agreement with the individual metrics, names, options."""

from __future__ import annotations

import inspect
import math

import pytest
import torch

import gpattn_ppl.metrics as metrics_pkg
from gpattn_ppl.metrics import (
    HIGHER_IS_BETTER,
    METRIC_NAMES,
    accuracy,
    aurc,
    brier_score,
    classification_report,
    eaurc,
    expected_calibration_error,
    failure_aupr_error,
    failure_aupr_success,
    failure_auroc,
    failure_fpr95,
    matthews_corrcoef,
    maximum_calibration_error,
    mutual_information,
    negative_log_likelihood,
    predicted_class_std,
    predictive_entropy,
)

ALL = [
    "acc",
    "mcc",
    "nll",
    "brier",
    "ece",
    "mce",
    "aurc",
    "eaurc",
    "fail_auroc",
    "fail_aupr_success",
    "fail_aupr_error",
    "fail_fpr95",
    "entropy",
    "mutual_info",
    "pred_std",
]


def test_every_metric_matches_its_function(random_data):
    probs, labels = random_data
    report = classification_report(probs, labels)
    assert list(report) == ALL
    assert all(type(v) is float for v in report.values())
    expected = {
        "acc": accuracy(probs, labels),
        "mcc": matthews_corrcoef(probs, labels),
        "nll": negative_log_likelihood(probs, labels),
        "brier": brier_score(probs, labels),
        "ece": expected_calibration_error(probs, labels),
        "mce": maximum_calibration_error(probs, labels),
        "aurc": aurc(probs, labels),
        "eaurc": eaurc(probs, labels),
        "fail_auroc": failure_auroc(probs, labels),
        "fail_aupr_success": failure_aupr_success(probs, labels),
        "fail_aupr_error": failure_aupr_error(probs, labels),
        "fail_fpr95": failure_fpr95(probs, labels),
        "entropy": predictive_entropy(probs).mean().item(),
        "mutual_info": mutual_information(probs).mean().item(),
        "pred_std": predicted_class_std(probs).mean().item(),
    }
    assert report == pytest.approx(expected, abs=1e-14)


def test_subset_order_and_aliases(random_data):
    probs, labels = random_data
    report = classification_report(probs, labels, metrics=["ece", "auroc", "fpr95", "accuracy"])
    assert list(report) == ["ece", "auroc", "fpr95", "accuracy"]
    assert report["auroc"] == failure_auroc(probs, labels)
    assert report["fpr95"] == failure_fpr95(probs, labels)
    assert report["accuracy"] == accuracy(probs, labels)


def test_unknown_metric_lists_allowed(random_data):
    with pytest.raises(ValueError, match=r"unknown metric\(s\) \['f1'\].*allowed: acc, mcc"):
        classification_report(*random_data, metrics=["acc", "f1"])


def test_average_logits_uses_mean_logits():
    # passes: logits [4, 0] and [-2, 0] for one sample, label 0
    # probs average: (sigmoid(4) + sigmoid(-2))/2 = (.982014 + .119203)/2 = .550609 -> NLL .596731
    # logits average: mean logits [1, 0] -> p = sigmoid(1) = .731059 -> NLL .313262
    logits = torch.tensor([[[4.0, 0.0]], [[-2.0, 0.0]]], dtype=torch.float64)
    probs = torch.softmax(logits, -1)
    y = torch.tensor([0])
    by_probs = classification_report(probs, y, logits, metrics=["nll"])["nll"]
    by_logits = classification_report(probs, y, logits, metrics=["nll"], average="logits")["nll"]
    sig = lambda x: 1 / (1 + math.exp(-x))  # noqa: E731
    assert by_probs == pytest.approx(-math.log((sig(4) + sig(-2)) / 2))
    assert by_logits == pytest.approx(-math.log(sig(1)))
    with pytest.raises(ValueError, match="needs logits"):
        classification_report(probs, y, metrics=["nll"], average="logits")
    with pytest.raises(ValueError, match="average"):
        classification_report(probs, y, metrics=["nll"], average="median")


def test_logits_shape_checked(random_data):
    probs, labels = random_data
    with pytest.raises(ValueError, match="logits must have the shape"):
        classification_report(probs, labels, logits=torch.zeros(2, 200, 4))


def test_n_bins_forwarded(random_data):
    probs, labels = random_data
    report = classification_report(probs, labels, metrics=["ece"], n_bins=10)
    assert report["ece"] == pytest.approx(expected_calibration_error(probs, labels, n_bins=10))


def test_names_tables_cover_every_key():
    keys = set(ALL) | {"auroc", "aupr_in", "aupr_out", "fpr95"}
    assert set(METRIC_NAMES) == keys
    assert set(HIGHER_IS_BETTER) == keys
    assert HIGHER_IS_BETTER["ece"] is False and HIGHER_IS_BETTER["mcc"] is True
    assert HIGHER_IS_BETTER["fpr95"] is False and HIGHER_IS_BETTER["aupr_out"] is True


def test_all_is_complete():
    public = {
        name
        for name, obj in vars(metrics_pkg).items()
        if not name.startswith("_") and (inspect.isfunction(obj) or inspect.isclass(obj))
    }
    assert public <= set(metrics_pkg.__all__)
    assert all(hasattr(metrics_pkg, name) for name in metrics_pkg.__all__)
    for mod_name in (
        "calibration",
        "classification",
        "failure",
        "ood_detection",
        "report",
        "selective",
        "uncertainty",
    ):
        mod = getattr(metrics_pkg, mod_name)
        defined = {
            n
            for n, o in vars(mod).items()
            if not n.startswith("_")
            and (inspect.isfunction(o) or inspect.isclass(o))
            and o.__module__ == mod.__name__
        }
        assert defined == set(mod.__all__) - {"METRIC_NAMES", "HIGHER_IS_BETTER"}, mod_name
