"""GPyTorch variational strategies of the GP attention units: q(u), its prior, the conditional and
the KL (SGPA standard and decoupled, the KEP-SVGP pair), one file each."""

from .kernel_eigen_pair_strategy import KEPState, KernelEigenPairStrategy
from .sgpa_strategy import DecoupledSGPAState, DecoupledSGPAStrategy, SGPAState, SGPAStrategy

__all__ = ["DecoupledSGPAState", "DecoupledSGPAStrategy", "KEPState", "KernelEigenPairStrategy",
           "SGPAState", "SGPAStrategy"]
