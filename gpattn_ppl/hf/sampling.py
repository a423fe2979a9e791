r"""Monte-Carlo passes of a swapped Hugging Face classifier, and the metrics on them.

A stochastic unit draws on every forward pass that is not inside
:class:`~gpattn_ppl.settings.posterior_mean` (in evaluation mode too; dropout is off there).
:func:`mc_logits` stacks ``S`` such passes; the predictive is their average probability
:math:`\bar p_i = \frac1S\sum_s \mathrm{softmax}(\ell_{s,i})`.
"""

from __future__ import annotations

import contextlib

import numpy as np
import torch

from .. import settings
from ..metrics import SUM_TOL, classification_report
from ..models.host import PrefixCache
from ..models.swap import attention_units, swapped_prefix

__all__ = ["EVAL_METRICS", "check_single_label", "is_stochastic", "mc_logits", "prefix_targets",
           "uncertainty_metrics"]

#: what :func:`uncertainty_metrics` reports (names of
#: :func:`~gpattn_ppl.metrics.classification_report`)
EVAL_METRICS = ("acc", "mcc", "nll", "ece", "entropy", "mutual_info")


def check_single_label(config, where: str) -> None:
    """Refuse a multi-label or regression head (``problem_type`` or ``num_labels < 2``): the
    library's predictive is one softmax over ``K >= 2`` classes.

    :raises ValueError: naming the alternative.
    """
    problem = getattr(config, "problem_type", None)
    K = int(getattr(config, "num_labels", 0) or 0)
    if problem == "multi_label_classification":
        raise ValueError(
            f"{where}: multi-label classification (problem_type='multi_label_classification') "
            "is not supported: the probabilities, entropy and mutual information here are those "
            "of one softmax over the classes. Train one single-label classifier per label "
            "(problem_type='single_label_classification', 2 classes), or take the per-pass "
            "logits [B, S, K] from gpattn_ppl.hf.mc_logits and apply a sigmoid per label")
    if problem == "regression" or K < 2:
        raise ValueError(f"{where}: expected a single-label classifier with num_labels >= 2, "
                         f"got problem_type={problem!r}, num_labels={K}")


def is_stochastic(model: torch.nn.Module) -> bool:
    """Whether two evaluation passes of ``model`` can differ (a stochastic swapped unit)."""
    return any(u.stochastic for u in attention_units(model).values())


def prefix_targets(model: torch.nn.Module) -> list[tuple[object, str]]:
    """The deterministic prefix of a swapped encoder, for
    :class:`~gpattn_ppl.models.host.PrefixCache` (:func:`~gpattn_ppl.models.swap.swapped_prefix`)."""
    return swapped_prefix(model)


@torch.no_grad()
def mc_logits(model: torch.nn.Module, inputs: dict, samples: int = 8, *,
              mean: bool = False) -> torch.Tensor:
    """Logits ``[B, S, K]`` of ``S`` passes of ``model(**inputs)`` in its current mode.

    A deterministic model (or ``mean=True``: the units' posterior means) is run once (``S =
    1``). Call it in evaluation mode, where dropout is off and only the units draw: there the
    deterministic prefix (:func:`prefix_targets`) runs once for the ``S`` passes
    (:class:`~gpattn_ppl.models.host.PrefixCache`; exact, it draws nothing).

    :param inputs: the model's keyword inputs (``input_ids``, ``attention_mask``, ...; no
        labels).
    :param samples: ``S`` for a stochastic model.
    """
    if samples < 1:
        raise ValueError(f"samples must be >= 1, got {samples}")
    S = 1 if mean or not is_stochastic(model) else int(samples)
    targets = prefix_targets(model) if S > 1 and not model.training else []
    reuse = PrefixCache(targets) if targets else contextlib.nullcontext()
    with settings.posterior_mean(mean), reuse:
        return torch.stack([model(**inputs).logits for _ in range(S)], 1)


def _as_pass_probs(predictions) -> torch.Tensor:
    """Per-pass probabilities ``[S, n, K]`` (float64) from predictions ``[n, S, K]`` or
    ``[n, K]``: probabilities as they are, anything else (logits) through a softmax."""
    x = torch.as_tensor(np.asarray(predictions), dtype=torch.float64)
    if x.dim() == 2:
        x = x.unsqueeze(1)
    if x.dim() != 3:
        raise ValueError(f"uncertainty_metrics: expected predictions [n, S, K] or [n, K], got "
                         f"shape {tuple(x.shape)}")
    is_probs = (bool(torch.isfinite(x).all()) and bool((x >= 0).all()) and bool((x <= 1).all())
                and float((x.sum(-1) - 1).abs().max()) <= SUM_TOL)
    return (x if is_probs else torch.softmax(x, -1)).transpose(0, 1)


def uncertainty_metrics(eval_pred, metrics=EVAL_METRICS) -> dict[str, float]:
    """``compute_metrics`` for the ``Trainer``: :func:`~gpattn_ppl.metrics.classification_report`
    of the ``S``-pass predictive.

    :param eval_pred: a ``transformers.EvalPrediction`` (or ``(predictions, labels)``) whose
        predictions are the per-pass probabilities ``[n, S, K]`` that
        :class:`~gpattn_ppl.hf.trainer.SwappedTrainer` gives a ``compute_metrics`` with
        ``per_pass = True`` (this function has it), or one predictive ``[n, K]`` (then the
        mutual information is 0). Rows that are not probabilities (that do not lie in
        ``[0, 1]`` and sum to 1 within :data:`~gpattn_ppl.metrics.SUM_TOL`) are taken for logits
        and put through a softmax.
    :returns: ``{"acc", "mcc", "nll", "ece", "entropy", "mutual_info"}`` (floats).
    """
    probs = _as_pass_probs(eval_pred[0])                                # [S, n, K]
    return classification_report(probs, torch.as_tensor(np.asarray(eval_pred[1])),
                                 metrics=metrics)


#: :class:`~gpattn_ppl.hf.trainer.SwappedTrainer` gives it the per-pass probabilities
uncertainty_metrics.per_pass = True
