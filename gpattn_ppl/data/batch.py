"""The minibatch every model, trainer and evaluator consumes."""

from __future__ import annotations

from dataclasses import dataclass

import torch

__all__ = ["Batch"]


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
        """The same batch on ``device`` (non-blocking where possible)."""
        mask = None if self.mask is None else self.mask.to(device, non_blocking=True)
        return Batch(self.x.to(device, non_blocking=True), self.y.to(device, non_blocking=True),
                     mask, self.index.to(device, non_blocking=True))

    def __len__(self) -> int:
        return int(self.y.shape[0])
