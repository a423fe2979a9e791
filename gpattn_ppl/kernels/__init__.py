"""gpytorch kernels used by the attention units."""

from .ard_rbf import ARDRBFKernel
from .attention_kernel import KERNELS, gram, log_gram, make_attention_kernel
from .canonical_se import CanonicalSEKernel, canonical_projection_init_
from .exponential_dot import ExponentialDotKernel

__all__ = ["ARDRBFKernel", "ExponentialDotKernel", "KERNELS", "gram", "log_gram",
           "make_attention_kernel", "CanonicalSEKernel", "canonical_projection_init_"]
