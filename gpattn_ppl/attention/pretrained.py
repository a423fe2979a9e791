"""Initialising a unit from a pretrained softmax self-attention layer.

A pretrained layer is read into :class:`SoftmaxWeights` (projections ``W_q, W_k, W_v, W_O`` with
their biases); :func:`init_from_softmax` copies into a unit what it has of them and, given the
layer's inputs on a calibration batch, fits the unit's GP-specific parameters so that its
posterior-mean output is as close to the pretrained layer's as the unit allows.
``docs/derivations/pretrained_init.rst`` derives each rule. Each rule lives in its unit's module,
registered with :func:`register_pretrained_init` (as a plug-in unit registers its own); this
module holds the registry, the weights type and the shared steps the rules are made of.

Rules (``x`` = the layer's inputs on the calibration batch, ``A = softmax(q k^T / sqrt(D))``):

========================  ==================================================================
unit                      carried over / fitted
========================  ==================================================================
softmax                   everything, exactly
gumbel                    everything; ``W_q, b_q`` scaled by :math:`1/\\sqrt D` (the unit has
                          no scale, :math:`\\tau` replaces it): exact at the modal noise
h_gumbel                  as gumbel; centroids: k-means of the pretrained keys of ``x``
kernel                    ``W_q, W_k`` (``symmetric``: ``W_qk = c W_q``, ``c`` searched), ``W_v``, ``W_O``;
                          ``b_v`` folded into ``b_O`` (:math:`A\\mathbf 1 = \\mathbf 1`);
                          ``b_q, b_k`` dropped; per-head value gain (unnormalised kernel)
sgpa                      ``W_qk = c W_q`` (``c`` searched), ``W_v``, ``W_O``, ``b_v`` folded;
                          inducing keys: tokens of ``x``; inducing weights 0; per-head value
                          gain; noise shrunk to ``NOISE_TARGET``
cgpt, scgpt               ``W_q, W_k`` scaled by :math:`D^{-1/4}`, latent ``W_o = W_k``
                          (scaled), ``W_v``, ``W_O``, ``b_v`` folded; SCGPT inducing inputs from
                          ``x``; per-head value gain; noise shrunk to ``NOISE_TARGET``
kep_svgp                  ``W_q, W_k`` into the feature projection; ``W_e, W_r, \\Lambda``: the
                          top-s singular triple of the pooled cross matrix
                          :math:`\\Phi_q^\\top\\Phi_k` (the KSVD primal solution); ``W_add``: least
                          squares onto the pretrained head outputs; ``W_O``, ``b_v`` folded;
                          noise shrunk to ``NOISE_TARGET`` (the q(u) covariance factor)
========================  ==================================================================

The value gain of head h is :math:`g_h = \\langle H_h, H^\\text{ref}_h\\rangle /
\\lVert H_h\\rVert^2` over the real tokens (``H`` the unit's posterior-mean head outputs
``[B, H, N, D]``, ``H^ref = A (x W_v^T)``), applied to the head's rows of ``W_v``: the mean of
every unit with values is linear in them.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from .. import settings
from .base import AttentionUnit, RotaryPositions

__all__ = ["NOISE_TARGET", "QUERY_SCALES", "SoftmaxWeights", "copy_output_projection",
           "copy_qkv", "dropped_biases", "fit_value_gain", "init_from_softmax", "mean_gap",
           "noise_excess", "pretrained_rule", "register_pretrained_init", "relative_error",
           "require_exponential_kernel", "search_query_scale", "shrink_noise"]


@dataclass
class SoftmaxWeights:
    r"""The projections of a pretrained multi-head softmax self-attention layer.

    .. math::
        \mathrm{out} = \mathrm{concat}_h\big(\mathrm{softmax}(s\,q_h k_h^\top + M)\,v_h\big)
        W_O^\top + b_O,\qquad q = xW_q^\top + b_q,\ k = xW_k^\top + b_k,\ v = xW_v^\top + b_v

    with ``[C, C]`` weights (rows head-major: head h owns rows ``h D .. (h+1) D - 1``), ``[C]``
    biases or ``None``, and the logit scale ``s`` (default :math:`1/\sqrt D`). ``rotary``: the
    rotary position embeddings of one batch (:class:`~gpattn_ppl.attention.RotaryPositions`)
    that the layer applies to ``q`` and ``k`` (ModernBERT); set for a calibration batch only.
    """

    q_weight: torch.Tensor
    k_weight: torch.Tensor
    v_weight: torch.Tensor
    out_weight: torch.Tensor
    q_bias: torch.Tensor | None
    k_bias: torch.Tensor | None
    v_bias: torch.Tensor | None
    out_bias: torch.Tensor | None
    heads: int
    scale: float | None = None
    rotary: RotaryPositions | None = None

    def __post_init__(self) -> None:
        C = self.q_weight.shape[-1]
        for name in ("q_weight", "k_weight", "v_weight", "out_weight"):
            if tuple(getattr(self, name).shape) != (C, C):
                raise ValueError(f"SoftmaxWeights.{name}: expected [{C}, {C}], got "
                                 f"{tuple(getattr(self, name).shape)}")
        for name in ("q_bias", "k_bias", "v_bias", "out_bias"):
            b = getattr(self, name)
            if b is not None and tuple(b.shape) != (C,):
                raise ValueError(f"SoftmaxWeights.{name}: expected [{C}], got {tuple(b.shape)}")
        if self.heads <= 0 or C % self.heads:
            raise ValueError(f"SoftmaxWeights: width {C} is not a multiple of heads {self.heads}")
        if self.scale is None:
            self.scale = 1.0 / math.sqrt(C // self.heads)

    @property
    def dim(self) -> int:
        return self.q_weight.shape[-1]

    @property
    def head_dim(self) -> int:
        return self.dim // self.heads

    def _split(self, t: torch.Tensor) -> torch.Tensor:
        B, N, _ = t.shape
        return t.view(B, N, self.heads, self.head_dim).transpose(1, 2)

    def attention(self, x: torch.Tensor, mask: torch.Tensor | None) -> torch.Tensor:
        """The attention matrix ``A`` ``[B, H, N, N]`` at ``x [B, N, C]`` (padded keys 0)."""
        q = self._split(F.linear(x, self.q_weight, self.q_bias))
        k = self._split(F.linear(x, self.k_weight, self.k_bias))
        if self.rotary is not None:
            q, k = self.rotary.apply(q), self.rotary.apply(k)
        logits = self.scale * (q @ k.mT)
        if mask is not None:
            logits = logits.masked_fill(~mask[:, None, None, :], float("-inf"))
        return torch.softmax(logits, -1)

    def head_outputs(self, x: torch.Tensor, mask: torch.Tensor | None, *,
                     value_bias: bool = True) -> torch.Tensor:
        """``A v`` ``[B, H, N, D]``; ``value_bias=False`` leaves ``b_v`` out (it is then
        :math:`W_O b_v` in the output bias, as rows of ``A`` sum to 1)."""
        v = F.linear(x, self.v_weight, self.v_bias if value_bias else None)
        return self.attention(x, mask) @ self._split(v)

    def output(self, x: torch.Tensor, mask: torch.Tensor | None) -> torch.Tensor:
        """The layer's output ``[B, N, C]`` (no dropout)."""
        h = self.head_outputs(x, mask)
        B, H, N, D = h.shape
        return F.linear(h.transpose(1, 2).reshape(B, N, H * D), self.out_weight, self.out_bias)

    def folded_out_bias(self) -> torch.Tensor:
        r""":math:`b_O + W_O b_v`: the output bias of a unit without a value bias."""
        b = self.out_bias if self.out_bias is not None else self.out_weight.new_zeros(self.dim)
        return b if self.v_bias is None else b + self.out_weight @ self.v_bias


