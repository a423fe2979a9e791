r"""SGPA variational strategies: standard (keys as inducing inputs) and orthogonally decoupled.

Both are GPyTorch modules in gpytorch's strategy sense -- they hold the kernel and the
variational parameters and map them to :math:`q(u)`, its prior and :math:`q(f)` -- but the
inducing inputs change with every sequence, so neither subclasses gpytorch's
``_VariationalStrategy`` (whose inducing points are fixed and whose memo caches would go stale)
and nothing is memoised. The GP algebra of one call is computed once by
``prepare`` and handed around as a small state object; the attention unit draws the Pyro sites
in between (:class:`~gpattn_ppl.attention.sgpa.SGPAttention`).

Notation (derivation in ``docs/derivations/sgpa.rst``): per batch element
b, head h and output channel c = 1..D an independent GP :math:`f_c` on the head's key space
with kernel :math:`\kappa` (``[H]``-batched gpytorch kernel); tokens ``[B, H, N, D]``; masks
``[B, N]`` (True = real token). Padded tokens are removed by the block trick: pad rows/columns
of every kernel matrix are zeroed and 1 is put on the pad diagonal of every matrix that is
factorised, pad rows of values are zeroed -- the real block is then the computation on the
unpadded sequence and pads contribute exactly nothing (to the KL either).

Inducing values are **whitened**: :math:`u = L u_w` with
:math:`L L^\top = K_{uu} + \epsilon\,\mathrm{diag}(K_{uu})` (a jitter relative to the prior
variances, :func:`~gpattn_ppl.linalg.scaled_cholesky`), prior :math:`u_w \sim \mathcal N(0, I)`
(:class:`~gpattn_ppl.distributions.StandardNormalMVN`, with an O(n²) KL registered against any
multivariate normal). The block trick, the free Cholesky parameterisation and the scaled
factorisation are the shared pieces of :mod:`gpattn_ppl.linalg`.
"""

from __future__ import annotations

from dataclasses import dataclass

import gpytorch
import pyro.distributions as pdist
import torch
from gpytorch.kernels import ScaleKernel
from linear_operator.operators import (
    DenseLinearOperator,
    MatmulLinearOperator,
    RootLinearOperator,
    SumLinearOperator,
)
from torch import nn
from torch.distributions import MultivariateNormal as TorchMVN

from .. import settings
from ..distributions import AttentionPredictive, SharedScaleMVN, StandardNormalMVN, TokenNormal
from ..features.inducing_keys import GlobalInducingKeys
from ..gp.head import GPHead, Sample
from ..kernels import gram
from ..linalg import block_mask, free_cholesky, mask_rows, scaled_cholesky, triangular_solve

__all__ = ["SGPAStrategy", "DecoupledSGPAStrategy", "SGPAState", "DecoupledSGPAState"]


# -- standard SGPA ---------------------------------------------------------------------------------
@dataclass
class SGPAState:
    r"""The GP algebra of one standard-SGPA call (all in the GP dtype, pads block-masked).

    :ivar k: inducing inputs (keys) ``[B, H, N, D]``, pad rows 0.
    :ivar v: values ``[B, H, N, D]``, pad rows 0.
    :ivar K: :math:`K_{kk}` ``[B, H, N, N]`` (block-masked, no jitter).
    :ivar L: lower Cholesky factor of :math:`K_{kk} + \epsilon\,\mathrm{diag}(K_{kk})` ``[B, H, N, N]``.
    :ivar q_mu: whitened variational mean :math:`m_w` ``[B, H, N, D]``.
    :ivar q_sqrt: whitened covariance root :math:`R`, :math:`\tilde S = R R^\top` ``[B|1, H, N, N]``.
    :ivar mask: ``[B, N]`` or ``None``.
    :ivar where: the unit named in numerics messages.
    """

    k: torch.Tensor
    v: torch.Tensor
    K: torch.Tensor
    L: torch.Tensor
    q_mu: torch.Tensor
    q_sqrt: torch.Tensor
    mask: torch.Tensor | None
    where: str = ""


