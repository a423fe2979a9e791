"""GPyTorch variational strategies of the GP attention units (one file each)."""

from .kernel_eigen_pair_strategy import KernelEigenPairStrategy

__all__ = ["KernelEigenPairStrategy"]

from .sgpa_strategy import DecoupledSGPAStrategy, SGPAStrategy, StandardNormalMVN  # noqa: E402

__all__ += ["DecoupledSGPAStrategy", "SGPAStrategy", "StandardNormalMVN"]

from .correlated_gp import CGPTerms, CorrelatedGP  # noqa: E402
from .sparse_correlated_gp import SCGPTerms, SparseCorrelatedGP  # noqa: E402
from .token_normal import TokenNormal  # noqa: E402

__all__ += ["CGPTerms", "CorrelatedGP", "SCGPTerms", "SparseCorrelatedGP", "TokenNormal"]
