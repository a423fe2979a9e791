r"""OOD detector scores by name; higher = more in-distribution.

Each detector is registered in :data:`~gpattn_ppl.ood.registry.OOD_DETECTORS` with
:func:`~gpattn_ppl.ood.registry.register_ood_detector` (so is a detector of yours, see
:mod:`gpattn_ppl.ood.registry`), and :func:`ood_score` looks the name up there. The built-in
detectors use the model average :math:`\bar p_i = \frac1T \sum_t p_{t,i}` of ``T`` passes
(:doc:`/metrics`; names as in pytorch-ood where they exist):

=================  =========================================================================
name               score :math:`s_i`
=================  =========================================================================
``max_softmax``    :math:`\max_k \bar p_{ik}` (MSP, Hendrycks & Gimpel 2017)
``entropy``        :math:`\sum_k \bar p_{ik} \log \bar p_{ik}` (negative predictive entropy)
``energy``         :math:`\log \sum_k \exp \bar\ell_{ik}`, :math:`\bar\ell = \frac1T\sum_t \ell_t`
                   the MC-mean logits, temperature 1 (Liu et al. 2020) [ours for ``T > 1``]
``kl_matching``    :math:`-\mathrm{KL}(\bar p_i \,\|\, d_{\hat y_i})`, templates :math:`d_k`
                   from ID *validation* data, see :func:`kl_matching_templates`
                   (Hendrycks et al. 2019)
``mutual_info``    :math:`-\mathrm{MI}_i` (negative mutual information) [ours]
``pred_variance``  :math:`-\frac1K\sum_k \mathrm{Var}_t(p_{t,ik})` (ddof 0) [ours]
``gp_variance``    alias of ``pred_variance``
=================  =========================================================================

``energy`` needs logits, ``kl_matching`` templates; ``mutual_info`` and ``pred_variance`` need
``T > 1`` passes (with ``T = 1`` they are constant and carry no information, so they raise).
Scores are float64 tensors ``[n]`` on the input's device. Complexity: :math:`O(TnK)`.
"""

from __future__ import annotations

import warnings

import torch
from torch import Tensor

from ..metrics.inputs import EPS, SUM_TOL, as_logits, as_probs, top_label
from ..metrics.uncertainty import entropy
from .registry import OOD_DETECTORS, register_ood_detector

__all__ = ["ood_score", "kl_matching_templates"]


def kl_matching_templates(val_probs) -> Tensor:
    r"""Class templates for the KL-matching detector from ID validation predictions.

    .. math::

        d_k = \frac{1}{|V_k|} \sum_{i \in V_k} \bar p_i, \qquad
        V_k = \{i : \hat y_i = k\}

    over the in-distribution **validation** set (never the test set, which would leak the
    evaluation data into the detector). A class that is never predicted on the validation set
    gets the uniform template :math:`1/K` [ours] and a :class:`UserWarning`.

    :param val_probs: validation probabilities ``[n, K]`` or ``[T, n, K]``.
    :returns: templates ``[K, K]`` (row ``k`` = :math:`d_k`), float64.

    >>> kl_matching_templates(torch.tensor([[0.8, 0.2], [0.6, 0.4], [0.1, 0.9]]))
    tensor([[0.7000, 0.3000],
            [0.1000, 0.9000]], dtype=torch.float64)
    """
    pbar = as_probs(val_probs, "val_probs").mean(0)
    k = pbar.shape[-1]
    _, pred = top_label(pbar)
    sums = torch.zeros(k, k, dtype=torch.float64, device=pbar.device).index_add_(0, pred, pbar)
    counts = torch.bincount(pred, minlength=k).to(torch.float64)
    missing = counts == 0
    if bool(missing.any()):
        warnings.warn(
            f"kl_matching_templates: classes {missing.nonzero().flatten().tolist()} are never "
            "predicted on the validation set; using the uniform template for them",
            UserWarning,
            stacklevel=2,
        )
    uniform = torch.full_like(sums, 1.0 / k)
    return torch.where(missing.unsqueeze(-1), uniform, sums / counts.clamp_min(1.0).unsqueeze(-1))


def _check_templates(templates, k: int, device: torch.device) -> Tensor:
    if templates is None:
        raise ValueError(
            "kl_matching needs templates: pass templates=kl_matching_templates("
            "val_probs) computed on ID validation predictions (never on test)"
        )
    d = torch.as_tensor(templates).detach()
    if tuple(d.shape) != (k, k):
        raise ValueError(f"templates must have shape [K, K] = [{k}, {k}], got {tuple(d.shape)}")
    if not d.is_floating_point():
        raise ValueError(f"templates must be floating, got dtype {d.dtype}")
    d = d.to(device=device, dtype=torch.float64)
    if not bool(torch.isfinite(d).all()) or bool((d < 0).any()):
        raise ValueError("templates must be finite and non-negative")
    if (d.sum(-1) - 1.0).abs().max().item() > SUM_TOL:
        raise ValueError("templates rows must sum to 1 (they are class-mean probabilities)")
    return d


