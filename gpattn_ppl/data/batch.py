"""The minibatch every model, trainer and evaluator consumes."""

from __future__ import annotations

from dataclasses import dataclass

import torch

__all__ = ["Batch", "to_device"]


def to_device(t: torch.Tensor, device: torch.device | str) -> torch.Tensor:
    """``t`` on ``device``; a host tensor bound for CUDA goes through pinned memory with a
    non-blocking copy (from pageable memory the copy blocks the host until the GPU has finished
    its queued work: a synchronisation per call)."""
    device = torch.device(device)
    if t.device == device:
        return t
    if device.type == "cuda" and t.device.type == "cpu":
        return t.pin_memory().to(device, non_blocking=True)
    return t.to(device)


@dataclass
class Batch:
    """One minibatch.

    :ivar x: token ids ``[B, N]`` (long), per-token features ``[B, N, F]`` (float) or images
        ``[B, 3, H, W]`` (float).
    :ivar y: labels ``[B]`` (long).
    :ivar mask: ``[B, N]`` bool, True on real tokens; ``None`` for images.
    :ivar index: ``[B]`` long, the rows of the dataset these examples are (for the Pyro plate's
        ``subsample``).
    """

    x: torch.Tensor
    y: torch.Tensor
    mask: torch.Tensor | None
    index: torch.Tensor

    def to(self, device: torch.device | str) -> Batch:
        """The same batch on ``device`` (:func:`to_device`: pinned and non-blocking to CUDA)."""
        mask = None if self.mask is None else to_device(self.mask, device)
        return Batch(to_device(self.x, device), to_device(self.y, device), mask,
                     to_device(self.index, device))

    def __len__(self) -> int:
        return int(self.y.shape[0])
