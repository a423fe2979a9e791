"""Numerical policy as context managers (the GPyTorch ``settings`` habit).

Every numerical knob that is a *policy* rather than a model choice lives here, so call sites never
hard-code a jitter or a dtype:

* :class:`cholesky_jitter` -- the jitter added to the diagonal of a matrix whose Cholesky failed
  (none is added before a failure), per dtype, and the bounded number of escalations (x10 each,
  of the failing matrices only) before :func:`gpattn_ppl.linalg.cholesky` gives up; also the
  model jitter of inducing-point matrices and of :func:`gpattn_ppl.linalg.scaled_cholesky`;
* :class:`gp_dtype` -- the dtype GP linear algebra runs in (never lower than float32, even under
  autocast);
* :class:`posterior_mean` -- stochastic units return their posterior mean instead of a sample
  (the analogue of gpytorch's ``prior_mode``); the Pyro runtime (:mod:`gpattn_ppl.ppl`) reads it;
* :class:`validate_args` -- argument checks (shapes, masks, NaN) on or off. Checks that need a host
  sync (``.any()`` on a device tensor) are skipped when this is off;
* :class:`blocked_cholesky` -- whether :func:`gpattn_ppl.linalg.cholesky` factorises by
  recursive 2 x 2 blocks (batched products around small LAPACK base cases) or by one LAPACK call
  per matrix: ``"auto"`` (the measured per-device rule), ``"on"`` or ``"off"``;
* :class:`attention_tiles` -- whether kernel and Gumbel attention run in tiles over keys (no
  ``[B, H, N, N]`` tensor kept for the backward): ``"auto"`` (from a measured N per device),
  ``"on"`` or ``"off"``.

>>> import torch
>>> from gpattn_ppl import settings
>>> with settings.cholesky_jitter(float32=1e-5):
...     settings.cholesky_jitter.value(torch.float32)
1e-05
"""

from __future__ import annotations

import threading
from contextlib import ContextDecorator

import torch

__all__ = ["attention_tiles", "blocked_cholesky", "cholesky_jitter", "gp_dtype",
           "posterior_mean", "validate_args"]

_state = threading.local()


def _get(name: str, default):
    return getattr(_state, name, default)


class _Setting(ContextDecorator):
    """Base class: a thread-local value restored on exit."""

    _name: str = ""
    _default = None

    def __init__(self, value) -> None:
        self._new = value
        self._old = None

    @classmethod
    def value(cls):
        return _get(cls._name, cls._default)

    def __enter__(self):
        self._old = _get(self._name, self._default)
        setattr(_state, self._name, self._new)
        return self

    def __exit__(self, *exc) -> bool:
        setattr(_state, self._name, self._old)
        return False


class cholesky_jitter(ContextDecorator):
    """Jitter for Cholesky factorisations, per dtype: the first one added to a matrix that failed
    without (then x10 per try), and the model jitter of matrices that always carry one (the
    relative jitter of :func:`gpattn_ppl.linalg.scaled_cholesky`, SCGPT's inducing matrices).

    :param float32: jitter for float32 matrices (default 1e-6).
    :param float64: jitter for float64 matrices (default 1e-8).
    :param max_tries: how many times the jitter is multiplied by 10 after a failure (default 4).
    """

    _default = {torch.float32: 1e-6, torch.float64: 1e-8, "max_tries": 4}

    def __init__(self, float32: float | None = None, float64: float | None = None,
                 max_tries: int | None = None) -> None:
        self._updates = {torch.float32: float32, torch.float64: float64, "max_tries": max_tries}
        self._old = None

    @classmethod
    def _current(cls) -> dict:
        return _get("cholesky_jitter", cls._default)

    @classmethod
    def value(cls, dtype: torch.dtype) -> float:
        table = cls._current()
        return table[dtype] if dtype in table else table[torch.float32]

    @classmethod
    def max_tries(cls) -> int:
        return int(cls._current()["max_tries"])

    def __enter__(self):
        self._old = self._current()
        new = dict(self._old)
        new.update({k: v for k, v in self._updates.items() if v is not None})
        _state.cholesky_jitter = new
        return self

    def __exit__(self, *exc) -> bool:
        _state.cholesky_jitter = self._old
        return False


class gp_dtype(_Setting):
    """Dtype of GP linear algebra (Cholesky, solves, KL). ``float32`` (default) or ``float64``.

    Inputs in a lower precision (float16/bfloat16 under autocast) are promoted to this dtype.
    """

    _name = "gp_dtype"
    _default = torch.float32

    def __init__(self, dtype: torch.dtype) -> None:
        if dtype not in (torch.float32, torch.float64):
            raise ValueError(f"gp_dtype must be torch.float32 or torch.float64, got {dtype}")
        super().__init__(dtype)

    @classmethod
    def resolve(cls, dtype: torch.dtype) -> torch.dtype:
        """The dtype GP algebra on an input of ``dtype`` runs in: the wider of the two."""
        if dtype == torch.float64:
            return torch.float64
        return cls.value()


class posterior_mean(_Setting):
    """Inside this block stochastic attention units return their posterior mean (or, for units
    without a closed-form mean, their value at the modal noise) instead of a sample, and draw no
    Pyro site (the analogue of gpytorch's ``settings.prior_mode``).

    >>> with posterior_mean():
    ...     posterior_mean.on()
    True
    """

    _name = "posterior_mean"
    _default = False

    def __init__(self, state: bool = True) -> None:
        super().__init__(bool(state))

    @classmethod
    def on(cls) -> bool:
        """Whether the posterior-mean mode is active."""
        return bool(cls.value())


class validate_args(_Setting):
    """Argument validation (shapes, masks, finiteness) on (default) or off.

    Switch it off in tight loops on an accelerator: some checks synchronise with the host.
    """

    _name = "validate_args"
    _default = True

    def __init__(self, value: bool = True) -> None:
        super().__init__(bool(value))


class blocked_cholesky(_Setting):
    """How :func:`gpattn_ppl.linalg.cholesky` factorises: ``"auto"`` (default: the per-device rule
    of :func:`gpattn_ppl.linalg.use_blocked_cholesky`, measured), ``"on"`` (recursive 2 x 2
    blocks whenever a matrix is larger than the base case) or ``"off"`` (one LAPACK / cuSOLVER
    call per matrix). The factor is the same up to floating-point reassociation; failures,
    jitter escalation and errors are the same.

    >>> with blocked_cholesky("off"):
    ...     blocked_cholesky.value()
    'off'
    """

    _name = "blocked_cholesky"
    _default = "auto"

    def __init__(self, mode: str = "on") -> None:
        if mode not in ("auto", "on", "off"):
            raise ValueError(f"blocked_cholesky must be 'auto', 'on' or 'off', got {mode!r}")
        super().__init__(mode)


class attention_tiles(_Setting):
    r"""Whether kernel attention (:math:`\mathcal K V`) and the fused Gumbel attention run in
    tiles over keys with a recomputing backward (no ``[B, H, N, N]`` tensor kept; without
    attention dropout): ``"auto"`` (default: from the number of keys each unit's measured
    per-device rule ``TILE_MIN_N`` names; untiled on a device it does not list), ``"on"`` or
    ``"off"``.

    >>> with attention_tiles("on"):
    ...     attention_tiles.value()
    'on'
    """

    _name = "attention_tiles"
    _default = "auto"

    def __init__(self, mode: str = "on") -> None:
        if mode not in ("auto", "on", "off"):
            raise ValueError(f"attention_tiles must be 'auto', 'on' or 'off', got {mode!r}")
        super().__init__(mode)
