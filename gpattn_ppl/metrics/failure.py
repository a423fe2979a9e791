r"""Failure (misclassification) prediction from the top-label confidence.

Definition (``docs/metrics.rst``). The score is :math:`\mathrm{conf}_i = \max_k \bar p_{ik}` and the
"positive" event is a correct prediction :math:`c_i = 1[\hat y_i = y_i]`:

* **AUROC**: area under the ROC curve of ``conf`` for ``c`` (ties count 1/2),
  ``sklearn.metrics.roc_auc_score``;
* **AUPR-Success**: area under the precision-recall curve with positive = correct and score
  ``conf``; **AUPR-Error**: positive = error and score ``-conf``. Both are *average precision*,
  :math:`\mathrm{AP} = \sum_j (R_j - R_{j-1}) P_j` over distinct thresholds
  (``sklearn.metrics.average_precision_score``, step-wise, no trapezoidal interpolation;
  pytorch-ood integrates the PR curve with the trapezoid rule instead, which can differ slightly);
* **FPR95**: the fraction of errors with :math:`\mathrm{conf} \ge t`, where :math:`t` is the
  largest threshold whose TPR on the correct predictions is at least 0.95, i.e. the
  :math:`\lceil 0.95 P \rceil`-th largest confidence among the :math:`P` correct predictions. No
  interpolation. (KEP-SVGP instead takes the ROC point whose TPR is nearest 0.95.)

A metric whose positive or negative class is empty is undefined and returned as ``nan``
(e.g. AUROC, AUPR-Error and FPR95 when every prediction is correct).

Complexity: :math:`O(TnK + n \log n)` time, :math:`O(n)` memory.
"""

from __future__ import annotations

import torch  # noqa: F401  (doctest namespace)

from . import _binary
from ._validation import confidence_and_correct

__all__ = ["failure_auroc", "failure_aupr_success", "failure_aupr_error", "failure_fpr95"]


def failure_auroc(probs, labels) -> float:
    r"""AUROC of the confidence for separating correct from wrong predictions.

    .. math::

        \mathrm{AUROC} = P(\mathrm{conf}_i > \mathrm{conf}_j \mid c_i = 1, c_j = 0)
        + \tfrac12 P(\mathrm{conf}_i = \mathrm{conf}_j \mid c_i = 1, c_j = 0)

    :param probs: class probabilities ``[n, K]`` or ``[T, n, K]`` (averaged over ``T``).
    :param labels: integer labels ``[n]``.
    :returns: AUROC in ``[0, 1]``; ``nan`` if all predictions are correct or all are wrong.

    >>> p = torch.tensor([[0.9, 0.1], [0.8, 0.2], [0.7, 0.3], [0.6, 0.4]])
    >>> failure_auroc(p, torch.tensor([0, 1, 0, 1]))  # correct: .9 .7, wrong: .8 .6
    0.75
    """
    conf, correct = confidence_and_correct(probs, labels)
    return _binary.auroc(conf, correct)


def failure_aupr_success(probs, labels) -> float:
    r"""Average precision of the confidence with positive = correct prediction.

    .. math::

        \mathrm{AUPR\text{-}S} = \sum_j (R_j - R_{j-1}) P_j,\quad
        \text{positives } c_i = 1,\ \text{score } \mathrm{conf}_i

    :param probs: class probabilities ``[n, K]`` or ``[T, n, K]`` (averaged over ``T``).
    :param labels: integer labels ``[n]``.
    :returns: AUPR-Success in ``[0, 1]``; ``nan`` if no prediction is correct.

    >>> p = torch.tensor([[0.9, 0.1], [0.8, 0.2], [0.7, 0.3], [0.6, 0.4]])
    >>> round(failure_aupr_success(p, torch.tensor([0, 1, 0, 1])), 6)  # (1 + 2/3) / 2
    0.833333
    """
    conf, correct = confidence_and_correct(probs, labels)
    return _binary.aupr(conf, correct)


def failure_aupr_error(probs, labels) -> float:
    r"""Average precision of the negative confidence with positive = wrong prediction.

    .. math::

        \mathrm{AUPR\text{-}E} = \sum_j (R_j - R_{j-1}) P_j,\quad
        \text{positives } c_i = 0,\ \text{score } -\mathrm{conf}_i

    :param probs: class probabilities ``[n, K]`` or ``[T, n, K]`` (averaged over ``T``).
    :param labels: integer labels ``[n]``.
    :returns: AUPR-Error in ``[0, 1]``; ``nan`` if every prediction is correct.

    >>> p = torch.tensor([[0.9, 0.1], [0.8, 0.2], [0.7, 0.3], [0.6, 0.4]])
    >>> round(failure_aupr_error(p, torch.tensor([0, 1, 0, 1])), 6)  # (1 + 2/3) / 2
    0.833333
    """
    conf, correct = confidence_and_correct(probs, labels)
    return _binary.aupr(-conf, ~correct)


def failure_fpr95(probs, labels, tpr: float = 0.95) -> float:
    r"""Fraction of wrong predictions accepted at the threshold that keeps 95% of correct ones.

    .. math::

        \mathrm{FPR95} = \frac{\#\{i : c_i = 0,\ \mathrm{conf}_i \ge t\}}{\#\{i : c_i = 0\}},
        \quad t = \max\{t : \mathrm{TPR}(t) \ge 0.95\}
        = \mathrm{conf}^{\downarrow}_{(\lceil 0.95 P \rceil)}

    with :math:`\mathrm{conf}^{\downarrow}_{(k)}` the :math:`k`-th largest confidence among the
    :math:`P` correct predictions.

    :param probs: class probabilities ``[n, K]`` or ``[T, n, K]`` (averaged over ``T``).
    :param labels: integer labels ``[n]``.
    :param tpr: the TPR level (default 0.95).
    :returns: FPR in ``[0, 1]``; ``nan`` if all predictions are correct or all are wrong.

    >>> p = torch.tensor([[0.9, 0.1], [0.8, 0.2], [0.7, 0.3], [0.6, 0.4]])
    >>> failure_fpr95(p, torch.tensor([0, 1, 0, 1]))  # t = 0.7 (2nd of 2), wrong >= t: 0.8
    0.5
    """
    conf, correct = confidence_and_correct(probs, labels)
    return _binary.fpr_at_tpr(conf, correct, tpr)
