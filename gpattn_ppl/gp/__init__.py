"""Gaussian-process heads: the GP-head type every GP attention unit runs
(:class:`~gpattn_ppl.gp.head.GPHead`), and the conditionals that are not variational -- the exact
correlated GP of CGPT and its sparse (DTC) version of SCGPT. Neither has a q(u): attention is the
GP's cross-covariance prediction, and each exposes the CGP bound as a regulariser."""

from .correlated_gp import CGPTState, CorrelatedGP, CorrelatedHead, KernelState
from .head import GPHead, Sample
from .scales import CorrelatedScales
from .sparse_correlated_gp import SCGPTState, SparseCorrelatedGP

__all__ = ["CGPTState", "CorrelatedGP", "CorrelatedHead", "CorrelatedScales", "GPHead",
           "KernelState", "SCGPTState", "Sample", "SparseCorrelatedGP"]
