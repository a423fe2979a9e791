r"""Multivariate normals of the variational GP units: draws that never broadcast the scale, and
the whitened prior with its O(n²) KL."""

from __future__ import annotations

import pyro.distributions as pdist
import torch
from torch.distributions import MultivariateNormal as TorchMVN
from torch.distributions import register_kl

__all__ = ["SharedScaleMVN", "StandardNormalMVN"]


class SharedScaleMVN(pdist.MultivariateNormal):
    r"""A multivariate normal whose draws never materialise its scale over expanded dimensions.

    ``q.expand([B, ...]).rsample()`` of a torch multivariate normal multiplies the noise by the
    scale through ``matmul`` broadcasting, which copies the scale ``B`` times. Here a draw is

    .. math:: v = \mu + L\varepsilon, \qquad \varepsilon \sim \mathcal N(0, I),

    with one ``einsum`` over the unbroadcast factor :math:`L` (``[..., n, n]``) and the noise
    ``[*sample, *batch, n]``: the same distribution and the same noise draws, O(n) extra memory
    per sample. The global inducing values of decoupled SGPA and KEP-SVGP, drawn once per
    sequence, use it.

    >>> q = SharedScaleMVN(torch.zeros(2, 3), scale_tril=torch.eye(3).expand(2, 3, 3))
    >>> q.expand(torch.Size([5, 2])).rsample().shape
    torch.Size([5, 2, 3])
    """

    def __init__(self, loc: torch.Tensor, scale_tril: torch.Tensor,
                 validate_args: bool | None = None) -> None:
        # torch's constructor broadcasts the shapes through its symbolic-shape path (tens of
        # microseconds per call, on every training step); the same broadcast in plain Python
        batch_shape = _broadcast(tuple(loc.shape[:-1]), tuple(scale_tril.shape[:-2]))
        self.loc = loc.expand(batch_shape + loc.shape[-1:])
        self._unbroadcasted_scale_tril = scale_tril
        torch.distributions.Distribution.__init__(self, batch_shape, loc.shape[-1:],
                                                  validate_args=validate_args)

    def expand(self, batch_shape, _instance=None) -> SharedScaleMVN:
        """Broadcast to ``batch_shape``: the mean is expanded (a view), the factor is kept
        unbroadcast, so draws of the expanded distribution never copy it."""
        new = self._get_checked_instance(SharedScaleMVN, _instance)
        batch_shape = torch.Size(batch_shape)
        new.loc = self.loc.expand(batch_shape + self.event_shape)
        new._unbroadcasted_scale_tril = self._unbroadcasted_scale_tril
        torch.distributions.Distribution.__init__(new, batch_shape, self.event_shape,
                                                  validate_args=False)
        new._validate_args = self._validate_args
        return new

    def rsample(self, sample_shape=torch.Size()) -> torch.Tensor:  # noqa: B008
        eps = torch.randn(self._extended_shape(sample_shape), dtype=self.loc.dtype,
                          device=self.loc.device)
        return self.loc + torch.einsum("...ij,...j->...i", self._unbroadcasted_scale_tril, eps)


def _broadcast(a: tuple[int, ...], b: tuple[int, ...]) -> torch.Size:
    """NumPy broadcasting of two shapes (``ValueError`` when they do not broadcast)."""
    n = max(len(a), len(b))
    a, b = (1,) * (n - len(a)) + a, (1,) * (n - len(b)) + b
    out = []
    for x, y in zip(a, b):
        if x != y and x != 1 and y != 1:
            raise ValueError(f"shapes {a} and {b} do not broadcast")
        out.append(y if x == 1 else x)
    return torch.Size(out)


class StandardNormalMVN(pdist.MultivariateNormal):
    r"""The whitened prior :math:`\mathcal N(0, I_n)` as a (Pyro) multivariate normal.

    Its KL against any multivariate normal :math:`q = \mathcal N(m, R R^\top)` is registered in
    closed form at O(n²) per batch element (torch's generic MVN-MVN KL would solve a triangular
    system against the identity, O(n³)):

    .. math:: \mathrm{KL}(q\,\|\,p) = \tfrac12\big[\|R\|_F^2 + \|m\|^2 - n\big] - \sum_i \log R_{ii}

    Build it with :meth:`like` so that its batch shape equals that of ``q`` (Pyro requires the
    guide and model sites to agree exactly).
    """

    @classmethod
    def like(cls, q: TorchMVN) -> StandardNormalMVN:
        """``N(0, I)`` with the batch and event shape, dtype and device of ``q``."""
        n = q.event_shape[0]
        loc = torch.zeros((), dtype=q.loc.dtype, device=q.loc.device).expand(q.loc.shape)
        eye = torch.eye(n, dtype=q.loc.dtype, device=q.loc.device)
        return cls(loc, scale_tril=eye, validate_args=False)


@register_kl(TorchMVN, StandardNormalMVN)
def _kl_mvn_standard_normal(q: TorchMVN, p: StandardNormalMVN) -> torch.Tensor:
    R = q._unbroadcasted_scale_tril
    n = q.event_shape[0]
    half_logdet = R.diagonal(dim1=-2, dim2=-1).log().sum(-1)
    trace = R.square().sum((-2, -1))
    maha = (q.loc - p.loc).square().sum(-1)
    kl = 0.5 * (trace + maha - n) - half_logdet
    return kl.expand(torch.broadcast_shapes(q.batch_shape, p.batch_shape))
