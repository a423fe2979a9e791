"""ECE / MCE: hand values, the bin convention ((m-1)/15, m/15], torchmetrics comparison, Metric."""

from __future__ import annotations

import pytest
import torch
from torchmetrics.classification import MulticlassCalibrationError

from gpattn_ppl.metrics import (
    CalibrationError,
    calibration_bins,
    expected_calibration_error,
    maximum_calibration_error,
)
from gpattn_ppl.metrics.calibration import bin_index

D = torch.float64


def _two_class(conf: list[float]) -> torch.Tensor:
    """[n, 2] float64 probabilities whose top label is class 0 with confidence ``conf``."""
    c = torch.tensor(conf, dtype=D)
    return torch.stack([c, 1 - c], -1)


def _reference_bins(conf: torch.Tensor, correct: torch.Tensor, n_bins: int):
    """Naive loop over bins with the interval conditions written out."""
    ece, mce, n = 0.0, 0.0, conf.numel()
    for m in range(1, n_bins + 1):
        lo, hi = (m - 1) / n_bins, m / n_bins
        inside = (conf > lo) & (conf <= hi)
        if m == 1:
            inside |= conf == 0
        if m == n_bins:
            inside |= conf > 1
        if inside.any():
            gap = abs(correct[inside].double().mean().item() - conf[inside].mean().item())
            ece += inside.sum().item() / n * gap
            mce = max(mce, gap)
    return ece, mce


def test_hand_computed_ece_mce():
    # conf / correct (class 0 predicted; label 0 = correct):
    #   0.95 ok, 0.95 wrong, 1.00 ok -> bin 15 (14/15 = .933, 1]: acc 2/3, conf .96667, gap .3
    #   0.62 ok                      -> bin 10 (.6, .667]:         acc 1,   conf .62,    gap .38
    #   0.55 wrong                   -> bin 9  (.533, .6]:         acc 0,   conf .55,    gap .55
    # ECE = 3/5 * .3 + 1/5 * .38 + 1/5 * .55 = .18 + .076 + .11 = .366 ; MCE = .55
    p = _two_class([0.95, 0.95, 1.0, 0.62, 0.55])
    y = torch.tensor([0, 1, 0, 0, 1])
    assert expected_calibration_error(p, y) == pytest.approx(0.366, abs=1e-12)
    assert maximum_calibration_error(p, y) == pytest.approx(0.55, abs=1e-12)
    bins = calibration_bins(p, y)
    assert bins["count"].tolist() == [0] * 8 + [1, 1] + [0] * 4 + [3]
    assert bins["accuracy"][14].item() == pytest.approx(2 / 3)
    assert torch.isnan(bins["accuracy"][0])


def test_right_closed_bins_edge_goes_down():
    # conf = 9/15 = 0.6 (float64) lies in bin 9 = (8/15, 9/15], not bin 10
    assert calibration_bins(_two_class([0.6]), torch.tensor([0]))["count"][8].item() == 1.0
    just_above = torch.nextafter(torch.tensor(0.6, dtype=D), torch.tensor(1.0, dtype=D))
    assert calibration_bins(_two_class([just_above.item()]), torch.tensor([0]))["count"][9] == 1


def test_first_bin_takes_lowest_confidence():
    # uniform over 15 classes: conf = 1/15 exactly -> bin 1 = (0, 1/15]
    p = torch.full((1, 15), 1 / 15, dtype=D)
    assert calibration_bins(p, torch.tensor([3]))["count"][0].item() == 1.0
    # and conf = 0 (not reachable top-label, but part of the definition) is bin 1 too
    assert bin_index(torch.tensor([0.0, 1.0, 1.0 + 1e-9], dtype=D), 15).tolist() == [0, 14, 14]


def test_matches_naive_reference_including_edges(probs_factory):
    # random confidences plus confidences exactly on every edge m/15 >= 0.5
    p = torch.cat([probs_factory(1, 300, 2, seed=4)[0], _two_class([m / 15 for m in range(8, 16)])])
    y = torch.arange(p.shape[0]) % 2
    conf, pred = p.max(-1)
    ref_ece, ref_mce = _reference_bins(conf, pred == y, 15)
    assert expected_calibration_error(p, y) == pytest.approx(ref_ece, abs=1e-12)
    assert maximum_calibration_error(p, y) == pytest.approx(ref_mce, abs=1e-12)


