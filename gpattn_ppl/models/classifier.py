"""Shared machinery of the text and image classifiers."""

from __future__ import annotations

import torch
from torch import nn

from ..attention.base import MCDropout
from ..attention.registry import attention_options, build_attention
from ..layers import TransformerBlock
from .host import AttentionHost

__all__ = ["TransformerClassifier", "resolve_block_attention"]


def resolve_block_attention(depth: int, attention: dict, overrides: list[dict] | None
                            ) -> list[dict]:
    """The attention spec of each block: the default, replaced by per-block overrides.

    :param overrides: ``[{"blocks": [-1], "attention": {...}}, ...]``; negative indices count
        from the end; later entries win.
    :raises ValueError: a block index out of range (naming the override).
    """
    specs = [dict(attention) for _ in range(depth)]
    for i, ov in enumerate(overrides or []):
        for b in ov["blocks"]:
            if not -depth <= b < depth:
                raise ValueError(f"model.overrides[{i}].blocks: block index {b} out of range for "
                                 f"depth {depth} (allowed {-depth}..{depth - 1})")
            specs[b % depth] = dict(ov["attention"])
    return specs


class TransformerClassifier(AttentionHost):
    """Embedding -> L TransformerBlocks -> LayerNorm -> masked mean pool -> linear head.

    Subclasses implement :meth:`embed` (``x -> ([B, N, C], mask)``).

    :param attention: per-block attention specs ``{"kind": ..., **options}`` (length ``depth``)
        or one spec for every block.
    :param mc_dropout: keep every dropout active at evaluation (Monte-Carlo dropout baseline).
    :param attn_dropout: dropout on the attention weights of the units that have weights
        (default ``dropout``); GP units have none and are not given it.
    """

    def __init__(self, *, num_classes: int, dim: int, depth: int, heads: int, mlp_dim: int,
                 dropout: float, attention: dict | list[dict], mc_dropout: bool = False,
                 attn_dropout: float | None = None) -> None:
        super().__init__()
        if depth < 1:
            raise ValueError(f"model.depth must be >= 1, got {depth}")
        specs = attention if isinstance(attention, list) else [attention] * depth
        if len(specs) != depth:
            raise ValueError(f"{len(specs)} attention specs for depth {depth}")
        blocks = []
        for i, spec in enumerate(specs):
            spec = dict(spec)
            kind = spec.pop("kind")
            if "attn_dropout" in attention_options(kind):   # units with attention weights only
                spec.setdefault("attn_dropout", dropout if attn_dropout is None else attn_dropout)
            spec.setdefault("proj_dropout", dropout)
            unit = build_attention(kind, dim, heads, where=f"model.blocks[{i}].attention", **spec)
            blocks.append(TransformerBlock(unit, mlp_dim, dropout))
        self.blocks = nn.ModuleList(blocks)
        self.norm = nn.LayerNorm(dim)
        self.head = nn.Linear(dim, num_classes)
        self.num_classes, self.dim = num_classes, dim
        self.emb_dropout = MCDropout(dropout)
        for path, unit in self.attention_units().items():
            unit.site_prefix = path
        self.set_mc_dropout(mc_dropout)

    def prefix_targets(self) -> list[tuple[object, str]]:
        """``embed`` and the blocks before the first stochastic unit (see
        :class:`~gpattn_ppl.models.host.PrefixCache`)."""
        targets: list[tuple[object, str]] = [(self, "embed")]
        for block in self.blocks:
            if block.attn.stochastic:
                break
            targets.append((block, "forward"))
        return targets

    # -- forward ------------------------------------------------------------------------------
    def embed(self, x: torch.Tensor, mask: torch.Tensor | None):
        """Validate and embed the inputs: ``x -> (h [B, N, C], mask [B, N] bool or None)``.

        Subclasses implement it.
        """
        raise NotImplementedError

    def features(self, x: torch.Tensor, mask: torch.Tensor | None = None) -> torch.Tensor:
        """Pooled representation ``[B, C]``."""
        h, mask = self.embed(x, mask)
        h = self.emb_dropout(h)
        for block in self.blocks:
            h = block(h, mask)
        h = self.norm(h)
        if mask is None:
            return h.mean(1)
        w = mask.unsqueeze(-1).to(h.dtype)
        return (h * w).sum(1) / w.sum(1)

    def forward(self, x: torch.Tensor, mask: torch.Tensor | None = None) -> torch.Tensor:
        """Class logits ``[B, K]``."""
        return self.head(self.features(x, mask))
