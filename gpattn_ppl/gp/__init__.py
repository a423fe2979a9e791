"""Gaussian-process conditionals that are not variational: the exact correlated GP of CGPT and
its sparse (DTC) version of SCGPT. Neither has a q(u): attention is the GP's cross-covariance
prediction, and each exposes the CGP bound as a regulariser."""

from .correlated_gp import CGPTerms, CorrelatedGP, KernelTerms
from .scales import CorrelatedScales
from .sparse_correlated_gp import SCGPTerms, SparseCorrelatedGP

__all__ = ["CGPTerms", "CorrelatedGP", "CorrelatedScales", "KernelTerms", "SCGPTerms",
           "SparseCorrelatedGP"]
