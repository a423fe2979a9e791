"""Distributions of the units: the numerically safe relaxed one-hot categorical in log space
(Gumbel units), the whitened standard-normal prior (SGPA), the token-correlated matrix normal
(correlated-GP predictives, SGPA inducing values) and :class:`AttentionPredictive`, the one
predictive type of every unit."""

from .attention_predictive import AttentionPredictive
from .mvn import SharedScaleMVN, StandardNormalMVN
from .relaxed_one_hot import SafeRelaxedOneHotCategorical, relaxed_scores, sample_gumbel
from .token_normal import TokenNormal

__all__ = ["AttentionPredictive", "SafeRelaxedOneHotCategorical", "SharedScaleMVN", "StandardNormalMVN",
           "TokenNormal", "relaxed_scores", "sample_gumbel"]
