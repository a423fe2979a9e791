r"""Predictive-performance metrics: accuracy, Matthews correlation, NLL and Brier score.

All functions take class probabilities ``probs`` of shape ``[n, K]`` or ``[T, n, K]`` and
integer ``labels`` ``[n]``. With ``T`` passes they first form the Bayesian model average

.. math::

    \bar p_{ik} = \frac{1}{T} \sum_{t=1}^{T} p_{t,ik}, \qquad
    \hat y_i = \operatorname{argmax}_k \bar p_{ik}

(the first maximal index on ties), compute once over the whole set in float64 and return a
Python ``float``. Complexity: :math:`O(TnK)` time, :math:`O(nK)` extra memory.
"""

from __future__ import annotations

import torch

from ._validation import EPS, prepare, top_label

__all__ = ["accuracy", "matthews_corrcoef", "negative_log_likelihood", "brier_score"]


def accuracy(probs, labels) -> float:
    r"""Top-1 accuracy of the model-averaged prediction.

    .. math::

        \mathrm{Acc} = \frac{1}{n} \sum_{i=1}^{n} \mathbb{1}[\hat y_i = y_i]

    :param probs: class probabilities ``[n, K]`` or ``[T, n, K]``.
    :param labels: integer labels ``[n]`` in ``[0, K)``.
    :returns: accuracy in ``[0, 1]``.
    :raises ValueError: on malformed input (see :mod:`gpattn_ppl.metrics`).

    >>> accuracy(torch.tensor([[0.9, 0.1], [0.2, 0.8], [0.6, 0.4]]), torch.tensor([0, 1, 1]))
    0.6666666666666666
    """
    _, pbar, y = prepare(probs, labels)
    _, pred = top_label(pbar)
    return float((pred == y).double().mean())


def matthews_corrcoef(probs, labels) -> float:
    r"""Matthews correlation coefficient from the global confusion counts (the CoLA score).

    For ``K = 2`` (class 1 = positive) this is the binary coefficient

    .. math::

        \mathrm{MCC} = \frac{TP\cdot TN - FP\cdot FN}
        {\sqrt{(TP+FP)(TP+FN)(TN+FP)(TN+FN)}},

    defined as 0 when the denominator is 0 (a constant prediction or a single true class). For
    ``K > 2`` the same code computes Gorodkin's multi-class generalisation ``R_K`` (as
    ``sklearn.metrics.matthews_corrcoef``), which reduces to the formula above for ``K = 2``:

    .. math::

        \mathrm{MCC} = \frac{c\,s - \sum_k p_k t_k}
        {\sqrt{(s^2 - \sum_k p_k^2)(s^2 - \sum_k t_k^2)}}

    with ``c`` correct predictions, ``s = n``, ``p_k`` / ``t_k`` the predicted / true counts of
    class ``k``. Implemented in torch rather than by calling scikit-learn, whose version warns
    (an error in our test suite) when only one label occurs.

    :param probs: class probabilities ``[n, K]`` or ``[T, n, K]``.
    :param labels: integer labels ``[n]``.
    :returns: MCC in ``[-1, 1]``.

    >>> p = torch.tensor([[0.2, 0.8], [0.3, 0.7], [0.9, 0.1], [0.4, 0.6]])
    >>> round(matthews_corrcoef(p, torch.tensor([1, 1, 0, 0])), 6)  # TP=2 TN=1 FP=1 FN=0
    0.57735
    """
    _, pbar, y = prepare(probs, labels)
    _, pred = top_label(pbar)
    k = pbar.shape[-1]
    t_k = torch.bincount(y, minlength=k).double()
    p_k = torch.bincount(pred, minlength=k).double()
    c = (pred == y).double().sum()
    s = torch.tensor(float(y.numel()), dtype=torch.float64, device=y.device)
    cov_yp = c * s - (p_k * t_k).sum()
    cov_pp = s * s - (p_k * p_k).sum()
    cov_yy = s * s - (t_k * t_k).sum()
    denom = cov_pp * cov_yy
    if float(denom) == 0.0:
        return 0.0
    return float(cov_yp / denom.sqrt())


def negative_log_likelihood(probs, labels) -> float:
    r"""Mean negative log predictive probability of the true class (nats).

    .. math::

        \mathrm{NLL} = -\frac{1}{n} \sum_{i=1}^{n} \log \max(\bar p_{i, y_i}, 10^{-12})

    The clamp keeps a confidently wrong prediction finite (at most :math:`12 \ln 10 \approx
    27.63`). KEP-SVGP reports this ×10.

    :param probs: class probabilities ``[n, K]`` or ``[T, n, K]``.
    :param labels: integer labels ``[n]``.
    :returns: NLL ``>= 0``.

    >>> round(negative_log_likelihood(torch.tensor([[0.5, 0.5], [0.1, 0.9]]), torch.tensor([0, 1])), 6)
    0.399254
    """
    _, pbar, y = prepare(probs, labels)
    p_true = pbar.gather(-1, y.unsqueeze(-1)).squeeze(-1).clamp_min(EPS)
    return float(-p_true.log().mean())


def brier_score(probs, labels) -> float:
    r"""Multi-class Brier score, summed over classes and averaged over samples.

    .. math::

        \mathrm{Brier} = \frac{1}{n} \sum_{i=1}^{n} \sum_{k=1}^{K}
        (\bar p_{ik} - \mathbb{1}[y_i = k])^2 \in [0, 2]

    KEP-SVGP reports this ×100.

    :param probs: class probabilities ``[n, K]`` or ``[T, n, K]``.
    :param labels: integer labels ``[n]``.
    :returns: Brier score.

    >>> brier_score(torch.tensor([[1.0, 0.0], [0.5, 0.5]]), torch.tensor([0, 1]))
    0.25
    """
    _, pbar, y = prepare(probs, labels)
    onehot = torch.nn.functional.one_hot(y, pbar.shape[-1]).to(pbar.dtype)
    return float(((pbar - onehot) ** 2).sum(-1).mean())
