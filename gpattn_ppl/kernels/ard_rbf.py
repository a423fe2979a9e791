"""ARD RBF kernel with a log-space evaluation for normalised attention."""

from __future__ import annotations

import torch
from gpytorch.kernels import RBFKernel

__all__ = ["ARDRBFKernel"]


class ARDRBFKernel(RBFKernel):
    r"""gpytorch's RBF kernel with ARD lengthscales, plus :meth:`log_forward`.

    .. math::
        \kappa(x, x') = \exp\Big(-\tfrac12 \sum_i \frac{(x_i - x'_i)^2}{\ell_i^2}\Big)

    Squared distances are expanded as :math:`\|a\|^2 + \|b\|^2 - 2 a^\top b` (never a
    ``[..., D, n, m]`` difference tensor). Wrap in :class:`gpytorch.kernels.ScaleKernel` for
    :math:`\sigma_f^2`.
    """

    def log_forward(self, x1: torch.Tensor, x2: torch.Tensor) -> torch.Tensor:
        r""":math:`\log\kappa(x_1, x_2) = -\tfrac12\|x_1/\ell - x_2/\ell\|^2`, ``[..., n, m]``."""
        ls = self.lengthscale
        a, b = x1 / ls, x2 / ls
        sq = (a * a).sum(-1, keepdim=True) + (b * b).sum(-1).unsqueeze(-2) - 2 * a @ b.transpose(-1, -2)
        return -0.5 * sq.clamp_min(0)
