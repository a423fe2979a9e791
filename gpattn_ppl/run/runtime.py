"""The process a run lives in: device choice, torch.distributed (DDP), seeding, peak memory,
progress output."""

from __future__ import annotations

import os
import random
import resource
import sys
import threading

import torch

__all__ = ["BACKEND_ENV", "barrier", "distributed_backend", "init_distributed", "peak_memory_mb",
           "seed_everything", "select_device", "usable_cpus"]

#: environment variable naming the torch.distributed backend (``nccl``, ``gloo``, ...); unset or
#: empty: :func:`distributed_backend` chooses
BACKEND_ENV = "GPATTN_DIST_BACKEND"


def usable_cpus() -> int:
    """The CPUs this process may run on (its affinity mask where the system has one, else
    ``os.cpu_count()``), at least 1: the bound of ``--threads`` (more threads than that only
    contend, and an absurd count makes OpenMP crash the process)."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except (AttributeError, OSError):
        return max(1, os.cpu_count() or 1)


def select_device(name: str = "auto", rank: int = 0) -> torch.device:
    """``"auto"`` -> CUDA when available (``cuda:(LOCAL_RANK % device_count)`` under torchrun,
    so more ranks than GPUs share them), else CPU; otherwise ``torch.device(name)``."""
    if name == "auto":
        if torch.cuda.is_available():
            local = int(os.environ.get("LOCAL_RANK", rank))
            return torch.device("cuda", local % max(torch.cuda.device_count(), 1))
        return torch.device("cpu")
    return torch.device(name)


def distributed_backend(local_world_size: int | None = None) -> str:
    """The torch.distributed backend of this process: ``$GPATTN_DIST_BACKEND`` when set, else
    ``nccl`` when CUDA is available and every local rank has a GPU of its own
    (``torch.cuda.device_count() >= local_world_size``), else ``gloo`` (NCCL cannot run two
    ranks on one GPU).

    :param local_world_size: ranks on this machine (default ``$LOCAL_WORLD_SIZE``, else 1).
    """
    override = os.environ.get(BACKEND_ENV, "").strip()
    if override:
        return override
    if local_world_size is None:
        local_world_size = int(os.environ.get("LOCAL_WORLD_SIZE", "1"))
    if torch.cuda.is_available() and torch.cuda.device_count() >= local_world_size:
        return "nccl"
    return "gloo"


def init_distributed() -> tuple[int, int]:
    """``(rank, world_size)``; joins the process group when launched by ``torchrun``.

    Data parallelism (DDP): each rank trains on its shard of every epoch's permutation, gradients
    are averaged by :class:`~torch.nn.parallel.DistributedDataParallel`, KL terms keep the global
    ``N_data``, every rank evaluates the full validation set (identical results, so identical
    checkpoint selection) and only rank 0 writes files. The backend is
    :func:`distributed_backend`'s.
    """
    import torch.distributed as dist

    world = int(os.environ.get("WORLD_SIZE", "1"))
    if world <= 1 or not dist.is_available():
        return 0, 1
    if not dist.is_initialized():
        dist.init_process_group(distributed_backend())
    return dist.get_rank(), dist.get_world_size()


def barrier(world: int) -> None:
    """Wait for every rank (a no-op in a single process)."""
    if world > 1:
        import torch.distributed as dist

        dist.barrier()


def seed_everything(seed: int) -> None:
    """Seed python, numpy and torch (model initialisation, dropout, MC sampling)."""
    import numpy as np

    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)


def peak_memory_mb(device: torch.device) -> float:
    """Peak CUDA memory allocated on ``device``, or the process's peak resident set on CPU (MiB)."""
    if device.type == "cuda":
        return torch.cuda.max_memory_allocated(device) / 2**20
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0


