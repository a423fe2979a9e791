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
import warnings
from collections.abc import Callable, Iterable

import pyro
import torch

from .. import linalg, settings
from ..errors import DivergenceError, NumericsWarning
from ..linalg import CholeskyError, NonFiniteError
from ..ppl import OBJECTIVE_WEIGHTS
from .precision import autocast
from .program import PyroProgram

__all__ = ["LOSS_RANGE", "TERM_HINTS", "TERM_RATIO", "epoch_clock", "fit_epoch", "lr_lambda",
           "objective_checks"]


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
              step_losses: list | None = None, epoch: int | float | None = None,
              checks: dict | bool = True, precision: str = "fp32",
              scaler: torch.amp.GradScaler | None = None, accumulate: int = 1,
              on_step: Callable[[int, float], None] | None = None) -> dict[str, float]:
    """One pass of optimiser steps over ``batches``.

    Per step ``i``, in this order: draw the batch (the iterable may be lazy, so its random
    choices interleave with the step's), move the program's clock with
    :meth:`~gpattn_ppl.infer.PyroProgram.set_epoch` to ``clock(i)``, compute
    :meth:`~gpattn_ppl.infer.PyroProgram.loss`, ``zero_grad``, ``backward``, clip the gradient
    norm of the network's parameters to ``grad_clip`` (when truthy), ``optimizer.step()``,
    ``scheduler.step()``.

    **One host synchronisation per step.** The loss is computed on the fast path: without
    argument checks (:class:`~gpattn_ppl.settings.validate_args` and Pyro's validation off)
    and with every Cholesky unchecked (:class:`~gpattn_ppl.linalg.deferred_checks`). Its value
    and whether any factorisation failed are read to the host together, once, before
    ``backward``. A step whose factorisation failed, whose loss is not finite or whose fast
    path raised is computed again with every check on -- where the failing matrices get their
    jitter escalation, or a named error -- and a loss still non-finite then stops the pass
    before it reaches the parameters. Such re-runs are counted (``checked_reruns``).

    :param clock: step index -> fractional epoch (:func:`epoch_clock`); ``None`` leaves the
        program's clock where it is.
    :param progress: an object with ``update(1)`` (a tqdm bar), called after each step.
    :param step_losses: a list the per-step losses are appended to (as floats).
    :param epoch: named in the error when training diverges (default: ``clock(0)``).
    :param checks: the objective-scale check of this pass's means (:func:`objective_checks`:
        an objective term that outweighs the cross-entropy :data:`TERM_RATIO` times, or a loss
        out of :data:`LOSS_RANGE`). ``True`` (the default): each message is warned
        (:class:`~gpattn_ppl.errors.NumericsWarning`, naming the option that fixes it); a dict:
        it receives ``{key: message}`` instead, for a caller that reports once per run (the
        trainer); ``False``: no check.
    :param precision: ``fp32``, ``bf16`` or ``fp16``: the loss (the forward pass) runs under
        :func:`~gpattn_ppl.infer.precision.autocast` (the GP algebra stays in
        :class:`~gpattn_ppl.settings.gp_dtype`); the backward follows the forward's dtypes.
    :param accumulate: ``k``, micro-batches per optimiser step (gradient accumulation): each
        step takes the next ``k`` batches (the last step of a pass those left), ``zero_grad``
        once, computes and back-propagates each micro-batch's loss scaled by its share of the
        step's examples (``1/k`` for equal batches) -- the gradient of one ``k`` times larger
        batch --, then clips, steps the optimiser and the scheduler once. ``clock`` and the
        step index count optimiser steps; the step's loss is the scaled sum. One host
        synchronisation per micro-batch. ``1``: the plain loop (no scaling at all).
    :param on_step: called after each optimiser step with its global index in the pass
        (0-based) and its loss (a float already on the host), e.g. a TensorBoard writer.
    :param scaler: a ``torch.amp.GradScaler`` (``fp16``,
        :func:`~gpattn_ppl.infer.precision.grad_scaler`): the loss is scaled before
        ``backward``, the gradients unscaled before clipping, and a step with overflowing
        gradients skipped (one more host read per step).
    :returns: ``{"loss": mean loss, "nll": mean cross-entropy, "term/<name>": mean of each
        objective term (unweighted), "share/<name>": its mean weighted per-datum share of the
        loss (weight x term, a global term also divided by N_data), "checked_reruns": steps
        re-run with the checks on}`` (``nll`` when the program records it).
    :raises DivergenceError: the loss, the logits or the parameters became non-finite; names
        the epoch, the step (1-based) and the term(s) that went non-finite.
    :raises ValueError: ``batches`` is empty.
    """
    net = program.net
    net.train()
    if epoch is None:
        epoch = clock(0) if clock is not None else program.epoch
    if accumulate < 1:
        raise ValueError(f"fit_epoch: accumulate must be >= 1, got {accumulate}")
    term_sums: dict[str, torch.Tensor] = {}
    shares: dict[str, torch.Tensor] = {}
    nll_sum, loss_sum, n_steps, reruns = None, 0.0, 0, 0
    for i, group in enumerate(_groups(batches, accumulate)):
        if clock is not None:
            program.set_epoch(clock(i))
        total = sum(len(b.y) for b in group) if accumulate > 1 else None
        value = 0.0
        for j, b in enumerate(group):
            # the micro-batch's share of the step (None: the plain loop, no scaling)
            w = None if total is None else len(b.y) / total
            with autocast(precision, b.x.device):
                loss, part = _fast_loss(program, b)
            if loss is None:  # a factorisation failed or the loss is not finite: check everything
                reruns += 1
                try:
                    with autocast(precision, b.x.device):
                        loss = program.loss(b.x, b.mask, b.y, b.index)
                except (ValueError, CholeskyError) as err:
                    _raise_if_diverged(err, program, epoch, i)
                    raise
                part = float(loss.detach())
                if not math.isfinite(part):
                    raise DivergenceError(_divergence_message(program, epoch, i, part))
            if j == 0:
                optimizer.zero_grad(set_to_none=True)
            if w is not None:
                loss, part = loss * w, part * w
            (loss if scaler is None else scaler.scale(loss)).backward()
            value += part
            scales = getattr(program, "last_scales", {})
            for name, term in program.last_terms.items():
                term = term if w is None else term * w
                term_sums[name] = term_sums.get(name, 0.0) + term
                if name in scales:
                    shares[name] = shares.get(name, 0.0) + scales[name] * term
            nll = getattr(program, "last_nll", None)
            if nll is not None:
                nll = nll if w is None else nll * w
                nll_sum = nll if nll_sum is None else nll_sum + nll
        if scaler is None:
            if grad_clip:
                torch.nn.utils.clip_grad_norm_(net.parameters(), grad_clip)
            optimizer.step()
        else:
            if grad_clip:
                scaler.unscale_(optimizer)
                torch.nn.utils.clip_grad_norm_(net.parameters(), grad_clip)
            scaler.step(optimizer)
            scaler.update()
        if scheduler is not None:
            scheduler.step()
        loss_sum += value
        n_steps += 1
        if step_losses is not None:
            step_losses.append(value)
        if on_step is not None:
            on_step(i, value)
        if progress is not None:
            progress.update(1)
    if n_steps == 0:
        raise ValueError("fit_epoch: no batches")
    out = {"loss": loss_sum / n_steps, "checked_reruns": reruns}
    if nll_sum is not None:
        out["nll"] = float(nll_sum) / n_steps
    out.update({f"term/{k}": float(v) / n_steps for k, v in term_sums.items()})
    out.update({f"share/{k}": float(v) / n_steps for k, v in shares.items()})
    if checks is not False:
        found = objective_checks(out["loss"], out.get("nll"),
                                 {k[len("share/"):]: v for k, v in out.items()
                                  if k.startswith("share/")})
        if isinstance(checks, dict):
            checks.update(found)
        else:
            for message in found.values():
                warnings.warn(f"fit_epoch (epoch {epoch}): {message}", NumericsWarning,
                              stacklevel=2)
    return out


