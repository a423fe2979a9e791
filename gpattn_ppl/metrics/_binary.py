"""Binary detection metrics on scores (private): AUROC, AUPR, FPR at a TPR level.

Used by failure prediction (positive = correct) and OOD detection (positive = in-distribution).
All return ``nan`` when a class is absent (the metric is undefined), without warnings.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

__all__: list[str] = []


def _numpy(x: Tensor):
    return x.detach().to("cpu", torch.float64).numpy()


def _both_present(targets: Tensor) -> bool:
    n_pos = int(targets.sum())
    return 0 < n_pos < targets.numel()


def auroc(scores: Tensor, targets: Tensor) -> float:
    """Area under the ROC curve of ``scores`` for ``targets`` (bool), ties counted 1/2.

    ``sklearn.metrics.roc_auc_score``; ``nan`` if only one class is present.
    """
    if not _both_present(targets):
        return float("nan")
    from sklearn.metrics import roc_auc_score  # lazy: keeps `import gpattn_ppl` fast

    return float(roc_auc_score(_numpy(targets), _numpy(scores)))


def aupr(scores: Tensor, targets: Tensor) -> float:
    """Area under the precision-recall curve as average precision (step-wise, no interpolation).

    ``sklearn.metrics.average_precision_score``: ``AP = sum_j (R_j - R_{j-1}) P_j`` over the
    distinct thresholds. ``nan`` if there is no positive; 1.0 if every sample is positive.
    """
    n_pos = int(targets.sum())
    if n_pos == 0:
        return float("nan")
    if n_pos == targets.numel():
        return 1.0
    from sklearn.metrics import average_precision_score

    return float(average_precision_score(_numpy(targets), _numpy(scores)))


def fpr_at_tpr(scores: Tensor, targets: Tensor, tpr: float = 0.95) -> float:
    """Fraction of negatives with ``score >= t``, ``t`` the largest threshold with TPR >= ``tpr``.

    ``TPR(t) = #{positives with score >= t} / P`` is non-increasing in ``t`` and only changes at
    positive scores, so the largest ``t`` with ``TPR(t) >= tpr`` is the ``k``-th largest positive
    score with ``k = ceil(tpr * P)``. No interpolation. ``nan`` if a class is absent.
    """
    pos = scores[targets]
    neg = scores[~targets]
    if pos.numel() == 0 or neg.numel() == 0:
        return float("nan")
    k = max(1, math.ceil(round(tpr * pos.numel(), 9)))
    t = torch.sort(pos, descending=True).values[k - 1]
    return float((neg >= t).to(torch.float64).mean())
