r"""Per-sample uncertainty measures from ``T`` stochastic forward passes.

Given per-pass probabilities :math:`p_{t,ik}` (``[T, n, K]``) and their average
:math:`\bar p_{ik} = \frac1T \sum_t p_{t,ik}`, with :math:`0 \log 0 = 0` and natural logarithms:

.. math::

    \mathcal H[\bar p_i] = -\sum_k \bar p_{ik} \log \bar p_{ik}
    \quad \text{(predictive entropy)}

    \mathrm{MI}_i = \mathcal H[\bar p_i] - \frac1T \sum_t \mathcal H[p_{t,i}]
    \quad \text{(mutual information, "BALD"; the expected entropy is the aleatoric part)}

    \mathrm{Var}_i = \frac1K \sum_k \frac1T \sum_t (p_{t,ik} - \bar p_{ik})^2
    \quad \text{(predictive variance, mean over classes)}

    \mathrm{Std}_i = \sqrt{\frac1T \sum_t (p_{t,i\hat y_i} - \bar p_{i\hat y_i})^2}
    \quad \text{(std of the predicted-class probability; sto-trans's measure)}

The variance and std use the population normalisation ``1/T`` (ddof 0) [ours: the sto-trans
paper does not state it]. With ``T = 1`` the MI, variance and std are exactly 0. Each function
accepts ``[n, K]`` (``T = 1``) or ``[T, n, K]`` and returns a float64 tensor ``[n]``.
Complexity: :math:`O(TnK)`.
"""

from __future__ import annotations

import torch
from torch import Tensor

from ._validation import as_probs, top_label

__all__ = [
    "entropy",
    "predictive_entropy",
    "expected_entropy",
    "mutual_information",
    "predictive_variance",
    "predicted_class_std",
]


def entropy(p: Tensor) -> Tensor:
    r"""Entropy :math:`-\sum_k p_k \log p_k` of each distribution on the last axis, in nats
    (:math:`0 \log 0 = 0`): ``[..., K] -> [...]``. No input checks: ``p`` is already checked
    (:func:`~gpattn_ppl.metrics.inputs.as_probs`) and averaged where needed.

    >>> entropy(torch.tensor([[0.5, 0.5], [0.25, 0.75]], dtype=torch.float64))
    tensor([0.6931, 0.5623], dtype=torch.float64)
    """
    return -torch.special.xlogy(p, p).sum(-1)


def predictive_entropy(probs) -> Tensor:
    r"""Entropy of the model-averaged prediction, in nats.

    .. math::

        \mathcal H[\bar p_i] = -\sum_{k=1}^{K} \bar p_{ik} \log \bar p_{ik}

    :param probs: class probabilities ``[n, K]`` or ``[T, n, K]``.
    :returns: entropies ``[n]`` in ``[0, log K]``.

    >>> predictive_entropy(torch.tensor([[[1.0, 0.0]], [[0.0, 1.0]]]))  # mean is (1/2, 1/2)
    tensor([0.6931], dtype=torch.float64)
    """
    return entropy(as_probs(probs).mean(0))


def expected_entropy(probs) -> Tensor:
    r"""Mean per-pass entropy (the aleatoric part of the predictive entropy).

    .. math::

        \mathbb E_t \mathcal H[p_{t,i}] = \frac1T \sum_{t=1}^{T} \mathcal H[p_{t,i}]

    :param probs: class probabilities ``[n, K]`` or ``[T, n, K]``.
    :returns: ``[n]``.

    >>> expected_entropy(torch.tensor([[[1.0, 0.0]], [[0.0, 1.0]]]))
    tensor([0.], dtype=torch.float64)
    """
    return entropy(as_probs(probs)).mean(0)


def mutual_information(probs) -> Tensor:
    r"""Mutual information between the label and the model: predictive minus expected entropy.

    .. math::

        \mathrm{MI}_i = \mathcal H[\bar p_i] - \frac1T \sum_{t=1}^{T} \mathcal H[p_{t,i}] \ge 0

    Clamped at 0 against rounding.

    :param probs: class probabilities ``[n, K]`` or ``[T, n, K]``.
    :returns: ``[n]`` in ``[0, log K]``; exactly 0 when ``T = 1``.

    >>> mutual_information(torch.tensor([[[1.0, 0.0]], [[0.0, 1.0]]]))  # log 2 - 0
    tensor([0.6931], dtype=torch.float64)
    """
    p = as_probs(probs)
    return (entropy(p.mean(0)) - entropy(p).mean(0)).clamp_min(0.0)


def predictive_variance(probs) -> Tensor:
    r"""Variance of the per-pass probabilities across passes, averaged over classes.

    .. math::

        \mathrm{Var}_i = \frac1K \sum_{k=1}^{K} \frac1T \sum_{t=1}^{T}
        (p_{t,ik} - \bar p_{ik})^2

    :param probs: class probabilities ``[n, K]`` or ``[T, n, K]``.
    :returns: ``[n]``; 0 when ``T = 1``.

    >>> predictive_variance(torch.tensor([[[1.0, 0.0]], [[0.0, 1.0]]]))
    tensor([0.2500], dtype=torch.float64)
    """
    p = as_probs(probs)
    return p.var(0, correction=0).mean(-1)


def predicted_class_std(probs) -> Tensor:
    r"""Standard deviation across passes of the probability of the predicted class.

    .. math::

        \mathrm{Std}_i = \Bigl(\frac1T \sum_{t=1}^{T}
        (p_{t,i\hat y_i} - \bar p_{i\hat y_i})^2\Bigr)^{1/2},
        \quad \hat y_i = \operatorname{argmax}_k \bar p_{ik}

    The measure sto-trans reports (std over the ``T`` inference runs), ddof 0.

    :param probs: class probabilities ``[n, K]`` or ``[T, n, K]``.
    :returns: ``[n]`` in ``[0, 0.5]``; 0 when ``T = 1``.

    >>> predicted_class_std(torch.tensor([[[0.9, 0.1]], [[0.5, 0.5]]]))
    tensor([0.2000], dtype=torch.float64)
    """
    p = as_probs(probs)
    _, pred = top_label(p.mean(0))
    idx = pred.view(1, -1, 1).expand(p.shape[0], -1, 1)
    return p.gather(-1, idx).squeeze(-1).std(0, correction=0)
