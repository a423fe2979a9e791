"""The process's memory allocator policy: keep freed memory for reuse (glibc's malloc).

A training step allocates and frees the same large tensors every time (``[B, H, N, N]`` kernel
matrices and their factors: 32 MiB each at B = 32, H = 4, N = 256). glibc's ``malloc`` serves
blocks above its mmap threshold (at most 32 MiB) with fresh ``mmap`` calls and returns freed heap
memory to the system above its trim threshold, so every step page-faults its memory in again.
Measured on 2 CPU cores (``benchmarks/results/units.json``, ``allocator`` section): a CGPT step
at N = 256 took 4.2 s with 1.3 million page faults and 2.2 s with none. PyTorch's CUDA allocator
caches for the same reason; on CPU the knob is glibc's ``mallopt``.

:func:`keep_freed_memory` raises both thresholds once per process. The command line does it at
start (``GPATTN_PPL_MALLOC=system`` leaves the allocator alone); a Python user calls it. The cost
is that the process keeps its peak heap until it exits, as a caching allocator does.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import os
import sys

__all__ = ["keep_freed_memory"]

#: environment variable: ``system`` keeps glibc's defaults in the command line
ENV = "GPATTN_PPL_MALLOC"

_M_TRIM_THRESHOLD, _M_TOP_PAD, _M_MMAP_THRESHOLD = -1, -2, -3
_APPLIED: list[bool] = []


def keep_freed_memory() -> bool:
    """Tell glibc's ``malloc`` to serve large blocks from the heap and keep freed memory (mmap
    threshold 1 GiB, trim threshold 2 GiB, top pad 64 MiB); once per process.

    :returns: whether the policy is in force (``False`` off Linux/glibc, or when ``mallopt``
        refuses a value).
    """
    if _APPLIED:
        return _APPLIED[0]
    ok = False
    if sys.platform.startswith("linux"):
        try:
            libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
            mallopt = libc.mallopt
        except (OSError, AttributeError):  # not glibc (e.g. musl has no mallopt)
            mallopt = None
        if mallopt is not None:
            mallopt.argtypes, mallopt.restype = [ctypes.c_int, ctypes.c_int], ctypes.c_int
            ok = all([mallopt(_M_MMAP_THRESHOLD, 1 << 30) == 1,
                      mallopt(_M_TRIM_THRESHOLD, (1 << 31) - 1) == 1,
                      mallopt(_M_TOP_PAD, 64 << 20) == 1])
    _APPLIED.append(ok)
    return ok


def apply_default_policy() -> bool:
    """What the command line does at start: :func:`keep_freed_memory` unless ``GPATTN_PPL_MALLOC``
    is ``system``."""
    if os.environ.get(ENV, "").strip().lower() == "system":
        return False
    return keep_freed_memory()
