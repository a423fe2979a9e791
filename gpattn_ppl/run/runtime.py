"""The process a run lives in: device choice, torch.distributed (DDP), seeding, peak memory."""

from __future__ import annotations

import os
import random
import resource

import torch

__all__ = ["BACKEND_ENV", "barrier", "distributed_backend", "init_distributed", "peak_memory_mb",
           "seed_everything", "select_device"]

#: environment variable naming the torch.distributed backend (``nccl``, ``gloo``, ...); unset or
#: empty: :func:`distributed_backend` chooses
BACKEND_ENV = "GPATTN_DIST_BACKEND"


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
