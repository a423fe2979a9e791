r"""The one predictive type of every attention unit: a distribution over its head outputs."""

from __future__ import annotations

import torch
from gpytorch.distributions import MultivariateNormal
from linear_operator.operators import (
    DenseLinearOperator,
    DiagLinearOperator,
    LinearOperator,
    LowRankRootLinearOperator,
    MatmulLinearOperator,
    RootLinearOperator,
    SumLinearOperator,
)

from .token_normal import TokenNormal

__all__ = ["AttentionPredictive"]


class AttentionPredictive:
    r"""The predictive distribution of one call's head outputs (before :math:`W_O`).

    Every unit's :meth:`~gpattn_ppl.attention.AttentionUnit.predictive` returns this type:

    * ``mean`` ``[B, H, N, D]`` -- the posterior mean of the head outputs;
    * ``variance`` ``[B, H, N, D]`` -- their marginal variances (exact, unclamped; 0 for
      deterministic units and on padded tokens where the unit decouples them);
    * ``mvn`` -- where the unit has one, the joint over tokens per head and channel as a
      gpytorch :class:`~gpytorch.distributions.MultivariateNormal` with batch ``[B, H, D]`` and
      event ``N`` and a lazy (linear-operator) covariance; ``None`` for deterministic units.

    Build it with :meth:`from_mvn`, :meth:`from_root`, :meth:`from_token_normal` or
    :meth:`point`; :meth:`masked` zeroes the padded tokens (every GP unit returns it masked:
    mean, variance and joint exactly 0 on pads).

    >>> p = AttentionPredictive.point(torch.zeros(2, 3, 5, 4))
    >>> p.mean.shape, float(p.variance.abs().sum()), p.mvn is None
    (torch.Size([2, 3, 5, 4]), 0.0, True)
    """

    def __init__(self, mean: torch.Tensor, variance: torch.Tensor,
                 mvn: MultivariateNormal | None = None) -> None:
        if variance.shape != mean.shape:
            raise ValueError(f"AttentionPredictive: variance {tuple(variance.shape)} does not match "
                             f"mean {tuple(mean.shape)}")
        self.mean, self.variance, self.mvn = mean, variance, mvn

    @property
    def stddev(self) -> torch.Tensor:
        """Marginal standard deviations ``[B, H, N, D]``."""
        return self.variance.clamp_min(0.0).sqrt()

    @classmethod
    def point(cls, mean: torch.Tensor) -> AttentionPredictive:
        """A deterministic unit's output ``[B, H, N, D]``: zero variance, no joint."""
        return cls(mean, torch.zeros_like(mean))

    @classmethod
    def from_mvn(cls, mvn: MultivariateNormal) -> AttentionPredictive:
        """From a gpytorch MVN with batch ``[B, H, D]``, event ``N``."""
        variance = mvn.lazy_covariance_matrix.diagonal(dim1=-2, dim2=-1)
        return cls(mvn.mean.mT, variance.mT, mvn)

    @classmethod
    def from_root(cls, mean: torch.Tensor, root: torch.Tensor) -> AttentionPredictive:
        r"""Mean ``[B, H, N, D]`` and a per-channel covariance root ``[B, H, D, N, r]``
        (:math:`\Sigma_{hd} = R_{hd}R_{hd}^\top`, rank r)."""
        mvn = MultivariateNormal(mean.mT, LowRankRootLinearOperator(root))
        return cls(mean, root.square().sum(-1).mT, mvn)

    @classmethod
    def from_token_normal(cls, tn: TokenNormal) -> AttentionPredictive:
        """From a :class:`~gpattn_ppl.distributions.TokenNormal` (row covariance shared by the D
        channels of a head): the joint per channel is that row covariance."""
        B_H, (N, D) = tn.loc.shape[:-2], tn.loc.shape[-2:]
        shape = B_H + (D, N)
        if tn.scale_tril is not None:
            L = tn.scale_tril.unsqueeze(-3).expand(shape + (N,))
            cov = RootLinearOperator(L)
        else:
            r = tn.cov_root.shape[-1]
            R = tn.cov_root.unsqueeze(-3).expand(shape + (r,))
            nv = tn.noise_var.reshape(tn.noise_var.shape + (1, 1)).expand(shape)
            cov = SumLinearOperator(RootLinearOperator(R), DiagLinearOperator(nv))
        return cls(tn.loc, tn.variance, MultivariateNormal(tn.loc.mT, cov))

    def masked(self, mask: torch.Tensor | None) -> AttentionPredictive:
        """The same predictive with the padded tokens (``mask [B, N]`` False) exactly 0: mean,
        variance and the rows and columns of the joint. Real tokens are multiplied by 1 (exact).
        The joint stays lazy: roots get their pad rows zeroed, other operators are wrapped."""
        if mask is None:
            return self
        keep = mask[:, None, :, None].to(self.mean.dtype)
        mean, variance = self.mean * keep, self.variance * keep
        mvn = None
        if self.mvn is not None:
            cov = self.mvn.lazy_covariance_matrix
            m = mask[:, None, None, :].to(cov.dtype).expand(cov.shape[:-1])
            mvn = MultivariateNormal(mean.mT, _mask_operator(cov, m))
        return type(self)(mean, variance, mvn)


def _mask_operator(cov: LinearOperator, m: torch.Tensor) -> LinearOperator:
    r""":math:`D_m\,\Sigma\,D_m` with :math:`D_m = \mathrm{diag}(m)`, keeping the structure."""
    if isinstance(cov, (RootLinearOperator, LowRankRootLinearOperator)):
        return type(cov)(MatmulLinearOperator(DiagLinearOperator(m), cov.root))
    if isinstance(cov, SumLinearOperator):
        return SumLinearOperator(*(_mask_operator(op, m) for op in cov.linear_ops))
    if isinstance(cov, DiagLinearOperator):
        return DiagLinearOperator(cov.diagonal(dim1=-2, dim2=-1) * m)
    if isinstance(cov, DenseLinearOperator):
        return DenseLinearOperator(cov.tensor * m.unsqueeze(-1) * m.unsqueeze(-2))
    D = DiagLinearOperator(m)
    return MatmulLinearOperator(D, MatmulLinearOperator(cov, D))