def is_terminal(stream=None) -> bool:
    """Whether ``stream`` (default: ``sys.stderr``, where progress bars go) is a terminal: a
    progress bar is drawn only there (a redirected log gets one line per epoch instead)."""
    stream = sys.stderr if stream is None else stream
    try:
        return bool(stream.isatty())
    except (AttributeError, ValueError):  # no isatty, or a closed stream
        return False


def _rss_bytes() -> int | None:
    """The process's current resident set (Linux ``/proc/self/statm``; None elsewhere)."""
    try:
        with open("/proc/self/statm", "rb") as fh:
            return int(fh.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError):
        return None


def _max_rss_bytes() -> int:
    """The process's peak resident set since it started (``ru_maxrss``: KiB on Linux)."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


class RunMemory:
    """The peak memory of one run, measured from ``start()`` (not since the process began).

    * CUDA: ``torch.cuda.reset_peak_memory_stats`` at the start, then
      ``torch.cuda.max_memory_allocated``: the tensors' peak on the device during the run.
    * CPU: a process's peak resident set cannot be reset, so the run's own peak is taken as the
      larger of (a) the resident set sampled every ``interval`` seconds by a daemon thread and
      (b) ``ru_maxrss`` when the run raised it above its value at the start (then it is the
      run's exact peak). ``increase_mb`` is that peak minus the resident set at the start.

    ``summary()`` says which was measured (``results.json``: ``cost.peak_mem``).
    """

    def __init__(self, device: torch.device, interval: float = 0.05) -> None:
        self.device, self.interval = torch.device(device), interval
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.start_bytes = self.max_bytes = 0
        self._maxrss_start = 0
        self._sampled = False

    def start(self) -> RunMemory:
        """Reset (CUDA) or record (CPU) the baseline and start sampling; returns ``self``."""
        if self.device.type == "cuda":
            torch.cuda.reset_peak_memory_stats(self.device)
            self.start_bytes = torch.cuda.memory_allocated(self.device)
            return self
        self._maxrss_start = _max_rss_bytes()
        self.start_bytes = self.max_bytes = _rss_bytes() or 0
        self._sampled = _rss_bytes() is not None
        if self._sampled:
            self._thread = threading.Thread(target=self._sample, name="gpattn-ppl-rss",
                                            daemon=True)
            self._thread.start()
        return self

    def _sample(self) -> None:
        while not self._stop.wait(self.interval):
            rss = _rss_bytes()
            if rss is not None and rss > self.max_bytes:
                self.max_bytes = rss

    def stop(self) -> None:
        """Stop the sampling thread (the readings stay)."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
            self._thread = None

    def __enter__(self) -> RunMemory:
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()

    def peak_bytes(self) -> int:
        """The run's peak so far (see the class docstring)."""
        if self.device.type == "cuda":
            return torch.cuda.max_memory_allocated(self.device)
        now = _rss_bytes() or 0
        self.max_bytes = max(self.max_bytes, now)
        maxrss = _max_rss_bytes()
        return max(self.max_bytes, maxrss if maxrss > self._maxrss_start else 0)

    def summary(self) -> dict:
        """``{"peak_mb", "start_mb", "increase_mb", "what"}`` for ``results.json``."""
        peak = self.peak_bytes()
        if self.device.type == "cuda":
            what = ("CUDA tensor memory allocated on the device, peak since the run started "
                    "(torch.cuda.reset_peak_memory_stats at its start)")
        elif self._sampled:
            what = (f"the process's resident set (RSS), the run's peak: sampled every "
                    f"{self.interval:g} s from the run's start, or ru_maxrss when the run "
                    "raised it; increase_mb is over the RSS at the run's start")
        else:
            what = ("the process's peak resident set (ru_maxrss) when the run raised it, else 0 "
                    "(no /proc/self/statm here to sample the run's own)")
        return {"peak_mb": peak / 2**20, "start_mb": self.start_bytes / 2**20,
                "increase_mb": max(peak - self.start_bytes, 0) / 2**20, "what": what}
