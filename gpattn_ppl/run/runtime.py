"""The process a run lives in: device choice, torch.distributed (DDP), seeding, peak memory."""

from __future__ import annotations

import os
import random
import resource

import torch

__all__ = ["barrier", "init_distributed", "peak_memory_mb", "seed_everything", "select_device"]


def select_device(name: str = "auto", rank: int = 0) -> torch.device:
    """``"auto"`` -> CUDA when available (``cuda:LOCAL_RANK`` under torchrun), else CPU;
    otherwise ``torch.device(name)``."""
    if name == "auto":
        if torch.cuda.is_available():
            return torch.device("cuda", int(os.environ.get("LOCAL_RANK", rank)))
        return torch.device("cpu")
    return torch.device(name)


def init_distributed() -> tuple[int, int]:
    """``(rank, world_size)``; joins the process group when launched by ``torchrun``.

    Data parallelism (DDP): each rank trains on its shard of every epoch's permutation, gradients
    are averaged by :class:`~torch.nn.parallel.DistributedDataParallel`, KL terms keep the global
    ``N_data``, every rank evaluates the full validation set (identical results, so identical
    checkpoint selection) and only rank 0 writes files.
    """
    import torch.distributed as dist

    world = int(os.environ.get("WORLD_SIZE", "1"))
    if world <= 1 or not dist.is_available():
        return 0, 1
    if not dist.is_initialized():
        dist.init_process_group("nccl" if torch.cuda.is_available() else "gloo")
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
