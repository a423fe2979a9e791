"""CGPT: exact correlated-GP attention (Bui et al., CGPT §3)."""

from __future__ import annotations

import math
from typing import Literal

import torch
import torch.nn.functional as F
from torch import nn

from ..gp.correlated_gp import CorrelatedGP
from ..kernels.canonical_se import canonical_projection_init_
from .gp_unit import GPAttentionUnit
from .pretrained import (
    SoftmaxWeights,
    copy_output_projection,
    dropped_biases,
    fit_value_gain,
    register_pretrained_init,
    shrink_noise,
)
from .registry import register_attention

__all__ = ["CGPTAttention"]

_LATENT = ("free", "key_offset")
_REDUCTIONS = ("sum", "mean")


class _CorrelatedAttention(GPAttentionUnit):
    """Projections shared by CGPT and SCGPT: q, k, v, latent inputs x_o, output W_O.

    ``proj`` is one bias-free ``Linear(C, 3C)`` split role-major ``[B, N, 3, H, D]`` into
    (q, k, v) -- the same names and layout as :class:`~gpattn_ppl.attention.KernelAttention`
    (asymmetric), so a kernel-attention run warm-starts these units by name
    (``train.init_from``). The latent inputs are ``x_o = X W_o^T`` with ``W_o`` either its own
    ``latent`` projection (``latent="free"``, CGPT §5.1) or ``W_o = W_k + latent_offset`` with
    the offset initialised at 0 (``latent="key_offset"``): the unit then starts as the
    asymmetric kernel attention it was warm-started from (x_o = k; exact as σ² → 0).
    The head (``gp``) holds the regulariser options (``cgp_loss``, ``cgp_reduction``, ...).
    """

    rotary_capable = True

    @property
    def head(self):
        """The GP head, ``gp``."""
        return self.gp

    cgp_loss = property(lambda self: self.gp.loss, doc="The regulariser (``gp.loss``).")
    cgp_reduction = property(lambda self: self.gp.reduction,
                             doc="Its reduction (``gp.reduction``).")

    def init_inducing_from(self, x: torch.Tensor, mask: torch.Tensor | None) -> list[str]:
        """Fit data-dependent inducing inputs from the inputs ``x [B, N, C]`` of a calibration
        batch (pretrained initialisation); returns what was fitted, for the report. CGPT has
        none (SCGPT overrides it)."""
        return []

    @staticmethod
    def _check_reduction(reduction: str) -> None:
        if reduction not in _REDUCTIONS:
            raise ValueError(f"cgp_reduction must be one of {', '.join(_REDUCTIONS)}, "
                             f"got {reduction!r}")

    def _init_projections(self, latent: str) -> None:
        if latent not in _LATENT:
            raise ValueError(f"latent must be one of {', '.join(_LATENT)}, got {latent!r}")
        C, D = self.dim, self.head_dim
        self.latent_mode = latent
        self.proj = nn.Linear(C, 3 * C, bias=False)
        canonical_projection_init_(self.proj.weight[: 2 * C], D)
        if latent == "free":
            self.latent = nn.Linear(C, C, bias=False)
            canonical_projection_init_(self.latent.weight, D)
        else:
            self.latent_offset = nn.Parameter(torch.zeros(C, C))
        self.out = nn.Linear(C, C)

    def latent_weight(self) -> torch.Tensor:
        """``W_o``, ``[C, C]`` (rows head-major like every projection)."""
        if self.latent_mode == "free":
            return self.latent.weight
        return self.proj.weight[self.dim: 2 * self.dim] + self.latent_offset

    def project(self, x: torch.Tensor, mask: torch.Tensor | None = None):
        """``(q, k, v, x_o)``, each ``[B, H, N, D]``: one GEMM with the stacked weights
        :math:`[W_q; W_k; W_v; W_o]` (a copy of ``4 C x C`` numbers instead of a second pass
        over ``x``). Inside :meth:`~gpattn_ppl.attention.AttentionUnit.positions` the queries,
        keys and latent inputs (which sit at the tokens' positions) are rotated; SCGPT's
        inducing inputs carry no position."""
        B, N, _ = x.shape
        weight = torch.cat([self.proj.weight, self.latent_weight()], 0)
        qkvo = F.linear(x, weight).view(B, N, 4, self.heads, self.head_dim).permute(2, 0, 3, 1, 4)
        if self._rotary is None and not self.requires_positions:
            return qkvo
        q, k, v, x_o = qkvo
        q, k, x_o = self.rotate(q, k, x_o)
        return q, k, v, x_o


