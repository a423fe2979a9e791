r"""Selective prediction: risk-coverage curve, AURC and E-AURC.

Definition (``docs/metrics.rst``). Sort the samples by confidence :math:`\mathrm{conf}_i = \max_k \bar
p_{ik}` in descending order with a **stable** sort, so that ties keep their index order (the
sample that comes first in the evaluation set is accepted first). With :math:`c_{(j)}` the
correctness of the :math:`j`-th sample in that order,

.. math::

    \mathrm{risk}_k = \frac{1}{k} \sum_{j \le k} \bigl(1 - c_{(j)}\bigr), \qquad
    \mathrm{AURC} = \frac{1}{n} \sum_{k=1}^{n} \mathrm{risk}_k,

    \mathrm{E\text{-}AURC} = \mathrm{AURC} - \bigl(r + (1 - r)\ln(1 - r)\bigr),

with :math:`r` the error rate. The subtracted term is the continuous approximation of the AURC
of an oracle ranking (Geifman et al. 2019); it is undefined at :math:`r = 1`, where we return
``nan``. Because it is an approximation, E-AURC can be slightly negative for a near-perfect
ranking on a small set. Ties make the AURC depend on the order of the data; the tie rule above
makes it deterministic. KEP-SVGP reports AURC ×1000.

Complexity: :math:`O(TnK + n \log n)` time, :math:`O(n)` memory.
"""

from __future__ import annotations

import math
from typing import Any

import torch
from torch import Tensor

from ._streaming import ConfidenceCorrectMetric
from ._validation import confidence_and_correct

__all__ = ["risk_coverage_curve", "aurc", "eaurc", "AURC"]


def _risk_curve(conf: Tensor, correct: Tensor) -> tuple[Tensor, Tensor]:
    order = torch.sort(conf, descending=True, stable=True).indices
    errors = 1.0 - correct.to(torch.float64)[order]
    k = torch.arange(1, conf.numel() + 1, dtype=torch.float64, device=conf.device)
    return k / conf.numel(), errors.cumsum(0) / k


def _aurc(conf: Tensor, correct: Tensor) -> Tensor:
    return _risk_curve(conf, correct)[1].mean()


def _eaurc(conf: Tensor, correct: Tensor) -> Tensor:
    value = _aurc(conf, correct)
    r = 1.0 - float(correct.to(torch.float64).mean())
    if r >= 1.0:
        return torch.full_like(value, float("nan"))
    optimal = r + (1.0 - r) * math.log1p(-r)
    return value - optimal


def risk_coverage_curve(probs, labels) -> tuple[Tensor, Tensor]:
    r"""Selective risk against coverage, accepting the most confident samples first.

    .. math::

        \mathrm{coverage}_k = k / n, \qquad
        \mathrm{risk}_k = \frac{1}{k} \sum_{j \le k} (1 - c_{(j)}), \quad k = 1, \dots, n

    (stable descending sort by confidence, ties by index).

    :param probs: class probabilities ``[n, K]`` or ``[T, n, K]`` (averaged over ``T``).
    :param labels: integer labels ``[n]``.
    :returns: ``(coverage [n], risk [n])`` as float64 tensors.

    >>> cov, risk = risk_coverage_curve(torch.tensor([[0.9, 0.1], [0.6, 0.4]]), torch.tensor([1, 0]))
    >>> cov.tolist(), risk.tolist()
    ([0.5, 1.0], [1.0, 0.5])
    """
    conf, correct = confidence_and_correct(probs, labels)
    return _risk_curve(conf, correct)


def aurc(probs, labels) -> float:
    r"""Area under the risk-coverage curve.

    .. math::

        \mathrm{AURC} = \frac{1}{n} \sum_{k=1}^{n} \frac{1}{k} \sum_{j \le k} (1 - c_{(j)})

    (stable descending sort by confidence; ties broken by index).

    :param probs: class probabilities ``[n, K]`` or ``[T, n, K]`` (averaged over ``T``).
    :param labels: integer labels ``[n]``.
    :returns: AURC in ``[0, 1]``.

    >>> aurc(torch.tensor([[0.9, 0.1], [0.6, 0.4]]), torch.tensor([1, 0]))
    0.75
    """
    conf, correct = confidence_and_correct(probs, labels)
    return float(_aurc(conf, correct))


def eaurc(probs, labels) -> float:
    r"""Excess AURC over the (continuous) oracle ranking.

    .. math::

        \mathrm{E\text{-}AURC} = \mathrm{AURC} - \bigl(r + (1 - r)\ln(1 - r)\bigr)

    :param probs: class probabilities ``[n, K]`` or ``[T, n, K]`` (averaged over ``T``).
    :param labels: integer labels ``[n]``.
    :returns: E-AURC; ``nan`` when every prediction is wrong (``r = 1``, undefined).

    >>> round(eaurc(torch.tensor([[0.9, 0.1], [0.6, 0.4]]), torch.tensor([0, 1])), 6)
    0.096574
    """
    conf, correct = confidence_and_correct(probs, labels)
    return float(_eaurc(conf, correct))


class AURC(ConfidenceCorrectMetric):
    r"""Streaming AURC (or E-AURC with ``excess=True``) as a torchmetrics Metric.

    Same definition as :func:`aurc` / :func:`eaurc`. States are the per-sample confidences and
    correctness flags, concatenated across batches and processes (``dist_reduce_fx="cat"``);
    the curve is built once over all of them. Ties are broken by the position in the
    concatenated state (batch order; after a distributed gather, rank order).

    :param excess: return E-AURC instead of AURC (``nan`` if every prediction is wrong).
    :param kwargs: passed to :class:`torchmetrics.Metric`.

    ``update(probs, labels)`` takes ``probs`` ``[B, K]`` or ``[T, B, K]`` (averaged over ``T``)
    and labels ``[B]``; ``compute()`` returns a 0-d float64 tensor. Memory :math:`O(n)`.

    >>> m = AURC()
    >>> m.update(torch.tensor([[0.9, 0.1]]), torch.tensor([1]))
    >>> m.update(torch.tensor([[0.6, 0.4]]), torch.tensor([0]))
    >>> float(m.compute())
    0.75
    """

    higher_is_better = False

    def __init__(self, excess: bool = False, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.excess = bool(excess)

    def compute(self) -> Tensor:
        """AURC (or E-AURC) over everything seen, as a 0-d float64 tensor."""
        conf, correct = self._gathered()
        return _eaurc(conf, correct) if self.excess else _aurc(conf, correct)