def relative_error(out: torch.Tensor, ref: torch.Tensor, mask: torch.Tensor | None) -> float:
    r""":math:`\lVert \mathrm{out} - \mathrm{ref}\rVert_F / \lVert \mathrm{ref}\rVert_F` over
    the real tokens of ``[B, N, C]`` outputs."""
    if mask is not None:
        out, ref = out[mask], ref[mask]
    return float((out - ref).norm() / ref.norm().clamp_min(1e-30))


#: unit class -> rule ``(unit, weights, x, mask) -> report``; looked up along the MRO
_RULES: dict[type, Callable] = {}


def register_pretrained_init(cls: type):
    """Decorator registering ``rule(unit, weights, x, mask) -> dict`` as the pretrained
    initialisation of unit class ``cls`` (and its subclasses without a rule of their own).

    The rule copies what it can from ``weights`` (:class:`SoftmaxWeights`) and, when ``x``
    (``[B, N, C]``, the layer's inputs on a calibration batch) is given, fits the rest; it
    returns ``{"copied": [...], "fitted": [...], "not_carried": [...]}`` (parameter names and
    what was dropped, for the swap report).
    """

    def wrap(rule):
        _RULES[cls] = rule
        return rule

    return wrap


def pretrained_rule(cls: type) -> Callable:
    """The rule registered for ``cls`` or its nearest base class (a subclass's rule may build on
    its base's).

    :raises ValueError: no class in ``cls``'s MRO has a rule.
    """
    rule = next((_RULES[c] for c in cls.__mro__ if c in _RULES), None)
    if rule is None:
        raise ValueError(f"no pretrained initialisation for {cls.__name__}")
    return rule


