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
mode (the units draw, dropout is off; :func:`~gpattn_ppl.hf.sampling.mc_logits`), or one pass at
the units' posterior means (``eval_mean``; default: ``model.config.gpattn_predictive ==
"mean"``). The loss is the NLL of the averaged probabilities
:math:`\bar p_i = \frac1S\sum_s p_{s,i}`, and

* ``predict(...).predictions`` are the averaged probabilities :math:`\bar p` ``[n, K]``
  (``argmax(-1)`` is the predicted class), or the per-pass probabilities ``[n, S, K]`` with
  ``per_pass=True`` (an argument of ``predict`` or of the trainer);
* a ``compute_metrics`` receives the averaged probabilities ``[n, K]`` as ``predictions``, so
  an ordinary one (``argmax(-1)``, ``evaluate.load("accuracy")``) works as it is; one whose
  attribute ``per_pass`` is true receives the per-pass probabilities ``[n, S, K]``. The
  default, :func:`~gpattn_ppl.hf.sampling.uncertainty_metrics`, is such a one: it reports
  accuracy, MCC, NLL, ECE, the predictive entropy and the mutual information.

Only single-label classification is supported (``labels`` are class ids ``[B]``); a
multi-label or regression head is refused when the trainer is built
(:func:`~gpattn_ppl.hf.sampling.check_single_label`, which names the alternatives).

