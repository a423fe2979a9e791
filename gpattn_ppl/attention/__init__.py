"""Multi-head attention units, one class per method, and the registry."""

from .base import AttentionUnit, MCDropout, check_attention_inputs
from .cgpt import CGPTAttention
from .gumbel import GumbelAttention
from .h_gumbel import HierarchicalGumbelAttention
from .kep_svgp import KEPSVGPAttention
from .kernel import KernelAttention
from .pretrained import (
    SoftmaxWeights,
    init_from_softmax,
    register_pretrained_init,
    relative_error,
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

__all__ = ["ATTENTION", "AttentionUnit", "CGPTAttention", "SCGPTAttention", "GumbelAttention",
           "HierarchicalGumbelAttention", "KEPSVGPAttention", "KernelAttention", "MCDropout",
           "SGPAttention", "SoftmaxAttention", "SoftmaxWeights", "attention_option_types",
           "attention_options", "build_attention", "init_from_softmax", "register_pretrained_init",
           "relative_error",
           "check_attention_inputs", "register_attention"]
