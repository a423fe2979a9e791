r"""Fine-tune a swapped Hugging Face classifier with ``transformers.Trainer``.

:class:`SwappedTrainer` is a ``Trainer`` whose loss is the library's per-datum objective
(:mod:`gpattn_ppl.ppl.objective`) and whose evaluation averages ``S`` stochastic passes. Per
training batch of size ``B`` drawn from ``N_data`` examples,

.. math::

    \mathcal L = \frac1B\sum_{i}\mathrm{CE}_i
      + \sum_g w_g\Big(\frac1B\sum_i \ell_{g,i} + \frac{\ell_g^{\text{glob}}}{N_\text{data}}\Big),

one group :math:`g` per unit and term name (``"<unit path>.kl"`` holds the unit's local ``kl``
and its ``kl_global``; ``ksvd_loss``, ``cgp_loss``, ...). The default weights follow the
step-0 rule (``docs/derivations/pretrained_init.rst``, "Objective terms at step 0"): on the
first training batch each group is weighted so that it starts at a tenth of the
cross-entropy, rounded down to one significant digit and never above 1 (the ELBO's weight):

.. math::

    w_g = \min\big(1,\ \lfloor 0.1\,\mathrm{CE}_0 / T_{g,0} \rfloor_{1\,\text{digit}}\big)

(:func:`step0_weight`; :math:`w_g = 1` when :math:`T_{g,0} \le 0`). That gives e.g. SGPA's
``kl`` a weight near 1e-8 on all-MiniLM-L6-v2: a tempered posterior, not the papers'
objective, without which the first steps follow the KL alone. The weights then stay constant;
``term_weights`` overrides them by term name (``{"kl": 1e-6}``) or by group
(``{"bert.encoder.layer.5.attention.unit.kl": 0.0}``). Scheduled unit attributes (Gumbel
temperatures) follow the trainer's epoch (:func:`~gpattn_ppl.ppl.apply_schedules`).

At evaluation (``evaluate``, ``predict``) each batch runs ``mc_samples`` passes in evaluation
mode (the units draw, dropout is off; :func:`~gpattn_ppl.hf.sampling.mc_logits`): the
predictions are the per-pass logits ``[n, S, K]``, the loss is the NLL of the averaged
probabilities, and the default ``compute_metrics``
(:func:`~gpattn_ppl.hf.sampling.uncertainty_metrics`) reports accuracy, MCC, NLL, ECE, the
predictive entropy and the mutual information.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F

from ..models.swap import attention_units
from ..ppl import apply_schedules
from .hub import _transformers, check_swap_record
from .sampling import mc_logits, uncertainty_metrics

__all__ = ["STEP0_RATIO", "SwappedTrainer", "objective_terms", "step0_weight"]

transformers = _transformers()

#: the share of the step-0 cross-entropy each term group starts at (the step-0 rule)
STEP0_RATIO = 0.1


def step0_weight(cross_entropy: float, term: float, ratio: float = STEP0_RATIO) -> float:
    r"""The step-0 rule: :math:`\min(1, \lfloor r\,\mathrm{CE}_0/T_0\rfloor)`, rounded down to one
    significant digit; 1 for a term that starts at or below 0.

    >>> step0_weight(0.76, 5.3e6), step0_weight(0.63, 165.0), step0_weight(0.66, 0.04)
    (1e-08, 0.0003, 1.0)

    :raises ValueError: a non-finite or negative cross-entropy, or a non-finite term.
    """
    if not (math.isfinite(cross_entropy) and cross_entropy >= 0 and math.isfinite(term)):
        raise ValueError(f"step-0 rule: cross-entropy {cross_entropy} and term {term} must be "
                         "finite (and the cross-entropy >= 0)")
    if term <= 0:
        return 1.0
    w = ratio * cross_entropy / term
    if w >= 1:
        return 1.0
    if w == 0:
        return 0.0
    exp = math.floor(math.log10(w))
    digit = math.floor(w / 10.0 ** exp + 1e-9)
    if digit == 0:                     # log10 rounded up at a power of ten
        exp, digit = exp - 1, 9
    return float(f"{min(digit, 9)}e{exp}")


def objective_terms(model: torch.nn.Module, num_data: int) -> dict[str, torch.Tensor]:
    """Group -> per-datum share of each unit's terms of the last forward pass: the batch mean of
    a local ``[B]`` term plus a global 0-d one divided by ``num_data`` (``<name>_global``
    joins the group of ``<name>``)."""
    out: dict[str, torch.Tensor] = {}
    for path, unit in attention_units(model).items():
        for name, value in unit.objective_terms().items():
            group = f"{path}.{name.removesuffix('_global')}"
            share = value.float().mean() if value.dim() else value.float() / num_data
            out[group] = out[group] + share if group in out else share
    return out


class SwappedTrainer(transformers.Trainer):
    """``transformers.Trainer`` for a classifier with swapped attention units (see the module
    docstring for the loss and the evaluation).

    Takes every argument of ``Trainer`` plus:

    :param term_weights: weights overriding the step-0 rule, by term name or by group; the
        others are set on the first training batch (``step0``).
    :param mc_samples: stochastic passes averaged per evaluation batch (a deterministic model
        is run once).
    :param eval_mean: evaluate the units' posterior means instead (one pass).
    :param num_data: ``N_data`` for the global terms (default: ``len(train_dataset)``).
    :param eval_seed: seeds the passes of every evaluation, so that ``evaluate`` is
        reproducible (the random state of training is left as it was); ``None`` draws from the
        global state.
    :raises SwapRecordError: the model holds units swapped without a record (it could not be
        reloaded: use :func:`~gpattn_ppl.hf.swap`).

    ``compute_metrics`` defaults to :func:`~gpattn_ppl.hf.sampling.uncertainty_metrics`.
    The inputs need single-label class ids under ``labels``.

    :ivar term_weights: group -> weight in use (filled on the first training batch).
    :ivar step0: ``{"cross_entropy", "terms", "weights"}`` measured on the first training
        batch (``None`` before).
    """

    def __init__(self, *args, term_weights: dict[str, float] | None = None,
                 mc_samples: int = 8, eval_mean: bool = False, num_data: int | None = None,
                 eval_seed: int | None = 0, **kwargs) -> None:
        kwargs.setdefault("compute_metrics", uncertainty_metrics)
        super().__init__(*args, **kwargs)
        if isinstance(self.model, transformers.PreTrainedModel):
            check_swap_record(self.model, where="SwappedTrainer")
        if mc_samples < 1:
            raise ValueError(f"mc_samples must be >= 1, got {mc_samples}")
        self.mc_samples, self.eval_mean = int(mc_samples), bool(eval_mean)
        self.eval_seed = eval_seed
        self.overrides = {k: float(v) for k, v in (term_weights or {}).items()}
        self._num_data = num_data
        self.term_weights: dict[str, float] = {}
        self.step0: dict | None = None
        self._sums: dict[str, float] = {}
        self._count = 0
        # the loss below is a per-batch mean: the Trainer divides it for gradient accumulation
        self.loss_is_scaled_for_ga = False

    # -- the objective --------------------------------------------------------------------------
    @property
    def num_data(self) -> int:
        """``N_data``: ``num_data`` if given, else the size of the training set."""
        if self._num_data is not None:
            return int(self._num_data)
        try:
            return len(self.train_dataset)
        except TypeError:
            raise ValueError("SwappedTrainer: the training set has no length; pass num_data "
                             "(N_data, which divides the units' global terms)") from None

    def _weight(self, group: str, ce0: float, t0: float) -> float:
        if group in self.overrides:
            return self.overrides[group]
        name = group.rsplit(".", 1)[-1]
        if name in self.overrides:
            return self.overrides[name]
        return step0_weight(ce0, t0)

    def compute_loss(self, model, inputs, return_outputs: bool = False,
                     num_items_in_batch=None):
        """Cross-entropy plus the weighted term groups (module docstring)."""
        inputs = dict(inputs)
        labels = inputs.pop("labels", None)
        if labels is None or labels.dim() != 1 or labels.is_floating_point():
            raise ValueError("SwappedTrainer: expected single-label class ids [B] under "
                             f"'labels', got {None if labels is None else tuple(labels.shape)}")
        if model.training:
            apply_schedules(model, float(self.state.epoch or 0.0), self.args.num_train_epochs)
        outputs = model(**inputs)
        logits = outputs["logits"] if isinstance(outputs, dict) else outputs[0]
        ce = F.cross_entropy(logits.float(), labels)
        terms = objective_terms(model, self.num_data)
        if model.training and self.step0 is None:
            ce0 = float(ce.detach())
            t0 = {g: float(v.detach()) for g, v in terms.items()}
            self.term_weights = {g: self._weight(g, ce0, t) for g, t in t0.items()}
            self.step0 = {"cross_entropy": ce0, "terms": t0, "weights": dict(self.term_weights)}
        loss = ce
        for group, value in terms.items():
            if group not in self.term_weights:       # a term that appeared after step 0
                self.term_weights[group] = self._weight(group, float(ce.detach()),
                                                        float(value.detach()))
            w = self.term_weights[group]
            if w:
                loss = loss + w * value
        if model.training:
            for group, value in terms.items():
                self._sums[group] = self._sums.get(group, 0.0) + float(value.detach())
            self._count += 1
        if return_outputs:
            return loss, outputs
        return loss

    def log(self, logs: dict[str, float], *args, **kwargs) -> None:
        """Add the mean unweighted term groups since the last training log (``term/<group>``)."""
        if "loss" in logs and self._count:
            for group, total in self._sums.items():
                logs[f"term/{group}"] = total / self._count
            self._sums, self._count = {}, 0
        super().log(logs, *args, **kwargs)

    # -- evaluation -----------------------------------------------------------------------------
    def evaluation_loop(self, *args, **kwargs):
        """``Trainer.evaluation_loop`` with its passes seeded by ``eval_seed``."""
        if self.eval_seed is None:
            return super().evaluation_loop(*args, **kwargs)
        devices = [self.args.device] if self.args.device.type == "cuda" else []
        with torch.random.fork_rng(devices=devices):
            torch.manual_seed(self.eval_seed)
            return super().evaluation_loop(*args, **kwargs)

    def prediction_step(self, model, inputs, prediction_loss_only: bool, ignore_keys=None):
        """``S`` passes: ``(NLL of the averaged probabilities, logits [B, S, K], labels)``."""
        inputs = dict(self._prepare_inputs(inputs))
        labels = inputs.pop("labels", None)
        logits = mc_logits(model, inputs, self.mc_samples, mean=self.eval_mean).float()
        loss = None
        if labels is not None:
            log_mean = torch.logsumexp(logits.log_softmax(-1), 1) - math.log(logits.shape[1])
            loss = F.nll_loss(log_mean, labels).detach()
        if prediction_loss_only:
            return loss, None, None
        return loss, logits, labels
