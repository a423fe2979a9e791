"""Kernel-eigen (KSVD) inducing features of KEP-SVGP attention (KEP eqs. 10-11, 13-15)."""

from __future__ import annotations

from collections.abc import Callable

import torch
from gpytorch.constraints import Positive
from gpytorch.module import Module
from torch import nn

from .. import settings
from ..linalg import gp_precision

__all__ = ["KernelEigenFeatures", "FEATURE_MAPS"]

#: the feature maps :math:`\phi_q, \phi_k` offered (KEP eq. 10; the paper uses ``"cosine"``).
FEATURE_MAPS = ("cosine", "linear")


def _orthonormal(heads: int, rows: int, cols: int) -> torch.Tensor:
    """``[H, rows, cols]`` with orthonormal columns (rows if ``cols > rows``), one QR per head."""
    a = torch.randn(heads, max(rows, cols), min(rows, cols))
    q = torch.linalg.qr(a).Q
    return (q if rows >= cols else q.mT).contiguous()   # safetensors saves contiguous tensors


class KernelEigenFeatures(Module):
    r"""The kernel-eigen feature pair of one KEP-SVGP layer: KSVD primal projections and :math:`\Lambda`.

    Per head :math:`h` (KEP eq. 10, primal form, and App. C eq. 37):

    .. math::
        q = x W_q,\quad k = x W_k,\qquad
        \phi_q(x) = \frac{q}{\lVert q\rVert_2},\quad \phi_k(x) = \frac{k}{\lVert k\rVert_2}
        \quad(\texttt{"cosine"};\ \texttt{"linear"}: \phi_q = q,\ \phi_k = k)

    .. math::
        e(x) = W_e^\top \phi_q(x),\qquad r(x) = W_r^\top \phi_k(x)\ \in \mathbb R^{s},\qquad
        E = [e(x_1),\dots,e(x_N)]^\top,\quad R = [r(x_1),\dots,r(x_N)]^\top \in \mathbb R^{N\times s}

    so the asymmetric attention kernel is :math:`\kappa_{att}(x_i, x_j) =
    \langle\phi_q(x_i),\phi_k(x_j)\rangle` and no :math:`N \times N` matrix is ever formed. At an
    exact KSVD of :math:`K_{att} = \Phi_q\Phi_k^\top = H_e\Lambda H_r^\top` (eq. 13) the
    projections are :math:`E = H_e\Lambda`, :math:`R = H_r\Lambda` (App. B.2 eq. 28), the
    kernel-eigen features of the SVGP pair. :math:`\Lambda = \mathrm{diag}(\lambda_1..\lambda_s) > 0`
    is learnable per head and shared by the KSVD loss (:meth:`ksvd_loss`) and the GP prior
    :math:`p(u_d) = \mathcal N(0, \Lambda^2)` of
    :class:`~gpattn_ppl.variational.KernelEigenPairStrategy`.

    Parameters (shapes): ``qk`` = ``Linear(C -> 2C, bias=False)`` split role-major
    ``[B, N, 2, H, D]`` (queries, keys); ``W_e``, ``W_r``: ``[H, D, s]``, orthonormal init;
    ``raw_lambda``: ``[H, s]`` with :math:`\Lambda = \exp(\texttt{raw\_lambda})` (a gpytorch
    :class:`~gpytorch.constraints.Positive` constraint with exp transform), initialised as the
    reference does, :math:`\log\Lambda^{-1/2} \sim U(0, 1)`, i.e. :math:`\Lambda\in(e^{-2}, 1)`.

    :param dim: model width C.
    :param heads: H (``D = C / H``).
    :param rank: s, the number of kernel-eigen features per head.
    :param feature_map: ``"cosine"`` (default, the paper's) or ``"linear"``.

    Cost O(N C² + N D s) per sequence for :meth:`forward`; O(N s) for :meth:`ksvd_loss`.

    >>> feats = KernelEigenFeatures(8, 2, 3)
    >>> E, R = feats(torch.randn(4, 5, 8))
    >>> E.shape, feats.ksvd_loss(E, R).shape
    (torch.Size([4, 2, 5, 3]), torch.Size([4]))
    """

    def __init__(self, dim: int, heads: int, rank: int, *, feature_map: str = "cosine") -> None:
        super().__init__()
        if dim <= 0 or heads <= 0 or dim % heads:
            raise ValueError(f"dim ({dim}) must be a positive multiple of heads ({heads})")
        if int(rank) < 1:
            raise ValueError(f"rank (s) must be >= 1, got {rank}")
        if feature_map not in FEATURE_MAPS:
            raise ValueError(f"unknown feature_map {feature_map!r}; allowed: {', '.join(FEATURE_MAPS)}")
        self.dim, self.heads, self.head_dim, self.rank = dim, heads, dim // heads, int(rank)
        self.feature_map = feature_map
        self.qk = nn.Linear(dim, 2 * dim, bias=False)
        self.W_e = nn.Parameter(_orthonormal(heads, self.head_dim, self.rank))
        self.W_r = nn.Parameter(_orthonormal(heads, self.head_dim, self.rank))
        self.register_parameter("raw_lambda", nn.Parameter(-2.0 * torch.rand(heads, self.rank)))
        self.register_constraint("raw_lambda", Positive(transform=torch.exp, inv_transform=torch.log))

    # -- Lambda ---------------------------------------------------------------------------------
    @property
    def lambda_(self) -> torch.Tensor:
        r""":math:`\Lambda` as ``[H, s]`` (the diagonals), positive."""
        return self.raw_lambda_constraint.transform(self.raw_lambda)

    @lambda_.setter
    def lambda_(self, value: torch.Tensor) -> None:
        value = torch.as_tensor(value, dtype=self.raw_lambda.dtype, device=self.raw_lambda.device)
        self.initialize(raw_lambda=self.raw_lambda_constraint.inverse_transform(value))

    # -- features -------------------------------------------------------------------------------
    def _qk(self, x: torch.Tensor, rotate: Callable | None) -> torch.Tensor:
        """``[B, N, 2, H, D]`` queries and keys of ``x``, rotated by ``rotate`` (a unit's
        :meth:`~gpattn_ppl.attention.AttentionUnit.rotate`) when given."""
        B, N, _ = x.shape
        qk = self.qk(x).view(B, N, 2, self.heads, self.head_dim)
        if rotate is not None:
            qk, = rotate(qk, token_dim=1)
        return qk

    def feature_maps(self, x: torch.Tensor, rotate: Callable | None = None
                     ) -> tuple[torch.Tensor, torch.Tensor]:
        r""":math:`\Phi_q, \Phi_k`: ``[B, N, C] -> 2 x [B, H, N, D]`` (eq. 10's feature maps);
        ``rotate``: applied to the queries and keys first (rotary position embeddings, which
        keep norms: the cosine map of the rotated vectors is the rotated map)."""
        qk = self._qk(x, rotate)
        if self.feature_map == "cosine":
            # q / max(||q||, 1e-12) as in F.normalize, one fused pass for q and k: an all-zero
            # (pad) row maps to 0, never NaN
            qk = qk * torch.rsqrt(qk.square().sum(-1, keepdim=True).clamp_min(1e-24))
        q, k = qk.permute(2, 0, 3, 1, 4)
        return q, k

    def project(self, phi_q: torch.Tensor, phi_k: torch.Tensor, mask: torch.Tensor | None = None
                ) -> tuple[torch.Tensor, torch.Tensor]:
        r""":math:`E = \Phi_q W_e`, :math:`R = \Phi_k W_r`: ``[B, H, N, D] -> [B, H, N, s]``.

        Rows of padded tokens (``mask[b, n] = False``) are set to exactly 0, so they take no part
        in the KSVD sums and their GP outputs are 0.
        """
        E = torch.einsum("bhnd,hds->bhns", phi_q, self.W_e.to(phi_q.dtype))
        R = torch.einsum("bhnd,hds->bhns", phi_k, self.W_r.to(phi_k.dtype))
        if mask is not None:
            keep = mask[:, None, :, None].to(E.dtype)
            E, R = E * keep, R * keep
        return E, R

    def forward(self, x: torch.Tensor, mask: torch.Tensor | None = None,
                rotate: Callable | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        r"""``x: [B, N, C]``, ``mask: [B, N]`` bool -> ``(E, R)``, each ``[B, H, N, s]``;
        ``rotate`` as for :meth:`feature_maps`.

        Equal to ``project(*feature_maps(x), mask)`` (tested) but computed without forming the
        normalised feature maps: for the cosine map :math:`e(x) = W_e^\top q / \lVert q\rVert =
        (q^\top W_e) / \lVert q\rVert`, so the projection is one strided batched matmul over
        (role, head) on the ``Linear`` output (no copy of ``q, k``) followed by a scaling of the
        small ``[.., s]`` result. The ``Linear`` runs in the input's (autocast) precision; the rest
        in :class:`~gpattn_ppl.settings.gp_dtype` with autocast off, and ``E, R`` are returned in it.
        """
        B, N, _ = x.shape
        H, D, s = self.heads, self.head_dim, self.rank
        qk = self.qk(x) if rotate is None else self._qk(x, rotate)   # [B, N, 2C], role-major
        dtype = settings.gp_dtype.resolve(x.dtype)
        with gp_precision(x.device.type):
            rows = qk.to(dtype).view(B * N, 2 * H, D)                 # row (b, n), col (role, h)
            W = torch.stack([self.W_e, self.W_r]).to(dtype).view(2 * H, D, s)
            ER = torch.bmm(rows.transpose(0, 1), W)                   # [2H, BN, s]
            if self.feature_map == "cosine":
                # 1 / max(||q||, 1e-12) as F.normalize: an all-zero (pad) row maps to 0, not NaN
                inv = torch.linalg.vector_norm(rows, dim=-1).clamp_min(1e-12).reciprocal()
                ER = ER * inv.T.unsqueeze(-1)
            ER = ER.view(2, H, B, N, s).permute(0, 2, 1, 3, 4)        # [2, B, H, N, s]
            if mask is not None:
                ER = ER * mask[None, :, None, :, None].to(dtype)
        return ER[0], ER[1]

    # -- KSVD objective -------------------------------------------------------------------------
    def ksvd_objective(self, E: torch.Tensor, R: torch.Tensor, mask: torch.Tensor | None = None
                       ) -> torch.Tensor:
        r"""The KSVD primal objective :math:`J` per sequence and head (App. C eq. 37), ``[B, H]``.

        .. math::
            J_{bh} = \tfrac12\sum_{i\in b} e_i^\top\Lambda_h^{-1}e_i
                   + \tfrac12\sum_{j\in b} r_j^\top\Lambda_h^{-1}r_j
                   - \mathrm{tr}(W_{e,h}^\top W_{r,h})

        summed over the *real* tokens of sequence b only. :math:`J = 0` at any exact KSVD
        stationary point (Chen et al. 2023, Lemma 4.2): with :math:`E = H_e\Lambda`,
        :math:`R = H_r\Lambda` and :math:`W_e = \Phi_k^\top H_r`, :math:`W_r = \Phi_q^\top H_e`
        all three terms equal :math:`\mathrm{tr}\,\Lambda`. ``E``, ``R`` must come from this
        module's current ``W_e``, ``W_r``.
        """
        if mask is not None:
            keep = mask[:, None, :, None].to(E.dtype)
            E, R = E * keep, R * keep
        inv_lam = self.lambda_.to(E.dtype).reciprocal()[:, None, :]          # [H, 1, s]
        quad = 0.5 * ((E.square() + R.square()) * inv_lam).sum((-2, -1))      # [B, H]
        trace = (self.W_e.to(E.dtype) * self.W_r.to(E.dtype)).sum((-2, -1))   # [H]
        return quad - trace

    def ksvd_loss(self, E: torch.Tensor, R: torch.Tensor, mask: torch.Tensor | None = None
                  ) -> torch.Tensor:
        r"""Per-sequence KSVD regulariser (KEP eq. 11), ``[B]``, unscaled.

        .. math::
            \mathcal L_{\mathrm{KSVD}, b} = \frac1H\sum_h \Big(\frac{J_{bh}}{n_b}\Big)^2

        with :math:`n_b` the number of real tokens [ours]: dividing by :math:`n_b`
        keeps the zero of eq. 11 at an exact KSVD and makes the weight :math:`\eta` comparable
        across lengths; the batch mean of this term is :math:`\mathrm{mean}_{b,h}(J_{bh}/n_b)^2`.
        """
        J = self.ksvd_objective(E, R, mask)
        if mask is None:
            n = torch.full((E.shape[0],), E.shape[-2], dtype=E.dtype, device=E.device)
        else:
            n = mask.sum(-1).to(E.dtype)
        return (J / n[:, None]).square().mean(-1)
