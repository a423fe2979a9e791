"""The SVGP pair of KEP-SVGP: kernel-eigen inducing features, q(u) and the two posteriors."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch
from gpytorch.variational import CholeskyVariationalDistribution

from ..distributions import AttentionPredictive, SharedScaleMVN
from ..features.kernel_eigen import KernelEigenFeatures
from ..gp.head import GPHead, Sample

__all__ = ["KEPState", "KernelEigenPairStrategy"]

#: the head output as a linear map of U, ``[(G_r [B, H, N, s], W_r [H, s, D])]``:
#: :math:`O = \sum_r G_r U^\top W_r`
OutputMaps = Callable[[torch.Tensor, torch.Tensor], list[tuple[torch.Tensor, torch.Tensor]]]


@dataclass
class KEPState:
    r"""The prepared state of one KEP-SVGP call: the KSVD projections (GP dtype).

    :ivar E: :math:`E` ``[B, H, N, s]`` (pad rows 0).
    :ivar R: :math:`R` ``[B, H, N, s]`` (pad rows 0).
    :ivar output_maps: the unit's output as a linear map of U, called as
        ``output_maps(E, R)`` by :meth:`KernelEigenPairStrategy.predictive` only.
    :ivar mask: ``[B, N]`` or ``None``.
    :ivar where: the unit named in messages.
    """

    E: torch.Tensor
    R: torch.Tensor
    output_maps: OutputMaps | None
    mask: torch.Tensor | None
    where: str = ""


class KernelEigenPairStrategy(GPHead):
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

    Shapes: the variational parameters live in a gpytorch
    :class:`~gpytorch.variational.CholeskyVariationalDistribution` (submodule ``q_u``) with batch
    shape ``[H, s]`` (head, output dimension d) and event shape ``s`` (feature i), i.e.
    ``q_u.variational_mean[h, d, :] = m_d``; posteriors have batch ``[B, H, s]`` and event ``N``.

    **Why not a gpytorch ``_VariationalStrategy``.** gpytorch's strategies condition a GP on
    inducing *locations* through :math:`K_{uu}^{-1}K_{uf}` computed by calling a model on them,
    and memoise :math:`K_{uu}` across calls. Here the inducing features are *indexed* (the s
    kernel-eigen directions of each input sequence), the conditional is exact
    (:math:`f_d = P\Lambda^{-1}u_d`, no :math:`K_{uu}` solve), and the features change with every
    input, so neither the call contract nor the memo applies. The strategy is a plain
    :class:`gpytorch.Module` with the same public surface (:attr:`prior_distribution`,
    :attr:`variational_distribution`, :meth:`predictive`, :meth:`kl_divergence`) and memoises
    nothing.

    Initialisation [ours]: :math:`m_d \sim \mathcal N(0, \Lambda^2)`,
    :math:`L_d = \Lambda` (q starts at the prior covariance, KL ≈ s²/2 per head).

    :param features: the layer's :class:`~gpattn_ppl.features.KernelEigenFeatures` (owns
        :math:`W_q, W_k, W_e, W_r, \Lambda`); registered as the submodule ``features``.
    :param merge: the unit's merge; ``"add"`` draws :math:`F` of :math:`E + R` (the branches
        share u), any other one the two branches :math:`(F^e, F^r)`.
    :param u_draws: ``"sequence"`` (one :math:`U` per sequence) or ``"batch"``.

    As a GP head (:class:`~gpattn_ppl.gp.GPHead`): the state is :class:`KEPState`, the draw is
    the global latent ``u`` pushed through :meth:`function_values`, the state term is
    ``ksvd_loss`` and :meth:`predictive` pushes q(u) through the unit's (linear) output map.
    The per-branch marginal :math:`q(f_d)` above is not a step of the unit (its output mixes
    the branches through the output map, so the predictive is that push-forward); the tests
    check it as a reference.

    Cost: mean O(N s²) per (b, h); a sample through :meth:`function_values` O(N s²); KL O(s³)
    per head, batch-free.

    >>> strat = KernelEigenPairStrategy(KernelEigenFeatures(8, 2, 3))
    >>> E, R = strat.features(torch.randn(4, 5, 8))
    >>> strat.function_values(E + R, strat.variational_mean).shape, strat.kl_divergence().shape
    (torch.Size([4, 2, 5, 3]), torch.Size([2, 3]))
    """

    term_names = ("ksvd_loss", "kl")

    def __init__(self, features: KernelEigenFeatures, *, merge: str = "add",
                 u_draws: str = "sequence") -> None:
        super().__init__()
        self.merge, self.u_draws = merge, u_draws
        H, s = features.heads, features.rank
        self.q_u = CholeskyVariationalDistribution(s, batch_shape=torch.Size([H, s]))
        self.features = features
        with torch.no_grad():
            lam = features.lambda_.detach()                                   # [H, s]
            self.q_u.variational_mean.copy_(lam[:, None, :] * torch.randn(H, s, s))
            self.q_u.chol_variational_covar.copy_(torch.diag_embed(lam)[:, None].expand(H, s, s, s))

    @property
    def heads(self) -> int:
        return self.features.heads

    @property
    def rank(self) -> int:
        return self.features.rank

    # -- distributions of u ---------------------------------------------------------------------
    @property
    def variational_mean(self) -> torch.Tensor:
        r""":math:`M = [m_1 \dots m_s]`, ``[H, s, s]`` (``[h, d, i]``), the mean of :math:`U`."""
        return self.q_u.variational_mean

    @property
    def prior_distribution(self) -> SharedScaleMVN:
        r""":math:`p(u_d) = \mathcal N(0, \Lambda^2)` with batch ``[H, s]``, event ``s`` (a
        diagonal scale; rebuilt on each access)."""
        lam = self.features.lambda_
        scale = torch.diag_embed(lam)[:, None].expand(self.heads, self.rank, self.rank, self.rank)
        return SharedScaleMVN(torch.zeros_like(lam)[:, None, :].expand(scale.shape[:-1]),
                              scale_tril=scale, validate_args=False)

    @property
    def variational_distribution(self) -> SharedScaleMVN:
        r""":math:`q(u_d) = \mathcal N(m_d, L_dL_d^\top)`, batch ``[H, s]``, event ``s`` (rebuilt
        on each access); ``.expand([B, H, s]).rsample()`` draws one :math:`U` per sequence without
        copying the factors.

        gpytorch's ``chol_variational_covar`` is unconstrained, so a diagonal entry of
        :math:`L_d` may turn negative in training; the factor handed out has each such column's
        sign flipped (:math:`L_d\,\mathrm{diag}(\mathrm{sign}\,L_{d,ii})`, the same
        :math:`S_d`), so it is a valid ``scale_tril`` and torch's KL and log-density stay finite.
        """
        L = self.q_u.chol_variational_covar.tril()
        sign = torch.where(L.diagonal(dim1=-2, dim2=-1) < 0, -1.0, 1.0).to(L.dtype)
        return SharedScaleMVN(self.q_u.variational_mean, scale_tril=L * sign.unsqueeze(-2),
                              validate_args=False)

    def q_params(self, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """``(m [H, s, s], L [H, s, s, s] lower, Lambda [H, s])`` in ``dtype``."""
        L = self.q_u.chol_variational_covar.tril()
        return (self.q_u.variational_mean.to(dtype), L.to(dtype), self.features.lambda_.to(dtype))

    # -- conditional ------------------------------------------------------------------------------
    def function_values(self, P: torch.Tensor, u: torch.Tensor) -> torch.Tensor:
        r"""Function values given inducing values, :math:`F = P\Lambda^{-1}U` (eq. 18 via u).

        .. math:: F_{[:, d]} = P\Lambda^{-1}u_d

        :param P: ``[B, H, N, s]`` projections.
        :param u: ``[B, H, s, s]`` (one draw per sequence) or ``[H, s, s]`` (one per batch), laid
            out ``u[..., h, d, i]`` like :attr:`variational_distribution`; ``u = m`` gives the mean.
        :returns: ``[B, H, N, s]`` (last axis d). With :math:`u_d \sim q(u_d)` the columns have
            exactly the covariance :math:`P\Lambda^{-1}S_d\Lambda^{-1}P^\top`.
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
        m, L, lam = self.q_params(self.features.lambda_.dtype)
        inv_lam2 = lam.square().reciprocal()                                  # [H, s]
        trace = (L.square() * inv_lam2[:, None, :, None]).sum((-2, -1))        # Σ_ij L_ij²/λ_i²
        maha = (m.square() * inv_lam2[:, None, :]).sum(-1)
        logdet_p = 2.0 * lam.log().sum(-1, keepdim=True)
        logdet_q = 2.0 * L.diagonal(dim1=-2, dim2=-1).abs().log().sum(-1)
        return 0.5 * (trace + maha + logdet_p - logdet_q - self.rank)

    # -- the GP-head protocol --------------------------------------------------------------------
    def prepare(self, E: torch.Tensor, R: torch.Tensor, output_maps: OutputMaps | None = None,
                *, mask: torch.Tensor | None = None, where: str = "") -> KEPState:
        """The state of a call: the projections ``E, R`` ``[B, H, N, s]`` of
        :class:`~gpattn_ppl.features.KernelEigenFeatures` and the unit's output map."""
        return KEPState(E=E, R=R, output_maps=output_maps, mask=mask, where=where)

    def state_terms(self, state: KEPState) -> dict[str, torch.Tensor]:
        """``ksvd_loss`` ``[B]`` (:meth:`KernelEigenFeatures.ksvd_loss`)."""
        return {"ksvd_loss": self.features.ksvd_loss(state.E, state.R, state.mask)}

    def draw(self, state: KEPState, sample: Sample):
        r"""The global latent ``u`` (``[B, H, s, s]`` per sequence, ``[H, s, s]`` per batch or
        the mean; KL eq. 21 summed, 0-d), then :math:`F = P\Lambda^{-1}U`: of :math:`E + R`
        (``merge="add"``) or the pair :math:`(F^e, F^r)`."""
        u = sample("u", lambda: self.variational_distribution, lambda: self.prior_distribution,
                   local=False, kl=lambda: self.kl_divergence().sum(),
                   per_sequence=state.E.shape[0] if self.u_draws == "sequence" else None,
                   mean=lambda: self.variational_mean)
        return self._branches(state, u)

    def _branches(self, state: KEPState, u: torch.Tensor):
        if self.merge == "add":
            return self.function_values(state.E + state.R, u)
        return self.function_values(state.E, u), self.function_values(state.R, u)

    def mean(self, state: KEPState):
        """The function values at :math:`U = M` (as :meth:`draw` returns them)."""
        return self._branches(state, self.variational_mean)

    def attention_matrix(self, state: KEPState) -> torch.Tensor:
        r"""The attention kernel the kernel-eigen pair reconstructs, ``[B, H, N, N]`` (rows:
        queries, columns: keys; pad rows and columns 0):

        .. math:: A = E\Lambda^{-1}R^\top, \qquad A_{ij} = \sum_k e_k(x_i)\,r_k(x_j)/\lambda_k .

        At a KSVD of :math:`K_{att} = \Phi_q\Phi_k^\top` (:math:`E = H_e\Lambda`,
        :math:`R = H_r\Lambda`) it is :math:`H_e\Lambda H_r^\top`, the rank-s truncation of
        :math:`K_{att}` (all of it when :math:`s = D`), and the dual form of the projections is
        attention: :math:`E = AH_r`, :math:`R = A^\top H_e`. The posterior-mean head output
        (``merge="add"``) is then :math:`A V^r + A^\top V^e` with the values
        :math:`V^r = R\Lambda^{-2}M^\top W^{add}`, :math:`V^e = E\Lambda^{-2}M^\top W^{add}`
        (tested against the unit's forward). Independent of q(u) and of the merge. O(N² s).
        """
        inv_lam = self.features.lambda_.to(state.E.dtype).reciprocal()[:, None, :]
        return torch.matmul(state.E * inv_lam, state.R.mT)

    def predictive(self, state: KEPState) -> AttentionPredictive:
        r"""The exact push-forward of q(u) through the output map ``state.output_maps``
        (:math:`O = \sum_r G_rU^\top W_r`): column j of head h has mean
        :math:`\sum_r G_r M^\top W_{r,:j}` and covariance root
        :math:`[\sum_r W_{r,dj}\,G_rL_d]_{d=1..s}` (rank :math:`s^2`)."""
        E, R = state.E, state.R
        m, L, _ = self.q_params(E.dtype)                                    # [H,s,s], [H,s,s,s]
        mean, root = 0.0, 0.0
        for G, W in state.output_maps(E, R):
            W = W.to(E.dtype)
            mean = mean + torch.einsum("bhni,hdi,hdj->bhnj", G, m, W)
            GL = torch.einsum("bhni,hdik->bhndk", G, L)                      # G L_d
            root = root + torch.einsum("bhndk,hdj->bhjndk", GL, W)
        B, H, D, N = root.shape[:4]
        return AttentionPredictive.from_root(mean, root.reshape(B, H, D, N, -1))
