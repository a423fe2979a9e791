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
from ..metrics import classification_report
from ..models.host import PrefixCache
from ..models.swap import attention_units, swapped_prefix

__all__ = ["EVAL_METRICS", "is_stochastic", "mc_logits", "prefix_targets",
           "uncertainty_metrics"]

#: what :func:`uncertainty_metrics` reports (names of
#: :func:`~gpattn_ppl.metrics.classification_report`)
EVAL_METRICS = ("acc", "mcc", "nll", "ece", "entropy", "mutual_info")


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


def uncertainty_metrics(eval_pred, metrics=EVAL_METRICS) -> dict[str, float]:
    """``compute_metrics`` for the ``Trainer``: :func:`~gpattn_ppl.metrics.classification_report`
    of the ``S``-pass predictive.

    :param eval_pred: a ``transformers.EvalPrediction`` (or ``(predictions, labels)``) whose
        predictions are the per-pass logits ``[n, S, K]`` of
        :class:`~gpattn_ppl.hf.trainer.SwappedTrainer` (or one pass ``[n, K]``).
    :returns: ``{"acc", "mcc", "nll", "ece", "entropy", "mutual_info"}`` (floats).
    """
    logits, labels = eval_pred[0], eval_pred[1]
    logits = torch.as_tensor(np.asarray(logits), dtype=torch.float64)
    if logits.dim() == 2:
        logits = logits.unsqueeze(1)
    probs = torch.softmax(logits, -1).transpose(0, 1)                  # [S, n, K]
    return classification_report(probs, torch.as_tensor(np.asarray(labels)), metrics=metrics)
