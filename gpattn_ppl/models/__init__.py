"""Classifiers, the model spec and declarative model construction."""

from .build import assemble_model, build_model
from .classifier import TransformerClassifier, resolve_block_attention
from .spec import (
    MODEL_SCHEMA,
    ConfigError,
    Option,
    check_model,
    check_section,
    check_value,
    read_yaml_mapping,
    validate_model_spec,
)
from .text import TextClassifier
from .vit import ViTClassifier

__all__ = ["ConfigError", "MODEL_SCHEMA", "Option", "TextClassifier", "TransformerClassifier",
           "ViTClassifier", "assemble_model", "build_model", "check_model", "check_section",
           "check_value", "read_yaml_mapping", "resolve_block_attention", "validate_model_spec"]
