"""Seeded split helpers shared by the dataset builders."""

from __future__ import annotations

import torch

__all__ = ["cut", "seeded_permutation"]


def seeded_permutation(n: int, seed: int) -> torch.Tensor:
    """``randperm(n)`` from a generator seeded with ``seed`` (independent of the global RNG)."""
    return torch.randperm(n, generator=torch.Generator().manual_seed(int(seed)))


def cut(index: torch.Tensor, sizes: dict[str, int]) -> dict[str, torch.Tensor]:
    """Consecutive chunks of ``index`` (sorted within each chunk) with the given sizes."""
    out, start = {}, 0
    for split, size in sizes.items():
        out[split] = index[start:start + size].sort().values
        start += size
    assert start == len(index), (start, len(index))
    return out
