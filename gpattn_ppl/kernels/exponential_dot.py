"""Exponential scaled dot-product kernel."""

from __future__ import annotations

import torch
from gpytorch.kernels import Kernel

__all__ = ["ExponentialDotKernel"]


class ExponentialDotKernel(Kernel):
    r"""The exponential scaled dot-product kernel (SGPA on text, kernel attention).

    .. math::
        \kappa(x, x') = \exp\Big(\sum_i \frac{x_i x'_i}{\ell_i^2}\Big)

    A valid kernel (the exponential of a PSD linear kernel). Wrap it in
    :class:`gpytorch.kernels.ScaleKernel` for the amplitude :math:`\sigma_f^2`. Nothing bounds the
    dot product, so :meth:`log_forward` is what normalised attention uses.

    :param ard_num_dims: D, one lengthscale per input dimension.
    :param batch_shape: ``(H,)`` for one kernel per head.

    >>> k = ExponentialDotKernel(ard_num_dims=4, batch_shape=torch.Size([2]))
    >>> k(torch.randn(2, 5, 4)).to_dense().shape
    torch.Size([2, 5, 5])
    """

    has_lengthscale = True

    def log_forward(self, x1: torch.Tensor, x2: torch.Tensor) -> torch.Tensor:
        r""":math:`\log\kappa(x_1, x_2) = (x_1/\ell)(x_2/\ell)^\top`, ``[..., n, m]``."""
        ls = self.lengthscale
        return (x1 / ls) @ (x2 / ls).transpose(-1, -2)

    def forward(self, x1: torch.Tensor, x2: torch.Tensor, diag: bool = False, **params
                ) -> torch.Tensor:
        if diag:
            ls = self.lengthscale
            return torch.exp(((x1 / ls) * (x2 / ls)).sum(-1))
        return torch.exp(self.log_forward(x1, x2))
