"""OOD detection metrics on the ID (positive) / OOD union: hand values and symmetries."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from gpattn_ppl.metrics import (
    ood_aupr_in,
    ood_aupr_out,
    ood_auroc,
    ood_detection_metrics,
    ood_fpr95,
)

ID = torch.tensor([0.9, 0.8, 0.4], dtype=torch.float64)
OOD = torch.tensor([0.5, 0.3], dtype=torch.float64)


def test_hand_values():
    # AUROC: ID>OOD pairs: .9 (2), .8 (2), .4 (>.3 only: 1) -> 5/6
    assert ood_auroc(ID, OOD) == pytest.approx(5 / 6)
    # AUPR-In: ranking .9I .8I .5O .4I .3O -> precision at ID hits 1, 1, 3/4 -> 11/12
    assert ood_aupr_in(ID, OOD) == pytest.approx(11 / 12)
    # AUPR-Out (score -s): ranking .3O .4I .5O .8I .9I -> OOD hits at ranks 1, 3 -> (1 + 2/3)/2
    assert ood_aupr_out(ID, OOD) == pytest.approx(5 / 6)
    # FPR95: n_in = 3 -> k = ceil(2.85) = 3 -> t = .4 ; OOD >= .4: {.5} -> 1/2
    assert ood_fpr95(ID, OOD) == pytest.approx(0.5)
    assert ood_detection_metrics(ID, OOD) == pytest.approx(
        {"auroc": 5 / 6, "aupr_in": 11 / 12, "aupr_out": 5 / 6, "fpr95": 0.5}
    )


def test_ties_and_perfect_separation():
    assert ood_auroc(torch.tensor([1.0, 1.0]), torch.tensor([1.0])) == pytest.approx(0.5)
    assert ood_fpr95(torch.tensor([1.0, 1.0]), torch.tensor([1.0])) == 1.0
    m = ood_detection_metrics(torch.tensor([3.0, 2.0]), torch.tensor([1.0, 0.0]))
    assert m == {"auroc": 1.0, "aupr_in": 1.0, "aupr_out": 1.0, "fpr95": 0.0}


def test_role_symmetries():
    g = torch.Generator().manual_seed(0)
    s_in = torch.randn(50, generator=g, dtype=torch.float64) + 1
    s_out = torch.randn(30, generator=g, dtype=torch.float64)
    # swapping roles and negating the score leaves AUROC unchanged and exchanges the AUPRs
    assert ood_auroc(-s_out, -s_in) == pytest.approx(ood_auroc(s_in, s_out))
    assert ood_aupr_out(s_in, s_out) == pytest.approx(ood_aupr_in(-s_out, -s_in))
    # a monotone transform of the score changes nothing
    assert ood_detection_metrics(s_in.exp(), s_out.exp()) == pytest.approx(
        ood_detection_metrics(s_in, s_out)
    )


def test_numpy_and_float32_inputs():
    assert ood_auroc(np.array([0.9, 0.8, 0.4], dtype=np.float32), OOD.float()) == pytest.approx(
        5 / 6
    )


@pytest.mark.parametrize(
    ("id_scores", "ood_scores", "match"),
    [
        (torch.tensor([]), OOD, "id_scores is empty"),
        (ID, torch.tensor([float("nan")]), "ood_scores contains NaN"),
        (ID.view(3, 1), OOD, r"id_scores must have shape \[n\]"),
        (ID, torch.tensor([float("inf")]), "ood_scores contains NaN or inf"),
    ],
)
def test_bad_scores(id_scores, ood_scores, match):
    with pytest.raises(ValueError, match=match):
        ood_auroc(id_scores, ood_scores)
