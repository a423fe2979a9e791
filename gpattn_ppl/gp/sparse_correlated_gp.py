r"""Sparse correlated Gaussian processes with DTC (SCGPT: CGPT §4, App. C-E).

Notation per batch element and head: tokens as in :mod:`~gpattn_ppl.gp.correlated_gp`,
two learned inducing sets in the canonical input space, :math:`s_m\in\mathbb R^{m\times D}`
(query side, for :math:`z_q\mid z_o`) and :math:`s_l\in\mathbb R^{l\times D}` (key side, for
:math:`z_o\mid z_k`); :math:`K_{mm} = \kappa_o(s_m, s_m)`, :math:`K_{om} = \kappa_o(x_o, s_m)`,
:math:`K_{qm} = \sigma_q\kappa_o(q, s_m)`, :math:`K_{ll} = \kappa_o(s_l, s_l)`,
:math:`K_{ol} = \kappa_o(x_o, s_l)`, :math:`K_{kl} = \sigma_k\kappa_o(k, s_l)`; σ is the DTC noise.
No :math:`N\times N` matrix is formed except :math:`K_o` in the exact regulariser (``k_o="exact"``).
The set sizes :math:`m, l` are the glossary's M (``num_inducing``, ``num_inducing_keys``);
inverse Cholesky factors :math:`L^{-1}` are named ``Linv_*``. The derivations are in
``docs/derivations/scgpt.rst``.
"""

from __future__ import annotations

import math
from functools import cached_property

import torch
from torch import nn

from .. import linalg
from ..distributions.token_normal import TokenNormal
from ..kernels.canonical_se import TARGET_SQ_DIST, CanonicalSEKernel
from .correlated_gp import MAX_NOISE, CorrelatedHead, KernelState

__all__ = ["SparseCorrelatedGP", "SCGPTState"]