def test_agrees_with_torchmetrics_away_from_edges(random_data):
    probs, labels = random_data
    pbar = probs.mean(0)
    for norm, fn in (("l1", expected_calibration_error), ("max", maximum_calibration_error)):
        tm = MulticlassCalibrationError(num_classes=4, n_bins=15, norm=norm)
        assert fn(probs, labels) == pytest.approx(float(tm(pbar, labels)), abs=1e-6)


def test_differs_from_torchmetrics_at_conf_one():
    # torchmetrics bins [(m-1)/15, m/15) and puts conf = 1.0 in a 16th bin of its own.
    # conf 1.0 wrong + conf 0.95 correct:
    #   ours: one bin (14/15, 1]: acc .5, conf .975 -> ECE = MCE = .475
    #   torchmetrics: |0 - 1|/2 + |1 - .95|/2 = .525, MCE = 1.0
    p = _two_class([1.0, 0.95])
    y = torch.tensor([1, 0])
    assert expected_calibration_error(p, y) == pytest.approx(0.475)
    assert maximum_calibration_error(p, y) == pytest.approx(0.475)
    tm_l1 = MulticlassCalibrationError(num_classes=2, n_bins=15, norm="l1")(p, y)
    tm_max = MulticlassCalibrationError(num_classes=2, n_bins=15, norm="max")(p, y)
    assert float(tm_l1) == pytest.approx(0.525)
    assert float(tm_max) == pytest.approx(1.0)


def test_perfectly_calibrated_bins_give_zero():
    # bin (.733, .8]: four samples at conf .75, three correct -> acc .75 = conf -> ECE 0
    p = _two_class([0.75] * 4)
    assert expected_calibration_error(p, torch.tensor([0, 0, 0, 1])) == pytest.approx(0.0)


def test_uses_model_average(probs_factory):
    p = probs_factory(5, 80, 3, seed=7)
    y = torch.arange(80) % 3
    assert expected_calibration_error(p, y) == pytest.approx(
        expected_calibration_error(p.mean(0), y)
    )
    assert expected_calibration_error(p, y) != pytest.approx(expected_calibration_error(p[0], y))


def test_permutation_invariant(random_data):
    probs, labels = random_data
    perm = torch.randperm(labels.numel(), generator=torch.Generator().manual_seed(1))
    assert expected_calibration_error(probs[:, perm], labels[perm]) == pytest.approx(
        expected_calibration_error(probs, labels), abs=1e-14
    )


def test_n_bins_validation():
    with pytest.raises(ValueError, match="n_bins"):
        expected_calibration_error(_two_class([0.7]), torch.tensor([0]), n_bins=0)


class TestCalibrationErrorMetric:
    @pytest.mark.parametrize("norm", ["l1", "max"])
    def test_streaming_equals_functional(self, random_data, norm):
        probs, labels = random_data
        metric = CalibrationError(n_bins=15, norm=norm)
        for chunk in torch.arange(labels.numel()).split(37):
            metric.update(probs[:, chunk], labels[chunk])
        fn = expected_calibration_error if norm == "l1" else maximum_calibration_error
        value = metric.compute()
        assert value.dtype == D
        assert float(value) == pytest.approx(fn(probs, labels), abs=1e-14)

    def test_merge_state_is_global_not_mean_of_parts(self):
        # part A: conf .95 correct (gap .05); part B: conf .95 wrong (gap .95)
        # global: one bin, acc .5 conf .95 -> .45 (mean of parts would be .5)
        a, b = CalibrationError(), CalibrationError()
        a.update(_two_class([0.95]), torch.tensor([0]))
        b.update(_two_class([0.95]), torch.tensor([1]))
        a.merge_state(b)
        assert float(a.compute()) == pytest.approx(0.45)

    def test_states_reduce_by_cat(self):
        metric = CalibrationError()
        assert metric._reductions["confidences"].__name__ == "dim_zero_cat"
        assert metric._reductions["correct"].__name__ == "dim_zero_cat"

    def test_bad_norm(self):
        with pytest.raises(ValueError, match="norm"):
            CalibrationError(norm="l2")


def test_metric_update_without_validation_gives_same_value(random_data):
    from gpattn_ppl import settings

    probs, labels = random_data
    checked, unchecked = CalibrationError(), CalibrationError()
    checked.update(probs, labels)
    with settings.validate_args(False):
        unchecked.update(probs.float(), labels)
    assert float(unchecked.compute()) == pytest.approx(float(checked.compute()), abs=1e-6)
