"""Global inducing keys of decoupled SGPA: learned points in the layer's input space."""

from __future__ import annotations

import torch
from torch import nn

__all__ = ["GlobalInducingKeys"]


class GlobalInducingKeys(nn.Module):
    r"""M learned inducing inputs per head, projected by that head's own query weights.

    The points live in the layer's input space (width C, the space of the LayerNorm output the
    attention unit sees) and are mapped to key space exactly like the tokens:

    .. math::
        k_\beta^{h} = Z_\beta^{h}\,(W_{qk}^{h})^\top \in \mathbb R^{M\times D},\qquad
        W_{qk}^{h} = W_{qk}[hD:(h+1)D,\ :]

    where :math:`W_{qk}^{h}` is head h's block of output rows of the tied query/key projection.
    Each head uses its own rows -- the public decoupled code projects heads >= 1 with rows of the
    value or of other heads' weights (a fused-projection bug).

    :param heads: H. :param num_inducing: M (``0`` is allowed: no global keys).
    :param dim: C, the input width.

    Parameter ``inducing_inputs``: :math:`Z_\beta` of shape ``[H, M, C]``, initialised
    :math:`\mathcal N(0, 1)` [ref] (the scale of a LayerNorm output).

    Cost O(H M C D) per call; batch-independent.

    >>> keys = GlobalInducingKeys(heads=2, num_inducing=3, dim=8)
    >>> keys(torch.randn(2, 4, 8)).shape          # W_qk viewed [H, D, C]
    torch.Size([2, 3, 4])
    """

    def __init__(self, heads: int, num_inducing: int, dim: int) -> None:
        super().__init__()
        if heads <= 0 or dim <= 0 or num_inducing < 0:
            raise ValueError(f"need heads > 0, dim > 0 and num_inducing >= 0, got heads={heads}, "
                             f"num_inducing={num_inducing}, dim={dim}")
        self.heads, self.num_inducing, self.dim = heads, num_inducing, dim
        self.inducing_inputs = nn.Parameter(torch.randn(heads, num_inducing, dim))

    def forward(self, weight: torch.Tensor) -> torch.Tensor:
        r"""Per-head inducing keys :math:`k_\beta` ``[H, M, D]`` from ``weight`` ``[H, D, C]``.

        ``weight`` is the tied projection's weight ``W_qk`` (``[C, C]``, ``out x in``) viewed as
        ``[H, D, C]``: head h owns output rows ``h*D ... (h+1)*D - 1``.
        """
        if weight.dim() != 3 or weight.shape[0] != self.heads or weight.shape[-1] != self.dim:
            raise ValueError(f"weight must have shape [H={self.heads}, D, C={self.dim}], "
                             f"got {tuple(weight.shape)}")
        return torch.einsum("hmc,hdc->hmd", self.inducing_inputs.to(weight.dtype), weight)
