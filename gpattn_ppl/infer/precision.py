"""Training and prediction precision: ``fp32``, ``bf16`` or ``fp16`` through ``torch.autocast``.

Under ``bf16``/``fp16`` the network's linear layers, attention products and MLPs run in the low
precision while the GP algebra of every unit -- kernel matrices, Cholesky factorisations,
triangular solves, KL divergences and regularisers -- runs in
:class:`~gpattn_ppl.settings.gp_dtype` (float32 or float64) with autocast disabled
(:func:`gpattn_ppl.linalg.gp_precision`); parameters and optimiser state stay float32.

``fp16`` also needs a gradient scaler (:func:`grad_scaler`): the loss is multiplied before the
backward pass so that small gradients do not underflow, the gradients are unscaled before
clipping, and a step whose gradients overflowed is skipped (the scale is halved). Reading
whether a step overflowed costs one host synchronisation per step; ``bf16`` has float32's range
and needs no scaler (the choice on GPUs that have it, and on CPUs).

>>> import torch
>>> with autocast("bf16", "cpu"):
...     (torch.ones(2, 2) @ torch.ones(2, 2)).dtype
torch.bfloat16
>>> grad_scaler("bf16", "cpu") is None
True
"""

from __future__ import annotations

import contextlib

import torch

__all__ = ["PRECISIONS", "autocast", "grad_scaler"]

#: precision name -> the autocast dtype (``None``: no autocast, float32 throughout)
PRECISIONS: dict[str, torch.dtype | None] = {"fp32": None, "bf16": torch.bfloat16,
                                             "fp16": torch.float16}


def _dtype(precision: str) -> torch.dtype | None:
    if precision not in PRECISIONS:
        raise ValueError(f"unknown precision {precision!r}; allowed: {', '.join(PRECISIONS)}")
    return PRECISIONS[precision]


def autocast(precision: str, device: torch.device | str):
    """The context the forward pass runs in: ``torch.autocast`` on ``device``'s type with
    ``precision``'s dtype, or a no-op for ``fp32``."""
    dtype = _dtype(precision)
    if dtype is None:
        return contextlib.nullcontext()
    return torch.autocast(torch.device(device).type, dtype=dtype)


def grad_scaler(precision: str, device: torch.device | str) -> torch.amp.GradScaler | None:
    """A ``torch.amp.GradScaler`` for ``fp16`` on ``device``'s type; ``None`` otherwise
    (fp32 and bf16 need none)."""
    _dtype(precision)
    if precision != "fp16":
        return None
    return torch.amp.GradScaler(torch.device(device).type)
