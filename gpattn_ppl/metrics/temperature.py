r"""Temperature scaling (Guo et al. 2017) of a ``T``-pass predictive.

One scalar temperature :math:`\tau > 0` divides every logit. With per-pass logits
:math:`z_{t,i} \in \mathbb R^K` (``[T, n, K]``; ``[n, K]`` is ``T = 1``) it is fitted on held-out
(validation) data by minimising the NLL of the predictive that averages the per-pass tempered
softmaxes, the Bayesian model average the metrics use:

.. math::

    \mathrm{NLL}(\tau) = -\frac1n \sum_{i=1}^{n}
    \log\Bigl(\frac1T \sum_{t=1}^{T} \mathrm{softmax}(z_{t,i} / \tau)_{y_i}\Bigr),

which for ``T = 1`` is the usual temperature scaling. It is not the same as fitting on the
averaged logits :math:`\frac1T\sum_t z_{t,i}` (the two differ when the passes disagree).
Dividing by :math:`\tau` never changes a pass's argmax, hence not the ``T = 1`` accuracy.

**Why hand-written.** ``torch-uncertainty``'s ``TemperatureScaler`` does the ``T = 1`` case, but
it is not a dependency, works on a model rather than on stored logits, and has no ``T``-pass
objective; the fit is a one-parameter LBFGS of about twenty lines.

Complexity: :math:`O(TnK)` per objective evaluation, at most ``max_iter`` LBFGS iterations.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

from ._validation import _as_tensor, as_labels, as_logits

__all__ = ["TEMPERATURE_RANGE", "TemperatureWarning", "fit_temperature", "apply_temperature",
           "check_temperature"]

#: the temperatures a fit may return and a run folder may hold: beyond them the validation
#: predictions say nothing (tau -> infinity: uniform) or the split is separable (tau -> 0)
TEMPERATURE_RANGE = (1e-2, 1e2)


class TemperatureWarning(UserWarning):
    """The temperature fit stopped at a bound of :data:`TEMPERATURE_RANGE`."""


def check_temperature(tau, where: str = "temperature") -> float:
    """``tau`` as a float, if it lies in :data:`TEMPERATURE_RANGE`.

    :raises ValueError: not a number, or outside the range (naming ``where`` and the value).
    """
    lo, hi = TEMPERATURE_RANGE
    if isinstance(tau, bool) or not isinstance(tau, (int, float)):
        raise ValueError(f"{where}: expected a number, got {tau!r}")
    if not (math.isfinite(tau) and lo <= tau <= hi):
        raise ValueError(f"{where}: {tau!r} is outside the sane range [{lo:g}, {hi:g}]")
    return float(tau)


def _logits_and_labels(logits, labels) -> tuple[Tensor, Tensor]:
    z = _as_tensor(logits, "logits")
    if z.dim() not in (2, 3):
        raise ValueError(f"logits must have shape [n, K] or [T, n, K], got {tuple(z.shape)}")
    if z.numel() == 0:
        raise ValueError(f"logits is empty (shape {tuple(z.shape)}); need T, n, K >= 1")
    shape = z.shape if z.dim() == 3 else (1, *z.shape)
    z = as_logits(z, torch.Size(shape))
    return z, as_labels(labels, z.shape[1], z.shape[2], z.device)


def _tempered_nll(z: Tensor, y: Tensor, log_tau: Tensor) -> Tensor:
    """``NLL(exp(log_tau))`` of the averaged tempered softmaxes, via log-sum-exp over passes."""
    logp = torch.log_softmax(z * torch.exp(-log_tau), dim=-1)  # [T, n, K]
    idx = y.view(1, -1, 1).expand(z.shape[0], -1, 1)
    log_py = logp.gather(-1, idx).squeeze(-1)  # [T, n]
    return -(torch.logsumexp(log_py, dim=0) - math.log(z.shape[0])).mean()


def fit_temperature(logits, labels, *, max_iter: int = 100) -> float:
    r"""Fit the temperature :math:`\tau` that minimises the NLL of the tempered predictive.

    .. math::

        \hat\tau = \operatorname*{argmin}_{\tau > 0} -\frac1n \sum_i
        \log \frac1T \sum_t \mathrm{softmax}(z_{t,i}/\tau)_{y_i}

    Optimises :math:`s = \log\tau` from :math:`s = 0` with :class:`torch.optim.LBFGS`
    (strong-Wolfe line search) in float64 on a detached copy of the logits (no gradient reaches
    the inputs). If the result is not a finite positive number, or its NLL is larger than at
    :math:`\tau = 1`, the fit is rejected and ``1.0`` (no scaling) is returned. Fit on
    validation data, never on the test set. The result is confined to
    :data:`TEMPERATURE_RANGE`: on perfectly separated data the NLL decreases towards
    :math:`\tau \to 0`, on uninformative predictions towards :math:`\tau \to \infty` (tiny
    splits reached 1e8 before); a fit that ends at a bound returns the bound and warns
    (:class:`TemperatureWarning`).

    :param logits: per-pass logits ``[T, n, K]``, or ``[n, K]`` for one pass.
    :param labels: integer labels ``[n]`` in ``[0, K)``.
    :param max_iter: maximum number of LBFGS iterations.
    :returns: :math:`\hat\tau` as a Python ``float``.
    :raises ValueError: malformed logits or labels, or ``max_iter < 1``.

    >>> z = torch.tensor([[4.0, 0.0], [0.0, 4.0], [4.0, 0.0], [0.0, 4.0]])
    >>> # 3 of 4 right: the optimum has sigmoid(4 / tau) = 3/4, i.e. tau = 4 / log 3
    >>> round(fit_temperature(z, torch.tensor([0, 1, 0, 0])), 4), round(4 / math.log(3), 4)
    (3.641, 3.641)
    """
    if isinstance(max_iter, bool) or not isinstance(max_iter, int) or max_iter < 1:
        raise ValueError(f"max_iter must be a positive integer, got {max_iter!r}")
    z, y = _logits_and_labels(logits, labels)
    with torch.enable_grad():
        log_tau = torch.zeros((), dtype=torch.float64, device=z.device, requires_grad=True)
        opt = torch.optim.LBFGS([log_tau], lr=1.0, max_iter=max_iter, tolerance_grad=1e-10,
                                tolerance_change=1e-14, line_search_fn="strong_wolfe")

        def closure() -> Tensor:
            opt.zero_grad()
            loss = _tempered_nll(z, y, log_tau)
            loss.backward()
            return loss

        opt.step(closure)
    with torch.no_grad():
        s = log_tau.detach()
        if not bool(torch.isfinite(s)):
            return 1.0
        lo, hi = TEMPERATURE_RANGE
        s = s.clamp(math.log(lo), math.log(hi))
        tau = float(torch.exp(s))
        at_bound = s.item() in (math.log(lo), math.log(hi))
        nll = float(_tempered_nll(z, y, s))
        nll_one = float(_tempered_nll(z, y, torch.zeros_like(s)))
    if not math.isfinite(nll) or nll > nll_one:
        return 1.0
    if at_bound:
        import warnings

        warnings.warn(f"temperature scaling: the fit reached the bound tau = {tau:g} of "
                      f"[{lo:g}, {hi:g}] (uninformative or separable validation predictions, "
                      "or a tiny validation split); the bound is used", TemperatureWarning,
                      stacklevel=2)
        tau = lo if s.item() == math.log(lo) else hi
    return tau


def apply_temperature(logits, temperature: float) -> Tensor:
    r"""Divide logits by a temperature: :math:`z / \tau` (any shape, e.g. ``[T, n, K]``).

    The tempered per-pass probabilities are ``softmax(apply_temperature(z, tau), -1)``; their
    mean over passes is the predictive that :func:`fit_temperature` calibrates.

    :param logits: floating tensor of logits.
    :param temperature: :math:`\tau > 0`, finite (e.g. from :func:`fit_temperature`).
    :returns: ``logits / temperature`` (same shape, dtype and device; differentiable).
    :raises ValueError: non-floating logits, or a temperature that is not a finite positive
        number.

    >>> apply_temperature(torch.tensor([2.0, -1.0]), 2.0)
    tensor([ 1.0000, -0.5000])
    """
    if isinstance(temperature, bool):
        raise ValueError(f"temperature must be a positive finite number, got {temperature!r}")
    try:
        tau = float(temperature)
    except (TypeError, ValueError, RuntimeError) as err:
        raise ValueError(
            f"temperature must be a positive finite number, got {temperature!r}"
        ) from err
    if not (math.isfinite(tau) and tau > 0.0):
        raise ValueError(f"temperature must be a positive finite number, got {tau!r}")
    z = torch.as_tensor(logits)
    if not z.is_floating_point():
        raise ValueError(f"logits must be a floating tensor, got dtype {z.dtype}")
    return z / tau
