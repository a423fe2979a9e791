"""The fit loop: a Pyro program, a torch optimiser and batches -> one pass of optimiser steps.

Nothing here knows about configs, datasets, devices or run folders (that is
:mod:`gpattn_ppl.run`); the caller hands in the batches (any iterable of
:class:`~gpattn_ppl.data.batch.Batch`-like objects with ``x``, ``mask``, ``y``, ``index``) and a
clock giving the fractional epoch of each step.

>>> f = lr_lambda("cosine", total_steps=10, warmup_steps=2, min_ratio=0.0)
>>> f(0), f(1), f(10)
(0.5, 1.0, 0.0)
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable

import torch

from .. import settings
from .program import PyroProgram

__all__ = ["epoch_clock", "fit_epoch", "lr_lambda"]


def lr_lambda(schedule: str, total_steps: int, warmup_steps: int, min_ratio: float):
    """Multiplier of the base learning rate at optimiser step ``s`` (linear warm-up from
    ``1/warmup_steps``, never 0, then cosine / linear decay to ``min_ratio``, or constant);
    for :class:`torch.optim.lr_scheduler.LambdaLR`."""

    def f(step: int) -> float:
        if step < warmup_steps:
            return (step + 1) / warmup_steps
        if schedule == "constant":
            return 1.0
        p = min((step - warmup_steps) / max(total_steps - warmup_steps, 1), 1.0)
        if schedule == "cosine":
            return min_ratio + (1 - min_ratio) * 0.5 * (1 + math.cos(math.pi * p))
        return 1.0 - (1.0 - min_ratio) * p

    return f


def epoch_clock(epoch: int | float, steps_per_epoch: int) -> Callable[[int], float]:
    """The clock of epoch ``epoch``: step ``i`` of it is at fractional epoch
    ``epoch + i / steps_per_epoch``."""
    return lambda i: epoch + i / steps_per_epoch


def fit_epoch(program: PyroProgram, optimizer: torch.optim.Optimizer, batches: Iterable, *,
              scheduler=None, grad_clip: float | None = None,
              clock: Callable[[int], float] | None = None, progress=None,
              step_losses: list | None = None, epoch: int | float | None = None
              ) -> dict[str, float]:
    """One pass of optimiser steps over ``batches``.

    Per step ``i``, in this order: draw the batch (the iterable may be lazy, so its random
    choices interleave with the step's), move the program's clock with
    :meth:`~gpattn_ppl.infer.PyroProgram.set_epoch` to ``clock(i)``, compute
    :meth:`~gpattn_ppl.infer.PyroProgram.loss`, ``zero_grad``, ``backward``, clip the gradient
    norm of the network's parameters to ``grad_clip`` (when truthy), ``optimizer.step()``,
    ``scheduler.step()``.

    :param clock: step index -> fractional epoch (:func:`epoch_clock`); ``None`` leaves the
        program's clock where it is.
    :param progress: an object with ``update(1)`` (a tqdm bar), called after each step.
    :param step_losses: a list the detached per-step losses are appended to (as floats).
    :param epoch: named in the error when the loss becomes non-finite (default: ``clock(0)``).
    :returns: ``{"loss": mean loss, "term/<name>": mean of each objective term}``.
    :raises FloatingPointError: a non-finite mean loss (when ``settings.validate_args`` is on).
    :raises ValueError: ``batches`` is empty.
    """
    net = program.net
    net.train()
    device = next(net.parameters()).device
    loss_sum = torch.zeros((), device=device)
    term_sums: dict[str, torch.Tensor] = {}
    losses: list[torch.Tensor] = []
    n_steps = 0
    for i, b in enumerate(batches):
        if clock is not None:
            program.set_epoch(clock(i))
        loss = program.loss(b.x, b.mask, b.y, b.index)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        if grad_clip:
            torch.nn.utils.clip_grad_norm_(net.parameters(), grad_clip)
        optimizer.step()
        if scheduler is not None:
            scheduler.step()
        loss_sum += loss.detach()
        for name, value in program.last_terms.items():
            term_sums[name] = term_sums.get(name, 0.0) + value
        n_steps += 1
        losses.append(loss.detach())
        if progress is not None:
            progress.update(1)
    if n_steps == 0:
        raise ValueError("fit_epoch: no batches")
    if step_losses is not None:
        step_losses.extend(float(v) for v in losses)
    if settings.validate_args.value() and not math.isfinite(float(loss_sum)):
        if epoch is None:
            epoch = clock(0) if clock is not None else program.epoch
        raise FloatingPointError(f"training loss became non-finite in epoch {epoch}")
    out = {"loss": float(loss_sum) / n_steps}
    out.update({f"term/{k}": float(v) / n_steps for k, v in term_sums.items()})
    return out
