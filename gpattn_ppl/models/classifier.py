"""Shared machinery of the text and image classifiers."""

from __future__ import annotations

import torch
from torch import nn

from ..attention.base import MCDropout
from ..attention.registry import attention_options, build_attention
from ..layers import TransformerBlock
from .host import AttentionHost
from .sngp import build_sngp_head, sngp_heads, sngp_options, spectral_normalize

#: the output layers of a classifier (``model.head``)
HEADS = ("linear", "sngp")

__all__ = ["HEADS", "SNGPHostMixin", "TransformerClassifier", "resolve_block_attention"]


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


class SNGPHostMixin:
    """The epoch hooks of a classifier that may have SNGP heads
    (:class:`~gpattn_ppl.models.sngp.RandomFeatureGP`); the trainer calls them."""

    def _init_sngp(self, head: str, sngp: dict | None, in_features: int, num_classes: int,
                   residual) -> nn.Module:
        """The output layer for ``head``; for ``"sngp"`` the layers named by ``residual()`` are
        spectrally normalised (``sngp.spectral_norm``) and the precision buffers are kept out of
        DistributedDataParallel's buffer broadcast (the ranks' sums are combined at epoch end)."""
        if head not in HEADS:
            raise ValueError(f"head must be one of {', '.join(HEADS)}, got {head!r}")
        self.head_kind = head
        self.spectral_layers: list[str] = []
        if head == "linear":
            if sngp:
                raise ValueError("sngp options given for head 'linear'")
            return nn.Linear(in_features, num_classes)
        opts = sngp_options(sngp)
        if opts["spectral_norm"]:
            self.spectral_layers = spectral_normalize(self, residual(), bound=opts["norm_bound"])
        out = build_sngp_head(in_features, num_classes, opts)
        self._ddp_params_and_buffers_to_ignore = ["head.precision"]
        return out

    def on_train_epoch_start(self) -> None:
        """Reset each SNGP head's precision to ``ridge * I`` (exact accumulation; a head with a
        momentum keeps its moving average)."""
        for head in sngp_heads(self).values():
            if head.momentum is None:
                head.reset_precision()

    def on_train_epoch_end(self) -> None:
        """Combine the precisions of several processes (``torch.distributed``; no-op otherwise)."""
        for head in sngp_heads(self).values():
            head.all_reduce_precision()


class TransformerClassifier(SNGPHostMixin, AttentionHost):
    """Embedding -> L TransformerBlocks -> LayerNorm -> masked mean pool -> linear head.

    Subclasses implement :meth:`embed` (``x -> ([B, N, C], mask)``).

    :param attention: per-block attention specs ``{"kind": ..., **options}`` (length ``depth``)
        or one spec for every block.
    :param mc_dropout: keep every dropout active at evaluation (Monte-Carlo dropout baseline).
    :param attn_dropout: dropout on the attention weights of the units that have weights
        (default ``dropout``); GP units have none and are not given it.
    :param head: ``"linear"`` or ``"sngp"``: the random-Fourier-feature GP output layer
        (:class:`~gpattn_ppl.models.sngp.RandomFeatureGP`) and, with ``sngp["spectral_norm"]``,
        spectral normalisation of each block's attention output projection and MLP layers.
    :param sngp: the options of the SNGP head (:data:`~gpattn_ppl.models.sngp.SNGP_DEFAULTS`).
    """

    def __init__(self, *, num_classes: int, dim: int, depth: int, heads: int, mlp_dim: int,
                 dropout: float, attention: dict | list[dict], mc_dropout: bool = False,
                 attn_dropout: float | None = None, head: str = "linear",
                 sngp: dict | None = None) -> None:
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
        self.head = self._init_sngp(head, sngp, dim, num_classes, self.residual_linears)
        self.num_classes, self.dim = num_classes, dim
        self.emb_dropout = MCDropout(dropout)
        for path, unit in self.attention_units().items():
            unit.site_prefix = path
        self.set_mc_dropout(mc_dropout)

    def residual_linears(self) -> list[str]:
        """The dense layers of the residual branches (what SNGP normalises): each block's
        attention output projection ``attn.out`` and its two MLP layers."""
        names = []
        for i, block in enumerate(self.blocks):
            if not isinstance(getattr(block.attn, "out", None), nn.Linear):
                raise ValueError(f"blocks.{i}.attn ({type(block.attn).__name__}) has no output "
                                 "projection 'out' to normalise")
            names += [f"blocks.{i}.attn.out", f"blocks.{i}.mlp.0", f"blocks.{i}.mlp.3"]
        return names

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
