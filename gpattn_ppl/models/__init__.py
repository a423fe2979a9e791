"""Classifiers, the model spec and declarative model construction."""

from ..schema import (  # the config-schema engine, re-exported here as before
    MAX_CONFIG_BYTES,
    MAX_CONFIG_DEPTH,
    MAX_VALUE_DEPTH,
    MAX_VALUE_ITEMS,
    ConfigError,
    ConfigLoader,
    Option,
    check_plain,
    check_section,
    load_yaml,
    read_yaml_mapping,
)
from .build import assemble_model, build_model
from .classifier import HEADS, SNGPHostMixin, TransformerClassifier, resolve_block_attention
from .frozen_prefix import FrozenPrefix, prefix_fingerprint
from .hf import FREEZE, POOLING, HFClassifier, load_hf_encoder
from .host import AttentionHost, PrefixCache
from .sngp import (
    SNGP_DEFAULTS,
    RandomFeatureGP,
    SpectralNormLinear,
    build_sngp_head,
    mean_field_logits,
    residual_linears,
    sngp_heads,
    sngp_options,
    spectral_normalize,
)
from .spec import (
    MODEL_SCHEMA,
    SNGP_SCHEMA,
    check_attention,
    check_model,
    check_value,
    validate_model_spec,
)
from .swap import (
    HOSTS,
    AttentionLayer,
    BertAttentionAdapter,
    HostAttentionAdapter,
    MultiheadAttentionAdapter,
    RotaryAttentionAdapter,
    SelfAttentionAdapter,
    attention_units,
    calibrate_swapped,
    find_attention_layers,
    gap_to_softmax,
    key_mask,
    swap_attention,
    swapped_prefix,
)
from .swap_record import (
    HEAD_KEY,
    PREDICTIVE_KEY,
    PREDICTIVES,
    SWAP_KEY,
    TEMPERATURE_KEY,
    SwapRecordError,
    check_swap_record,
    read_head,
    read_record,
    read_temperature,
)
from .swapped_types import (
    AUTO_MODELS,
    DEFAULT_HOSTS,
    is_swapped_class,
    register_swapped_types,
    swapped_config_class,
    swapped_model_class,
)
from .text import TextClassifier
from .vit import ViTClassifier

__all__ = ["AUTO_MODELS", "AttentionHost", "AttentionLayer", "DEFAULT_HOSTS", "HEAD_KEY",
           "PREDICTIVES", "PREDICTIVE_KEY", "SWAP_KEY", "SwapRecordError", "TEMPERATURE_KEY",
           "check_swap_record", "is_swapped_class", "read_head", "read_record",
           "read_temperature", "register_swapped_types", "swapped_config_class",
           "swapped_model_class", "BertAttentionAdapter", "ConfigError",
           "ConfigLoader", "FREEZE", "HEADS", "HFClassifier", "HOSTS",
           "HostAttentionAdapter", "MAX_CONFIG_BYTES",
           "MAX_CONFIG_DEPTH", "MAX_VALUE_DEPTH", "MAX_VALUE_ITEMS", "MODEL_SCHEMA",
           "MultiheadAttentionAdapter", "Option", "POOLING", "PrefixCache", "RandomFeatureGP",
           "RotaryAttentionAdapter", "SNGPHostMixin", "SNGP_DEFAULTS", "SNGP_SCHEMA", "SelfAttentionAdapter", "SpectralNormLinear",
           "TextClassifier", "TransformerClassifier", "ViTClassifier", "assemble_model",
           "attention_units", "build_model", "build_sngp_head", "calibrate_swapped",
           "check_attention", "check_model", "check_plain", "check_section", "check_value",
           "find_attention_layers", "gap_to_softmax", "key_mask", "load_hf_encoder", "load_yaml",
           "mean_field_logits", "read_yaml_mapping", "residual_linears",
           "resolve_block_attention", "sngp_heads", "sngp_options", "spectral_normalize",
           "swap_attention", "swapped_prefix", "validate_model_spec", "FrozenPrefix",
           "prefix_fingerprint"]
