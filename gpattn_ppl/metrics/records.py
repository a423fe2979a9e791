r"""The one schema of a per-input prediction, shared by every predictor of the library.

:meth:`gpattn_ppl.run.predictor.Predictor.predict` (``load_run(...).predict``), ``gpattn-ppl
predict`` (one JSON line per input: ``text`` first, then these keys) and the Hugging Face
pipeline (``transformers.pipeline("uncertainty-classification", ...)``,
:class:`~gpattn_ppl.hf.pipeline.UncertaintyPipeline`) return, per input, a dict with the keys
of :data:`PREDICTION_KEYS`, in this order. From ``T`` passes with class probabilities
:math:`p_{t,k}` (``T = 1``: a deterministic model, or the units' posterior mean, run once) and
their mean :math:`\bar p_k = \frac1T\sum_t p_{t,k}`:

===============  ===========================================================================
key              value
===============  ===========================================================================
``label``        the name of the most probable class, :math:`\hat y = \arg\max_k \bar p_k`
``score``        its probability :math:`\max_k \bar p_k` (the max-softmax probability)
``probs``        class name -> :math:`\bar p_k`, every class in index order (the pipeline's
                 ``top_k=k``: the ``k`` most probable classes, most probable first)
``entropy``      the predictive entropy :math:`-\sum_k \bar p_k\log\bar p_k`
                 (:func:`~gpattn_ppl.metrics.predictive_entropy`)
``mutual_info``  :math:`\mathcal H[\bar p] - \frac1T\sum_t \mathcal H[p_t]`
                 (:func:`~gpattn_ppl.metrics.mutual_information`) for ``T > 1`` passes;
                 ``None`` (JSON ``null``) for one pass: it is 0 by definition there
===============  ===========================================================================

Natural logarithms; floats are Python floats, so a record is JSON as it is. ``label`` and
``score`` are the keys of a ``transformers`` text-classification pipeline.

>>> import torch
>>> p = torch.tensor([[[0.9, 0.1]], [[0.5, 0.5]]], dtype=torch.float64)     # T = 2, n = 1
>>> r = prediction_records(p, ["no", "yes"])[0]
>>> list(r), r["label"], round(r["score"], 3), round(r["mutual_info"], 4)
(['label', 'score', 'probs', 'entropy', 'mutual_info'], 'no', 0.7, 0.1017)
>>> prediction_records(p[:1], ["no", "yes"])[0]["mutual_info"] is None      # one pass
True
"""

from __future__ import annotations

from collections.abc import Sequence

from ._validation import as_probs
from .uncertainty import entropy

__all__ = ["PREDICTION_KEYS", "prediction_records"]

#: the keys of a prediction record, in order
PREDICTION_KEYS = ("label", "score", "probs", "entropy", "mutual_info")


def prediction_records(probs, classes: Sequence[str], *, top_k: int | None = None,
                       ranked: bool = False) -> list[dict]:
    """One record per input (module docstring) from per-pass probabilities.

    :param probs: class probabilities ``[T, n, K]`` (``T`` passes) or ``[n, K]`` (one pass).
    :param classes: the ``K`` class names, in index order.
    :param ranked: order ``probs`` by probability, most probable first, instead of by index.
    :param top_k: with ``ranked``, keep the ``top_k`` most probable classes only (``None``:
        all).
    :raises ValueError: malformed probabilities (:func:`~gpattn_ppl.metrics.as_probs`), a
        number of class names other than ``K``, or ``top_k < 1``.
    """
    p = as_probs(probs)                                        # [T, n, K], float64
    classes = [str(c) for c in classes]
    if len(classes) != p.shape[-1]:
        raise ValueError(f"prediction_records: {len(classes)} class names for "
                         f"{p.shape[-1]} classes")
    if top_k is not None and (isinstance(top_k, bool) or not isinstance(top_k, int)
                              or top_k < 1):
        raise ValueError(f"top_k must be a positive int or None, got {top_k!r}")
    mean = p.mean(0)
    H = entropy(mean)
    MI = (H - entropy(p).mean(0)).clamp_min(0.0) if p.shape[0] > 1 else None
    score, pred = mean.max(-1)
    out = []
    for i in range(mean.shape[0]):
        row = mean[i].tolist()
        order = range(len(classes))
        if ranked:
            order = sorted(order, key=lambda k: -row[k])[:top_k]
        out.append({"label": classes[int(pred[i])], "score": float(score[i]),
                    "probs": {classes[k]: float(row[k]) for k in order},
                    "entropy": float(H[i]),
                    "mutual_info": None if MI is None else float(MI[i])})
    return out
