"""Pyro-side distributions: a numerically safe relaxed one-hot categorical in log space."""

from .relaxed_one_hot import SafeRelaxedOneHotCategorical, relaxed_scores, sample_gumbel

__all__ = ["SafeRelaxedOneHotCategorical", "relaxed_scores", "sample_gumbel"]
