r"""The affine output scales :math:`\sigma_q, \sigma_k` shared by the exact and sparse correlated GPs."""

from __future__ import annotations

import torch
from gpytorch.constraints import Positive
from torch import nn

__all__ = ["CorrelatedScales"]


class CorrelatedScales:
    r"""Mixin for a :class:`gpytorch.Module`: the query and key GPs are
    :math:`z_q = \sigma_q z_o(xW_q)` and :math:`z_k = \sigma_k z_o(xW_k)` (CGPT eqs. 13-16).

    ``_init_scales`` registers ``raw_scale_q`` and ``raw_scale_k`` (``[H]`` per head or
    ``[1]`` shared, initialised at :math:`\sigma = 1`) with :class:`~gpytorch.constraints.Positive`
    constraints; :attr:`scale_q` and :attr:`scale_k` are the constrained values.
    """

    def _init_scales(self, heads: int, per_head: bool) -> None:
        n = heads if per_head else 1
        init = Positive().inverse_transform(torch.tensor(1.0))
        self.register_parameter("raw_scale_q", nn.Parameter(init.repeat(n)))
        self.register_parameter("raw_scale_k", nn.Parameter(init.repeat(n)))
        self.register_constraint("raw_scale_q", Positive())
        self.register_constraint("raw_scale_k", Positive())

    @property
    def scale_q(self) -> torch.Tensor:
        r""":math:`\sigma_q`, ``[H]`` or ``[1]``."""
        return self.raw_scale_q_constraint.transform(self.raw_scale_q)

    @property
    def scale_k(self) -> torch.Tensor:
        r""":math:`\sigma_k`, ``[H]`` or ``[1]``."""
        return self.raw_scale_k_constraint.transform(self.raw_scale_k)
