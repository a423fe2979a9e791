"""Predictive entropy, mutual information, predictive variance and predicted-class std."""

from __future__ import annotations

import math

import pytest
import torch

from gpattn_ppl.metrics import (
    expected_entropy,
    mutual_information,
    predicted_class_std,
    predictive_entropy,
    predictive_variance,
)

D = torch.float64
# two passes on one sample: [.8, .2] and [.4, .6] -> pbar = [.6, .4], predicted class 0
P = torch.tensor([[[0.8, 0.2]], [[0.4, 0.6]]], dtype=D)


def _h(*p: float) -> float:
    return -sum(x * math.log(x) for x in p if x > 0)


def test_hand_values():
    # H(.6,.4) = .673012 ; E_t H = (H(.8,.2) + H(.4,.6))/2 = (.500402 + .673012)/2 = .586707
    # MI = .673012 - .586707 = .086305
    assert predictive_entropy(P).item() == pytest.approx(_h(0.6, 0.4))
    assert predictive_entropy(P).item() == pytest.approx(0.6730116670092565)
    assert expected_entropy(P).item() == pytest.approx((_h(0.8, 0.2) + _h(0.4, 0.6)) / 2)
    assert mutual_information(P).item() == pytest.approx(0.08630462173553433)
    # class 0: values .8, .4 around .6 -> var .04 ; class 1: .2, .6 -> .04 ; mean .04
    assert predictive_variance(P).item() == pytest.approx(0.04)
    # predicted class 0: std of (.8, .4) with ddof 0 = .2
    assert predicted_class_std(P).item() == pytest.approx(0.2)


def test_decomposition_and_bounds(probs_factory):
    p = probs_factory(6, 100, 4, seed=13)
    h, eh, mi = predictive_entropy(p), expected_entropy(p), mutual_information(p)
    assert torch.allclose(h, eh + mi)
    assert bool((mi >= 0).all()) and bool((h <= math.log(4) + 1e-12).all())
    std = predicted_class_std(p)
    assert bool((std >= 0).all()) and bool((std <= 0.5).all())
    # predicted-class std agrees with a per-sample loop
    pred = p.mean(0).argmax(-1)
    loop = torch.stack([p[:, i, pred[i]].std(correction=0) for i in range(100)])
    assert torch.allclose(std, loop)


def test_single_pass_gives_zero_epistemic():
    p = torch.tensor([[0.7, 0.3], [0.5, 0.5]], dtype=D)
    assert predictive_entropy(p).tolist() == pytest.approx([_h(0.7, 0.3), math.log(2)])
    for fn in (mutual_information, predictive_variance, predicted_class_std):
        assert fn(p).tolist() == [0.0, 0.0]


def test_zero_probabilities_are_safe():
    # 0 log 0 = 0: a one-hot prediction has zero entropy, not NaN
    p = torch.tensor([[[1.0, 0.0]], [[0.0, 1.0]]], dtype=D)
    assert expected_entropy(p).item() == 0.0
    assert mutual_information(p).item() == pytest.approx(math.log(2))
    assert predictive_variance(p).item() == pytest.approx(0.25)