@register_attention("cgpt")
class CGPTAttention(_CorrelatedAttention):
    r"""Correlated-GP attention (CGPT, eqs. 13-29 and App. A-B), every head an exact CGP.

    Per head, with :math:`q = XW_q`, :math:`k = XW_k`, :math:`x_o = XW_o`, :math:`V = XW_v`
    and the canonical SE kernel (see :class:`~gpattn_ppl.gp.CorrelatedGP`):

    .. math::
        \nu = K_{qo}(K_o + \sigma^2I)^{-1}K_{ok}V, \qquad
        z_q \mid z_k \sim \mathcal N(\nu_{:,a}, \Sigma_\text{post})\ \text{for each column } a,

    output :math:`= \mathrm{concat}_h(z_q)\,W_O` with one joint sample over the tokens of each
    (b, h) (the latent ``<path>.z``, whose variational distribution is the predictive itself,
    so its KL is 0), or :math:`\nu` inside :class:`~gpattn_ppl.settings.posterior_mean`.
    :meth:`predictive` returns the predictive of the head outputs (before :math:`W_O`) as an
    :class:`~gpattn_ppl.distributions.AttentionPredictive` built from the GP's
    :class:`~gpattn_ppl.distributions.TokenNormal` (batch ``[B, H]``, event ``(N, D)``).

    In training mode the unit exposes the objective term ``cgp_loss`` ``[B]``: minus the CGP
    bound summed over heads and columns (eq. 44), weighted by :math:`\alpha` from
    ``train.objective.cgp_alpha`` (paper: linear 0 → 1, or 0.7). It is not computed in eval mode.

    :param noise: σ of eqs. 19-20 (standard deviation; σ² enters). Default 0.5, the paper's
        CoLA value; 0.01 is the nearly noise-free GP of the paper's eq. 22.
    :param per_head_scales: one (σ_q, σ_k) per head instead of one shared pair [ref].
    :param latent: ``"free"`` (own ``W_o``) or ``"key_offset"`` (``W_o = W_k + Δ``, Δ = 0 at
        init: starts as asymmetric kernel attention, for warm starts).
    :param cgp_loss: ``"jensen"`` (paper, closed form), ``"marginal"`` (the exact log marginal,
        tighter), ``"mc"`` (the paper's MC estimator with ``cgp_samples`` draws) or ``"none"``.
    :param cgp_samples: Monte-Carlo draws of :math:`z_o` for ``cgp_loss="mc"``.
    :param cgp_reduction: ``"mean"`` (default: averaged per entry) or ``"sum"`` (paper: summed
        over heads, columns and tokens; see ``docs/derivations/cgpt.rst``, "Scale and
        boundedness", and "Default recipe" for what each does on CoLA).
    :param cgp_observation_noise: if true, the regulariser scores :math:`\nu` and :math:`Z` as
        observations with the model's noise, :math:`\Sigma_q + \sigma^2I` and
        :math:`\Sigma_k + \sigma^2I` (as SCGPT's bound does; the default). The paper's bound
        (false) is unbounded above: :math:`\log|\Sigma_q| \to -\infty` as the latent inputs
        approach the queries; with the noise each head and column is bounded by
        :math:`-\tfrac{n_b}{2}\log(2\pi\sigma^2)` per side.
    :param proj_dropout: dropout after :math:`W_O`. CGPT has no attention weights to drop, so
        it takes no ``attn_dropout``.

    Cost per (b, h): O(N³ + N² D) time, O(N²) memory; the posterior mean needs one Cholesky.

    >>> att = CGPTAttention(dim=8, heads=2)
    >>> att(torch.randn(3, 5, 8)).shape
    torch.Size([3, 5, 8])
    """

    def __init__(self, dim: int, heads: int, *, noise: float = 0.5, per_head_scales: bool = False,
                 latent: Literal["free", "key_offset"] = "free",
                 cgp_loss: Literal["jensen", "marginal", "mc", "none"] = "jensen",
                 cgp_samples: int = 1,
                 cgp_reduction: Literal["sum", "mean"] = "mean", cgp_observation_noise: bool = True,
                 proj_dropout: float = 0.0) -> None:
        super().__init__(dim, heads, proj_dropout=proj_dropout)
        if cgp_loss not in CorrelatedGP.LOSSES:
            raise ValueError(f"cgp_loss must be one of {', '.join(CorrelatedGP.LOSSES)}, "
                             f"got {cgp_loss!r}")
        if int(cgp_samples) < 1:
            raise ValueError(f"cgp_samples must be >= 1, got {cgp_samples}")
        self._check_reduction(cgp_reduction)
        self._init_projections(latent)
        self.gp = CorrelatedGP(heads, noise=noise, per_head_scales=per_head_scales, loss=cgp_loss,
                               samples=cgp_samples, observation_noise=cgp_observation_noise,
                               reduction=cgp_reduction)


# -- initialisation from a pretrained softmax layer (attention/pretrained.py) ------------------

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
    copy_output_projection(unit, w, fold_value_bias=True)
    fitted = []
    if x is not None:
        fitted += unit.init_inducing_from(x, mask)     # SCGPT: inducing inputs from x
        fit_value_gain(unit, w, x, mask, slice(2 * C, 3 * C))
        a = shrink_noise(unit, w, x, mask, slice(2 * C, 3 * C))
        fitted += ["W_v (per-head gain)", f"noise: W_v x {a:.3g}, W_O / {a:.3g}"]
    return {"copied": ["W_q (x sqrt(s))", "W_k (x sqrt(s))", "W_o <- W_k (x sqrt(s))", "W_v",
                       "W_O", "b_O + W_O b_v"], "fitted": fitted,
            "not_carried": dropped_biases(w, ("q", "k"))}
