r"""The OOD report: every detector's AUROC, AUPR-In/Out and FPR95 on an ID and an OOD set.

Like :func:`gpattn_ppl.metrics.classification_report` it is computed once over
the whole sets, in float64, returned as Python ``float``.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch  # noqa: F401  (doctest namespace)
from torch import Tensor

from ..metrics._validation import as_probs
from ..metrics.ood_detection import ood_detection_metrics
from .scores import DETECTOR_NAMES, ood_score

__all__ = ["ood_report"]


def ood_report(
    id_probs,
    id_logits,
    ood_probs,
    ood_logits=None,
    detectors: Sequence[str] | None = None,
    templates: Tensor | None = None,
) -> dict[str, dict[str, float]]:
    r"""OOD-detection metrics for each detector on the union of an ID and an OOD set.

    For each detector the score :math:`s` (higher = more in-distribution,
    :func:`gpattn_ppl.ood.ood_score`) is computed on both sets and evaluated with ID as the
    positive class (:mod:`~gpattn_ppl.metrics.ood_detection`): AUROC, AUPR-In (score
    :math:`s`), AUPR-Out (OOD positive, score :math:`-s`) and FPR95 (fraction of OOD with
    :math:`s \ge t`, :math:`t` the largest threshold keeping 95% of ID).

    Default ``detectors``: ``max_softmax`` and ``entropy``; ``energy`` when both logits are
    given; ``kl_matching`` when ``templates`` are given; ``mutual_info`` and ``pred_variance``
    when both sets have ``T > 1`` passes. A detector requested explicitly without what it needs
    raises :class:`ValueError`.

    :param id_probs: ID test probabilities ``[T, n_in, K]`` or ``[n_in, K]``.
    :param id_logits: ID logits of the same shape, or ``None``.
    :param ood_probs: OOD probabilities ``[T', n_out, K]`` or ``[n_out, K]``.
    :param ood_logits: OOD logits of the same shape, or ``None``.
    :param detectors: names from :data:`gpattn_ppl.ood.SCORE_NAMES`.
    :param templates: ``[K, K]`` KL-matching templates from
        :func:`gpattn_ppl.ood.kl_matching_templates` on ID **validation** predictions (never
        on test data).
    :returns: ``{detector: {"auroc", "aupr_in", "aupr_out", "fpr95"}}``.

    >>> id_p = torch.tensor([[0.9, 0.1], [0.2, 0.8]])
    >>> ood_p = torch.tensor([[0.6, 0.4], [0.5, 0.5]])
    >>> ood_report(id_p, None, ood_p, None)["max_softmax"]["auroc"]
    1.0
    """
    p_in = as_probs(id_probs, "id_probs")
    p_out = as_probs(ood_probs, "ood_probs")
    if p_in.shape[-1] != p_out.shape[-1]:
        raise ValueError(
            f"id_probs and ood_probs must have the same number of classes, got "
            f"K = {p_in.shape[-1]} and {p_out.shape[-1]}"
        )
    if detectors is None:
        have_logits = id_logits is not None and ood_logits is not None
        multi_pass = p_in.shape[0] > 1 and p_out.shape[0] > 1
        wanted = {
            "max_softmax": True,
            "entropy": True,
            "energy": have_logits,
            "kl_matching": templates is not None,
            "mutual_info": multi_pass,
            "pred_variance": multi_pass,
        }
        detectors = [d for d in DETECTOR_NAMES if wanted[d]]
    if isinstance(detectors, str):
        raise ValueError(f"detectors must be a sequence of names, got the string {detectors!r}")
    out: dict[str, dict[str, float]] = {}
    for name in detectors:
        s_in = ood_score(name, p_in, id_logits, templates)
        s_out = ood_score(name, p_out, ood_logits, templates)
        out[name] = ood_detection_metrics(s_in, s_out)
    return out
