"""Seeded split helpers shared by the dataset builders."""

from __future__ import annotations

import torch

__all__ = ["cut", "official_split", "pool", "seeded_permutation"]


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


def official_split(n_train: int, n: int, seed: int, val_fraction: float = 0.1
                   ) -> dict[str, torch.Tensor]:
    """The "official" protocol of a dataset whose first ``n_train`` of ``n`` examples are its
    training file: a seeded ``val_fraction`` of the training file is held out for validation,
    the rest trains, and examples ``n_train .. n - 1`` (the official test/dev file) are the test."""
    n_val = round(val_fraction * n_train)
    splits = cut(seeded_permutation(n_train, seed), {"val": n_val, "train": n_train - n_val})
    splits["test"] = torch.arange(n_train, n)
    return splits


def pool(first: tuple[list, torch.Tensor], second: tuple[list, torch.Tensor]
         ) -> tuple[list, torch.Tensor, int, int]:
    """Two labelled files ``(texts, labels)`` as one pool: ``(x, y, n_first, n)`` with the first
    file's examples at ``0 .. n_first - 1``."""
    (x1, y1), (x2, y2) = first, second
    return x1 + x2, torch.cat([y1, y2]), len(x1), len(x1) + len(x2)
