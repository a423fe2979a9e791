"""Atomic checkpoints, exact resume and strict warm starts; nothing in a checkpoint is executed.

Every ``.pt`` file is read with ``torch.load(weights_only=True)``: tensors, numbers, strings and
the containers dict / list / tuple only (plus numpy arrays and dtypes, in which checkpoints
written before this rule stored the numpy RNG state: numpy's array reconstruction and dtype
classes are admitted by name, nothing else, so old run folders load as they are). A file that names any other Python global -- a pickled object whose
``__reduce__`` would run code -- is refused with :class:`UnsafeCheckpointError` before anything
of it runs.
"""

from __future__ import annotations

import random
from collections.abc import Callable
from pathlib import Path
from typing import IO

import numpy as np
import torch

from ..errors import GpattnError

__all__ = ["CheckpointError", "UnsafeCheckpointError", "WARM_START_MIN_SHARE", "atomic_write",
           "save_atomic", "load_checkpoint", "load_predictions", "load_pt", "rng_state",
           "set_rng_state", "init_from"]

#: a warm start (``train.init_from``) must fill at least this share of the model's parameter
#: elements (by name and shape); below it, the source is not this model's kind of checkpoint
WARM_START_MIN_SHARE = 0.5


class CheckpointError(GpattnError, RuntimeError):
    """A checkpoint is missing, corrupt or does not match the model."""


class UnsafeCheckpointError(CheckpointError):
    """A ``.pt`` file holds a Python object that is not plain data (it was refused unread)."""


def _numpy_globals() -> list:
    """The numpy names an older checkpoint's RNG state needs (array reconstruction, dtypes)."""
    import numpy as np

    try:
        from numpy._core.multiarray import _reconstruct
    except ImportError:  # numpy < 2
        from numpy.core.multiarray import _reconstruct
    dtypes = [type(np.dtype(t)) for t in ("uint32", "int64", "float64", "uint8")]
    return [_reconstruct, np.ndarray, np.dtype, *dtypes]


def load_pt(path: str | Path, map_location="cpu", *, what: str = "checkpoint"):
    """``torch.load(path, weights_only=True)``: plain data and tensors only, nothing executed.

    :raises CheckpointError: no such file, or a corrupt one (one line naming the file).
    :raises UnsafeCheckpointError: the file names a Python global other than tensors' and
        numpy arrays' (a crafted or foreign pickle); nothing of it was run.
    """
    import pickle

    path = Path(path)
    if not path.is_file():
        raise CheckpointError(f"{what} not found: {path}")
    try:
        with torch.serialization.safe_globals(_numpy_globals()):
            return torch.load(path, map_location=map_location, weights_only=True)
    except pickle.UnpicklingError as err:
        text = str(err)
        if "GLOBAL" in text:
            import re

            found = re.search(r"GLOBAL ([\w.]+)", text)
            glob = found.group(1) if found else None
            named = f" (it names {glob})" if glob else ""
            raise UnsafeCheckpointError(
                f"refused {path}: it holds a Python object that is not plain data{named}; "
                "gpattn_ppl reads tensors, numbers, strings and containers only, and ran nothing "
                "from it") from None
        detail = text.split("WeightsUnpickler error:", 1)[-1].strip()
        raise CheckpointError(f"corrupt {what} {path}: "
                              f"{(detail.splitlines() or ['not a torch file'])[0]}") from None
    except Exception as err:  # noqa: BLE001 - any other reading failure means a corrupt file
        first = (str(err).strip().splitlines() or [type(err).__name__])[0]
        raise CheckpointError(f"corrupt {what} {path}: {type(err).__name__}: {first}") from None


def atomic_write(path: str | Path, write: Callable[[IO], None], *, binary: bool = True,
                 root: str | Path | None = None) -> Path:
    """Call ``write(fh)`` on an in-memory file, then write its content atomically with
    :func:`gpattn_ppl.safe_files.write_atomic` (a temporary file in the same folder, fsync,
    ``os.replace``): a process killed at any moment leaves the previous file or the new one,
    never a partial file (and no temporary file on an exception). A link, a folder or a special
    file at ``path`` (or a link among the folders below ``root``) is refused, nothing written."""
    import io

    from ..safe_files import write_atomic

    buf = io.BytesIO() if binary else io.StringIO(newline="")
    write(buf)
    return write_atomic(path, buf.getvalue(), root=root)


def save_atomic(obj, path: str | Path) -> Path:
    """``torch.save`` through :func:`atomic_write`."""
    return atomic_write(path, lambda fh: torch.save(obj, fh))