@torch.no_grad()
def init_from_softmax(unit: AttentionUnit, weights: SoftmaxWeights, x: torch.Tensor | None = None,
                      mask: torch.Tensor | None = None) -> dict:
    """Initialise ``unit`` from a pretrained softmax layer (see the module docstring).

    :param unit: an attention unit of the same width and head count as the layer.
    :param weights: the layer's projections (with ``rotary``, the positions of the calibration
        batch of a layer that rotates queries and keys: the rule then runs inside
        ``unit.positions(weights.rotary)``).
    :param x: the layer's inputs on a calibration batch ``[B, N, C]`` (optional: without it,
        only the copies are made and the data-dependent parts keep their defaults).
    :param mask: ``[B, N]`` bool, True on real tokens.
    :returns: the rule's report, plus ``"kind"``.
    :raises ValueError: width or heads differ, or the unit's class has no rule.
    """
    where = unit.site_prefix or type(unit).__name__
    if unit.dim != weights.dim or unit.heads != weights.heads:
        raise ValueError(f"{where}: the unit has width {unit.dim} and {unit.heads} heads, the "
                         f"pretrained layer {weights.dim} and {weights.heads}")
    rule = next((_RULES[c] for c in type(unit).__mro__ if c in _RULES), None)
    if rule is None:
        raise ValueError(f"{where}: no pretrained initialisation for {type(unit).__name__} "
                         f"(kind {getattr(unit, 'kind', '?')!r}); use init='random' or "
                         "register one with gpattn_ppl.attention.register_pretrained_init")
    param = next(unit.parameters())
    w = SoftmaxWeights(*(None if t is None else t.detach().to(param) for t in (
        weights.q_weight, weights.k_weight, weights.v_weight, weights.out_weight,
        weights.q_bias, weights.k_bias, weights.v_bias, weights.out_bias)),
        heads=weights.heads, scale=weights.scale, rotary=weights.rotary)
    if x is not None:
        x = x.detach().to(param)
    was_training = unit.training
    unit.eval()
    try:
        with unit.positions(w.rotary if w.rotary is not None else unit._rotary):
            report = rule(unit, w, x, mask)
    finally:
        unit.train(was_training)
    return {"kind": getattr(unit, "kind", type(unit).__name__), **report}


# -- helpers ----------------------------------------------------------------------------------

def copy_output_projection(unit, w: SoftmaxWeights, fold_value_bias: bool) -> None:
    """``W_O`` into ``unit.out``, and ``b_O`` (``fold_value_bias``: :math:`b_O + W_O b_v`, for a
    unit without a value bias)."""
    unit.out.weight.copy_(w.out_weight)
    if unit.out.bias is not None:
        unit.out.bias.copy_(w.folded_out_bias() if fold_value_bias else
                            (w.out_bias if w.out_bias is not None else 0.0))


def require_exponential_kernel(unit) -> None:
    """Refuse a unit whose kernel is not the exponential one (a softmax layer maps onto it)."""
    if unit.kernel_name != "exponential":
        raise ValueError(f"{unit.site_prefix or type(unit).__name__}: a pretrained softmax layer "
                         f"maps onto the exponential kernel only, not {unit.kernel_name!r}")


def dropped_biases(w: SoftmaxWeights, names) -> list[str]:
    """``["b_q", ...]``: the biases among ``names`` (``"q"``, ``"k"``) the layer has and a unit
    without them drops (for the report)."""
    return [f"b_{n}" for n in names if getattr(w, f"{n}_bias") is not None]


