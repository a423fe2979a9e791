"""Inference: the Pyro program (model / guide, ELBO), the fit loop, prediction, checkpoints.

* :mod:`~gpattn_ppl.infer.program` -- :class:`PyroProgram`, the model and guide of a network;
* :mod:`~gpattn_ppl.infer.fit` -- :func:`fit_epoch`, one pass of optimiser steps (stopping at
  the first non-finite step), :func:`objective_checks` of the objective's scale, and the
  learning-rate schedule :func:`lr_lambda`;
* :mod:`~gpattn_ppl.infer.predictive` -- :func:`predict`, T stochastic passes (each one
  :func:`program_pass`);
* :mod:`~gpattn_ppl.infer.precision` -- ``fp32`` / ``bf16`` / ``fp16`` autocast and the fp16
  gradient scaler;
* :mod:`~gpattn_ppl.infer.variance_budget` -- :func:`variance_budget`, where a stochastic
  network's predictive spread goes, from each unit's latent to the class probabilities;
* :mod:`~gpattn_ppl.infer.checkpoint` -- atomic checkpoints, RNG states, warm starts.
"""

from .checkpoint import (
    WARM_START_MIN_SHARE,
    CheckpointError,
    UnsafeCheckpointError,
    atomic_write,
    init_from,
    load_checkpoint,
    load_predictions,
    load_pt,
    rng_state,
    save_atomic,
    set_rng_state,
)
from .fit import (
    LOSS_RANGE,
    TERM_HINTS,
    TERM_RATIO,
    epoch_clock,
    fit_epoch,
    lr_lambda,
    objective_checks,
)
from .precision import PRECISIONS, autocast, grad_scaler
from .predictive import predict, program_pass
from .program import PyroProgram, unit_schedules
from .variance_budget import q_at_prior, set_q_to_prior, stochastic_units, variance_budget

__all__ = ["CheckpointError", "LOSS_RANGE", "PRECISIONS", "PyroProgram", "TERM_HINTS", "TERM_RATIO",
           "UnsafeCheckpointError", "WARM_START_MIN_SHARE", "atomic_write", "autocast", "epoch_clock", "fit_epoch", "grad_scaler", "init_from",
           "load_checkpoint", "load_predictions", "load_pt", "lr_lambda",
           "objective_checks", "predict", "program_pass", "q_at_prior", "rng_state",
           "save_atomic", "set_q_to_prior", "set_rng_state", "stochastic_units", "unit_schedules",
           "variance_budget"]
