"""Base of the streaming (torchmetrics) metrics computed from top-label confidence and correctness
(private)."""

from __future__ import annotations

from typing import Any

from torch import Tensor
from torchmetrics import Metric
from torchmetrics.utilities import dim_zero_cat

from ._validation import conf_correct_streaming

__all__: list[str] = []


class ConfidenceCorrectMetric(Metric):
    """A Metric whose states are the per-sample top-label confidences and correctness flags.

    Both states are lists concatenated across batches and, under ``torch.distributed``, across
    processes (``dist_reduce_fx="cat"``); a subclass's ``compute`` calls ``_gathered()`` and
    evaluates its metric once over the whole evaluation set.
    """

    is_differentiable = False
    full_state_update = False

    confidences: list[Tensor]
    correct: list[Tensor]

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.add_state("confidences", default=[], dist_reduce_fx="cat")
        self.add_state("correct", default=[], dist_reduce_fx="cat")

    def update(self, probs: Tensor, labels: Tensor) -> None:
        """Append the batch's top-label confidences and correctness flags."""
        conf, correct = conf_correct_streaming(probs, labels)
        self.confidences.append(conf)
        self.correct.append(correct)

    def _gathered(self) -> tuple[Tensor, Tensor]:
        """All confidences and correctness flags seen; :class:`ValueError` if there are none."""
        conf = dim_zero_cat(self.confidences)
        correct = dim_zero_cat(self.correct)
        if conf.numel() == 0:
            raise ValueError(f"{type(self).__name__}.compute() called with no samples")
        return conf, correct
