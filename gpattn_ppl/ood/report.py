r"""The OOD report: every detector's AUROC, AUPR-In/Out and FPR95 on an ID and an OOD set.

Like :func:`gpattn_ppl.metrics.classification_report` it is computed once over
the whole sets, in float64, returned as Python ``float``.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch  # noqa: F401  (doctest namespace)
from torch import Tensor

from ..metrics.inputs import as_probs
from ..metrics.ood_detection import ood_detection_metrics
from .registry import DETECTOR_NAMES, OOD_DETECTORS
from .scores import ood_score

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

    Default ``detectors``: every registered detector (:data:`~gpattn_ppl.ood.DETECTOR_NAMES`,
    in registration order) whose ``needs`` the input meets -- ``max_softmax`` and ``entropy``;
    ``energy`` when both logits are given; ``kl_matching`` when ``templates`` are given;
    ``mutual_info`` and ``pred_variance`` when both sets have ``T > 1`` passes; then any
    detector registered with :func:`~gpattn_ppl.ood.register_ood_detector` by the same rules.
    A detector requested explicitly without what it needs raises :class:`ValueError`.

    :param id_probs: ID test probabilities ``[T, n_in, K]`` or ``[n_in, K]``.
    :param id_logits: ID logits of the same shape, or ``None``.
    :param ood_probs: OOD probabilities ``[T', n_out, K]`` or ``[n_out, K]``.
    :param ood_logits: OOD logits of the same shape, or ``None``.
    :param detectors: names from :data:`gpattn_ppl.ood.SCORE_NAMES` (the registered names).
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
        met = {"logits": have_logits, "templates": templates is not None, "passes": multi_pass}
        detectors = [d for d in DETECTOR_NAMES if all(met[n] for n in OOD_DETECTORS[d].needs)]
    if isinstance(detectors, str):
        raise ValueError(f"detectors must be a sequence of names, got the string {detectors!r}")
    out: dict[str, dict[str, float]] = {}
    for name in detectors:
        s_in = ood_score(name, p_in, id_logits, templates)
        s_out = ood_score(name, p_out, ood_logits, templates)
        out[name] = ood_detection_metrics(s_in, s_out)
    return out
