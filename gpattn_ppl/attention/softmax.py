"""Scaled dot-product softmax attention (the MSP baseline)."""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

from ..distributions import AttentionPredictive
from .base import AttentionUnit
from .pretrained import SoftmaxWeights, copy_qkv, register_pretrained_init
from .registry import register_attention

__all__ = ["SoftmaxAttention"]


@register_attention("softmax")
class SoftmaxAttention(AttentionUnit):
    r"""Multi-head softmax attention.

    .. math::
        A = \mathrm{softmax}_{\text{row}}\big(Q K^\top / \sqrt{D} + M\big), \quad
        \text{out} = \mathrm{concat}_h(A_h V_h)\, W_O

    with :math:`M_{ab} = -\infty` on padded keys (CGPT eqs. 4-5). Runs through
    :func:`torch.nn.functional.scaled_dot_product_attention` (fused kernels on GPU).

    :param dim: C. :param heads: H.
    :param attn_dropout: dropout on A (kept on at test under MC dropout).
    :param proj_dropout: dropout after W_O.

    Cost O(N² D) time per (b, h).

    >>> att = SoftmaxAttention(dim=8, heads=2)
    >>> att(torch.randn(3, 5, 8)).shape
    torch.Size([3, 5, 8])
    """

    rotary_capable = True

    def __init__(self, dim: int, heads: int, *, attn_dropout: float = 0.0,
                 proj_dropout: float = 0.0) -> None:
        super().__init__(dim, heads, attn_dropout=attn_dropout, proj_dropout=proj_dropout)
        self.qkv = nn.Linear(dim, 3 * dim)
        self.out = nn.Linear(dim, dim)

    def project(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Per-head queries, keys and values, each ``[B, H, N, D]`` (role-major split of the
        fused ``[B, N, 3, H, D]`` projection; queries and keys rotated inside
        :meth:`~gpattn_ppl.attention.AttentionUnit.positions`)."""
        B, N, _ = x.shape
        q, k, v = self.qkv(x).view(B, N, 3, self.heads, self.head_dim).permute(2, 0, 3, 1, 4)
        q, k = self.rotate(q, k)
        return q, k, v

    def attend(self, x: torch.Tensor, mask: torch.Tensor | None) -> torch.Tensor:
        q, k, v = self.project(x)
        attn_mask = None if mask is None else mask[:, None, None, :]
        p = self.attn_dropout.p if self.attn_dropout.active else 0.0
        h = F.scaled_dot_product_attention(q, k, v, attn_mask=attn_mask, dropout_p=p)
        return self.proj_dropout(self.out(self.merge_heads(h)))

    def attention_matrix(self, x: torch.Tensor, mask: torch.Tensor | None = None) -> torch.Tensor:
        """The softmax attention matrix ``[B, H, N, N]`` (no dropout); padded key columns 0."""
        mask = self._check(x, mask)
        q, k, _ = self.project(x)
        logits = (q @ k.mT) / self.head_dim ** 0.5
        if mask is not None:
            logits = logits.masked_fill(~mask[:, None, None, :], float("-inf"))
        return torch.softmax(logits, -1)

    def predictive(self, x: torch.Tensor, mask: torch.Tensor | None = None) -> AttentionPredictive:
        """The (deterministic) head outputs ``[B, H, N, D]`` as a zero-variance predictive."""
        mask = self._check(x, mask)
        return AttentionPredictive.point(self.attention_matrix(x, mask) @ self.project(x)[2])


# -- initialisation from a pretrained softmax layer (attention/pretrained.py) ------------------

@register_pretrained_init(SoftmaxAttention)
def _softmax(unit: SoftmaxAttention, w: SoftmaxWeights, x, mask) -> dict:
    # the unit scales by 1/sqrt(D): a non-standard scale s is folded into the queries
    copy_qkv(unit, w, w.scale * math.sqrt(unit.head_dim))
    return {"copied": ["W_q", "b_q", "W_k", "b_k", "W_v", "b_v", "W_O", "b_O"], "fitted": [],
            "not_carried": []}