class SGPAStrategy(GPHead):
    r"""Standard SGPA [ours]: the keys of the sequence are the inducing inputs.

    Per head and channel c, with :math:`K = \kappa(k, k)` (n x n, n real tokens) and
    :math:`L = \mathrm{chol}(K + \epsilon\,\mathrm{diag}\,K)`:

    .. math::
        q(u_{w,c}) = \mathcal N(m_{w,c}, \tilde S), \quad \tilde S = R R^\top, \quad
        u_c = L u_{w,c}, \qquad
        m_{w,c} = \begin{cases} L^\top v_c & \text{dual (default): } \mathbb E\,u_c = L L^\top v_c
        \approx K v_c \\ L^{-1} v_c & \text{direct: } \mathbb E\,u_c = v_c\end{cases}

    with :math:`R` the leading n x n block of one free lower-triangular ``[N_max, N_max]`` factor
    per head (shared by the D channels; exp-diagonal; identity init). At query inputs
    :math:`x_q` (whitened SVGP conditional, :math:`A = L^{-1} K_{kq}`):

    .. math::
        q(f_c(x_q)) = \mathcal N\big(A^\top m_{w,c},\;
            K_{qq} - A^\top A + A^\top \tilde S A\big)

    which is :math:`\mathcal N(K_{qk}K_{kk}^{-1} m_{u,c},\, K_{qq} - K_{qk}K_{kk}^{-1}K_{kq} +
    K_{qk}K_{kk}^{-1} S_u K_{kk}^{-1}K_{kq})` with :math:`S_u = L\tilde S L^\top`. The attention
    unit ties queries to keys (:math:`x_q = k`), where :math:`A = L^\top` up to the jitter and
    :math:`f = u = L u_w` exactly: mean :math:`L L^\top v` (unnormalised symmetric kernel
    attention), covariance :math:`L\tilde S L^\top`. The KL per sequence, head and channel,

    .. math::
        \mathrm{KL}_c = \tfrac12\big[\mathrm{tr}\,\tilde S + \|m_{w,c}\|^2 - n - \log|\tilde S|\big]
        = \mathrm{KL}\big(\mathcal N(L m_{w,c}, L\tilde SL^\top)\,\|\,\mathcal N(0, LL^\top)\big),

    is local (it depends on the sequence).

    :param kernel: ``[H]``-batched :class:`~gpytorch.kernels.ScaleKernel` (registered as
        ``kernel``). :param heads: H.
    :param max_len: N_max, the longest sequence the covariance parameter covers.
    :param mean_param: ``"dual"`` (default; values are the weights of :math:`K_{kk}`) or
        ``"direct"`` (values are the inducing mean, SGPA paper's :math:`K_{qk}K_{kk}^{-1}v`).

    Parameter ``raw_chol`` ``[H, N_max, N_max]`` (see :func:`free_cholesky`).
    Cost: O(n³ + n² D) per (b, h) (one Cholesky), memory O(n²) per (b, h).

    >>> from gpattn_ppl.kernels import make_attention_kernel
    >>> strat = SGPAStrategy(make_attention_kernel("exponential", 2, 4), heads=2, max_len=8)
    >>> k, v = torch.randn(3, 2, 5, 4), torch.randn(3, 2, 5, 4)
    >>> state = strat.prepare(k, v)
    >>> q = strat.variational_distribution(state)
    >>> q.batch_shape, q.event_shape, strat.propagate(state, q.rsample()).shape
    (torch.Size([3, 2]), torch.Size([5, 4]), torch.Size([3, 2, 5, 4]))
    """

    def __init__(self, kernel: ScaleKernel, heads: int, max_len: int, *,
                 mean_param: str = "dual") -> None:
        super().__init__()
        if max_len < 1:
            raise ValueError(f"max_len must be >= 1, got {max_len}")
        if mean_param not in ("dual", "direct"):
            raise ValueError(f"mean_param must be 'dual' or 'direct', got {mean_param!r}")
        self.kernel, self.heads, self.max_len, self.mean_param = kernel, heads, max_len, mean_param
        self.raw_chol = nn.Parameter(torch.zeros(heads, max_len, max_len))

    def covariance_root(self, n: int, mask: torch.Tensor | None = None,
                        dtype: torch.dtype | None = None) -> torch.Tensor:
        r"""Whitened root :math:`R` ``[B|1, H, n, n]``: the leading :math:`n_b\times n_b` block of
        the free factor for the :math:`n_b` real tokens of each sequence, block-masked.

        The leading block of a Cholesky factor is the factor of the leading block, so sequences
        of different lengths reuse one parameter consistently. Real tokens are indexed by their
        rank among the real tokens (not their absolute position), so a sequence padded anywhere
        -- in the middle too -- gets the factor of its unpadded self.
        """
        if n > self.max_len:
            raise ValueError(f"sequence length {n} exceeds max_len={self.max_len} of the standard "
                             "SGPA covariance parameter; raise the attention option max_len")
        R = free_cholesky(self.raw_chol[:, :n, :n])                      # [H, n, n]
        if dtype is not None:
            R = R.to(dtype)
        if mask is None:
            return R.unsqueeze(0)
        B, H = mask.shape[0], R.shape[0]
        rank = (mask.cumsum(-1) - 1).clamp_min(0)                        # [B, n] real-token rank
        # R_b[i, j] = R[rank_i, rank_j]: one flat gather (its backward is a scatter into a
        # [B, H, n*n] buffer plus a sum over B, several times faster than advanced indexing)
        index = (rank[:, :, None] * n + rank[:, None, :]).view(B, 1, n * n).expand(B, H, n * n)
        R = R.reshape(1, H, n * n).expand(B, H, n * n).gather(-1, index).view(B, H, n, n)
        return block_mask(R, mask)

    def prepare(self, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor | None = None, *,
                where: str = "") -> SGPAState:
        """Kernel matrix, its factor and q(u)'s parameters for keys/values ``[B, H, N, D]``.

        :raises gpattn_ppl.linalg.CholeskyError: :math:`K_{kk}` not factorisable after the
            bounded jitter escalation (names ``where`` and the head).
        """
        dtype = settings.gp_dtype.resolve(k.dtype)
        k, v = mask_rows(k.to(dtype), mask), mask_rows(v.to(dtype), mask)
        K = block_mask(gram(self.kernel, k, k).to(dtype), mask)
        L = scaled_cholesky(K, K.diagonal(dim1=-2, dim2=-1),
                            where=(where or "SGPAStrategy") + " K_kk", head_axis=1)
        m_w = L.mT @ v if self.mean_param == "dual" else triangular_solve(v, L)
        R = self.covariance_root(k.shape[-2], mask, dtype)
        return SGPAState(k=k, v=v, K=K, L=L, q_mu=m_w, q_sqrt=R, mask=mask, where=where)

    def variational_distribution(self, state: SGPAState) -> TokenNormal:
        r""":math:`q(u_w)`: a :class:`~gpattn_ppl.distributions.TokenNormal` with batch ``[B, H]``
        and event ``(N, D)`` -- channel c is :math:`\mathcal N(m_{w,c}, RR^\top)`, the row
        covariance shared by the D channels, so a draw is one matmul :math:`m_w + R\,E`."""
        return TokenNormal(state.q_mu, scale_tril=state.q_sqrt, validate_args=False)

    @staticmethod
    def prior_distribution(q: TokenNormal) -> TokenNormal:
        r"""Whitened prior :math:`\mathcal N(0, I)` per channel, with ``q``'s shapes."""
        return TokenNormal.standard(q)

    def kl_divergence(self, state: SGPAState) -> torch.Tensor:
        """KL(q(u) || p(u)) per sequence, head and channel, ``[B, H, D]``, in O(n² D) (the
        registered closed form of :class:`~gpattn_ppl.distributions.StandardNormalMVN`)."""
        q = pdist.MultivariateNormal(state.q_mu.mT, scale_tril=state.q_sqrt.unsqueeze(2),
                                     validate_args=False)
        return torch.distributions.kl_divergence(q, StandardNormalMVN.like(q))

    @staticmethod
    def propagate(state: SGPAState, u_w: torch.Tensor) -> torch.Tensor:
        r"""Function values at the keys, :math:`f = L u_w`: ``u_w [B, H, N, D] -> [B, H, N, D]``."""
        return state.L @ u_w.to(state.L.dtype)

    # -- the GP-head protocol --------------------------------------------------------------------
    term_names = ("kl",)

    def draw(self, state: SGPAState, sample: Sample) -> torch.Tensor:
        """The local latent ``u`` (:meth:`variational_distribution`, KL
        :meth:`kl_divergence`), then :math:`f = L u_w` ``[B, H, N, D]``."""
        q_u = self.variational_distribution(state)                     # views, no algebra
        u_w = sample("u", q_u, lambda: self.prior_distribution(q_u), local=True,
                     kl=lambda: self.kl_divergence(state), mean=lambda: state.q_mu)
        return self.propagate(state, u_w)

    def mean(self, state: SGPAState) -> torch.Tensor:
        r""":math:`L m_w` ``[B, H, N, D]``."""
        return self.propagate(state, state.q_mu)

    def predictive(self, state: SGPAState) -> AttentionPredictive:
        """The marginal at the keys (:meth:`forward`) as an AttentionPredictive."""
        return AttentionPredictive.from_mvn(self(state))

    def attention_matrix(self, state: SGPAState) -> torch.Tensor:
        r""":math:`LL^\top = K_{kk} + \epsilon\,\mathrm{diag}K_{kk}` ``[B, H, N, N]`` (pad rows
        and columns 0)."""
        return _pair_masked(state.L @ state.L.mT, state.mask)

    def forward(self, state: SGPAState, x_q: torch.Tensor | None = None,
                mask_q: torch.Tensor | None = None) -> gpytorch.distributions.MultivariateNormal:
        r"""The marginal :math:`q(f(x_q))`, batch ``[B, H, D]``, event ``N_q`` (lazy covariance).

        :param x_q: query inputs ``[B, H, N_q, D]``; ``None`` means the keys themselves (the
            tied case of the attention unit: mean :math:`L m_w`, covariance :math:`L\tilde SL^\top`).
        :param mask_q: ``[B, N_q]`` real queries (pad query rows get mean 0 and unit variance).
        """
        L, R, m_w = state.L, state.q_sqrt, state.q_mu
        B, H, N, D = m_w.shape
        if x_q is None:
            mean = L @ m_w
            root = MatmulLinearOperator(L.unsqueeze(2).expand(B, H, D, N, N),
                                        R.unsqueeze(2).expand(B, H, D, N, N))
            return gpytorch.distributions.MultivariateNormal(mean.mT, RootLinearOperator(root))
        x_q = mask_rows(x_q.to(L.dtype), mask_q)
        K_qk = mask_rows(gram(self.kernel, x_q, state.k).to(L.dtype), mask_q)
        if state.mask is not None:
            K_qk = K_qk.masked_fill(~state.mask[:, None, None, :], 0.0)
        K_qq = block_mask(gram(self.kernel, x_q, x_q).to(L.dtype), mask_q)
        A = triangular_solve(K_qk.mT, L)                                  # [B, H, N, N_q]
        mean = A.mT @ m_w
        Nq = x_q.shape[-2]
        cond = DenseLinearOperator((K_qq - A.mT @ A).unsqueeze(2).expand(B, H, D, Nq, Nq))
        root = RootLinearOperator((A.mT @ R).unsqueeze(2).expand(B, H, D, Nq, N))
        return gpytorch.distributions.MultivariateNormal(mean.mT, SumLinearOperator(cond, root))


