r"""Evaluation metrics, computed once over the whole evaluation set (``docs/metrics.rst``).

Every function takes class probabilities ``[n, K]`` (one pass, ``T = 1``) or ``[T, n, K]``
(``T`` stochastic passes, averaged first: :math:`\bar p_i = \frac1T\sum_t p_{t,i}`), integer
labels ``[n]``, works in float64 on the input's device, and returns a Python ``float``
(per-sample uncertainty measures return float64 tensors ``[n]``). Malformed input (shapes,
NaN/inf, rows not summing to 1 within 1e-3, empty arrays, labels out of range) raises
:class:`ValueError` naming the problem.

* :mod:`.classification` -- accuracy, MCC, NLL, Brier;
* :mod:`.calibration` -- top-label ECE / MCE (15 bins ``((m-1)/15, m/15]``), reliability bins,
  and the streaming :class:`CalibrationError` Metric;
* :mod:`.selective` -- risk-coverage curve, AURC, E-AURC, streaming :class:`AURC` Metric;
* :mod:`.failure` -- failure-prediction AUROC, AUPR-Success/Error, FPR95;
* :mod:`.ood_detection` -- OOD AUROC, AUPR-In/Out, FPR95 (ID = positive);
* :mod:`.uncertainty` -- predictive entropy, mutual information, predictive variance/std;
* :mod:`.inputs` -- the input checks of every metric (:func:`as_probs`, ...), for code that
  takes the same inputs (OOD scores, figures);
* :mod:`.temperature` -- temperature scaling of ``T``-pass logits (fit on validation data);
* :mod:`.report` -- :func:`classification_report` (the OOD report is
  :func:`gpattn_ppl.ood.ood_report`);
* :mod:`.records` -- :func:`prediction_records`: the one per-input prediction schema
  (``label``, ``score``, ``probs``, ``entropy``, ``mutual_info``) of ``load_run(...).predict``,
  ``gpattn-ppl predict`` and the Hugging Face pipeline.

>>> import torch
>>> from gpattn_ppl.metrics import classification_report
>>> p = torch.tensor([[0.8, 0.2], [0.3, 0.7], [0.6, 0.4]])
>>> r = classification_report(p, torch.tensor([0, 1, 1]), metrics=["acc", "brier"])
>>> round(r["acc"], 6), round(r["brier"], 6)  # Brier = (0.08 + 0.18 + 0.72) / 3
(0.666667, 0.326667)
"""

from .calibration import (
    CalibrationError,
    bin_index,
    calibration_bins,
    expected_calibration_error,
    maximum_calibration_error,
)
from .classification import accuracy, brier_score, matthews_corrcoef, negative_log_likelihood
from .failure import failure_aupr_error, failure_aupr_success, failure_auroc, failure_fpr95
from .inputs import EPS, SUM_TOL, as_labels, as_logits, as_probs, as_scores, top_label
from .ood_detection import (
    ood_aupr_in,
    ood_aupr_out,
    ood_auroc,
    ood_detection_metrics,
    ood_fpr95,
)
from .records import PREDICTION_KEYS, prediction_records
from .report import HIGHER_IS_BETTER, METRIC_NAMES, classification_report
from .selective import AURC, aurc, eaurc, risk_coverage_curve
from .temperature import (
    TEMPERATURE_RANGE,
    TemperatureWarning,
    apply_temperature,
    check_temperature,
    fit_temperature,
)
from .uncertainty import (
    entropy,
    expected_entropy,
    mutual_information,
    predicted_class_std,
    predictive_entropy,
    predictive_variance,
)

__all__ = [
    "AURC",
    "CalibrationError",
    "EPS",
    "HIGHER_IS_BETTER",
    "METRIC_NAMES",
    "SUM_TOL",
    "TEMPERATURE_RANGE",
    "TemperatureWarning",
    "accuracy",
    "apply_temperature",
    "as_labels",
    "as_logits",
    "as_probs",
    "as_scores",
    "check_temperature",
    "aurc",
    "bin_index",
    "brier_score",
    "calibration_bins",
    "classification_report",
    "eaurc",
    "entropy",
    "expected_calibration_error",
    "expected_entropy",
    "failure_aupr_error",
    "failure_aupr_success",
    "failure_auroc",
    "failure_fpr95",
    "fit_temperature",
    "matthews_corrcoef",
    "maximum_calibration_error",
    "mutual_information",
    "negative_log_likelihood",
    "ood_aupr_in",
    "ood_aupr_out",
    "ood_auroc",
    "ood_detection_metrics",
    "ood_fpr95",
    "PREDICTION_KEYS",
    "prediction_records",
    "predicted_class_std",
    "predictive_entropy",
    "predictive_variance",
    "risk_coverage_curve",
    "top_label",
]