def fit_value_gain(unit, w: SoftmaxWeights, x, mask, v_rows: slice) -> list[float]:
    """Fit and apply the per-head value gain :math:`g_h` (see the module docstring) to the
    rows ``v_rows`` of ``unit.proj.weight``; returns the gains."""
    with settings.posterior_mean():
        h = unit.predictive(x, mask).mean.to(x.dtype)                    # [B, H, N, D]
    ref = w.head_outputs(x, mask, value_bias=False)
    if mask is not None:
        real = mask[:, None, :, None].to(h.dtype)
        h, ref = h * real, ref * real
    num = (h * ref).sum((0, 2, 3))
    den = h.square().sum((0, 2, 3)).clamp_min(1e-30)
    gain = num / den                                                     # [H]
    rows = unit.proj.weight[v_rows].view(unit.heads, unit.head_dim, -1)
    rows.mul_(gain[:, None, None])
    return [round(float(g), 4) for g in gain]


#: query scales tried for units whose kernel ties W_q = W_k (the self term q.q dominates)
QUERY_SCALES = tuple(2.0 ** -i for i in range(7))
#: the relative size of one draw's noise a calibrated unit starts with, at most
NOISE_TARGET = 0.25


@torch.no_grad()
def mean_gap(unit, w: SoftmaxWeights, x, mask) -> float:
    """:func:`relative_error` of the unit's posterior-mean output to the pretrained layer's."""
    with settings.posterior_mean():
        out = unit(x, mask)
    return relative_error(out, w.output(x, mask), mask)


def search_query_scale(unit, w: SoftmaxWeights, x, mask, trial) -> float:
    """The scale ``c`` of :data:`QUERY_SCALES` whose ``trial(c)`` (which re-copies the
    projections scaled by ``c`` and refits) gives the smallest posterior-mean gap on the
    calibration batch; ``trial(c)`` is left applied."""
    gaps = {}
    for c in QUERY_SCALES:
        trial(c)
        gaps[c] = mean_gap(unit, w, x, mask)
    best = min(gaps, key=lambda c: (not math.isfinite(gaps[c]), gaps[c]))
    trial(best)
    return best


def _noise_ratio(draw, mean, ref, mask) -> float:
    if mask is not None:
        draw, mean, ref = draw[mask], mean[mask], ref[mask]
    return float((draw - mean).norm() / ref.norm().clamp_min(1e-30))


@torch.no_grad()
def noise_excess(unit, w: SoftmaxWeights, x, mask, draws: int = 4) -> float:
    """``a`` = (one draw's noise relative to the pretrained output, averaged over ``draws``) /
    ``NOISE_TARGET``, or 1 when that is below the target."""
    with settings.posterior_mean():
        mean = unit(x, mask)
    ref = w.output(x, mask)
    noise = statistics.fmean(_noise_ratio(unit(x, mask), mean, ref, mask)
                             for _ in range(draws))
    if not math.isfinite(noise) or noise <= NOISE_TARGET:
        return 1.0
    return noise / NOISE_TARGET


@torch.no_grad()
def shrink_noise(unit, w: SoftmaxWeights, x, mask, v_rows: slice) -> float:
    r"""Scale the values by :math:`a` and :math:`W_O` by :math:`1/a` so that one draw's noise
    is at most ``NOISE_TARGET`` of the pretrained output: the mean is unchanged and, in units
    whose predictive covariance does not depend on the values (SGPA, CGPT, SCGPT), the noise is
    divided by :math:`a`. Returns :math:`a` (1: already small enough)."""
    a = noise_excess(unit, w, x, mask)
    if a > 1.0:
        unit.proj.weight[v_rows].mul_(a)
        unit.out.weight.div_(a)
    return a


def copy_qkv(unit, w: SoftmaxWeights, q_scale: float) -> None:
    """The fused ``qkv`` (weights and biases) of a unit with softmax-shaped projections, the
    queries (weight and bias) scaled by ``q_scale``, and ``W_O``, ``b_O`` as they are."""
    C = unit.dim
    unit.qkv.weight.copy_(torch.cat([w.q_weight * q_scale, w.k_weight, w.v_weight]))
    for i, b in enumerate((w.q_bias, w.k_bias, w.v_bias)):
        if b is None:
            unit.qkv.bias[i * C:(i + 1) * C].zero_()
        else:
            unit.qkv.bias[i * C:(i + 1) * C].copy_(b * q_scale if i == 0 else b)
    copy_output_projection(unit, w, fold_value_bias=False)
