"""Atomic checkpoints, exact resume and strict warm starts."""

from __future__ import annotations

import os
import random
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import IO

import numpy as np
import torch

from ..errors import GpattnError

__all__ = ["CheckpointError", "atomic_write", "save_atomic", "load_checkpoint", "rng_state", "set_rng_state",
           "init_from"]


class CheckpointError(GpattnError, RuntimeError):
    """A checkpoint is missing, corrupt or does not match the model."""


def atomic_write(path: str | Path, write: Callable[[IO], None], *, binary: bool = True) -> Path:
    """Call ``write(fh)`` on a temporary file in the same folder, fsync, then ``os.replace`` it
    onto ``path``: a process killed at any moment leaves the previous file or the new one,
    never a partial file (and no temporary file on an exception)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb" if binary else "w", **({} if binary else {"newline": ""})) as fh:
            write(fh)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise
    return path


def save_atomic(obj, path: str | Path) -> Path:
    """``torch.save`` through :func:`atomic_write`."""
    return atomic_write(path, lambda fh: torch.save(obj, fh))


def load_checkpoint(path: str | Path, map_location="cpu") -> dict:
    """Load a checkpoint written by :func:`save_atomic`; errors name the file and the problem."""
    path = Path(path)
    if not path.is_file():
        raise CheckpointError(f"checkpoint not found: {path}")
    try:
        obj = torch.load(path, map_location=map_location, weights_only=False)
    except Exception as err:  # noqa: BLE001 - any unpickling failure means a corrupt file
        raise CheckpointError(f"corrupt checkpoint {path}: {type(err).__name__}: {err}") from None
    if not isinstance(obj, dict) or "model" not in obj:
        raise CheckpointError(f"corrupt checkpoint {path}: not a gpattn_ppl checkpoint "
                              "(no 'model' entry)")
    return obj


def rng_state() -> dict:
    """Every RNG state a run depends on (python, numpy, torch CPU and CUDA)."""
    state = {"python": random.getstate(), "numpy": np.random.get_state(),
             "torch": torch.get_rng_state()}
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def set_rng_state(state: dict) -> None:
    """Restore :func:`rng_state`."""
    random.setstate(state["python"])
    np.random.set_state(state["numpy"])
    torch.set_rng_state(state["torch"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])


def init_from(model: torch.nn.Module, source: str | Path) -> dict:
    """Warm-start ``model`` from a run directory or checkpoint, strictly by parameter name.

    Tensors whose name and shape match are copied; the rest keep their initialisation. Returns
    ``{"loaded": [...], "missing": [...], "unexpected": [...], "shape_mismatch": [...]}``.

    :raises CheckpointError: when no tensor at all was loaded (the silent no-op warm start of the
        public CGPT code).
    """
    source = Path(source)
    path = source / "best.pt" if source.is_dir() else source
    if source.is_dir() and not path.is_file():
        path = source / "last.pt"
    state = load_checkpoint(path)["model"]
    own = model.state_dict()
    loaded, mismatch = [], []
    for name, tensor in state.items():
        if name in own:
            if own[name].shape == tensor.shape:
                own[name] = tensor
                loaded.append(name)
            else:
                mismatch.append(name)
    if not loaded:
        raise CheckpointError(f"warm start from {path} loaded 0 tensors: no parameter name and "
                              "shape matches the model")
    model.load_state_dict(own)
    return {"loaded": loaded, "missing": sorted(set(own) - set(state)),
            "unexpected": sorted(set(state) - set(own)), "shape_mismatch": mismatch,
            "source": str(path)}
