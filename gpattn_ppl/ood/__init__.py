"""Out-of-distribution detection: detector scores by name (higher = more in-distribution), the
detector registry (:func:`register_ood_detector`: a detector of yours, usable in
``eval.ood_detectors`` and the figures through ``--import``) and the OOD report (every
detector's AUROC, AUPR-In/Out, FPR95 on an ID and an OOD set).

>>> import torch
>>> from gpattn_ppl.ood import ood_score
>>> ood_score("entropy", torch.tensor([[0.5, 0.5]])).tolist() == [-0.6931471805599453]
True
"""

from .registry import (
    DETECTOR_NAMES,
    DETECTOR_NEEDS,
    OOD_DETECTORS,
    SCORE_NAMES,
    OODDetector,
    register_ood_detector,
)
from .report import ood_report
from .scores import kl_matching_templates, ood_score
from .shift import CGPT_CATEGORIES, SHIFT_METRICS, shift_summary

__all__ = ["CGPT_CATEGORIES", "DETECTOR_NAMES", "DETECTOR_NEEDS", "OOD_DETECTORS", "OODDetector",
           "SCORE_NAMES", "SHIFT_METRICS", "kl_matching_templates", "ood_report", "ood_score",
           "register_ood_detector", "shift_summary"]
