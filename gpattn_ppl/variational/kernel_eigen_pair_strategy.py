"""The SVGP pair of KEP-SVGP: kernel-eigen inducing features, q(u) and the two posteriors."""

from __future__ import annotations

import torch
from gpytorch.distributions import MultivariateNormal
from gpytorch.variational import CholeskyVariationalDistribution, _VariationalStrategy
from linear_operator.operators import (
    DiagLinearOperator,
    LowRankRootLinearOperator,
    MatmulLinearOperator,
)

from ..features.kernel_eigen import KernelEigenFeatures

__all__ = ["KernelEigenPairStrategy"]


class KernelEigenPairStrategy(_VariationalStrategy):
    r"""Variational strategy of KEP-SVGP (KEP eqs. 16-18, 21): one q(u) shared by two SVGPs.

    For head :math:`h` and output dimension :math:`d = 1..s` the inducing values
    :math:`u_d \in \mathbb R^s` are the projections of the GP on the kernel-eigen features, with
    prior and variational distribution (eqs. 16-17)

    .. math::
        p(u_d) = \mathcal N(0, \Lambda^2), \qquad q(u_d) = \mathcal N(m_d, S_d),\quad
        S_d = L_d L_d^\top,

    and cross-covariance :math:`K_{fu} = H_e\Lambda^2 = E\Lambda` (resp. :math:`R\Lambda`). Dropping
    the conditional-prior residual :math:`K_{att}K_{att}^\top - H_e\Lambda^2H_e^\top` (Remark 3.1),
    :math:`f_d \mid u_d = P\Lambda^{-1}u_d` exactly and the posteriors of the two branches
    (:math:`P = E` or :math:`P = R`, ``[B, H, N, s]``) are

    .. math::
        q(f_d) = \mathcal N\big(P\Lambda^{-1}m_d,\; P\Lambda^{-1}S_d\Lambda^{-1}P^\top\big).

    The covariance is written in the symmetric form; the paper's shorthand
    :math:`P\Lambda^{-2}S_dP^\top` equals it only when :math:`S_d` commutes with :math:`\Lambda`
    (see ``docs/derivations/kep_svgp.rst``). It is returned as a rank-s
    :class:`~linear_operator.operators.LowRankRootLinearOperator` with the lazy root
    :math:`(P\Lambda^{-1})L_d`; no ``N x N`` matrix is formed unless a caller densifies it.

    Shapes: q(u) is a gpytorch :class:`~gpytorch.variational.CholeskyVariationalDistribution`
    with batch shape ``[H, s]`` (head, output dimension d) and event shape ``s`` (feature i),
    i.e. ``variational_mean[h, d, :] = m_d``; posteriors have batch ``[B, H, s]`` and event ``N``.

    Caching: the features change with every input and the parameters with every step, so this
    strategy memoises nothing -- :attr:`prior_distribution` and :attr:`variational_distribution`
    are rebuilt on each access and :meth:`__call__` clears gpytorch's memo in train and eval mode.

    Initialisation [ours, METHODS §1.5]: :math:`m_d \sim \mathcal N(0, \Lambda^2)`,
    :math:`L_d = \Lambda` (q starts at the prior covariance, KL ≈ s²/2 per head).

    :param features: the layer's :class:`~gpattn_ppl.features.KernelEigenFeatures` (owns
        :math:`W_q, W_k, W_e, W_r, \Lambda`); registered as the submodule ``features``.

    Cost: mean O(N s²) per (b, h); a sample through :meth:`function_values` O(N s²); KL O(s³)
    per head, batch-free.

    >>> strat = KernelEigenPairStrategy(KernelEigenFeatures(8, 2, 3))
    >>> E, R = strat.features(torch.randn(4, 5, 8))
    >>> q_e, q_r = strat(E, R)
    >>> q_e.batch_shape, q_e.event_shape, strat.kl_divergence().shape
    (torch.Size([4, 2, 3]), torch.Size([5]), torch.Size([2, 3]))
    """

    def __init__(self, features: KernelEigenFeatures) -> None:
        H, s = features.heads, features.rank
        q_u = CholeskyVariationalDistribution(s, batch_shape=torch.Size([H, s]))
        # kernel-eigen features are indexed, not located: the "inducing points" are 0..s-1
        index = torch.arange(s, dtype=torch.get_default_dtype()).unsqueeze(-1)
        super().__init__(features, index, q_u, learn_inducing_locations=False)
        self.features = features
        with torch.no_grad():
            lam = features.lambda_.detach()                                   # [H, s]
            q_u.variational_mean.copy_(lam[:, None, :] * torch.randn(H, s, s))
            q_u.chol_variational_covar.copy_(torch.diag_embed(lam)[:, None].expand(H, s, s, s))
        self.variational_params_initialized.fill_(1)

    @property
    def heads(self) -> int:
        return self.features.heads

    @property
    def rank(self) -> int:
        return self.features.rank

    # -- distributions of u ---------------------------------------------------------------------
    @property
    def prior_distribution(self) -> MultivariateNormal:
        r""":math:`p(u_d) = \mathcal N(0, \Lambda^2)` with batch ``[H, s]``, event ``s``; a
        :class:`~linear_operator.operators.DiagLinearOperator` covariance (no s x s inversion)."""
        lam2 = self.features.lambda_.square()[:, None, :].expand(self.heads, self.rank, self.rank)
        return MultivariateNormal(torch.zeros_like(lam2), DiagLinearOperator(lam2))

    @property
    def variational_distribution(self) -> MultivariateNormal:
        r""":math:`q(u_d) = \mathcal N(m_d, L_dL_d^\top)`, batch ``[H, s]``, event ``s`` (not memoised)."""
        return self._variational_distribution()

    def _q_params(self, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """``(m [H, s, s], L [H, s, s, s] lower, Lambda [H, s])`` in ``dtype``."""
        q_u = self._variational_distribution
        L = q_u.chol_variational_covar.tril()
        return (q_u.variational_mean.to(dtype), L.to(dtype), self.features.lambda_.to(dtype))

    # -- posteriors -----------------------------------------------------------------------------
    def posterior(self, P: torch.Tensor) -> MultivariateNormal:
        r"""The posterior of one branch, :math:`q(f_d) = \mathcal N(P\Lambda^{-1}m_d,
        P\Lambda^{-1}S_d\Lambda^{-1}P^\top)`.

        :param P: ``[B, H, N, s]`` projections (``E``, ``R``, or ``E + R`` for the add merge,
            whose two branches share u).
        :returns: MVN with batch ``[B, H, s]`` (d) and event ``N``; covariance a rank-s lazy
            :class:`~linear_operator.operators.LowRankRootLinearOperator`.
        """
        m, L, lam = self._q_params(P.dtype)
        Pt = P * lam.reciprocal()[:, None, :]                                  # P Λ^{-1}
        mean = torch.einsum("bhni,hdi->bhdn", Pt, m)
        B, H, N, s = Pt.shape
        root = MatmulLinearOperator(Pt.unsqueeze(-3).expand(B, H, s, N, s),
                                    L.expand(B, H, s, s, s))                   # (PΛ^{-1}) L_d
        return MultivariateNormal(mean, LowRankRootLinearOperator(root))

    def forward(self, E: torch.Tensor, R: torch.Tensor
                ) -> tuple[MultivariateNormal, MultivariateNormal]:
        r"""The SVGP pair ``(q(f^e), q(f^r))`` of eq. 16 (symmetric covariance), for ``E, R: [B, H, N, s]``."""
        return self.posterior(E), self.posterior(R)

    def __call__(self, E: torch.Tensor, R: torch.Tensor
                 ) -> tuple[MultivariateNormal, MultivariateNormal]:
        """Clear every memo (train *and* eval mode), then :meth:`forward`."""
        self._clear_cache()
        return self.forward(E, R)

    def rsample_u(self, sample_shape: torch.Size = torch.Size()) -> torch.Tensor:  # noqa: B008
        r"""Reparameterised draws :math:`u_d = m_d + L_d\varepsilon_d`, :math:`\varepsilon_d\sim
        \mathcal N(0, I_s)`: ``[*sample_shape, H, s, s]`` (``u[..., h, d, i]``).

        The same distribution as ``variational_distribution.rsample(sample_shape)``, computed
        from the parameters directly (no linear-operator objects on the training fast path).
        """
        q_u = self._variational_distribution
        m, L = q_u.variational_mean, q_u.chol_variational_covar.tril()
        eps = torch.randn(torch.Size(sample_shape) + m.shape, dtype=m.dtype, device=m.device)
        return m + torch.einsum("hdij,...hdj->...hdi", L, eps)

    def function_values(self, P: torch.Tensor, u: torch.Tensor) -> torch.Tensor:
        r"""Function values given inducing values, :math:`F = P\Lambda^{-1}U` (eq. 18 via u).

        .. math:: F_{[:, d]} = P\Lambda^{-1}u_d

        :param P: ``[B, H, N, s]`` projections.
        :param u: ``[B, H, s, s]`` (one draw per sequence) or ``[H, s, s]`` (one per batch), laid
            out ``u[..., h, d, i]`` like :attr:`variational_distribution`; ``u = m`` gives the mean.
        :returns: ``[B, H, N, s]`` (last axis d). With :math:`u_d \sim q(u_d)` the columns have
            exactly the covariance of :meth:`posterior`.
        """
        Pt = P * self.features.lambda_.to(P.dtype).reciprocal()[:, None, :]  # P Λ^{-1}
        u = u.to(P.dtype)
        if u.dim() == 3:
            return torch.einsum("bhni,hdi->bhnd", Pt, u)
        return torch.einsum("bhni,bhdi->bhnd", Pt, u)

    # -- KL ---------------------------------------------------------------------------------------
    def kl_divergence(self) -> torch.Tensor:
        r"""KL(q(u) || p(u)) per head and output dimension, ``[H, s]`` (KEP eq. 21, brackets fixed).

        .. math::
            \mathrm{KL}_{hd} = \tfrac12\big[\mathrm{tr}(\Lambda^{-2}S_d) + m_d^\top\Lambda^{-2}m_d
            + \log|\Lambda^2| - \log|S_d| - s\big]

        in O(s³) per head with the diagonal prior; equal to gpytorch's generic KL and to
        ``torch.distributions.kl_divergence`` (tested). Sum it for eq. 21's per-head sum over d.
        """
        m, L, lam = self._q_params(self.features.lambda_.dtype)
        inv_lam2 = lam.square().reciprocal()                                  # [H, s]
        trace = (L.square() * inv_lam2[:, None, :, None]).sum((-2, -1))        # Σ_ij L_ij²/λ_i²
        maha = (m.square() * inv_lam2[:, None, :]).sum(-1)
        logdet_p = 2.0 * lam.log().sum(-1, keepdim=True)
        logdet_q = 2.0 * L.diagonal(dim1=-2, dim2=-1).abs().log().sum(-1)
        return 0.5 * (trace + maha + logdet_p - logdet_q - self.rank)
