r"""A Gaussian over one head's attention output, correlated over tokens, shared by its columns."""

from __future__ import annotations

import math

import torch
from pyro.distributions import TorchDistribution
from torch.distributions import constraints, register_kl

from .. import linalg

__all__ = ["TokenNormal"]


class TokenNormal(TorchDistribution):
    r"""Matrix normal over :math:`Z \in \mathbb R^{N\times D}` with row covariance :math:`\Sigma`
    and identity column covariance: the D columns are independent,

    .. math::
        z_{:,d} \sim \mathcal N(\mu_{:,d}, \Sigma), \qquad d = 1, \dots, D,

    the predictive distribution of a correlated-GP attention head (CGPT App. B, SCGPT App. D).
    :math:`\Sigma` is given either densely by its lower Cholesky factor ``scale_tril``
    (:math:`\Sigma = L L^\top`, CGPT) or, without any :math:`N\times N` matrix, as a low-rank
    plus isotropic matrix :math:`\Sigma = s^2 I + R R^\top` (``cov_root`` R ``[..., N, r]``
    and ``noise_var`` :math:`s^2`, SCGPT).

    Batch shape ``loc.shape[:-2]`` (``[B, H]``), event shape ``(N, D)``.

    * :meth:`rsample`: :math:`\mu + L E` (dense) or :math:`\mu + s E_1 + R E_2` with iid
      standard normal :math:`E \in \mathbb R^{N\times D}`, :math:`E_2 \in \mathbb R^{r\times D}`:
      O(N² D) resp. O(N r D).
    * :meth:`log_prob`: dense triangular solve, or Woodbury with the capacitance
      :math:`I_r + s^{-2} R^\top R` (O(N r² + r³), no :math:`N\times N` matrix).
    * :attr:`covariance_matrix` is the per-head row covariance ``[..., N, N]`` (formed on
      demand); :attr:`variance` the marginal variances ``[..., N, D]``.

    :param loc: ``[..., N, D]`` mean.
    :param scale_tril: ``[..., N, N]`` lower Cholesky factor of :math:`\Sigma`.
    :param cov_root: ``[..., N, r]`` root R of the low-rank part.
    :param noise_var: :math:`s^2 > 0` (float or tensor broadcastable to the batch shape).
    :param where: the module path named if the capacitance of :meth:`log_prob` cannot be
        factorised (default ``"TokenNormal"``).

    The whitened inducing values of standard SGPA are a ``TokenNormal`` too (row covariance
    :math:`RR^\top` shared by the D channels). The KL between two dense ``TokenNormal``
    distributions is registered with :func:`torch.distributions.kl.register_kl`, so
    :func:`torch.distributions.kl.kl_divergence` computes it in closed form.

    >>> L = torch.eye(3).expand(2, 3, 3)
    >>> d = TokenNormal(torch.zeros(2, 3, 4), scale_tril=L)
    >>> d.rsample().shape, d.log_prob(torch.zeros(2, 3, 4)).shape
    (torch.Size([2, 3, 4]), torch.Size([2]))
    """

    arg_constraints: dict = {}
    support = constraints.independent(constraints.real, 2)
    has_rsample = True

    def __init__(self, loc: torch.Tensor, scale_tril: torch.Tensor | None = None, *,
                 cov_root: torch.Tensor | None = None, noise_var=None,
                 validate_args: bool | None = None, where: str = "") -> None:
        if (scale_tril is None) == (cov_root is None):
            raise ValueError("TokenNormal: give exactly one of scale_tril or cov_root")
        if cov_root is not None and noise_var is None:
            raise ValueError("TokenNormal: cov_root needs noise_var (the isotropic part s^2)")
        self.loc = loc
        self.where = where or type(self).__name__
        self.scale_tril = scale_tril
        self.cov_root = cov_root
        if noise_var is not None and not torch.is_tensor(noise_var):
            noise_var = torch.full((), float(noise_var), dtype=loc.dtype, device=loc.device)
        self.noise_var = noise_var
        super().__init__(loc.shape[:-2], loc.shape[-2:], validate_args=validate_args)

    # -- moments --------------------------------------------------------------------------------
    @property
    def mean(self) -> torch.Tensor:
        return self.loc

    def _nv(self) -> torch.Tensor:
        """``noise_var`` shaped to broadcast against ``[..., N, k]``."""
        nv = self.noise_var
        return nv.reshape(nv.shape + (1, 1))

    @property
    def covariance_matrix(self) -> torch.Tensor:
        """Row covariance :math:`\\Sigma` per head, ``[..., N, N]``."""
        if self.scale_tril is not None:
            return self.scale_tril @ self.scale_tril.mT
        R = self.cov_root
        eye = torch.eye(R.shape[-2], dtype=R.dtype, device=R.device)
        return self._nv() * eye + R @ R.mT

    @property
    def variance(self) -> torch.Tensor:
        """Marginal variances ``[..., N, D]`` (the diagonal of :math:`\\Sigma`, per column)."""
        if self.scale_tril is not None:
            diag = self.scale_tril.square().sum(-1)
        else:
            diag = self._nv()[..., 0] + self.cov_root.square().sum(-1)
        return diag.unsqueeze(-1).expand(self.loc.shape)

    def expand(self, batch_shape, _instance=None) -> TokenNormal:
        """The same distribution broadcast to ``batch_shape`` (views, no copies)."""
        batch_shape = torch.Size(batch_shape)
        if batch_shape == self.batch_shape:
            return self
        loc = self.loc.expand(batch_shape + self.loc.shape[-2:])
        if self.scale_tril is not None:
            return TokenNormal(loc, scale_tril=self.scale_tril.expand(
                batch_shape + self.scale_tril.shape[-2:]), validate_args=False)
        nv = self.noise_var
        return TokenNormal(loc, cov_root=self.cov_root.expand(batch_shape + self.cov_root.shape[-2:]),
                           noise_var=nv.expand(batch_shape) if nv.dim() else nv,
                           validate_args=False, where=self.where)

    # -- sampling and density -------------------------------------------------------------------
    def rsample(self, sample_shape=()) -> torch.Tensor:
        """A reparameterised draw ``[*sample_shape, ..., N, D]`` (cost in the class docstring)."""
        shape = torch.Size(sample_shape) + self.loc.shape
        eps = torch.randn(shape, dtype=self.loc.dtype, device=self.loc.device)
        if self.scale_tril is not None:
            return self.loc + (self.scale_tril.to(self.loc.dtype) @ eps)
        R = self.cov_root.to(self.loc.dtype)
        eps2 = torch.randn(torch.Size(sample_shape) + R.shape[:-2] + (R.shape[-1], self.loc.shape[-1]),
                           dtype=self.loc.dtype, device=self.loc.device)
        return self.loc + self._nv().to(self.loc.dtype).sqrt() * eps + R @ eps2

    def log_prob(self, value: torch.Tensor) -> torch.Tensor:
        """Log density of ``value`` ``[..., N, D]``, summed over the event: shape ``[...]``."""
        if self._validate_args:
            self._validate_sample(value)
        N, D = self.loc.shape[-2:]
        r = value - self.loc
        if self.scale_tril is not None:
            L = self.scale_tril
            w = linalg.triangular_solve(r, L.expand(r.shape[:-2] + L.shape[-2:]))
            quad = w.square().sum((-1, -2))
            logdet = 2.0 * L.diagonal(dim1=-2, dim2=-1).log().sum(-1)
        else:
            R, nv = self.cov_root, self._nv()
            s2 = nv[..., 0, 0]
            eye = torch.eye(R.shape[-1], dtype=R.dtype, device=R.device)
            Lc = linalg.cholesky(eye + (R.mT @ R) / nv,  # capacitance I + R^T R / s^2
                                 where=f"{self.where} capacitance")
            w = linalg.triangular_solve(R.mT @ r, Lc.expand(r.shape[:-2] + Lc.shape[-2:]))
            quad = r.square().sum((-1, -2)) / s2 - w.square().sum((-1, -2)) / s2**2
            logdet = N * s2.log() + 2.0 * Lc.diagonal(dim1=-2, dim2=-1).log().sum(-1)
        out = -0.5 * (quad + D * logdet + N * D * math.log(2 * math.pi))
        return out.to(self.loc.dtype)

    @classmethod
    def standard(cls, like: TokenNormal) -> TokenNormal:
        r""":math:`\mathcal N(0, I)` per column with the batch and event shape of ``like``."""
        loc = torch.zeros((), dtype=like.loc.dtype, device=like.loc.device).expand(like.loc.shape)
        N = like.loc.shape[-2]
        eye = torch.eye(N, dtype=like.loc.dtype, device=like.loc.device)
        return cls(loc, scale_tril=eye.expand(like.loc.shape[:-2] + (N, N)), validate_args=False)


