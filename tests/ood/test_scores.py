"""OOD scores by name: hand values, sign convention (higher = more ID), required inputs."""

from __future__ import annotations

import math

import pytest
import torch

import gpattn_ppl.ood as ood_pkg
from gpattn_ppl.ood import SCORE_NAMES, kl_matching_templates, ood_score

D = torch.float64
# two passes, one sample: [.8, .2] and [.4, .6] -> pbar = [.6, .4], predicted class 0
P = torch.tensor([[[0.8, 0.2]], [[0.4, 0.6]]], dtype=D)
TEMPLATES = torch.tensor([[0.7, 0.3], [0.1, 0.9]], dtype=D)


def test_max_softmax_uses_model_average():
    # max of the mean (.6), not the mean of per-pass maxima ((.8 + .6)/2 = .7)
    assert ood_score("max_softmax", P).tolist() == pytest.approx([0.6])


def test_entropy_is_negative_entropy():
    # .6 ln .6 + .4 ln .4 = -.673012
    assert ood_score("entropy", P).item() == pytest.approx(
        0.6 * math.log(0.6) + 0.4 * math.log(0.4)
    )


def test_energy_uses_mean_logits():
    # logits [1, 2] and [3, 0] -> mean [2, 1] -> logsumexp = 2 + ln(1 + e^-1) = 2.313262
    # (the mean of per-pass logsumexps would be (2.313262 + 3.048587)/2)
    logits = torch.tensor([[[1.0, 2.0]], [[3.0, 0.0]]], dtype=D)
    probs = torch.softmax(logits, -1)
    assert ood_score("energy", probs, logits).item() == pytest.approx(
        2 + math.log(1 + math.exp(-1))
    )


def test_kl_matching_hand_value():
    # pbar [.6, .4], predicted 0, template d_0 = [.7, .3]
    # KL = .6 ln(.6/.7) + .4 ln(.4/.3) = -.092490 + .115073 = .022582 -> score -.022582
    assert ood_score("kl_matching", P, templates=TEMPLATES).item() == pytest.approx(
        -0.022582421084357485
    )
    # a prediction equal to its class template scores the maximum, 0
    assert ood_score("kl_matching", TEMPLATES[:1], templates=TEMPLATES).item() == pytest.approx(0.0)


def test_templates_from_validation_predictions():
    # predictions 0, 0, 1 -> d_0 = mean([.8,.2], [.6,.4]) = [.7,.3], d_1 = [.1,.9]
    val = torch.tensor([[0.8, 0.2], [0.6, 0.4], [0.1, 0.9]], dtype=D)
    assert torch.allclose(kl_matching_templates(val), TEMPLATES)
    # averaged over passes first
    assert torch.allclose(kl_matching_templates(torch.stack([val, val])), TEMPLATES)


def test_template_for_unpredicted_class_is_uniform_with_warning():
    val = torch.tensor([[0.8, 0.1, 0.1], [0.6, 0.3, 0.1]], dtype=D)
    with pytest.warns(UserWarning, match=r"classes \[1, 2\] are never predicted"):
        d = kl_matching_templates(val)
    assert torch.allclose(d[1:], torch.full((2, 3), 1 / 3, dtype=D))


def test_mutual_info_and_variance_are_negated():
    # MI = H(.6,.4) - (H(.8,.2) + H(.4,.6))/2 = .086305 ; variance mean over classes = .04
    assert ood_score("mutual_info", P).item() == pytest.approx(-0.08630462173553433)
    assert ood_score("pred_variance", P).item() == pytest.approx(-0.04)
    assert torch.equal(ood_score("gp_variance", P), ood_score("pred_variance", P))


def test_higher_means_more_in_distribution():
    # a confident, consistent sample must outscore a flat, disagreeing one for every detector
    conf = torch.tensor([[0.95, 0.05], [0.97, 0.03]], dtype=D)
    flat = torch.tensor([[0.7, 0.3], [0.2, 0.8]], dtype=D)
    probs = torch.stack([conf, flat], 1)  # [T=2, n=2, K=2]
    logits = probs.log()
    templates = torch.tensor([[0.96, 0.04], [0.04, 0.96]], dtype=D)
    for name in SCORE_NAMES:
        s = ood_score(name, probs, logits, templates)
        assert s.shape == (2,) and s.dtype == D
        assert s[0] > s[1], name


def test_two_d_input_is_single_pass():
    p = torch.tensor([[0.7, 0.3], [0.5, 0.5]], dtype=D)
    assert torch.equal(ood_score("max_softmax", p), ood_score("max_softmax", p.unsqueeze(0)))


def test_unknown_name_lists_allowed():
    with pytest.raises(ValueError, match="unknown OOD score 'odin'; allowed: max_softmax, entropy"):
        ood_score("odin", P)


@pytest.mark.parametrize("name", ["mutual_info", "pred_variance", "gp_variance"])
def test_single_pass_rejected_for_epistemic_scores(name):
    with pytest.raises(ValueError, match="needs T > 1"):
        ood_score(name, P[0])


def test_missing_or_bad_inputs():
    with pytest.raises(ValueError, match="needs logits"):
        ood_score("energy", P)
    with pytest.raises(ValueError, match=r"logits must have the shape"):
        ood_score("energy", P, torch.zeros(3, 1, 2))
    with pytest.raises(ValueError, match="validation"):
        ood_score("kl_matching", P)
    with pytest.raises(ValueError, match=r"templates must have shape \[K, K\]"):
        ood_score("kl_matching", P, templates=torch.eye(3))
    with pytest.raises(ValueError, match="rows must sum to 1"):
        ood_score("kl_matching", P, templates=2 * TEMPLATES)
    with pytest.raises(ValueError, match="sum to 1"):
        ood_score("max_softmax", torch.randn(2, 3).abs() + 1)


def test_all_is_complete():
    assert set(ood_pkg.__all__) == {"DETECTOR_NAMES", "SCORE_NAMES", "ood_score",
                                    "kl_matching_templates", "ood_report", "SHIFT_METRICS",
                                    "CGPT_CATEGORIES", "shift_summary", "OOD_DETECTORS",
                                    "OODDetector", "DETECTOR_NEEDS", "register_ood_detector"}
    assert all(hasattr(ood_pkg, n) for n in ood_pkg.__all__)