Several processes (``torchrun --nproc_per_node P script.py`` or ``accelerate launch
--multi_gpu --num_processes P script.py``; on CPU with the gloo backend, on GPUs with NCCL):
the script is unchanged, every process builds the same model and trainer, and the ``Trainer``
shards each global batch of ``P * per_device_train_batch_size`` examples. The objective stays
the global one: :math:`N_\text{data}` is ``len(train_dataset)``, the size of the whole training
set (every process holds all of it; pass ``num_data``, the global count, for a dataset without
a length or one sharded by hand), each process's loss is its shard's mean plus the global terms
over :math:`N_\text{data}`, and the data-parallel gradient average gives the gradient of the
global batch's objective. The step-0 weights are computed from the cross-entropy and the terms
averaged over the processes, so every process uses the same weights, those of one process with
the same global batch (``tests/hf/test_trainer_distributed.py`` checks losses and weights
against one process). The logged ``loss`` is the mean over the processes; the
``term/<group>`` logs are those of the main process's batches. Evaluation and ``predict``
gather the predictions of all processes (each example once).
"""

from __future__ import annotations

import math

import numpy as np
import torch
import torch.nn.functional as F

from ..models.swap import attention_units
from ..ppl import apply_schedules
from .hub import _transformers, check_swap_record
from .sampling import check_single_label, mc_logits, uncertainty_metrics

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
    docstring for the loss, the evaluation and several processes).

    Takes every argument of ``Trainer`` plus:

    :param term_weights: weights overriding the step-0 rule, by term name or by group; the
        others are set on the first training batch (``step0``).
    :param mc_samples: stochastic passes averaged per evaluation batch (a deterministic model
        is run once).
    :param eval_mean: evaluate the units' posterior means instead (one pass); default
        (``None``): ``model.config.gpattn_predictive == "mean"``.
    :param num_data: ``N_data`` for the global terms (default: ``len(train_dataset)``): the
        number of training examples of all processes together.
    :param eval_seed: seeds the passes of every evaluation, so that ``evaluate`` is
        reproducible (the random state of training is left as it was); ``None`` draws from the
        global state.
    :param per_pass: ``predict`` returns the per-pass probabilities ``[n, S, K]`` instead of
        their average ``[n, K]`` (also an argument of :meth:`predict`).
    :raises SwapRecordError: the model holds units swapped without a record (it could not be
        reloaded: use :func:`~gpattn_ppl.hf.swap`).
    :raises ValueError: a multi-label or regression head
        (:func:`~gpattn_ppl.hf.sampling.check_single_label`).

    ``compute_metrics`` defaults to :func:`~gpattn_ppl.hf.sampling.uncertainty_metrics`.
    The inputs need single-label class ids under ``labels``.

    Several processes: launch the unchanged script with ``torchrun --nproc_per_node 2
    train.py`` or ``accelerate launch --multi_gpu --num_processes 2 train.py`` (CPU: add
    ``use_cpu=True`` to the ``TrainingArguments``; gloo is then the backend; accelerate's
    ``--cpu`` alone starts one process). ``per_device_train_batch_size``
    is per process, so the global batch is ``P`` times it. ``ddp_find_unused_parameters``
    left at ``None`` is set to ``False`` in the ``TrainingArguments``: every parameter of a
    swapped model reaches the loss, some (a variational covariance when the units run at their
    posterior means) only through a unit's terms, which DDP's search for unused parameters,
    from the forward's outputs, would count twice. Set it to ``True`` for a model with trainable
    parameters that never reach the loss.

    :ivar term_weights: group -> weight in use (filled on the first training batch).
    :ivar step0: ``{"cross_entropy", "terms", "weights"}`` measured on the first training
        batch (``None`` before); with several processes, the means over the processes.
    """

    def __init__(self, *args, term_weights: dict[str, float] | None = None,
                 mc_samples: int = 8, eval_mean: bool | None = None, num_data: int | None = None,
                 eval_seed: int | None = 0, per_pass: bool = False, **kwargs) -> None:
        kwargs.setdefault("compute_metrics", uncertainty_metrics)
        training_args = kwargs.get("args", args[1] if len(args) > 1 else None)
        if getattr(training_args, "ddp_find_unused_parameters", False) is None:
            # every parameter reaches the loss, some only through a unit's terms (computed
            # beside the forward's outputs), which DDP's search for unused parameters would
            # mark ready twice
            training_args.ddp_find_unused_parameters = False
        super().__init__(*args, **kwargs)
        if isinstance(self.model, transformers.PreTrainedModel):
            check_swap_record(self.model, where="SwappedTrainer")
        config = getattr(self.model, "config", None)
        if config is not None:
            check_single_label(config, "SwappedTrainer")
        if mc_samples < 1:
            raise ValueError(f"mc_samples must be >= 1, got {mc_samples}")
        if eval_mean is None:
            eval_mean = getattr(config, "gpattn_predictive", None) == "mean"
        self.mc_samples, self.eval_mean = int(mc_samples), bool(eval_mean)
        self.eval_seed = eval_seed
        self.per_pass = bool(per_pass)
        self.overrides = {k: float(v) for k, v in (term_weights or {}).items()}
        self._num_data = num_data
        self.term_weights: dict[str, float] = {}
        self.step0: dict | None = None
        self._sums: dict[str, float] = {}
        self._count = 0
        self._per_pass_now: bool | None = None
        # the loss below is a per-batch mean: the Trainer divides it for gradient accumulation
        self.loss_is_scaled_for_ga = False

    # -- the objective --------------------------------------------------------------------------
    @property
    def num_data(self) -> int:
        """``N_data``: ``num_data`` if given, else the size of the training set (all of it,
        whatever the number of processes)."""
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

    def _process_mean(self, values: torch.Tensor) -> torch.Tensor:
        """``values`` averaged over the processes (itself for one process)."""
        if self.accelerator.num_processes <= 1:
            return values
        return self.accelerator.reduce(values, reduction="mean")

    def compute_loss(self, model, inputs, return_outputs: bool = False,
                     num_items_in_batch=None):
        """Cross-entropy plus the weighted term groups (module docstring)."""
        inputs = dict(inputs)
        labels = inputs.pop("labels", None)
        if labels is None or labels.dim() != 1 or labels.is_floating_point():
            raise ValueError("SwappedTrainer: expected single-label class ids [B] under "
                             f"'labels', got {None if labels is None else tuple(labels.shape)}"
                             " (multi-label classification is not supported)")
        core = self.accelerator.unwrap_model(model)     # group names without a DDP "module."
        if model.training:
            apply_schedules(core, float(self.state.epoch or 0.0), self.args.num_train_epochs)
        outputs = model(**inputs)
        logits = outputs["logits"] if isinstance(outputs, dict) else outputs[0]
        ce = F.cross_entropy(logits.float(), labels)
        terms = objective_terms(core, self.num_data)
        if model.training and self.step0 is None:
            groups = sorted(terms)
            step0 = self._process_mean(torch.stack(
                [ce.detach().float(), *(terms[g].detach().float() for g in groups)]))
            ce0 = float(step0[0])
            t0 = {g: float(v) for g, v in zip(groups, step0[1:])}
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
        """Add the mean unweighted term groups since the last training log (``term/<group>``;
        with several processes, those of this process's batches)."""
        if "loss" in logs and self._count:
            for group, total in self._sums.items():
                logs[f"term/{group}"] = total / self._count
            self._sums, self._count = {}, 0
        super().log(logs, *args, **kwargs)

    # -- evaluation -----------------------------------------------------------------------------
    def predict(self, test_dataset, ignore_keys=None, metric_key_prefix: str = "test",
                per_pass: bool | None = None):
        """``Trainer.predict``: ``predictions`` are the averaged probabilities ``[n, K]``, or
        the per-pass probabilities ``[n, S, K]`` with ``per_pass=True`` (default: the trainer's
        ``per_pass``); ``metrics`` as ``evaluate()`` with the prefix ``test_``."""
        self._per_pass_now = self.per_pass if per_pass is None else bool(per_pass)
        try:
            return super().predict(test_dataset, ignore_keys=ignore_keys,
                                   metric_key_prefix=metric_key_prefix)
        finally:
            self._per_pass_now = None

    def evaluation_loop(self, *args, **kwargs):
        """``Trainer.evaluation_loop`` with its passes seeded by ``eval_seed``, the per-pass
        probabilities given to a ``compute_metrics`` with ``per_pass`` and the averaged ones to
        any other, and averaged predictions unless ``per_pass`` was asked for."""
        user = self.compute_metrics
        if user is not None and not getattr(user, "per_pass", False):
            def averaged(eval_pred, **kw):
                return user(transformers.EvalPrediction(
                    predictions=_average(eval_pred.predictions), label_ids=eval_pred.label_ids,
                    inputs=eval_pred.inputs, losses=eval_pred.losses), **kw)
            self.compute_metrics = averaged
        try:
            if self.eval_seed is None:
                out = super().evaluation_loop(*args, **kwargs)
            else:
                devices = [self.args.device] if self.args.device.type == "cuda" else []
                with torch.random.fork_rng(devices=devices):
                    torch.manual_seed(self.eval_seed)
                    out = super().evaluation_loop(*args, **kwargs)
        finally:
            self.compute_metrics = user
        if not self._per_pass_now:
            out = out._replace(predictions=_average(out.predictions))
        return out

    def prediction_step(self, model, inputs, prediction_loss_only: bool, ignore_keys=None):
        """``S`` passes: ``(NLL of the averaged probabilities, per-pass probabilities
        [B, S, K], labels)``."""
        inputs = dict(self._prepare_inputs(inputs))
        labels = inputs.pop("labels", None)
        core = self.accelerator.unwrap_model(model)
        logits = mc_logits(core, inputs, self.mc_samples, mean=self.eval_mean).float()
        loss = None
        if labels is not None:
            log_mean = torch.logsumexp(logits.log_softmax(-1), 1) - math.log(logits.shape[1])
            loss = F.nll_loss(log_mean, labels).detach()
        if prediction_loss_only:
            return loss, None, None
        return loss, torch.softmax(logits, -1), labels


def _average(predictions):
    """Per-pass probabilities ``[n, S, K]`` -> their mean ``[n, K]`` (a list of such arrays
    when the ``Trainer`` does not concatenate the batches; ``None`` stays ``None``)."""
    if predictions is None:
        return None
    if isinstance(predictions, (list, tuple)):
        return type(predictions)(_average(p) for p in predictions)
    return np.asarray(predictions).mean(1)