class SCGPTState(KernelState):
    r"""The matrices and factors of one SCGP call, each computed on first use.

    Token-side matrices are ``[B, H, N, m]`` / ``[B, H, N, l]`` with padded rows zeroed, so pads
    drop out of every inducing-space product. With the rescaled DTC matrices

    .. math::
        \tilde B_m = \sigma^2 B_m = \sigma^2K_{mm} + K_{mo}K_{om}, \qquad
        \tilde B_l = \sigma^2 K_{ll} + K_{lk}K_{kl}, \qquad
        \tilde B'_l = \sigma^2 K_{ll} + K_{lo}K_{ol}

    (:math:`B_m = K_{mm} + \sigma^{-2}K_{mo}K_{om}` of eqs. 31-33), the :math:`\sigma^{-2}`,
    :math:`\sigma^{-4}` factors of the paper cancel and every factorised matrix is O(1)-scaled.
    """

    def __init__(self, q, k, x_o, s_m, s_l, *, scale_q, scale_k, noise: float, mask=None,
                 where: str = "", kernel: CanonicalSEKernel | None = None,
                 k_o: str = "exact", v=None) -> None:
        super().__init__(q, k, x_o, scale_q=scale_q, scale_k=scale_k, noise=noise, mask=mask,
                         where=where, kernel=kernel, v=v)
        self.s_m, self.s_l, self.k_o = s_m.to(self.dtype), s_l.to(self.dtype), k_o
        #: ``[B, 1, N, 1]`` 0/1 factor of the real token rows (``None`` without a mask)
        self.row = None if mask is None else mask.to(self.dtype)[:, None, :, None]

    def _chol(self, A, name: str):
        r"""Factor of an inducing-space matrix (lower triangle read) with the model jitter
        :math:`\epsilon I` of :class:`~gpattn_ppl.settings.cholesky_jitter` (as gpytorch adds
        to every :math:`K_{uu}`: inducing inputs may coincide), escalated where it fails."""
        return linalg.cholesky(A, where=f"{self.where} {name}", head_axis=1,
                               jitter=self.model_jitter)

    def _factors(self, A, name: str):
        """``(L, L^{-1})`` of an inducing-space matrix, with the jitter of ``_chol``: every
        later solve is a product with the inverse factor (cheap at m x m, and so is its
        backward)."""
        return linalg.cholesky_factors(A, where=f"{self.where} {name}", head_axis=1,
                                       jitter=self.model_jitter)

    # -- kernels ----------------------------------------------------------------------------
    @cached_property
    def _tokens_by_inducing(self):
        r"""``[B, H, 3N, m + l]``: the rows :math:`(q, x_o, k)` against the columns
        :math:`(s_m, s_l)` in one product (scales :math:`\sigma_q`, 1, :math:`\sigma_k` per row
        block, pad rows zeroed). Four of its six blocks are used; the two unused ones cost less
        than a second call."""
        return self._k_stacked([(self.q, self.log_sq), (self.x_o, None), (self.k, self.log_sk)],
                               torch.cat([self.s_m, self.s_l], -2), tokens_b=False)

    @property
    def num_inducing(self) -> int:
        """M, the size of the query-side inducing set :math:`s_m` (its :math:`m`)."""
        return self.s_m.shape[-2]

    @cached_property
    def K_qm(self):
        return self._tokens_by_inducing[0][..., :self.num_inducing]

    @cached_property
    def K_o_ml(self):
        r""":math:`[K_{om} \mid K_{ol}]`, ``[B, H, N, m + l]`` (a contiguous row block)."""
        return self._tokens_by_inducing[1]

    @cached_property
    def K_om(self):
        return self.K_o_ml[..., :self.num_inducing]

    @cached_property
    def K_ol(self):
        return self.K_o_ml[..., self.num_inducing:]

    @cached_property
    def K_kl(self):
        return self._tokens_by_inducing[2][..., self.num_inducing:]

    @cached_property
    def _inducing_gram(self):
        """``[H, m + l, m + l]``: :math:`(s_m, s_l)` against themselves, one product."""
        s = torch.cat([self.s_m, self.s_l], -2)
        return self.kernel.gram(s, s)

    @cached_property
    def K_mm(self):
        return self._inducing_gram[..., :self.num_inducing, :self.num_inducing]

    @cached_property
    def K_ll(self):
        return self._inducing_gram[..., self.num_inducing:, self.num_inducing:]

    @cached_property
    def K_o(self):
        """Dense ``[B, H, N, N]`` latent Gram matrix (exact regulariser only), pads zeroed."""
        return self._k(self.x_o, self.x_o)

    # -- DTC factors ------------------------------------------------------------------------
    @cached_property
    def _latent_products(self):
        r""":math:`[K_{om}\mid K_{ol}]^\top[K_{om}\mid K_{ol}]`, ``[B, H, m + l, m + l]``: its
        blocks are :math:`P_m = K_{mo}K_{om}`, :math:`C_{ml} = K_{mo}K_{ol}` and
        :math:`K_{lo}K_{ol}` (of :math:`\tilde B'_l`), one product."""
        return self.K_o_ml.mT @ self.K_o_ml

    @cached_property
    def P_m(self):
        """:math:`K_{mo}K_{om}`, ``[B, H, m, m]``."""
        return self._latent_products[..., :self.num_inducing, :self.num_inducing]

    @cached_property
    def C_ml(self):
        """:math:`K_{mo}K_{ol}`, ``[B, H, m, l]``."""
        return self._latent_products[..., :self.num_inducing, self.num_inducing:]

    @cached_property
    def P_lo(self):
        """:math:`K_{lo}K_{ol}`, ``[B, H, l, l]``."""
        return self._latent_products[..., self.num_inducing:, self.num_inducing:]

    @cached_property
    def _factors_ml(self):
        r"""``(L_m, Linv_m), (L_l, Linv_l)`` of :math:`\tilde B_m`, :math:`\tilde B_l`; one stacked
        factorisation when m = l (batch index 0 is :math:`\tilde B_m`, 1 is :math:`\tilde B_l`)."""
        B_m = self.noise_var * self.K_mm + self.P_m
        B_l = self.noise_var * self.K_ll + self.K_kl.mT @ self.K_kl
        if B_m.shape != B_l.shape:
            return self._factors(B_m, "B_m"), self._factors(B_l, "B_l")
        L, Linv = linalg.cholesky_factors(torch.stack([B_m, B_l]),
                                          where=f"{self.where} B_m (0) / B_l (1)", head_axis=2,
                                          jitter=self.model_jitter)
        return (L[0], Linv[0]), (L[1], Linv[1])

    @property
    def factors_m(self):
        r"""``(L_m, Linv_m)``: :math:`L_m` and :math:`L_m^{-1}`,
        :math:`L_mL_m^\top = \tilde B_m`."""
        return self._factors_ml[0]

    @property
    def factors_l(self):
        r"""``(L_l, Linv_l)``: :math:`L_l` and :math:`L_l^{-1}`,
        :math:`L_lL_l^\top = \tilde B_l`."""
        return self._factors_ml[1]

    @property
    def L_m(self):
        return self.factors_m[0]

    @property
    def Linv_m(self):
        r""":math:`L_m^{-1}`, the inverse Cholesky factor of :math:`\tilde B_m`."""
        return self.factors_m[1]

    @property
    def L_l(self):
        return self.factors_l[0]

    @property
    def Linv_l(self):
        r""":math:`L_l^{-1}`, the inverse Cholesky factor of :math:`\tilde B_l`."""
        return self.factors_l[1]

    @cached_property
    def S_ml(self):
        r""":math:`[K_{om}\mid K_{ol}]^\top\hat K_o[K_{om}\mid K_{ol}]` ``[B, H, m + l, m + l]``
        (:meth:`nystrom` of both sets in one product); its diagonal blocks are :math:`S_m`,
        :math:`S_l`."""
        return self.nystrom(self.K_o_ml)

    def nystrom(self, U: torch.Tensor) -> torch.Tensor:
        r""":math:`U^\top \hat K_o U` with :math:`\hat K_o = K_{ol}K_{ll}^{-1}K_{lo}` (``k_o="nystrom"``)
        or :math:`K_o` itself (``"exact"``), for ``U = K_{om}`` or ``K_{ol}``."""
        if self.k_o == "exact":
            return U.mT @ (self.K_o @ U)
        Linv_ll = self._factors(self.K_ll, "K_ll")[1]
        Y = Linv_ll @ (self.K_ol.mT @ U)                                  # L_ll^-1 K_lo U  [l, r]
        return Y.mT @ Y