def load_checkpoint(path: str | Path, map_location="cpu") -> dict:
    """Load a checkpoint written by :func:`save_atomic`; errors name the file and the problem."""
    obj = load_pt(path, map_location)
    if not isinstance(obj, dict) or not isinstance(obj.get("model"), dict):
        raise CheckpointError(f"corrupt checkpoint {path}: not a gpattn_ppl checkpoint "
                              "(no 'model' state dict)")
    bad = [k for k, v in obj["model"].items() if not isinstance(k, str)
           or not isinstance(v, torch.Tensor)]
    if bad:
        raise CheckpointError(f"corrupt checkpoint {path}: its 'model' entry {bad[0]!r} is not "
                              "a named tensor")
    return obj


def load_predictions(path: str | Path) -> dict:
    """A run's ``predictions.pt``: split name -> ``{"probs" [T, n, K], "logits" [T, n, K],
    "labels" [n]}`` tensors, checked (one line naming the file and the entry otherwise)."""
    obj = load_pt(path, what="predictions file")
    if not isinstance(obj, dict) or not obj:
        raise CheckpointError(f"corrupt predictions file {path}: expected a mapping of split "
                              "names to predictions")
    for name, pred in obj.items():
        where = f"corrupt predictions file {path}: entry {name!r}"
        if not isinstance(name, str) or not isinstance(pred, dict):
            raise CheckpointError(f"{where} is not a named mapping")
        for key, dim in (("probs", 3), ("logits", 3), ("labels", 1)):
            t = pred.get(key)
            if not isinstance(t, torch.Tensor) or t.dim() != dim:
                raise CheckpointError(f"{where}: {key!r} is not a {dim}-d tensor")
        n = pred["labels"].shape[0]
        if pred["probs"].shape != pred["logits"].shape or pred["probs"].shape[1] != n:
            raise CheckpointError(f"{where}: probs {tuple(pred['probs'].shape)}, logits "
                                  f"{tuple(pred['logits'].shape)} and labels ({n},) disagree")
    return obj


def rng_state() -> dict:
    """Every RNG state a run depends on (python, numpy, torch CPU and CUDA)."""
    kind, keys, pos, has_gauss, gauss = np.random.get_state()
    # numpy's key array as a tensor: the state loads with weights_only=True and no numpy global
    state = {"python": random.getstate(),
             "numpy": (kind, torch.from_numpy(keys.astype(np.int64)), int(pos), int(has_gauss),
                       float(gauss)),
             "torch": torch.get_rng_state()}
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def set_rng_state(state: dict) -> None:
    """Restore :func:`rng_state`."""
    random.setstate(state["python"])
    kind, keys, *rest = state["numpy"]
    keys = keys.numpy() if isinstance(keys, torch.Tensor) else np.asarray(keys)
    np.random.set_state((kind, keys.astype(np.uint32), *rest))
    torch.set_rng_state(state["torch"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])


def init_from(model: torch.nn.Module, source: str | Path) -> dict:
    """Warm-start ``model`` from a run directory or checkpoint, strictly by parameter name.

    Tensors whose name and shape match are copied; the rest keep their initialisation. Returns
    ``{"loaded": [...], "missing": [...], "unexpected": [...], "shape_mismatch": [...],
    "source": path, "share": s}`` with ``s`` the share of the model's parameter elements loaded
    (buffers are copied when they match but not counted).

    :raises CheckpointError: when the loaded tensors fill less than
        :data:`WARM_START_MIN_SHARE` of the model's parameter elements (a checkpoint of another
        architecture; 0 tensors was the silent no-op warm start of the public CGPT code). The
        message counts what matched.
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
    # the share counts parameters (buffers such as SNGP's precision matrix are state, not
    # what a warm start carries over)
    params = {name for name, _ in model.named_parameters()}
    total = sum(t.numel() for n, t in own.items() if n in params)
    share = sum(own[n].numel() for n in loaded if n in params) / max(total, 1)
    if share < WARM_START_MIN_SHARE:
        raise CheckpointError(
            f"warm start from {path} matched {len(loaded)} of {len(own)} tensors ({share:.0%} of "
            f"the model's parameters; {len(mismatch)} with another shape), below the "
            f"{WARM_START_MIN_SHARE:.0%} a warm start needs: a checkpoint of another model")
    model.load_state_dict(own)
    return {"loaded": loaded, "missing": sorted(set(own) - set(state)),
            "unexpected": sorted(set(state) - set(own)), "shape_mismatch": mismatch,
            "source": str(path), "share": share}
