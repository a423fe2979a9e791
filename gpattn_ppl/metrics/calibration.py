r"""Top-label calibration error (ECE, MCE) with 15 equal-width bins.

Definition (``docs/metrics.rst``). With :math:`\bar p_i` the model-averaged probabilities,
:math:`\mathrm{conf}_i = \max_k \bar p_{ik}` and :math:`c_i = \mathbb{1}[\hat y_i = y_i]`, bin
:math:`m \in \{1, \dots, M\}` holds the samples with

.. math::

    \mathrm{conf}_i \in \left(\tfrac{m-1}{M}, \tfrac{m}{M}\right]
    \quad (\text{bin 1 also takes } \mathrm{conf}_i = 0),

and

.. math::

    \mathrm{ECE} = \sum_{m} \frac{|B_m|}{n}\,\bigl|\mathrm{acc}(B_m) - \mathrm{conf}(B_m)\bigr|,
    \qquad
    \mathrm{MCE} = \max_{m:\,|B_m| > 0} \bigl|\mathrm{acc}(B_m) - \mathrm{conf}(B_m)\bigr|,

computed once over the whole evaluation set. The bin edges are the float64 numbers ``m / M``
and confidences are compared in float64 (a float32 ``0.6`` is ``0.6000000238...`` and lies above
the edge ``0.6``); a confidence that exceeds 1 by rounding goes to the last bin.

**Why not torchmetrics.** ``torchmetrics``' ``MulticlassCalibrationError(n_bins=15)`` bins with
``torch.bucketize(conf, linspace(0, 1, 16), right=True) - 1``, i.e. *left-closed* bins
``[(m-1)/M, m/M)``, plus a sixteenth bin that holds exactly ``conf = 1.0``; it also casts the
confidences to float32. It therefore differs from the stated definition whenever a confidence
sits on a bin edge, in particular ``conf = 1`` (common for saturated softmax outputs), and the
MCE can differ by a large amount there. Away from edges the two agree to float32 precision; the
tests pin both facts. We implement the definition above directly.

Complexity: :math:`O(TnK + n)` time, :math:`O(n + M)` memory.
"""

from __future__ import annotations

from typing import Any, Literal

import torch
from torch import Tensor

from ._streaming import ConfidenceCorrectMetric
from ._validation import confidence_and_correct

__all__ = [
    "bin_index",
    "calibration_bins",
    "expected_calibration_error",
    "maximum_calibration_error",
    "CalibrationError",
]


def bin_index(conf: Tensor, n_bins: int) -> Tensor:
    """Bin of each confidence: ``m - 1`` for ``conf in ((m-1)/M, m/M]``, 0 for ``conf = 0``
    (the binning of every calibration metric here; a confidence above 1 by rounding goes to the
    last bin). ``conf`` is compared in float64; returns int64 indices of ``conf``'s shape.

    >>> bin_index(torch.tensor([0.0, 0.1, 0.2, 0.5, 1.0], dtype=torch.float64), 5).tolist()
    [0, 0, 0, 2, 4]
    """
    edges = torch.arange(n_bins + 1, dtype=torch.float64, device=conf.device) / n_bins
    idx = torch.bucketize(conf.to(torch.float64), edges, right=False) - 1
    return idx.clamp_(0, n_bins - 1)


def _bin_stats(conf: Tensor, correct: Tensor, n_bins: int) -> tuple[Tensor, Tensor, Tensor]:
    """Per-bin count, summed confidence and summed correctness (float64, ``[M]`` each)."""
    idx = bin_index(conf, n_bins)
    conf = conf.to(torch.float64)
    count = torch.zeros(n_bins, dtype=torch.float64, device=conf.device)
    conf_sum = torch.zeros_like(count)
    acc_sum = torch.zeros_like(count)
    count.index_add_(0, idx, torch.ones_like(conf))
    conf_sum.index_add_(0, idx, conf)
    acc_sum.index_add_(0, idx, correct.to(torch.float64))
    return count, conf_sum, acc_sum


def _calibration_error(conf: Tensor, correct: Tensor, n_bins: int, norm: str) -> Tensor:
    count, conf_sum, acc_sum = _bin_stats(conf, correct, n_bins)
    if norm == "l1":
        # sum_m |B_m|/n * |acc - conf| = (1/n) sum_m |sum correct - sum conf|
        return (acc_sum - conf_sum).abs().sum() / count.sum()
    gap = (acc_sum - conf_sum).abs() / count.clamp_min(1.0)
    return gap[count > 0].max()


def _check_bins(n_bins: int) -> int:
    if isinstance(n_bins, bool) or not isinstance(n_bins, int) or n_bins < 1:
        raise ValueError(f"n_bins must be a positive integer, got {n_bins!r}")
    return n_bins


