"""Multi-head attention units, one class per method, and the registry."""

from .base import AttentionUnit, MCDropout, check_attention_inputs, posterior_mean
from .gumbel import GumbelAttention
from .h_gumbel import HierarchicalGumbelAttention
from .kernel import KernelAttention
from .registry import ATTENTION, attention_options, build_attention, register_attention
from .softmax import SoftmaxAttention

__all__ = ["ATTENTION", "AttentionUnit", "GumbelAttention", "HierarchicalGumbelAttention",
           "KernelAttention", "MCDropout", "SoftmaxAttention",
           "attention_options", "build_attention", "check_attention_inputs", "posterior_mean",
           "register_attention"]
