"""Initialising a unit from a pretrained softmax self-attention layer.

A pretrained layer is read into :class:`SoftmaxWeights` (projections ``W_q, W_k, W_v, W_O`` with
their biases); :func:`init_from_softmax` copies into a unit what it has of them and, given the
layer's inputs on a calibration batch, fits the unit's GP-specific parameters so that its
posterior-mean output is as close to the pretrained layer's as the unit allows.
``docs/derivations/pretrained_init.rst`` derives each rule; :func:`register_pretrained_init`
adds the rule of a plug-in unit.

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
from .base import AttentionUnit
from .cgpt import _CorrelatedAttention
from .gumbel import GumbelAttention
from .h_gumbel import HierarchicalGumbelAttention
from .kep_svgp import KEPSVGPAttention
from .kernel import KernelAttention
from .scgpt import SCGPTAttention
from .sgpa import SGPAttention
from .softmax import SoftmaxAttention

__all__ = ["SoftmaxWeights", "init_from_softmax", "register_pretrained_init", "relative_error"]


@dataclass
class SoftmaxWeights:
    r"""The projections of a pretrained multi-head softmax self-attention layer.

    .. math::
        \mathrm{out} = \mathrm{concat}_h\big(\mathrm{softmax}(s\,q_h k_h^\top + M)\,v_h\big)
        W_O^\top + b_O,\qquad q = xW_q^\top + b_q,\ k = xW_k^\top + b_k,\ v = xW_v^\top + b_v

    with ``[C, C]`` weights (rows head-major: head h owns rows ``h D .. (h+1) D - 1``), ``[C]``
    biases or ``None``, and the logit scale ``s`` (default :math:`1/\sqrt D`).
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


