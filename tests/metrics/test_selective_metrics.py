"""Risk-coverage curve, AURC and E-AURC: hand values, tie rule, undefined cases, Metric."""

from __future__ import annotations

import math

import pytest
import torch

from gpattn_ppl.metrics import AURC, aurc, eaurc, risk_coverage_curve

D = torch.float64


def _two_class(conf: list[float]) -> torch.Tensor:
    c = torch.tensor(conf, dtype=D)
    return torch.stack([c, 1 - c], -1)


def _naive_aurc(conf: list[float], correct: list[bool]) -> float:
    """Python sort (stable) by -conf, then the running risk, summed by hand."""
    order = sorted(range(len(conf)), key=lambda i: -conf[i])
    errors, total = 0, 0.0
    for k, i in enumerate(order, start=1):
        errors += not correct[i]
        total += errors / k
    return total / len(conf)


def test_hand_computed():
    # conf .9 .8 .7 .6, correct 1 0 1 0 -> risk_k = 0, 1/2, 1/3, 2/4
    # AURC = (0 + .5 + .3333 + .5)/4 = 1/3 ; r = .5 -> E-AURC = 1/3 - (.5 + .5 ln .5) = .179907
    p = _two_class([0.9, 0.8, 0.7, 0.6])
    y = torch.tensor([0, 1, 0, 1])
    cov, risk = risk_coverage_curve(p, y)
    assert cov.tolist() == [0.25, 0.5, 0.75, 1.0]
    assert risk.tolist() == pytest.approx([0.0, 0.5, 1 / 3, 0.5])
    assert aurc(p, y) == pytest.approx(1 / 3)
    assert eaurc(p, y) == pytest.approx(1 / 3 - (0.5 + 0.5 * math.log(0.5)))
    assert eaurc(p, y) == pytest.approx(0.17990692361330596)


def test_ties_broken_by_index():
    # equal confidences: the earlier sample is accepted first
    # [wrong, right] -> risk 1, 1/2 -> AURC .75 ; [right, wrong] -> risk 0, 1/2 -> .25
    p = _two_class([0.8, 0.8])
    assert aurc(p, torch.tensor([1, 0])) == pytest.approx(0.75)
    assert aurc(p, torch.tensor([0, 1])) == pytest.approx(0.25)


def test_sorted_by_confidence_not_by_index():
    # sample 0 (.6) correct, sample 1 (.9) wrong: index order would give risk 0, 1/2 (.25);
    # confidence order accepts the wrong .9 first: risk 1, 1/2 -> .75 (and vice versa)
    p = _two_class([0.6, 0.9])
    assert aurc(p, torch.tensor([0, 1])) == pytest.approx(0.75)
    assert aurc(p, torch.tensor([1, 0])) == pytest.approx(0.25)


def test_all_wrong_eaurc_undefined():
    p = _two_class([0.9, 0.7, 0.6])
    y = torch.tensor([1, 1, 1])
    assert aurc(p, y) == pytest.approx(1.0)
    assert math.isnan(eaurc(p, y))


def test_all_correct_is_zero():
    p = _two_class([0.9, 0.7, 0.6])
    y = torch.tensor([0, 0, 0])
    assert aurc(p, y) == 0.0
    assert eaurc(p, y) == 0.0


def test_oracle_ranking_close_to_optimum_for_large_n():
    # errors ranked last: AURC = (1/n) sum_{k > n(1-r)} (k - n(1-r))/k -> r + (1-r) ln(1-r)
    n, n_err = 10000, 2500
    conf = torch.linspace(0.99, 0.51, n, dtype=D)
    y = torch.zeros(n, dtype=torch.long)
    y[-n_err:] = 1
    assert abs(eaurc(_two_class(conf.tolist()), y)) < 1e-3


def test_matches_naive_reference_with_ties(probs_factory):
    p = probs_factory(1, 200, 2, seed=9)[0]
    p = torch.round(p * 10) / 10  # many ties
    y = torch.arange(200) % 2
    conf, pred = p.max(-1)
    assert aurc(p, y) == pytest.approx(_naive_aurc(conf.tolist(), (pred == y).tolist()), abs=1e-12)


class TestAURCMetric:
    @pytest.mark.parametrize("excess", [False, True])
    def test_streaming_equals_functional(self, random_data, excess):
        probs, labels = random_data
        metric = AURC(excess=excess)
        for chunk in torch.arange(labels.numel()).split(64):
            metric.update(probs[:, chunk], labels[chunk])
        fn = eaurc if excess else aurc
        assert float(metric.compute()) == pytest.approx(fn(probs, labels), abs=1e-14)

    def test_merge_state(self, random_data):
        probs, labels = random_data
        a, b = AURC(), AURC()
        a.update(probs[:, :120], labels[:120])
        b.update(probs[:, 120:], labels[120:])
        a.merge_state(b)
        assert float(a.compute()) == pytest.approx(aurc(probs, labels), abs=1e-14)
        assert a._reductions["confidences"].__name__ == "dim_zero_cat"