def calibration_bins(probs, labels, n_bins: int = 15) -> dict[str, Tensor]:
    r"""Per-bin statistics of the top-label reliability diagram.

    Bins as in the module docstring: bin ``m`` covers :math:`((m-1)/M, m/M]`.

    :param probs: class probabilities ``[n, K]`` or ``[T, n, K]`` (averaged over ``T``).
    :param labels: integer labels ``[n]``.
    :param n_bins: number ``M`` of equal-width bins on ``[0, 1]``.
    :returns: dict of float64 tensors: ``edges [M + 1]``, ``count [M]``, ``accuracy [M]`` and
        ``confidence [M]`` (NaN in empty bins).

    >>> b = calibration_bins(torch.tensor([[0.7, 0.3], [0.1, 0.9]]), torch.tensor([0, 0]), n_bins=5)
    >>> b["count"].tolist()
    [0.0, 0.0, 0.0, 1.0, 1.0]
    >>> b["accuracy"].tolist()[3:]
    [1.0, 0.0]
    """
    n_bins = _check_bins(n_bins)
    conf, correct = confidence_and_correct(probs, labels)
    count, conf_sum, acc_sum = _bin_stats(conf, correct, n_bins)
    nan = torch.full_like(count, float("nan"))
    nonempty = count > 0
    return {
        "edges": torch.arange(n_bins + 1, dtype=torch.float64, device=conf.device) / n_bins,
        "count": count,
        "accuracy": torch.where(nonempty, acc_sum / count.clamp_min(1.0), nan),
        "confidence": torch.where(nonempty, conf_sum / count.clamp_min(1.0), nan),
    }


def expected_calibration_error(probs, labels, n_bins: int = 15) -> float:
    r"""Top-label expected calibration error (equal-width bins, L1).

    .. math::

        \mathrm{ECE} = \sum_{m=1}^{M} \frac{|B_m|}{n}
        \bigl|\mathrm{acc}(B_m) - \mathrm{conf}(B_m)\bigr|,
        \quad B_m = \{i : \mathrm{conf}_i \in ((m-1)/M, m/M]\}

    :param probs: class probabilities ``[n, K]`` or ``[T, n, K]`` (averaged over ``T``).
    :param labels: integer labels ``[n]``.
    :param n_bins: ``M`` (default 15).
    :returns: ECE in ``[0, 1]``.

    >>> p = torch.tensor([[0.9, 0.1], [0.9, 0.1], [0.3, 0.7]])
    >>> round(expected_calibration_error(p, torch.tensor([0, 1, 1])), 6)
    0.366667
    """
    n_bins = _check_bins(n_bins)
    conf, correct = confidence_and_correct(probs, labels)
    return float(_calibration_error(conf, correct, n_bins, "l1"))


def maximum_calibration_error(probs, labels, n_bins: int = 15) -> float:
    r"""Top-label maximum calibration error over the non-empty bins.

    .. math::

        \mathrm{MCE} = \max_{m:\,|B_m|>0} \bigl|\mathrm{acc}(B_m) - \mathrm{conf}(B_m)\bigr|

    :param probs: class probabilities ``[n, K]`` or ``[T, n, K]`` (averaged over ``T``).
    :param labels: integer labels ``[n]``.
    :param n_bins: ``M`` (default 15).
    :returns: MCE in ``[0, 1]``.

    >>> p = torch.tensor([[0.9, 0.1], [0.9, 0.1], [0.3, 0.7]])
    >>> round(maximum_calibration_error(p, torch.tensor([0, 1, 1])), 6)
    0.4
    """
    n_bins = _check_bins(n_bins)
    conf, correct = confidence_and_correct(probs, labels)
    return float(_calibration_error(conf, correct, n_bins, "max"))


class CalibrationError(ConfidenceCorrectMetric):
    r"""Streaming top-label ECE (``norm="l1"``) or MCE (``norm="max"``) as a torchmetrics Metric.

    Same definition as :func:`expected_calibration_error` / :func:`maximum_calibration_error`
    (bins :math:`((m-1)/M, m/M]`). The states are the per-sample confidences and correctness
    flags, concatenated across batches and, under ``torch.distributed``, across processes
    (``dist_reduce_fx="cat"``), so the value is computed once over the whole evaluation set,
    never averaged over batches.

    :param n_bins: number ``M`` of equal-width bins (default 15).
    :param norm: ``"l1"`` for ECE or ``"max"`` for MCE.
    :param kwargs: passed to :class:`torchmetrics.Metric`.

    ``update(probs, labels)`` takes ``probs`` ``[B, K]`` or ``[T, B, K]`` (averaged over ``T``)
    and labels ``[B]``; ``compute()`` returns a 0-d float64 tensor. Memory :math:`O(n)`.

    >>> m = CalibrationError(n_bins=15, norm="l1")
    >>> m.update(torch.tensor([[0.9, 0.1], [0.9, 0.1]]), torch.tensor([0, 1]))
    >>> m.update(torch.tensor([[0.3, 0.7]]), torch.tensor([1]))
    >>> round(float(m.compute()), 6)
    0.366667
    """

    higher_is_better = False

    def __init__(self, n_bins: int = 15, norm: Literal["l1", "max"] = "l1", **kwargs: Any) -> None:
        super().__init__(**kwargs)
        if norm not in ("l1", "max"):
            raise ValueError(f"norm must be 'l1' (ECE) or 'max' (MCE), got {norm!r}")
        self.n_bins = _check_bins(n_bins)
        self.norm = norm

    def compute(self) -> Tensor:
        """ECE or MCE over everything seen (all batches, all processes)."""
        conf, correct = self._gathered()
        return _calibration_error(conf, correct, self.n_bins, self.norm)
