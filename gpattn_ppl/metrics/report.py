r"""One entry point for classification evaluation: :func:`classification_report`.

It follows the protocol of ``docs/metrics.rst`` (as :func:`gpattn_ppl.ood.ood_report` does for OOD detection):
probabilities of ``T`` passes are averaged first (Bayesian model average :math:`\bar p_i = \frac1T \sum_t p_{t,i}`; ``average="logits"`` uses
:math:`\mathrm{softmax}(\frac1T \sum_t \ell_{t,i})` instead, as KEP-SVGP does), and every metric is
computed once over the whole evaluation set, in float64, returned as a Python ``float``.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Literal

import torch

from . import _binary
from ._validation import as_labels, as_logits, as_probs, top_label
from .calibration import _calibration_error, _check_bins
from .classification import (
    accuracy,
    brier_score,
    matthews_corrcoef,
    negative_log_likelihood,
)
from .selective import _aurc, _eaurc
from .uncertainty import entropy

__all__ = ["METRIC_NAMES", "HIGHER_IS_BETTER", "classification_report"]

#: Display name of every metric key produced by :func:`classification_report` (first block) and
#: of the per-detector keys of :func:`gpattn_ppl.ood.ood_report` (last four), for result tables.
METRIC_NAMES: dict[str, str] = {
    "acc": "Accuracy",
    "mcc": "MCC",
    "nll": "NLL",
    "brier": "Brier",
    "ece": "ECE",
    "mce": "MCE",
    "aurc": "AURC",
    "eaurc": "E-AURC",
    "fail_auroc": "Failure AUROC",
    "fail_aupr_success": "AUPR-Success",
    "fail_aupr_error": "AUPR-Error",
    "fail_fpr95": "Failure FPR95",
    "entropy": "Predictive entropy",
    "mutual_info": "Mutual information",
    "pred_std": "Predicted-class std",
    "auroc": "AUROC",
    "aupr_in": "AUPR-In",
    "aupr_out": "AUPR-Out",
    "fpr95": "FPR95",
}

#: ``True`` if larger is better, ``False`` if smaller is better, ``None`` for descriptive
#: uncertainty summaries (entropy, MI, std) that have no better direction on their own.
HIGHER_IS_BETTER: dict[str, bool | None] = {
    "acc": True,
    "mcc": True,
    "nll": False,
    "brier": False,
    "ece": False,
    "mce": False,
    "aurc": False,
    "eaurc": False,
    "fail_auroc": True,
    "fail_aupr_success": True,
    "fail_aupr_error": True,
    "fail_fpr95": False,
    "entropy": None,
    "mutual_info": None,
    "pred_std": None,
    "auroc": True,
    "aupr_in": True,
    "aupr_out": True,
    "fpr95": False,
}

_CLASSIFICATION = (
    "acc",
    "mcc",
    "nll",
    "brier",
    "ece",
    "mce",
    "aurc",
    "eaurc",
    "fail_auroc",
    "fail_aupr_success",
    "fail_aupr_error",
    "fail_fpr95",
    "entropy",
    "mutual_info",
    "pred_std",
)
# names used in experiment configs -> canonical name; the result keeps the alias
_ALIASES = {"auroc": "fail_auroc", "fpr95": "fail_fpr95", "accuracy": "acc"}

#: every name :func:`classification_report` accepts in ``metrics`` (the metrics, then the
#: aliases), as checked for ``eval.metrics`` of an experiment config.
CONFIG_METRICS: tuple[str, ...] = (*_CLASSIFICATION, *_ALIASES)


def classification_report(
    probs,
    labels,
    logits=None,
    metrics: Iterable[str] | None = None,
    *,
    average: Literal["probs", "logits"] = "probs",
    n_bins: int = 15,
) -> dict[str, float]:
    r"""Every classification, calibration, selective and uncertainty metric, by name.

    ====================== ==================================================================
    key                    definition (module)
    ====================== ==================================================================
    ``acc``                top-1 accuracy (:mod:`~gpattn_ppl.metrics.classification`)
    ``mcc``                Matthews correlation, 0 if the denominator is 0
    ``nll``                :math:`-\frac1n\sum_i \log\max(\bar p_{iy_i}, 10^{-12})`
    ``brier``              :math:`\frac1n\sum_i\sum_k(\bar p_{ik}-1[y_i=k])^2`
    ``ece`` / ``mce``      top-label, ``n_bins`` bins :math:`((m-1)/M, m/M]`
                           (:mod:`~gpattn_ppl.metrics.calibration`)
    ``aurc`` / ``eaurc``   stable sort by confidence, ties by index; ``eaurc`` is ``nan`` if
                           every prediction is wrong (:mod:`~gpattn_ppl.metrics.selective`)
    ``fail_*``             failure prediction from the confidence: ``fail_auroc``,
                           ``fail_aupr_success``, ``fail_aupr_error``, ``fail_fpr95``
                           (:mod:`~gpattn_ppl.metrics.failure`; ``nan`` when undefined)
    ``entropy``            mean predictive entropy :math:`\frac1n\sum_i\mathcal H[\bar p_i]`
    ``mutual_info``        mean of :math:`\mathcal H[\bar p_i]-\frac1T\sum_t\mathcal H[p_{t,i}]`
    ``pred_std``           mean over samples of the std (ddof 0) across passes of
                           :math:`p_{t,i\hat y_i}` (sto-trans)
    ====================== ==================================================================

    The aliases ``auroc`` (= ``fail_auroc``), ``fpr95`` (= ``fail_fpr95``) and ``accuracy``
    (= ``acc``) are accepted, as used in experiment configs; the result keeps the requested key.

    :param probs: per-pass class probabilities ``[T, n, K]``, or ``[n, K]`` for ``T = 1``.
    :param labels: integer labels ``[n]`` in ``[0, K)``.
    :param logits: optional logits with the shape of ``probs``; required for
        ``average="logits"``, otherwise only checked.
    :param metrics: names to compute (default: all 15, in the order above).
    :param average: ``"probs"`` (default, Bayesian model average) or ``"logits"`` (softmax of the
        mean logits, KEP-SVGP's test-time rule). MI and ``pred_std`` always use the per-pass
        probabilities.
    :param n_bins: number of calibration bins (default 15).
    :returns: ``{name: float}`` in the requested order.
    :raises ValueError: unknown metric name (lists the allowed ones) or malformed input.

    Complexity: :math:`O(TnK + n\log n)`.

    >>> p = torch.tensor([[[0.9, 0.1], [0.4, 0.6]], [[0.7, 0.3], [0.2, 0.8]]])
    >>> classification_report(p, torch.tensor([0, 0]), metrics=["acc", "nll"])["acc"]
    0.5
    """
    names = list(_CLASSIFICATION) if metrics is None else list(metrics)
    unknown = [m for m in names if _ALIASES.get(m, m) not in _CLASSIFICATION]
    if unknown:
        raise ValueError(
            f"unknown metric(s) {unknown}; allowed: {', '.join(_CLASSIFICATION)} "
            f"(aliases: {', '.join(_ALIASES)})"
        )
    n_bins = _check_bins(n_bins)
    p = as_probs(probs)
    y = as_labels(labels, p.shape[1], p.shape[2], p.device)
    z = None if logits is None else as_logits(logits, p.shape)
    if average == "probs":
        pbar = p.mean(0)
    elif average == "logits":
        if z is None:
            raise ValueError("average='logits' needs logits")
        pbar = torch.softmax(z.mean(0), dim=-1)
    else:
        raise ValueError(f"average must be 'probs' or 'logits', got {average!r}")
    conf, pred = top_label(pbar)
    correct = pred == y

    def _pred_std() -> float:
        idx = pred.view(1, -1, 1).expand(p.shape[0], -1, 1)
        return float(p.gather(-1, idx).squeeze(-1).std(0, correction=0).mean())

    compute: dict[str, Callable[[], float]] = {
        "acc": lambda: accuracy(pbar, y),
        "mcc": lambda: matthews_corrcoef(pbar, y),
        "nll": lambda: negative_log_likelihood(pbar, y),
        "brier": lambda: brier_score(pbar, y),
        "ece": lambda: float(_calibration_error(conf, correct, n_bins, "l1")),
        "mce": lambda: float(_calibration_error(conf, correct, n_bins, "max")),
        "aurc": lambda: float(_aurc(conf, correct)),
        "eaurc": lambda: float(_eaurc(conf, correct)),
        "fail_auroc": lambda: _binary.auroc(conf, correct),
        "fail_aupr_success": lambda: _binary.aupr(conf, correct),
        "fail_aupr_error": lambda: _binary.aupr(-conf, ~correct),
        "fail_fpr95": lambda: _binary.fpr_at_tpr(conf, correct, 0.95),
        "entropy": lambda: float(entropy(pbar).mean()),
        "mutual_info": lambda: float(
            (entropy(p.mean(0)) - entropy(p).mean(0)).clamp_min(0.0).mean()
        ),
        "pred_std": _pred_std,
    }
    return {m: compute[_ALIASES.get(m, m)]() for m in names}