def _groups(batches: Iterable, k: int):
    """``batches`` in lists of ``k`` (the last one shorter), drawn lazily: one batch at a time
    for ``k = 1``, each group's ``k`` batches before its first is computed otherwise."""
    group = []
    for b in batches:
        group.append(b)
        if len(group) == k:
            yield group
            group = []
    if group:
        yield group


def _fast_loss(program: PyroProgram, b) -> tuple[torch.Tensor | None, float]:
    """The step's loss on the fast path and its value, read with the factorisations' status in
    one host synchronisation; ``(None, nan)`` when the step must be re-run with the checks on."""
    try:
        with linalg.deferred_checks() as box, settings.validate_args(False), \
                pyro.validation_enabled(False), warnings.catch_warnings():
            # Pyro's ELBO warns about a NaN loss itself; the checked re-run reports it instead
            warnings.filterwarnings("ignore", message="Encountered NaN", category=UserWarning)
            loss = program.loss(b.x, b.mask, b.y, b.index)
    except (ValueError, RuntimeError):  # the checked re-run names the problem
        return None, math.nan
    value, failed = torch.stack([loss.detach().double(),
                                 box.failed().to(loss.device, torch.float64)]).tolist()
    if failed or not math.isfinite(value):
        return None, math.nan
    return loss, value


