"""Out-of-distribution detection: detector scores by name (higher = more in-distribution) and
the OOD report (every detector's AUROC, AUPR-In/Out, FPR95 on an ID and an OOD set).

>>> import torch
>>> from gpattn_ppl.ood import ood_score
>>> ood_score("entropy", torch.tensor([[0.5, 0.5]])).tolist() == [-0.6931471805599453]
True
"""

from .report import ood_report
from .scores import DETECTOR_NAMES, SCORE_NAMES, kl_matching_templates, ood_score
from .shift import CGPT_CATEGORIES, SHIFT_METRICS, shift_summary

__all__ = ["CGPT_CATEGORIES", "DETECTOR_NAMES", "SCORE_NAMES", "SHIFT_METRICS",
           "kl_matching_templates", "ood_report", "ood_score", "shift_summary"]