class SparseCorrelatedGP(CorrelatedHead):
    r"""Sparse correlated-GP attention head with DTC conditionals (CGPT §4, App. C-E).

    Both conditionals of the CGP chain :math:`z_q\mid z_o` and :math:`z_o\mid z_k` are replaced
    by their deterministic-training-conditional approximations through the inducing sets
    :math:`s_m` and :math:`s_l` (eqs. 31-32). With the key observations :math:`Z = V` (eq. 34)
    the predictive mean (eq. 33), evaluated right to left, is

    .. math::
        \nu = \sigma^{-4}K_{qm}B_m^{-1}K_{mo}K_{ol}B_l^{-1}K_{lk}V
            = K_{qm}\tilde B_m^{-1}K_{mo}\,K_{ol}\tilde B_l^{-1}K_{lk}V,

    O(N (m + l) D + N (m² + l²) + m³ + l³) per (b, h): linear in N. The predictive covariance
    (App. D, eqs. 59-67, written out; the :math:`z_k`-dependent parts cancel against
    :math:`\nu\nu^\top`) is isotropic plus rank m,

    .. math::
        \Sigma_\text{post} = \sigma^2 I + \sigma^2 A_{qm} Q A_{qm}^\top, \qquad
        A_{qm} = K_{qm}\tilde B_m^{-1}, \qquad
        Q = \sigma^2K_{mm} + 2K_{mo}K_{om} + K_{mo}K_{ol}\tilde B_l^{-1}K_{lo}K_{om},

    sampled as :math:`\nu + \sigma E_1 + \sigma A_{qm}\,\mathrm{chol}(Q)\,E_2` without any
    :math:`N\times N` matrix. The regulariser is :meth:`lower_bound`.

    :param heads: H. :param head_dim: D (dimension of the canonical input space).
    :param num_inducing: m, size of the query-side set (paper: 16 on CIFAR; [ref] 5 on CoLA).
    :param num_inducing_keys: l, size of the key-side set (default m).
    :param noise: σ, the DTC noise standard deviation (paper: 0.1 images, 0.5 CoLA).
    :param per_head_scales: one (σ_q, σ_k) pair per head instead of one shared pair.
    :param k_o: ``"exact"`` (the regulariser's :math:`K_o` term costs O(N² m) time, O(N²)
        memory) or ``"nystrom"`` (:math:`K_o\approx K_{ol}K_{ll}^{-1}K_{lo}`: O(N κ²) throughout).
    :param loss: ``"jensen"`` (the training term ``cgp_loss``) or ``"none"``; ``reduction``:
        ``"mean"`` or ``"sum"`` (:class:`~gpattn_ppl.gp.correlated_gp.CorrelatedHead`).

    >>> gp = SparseCorrelatedGP(heads=2, head_dim=4, num_inducing=3)
    >>> q, k, xo, v = torch.randn(4, 3, 2, 5, 4).unbind(0)
    >>> state = gp.prepare(q, k, v, xo)
    >>> gp.mean(state).shape, gp.posterior(state).cov_root.shape
    (torch.Size([3, 2, 5, 4]), torch.Size([3, 2, 5, 3]))
    """

    def __init__(self, heads: int, head_dim: int, *, num_inducing: int = 16,
                 num_inducing_keys: int | None = None, noise: float = 0.1,
                 per_head_scales: bool = False, k_o: str = "exact", loss: str = "jensen",
                 reduction: str = "mean") -> None:
        super().__init__()
        self.loss, self.reduction = loss, reduction
        if not 0 < noise <= MAX_NOISE:
            raise ValueError(f"noise must be > 0 and at most {MAX_NOISE:.3g} (the DTC noise "
                             f"sigma; sigma^2 must be a finite float32), got {noise}")
        if k_o not in ("exact", "nystrom"):
            raise ValueError(f"k_o must be 'exact' or 'nystrom', got {k_o!r}")
        M = int(num_inducing)
        M_keys = int(num_inducing_keys) if num_inducing_keys is not None else M
        if M < 1 or M_keys < 1:
            raise ValueError(f"inducing set sizes must be >= 1, got num_inducing={M}, "
                             f"num_inducing_keys={M_keys}")
        self.heads, self.head_dim, self.noise, self.k_o = int(heads), int(head_dim), float(noise), k_o
        self.kernel = CanonicalSEKernel()
        # spread of projected tokens at the default projection init (E||x - x'||^2 = TARGET_SQ_DIST)
        std = math.sqrt(TARGET_SQ_DIST / (2.0 * head_dim))
        self.inducing_m = nn.Parameter(std * torch.randn(heads, M, head_dim))
        self.inducing_l = nn.Parameter(std * torch.randn(heads, M_keys, head_dim))
        #: whether the inducing inputs were set from data (:meth:`init_inducing_`)
        self.register_buffer("inducing_initialized", torch.tensor(False))
        self._init_scales(self.heads, per_head_scales)

    @torch.no_grad()
    def init_inducing_(self, x_o: torch.Tensor, k: torch.Tensor, mask: torch.Tensor | None = None,
                       generator: torch.Generator | None = None) -> None:
        r"""Set :math:`s_m` to random real latent inputs :math:`x_o` and :math:`s_l` to random real
        keys of a batch (``[B, H, N, D]``), plus 1% noise, and mark the sets initialised.

        Data initialisation keeps the inducing inputs where the tokens are (never
        near the origin if the tokens are not); with them equal to the tokens the DTC mean is exact.
        """
        B, H, N, D = x_o.shape
        real = (torch.ones(B, N, dtype=torch.bool, device=x_o.device) if mask is None
                else mask).reshape(-1).nonzero().squeeze(-1)
        for param, src in ((self.inducing_m, x_o), (self.inducing_l, k)):
            # at least float32 (a bfloat16 x_o under autocast: the statistics in float32)
            src = src.detach().to(torch.promote_types(src.dtype, torch.float32))
            flat = src.transpose(0, 1).reshape(H, B * N, D)[:, real]
            n_real, size = flat.shape[1], param.shape[1]
            if n_real >= size:
                idx = torch.randperm(n_real, generator=generator)[:size]
            else:
                idx = torch.randint(n_real, (size,), generator=generator)
            pick = flat[:, idx.to(flat.device)]
            spread = flat.std(1, keepdim=True).nan_to_num(1.0).clamp_min(1e-3)
            noise = torch.randn(pick.shape, generator=generator).to(pick)
            param.copy_((pick + 0.01 * spread * noise).to(param))
        self.inducing_initialized.fill_(True)

    def prepare(self, q, k, v, x_o, *, mask=None, where: str = "") -> SCGPTState:
        """The prepared state of one call, its matrices computed on first use (``q, k, v, x_o:
        [B, H, N, D]``)."""
        return SCGPTState(q, k, x_o, self.inducing_m, self.inducing_l, scale_q=self.scale_q,
                          scale_k=self.scale_k, noise=self.noise, mask=mask, where=where,
                          kernel=self.kernel, k_o=self.k_o, v=v)

    # -- predictive -------------------------------------------------------------------------
    def mean(self, t: SCGPTState, v: torch.Tensor | None = None) -> torch.Tensor:
        r"""Posterior mean (eq. 33 with Z = V), right to left, ``[B, H, N, D]`` (``v`` defaults to
        the state's values)."""
        v = (t.v if v is None else v).to(t.dtype)
        a = t.Linv_l.mT @ (t.Linv_l @ (t.K_kl.mT @ v))              # B~_l^-1 K_lk V   [l, D]
        b = t.Linv_m.mT @ (t.Linv_m @ (t.K_om.mT @ (t.K_ol @ a)))    # B~_m^-1 K_mo K_ol a
        return t.K_qm @ b

    def attention_matrix(self, t: SCGPTState) -> torch.Tensor:
        r"""The attention matrix of eq. 35, :math:`\mathcal K = K_{qm}\tilde B_m^{-1}K_{mo}
        K_{ol}\tilde B_l^{-1}K_{lk}`, ``[B, H, N, N]`` -- formed for analysis only (O(N²))."""
        right = t.Linv_l.mT @ (t.Linv_l @ t.K_kl.mT)                   # B~_l^-1 K_lk  [l, N]
        left = t.Linv_m.mT @ (t.Linv_m @ t.C_ml)                        # B~_m^-1 K_mo K_ol
        return t.K_qm @ (left @ right)

    def cov_root(self, t: SCGPTState) -> torch.Tensor:
        r"""R with :math:`\Sigma_\text{post} = \sigma^2 I + RR^\top`, ``[B, H, N, m]``:
        :math:`R = \sigma\,K_{qm}\tilde B_m^{-1}\,\mathrm{chol}(Q)`."""
        A_qm = (t.K_qm @ t.Linv_m.mT) @ t.Linv_m                     # K_qm B~_m^-1  [N, m]
        J_lm = t.Linv_l @ t.C_ml.mT                                    # L_l^-1 K_lo K_om [l, m]
        Q = t.noise_var * t.K_mm + 2.0 * t.P_m + J_lm.mT @ J_lm
        L_Q = t._chol(Q, "Q")
        return math.sqrt(t.noise_var) * (A_qm @ L_Q)

    def posterior(self, t: SCGPTState, v: torch.Tensor | None = None,
                  mean: torch.Tensor | None = None) -> TokenNormal:
        r""":math:`z_q\mid z_k\sim` :class:`TokenNormal` :math:`(\nu, \sigma^2I + RR^\top)`."""
        nu = self.mean(t, v) if mean is None else mean
        return TokenNormal(nu, cov_root=self.cov_root(t),
                           noise_var=torch.full((), t.noise_var, dtype=t.dtype, device=t.device),
                           where=t.where)

    # -- the sparse CGP regulariser -------------------------------------------------------------
    def bound(self, state: SCGPTState) -> torch.Tensor:
        """:meth:`lower_bound` at the draw's mean."""
        return self.lower_bound(state, state.nu, state.v)

    def lower_bound(self, t: SCGPTState, nu: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        r"""The sparse CGP objective (App. E, eqs. 68-72, corrected), summed over heads and
        columns, ``[B]``.

        Per column a, query side (the key side swaps :math:`(q, m, \nu_a)\to(k, l, v_a)` with
        :math:`\tilde B'_l = \sigma^2K_{ll} + K_{lo}K_{ol}`):

        .. math::
            \mathbb E_{z_o}\mathbb E_{z_m\mid z_o}\log\mathcal N(\nu_a; K_{qm}K_{mm}^{-1}z_m, \sigma^2I)
            = -\frac{1}{2\sigma^2}\Big[\lVert\nu_a\rVert^2
              + \mathrm{tr}\big(\tilde B_m^{-1}S_m\tilde B_m^{-1}P_q\big)
              + \sigma^2\,\mathrm{tr}\big(\tilde B_m^{-1}P_q\big)\Big] - \frac{n_b}{2}\log(2\pi\sigma^2),

        :math:`P_q = K_{mq}K_{qm}`, :math:`S_m = K_{mo}K_oK_{om}` (or its Nyström form), a lower
        bound on :math:`\log\mathbb E_{z_o}p(z_q = \nu_a\mid z_o)` with
        :math:`z_o\sim\mathcal N(0, K_o)`. The traces are shared by the D columns. Cost
        O(N κ² + κ³) plus O(N² m) for the exact :math:`S_m`.

        :returns: ``[B]``, the bound (to be maximised; the unit reports its negative).
        """
        nu, v = nu.to(t.dtype), v.to(t.dtype)
        if t.row is not None:
            v = v * t.row
        D, s2 = nu.shape[-1], t.noise_var
        # per side, with Linv the inverse factor of B~ (Linv B~ Linv^T = I), G = Linv K_{mq} and
        # S = K_{mo} K_o K_{om}: tr(B~^-1 S B~^-1 P) = <Linv S Linv^T, G G^T>,
        # tr(B~^-1 P) = ||G||^2
        traces = []
        M = t.num_inducing
        Linv_lo = t._factors(s2 * t.K_ll + t.P_lo, "B'_l")[1]
        for Linv, K_tok, S in ((t.Linv_m, t.K_qm, t.S_ml[..., :M, :M]),  # query side, set m
                               (Linv_lo, t.K_kl, t.S_ml[..., M:, M:])):  # key side, set l
            G = Linv @ K_tok.mT                                           # [r, N]
            S_white = Linv @ S @ Linv.mT                                  # [r, r]
            traces.append((S_white * (G @ G.mT)).sum((-1, -2)) + s2 * G.square().sum((-1, -2)))
        tr_q, tr_k = traces
        sq = nu.square().sum((-1, -2)) + v.square().sum((-1, -2))
        bound = -(sq + D * (tr_q + tr_k)) / (2 * s2) - D * t.n_b * math.log(2 * math.pi * s2)
        return bound.sum(-1)