# -- divergence ----------------------------------------------------------------------------------
_HINT = "lower train.lr, set train.grad_clip, or warm the objective weights up"


def _raise_if_diverged(err: Exception, program: PyroProgram, epoch, i: int) -> None:
    """Turn an error of the forward pass that is a symptom of divergence (non-finite
    parameters, logits, objective terms or kernel matrices) into a :class:`DivergenceError`
    naming epoch and step; any other error is left alone (the failure path: syncs freely)."""
    first = str(err).split("\n", 1)[0]
    where = f"training diverged in epoch {epoch}, step {i + 1}"
    bad = [n for n, p in program.net.named_parameters() if not bool(torch.isfinite(p).all())]
    if bad:
        raise DivergenceError(f"{where}: parameters became non-finite in the previous step "
                              f"({', '.join(bad[:3])}{', ...' if len(bad) > 3 else ''}; a "
                              f"gradient overflowed); {_HINT}. The forward pass then failed: "
                              f"{first}") from err
    if isinstance(err, NonFiniteError) or "NaN or inf" in first:
        raise DivergenceError(f"{where}: {first}; {_HINT}") from err
    if "invalid values" not in first:  # not a distribution's check of a non-finite parameter
        return
    if "parameter logits" in first:
        what = "the logits of the likelihood term 'y' (the cross-entropy) became non-finite"
    else:  # a pyro.factor of an objective term: the model recorded it just before
        terms = [n for n, v in program.last_terms.items() if not bool(torch.isfinite(v).all())]
        what = (f"objective term(s) {', '.join(terms)} became non-finite" if terms
                else first)
    raise DivergenceError(f"{where}: {what}; {_HINT}") from err


def _divergence_message(program: PyroProgram, epoch, i: int, value: float) -> str:
    """Which term of a non-finite loss went non-finite (the failure path: syncs freely)."""
    terms = [n for n, v in program.last_terms.items() if not bool(torch.isfinite(v).all())]
    nll = getattr(program, "last_nll", None)
    if nll is not None and not bool(torch.isfinite(nll)):
        terms.insert(0, "y (the cross-entropy of the labels)")
    what = (f"non-finite term(s): {', '.join(terms)}" if terms
            else "every recorded term is finite: the ELBO's latent sites (their KL or "
                 "log-densities) went non-finite")
    return (f"training diverged in epoch {epoch}, step {i + 1}: the loss is non-finite "
            f"({value}); {what}; {_HINT}")


