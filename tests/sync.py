"""Test helper: count the host synchronisations of a block at the aten level.

:func:`sync_counter` watches the aten ops through a
``torch.utils._python_dispatch.TorchDispatchMode``; the tests of the fit loop's fast path
(``tests/infer/test_no_host_sync.py``) assert that a training step makes none.
"""

from __future__ import annotations

import torch
from torch.utils._python_dispatch import TorchDispatchMode

__all__ = ["SYNC_OPS", "SyncCounter", "sync_counter"]


#: aten ops whose result the host waits for (a scalar read, a data-dependent output size, a
#: comparison answered on the host, an assertion)
SYNC_OPS = frozenset({"_local_scalar_dense", "is_nonzero", "nonzero", "equal", "allclose",
                      "_assert_async", "masked_select", "_unique", "_unique2", "unique_dim",
                      "unique_consecutive"})


def _is_sync(func, args, kwargs) -> bool:
    name = func.overloadpacket.__name__
    if name in SYNC_OPS:
        return True
    if name in ("index", "index_put", "index_put_", "_index_put_impl_"):  # boolean-mask indexing
        indices = args[1] if len(args) > 1 else kwargs.get("indices", ())
        return any(isinstance(i, torch.Tensor) and i.dtype in (torch.bool, torch.uint8)
                   for i in indices)
    if name == "_to_copy":  # device -> host copy
        src, dst = args[0], kwargs.get("device")
        return (src.device.type != "cpu" and dst is not None and torch.device(dst).type == "cpu"
                and not kwargs.get("non_blocking", False))
    if name == "copy_":
        non_blocking = args[2] if len(args) > 2 else kwargs.get("non_blocking", False)
        return (args[0].device.type == "cpu" and args[1].device.type != "cpu"
                and not non_blocking)
    return False


class SyncCounter(TorchDispatchMode):
    """Counts the host synchronisations of the ops run under it (see :func:`sync_counter`):
    ``count`` and ``ops`` (the aten op names, in order)."""

    def __init__(self) -> None:
        super().__init__()
        self.count = 0
        self.ops: list[str] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if _is_sync(func, args, kwargs):
            self.count += 1
            self.ops.append(func.overloadpacket.__name__)
        return func(*args, **kwargs)


def sync_counter():
    """A context manager counting host synchronisations at the aten level::

        with sync_counter() as s:
            step()
        assert s.count == 0, s.ops

    Counted: the ops of :data:`SYNC_OPS` (``.item()``, ``float(t)``, ``bool(t)`` and ``if t:``
    reach ``_local_scalar_dense``), boolean-mask indexing, and blocking device -> host copies
    (``.cpu()``, ``.tolist()`` of a CUDA tensor). Not seen: syncs inside a kernel or in Python
    code that reads tensor data without an aten op (``.tolist()`` / ``.numpy()`` of a CPU
    tensor), and ``torch.cuda.synchronize``.
    """
    return SyncCounter()
