"""Transformer classifier for token sequences."""

from __future__ import annotations

import torch
from torch import nn

from .. import settings
from .classifier import TransformerClassifier

__all__ = ["TextClassifier"]


class TextClassifier(TransformerClassifier):
    """Text classifier: token embeddings (or projected pretrained features) + learned positions.

    Inputs are token ids ``[B, N]`` (``vocab_size`` given; id 0 is padding) or per-token features
    ``[B, N, F]`` (``feature_dim`` given, e.g. MiniLM states), with ``mask: [B, N]`` bool. Padded
    keys get zero attention weight in every block and pooling averages real tokens only.

    :param max_len: longest sequence (number of learned positions).

    Other parameters: see :class:`~gpattn_ppl.models.classifier.TransformerClassifier`.
    """

    def __init__(self, *, num_classes: int, vocab_size: int | None = None,
                 feature_dim: int | None = None, max_len: int = 64, dim: int = 128,
                 depth: int = 2, heads: int = 4, mlp_dim: int = 256, dropout: float = 0.1,
                 attention: dict | list[dict] | None = None, mc_dropout: bool = False,
                 attn_dropout: float | None = None, head: str = "linear",
                 sngp: dict | None = None) -> None:
        super().__init__(num_classes=num_classes, dim=dim, depth=depth, heads=heads,
                         mlp_dim=mlp_dim, dropout=dropout,
                         attention=attention or {"kind": "softmax"}, mc_dropout=mc_dropout,
                         attn_dropout=attn_dropout, head=head, sngp=sngp)
        if (vocab_size is None) == (feature_dim is None):
            raise ValueError("TextClassifier needs exactly one of vocab_size (token ids) or "
                             "feature_dim (pretrained per-token features)")
        self.vocab_size, self.feature_dim, self.max_len = vocab_size, feature_dim, max_len
        if vocab_size is not None:
            self.token_embedding = nn.Embedding(vocab_size, dim, padding_idx=0)
        else:
            self.token_embedding = nn.Linear(feature_dim, dim)
        self.position_embedding = nn.Parameter(torch.zeros(1, max_len, dim))
        nn.init.normal_(self.position_embedding, std=0.02)

    def _check(self, x: torch.Tensor, mask: torch.Tensor | None) -> torch.Tensor:
        B, N = x.shape[:2]
        if self.vocab_size is not None:
            if x.dim() != 2 or x.dtype != torch.long:
                raise ValueError(f"TextClassifier: expected token ids [B, N] (long), got "
                                 f"{tuple(x.shape)} {x.dtype}")
        elif x.dim() != 3 or x.shape[-1] != self.feature_dim or not x.is_floating_point():
            raise ValueError(f"TextClassifier: expected features [B, N, {self.feature_dim}] "
                             f"(float), got {tuple(x.shape)} {x.dtype}")
        if N > self.max_len:
            raise ValueError(f"TextClassifier: sequence length {N} exceeds max_len {self.max_len}")
        if mask is None:
            mask = torch.ones(B, N, dtype=torch.bool, device=x.device)
        elif mask.shape != (B, N) or mask.dtype != torch.bool:
            raise ValueError(f"TextClassifier: mask must be bool [B, N] = {(B, N)}, got "
                             f"{tuple(mask.shape)} {mask.dtype}")
        if settings.validate_args.value():
            if not bool(mask.any(-1).all()):
                rows = (~mask.any(-1)).nonzero().flatten().tolist()[:5]
                raise ValueError(f"TextClassifier: all-padding sequence(s) at batch rows {rows}")
            if self.vocab_size is not None and (int(x.min()) < 0 or int(x.max()) >= self.vocab_size):
                raise ValueError(f"TextClassifier: token ids must lie in [0, {self.vocab_size}), "
                                 f"got range [{int(x.min())}, {int(x.max())}]")
            if x.is_floating_point() and not bool(torch.isfinite(x).all()):
                raise ValueError("TextClassifier: input features contain NaN or inf")
        return mask

    def embed(self, x: torch.Tensor, mask: torch.Tensor | None):
        mask = self._check(x, mask)
        h = self.token_embedding(x if self.vocab_size is not None else x.to(self.position_embedding.dtype))
        return h + self.position_embedding[:, : x.shape[1]], mask