# -- objective terms out of range ----------------------------------------------------------------
#: per-datum loss bounds: below, a term unbounded below is being exploited (e.g. the summed CGP
#: bound); above, the data term no longer matters
LOSS_RANGE = (-10.0, 1e4)
#: a term's per-datum share of the loss larger than this many cross-entropies is warned about
#: (SGPA's KL at 11.4 and SCGPT's CGP term at 8.5 against a cross-entropy of 0.66 -- 17 and 13
#: times -- left CoLA runs at chance, so 100 said nothing where it mattered)
TERM_RATIO = 10.0
#: term -> the config change that brings it back in range (default: its weight's key)
TERM_HINTS = {
    "kl": "lower train.objective.kl_weight or warm it up (kl_weight: {kind: linear, start: 0, "
          "end: 1})",
    "cgp_loss": "use model.attention.cgp_reduction: mean (the paper's summed bound is unbounded "
                "and ~1e4 x the cross-entropy), a larger model.attention.noise (the bound scales "
                "as 1/noise^2) or a smaller train.objective.cgp_alpha",
}


def _hint(name: str) -> str:
    term = name.rsplit(".", 1)[-1].removesuffix("_global")
    key = OBJECTIVE_WEIGHTS.get(term, (None,))[0]
    if term in TERM_HINTS:
        hint = TERM_HINTS[term]
    else:
        hint = f"lower train.objective.{key}" if key else "lower its weight"
    if key and "." in name:     # a unit's term: its own weight is the entry's objective
        hint += (f" (for this unit alone: {key} in the objective of its model.swap or "
                 "model.overrides entry)")
    return hint


def objective_checks(loss: float, nll: float | None, shares: dict[str, float]) -> dict[str, str]:
    r"""Messages for an epoch whose objective is out of its usual range, keyed by a stable key
    (``"<term>:ratio"``, ``"loss:range"``) for once-per-run reporting.

    * a term whose per-datum share of the loss :math:`w_t\bar\ell_t` (global terms divided by
      :math:`N_\text{data}`) exceeds :data:`TERM_RATIO` times the mean cross-entropy;
    * a mean loss outside :data:`LOSS_RANGE` (nats per datum).

    Each message names the term and the config option that fixes it.

    >>> sorted(objective_checks(-98.4, 0.6, {"blocks.0.attn.cgp_loss": -99.0}))
    ['cgp_loss:ratio', 'loss:range']
    """
    out = {}
    if nll is not None and math.isfinite(nll) and nll > 0:
        worst: dict[str, tuple[float, str]] = {}
        for name, share in shares.items():
            term = name.rsplit(".", 1)[-1].removesuffix("_global")
            if abs(share) > TERM_RATIO * nll and abs(share) > worst.get(term, (0.0, ""))[0]:
                worst[term] = (abs(share), name)
        for term, (size, name) in worst.items():
            out[f"{term}:ratio"] = (
                f"objective term {name} is {shares[name]:.3g} per datum, {size / nll:.0f}x the "
                f"cross-entropy ({nll:.3g}): the labels hardly shape the training any more; "
                f"{_hint(name)}")
    low, high = LOSS_RANGE
    if not low <= loss <= high:
        name = (min(shares, key=shares.get) if loss < low else max(shares, key=shares.get)
                ) if shares else None
        cause = (f"; the largest {'negative' if loss < low else 'positive'} term is {name} "
                 f"({shares[name]:.3g} per datum): {_hint(name)}") if name else ""
        out["loss:range"] = (f"the training loss is {loss:.3g} nats per datum, outside "
                             f"[{low:g}, {high:g}]{cause}")
    return out
