"""One Transformer block = one (deep-GP) layer."""

from __future__ import annotations

import torch
from torch import nn

from ..attention.base import AttentionUnit, MCDropout

__all__ = ["TransformerBlock"]


class TransformerBlock(nn.Module):
    r"""Pre-LN Transformer block around any attention unit.

    .. math::
        x \leftarrow x + \mathrm{attn}(\mathrm{LN}(x), \text{mask}), \qquad
        x \leftarrow x + \mathrm{MLP}(\mathrm{LN}(x))

    with MLP = Linear(C, mlp_dim) - GELU - Dropout - Linear(mlp_dim, C) - Dropout.

    :param attn: the attention unit (owns its own projections and dropout).
    :param mlp_dim: hidden width of the MLP. :param dropout: MLP dropout probability.
    """

    def __init__(self, attn: AttentionUnit, mlp_dim: int, dropout: float = 0.0) -> None:
        super().__init__()
        dim = attn.dim
        self.norm1, self.attn = nn.LayerNorm(dim), attn
        self.norm2 = nn.LayerNorm(dim)
        self.mlp = nn.Sequential(nn.Linear(dim, mlp_dim), nn.GELU(), MCDropout(dropout),
                                 nn.Linear(mlp_dim, dim), MCDropout(dropout))

    def forward(self, x: torch.Tensor, mask: torch.Tensor | None = None) -> torch.Tensor:
        """``[B, N, C] -> [B, N, C]``."""
        x = x + self.attn(self.norm1(x), mask)
        return x + self.mlp(self.norm2(x))
