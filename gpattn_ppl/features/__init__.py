"""Inducing / inter-domain features of the GP attention units."""

from .kernel_eigen import FEATURE_MAPS, KernelEigenFeatures

__all__ = ["FEATURE_MAPS", "KernelEigenFeatures"]

from .inducing_keys import GlobalInducingKeys  # noqa: E402

__all__ += ["GlobalInducingKeys"]