def _need_passes(p: Tensor, name: str) -> None:
    if p.shape[0] < 2:
        raise ValueError(
            f"OOD score {name!r} needs T > 1 stochastic passes (probs [T, n, K]); "
            f"got T = {p.shape[0]}, for which it is constant"
        )


@register_ood_detector("max_softmax", label="Max softmax probability")
def _max_softmax(probs: Tensor, logits=None, templates=None) -> Tensor:
    return probs.mean(0).max(-1).values


@register_ood_detector("entropy", label="Negative predictive entropy (nats)")
def _neg_entropy(probs: Tensor, logits=None, templates=None) -> Tensor:
    return -entropy(probs.mean(0))


@register_ood_detector("energy", needs=("logits",), label="Energy score")
def _energy(probs: Tensor, logits: Tensor, templates=None) -> Tensor:
    return torch.logsumexp(logits.mean(0), dim=-1)


@register_ood_detector("kl_matching", needs=("templates",),
                       label="Negative KL to the class template")
def _kl_matching(probs: Tensor, logits=None, templates: Tensor | None = None) -> Tensor:
    pbar = probs.mean(0)
    _, pred = top_label(pbar)
    log_ratio = pbar.clamp_min(EPS).log() - templates[pred].clamp_min(EPS).log()
    return -(pbar * log_ratio).sum(-1)


@register_ood_detector("mutual_info", needs=("passes",),
                       label="Negative mutual information (nats)")
def _neg_mutual_info(probs: Tensor, logits=None, templates=None) -> Tensor:
    return -(entropy(probs.mean(0)) - entropy(probs).mean(0)).clamp_min(0.0)


@register_ood_detector("pred_variance", needs=("passes",), aliases=("gp_variance",),
                       label="Negative predictive variance")
def _neg_pred_variance(probs: Tensor, logits=None, templates=None) -> Tensor:
    return -probs.var(0, correction=0).mean(-1)


def ood_score(name: str, probs, logits=None, templates=None) -> Tensor:
    r"""Compute the OOD score ``name`` for each sample; higher = more in-distribution.

    See the module table for the definitions, e.g. for ``kl_matching``

    .. math::

        s_i = -\sum_k \bar p_{ik} \bigl(\log \bar p_{ik} - \log d_{\hat y_i k}\bigr)

    (probabilities and templates clamped at :math:`10^{-12}` inside the logarithms). The
    detector is looked up in :data:`~gpattn_ppl.ood.registry.OOD_DETECTORS`: its declared
    ``needs`` are checked, its function is called with the checked inputs, and its score is
    negated if it was registered with ``higher_is_ood=True``.

    :param name: one of :data:`~gpattn_ppl.ood.registry.SCORE_NAMES` (the registered names).
    :param probs: class probabilities ``[n, K]`` or ``[T, n, K]``.
    :param logits: logits of the same shape, required for ``energy`` (and any detector that
        needs logits).
    :param templates: ``[K, K]`` from :func:`kl_matching_templates`, required for ``kl_matching``
        (and any detector that needs templates).
    :returns: scores ``[n]`` (float64).
    :raises ValueError: unknown name (the message lists the registered names), missing logits
        or templates, ``T = 1`` for ``mutual_info``/``pred_variance``, malformed input, or a
        detector returning a score that is not ``[n]``.

    >>> ood_score("max_softmax", torch.tensor([[0.7, 0.3], [0.5, 0.5]]))
    tensor([0.7000, 0.5000], dtype=torch.float64)
    """
    det = OOD_DETECTORS.get(name) if isinstance(name, str) else None
    if det is None:
        raise ValueError(f"unknown OOD score {name!r}; allowed: {', '.join(OOD_DETECTORS)}")
    p = as_probs(probs)
    z = d = None
    if "logits" in det.needs:
        if logits is None:
            raise ValueError(f"OOD score {name!r} needs logits ([T, n, K] or [n, K])")
        z = as_logits(logits, p.shape)
    if "templates" in det.needs:
        d = _check_templates(templates, p.shape[-1], p.device)
    if det.multi_pass:
        _need_passes(p, name)
    s = det.score(p, logits=z, templates=d)
    if not isinstance(s, Tensor) or tuple(s.shape) != (p.shape[1],):
        shape = tuple(s.shape) if isinstance(s, Tensor) else type(s).__name__
        raise ValueError(f"OOD detector {name!r} must return a tensor of shape [n] = "
                         f"[{p.shape[1]}], got {shape}")
    s = s.to(torch.float64)
    return -s if det.higher_is_ood else s
