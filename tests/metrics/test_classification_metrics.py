"""Accuracy, MCC, NLL and Brier: hand-computed values, limits, edge cases."""

from __future__ import annotations

import math

import numpy as np
import pytest
import sklearn.metrics
import torch

from gpattn_ppl.metrics import (
    accuracy,
    brier_score,
    matthews_corrcoef,
    negative_log_likelihood,
)

D = torch.float64


def _binary_probs(pred: list[int], conf: float = 0.8) -> torch.Tensor:
    """[n, 2] probabilities predicting ``pred`` with confidence ``conf``."""
    p = torch.tensor(pred, dtype=D)
    p1 = conf * p + (1 - conf) * (1 - p)
    return torch.stack([1 - p1, p1], -1)


class TestAccuracy:
    def test_model_average_before_argmax(self):
        # pass 1: [.9,.1] [.4,.6]; pass 2: [.3,.7] [.2,.8] -> pbar = [.6,.4] [.3,.7] -> preds 0, 1
        # labels 0, 1 -> acc = 1.0 (the mean of per-pass accuracies would be (1 + 0.5)/2 = 0.75)
        p = torch.tensor([[[0.9, 0.1], [0.4, 0.6]], [[0.3, 0.7], [0.2, 0.8]]], dtype=D)
        assert accuracy(p, torch.tensor([0, 1])) == 1.0

    def test_hand_value_and_type(self):
        # preds 0, 1, 0 vs labels 0, 1, 1 -> 2/3
        value = accuracy(
            torch.tensor([[0.9, 0.1], [0.2, 0.8], [0.6, 0.4]]), torch.tensor([0, 1, 1])
        )
        assert isinstance(value, float)
        assert value == pytest.approx(2 / 3)

    def test_argmax_tie_takes_first_class(self):
        p = torch.tensor([[0.5, 0.5]], dtype=D)
        assert accuracy(p, torch.tensor([0])) == 1.0
        assert accuracy(p, torch.tensor([1])) == 0.0

    def test_two_d_equals_single_pass(self, probs_factory):
        p = probs_factory(1, 50, 3)
        y = torch.arange(50) % 3
        assert accuracy(p[0], y) == accuracy(p, y)


class TestMCC:
    def test_hand_value(self):
        # pred  1 1 0 1 0 0 ; label 1 0 0 1 1 0 -> TP=2 FP=1 TN=2 FN=1
        # MCC = (2*2 - 1*1) / sqrt(3*3*3*3) = 3/9 = 1/3
        p = _binary_probs([1, 1, 0, 1, 0, 0])
        assert matthews_corrcoef(p, torch.tensor([1, 0, 0, 1, 1, 0])) == pytest.approx(1 / 3)

    def test_limits(self):
        y = torch.tensor([1, 0, 0, 1, 1, 0])
        assert matthews_corrcoef(_binary_probs(y.tolist()), y) == pytest.approx(1.0)
        assert matthews_corrcoef(_binary_probs((1 - y).tolist()), y) == pytest.approx(-1.0)

    def test_zero_denominator_constant_prediction(self):
        # every prediction 1 -> TN + FN = 0 -> denominator 0 -> MCC = 0
        assert matthews_corrcoef(_binary_probs([1, 1, 1, 1]), torch.tensor([1, 0, 1, 0])) == 0.0

    def test_zero_denominator_single_true_class(self):
        # every label 1 -> TN + FP = 0 -> 0 (scikit-learn warns here; we must not)
        assert matthews_corrcoef(_binary_probs([1, 0, 1]), torch.tensor([1, 1, 1])) == 0.0

    @pytest.mark.parametrize("k", [2, 3, 5])
    def test_agrees_with_sklearn(self, probs_factory, k):
        p = probs_factory(2, 300, k, seed=k)
        y = (p.mean(0).argmax(-1) + (torch.arange(300) % 4 == 0).long()) % k
        expected = sklearn.metrics.matthews_corrcoef(y.numpy(), p.mean(0).argmax(-1).numpy())
        assert matthews_corrcoef(p, y) == pytest.approx(expected, abs=1e-12)


class TestNLL:
    def test_hand_value(self):
        # true-class probabilities 0.5 and 0.25 -> (ln 2 + ln 4) / 2 = 1.5 ln 2
        p = torch.tensor([[0.5, 0.5, 0.0], [0.25, 0.5, 0.25]], dtype=D)
        assert negative_log_likelihood(p, torch.tensor([1, 2])) == pytest.approx(1.5 * math.log(2))

    def test_clamped_at_1e_12(self):
        # true-class probability 0 -> -ln(1e-12) = 27.631...; with a perfect sample: half of that
        p = torch.tensor([[1.0, 0.0], [1.0, 0.0]], dtype=D)
        value = negative_log_likelihood(p, torch.tensor([1, 0]))
        assert math.isfinite(value)
        assert value == pytest.approx(-math.log(1e-12) / 2, rel=1e-12)

    def test_averages_probabilities_not_losses(self):
        # passes give p(y) = 1 and 0 -> pbar(y) = 0.5 -> NLL = ln 2 (not the clamped mean 13.8)
        p = torch.tensor([[[0.0, 1.0]], [[1.0, 0.0]]], dtype=D)
        assert negative_log_likelihood(p, torch.tensor([1])) == pytest.approx(math.log(2))


class TestBrier:
    def test_hand_value(self):
        # [.7,.2,.1] label 0: .09+.04+.01 = .14 ; [.1,.1,.8] label 2: .01+.01+.04 = .06 -> 0.10
        p = torch.tensor([[0.7, 0.2, 0.1], [0.1, 0.1, 0.8]], dtype=D)
        assert brier_score(p, torch.tensor([0, 2])) == pytest.approx(0.10)

    def test_range_limits(self):
        onehot = torch.eye(3, dtype=D)
        assert brier_score(onehot, torch.tensor([0, 1, 2])) == 0.0
        assert brier_score(onehot, torch.tensor([1, 2, 0])) == pytest.approx(2.0)

    def test_matches_numpy_brute_force(self, probs_factory):
        p = probs_factory(4, 100, 5, seed=3)
        y = torch.arange(100) % 5
        pbar = p.mean(0).numpy()
        expected = np.mean([np.sum((pbar[i] - np.eye(5)[y[i]]) ** 2) for i in range(100)])
        assert brier_score(p, y) == pytest.approx(expected, rel=1e-12)


def test_float32_numpy_input_and_permutation_invariance(probs_factory):
    p = probs_factory(2, 64, 3, seed=5)
    y = torch.arange(64) % 3
    perm = torch.randperm(64, generator=torch.Generator().manual_seed(0))
    for fn in (accuracy, matthews_corrcoef, negative_log_likelihood, brier_score):
        base = fn(p, y)
        assert fn(p[:, perm], y[perm]) == pytest.approx(base, rel=1e-12, abs=1e-12)
        assert fn(p.float().numpy(), y.numpy()) == pytest.approx(base, rel=1e-5, abs=1e-6)
