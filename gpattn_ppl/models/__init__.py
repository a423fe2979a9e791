"""Classifiers and declarative model construction."""

from .build import build_model
from .classifier import TransformerClassifier, resolve_block_attention
from .text import TextClassifier
from .vit import ViTClassifier

__all__ = ["TextClassifier", "TransformerClassifier", "ViTClassifier", "build_model",
           "resolve_block_attention"]