# -- decoupled SGPA --------------------------------------------------------------------------------
@dataclass
class DecoupledSGPAState:
    r"""The GP algebra of one decoupled-SGPA call (GP dtype, pads block-masked).

    :ivar v: values ``[B, H, N, D]``, pad rows 0.
    :ivar K_qq: :math:`K_{qq}` ``[B, H, N, N]`` (block-masked).
    :ivar L_beta: factor of :math:`K_{\beta\beta} + \epsilon\,\mathrm{diag}(K_{\beta\beta})` ``[H, M, M]``.
    :ivar A: :math:`L_\beta^{-1}K_{\beta q}` ``[B, H, M, N]`` (pad columns 0).
    :ivar Av: :math:`A v` ``[B, H, M, D]``.
    :ivar Kv: :math:`K_{qq} v` ``[B, H, N, D]``.
    :ivar mask: ``[B, N]`` or ``None``.
    :ivar where: the unit named in numerics messages.
    """

    v: torch.Tensor
    K_qq: torch.Tensor
    L_beta: torch.Tensor
    A: torch.Tensor
    Av: torch.Tensor
    Kv: torch.Tensor
    mask: torch.Tensor | None
    where: str = ""


class DecoupledSGPAStrategy(GPHead):
    r"""Orthogonally decoupled SGPA [paper: KEP §4.1; ref; Salimbeni et al. 2018].

    Two inducing sets per head: the tokens (γ, amortised: inputs :math:`q`, weights the values
    :math:`v_c`) and M global keys (β: :math:`k_\beta = Z_\beta W_{qk}^{h\top}` from
    :class:`~gpattn_ppl.features.GlobalInducingKeys`, free weights :math:`a_{\beta,c}`, whitened
    covariance :math:`\tilde S_c = R_cR_c^\top` per head and channel). With
    :math:`L_\beta L_\beta^\top = K_{\beta\beta} + \epsilon\,\mathrm{diag}(K_{\beta\beta})` and :math:`A = L_\beta^{-1}K_{\beta q}`:

    .. math::
        \mu_c &= K_{qq} v_c - A^\top A v_c + K_{q\beta} a_{\beta,c}
              = K_{qq} v_c + A^\top\,(L_\beta^\top a_{\beta,c} - A v_c) \\
        \Sigma_c &= K_{qq} - A^\top A + A^\top \tilde S_c A \\
        \mathrm{KL}_c &= \underbrace{\tfrac12\big[\mathrm{tr}\,\tilde S_c - \log|\tilde S_c| - M
              + \|L_\beta^\top a_{\beta,c}\|^2\big]}_{\text{global (β)}}
              + \underbrace{\tfrac12\big[v_c^\top K_{qq} v_c - \|A v_c\|^2\big]}_{\text{local (γ)}}

    The β part is the KL of the whitened global site
    :math:`u_{w,c}\sim\mathcal N(L_\beta^\top a_{\beta,c}, \tilde S_c)` against
    :math:`\mathcal N(0, I_M)`; a function sample is

    .. math::
        f_c = K_{qq} v_c + A^\top (u_{w,c} - A v_c) + \xi_c, \qquad
        \xi_c \sim \mathcal N(0, K_{qq} - A^\top A)

    with :math:`\xi` drawn through the n x n Cholesky of :math:`K_{qq} - A^\top A + \epsilon\,\mathrm{diag}(K_{qq})`
    (``cov="full"``, shared by the D channels of a head) or, as an approximation, independently
    per token from its diagonal (``cov="diag"``: exact marginal variances
    :math:`\mathrm{diag}\,\Sigma_c`, the β part keeps its token correlations). With ``M = 0`` it
    reduces to the amortised part: :math:`\mathcal N(K_{qq}v_c, K_{qq})`, KL
    :math:`\tfrac12 v_c^\top K_{qq} v_c`.

    :param kernel: ``[H]``-batched :class:`~gpytorch.kernels.ScaleKernel` (submodule ``kernel``).
    :param heads: H. :param head_dim: D. :param dim: C (input width of the inducing keys).
    :param num_inducing: M.
    :param cov: how :meth:`draw` samples the conditional part, ``"full"`` or ``"diag"``
        (:meth:`conditional_noise`).

    Parameters: ``inducing.inducing_inputs`` :math:`Z_\beta` ``[H, M, C]`` ~ N(0, 1) [ref];
    ``inducing_weights`` :math:`a_\beta` ``[H, M, D]`` ~ N(0, 0.1²) and ``raw_chol`` ``[H, D, M, M]``
    (:math:`R_c = I` at init) [ours].
    Cost: O(n² D + n M D + M³) per (b, h) for mean and KL, plus O(n³) for ``cov="full"``.

    >>> from gpattn_ppl.kernels import make_attention_kernel
    >>> strat = DecoupledSGPAStrategy(make_attention_kernel("exponential", 2, 4), heads=2,
    ...                               head_dim=4, dim=8, num_inducing=3)
    >>> q, v = torch.randn(3, 2, 5, 4), torch.randn(3, 2, 5, 4)
    >>> state = strat.prepare(q, v, torch.randn(2, 4, 8))
    >>> qu = strat.variational_distribution(state)
    >>> qu.batch_shape, qu.event_shape, strat.kl_gamma(state).shape
    (torch.Size([2, 4]), torch.Size([3]), torch.Size([3, 2, 4]))
    """

    def __init__(self, kernel: ScaleKernel, heads: int, head_dim: int, dim: int,
                 num_inducing: int, *, cov: str = "full") -> None:
        super().__init__()
        self.kernel, self.cov = kernel, cov
        self.heads, self.head_dim, self.num_inducing = heads, head_dim, num_inducing
        self.inducing = GlobalInducingKeys(heads, num_inducing, dim)
        self.inducing_weights = nn.Parameter(0.1 * torch.randn(heads, num_inducing, head_dim))
        self.raw_chol = nn.Parameter(torch.zeros(heads, head_dim, num_inducing, num_inducing))

    def prepare(self, q: torch.Tensor, v: torch.Tensor, weight: torch.Tensor,
                mask: torch.Tensor | None = None, *, where: str = "") -> DecoupledSGPAState:
        """All batch quantities for queries/values ``[B, H, N, D]`` and ``W_qk`` viewed ``[H, D, C]``.

        :raises gpattn_ppl.linalg.CholeskyError: :math:`K_{\\beta\\beta}` not factorisable.
        """
        dtype = settings.gp_dtype.resolve(q.dtype)
        q, v = mask_rows(q.to(dtype), mask), mask_rows(v.to(dtype), mask)
        k_beta = self.inducing(weight.to(dtype))                          # [H, M, D]
        K_qq = block_mask(gram(self.kernel, q, q).to(dtype), mask)
        K_bb = gram(self.kernel, k_beta, k_beta).to(dtype)                # [H, M, M]
        L_beta, W_beta = scaled_cholesky(K_bb, K_bb.diagonal(dim1=-2, dim2=-1),
                                         where=(where or "DecoupledSGPAStrategy") + " K_bb",
                                         head_axis=0, inverse=True)
        K_bq = gram(self.kernel, k_beta.unsqueeze(0), q).to(dtype)        # [B, H, M, N]
        if mask is not None:
            K_bq = K_bq.masked_fill(~mask[:, None, None, :], 0.0)
        A = W_beta @ K_bq                                  # L_beta^-1 K_bq: a product, no solve
        return DecoupledSGPAState(v=v, K_qq=K_qq, L_beta=L_beta, A=A, Av=A @ v, Kv=K_qq @ v,
                                  mask=mask, where=where)

    def covariance_root(self, dtype: torch.dtype | None = None) -> torch.Tensor:
        r""":math:`R_c` ``[H, D, M, M]``."""
        R = free_cholesky(self.raw_chol)
        return R if dtype is None else R.to(dtype)

    def variational_distribution(self, state: DecoupledSGPAState) -> SharedScaleMVN:
        r""":math:`q(u_w)` of the global site: batch ``[H, D]``, event ``M``, mean
        :math:`L_\beta^\top a_\beta` (drawn once per sequence without copying the scale)."""
        dtype = state.L_beta.dtype
        loc = (state.L_beta.mT @ self.inducing_weights.to(dtype)).mT    # [H, D, M]
        return SharedScaleMVN(loc, scale_tril=self.covariance_root(dtype), validate_args=False)

    @staticmethod
    def prior_distribution(q: TorchMVN) -> StandardNormalMVN:
        r"""Whitened prior :math:`\mathcal N(0, I_M)` with ``q``'s shapes."""
        return StandardNormalMVN.like(q)

    @staticmethod
    def kl_gamma(state: DecoupledSGPAState) -> torch.Tensor:
        r"""Local (γ) KL part :math:`\tfrac12[v_c^\top K_{qq} v_c - \|A v_c\|^2]`, ``[B, H, D]``."""
        return 0.5 * ((state.v * state.Kv).sum(-2) - state.Av.square().sum(-2))

    def conditional_covariance(self, state: DecoupledSGPAState) -> torch.Tensor:
        r""":math:`K_{qq} - A^\top A` ``[B, H, N, N]`` (pad block identity)."""
        return state.K_qq - state.A.mT @ state.A

    def propagate(self, state: DecoupledSGPAState, u_w: torch.Tensor | None) -> torch.Tensor:
        r"""The function values given the global values, without the conditional noise,
        :math:`K_{qq}v + A^\top(u_w - Av)` ``[B, H, N, D]`` (the mean when ``u_w`` is q's mean).

        :param u_w: whitened global values ``[B|1, H, D, M]`` (``None`` when M = 0).
        """
        f = state.Kv
        if u_w is not None and self.num_inducing > 0:
            f = f + state.A.mT @ (u_w.mT.to(f.dtype) - state.Av)
        return f

    def conditional_noise(self, state: DecoupledSGPAState, *, cov: str = "full", where: str = ""):
        r"""The conditional part :math:`\xi_c \sim \mathcal N(0, K_{qq} - A^\top A)` of a function
        sample, per channel, as a distribution over ``[B, H, N, D]``.

        ``cov="full"``: a :class:`~gpattn_ppl.distributions.TokenNormal` through the n x n
        Cholesky of :math:`K_{qq} - A^\top A + \epsilon\,\mathrm{diag}(K_{qq})` (shared by the D
        channels of a head); ``"diag"``: independent normals per token with the exact marginal
        variances (an approximation that skips the Cholesky).
        """
        zeros = torch.zeros_like(state.Kv)
        if cov == "full":
            L1 = scaled_cholesky(self.conditional_covariance(state),
                                 state.K_qq.diagonal(dim1=-2, dim2=-1),
                                 where=(where or "DecoupledSGPAStrategy") + " K_qq - Q_qq",
                                 head_axis=1)
            return TokenNormal(zeros, scale_tril=L1, validate_args=False)
        jitter = settings.cholesky_jitter.value(zeros.dtype)
        prior_var = state.K_qq.diagonal(dim1=-2, dim2=-1)
        var = prior_var - state.A.square().sum(-2)
        sd = (var.clamp_min(0.0) + jitter * prior_var).sqrt().unsqueeze(-1)
        return pdist.Normal(zeros, sd.expand_as(zeros), validate_args=False)

    def forward(self, state: DecoupledSGPAState) -> gpytorch.distributions.MultivariateNormal:
        r"""The marginal :math:`q(f_c) = \mathcal N(\mu_c, \Sigma_c)`: batch ``[B, H, D]``, event
        ``N``, covariance a lazy sum of the conditional part and a rank-M root."""
        B, H, N, D = state.Kv.shape
        M = self.num_inducing
        if M > 0:
            q = self.variational_distribution(state)
            mean = self.propagate(state, q.loc.unsqueeze(0))
        else:
            mean = state.Kv
        cond = DenseLinearOperator(self.conditional_covariance(state).unsqueeze(2)
                                   .expand(B, H, D, N, N))
        if M == 0:
            return gpytorch.distributions.MultivariateNormal(mean.mT, cond)
        R = self.covariance_root(state.A.dtype)                          # [H, D, M, M]
        root = MatmulLinearOperator(state.A.mT.unsqueeze(2).expand(B, H, D, N, M),
                                    R.unsqueeze(0).expand(B, H, D, M, M))
        return gpytorch.distributions.MultivariateNormal(
            mean.mT, SumLinearOperator(cond, RootLinearOperator(root)))

    # -- the GP-head protocol --------------------------------------------------------------------
    term_names = ("kl", "kl_global")

    def state_terms(self, state: DecoupledSGPAState) -> dict[str, torch.Tensor]:
        """``kl`` ``[B]``: the local (γ) KL part, :meth:`kl_gamma` summed."""
        return {"kl": self.kl_gamma(state).flatten(1).sum(-1)}

    def draw(self, state: DecoupledSGPAState, sample: Sample) -> torch.Tensor:
        r"""The global latent ``u`` (one draw per sequence, its KL counted once:
        ``kl_global``), :meth:`propagate`, then the conditional part ``xi`` (a local latent whose
        prior is itself, KL 0; 0 in the posterior-mean mode): :math:`f + \xi` ``[B, H, N, D]``."""
        u_w = None
        if self.num_inducing > 0:
            q_u = self.variational_distribution(state)
            u_w = sample("u", q_u, self.prior_distribution(q_u), local=False,
                         per_sequence=state.v.shape[0])
            if u_w.dim() == 3:                                          # the mean, [H, D, M]
                u_w = u_w.unsqueeze(0)
        f = self.propagate(state, u_w)
        xi = sample("xi", lambda: self.conditional_noise(state, cov=self.cov, where=state.where),
                    local=True, mean=lambda: f.new_zeros(()))
        return f + xi

    def mean(self, state: DecoupledSGPAState) -> torch.Tensor:
        r""":math:`K_{qq}v + A^\top(L_\beta^\top a_\beta - Av)` ``[B, H, N, D]``."""
        if self.num_inducing == 0:
            return state.Kv
        return self.propagate(state, self.variational_distribution(state).loc.unsqueeze(0))

    def predictive(self, state: DecoupledSGPAState) -> AttentionPredictive:
        """The marginal :meth:`forward` as an AttentionPredictive."""
        return AttentionPredictive.from_mvn(self(state))

    def attention_matrix(self, state: DecoupledSGPAState) -> torch.Tensor:
        r""":math:`K_{qq} - A^\top A` ``[B, H, N, N]`` (pad rows and columns 0); the mean adds
        :math:`A^\top L_\beta^\top a_\beta`."""
        return _pair_masked(self.conditional_covariance(state), state.mask)


def _pair_masked(A: torch.Tensor, mask: torch.Tensor | None) -> torch.Tensor:
    """``A [B, H, N, N]`` with the rows and columns of padded tokens 0."""
    if mask is None:
        return A
    return A.masked_fill(~(mask[:, None, :, None] & mask[:, None, None, :]), 0.0)
