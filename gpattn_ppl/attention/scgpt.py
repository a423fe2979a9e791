"""SCGPT: sparse correlated-GP attention with DTC (Bui et al., CGPT §4)."""

from __future__ import annotations

from typing import Literal

import torch

from ..gp.sparse_correlated_gp import SparseCorrelatedGP
from .cgpt import _CorrelatedAttention
from .registry import register_attention

__all__ = ["SCGPTAttention"]


@register_attention("scgpt")
class SCGPTAttention(_CorrelatedAttention):
    r"""Sparse correlated-GP attention (SCGPT, eqs. 30-35 and App. C-E), linear in N.

    Per head, with learned inducing inputs :math:`s_m` (m points, query side) and :math:`s_l`
    (l points, key side) in the canonical input space (see
    :class:`~gpattn_ppl.gp.SparseCorrelatedGP`):

    .. math::
        \nu = K_{qm}\tilde B_m^{-1}K_{mo}K_{ol}\tilde B_l^{-1}K_{lk}V, \qquad
        \Sigma_\text{post} = \sigma^2 I + RR^\top,\ R \in \mathbb R^{N\times m},

    output :math:`= \mathrm{concat}_h(z_q)\,W_O` with one joint sample
    :math:`\nu + \sigma E_1 + RE_2` per (b, h) (latent ``<path>.z``, KL 0) or :math:`\nu`
    inside :class:`~gpattn_ppl.settings.posterior_mean`. :meth:`predictive` is built from the
    low-rank :class:`~gpattn_ppl.distributions.TokenNormal` (no :math:`N\times N` matrix).

    In training mode the unit exposes ``cgp_loss`` ``[B]``: minus the sparse CGP bound of
    App. E summed over heads and columns (weight ``train.objective.cgp_alpha``).

    **Inducing inputs** are global per head (``inducing_m: [H, m, D]``, ``inducing_l: [H, l, D]``).
    With ``inducing_init="data"`` (default) they are set on the first training call from random
    real latent inputs (m) and keys (l) of that batch -- also after a warm start, since a
    kernel-attention checkpoint has no inducing inputs; ``"random"`` keeps the Gaussian init.

    :param num_inducing: m (paper: 16 on CIFAR; [ref]: 5 on CoLA).
    :param num_inducing_keys: l (default m).
    :param noise: the DTC noise σ; default 0.5 (paper: 0.1 on images, 0.5 on CoLA).
    :param per_head_scales: one (σ_q, σ_k) per head instead of one shared pair.
    :param latent: ``"free"`` or ``"key_offset"`` (see
        :class:`~gpattn_ppl.attention.CGPTAttention`).
    :param k_o: ``"exact"`` (regulariser's K_o term O(N² m)) or ``"nystrom"`` (all O(N κ²)).
    :param inducing_init: ``"data"`` or ``"random"``.
    :param cgp_loss: ``"jensen"`` (App. E bound, closed form) or ``"none"``.
    :param cgp_reduction: ``"mean"`` (default: per entry) or ``"sum"`` (paper), as for
        :class:`~gpattn_ppl.attention.CGPTAttention`.
    :param proj_dropout: dropout after :math:`W_O`. SCGPT has no attention weights to drop, so
        it takes no ``attn_dropout``.

    Cost per (b, h): O(N κ (κ + D) + κ³) for the mean and a sample (κ = max(m, l)), memory
    O(N κ); the regulariser adds O(N² m) with ``k_o="exact"``.

    >>> att = SCGPTAttention(dim=8, heads=2, num_inducing=3)
    >>> att(torch.randn(3, 5, 8)).shape
    torch.Size([3, 5, 8])
    """

    LOSSES = ("jensen", "none")

    def __init__(self, dim: int, heads: int, *, num_inducing: int = 16,
                 num_inducing_keys: int | None = None, noise: float = 0.5,
                 per_head_scales: bool = False, latent: Literal["free", "key_offset"] = "free",
                 k_o: Literal["exact", "nystrom"] = "exact",
                 inducing_init: Literal["data", "random"] = "data",
                 cgp_loss: Literal["jensen", "none"] = "jensen",
                 cgp_reduction: Literal["sum", "mean"] = "mean", proj_dropout: float = 0.0) -> None:
        super().__init__(dim, heads, proj_dropout=proj_dropout)
        if cgp_loss not in self.LOSSES:
            raise ValueError(f"cgp_loss must be one of {', '.join(self.LOSSES)}, got {cgp_loss!r}")
        if inducing_init not in ("data", "random"):
            raise ValueError(f"inducing_init must be 'data' or 'random', got {inducing_init!r}")
        self.inducing_init = inducing_init
        self._check_reduction(cgp_reduction)
        self._init_projections(latent)
        self.gp = SparseCorrelatedGP(heads, self.head_dim, num_inducing=num_inducing,
                                     num_inducing_keys=num_inducing_keys, noise=noise,
                                     per_head_scales=per_head_scales, k_o=k_o, loss=cgp_loss,
                                     reduction=cgp_reduction)
        self._inducing_ready: bool | None = None  # host-side mirror of the buffer

    def _load_from_state_dict(self, *args, **kwargs):
        self._inducing_ready = None  # re-read gp.inducing_initialized after any load
        return super()._load_from_state_dict(*args, **kwargs)

    @torch.no_grad()
    def init_inducing_from(self, x: torch.Tensor, mask: torch.Tensor | None) -> list[str]:
        """Place the inducing inputs from the latent inputs and keys of ``x [B, N, C]`` (as the
        first training batch would with ``inducing_init="data"``), now; returns the report
        entry."""
        _, k, _, x_o = self.project(x)
        self.gp.init_inducing_(x_o, k, mask)
        self._inducing_ready = True
        return ["inducing inputs s_m, s_l (from the calibration batch)"]

    def before_attend(self, inputs: tuple, mask: torch.Tensor | None) -> None:
        """With ``inducing_init="data"``, place the inducing inputs on the first training call."""
        if self.inducing_init != "data" or not self.training:
            return
        if self._inducing_ready is None:
            self._inducing_ready = bool(self.gp.inducing_initialized)
        if not self._inducing_ready:
            _, k, _, x_o = inputs
            self.gp.init_inducing_(x_o, k, mask)
            self._inducing_ready = True
