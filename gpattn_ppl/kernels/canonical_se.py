"""The canonical, parameter-free squared-exponential kernel of CGPT / SCGPT."""

from __future__ import annotations

import copy
import math

import torch
from gpytorch.kernels import Kernel

__all__ = ["CanonicalSEKernel", "canonical_projection_init_"]

#: median squared distance between two projected tokens at initialisation [ours]
TARGET_SQ_DIST = 1.5


class CanonicalSEKernel(Kernel):
    r"""The canonical squared-exponential kernel :math:`\kappa_o` (CGPT Definition 1, §3.1).

    .. math::
        \kappa_o(x, x') = \exp\big(-\tfrac12 \lVert x - x' \rVert^2\big)

    It has no hyperparameters: every scale of a CGP lives in the affine input scalings
    :math:`(W_q, \sigma_q)`, :math:`(W_k, \sigma_k)` and in the latent projection :math:`W_o`
    (CGPT eqs. 13-16). Squared distances are expanded as
    :math:`\lVert a\rVert^2 + \lVert b\rVert^2 - 2 a^\top b` (clamped at 0), so no
    ``[..., D, n, m]`` difference tensor is formed: ``x1: [..., n, D]``, ``x2: [..., m, D]``
    give ``[..., n, m]`` in O(n m D) time.

    :meth:`log_forward` is the log kernel :math:`-\tfrac12\lVert x - x'\rVert^2`, used by
    (normalised) kernel attention through :func:`gpattn_ppl.kernels.log_gram`.

    >>> k = CanonicalSEKernel()
    >>> x = torch.zeros(2, 3)
    >>> k(x).to_dense()
    tensor([[1., 1.],
            [1., 1.]])
    """

    has_lengthscale = False

    @staticmethod
    def sq_dist(x1: torch.Tensor, x2: torch.Tensor) -> torch.Tensor:
        r""":math:`\lVert x_{1,a} - x_{2,b}\rVert^2` as ``[..., n, m]`` (never negative)."""
        sq = ((x1 * x1).sum(-1, keepdim=True) + (x2 * x2).sum(-1).unsqueeze(-2)
              - 2.0 * x1 @ x2.transpose(-1, -2))
        return sq.clamp_min(0.0)

    def log_forward(self, x1: torch.Tensor, x2: torch.Tensor) -> torch.Tensor:
        r""":math:`\log\kappa_o(x_1, x_2) = -\tfrac12\lVert x_1 - x_2\rVert^2`, ``[..., n, m]``."""
        return -0.5 * self.sq_dist(x1, x2)

    def __getitem__(self, index) -> CanonicalSEKernel:
        """Index the kernel's batch (gpytorch derives the new batch shape from the indexed
        parameters; this kernel has none, so it is derived from the shape itself)."""
        if len(self.batch_shape) == 0:
            return self
        new = copy.deepcopy(self)
        new.batch_shape = torch.empty(self.batch_shape, device="meta")[index].shape
        return new

    @staticmethod
    def gram(x1: torch.Tensor, x2: torch.Tensor, *, log_scale: torch.Tensor | None = None,
             rows: torch.Tensor | None = None, cols: torch.Tensor | None = None) -> torch.Tensor:
        r"""The scaled, masked Gram matrix in one fused pass, ``[..., n, m]``:

        .. math::
            K_{ab} = \exp\Big(\min\big(\log s,\; x_{1,a}^\top x_{2,b} - \tfrac12\lVert x_{1,a}
            \rVert^2 - \tfrac12\lVert x_{2,b}\rVert^2 + \beta_a + \gamma_b\big)\Big)
            = s\,\kappa_o(x_{1,a}, x_{2,b})\,[\text{row } a\text{ and column } b\text{ real}],

        with :math:`\beta_a, \gamma_b \in \{0, -\infty\}` from the masks (a padded row or
        column is exactly 0, and so is its gradient) and the clamp at :math:`\log s` the
        :math:`\lVert\cdot\rVert^2 \ge 0` of :meth:`sq_dist`. One product and three passes over
        the ``[..., n, m]`` result, against eight for ``s * forward(x1, x2) * mask``.

        :param x1: ``[..., n, D]``. :param x2: ``[..., m, D]``.
        :param log_scale: :math:`\log s`, broadcastable to ``[..., 1, 1]`` (default 0: s = 1).
        :param rows: ``[..., n]`` bool (True = real) or ``None``; ``cols`` likewise ``[..., m]``.
        """
        a = -0.5 * x1.square().sum(-1, keepdim=True)                 # [..., n, 1]
        if log_scale is not None:
            a = a + log_scale
        b = -0.5 * x2.square().sum(-1).unsqueeze(-2)                 # [..., 1, m]
        if rows is not None:
            a = a.masked_fill(~rows.unsqueeze(-1), float("-inf"))
        if cols is not None:
            b = b.masked_fill(~cols.unsqueeze(-2), float("-inf"))
        expo = torch.matmul(x1, x2.transpose(-1, -2)).add_(a).add_(b)
        return torch.exp(torch.clamp(expo, max=0.0 if log_scale is None else log_scale))

    def forward(self, x1: torch.Tensor, x2: torch.Tensor, diag: bool = False,
                last_dim_is_batch: bool = False, **params) -> torch.Tensor:
        if last_dim_is_batch:
            x1 = x1.transpose(-1, -2).unsqueeze(-1)
            x2 = x2.transpose(-1, -2).unsqueeze(-1)
        if diag:
            res = torch.exp(-0.5 * (x1 - x2).square().sum(-1))
            event = res.shape[-1:]
        else:
            res = torch.exp(self.log_forward(x1, x2))
            event = res.shape[-2:]
        if not self.batch_shape:           # the attention units' case: no broadcast to do
            return res
        # a kernel built with a batch_shape returns that batch for un-batched inputs (gpytorch)
        batch = torch.broadcast_shapes(self.batch_shape, res.shape[:len(res.shape) - len(event)])
        return res.expand(batch + event)


def canonical_projection_init_(weight: torch.Tensor, head_dim: int,
                               target_sq_dist: float = TARGET_SQ_DIST) -> torch.Tensor:
    r"""Initialise a projection feeding :math:`\kappa_o` so kernel values start informative.

    With unit-variance inputs of width :math:`C` and iid weights of variance :math:`s^2`, two
    projected tokens in :math:`\mathbb R^D` are at expected squared distance
    :math:`2 D C s^2`. The default ``nn.Linear`` init gives about :math:`2D/3` (21 for D = 32),
    so :math:`\kappa_o \approx 2\cdot10^{-5}` off the diagonal and the kernel starts as the
    identity. This draws
    :math:`W \sim \mathcal N(0, s^2)` with :math:`2 D C s^2 =` ``target_sq_dist`` [ours].

    :param weight: ``[rows, C]`` weight (or a view of some of its rows), filled in place.
    :param head_dim: D, the width of the kernel's input per head.
    :returns: ``weight``.
    """
    C = weight.shape[-1]
    with torch.no_grad():
        return weight.normal_(0.0, math.sqrt(target_sq_dist / (2.0 * head_dim * C)))
