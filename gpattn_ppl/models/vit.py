"""Vision Transformer classifier."""

from __future__ import annotations

import torch
from torch import nn

from .. import settings
from .classifier import TransformerClassifier

__all__ = ["ViTClassifier"]


class ViTClassifier(TransformerClassifier):
    """ViT: non-overlapping patch embedding (a strided convolution) + learned positions, no CLS
    token (masked-mean pooling over the N = (image_size / patch_size)² patches).

    :param image_size: side of the square input image. :param patch_size: side of a patch.
    :param channels: input channels.
    """

    def __init__(self, *, num_classes: int, image_size: int = 32, patch_size: int = 4,
                 channels: int = 3, dim: int = 128, depth: int = 5, heads: int = 4,
                 mlp_dim: int = 128, dropout: float = 0.1,
                 attention: dict | list[dict] | None = None, mc_dropout: bool = False,
                 attn_dropout: float | None = None, head: str = "linear",
                 sngp: dict | None = None) -> None:
        super().__init__(num_classes=num_classes, dim=dim, depth=depth, heads=heads,
                         mlp_dim=mlp_dim, dropout=dropout,
                         attention=attention or {"kind": "softmax"}, mc_dropout=mc_dropout,
                         attn_dropout=attn_dropout, head=head, sngp=sngp)
        if image_size % patch_size:
            raise ValueError(f"image_size {image_size} is not a multiple of patch_size {patch_size}")
        self.image_size, self.patch_size, self.channels = image_size, patch_size, channels
        self.patch_embedding = nn.Conv2d(channels, dim, patch_size, stride=patch_size)
        n = (image_size // patch_size) ** 2
        self.position_embedding = nn.Parameter(torch.zeros(1, n, dim))
        nn.init.normal_(self.position_embedding, std=0.02)

    def embed(self, x: torch.Tensor, mask: torch.Tensor | None):
        shape = (self.channels, self.image_size, self.image_size)
        if x.dim() != 4 or tuple(x.shape[1:]) != shape:
            raise ValueError(f"ViTClassifier: expected images [B, {', '.join(map(str, shape))}], "
                             f"got {tuple(x.shape)}")
        if mask is not None:
            raise ValueError("ViTClassifier: images take no mask")
        if settings.validate_args.value() and not bool(torch.isfinite(x).all()):
            raise ValueError("ViTClassifier: input images contain NaN or inf")
        h = self.patch_embedding(x).flatten(2).transpose(1, 2)
        return h + self.position_embedding, None
