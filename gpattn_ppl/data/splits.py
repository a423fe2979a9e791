"""Seeded split helpers shared by the dataset builders."""

from __future__ import annotations

import torch

__all__ = ["cut", "official_split", "pool", "seeded_permutation", "stratified_split",
           "stratified_subset"]


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


def _groups(labels: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """``(group [n] long, counts [G] long)``: labels below 0 form one group; groups follow the
    sorted label values."""
    labels = torch.as_tensor(labels, dtype=torch.long).reshape(-1)
    _, group, counts = labels.clamp(min=-1).unique(sorted=True, return_inverse=True,
                                                   return_counts=True)
    return group, counts


def _allocate(counts: torch.Tensor, size: int, cap: torch.Tensor) -> torch.Tensor:
    """Per-group shares ``[G]`` of ``size``: proportional to ``counts`` with largest-remainder
    rounding, at least one per group (that has room) when ``size >= G``, at most ``cap``."""
    if size == 0:
        return torch.zeros_like(counts)
    quota = size * counts.double() / float(counts.sum())
    share = torch.minimum(quota.floor().long(), cap)
    if size >= len(counts):
        share = torch.maximum(share, cap.clamp(max=1))
    while int(share.sum()) < size:  # hand out the rest by largest remainder (ties: lower group)
        room = (share < cap).nonzero().squeeze(1)
        order = torch.sort(-(quota - share)[room], stable=True).indices
        share[room[order[:size - int(share.sum())]]] += 1
    while int(share.sum()) > size:  # the minimum-one rule overshot: take from the most over-given
        over = (share > 1).nonzero().squeeze(1)
        order = torch.sort((quota - share)[over], stable=True).indices
        share[over[order[:int(share.sum()) - size]]] -= 1
    return share


def _shuffled_by_group(group: torch.Tensor, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Indices grouped by ``group`` (seeded order inside each) and each group's start offset."""
    perm = seeded_permutation(len(group), seed)
    order = perm[torch.sort(group[perm], stable=True).indices]
    counts = torch.bincount(group)
    return order, torch.cumsum(counts, 0) - counts


def stratified_subset(labels: torch.Tensor, size: int, seed: int) -> torch.Tensor:
    """A seeded subset of ``size`` examples with the label proportions of the whole.

    Each label gets ``size * n_label / n`` examples, rounded by largest remainder (so every share
    is within 1 of its exact value), and at least one when ``size`` is at least the number of
    labels; labels below 0 (unknown) count as one label. The draw uses its own generator seeded
    with ``seed``, never the global one.

    :param labels: ``[n]`` integer labels.
    :param size: how many to keep; ``size >= n`` keeps everything.
    :param seed: seeds the draw.
    :returns: ``[min(size, n)]`` sorted long indices into ``labels``.

    >>> stratified_subset(torch.tensor([0] * 6 + [1] * 3 + [2]), 5, seed=0).shape
    torch.Size([5])
    """
    n = int(torch.as_tensor(labels).numel())
    if size < 0:
        raise ValueError(f"size must be >= 0, got {size}")
    if size >= n:
        return torch.arange(n)
    return stratified_split(labels, {"subset": int(size)}, seed, rest=None)["subset"]


def stratified_split(labels: torch.Tensor, sizes: dict[str, int | float], seed: int, *,
                     rest: str | None = "train") -> dict[str, torch.Tensor]:
    """Seeded, label-stratified held-out splits.

    The splits are drawn in the order of ``sizes``, each from what the earlier ones left, with
    the allocation of :func:`stratified_subset`; when ``rest`` is kept, a held-out split leaves
    at least one example of every label to it while it can, so a small label is not lost to
    training.

    :param labels: ``[n]`` integer labels (below 0 = unknown, one group).
    :param sizes: split name -> a count (int) or a fraction of ``n`` (float in ``(0, 1)``;
        ``round(fraction * n)``, at least 1).
    :param seed: seeds the draw (own generator).
    :param rest: name of the split holding what is left; ``None``: drop it.
    :returns: split name -> sorted long indices (disjoint).
    :raises ValueError: a bad size or sizes adding up to more than ``n``.

    >>> s = stratified_split(torch.tensor([0] * 8 + [1] * 12), {"val": 0.1, "test": 0.1}, 0)
    >>> {k: len(v) for k, v in s.items()}
    {'val': 2, 'test': 2, 'train': 16}
    """
    group, counts = _groups(labels)
    n = len(group)
    want = {}
    for name, size in sizes.items():
        if isinstance(size, float) and not isinstance(size, bool):
            if not 0.0 < size < 1.0:
                raise ValueError(f"fraction for {name!r} must be in (0, 1), got {size}")
            size = max(1, round(size * n))
        elif not isinstance(size, int) or isinstance(size, bool) or size < 0:
            raise ValueError(f"size for {name!r} must be an int >= 0 or a fraction, got {size!r}")
        want[name] = size
    if sum(want.values()) > n:
        raise ValueError(f"split sizes {want} add up to more than the {n} examples")
    order, start = _shuffled_by_group(group, seed)
    left = counts.clone()
    taken = torch.zeros_like(counts)
    out = {}
    for name, size in want.items():
        keep_one = rest is not None and int((left - 1).clamp(min=0).sum()) >= size
        cap = left - 1 if keep_one else left
        share = _allocate(left, size, cap.clamp(min=0))
        pieces = [order[int(s) + int(t):int(s) + int(t) + int(k)]
                  for s, t, k in zip(start, taken, share)]
        out[name] = torch.cat(pieces).sort().values if pieces else order[:0]
        taken += share
        left -= share
    if rest is not None:
        pieces = [order[int(s) + int(t):int(s) + int(c)] for s, t, c in zip(start, taken, counts)]
        out[rest] = torch.cat(pieces).sort().values if pieces else order[:0]
    return out
