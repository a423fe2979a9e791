"""The checks and conversions of the metrics' inputs, for code that takes the same inputs.

Every metric checks its arguments with these functions; the OOD scores (:mod:`gpattn_ppl.ood`)
and the figures (:mod:`gpattn_ppl.run.plotting`) use them too, so that a malformed input gets
the same :class:`ValueError` (naming the argument) wherever it is passed:

* :func:`as_probs` -- class probabilities ``[n, K]`` or ``[T, n, K]`` -> float64 ``[T, n, K]``;
* :func:`as_logits` -- logits of the probabilities' shape -> float64 ``[T, n, K]``;
* :func:`as_labels` -- class indices ``[n]`` in ``[0, K)`` -> int64;
* :func:`as_scores` -- finite 1-D scores ``[n]`` -> float64;
* :func:`top_label` -- confidence and prediction of model-averaged probabilities.

>>> import torch
>>> as_probs(torch.tensor([[0.25, 0.75]])).shape
torch.Size([1, 1, 2])
>>> as_probs(torch.tensor([[2.0, -1.0]]))
Traceback (most recent call last):
...
ValueError: probs contains negative entries (min -1); expected probabilities, did you pass logits?
"""

from __future__ import annotations

from . import _validation
from ._validation import as_labels, as_logits, as_probs, as_scores, top_label

__all__ = ["EPS", "SUM_TOL", "as_labels", "as_logits", "as_probs", "as_scores", "top_label"]

#: Tolerance on ``|sum_k p_k - 1|`` (absolute) of :func:`as_probs`.
SUM_TOL: float = _validation.SUM_TOL
#: Probabilities are clamped at this value before a logarithm.
EPS: float = _validation.EPS
