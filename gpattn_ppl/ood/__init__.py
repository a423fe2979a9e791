"""Out-of-distribution detector scores by name (higher = more in-distribution).

>>> import torch
>>> from gpattn_ppl.ood import ood_score
>>> ood_score("entropy", torch.tensor([[0.5, 0.5]])).tolist() == [-0.6931471805599453]
True
"""

from .scores import SCORE_NAMES, kl_matching_templates, ood_score

__all__ = ["SCORE_NAMES", "kl_matching_templates", "ood_score"]
