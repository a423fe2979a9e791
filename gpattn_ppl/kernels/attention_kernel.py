"""Scaled attention kernels: ``sigma_f^2 * base`` with a log-space path."""

from __future__ import annotations

import math

import torch
from gpytorch.kernels import ScaleKernel

from .ard_rbf import ARDRBFKernel
from .canonical_se import CanonicalSEKernel
from .exponential_dot import ExponentialDotKernel

__all__ = ["KERNELS", "make_attention_kernel", "log_gram", "gram"]

KERNELS = ("exponential", "rbf", "canonical")


def make_attention_kernel(name: str, heads: int, head_dim: int) -> ScaleKernel:
    r"""A per-head ``ScaleKernel(base)`` with batch shape ``(H,)`` and ARD over ``D`` dims.

    Initialisation [ours]: :math:`\sigma_f^2 = 1`; exponential: :math:`\ell_i = D^{1/4}` so that
    :math:`\log\kappa = q^\top k / \sqrt{D}` (scaled dot product at init); RBF:
    :math:`\ell_i = \sqrt{D}`, so squared distances enter on the same :math:`O(1)` scale.

    :param name: ``"exponential"``, ``"rbf"`` or ``"canonical"`` (CGPT's parameter-free SE
        :math:`\exp(-\tfrac12\lVert x - x'\rVert^2)`, amplitude fixed at 1).
    """
    batch = torch.Size([heads])
    if name == "exponential":
        base = ExponentialDotKernel(ard_num_dims=head_dim, batch_shape=batch)
        base.lengthscale = torch.full((heads, 1, head_dim), head_dim ** 0.25)
    elif name == "rbf":
        base = ARDRBFKernel(ard_num_dims=head_dim, batch_shape=batch)
        base.lengthscale = torch.full((heads, 1, head_dim), math.sqrt(head_dim))
    elif name == "canonical":  # CGPT's parameter-free SE: sigma_f^2 = 1 fixed, no lengthscale
        base = CanonicalSEKernel(batch_shape=batch)
    else:
        raise ValueError(f"unknown kernel '{name}'; allowed: {', '.join(KERNELS)}")
    kernel = ScaleKernel(base, batch_shape=batch)
    kernel.outputscale = torch.ones(heads)
    if name == "canonical":
        kernel.raw_outputscale.requires_grad_(False)
    return kernel


def log_gram(kernel: ScaleKernel, q: torch.Tensor, k: torch.Tensor) -> torch.Tensor:
    r""":math:`\log \mathcal K_{ab} = \log\sigma_f^2 + \log\kappa(q_a, k_b)` for ``q: [B, H, N, D]``,
    ``k: [B, H, N', D]``; returns ``[B, H, N, N']``."""
    log_scale = kernel.outputscale.log().view(-1, 1, 1)
    return log_scale + kernel.base_kernel.log_forward(q, k)


def gram(kernel: ScaleKernel, q: torch.Tensor, k: torch.Tensor) -> torch.Tensor:
    r"""Dense :math:`\mathcal K_{ab} = \sigma_f^2\kappa(q_a, k_b)`, ``[B, H, N, N']``."""
    return torch.exp(log_gram(kernel, q, k))
