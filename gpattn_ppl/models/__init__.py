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
from .swap import (
    HOSTS,
    BertAttentionAdapter,
    DistilBertAttentionAdapter,
    MultiheadAttentionAdapter,
    attention_units,
    find_attention_layers,
    key_mask,
    swap_attention,
)
from .text import TextClassifier
from .vit import ViTClassifier

__all__ = ["BertAttentionAdapter", "ConfigError", "DistilBertAttentionAdapter", "HOSTS",
           "MODEL_SCHEMA", "MultiheadAttentionAdapter", "Option", "TextClassifier", "TransformerClassifier",
           "ViTClassifier", "assemble_model", "attention_units", "build_model", "check_model", "check_section",
           "check_value", "find_attention_layers", "key_mask", "read_yaml_mapping", "resolve_block_attention",
           "swap_attention", "validate_model_spec"]