@register_kl(TokenNormal, TokenNormal)
def _kl_token_normal(q: TokenNormal, p: TokenNormal) -> torch.Tensor:
    r"""KL of two dense ``TokenNormal`` distributions, summed over the D independent columns,
    ``[...]``:

    .. math::
        \tfrac12\big[D\,\lVert L_p^{-1}L_q\rVert_F^2 + \lVert L_p^{-1}(\mu_q - \mu_p)\rVert_F^2
        - ND\big] + D\sum_i(\log L_{p,ii} - \log L_{q,ii}).
    """
    if q.scale_tril is None or p.scale_tril is None:
        raise NotImplementedError("KL between low-rank TokenNormals is not implemented")
    N, D = q.loc.shape[-2:]
    Lq, Lp = q.scale_tril, p.scale_tril
    shape = torch.broadcast_shapes(Lq.shape, Lp.shape)
    trace = linalg.triangular_solve(Lq.expand(shape), Lp.expand(shape)).square().sum((-2, -1))
    r = q.loc - p.loc
    maha = linalg.triangular_solve(r, Lp.expand(r.shape[:-2] + Lp.shape[-2:])).square().sum((-2, -1))
    logdet = (Lp.diagonal(dim1=-2, dim2=-1).log().sum(-1)
              - Lq.diagonal(dim1=-2, dim2=-1).log().sum(-1))
    return 0.5 * (D * trace + maha - N * D) + D * logdet
