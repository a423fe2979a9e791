"""Failure prediction: AUROC, AUPR-Success/Error, FPR95 (hand values, brute force, nan cases)."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from sklearn.metrics import roc_curve

from gpattn_ppl.metrics import (
    failure_aupr_error,
    failure_aupr_success,
    failure_auroc,
    failure_fpr95,
)

D = torch.float64


def _two_class(conf: list[float]) -> torch.Tensor:
    c = torch.tensor(conf, dtype=D)
    return torch.stack([c, 1 - c], -1)


def _fpr95_brute_force(scores: np.ndarray, positive: np.ndarray) -> float:
    """Try every candidate threshold; keep the largest with TPR >= 0.95."""
    best = -np.inf
    for t in np.unique(scores):
        if np.mean(scores[positive] >= t) >= 0.95:
            best = max(best, t)
    return float(np.mean(scores[~positive] >= best))


@pytest.fixture
def four():
    # conf .9 (correct) .8 (wrong) .7 (correct) .6 (wrong)
    return _two_class([0.9, 0.8, 0.7, 0.6]), torch.tensor([0, 1, 0, 1])


def test_auroc_hand(four):
    # pairs (correct, wrong): (.9,.8) (.9,.6) (.7,.6) ranked right, (.7,.8) wrong -> 3/4
    assert failure_auroc(*four) == pytest.approx(0.75)


def test_auroc_ties_count_half():
    # one correct and one wrong at the same confidence -> 0.5
    assert failure_auroc(_two_class([0.7, 0.7]), torch.tensor([0, 1])) == pytest.approx(0.5)


def test_aupr_success_hand(four):
    # ranked .9 C, .8 W, .7 C, .6 W: precision at the two hits 1 and 2/3 -> AP = (1 + 2/3)/2
    assert failure_aupr_success(*four) == pytest.approx(5 / 6)


def test_aupr_error_hand():
    # scores -conf: ranked .6 W, .7 W, .8 C, .9 C -> AP = 1 for errors ranked first
    assert failure_aupr_error(_two_class([0.9, 0.8, 0.7, 0.6]), torch.tensor([0, 0, 1, 1])) == 1.0
    # ranked .6 C, .7 W, .8 C, .9 W -> hits at ranks 2 and 4: (1/2 + 2/4)/2 = 0.5
    assert failure_aupr_error(_two_class([0.9, 0.8, 0.7, 0.6]), torch.tensor([1, 0, 1, 0])) == 0.5


def test_fpr95_hand_small(four):
    # P = 2 correct -> k = ceil(1.9) = 2 -> t = .7 ; errors >= .7: {.8} of {.8, .6} -> 0.5
    assert failure_fpr95(*four) == 0.5


def test_fpr95_hand_exact_95_percent_and_tie():
    # 20 correct at .99, .98, ..., .80 -> k = ceil(.95 * 20) = 19 -> t = .81 (TPR exactly .95)
    # errors .95 .85 .81 .805 .70 -> >= .81 (tie counts): .95 .85 .81 -> 3/5
    ok = [round(0.99 - 0.01 * j, 2) for j in range(20)]
    bad = [0.95, 0.85, 0.81, 0.805, 0.70]
    p = _two_class(ok + bad)
    y = torch.tensor([0] * 20 + [1] * 5)
    assert failure_fpr95(p, y) == pytest.approx(0.6)


def test_fpr95_matches_brute_force_and_roc_curve(probs_factory):
    p = probs_factory(2, 400, 3, seed=11)
    pbar = p.mean(0)
    conf, pred = pbar.max(-1)
    y = pred.clone()
    y[::3] = (y[::3] + 1) % 3  # a third wrong
    correct = (pred == y).numpy()
    expected = _fpr95_brute_force(conf.numpy(), correct)
    assert failure_fpr95(p, y) == pytest.approx(expected, abs=1e-15)
    fpr, tpr, _ = roc_curve(correct, conf.numpy(), drop_intermediate=False)
    assert failure_fpr95(p, y) == pytest.approx(fpr[np.argmax(tpr >= 0.95)], abs=1e-15)


def test_undefined_cases_are_nan():
    p = _two_class([0.9, 0.7])
    all_right, all_wrong = torch.tensor([0, 0]), torch.tensor([1, 1])
    for fn in (failure_auroc, failure_aupr_error, failure_fpr95):
        assert math.isnan(fn(p, all_right))
    for fn in (failure_auroc, failure_aupr_success, failure_fpr95):
        assert math.isnan(fn(p, all_wrong))
    assert failure_aupr_success(p, all_right) == 1.0
    assert failure_aupr_error(p, all_wrong) == 1.0


def test_perfect_separation():
    p = _two_class([0.99, 0.95, 0.6, 0.55])
    y = torch.tensor([0, 0, 1, 1])
    assert failure_auroc(p, y) == 1.0
    assert failure_aupr_success(p, y) == 1.0
    assert failure_aupr_error(p, y) == 1.0
    assert failure_fpr95(p, y) == 0.0
