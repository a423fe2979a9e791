"""Every metric rejects malformed input with a ValueError that names the problem."""

from __future__ import annotations

import pytest
import torch

from gpattn_ppl import metrics as M

GOOD_P = torch.tensor([[0.7, 0.3], [0.4, 0.6], [0.5, 0.5]], dtype=torch.float64)
GOOD_Y = torch.tensor([0, 1, 1])

LABELLED = [
    M.accuracy,
    M.matthews_corrcoef,
    M.negative_log_likelihood,
    M.brier_score,
    M.expected_calibration_error,
    M.maximum_calibration_error,
    M.calibration_bins,
    M.aurc,
    M.eaurc,
    M.risk_coverage_curve,
    M.failure_auroc,
    M.failure_aupr_success,
    M.failure_aupr_error,
    M.failure_fpr95,
    M.classification_report,
]
UNLABELLED = [
    M.predictive_entropy,
    M.expected_entropy,
    M.mutual_information,
    M.predictive_variance,
    M.predicted_class_std,
]

BAD_PROBS = [
    (torch.tensor([0.5, 0.5]), r"must have shape \[n, K\] or \[T, n, K\]"),
    (torch.full((1, 1, 3, 2), 0.5), r"must have shape \[n, K\] or \[T, n, K\]"),
    (torch.zeros(0, 2), "empty"),
    (torch.tensor([[0.5, float("nan")], [0.5, 0.5], [0.5, 0.5]]), "NaN or inf"),
    (torch.tensor([[float("inf"), 0.0], [0.5, 0.5], [0.5, 0.5]]), "NaN or inf"),
    (torch.tensor([[2.0, -1.0], [0.5, 0.5], [0.5, 0.5]]), "negative"),
    (torch.tensor([[0.7, 0.31], [0.4, 0.6], [0.5, 0.5]]), "sum to 1"),
    (torch.tensor([[1, 0], [0, 1], [1, 0]]), "floating"),
]

BAD_LABELS = [
    (torch.tensor([0, 1]), "length 2 but the probabilities have n = 3"),
    (torch.tensor([0, 2, 1]), r"must lie in \[0, 2\)"),
    (torch.tensor([0, -1, 1]), r"must lie in \[0, 2\)"),
    (torch.tensor([0.0, 1.0, 1.0]), "integer"),
    (torch.tensor([[0, 1, 1]]), r"labels must have shape \[n\]"),
    (None, "labels is required"),
]


def test_sum_tolerance_is_1e_3():
    # |sum - 1| = 5e-4 passes, 2e-3 fails
    M.accuracy(torch.tensor([[0.7, 0.3005]]), torch.tensor([0]))
    with pytest.raises(ValueError, match="sum to 1"):
        M.accuracy(torch.tensor([[0.7, 0.302]]), torch.tensor([0]))


@pytest.mark.parametrize("fn", LABELLED, ids=lambda f: f.__name__)
@pytest.mark.parametrize(("probs", "match"), BAD_PROBS)
def test_bad_probs_labelled(fn, probs, match):
    y = torch.zeros(probs.shape[-2] if probs.dim() >= 2 else 1, dtype=torch.long)
    with pytest.raises(ValueError, match=match):
        fn(probs, y)


@pytest.mark.parametrize("fn", UNLABELLED, ids=lambda f: f.__name__)
@pytest.mark.parametrize(("probs", "match"), BAD_PROBS)
def test_bad_probs_unlabelled(fn, probs, match):
    with pytest.raises(ValueError, match=match):
        fn(probs)


@pytest.mark.parametrize("fn", LABELLED, ids=lambda f: f.__name__)
@pytest.mark.parametrize(("labels", "match"), BAD_LABELS)
def test_bad_labels(fn, labels, match):
    with pytest.raises(ValueError, match=match):
        fn(GOOD_P, labels)


def test_metric_update_validates():
    metric = M.CalibrationError()
    with pytest.raises(ValueError, match="sum to 1"):
        metric.update(torch.rand(4, 3) + 0.5, torch.zeros(4, dtype=torch.long))
    with pytest.raises(ValueError, match="length"):
        M.AURC().update(GOOD_P, torch.tensor([0]))


def test_accepts_lists_numpy_and_both_layouts():
    ref = M.classification_report(GOOD_P, GOOD_Y)
    as_list = M.classification_report(GOOD_P.tolist(), GOOD_Y.tolist())
    stacked = M.classification_report(GOOD_P.unsqueeze(0), GOOD_Y.numpy())
    assert as_list == pytest.approx(ref, nan_ok=True)
    assert stacked == pytest.approx(ref, nan_ok=True)