@torch.no_grad()
def init_from_softmax(unit: AttentionUnit, weights: SoftmaxWeights, x: torch.Tensor | None = None,
                      mask: torch.Tensor | None = None) -> dict:
    """Initialise ``unit`` from a pretrained softmax layer (see the module docstring).

    :param unit: an attention unit of the same width and head count as the layer.
    :param weights: the layer's projections.
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
        heads=weights.heads, scale=weights.scale)
    if x is not None:
        x = x.detach().to(param)
    was_training = unit.training
    unit.eval()
    try:
        report = rule(unit, w, x, mask)
    finally:
        unit.train(was_training)
    return {"kind": getattr(unit, "kind", type(unit).__name__), **report}


# -- helpers ----------------------------------------------------------------------------------

def _copy_out(unit, w: SoftmaxWeights, fold_value_bias: bool) -> None:
    unit.out.weight.copy_(w.out_weight)
    if unit.out.bias is not None:
        unit.out.bias.copy_(w.folded_out_bias() if fold_value_bias else
                            (w.out_bias if w.out_bias is not None else 0.0))


def _require_exponential(unit) -> None:
    if unit.kernel_name != "exponential":
        raise ValueError(f"{unit.site_prefix or type(unit).__name__}: a pretrained softmax layer "
                         f"maps onto the exponential kernel only, not {unit.kernel_name!r}")


def _dropped(w: SoftmaxWeights, names) -> list[str]:
    return [f"b_{n}" for n in names if getattr(w, f"{n}_bias") is not None]


def _value_gain(unit, w: SoftmaxWeights, x, mask, v_rows: slice) -> list[float]:
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
def _mean_gap(unit, w: SoftmaxWeights, x, mask) -> float:
    with settings.posterior_mean():
        out = unit(x, mask)
    return relative_error(out, w.output(x, mask), mask)


def _search_query_scale(unit, w: SoftmaxWeights, x, mask, trial) -> float:
    """The scale ``c`` of :data:`QUERY_SCALES` whose ``trial(c)`` (which re-copies the
    projections scaled by ``c`` and refits) gives the smallest posterior-mean gap on the
    calibration batch; ``trial(c)`` is left applied."""
    gaps = {}
    for c in QUERY_SCALES:
        trial(c)
        gaps[c] = _mean_gap(unit, w, x, mask)
    best = min(gaps, key=lambda c: (not math.isfinite(gaps[c]), gaps[c]))
    trial(best)
    return best


def _noise_ratio(draw, mean, ref, mask) -> float:
    if mask is not None:
        draw, mean, ref = draw[mask], mean[mask], ref[mask]
    return float((draw - mean).norm() / ref.norm().clamp_min(1e-30))


@torch.no_grad()
def _noise_excess(unit, w: SoftmaxWeights, x, mask, draws: int = 4) -> float:
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
def _shrink_noise(unit, w: SoftmaxWeights, x, mask, v_rows: slice) -> float:
    r"""Scale the values by :math:`a` and :math:`W_O` by :math:`1/a` so that one draw's noise
    is at most ``NOISE_TARGET`` of the pretrained output: the mean is unchanged and, in units
    whose predictive covariance does not depend on the values (SGPA, CGPT, SCGPT), the noise is
    divided by :math:`a`. Returns :math:`a` (1: already small enough)."""
    a = _noise_excess(unit, w, x, mask)
    if a > 1.0:
        unit.proj.weight[v_rows].mul_(a)
        unit.out.weight.div_(a)
    return a


# -- rules --------------------------------------------------------------------------------------

def _copy_qkv(unit, w: SoftmaxWeights, q_scale: float) -> None:
    """The fused ``qkv`` (weights and biases) of a unit with softmax-shaped projections, the
    queries (weight and bias) scaled by ``q_scale``, and ``W_O``, ``b_O`` as they are."""
    C = unit.dim
    unit.qkv.weight.copy_(torch.cat([w.q_weight * q_scale, w.k_weight, w.v_weight]))
    for i, b in enumerate((w.q_bias, w.k_bias, w.v_bias)):
        if b is None:
            unit.qkv.bias[i * C:(i + 1) * C].zero_()
        else:
            unit.qkv.bias[i * C:(i + 1) * C].copy_(b * q_scale if i == 0 else b)
    _copy_out(unit, w, fold_value_bias=False)


@register_pretrained_init(SoftmaxAttention)
def _softmax(unit: SoftmaxAttention, w: SoftmaxWeights, x, mask) -> dict:
    # the unit scales by 1/sqrt(D): a non-standard scale s is folded into the queries
    _copy_qkv(unit, w, w.scale * math.sqrt(unit.head_dim))
    return {"copied": ["W_q", "b_q", "W_k", "b_k", "W_v", "b_v", "W_O", "b_O"], "fitted": [],
            "not_carried": []}


@register_pretrained_init(GumbelAttention)
def _gumbel(unit: GumbelAttention, w: SoftmaxWeights, x, mask) -> dict:
    _copy_qkv(unit, w, w.scale)       # no 1/sqrt(D) in the unit: tau takes its place
    return {"copied": ["W_q (x 1/sqrt(D))", "b_q (x 1/sqrt(D))", "W_k", "b_k", "W_v", "b_v",
                       "W_O", "b_O"], "fitted": [], "not_carried": []}


@register_pretrained_init(HierarchicalGumbelAttention)
def _h_gumbel(unit: HierarchicalGumbelAttention, w: SoftmaxWeights, x, mask) -> dict:
    report = _gumbel(unit, w, x, mask)
    if x is not None:
        unit.init_centroids(x, mask)
        report["fitted"] = ["centroids (k-means of the pretrained keys)"]
    return report


@register_pretrained_init(KernelAttention)
def _kernel(unit: KernelAttention, w: SoftmaxWeights, x, mask) -> dict:
    C = unit.dim
    _require_exponential(unit)
    qk = [w.q_weight] if unit.symmetric else [w.q_weight, w.k_weight]
    scale = w.scale * math.sqrt(unit.head_dim)      # the exponential kernel scales by 1/sqrt(D)
    unit.kernel.outputscale = torch.ones(unit.heads)
    v_rows = slice((unit.n_proj - 1) * C, unit.n_proj * C)

    def trial(c: float) -> None:
        unit.proj.weight.copy_(torch.cat([t * (c * math.sqrt(scale)) for t in qk] + [w.v_weight]))
        _copy_out(unit, w, fold_value_bias=True)
        if x is not None and not unit.normalize:
            _value_gain(unit, w, x, mask, v_rows)

    fitted = []
    if x is None or not unit.symmetric:
        trial(1.0)
    else:               # tied W_q = W_k: the self term q.q dominates at c = 1
        c = _search_query_scale(unit, w, x, mask, trial)
        fitted.append(f"W_qk scale c = {c:g} (searched)")
    if x is not None and not unit.normalize:
        fitted.append("W_v (per-head gain)")
    return {"copied": ["W_qk <- W_q" if unit.symmetric else "W_q", *([] if unit.symmetric
                       else ["W_k"]), "W_v", "W_O", "b_O + W_O b_v"], "fitted": fitted,
            "not_carried": _dropped(w, ("q", "k")) + (["W_k"] if unit.symmetric else [])}


@register_pretrained_init(SGPAttention)
def _sgpa(unit: SGPAttention, w: SoftmaxWeights, x, mask) -> dict:
    C = unit.dim
    _require_exponential(unit)
    # the symmetric kernel sees q.q: W_qk = c sqrt(s sqrt(D)) W_q (c = 1 keeps the logits' scale)
    base = w.q_weight * math.sqrt(w.scale * math.sqrt(unit.head_dim))
    _copy_out(unit, w, fold_value_bias=True)
    fitted = []
    if unit.variant == "decoupled" and unit.num_inducing > 0:
        unit.strategy.inducing_weights.zero_()      # the mean is then linear in the values
        fitted.append("inducing weights a_beta = 0")
        if x is not None:
            tokens = x[mask] if mask is not None else x.reshape(-1, C)
            idx = torch.randperm(tokens.shape[0], device=x.device)
            M = unit.num_inducing
            idx = idx[:M] if idx.numel() >= M else idx[torch.arange(M, device=x.device) % idx.numel()]
            Z = unit.strategy.inducing.inducing_inputs                  # [H, M, C]
            Z.copy_(tokens[idx].unsqueeze(0).expand_as(Z))
            fitted.append("inducing keys Z_beta (tokens of the calibration batch)")

    def trial(c: float) -> None:
        unit.proj.weight.copy_(torch.cat([base * c, w.v_weight]))
        _copy_out(unit, w, fold_value_bias=True)
        if x is not None:
            _value_gain(unit, w, x, mask, slice(C, 2 * C))

    if x is None:
        trial(1.0)
    else:
        c = _search_query_scale(unit, w, x, mask, trial)
        a = _shrink_noise(unit, w, x, mask, slice(C, 2 * C))
        fitted += [f"W_qk scale c = {c:g} (searched)", "W_v (per-head gain)",
                   f"noise: W_v x {a:.3g}, W_O / {a:.3g}"]
    return {"copied": ["W_qk <- W_q", "W_v", "W_O", "b_O + W_O b_v"], "fitted": fitted,
            "not_carried": ["W_k"] + _dropped(w, ("q", "k"))}


@register_pretrained_init(_CorrelatedAttention)
def _correlated(unit: _CorrelatedAttention, w: SoftmaxWeights, x, mask) -> dict:
    C = unit.dim
    # exp(-|q - k|^2 / 2) = exp(q.k) exp(-|q|^2/2) exp(-|k|^2/2): inputs scaled by
    # (s sqrt(D))^(1/2) D^(-1/4) = sqrt(s) carry the pretrained logits q.k s
    r = math.sqrt(w.scale)
    unit.proj.weight.copy_(torch.cat([w.q_weight * r, w.k_weight * r, w.v_weight]))
    if unit.latent_mode == "free":
        unit.latent.weight.copy_(w.k_weight * r)
    else:
        unit.latent_offset.zero_()
    _copy_out(unit, w, fold_value_bias=True)
    fitted = []
    if x is not None:
        if isinstance(unit, SCGPTAttention):
            _, k, _, x_o = unit.project(x)
            unit.gp.init_inducing_(x_o, k, mask)
            unit._inducing_ready = True
            fitted.append("inducing inputs s_m, s_l (from the calibration batch)")
        _value_gain(unit, w, x, mask, slice(2 * C, 3 * C))
        a = _shrink_noise(unit, w, x, mask, slice(2 * C, 3 * C))
        fitted += ["W_v (per-head gain)", f"noise: W_v x {a:.3g}, W_O / {a:.3g}"]
    return {"copied": ["W_q (x sqrt(s))", "W_k (x sqrt(s))", "W_o <- W_k (x sqrt(s))", "W_v",
                       "W_O", "b_O + W_O b_v"], "fitted": fitted,
            "not_carried": _dropped(w, ("q", "k"))}


@register_pretrained_init(KEPSVGPAttention)
def _kep_svgp(unit: KEPSVGPAttention, w: SoftmaxWeights, x, mask) -> dict:
    feats = unit.features
    feats.qk.weight.copy_(torch.cat([w.q_weight, w.k_weight]))
    _copy_out(unit, w, fold_value_bias=True)
    fitted = []
    if x is not None:
        if unit.merge != "add":
            raise ValueError(f"{unit.site_prefix or 'KEPSVGPAttention'}: the pretrained "
                             f"calibration fits merge='add' only, not {unit.merge!r}")
        phi_q, phi_k = feats.feature_maps(x)                              # [B, H, N, D]
        if mask is not None:
            real = mask[:, None, :, None].to(phi_q.dtype)
            phi_q, phi_k = phi_q * real, phi_k * real
        cross = torch.einsum("bhnd,bhne->hde", phi_q, phi_k) / x.shape[0]   # [H, D, D]
        U, S, Vh = torch.linalg.svd(cross.double())
        s = unit.rank
        feats.W_e.copy_(U[..., :s].to(feats.W_e))
        feats.W_r.copy_(Vh.mT[..., :s].to(feats.W_r))
        lam = S[:, :s].clamp_min(1e-6).float()
        feats.lambda_ = lam
        # m_d = lambda_d e_d (one prior std along its own feature): F = P Lambda^-1 M = P;
        # S_d = Lambda^2, the prior's covariance, as the strategy initialises it
        q_u = unit.strategy.q_u
        q_u.variational_mean.copy_(torch.diag_embed(lam).to(q_u.variational_mean))
        H = lam.shape[0]
        q_u.chol_variational_covar.copy_(
            torch.diag_embed(lam)[:, None].expand(H, s, s, s).to(q_u.chol_variational_covar))
        # W_add: least squares of the head outputs on the posterior-mean features
        E, R = feats(x, mask)
        G, _ = unit._output_maps(E, R)[0]                                # [B, H, N, s]
        m = unit.strategy.q_params(G.dtype)[0]                           # [H, s, s]
        Gm = torch.einsum("bhni,hdi->bhnd", G, m)                         # [B, H, N, s]
        ref = w.head_outputs(x, mask, value_bias=False).to(G.dtype)      # [B, H, N, D]
        real = (mask if mask is not None
                else torch.ones(x.shape[:2], dtype=torch.bool, device=x.device))
        Gh = Gm.permute(1, 0, 2, 3)[:, real]                              # [H, P, s]
        Rh = ref.permute(1, 0, 2, 3)[:, real]                             # [H, P, D]
        sol = torch.linalg.lstsq(Gh.double(), Rh.double()).solution        # [H, s, D]
        unit.W_add.copy_(sol.to(unit.W_add))
        # the output is linear in U = M + L eps: dividing L by a divides the noise by a
        a = _noise_excess(unit, w, x, mask)
        if a > 1.0:
            unit.strategy.q_u.chol_variational_covar.div_(a)
        fitted += ["W_e, W_r, Lambda (top-s SVD of the pooled Phi_q^T Phi_k)",
                   "q(u) mean m_d = lambda_d e_d (then F = E + R)",
                   "W_add (least squares onto the pretrained head outputs)",
                   f"noise: q(u) covariance factor / {a:.3g}"]
    return {"copied": ["W_q, W_k -> feature projection", "W_O", "b_O + W_O b_v"],
            "fitted": fitted, "not_carried": ["W_v (KEP-SVGP has no values)"]
            + _dropped(w, ("q", "k"))}
