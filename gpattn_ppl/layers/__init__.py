"""Transformer layers composed from attention units."""

from .transformer_block import TransformerBlock

__all__ = ["TransformerBlock"]
