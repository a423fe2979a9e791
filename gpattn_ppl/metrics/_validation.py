"""Input checks and conversions shared by every metric (private).

All metrics take class probabilities ``probs`` of shape ``[n, K]`` (one forward pass, treated as
``T = 1``) or ``[T, n, K]`` (``T`` stochastic passes), integer ``labels`` of shape ``[n]`` and,
where needed, ``logits`` of the same shape as ``probs``. They are converted to float64 on the
input's device; every problem raises a :class:`ValueError` that names the argument.
"""

from __future__ import annotations

import torch
from torch import Tensor

__all__: list[str] = []

#: Tolerance on ``|sum_k p_k - 1|`` (absolute).
SUM_TOL = 1e-3
#: Probabilities are clamped at this value before a logarithm.
EPS = 1e-12


def _as_tensor(x, name: str) -> Tensor:
    if x is None:
        raise ValueError(f"{name} is required, got None")
    try:
        t = torch.as_tensor(x)
    except (TypeError, ValueError, RuntimeError) as err:
        raise ValueError(f"{name} could not be converted to a tensor: {err}") from err
    return t.detach()


def as_probs(probs, name: str = "probs") -> Tensor:
    """Return ``probs`` as a float64 tensor ``[T, n, K]`` after checking it.

    :raises ValueError: wrong rank, empty, non-floating, NaN/inf, negative entries, or rows that
        do not sum to 1 within :data:`SUM_TOL`.
    """
    p = _as_tensor(probs, name)
    if p.dim() == 2:
        p = p.unsqueeze(0)
    elif p.dim() != 3:
        raise ValueError(f"{name} must have shape [n, K] or [T, n, K], got shape {tuple(p.shape)}")
    if p.numel() == 0:
        raise ValueError(f"{name} is empty (shape {tuple(p.shape)}); need T, n, K >= 1")
    if not p.is_floating_point():
        raise ValueError(f"{name} must be a floating tensor of probabilities, got dtype {p.dtype}")
    p = p.to(torch.float64)
    if not bool(torch.isfinite(p).all()):
        raise ValueError(f"{name} contains NaN or inf")
    if bool((p < 0).any()):
        raise ValueError(
            f"{name} contains negative entries (min {p.min().item():.3g}); "
            "expected probabilities, did you pass logits?"
        )
    dev = (p.sum(-1) - 1.0).abs().max().item()
    if dev > SUM_TOL:
        raise ValueError(
            f"{name} rows must sum to 1 (tolerance {SUM_TOL:g}); largest deviation "
            f"{dev:.3g}. Did you pass logits instead of probabilities?"
        )
    return p


def as_logits(logits, shape: torch.Size, name: str = "logits") -> Tensor:
    """Return ``logits`` as float64 ``[T, n, K]`` with ``shape`` (that of the checked probs)."""
    z = _as_tensor(logits, name)
    if z.dim() == 2:
        z = z.unsqueeze(0)
    if tuple(z.shape) != tuple(shape):
        raise ValueError(
            f"{name} must have the shape of the probabilities {tuple(shape)} "
            f"([T, n, K], or [n, K] for T = 1), got {tuple(z.shape)}"
        )
    if not z.is_floating_point():
        raise ValueError(f"{name} must be a floating tensor, got dtype {z.dtype}")
    z = z.to(torch.float64)
    if not bool(torch.isfinite(z).all()):
        raise ValueError(f"{name} contains NaN or inf")
    return z


def as_labels(
    labels, n: int, num_classes: int, device: torch.device, name: str = "labels"
) -> Tensor:
    """Return ``labels`` as an int64 tensor ``[n]`` on ``device`` with values in ``[0, K)``."""
    y = _as_tensor(labels, name)
    if y.dim() != 1:
        raise ValueError(f"{name} must have shape [n], got shape {tuple(y.shape)}")
    if y.numel() == 0:
        raise ValueError(f"{name} is empty")
    if y.is_floating_point() or y.is_complex() or y.dtype == torch.bool:
        raise ValueError(f"{name} must be an integer tensor of class indices, got dtype {y.dtype}")
    if y.shape[0] != n:
        raise ValueError(f"{name} has length {y.shape[0]} but the probabilities have n = {n} rows")
    y = y.to(device=device, dtype=torch.int64)
    lo, hi = int(y.min()), int(y.max())
    if lo < 0 or hi >= num_classes:
        raise ValueError(
            f"{name} must lie in [0, {num_classes}) for K = {num_classes} classes, "
            f"got values in [{lo}, {hi}]"
        )
    return y


def as_scores(scores, name: str) -> Tensor:
    """Return 1-D finite float64 scores ``[n]`` (n >= 1)."""
    s = _as_tensor(scores, name)
    if s.dim() != 1:
        raise ValueError(f"{name} must have shape [n], got shape {tuple(s.shape)}")
    if s.numel() == 0:
        raise ValueError(f"{name} is empty")
    if s.dtype == torch.bool or s.is_complex():
        raise ValueError(f"{name} must be real-valued, got dtype {s.dtype}")
    s = s.to(torch.float64)
    if not bool(torch.isfinite(s).all()):
        raise ValueError(f"{name} contains NaN or inf")
    return s


def predictive(probs: Tensor) -> Tensor:
    """Bayesian model average ``p̄ = (1/T) Σ_t p_t``: ``[T, n, K] -> [n, K]``."""
    return probs.mean(0)


def top_label(pbar: Tensor) -> tuple[Tensor, Tensor]:
    """Confidence ``max_k p̄_k`` and prediction ``argmax_k p̄_k`` (first index on ties)."""
    pred = pbar.argmax(-1)
    conf = pbar.gather(-1, pred.unsqueeze(-1)).squeeze(-1)
    return conf, pred


def prepare(probs, labels) -> tuple[Tensor, Tensor, Tensor]:
    """Check ``probs``/``labels``; return ``(p [T, n, K], p̄ [n, K], labels [n])`` in float64."""
    p = as_probs(probs)
    y = as_labels(labels, p.shape[1], p.shape[2], p.device)
    return p, predictive(p), y


def confidence_and_correct(probs, labels) -> tuple[Tensor, Tensor]:
    """Top-label confidence ``conf_i`` and correctness ``c_i = 1[ŷ_i = y_i]`` (bool)."""
    _, pbar, y = prepare(probs, labels)
    conf, pred = top_label(pbar)
    return conf, pred == y


def conf_correct_streaming(probs, labels) -> tuple[Tensor, Tensor]:
    """Confidence and correctness (float64) for a Metric ``update``.

    Checks the input unless :class:`gpattn_ppl.settings.validate_args` is off (the checks
    synchronise with the host on an accelerator).
    """
    from .. import settings

    if settings.validate_args.value():
        conf, correct = confidence_and_correct(probs, labels)
    else:
        p = torch.as_tensor(probs).detach().to(torch.float64)
        p = p.unsqueeze(0) if p.dim() == 2 else p
        conf, pred = top_label(predictive(p))
        correct = pred == torch.as_tensor(labels, device=p.device)
    return conf, correct.to(torch.float64)
