"""Multi-head attention units, one class per method, and the registry."""

from .base import (
    AttentionUnit,
    MCDropout,
    RotaryPositions,
    check_attention_inputs,
    check_parameter_memory,
)
from .cgpt import CGPTAttention
from .gp_unit import GPAttentionUnit
from .gumbel import GumbelAttention
from .h_gumbel import HierarchicalGumbelAttention
from .kep_svgp import KEPSVGPAttention
from .kernel import KernelAttention
from .pretrained import (
    NOISE_TARGET,
    QUERY_SCALES,
    SoftmaxWeights,
    copy_output_projection,
    copy_qkv,
    dropped_biases,
    fit_value_gain,
    init_from_softmax,
    mean_gap,
    noise_excess,
    pretrained_rule,
    register_pretrained_init,
    relative_error,
    require_exponential_kernel,
    search_query_scale,
    shrink_noise,
)
from .registry import (
    ATTENTION,
    attention_option_types,
    attention_options,
    build_attention,
    register_attention,
)
from .scgpt import SCGPTAttention
from .sgpa import SGPAttention
from .softmax import SoftmaxAttention

__all__ = ["ATTENTION", "AttentionUnit", "CGPTAttention", "GPAttentionUnit", "SCGPTAttention",
           "GumbelAttention",
           "HierarchicalGumbelAttention", "KEPSVGPAttention", "KernelAttention", "MCDropout",
           "NOISE_TARGET", "QUERY_SCALES", "RotaryPositions", "SGPAttention", "SoftmaxAttention",
           "SoftmaxWeights",
           "attention_option_types", "attention_options", "build_attention",
           "check_attention_inputs", "check_parameter_memory",
           "copy_output_projection", "copy_qkv", "dropped_biases",
           "fit_value_gain", "init_from_softmax", "mean_gap", "noise_excess", "pretrained_rule",
           "register_attention", "register_pretrained_init", "relative_error",
           "require_exponential_kernel", "search_query_scale", "shrink_noise"]
