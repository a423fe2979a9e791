"""ood_report: default detectors, agreement with the scores and detection metrics, errors."""

from __future__ import annotations

import pytest
import torch

from gpattn_ppl.metrics import ood_detection_metrics
from gpattn_ppl.ood import kl_matching_templates, ood_report, ood_score


class TestOODReport:
    @pytest.fixture
    def sets(self):
        g = torch.Generator().manual_seed(3)
        id_logits = 3 * torch.randn(4, 60, 3, generator=g, dtype=torch.float64)
        ood_logits = 0.5 * torch.randn(4, 40, 3, generator=g, dtype=torch.float64)
        val = torch.softmax(3 * torch.randn(4, 90, 3, generator=g, dtype=torch.float64), -1)
        return (
            torch.softmax(id_logits, -1),
            id_logits,
            torch.softmax(ood_logits, -1),
            ood_logits,
            kl_matching_templates(val),
        )

    def test_default_detectors(self, sets):
        id_p, id_z, ood_p, ood_z, templates = sets
        full = ood_report(id_p, id_z, ood_p, ood_z, templates=templates)
        assert list(full) == [
            "max_softmax",
            "entropy",
            "energy",
            "kl_matching",
            "mutual_info",
            "pred_variance",
        ]
        assert all(list(v) == ["auroc", "aupr_in", "aupr_out", "fpr95"] for v in full.values())
        # single pass, no logits, no templates -> only what can be computed
        assert list(ood_report(id_p[0], None, ood_p[0])) == ["max_softmax", "entropy"]

    def test_values_match_scores_and_metrics(self, sets):
        id_p, id_z, ood_p, ood_z, templates = sets
        report = ood_report(
            id_p, id_z, ood_p, ood_z, detectors=["energy", "kl_matching"], templates=templates
        )
        for name in ("energy", "kl_matching"):
            expected = ood_detection_metrics(
                ood_score(name, id_p, id_z, templates), ood_score(name, ood_p, ood_z, templates)
            )
            assert report[name] == pytest.approx(expected)
        # sharper ID logits than OOD logits: MSP separates them better than chance
        assert ood_report(id_p, id_z, ood_p, ood_z)["max_softmax"]["auroc"] > 0.75

    def test_hand_value(self):
        # MSP: ID .9, .8 ; OOD .6, .5 -> perfectly separated
        id_p = torch.tensor([[0.9, 0.1], [0.2, 0.8]])
        ood_p = torch.tensor([[0.6, 0.4], [0.5, 0.5]])
        r = ood_report(id_p, None, ood_p, None, detectors=["max_softmax"])
        assert r == {"max_softmax": {"auroc": 1.0, "aupr_in": 1.0, "aupr_out": 1.0, "fpr95": 0.0}}

    def test_explicit_detector_without_inputs(self, sets):
        id_p, _, ood_p, _, _ = sets
        with pytest.raises(ValueError, match="templates"):
            ood_report(id_p, None, ood_p, None, detectors=["kl_matching"])
        with pytest.raises(ValueError, match="needs logits"):
            ood_report(id_p, None, ood_p, None, detectors=["energy"])
        with pytest.raises(ValueError, match="unknown OOD score 'odin'"):
            ood_report(id_p, None, ood_p, None, detectors=["odin"])

    def test_class_count_mismatch(self, sets):
        id_p = sets[0]
        with pytest.raises(ValueError, match="same number of classes"):
            ood_report(id_p, None, torch.full((5, 4), 0.25), None)
