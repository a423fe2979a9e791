r"""Out-of-distribution detection metrics on the labelled union of ID and OOD scores.

Definition (``docs/metrics.rst``). In-distribution samples are the **positives**; the score
:math:`s` is higher for "more in-distribution" (see :func:`gpattn_ppl.ood.ood_score`). On the
union of the ``n_in`` ID and ``n_out`` OOD samples:

* **AUROC** of :math:`s` for ID vs OOD (ties count 1/2), ``sklearn.metrics.roc_auc_score``;
* **AUPR-In**: average precision with ID positive and score :math:`s`;
  **AUPR-Out**: OOD positive and score :math:`-s` (``sklearn.metrics.average_precision_score``,
  step-wise AP, no trapezoidal interpolation);
* **FPR95**: the fraction of OOD samples with :math:`s \ge t`, where :math:`t` is the largest
  threshold that keeps at least 95% of the ID samples, i.e. the
  :math:`\lceil 0.95\, n_\mathrm{in} \rceil`-th largest ID score. No interpolation.

Complexity: :math:`O(n \log n)` for :math:`n = n_\mathrm{in} + n_\mathrm{out}`.
"""

from __future__ import annotations

import torch
from torch import Tensor

from . import _binary
from ._validation import as_scores

__all__ = ["ood_auroc", "ood_aupr_in", "ood_aupr_out", "ood_fpr95", "ood_detection_metrics"]


def _union(id_scores, ood_scores) -> tuple[Tensor, Tensor]:
    s_in = as_scores(id_scores, "id_scores")
    s_out = as_scores(ood_scores, "ood_scores").to(s_in.device)
    scores = torch.cat([s_in, s_out])
    is_id = torch.cat(
        [torch.ones_like(s_in, dtype=torch.bool), torch.zeros_like(s_out, dtype=torch.bool)]
    )
    return scores, is_id


def ood_auroc(id_scores, ood_scores) -> float:
    r"""AUROC of the score for ID (positive) against OOD.

    .. math::

        \mathrm{AUROC} = P(s_\mathrm{in} > s_\mathrm{out}) + \tfrac12 P(s_\mathrm{in} = s_\mathrm{out})

    :param id_scores: scores of the ID samples ``[n_in]`` (higher = more ID).
    :param ood_scores: scores of the OOD samples ``[n_out]``.
    :returns: AUROC in ``[0, 1]``.

    >>> ood_auroc(torch.tensor([3.0, 1.0]), torch.tensor([2.0, 0.0]))
    0.75
    """
    return _binary.auroc(*_union(id_scores, ood_scores))


def ood_aupr_in(id_scores, ood_scores) -> float:
    r"""Average precision with ID as the positive class and score :math:`s`.

    .. math::

        \mathrm{AUPR\text{-}In} = \sum_j (R_j - R_{j-1}) P_j

    :param id_scores: ID scores ``[n_in]``.
    :param ood_scores: OOD scores ``[n_out]``.
    :returns: AUPR-In in ``[0, 1]``.

    >>> round(ood_aupr_in(torch.tensor([3.0, 1.0]), torch.tensor([2.0, 0.0])), 6)
    0.833333
    """
    scores, is_id = _union(id_scores, ood_scores)
    return _binary.aupr(scores, is_id)


def ood_aupr_out(id_scores, ood_scores) -> float:
    r"""Average precision with OOD as the positive class and score :math:`-s`.

    .. math::

        \mathrm{AUPR\text{-}Out} = \sum_j (R_j - R_{j-1}) P_j \quad (\text{positives: OOD})

    :param id_scores: ID scores ``[n_in]``.
    :param ood_scores: OOD scores ``[n_out]``.
    :returns: AUPR-Out in ``[0, 1]``.

    >>> round(ood_aupr_out(torch.tensor([3.0, 1.0]), torch.tensor([2.0, 0.0])), 6)
    0.833333
    """
    scores, is_id = _union(id_scores, ood_scores)
    return _binary.aupr(-scores, ~is_id)


def ood_fpr95(id_scores, ood_scores, tpr: float = 0.95) -> float:
    r"""Fraction of OOD samples at or above the threshold that keeps 95% of the ID samples.

    .. math::

        \mathrm{FPR95} = \frac{\#\{j : s^\mathrm{out}_j \ge t\}}{n_\mathrm{out}}, \quad
        t = s^{\mathrm{in}\downarrow}_{(\lceil 0.95\, n_\mathrm{in} \rceil)}

    :param id_scores: ID scores ``[n_in]``.
    :param ood_scores: OOD scores ``[n_out]``.
    :param tpr: fraction of ID kept (default 0.95).
    :returns: FPR in ``[0, 1]``.

    >>> ood_fpr95(torch.tensor([3.0, 1.0]), torch.tensor([2.0, 0.0]))  # t = 1.0
    0.5
    """
    scores, is_id = _union(id_scores, ood_scores)
    return _binary.fpr_at_tpr(scores, is_id, tpr)


def ood_detection_metrics(id_scores, ood_scores) -> dict[str, float]:
    """All four OOD-detection metrics at once.

    :param id_scores: ID scores ``[n_in]`` (higher = more in-distribution).
    :param ood_scores: OOD scores ``[n_out]``.
    :returns: ``{"auroc", "aupr_in", "aupr_out", "fpr95"}`` as Python floats.

    >>> ood_detection_metrics(torch.tensor([3.0, 1.0]), torch.tensor([2.0, 0.0]))["fpr95"]
    0.5
    """
    scores, is_id = _union(id_scores, ood_scores)
    return {
        "auroc": _binary.auroc(scores, is_id),
        "aupr_in": _binary.aupr(scores, is_id),
        "aupr_out": _binary.aupr(-scores, ~is_id),
        "fpr95": _binary.fpr_at_tpr(scores, is_id, 0.95),
    }
