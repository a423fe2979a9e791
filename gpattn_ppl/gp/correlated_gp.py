r"""Correlated Gaussian processes (CGPT §3, App. A-B): the exact attention head.

Notation (per batch element b and head h; all matrices ``[B, H, N, N]``, inputs ``[B, H, N, D]``):
queries :math:`q = XW_q`, keys :math:`k = XW_k`, latent inputs :math:`x_o = XW_o`, values
:math:`V = XW_v`; :math:`\kappa_o` the canonical SE kernel;
:math:`K_q = \sigma_q^2\kappa_o(q, q)`, :math:`K_k = \sigma_k^2\kappa_o(k, k)`,
:math:`K_o = \kappa_o(x_o, x_o)`, :math:`K_{qo} = \sigma_q\kappa_o(q, x_o)`,
:math:`K_{ok} = \sigma_k\kappa_o(x_o, k)`; :math:`P_o = (K_o + \sigma^2 I)^{-1}`,
:math:`P_k = (K_k + \sigma^2 I)^{-1}`. Inverse Cholesky factors :math:`L^{-1}` are named
``Linv_*`` in the code (``W_*`` are projections only). The derivations are in
``docs/derivations/cgpt.rst``.
"""

from __future__ import annotations

import math
from functools import cached_property

import torch

from .. import linalg, settings
from ..distributions import AttentionPredictive
from ..distributions.token_normal import TokenNormal
from ..kernels.canonical_se import CanonicalSEKernel
from .head import GPHead, Sample
from .scales import CorrelatedScales

__all__ = ["CorrelatedGP", "CorrelatedHead", "CGPTState", "KernelState"]

#: the largest noise sigma of the CGPT / SCGPT heads: sigma^2 must be a finite float32
MAX_NOISE = math.sqrt(torch.finfo(torch.float32).max)

_LOG_2PI = math.log(2.0 * math.pi)



class KernelState:
    """Base of the prepared states of the correlated GPs: the inputs of a call in the GP dtype,
    the values, the output scales, the noise, the masks, and the kernel matrices of the call,
    masked (each computed on first use). ``nu`` is the posterior mean once a draw has formed it.

    ``real`` is ``None`` or the ``[B, 1, N]`` bool mask of real tokens (broadcast over heads)
    that zeroes the padded rows (and, for token-by-token matrices, columns) of every kernel
    matrix; ``n_b`` ``[B, 1]`` counts the real tokens.
    """

    def __init__(self, q, k, x_o, *, scale_q, scale_k, noise: float, mask=None, where: str = "",
                 kernel: CanonicalSEKernel | None = None, v=None) -> None:
        dtype = settings.gp_dtype.resolve(q.dtype)
        #: the values ``[B, H, N, D]`` (as given) and the posterior mean formed by the draw
        self.v, self.nu = v, None
        self.q, self.k, self.x_o = q.to(dtype), k.to(dtype), x_o.to(dtype)
        self.dtype, self.device = dtype, q.device
        self.sq = scale_q.to(dtype).view(-1, 1, 1)
        self.sk = scale_k.to(dtype).view(-1, 1, 1)
        self.log_sq, self.log_sk = self.sq.log(), self.sk.log()
        self.noise_var = float(noise) ** 2
        self.mask, self.where = mask, where or type(self).__name__
        self.kernel = kernel if kernel is not None else CanonicalSEKernel()
        self.real = None if mask is None else mask[:, None, :]
        self.n_b = (torch.full((q.shape[0], 1), float(q.shape[-2]), dtype=dtype, device=q.device)
                    if mask is None else mask.to(dtype).sum(-1, keepdim=True))

    @property
    def model_jitter(self) -> float:
        r"""The :class:`~gpattn_ppl.settings.cholesky_jitter` value, for matrices that carry it
        as part of the model (as gpytorch adds jitter to every :math:`K_{uu}`)."""
        return settings.cholesky_jitter.value(self.dtype)

    def _k(self, a, b, log_scale=None, *, tokens_b: bool = True):
        r""":math:`s\,\kappa_o(a, b)` (``log_scale`` = log s or ``None``) with pad rows zeroed,
        and pad columns too when ``b`` holds tokens (:meth:`CanonicalSEKernel.gram`)."""
        return self.kernel.gram(a, b, log_scale=log_scale, rows=self.real,
                                cols=self.real if tokens_b else None)

    def _k_stacked(self, parts, b, *, tokens_b: bool = True):
        r"""``[s_i\,\kappa_o(a_i, b)]`` for ``parts = [(a_i, log s_i or None)]`` (token rows
        ``[B, H, N, D]`` each) against the same ``b``, as one product on the stacked rows;
        returns the blocks ``[B, H, N, m]`` (views)."""
        a = torch.cat([p[0] for p in parts], -2)
        n = parts[0][0].shape[-2]
        scales = [torch.zeros((), dtype=a.dtype, device=a.device) if ls is None
                  else ls.reshape(-1, 1, 1) for _, ls in parts]
        h = max(ls.numel() for ls in scales)
        log_scale = torch.cat([ls.reshape(-1, 1, 1).expand(h, n, 1) for ls in scales],
                              -2)                                           # [H | 1, P n, 1]
        rows = None if self.real is None else self.real.repeat(1, 1, len(parts))
        K_stacked = self.kernel.gram(a, b, log_scale=log_scale, rows=rows,
                                     cols=self.real if tokens_b else None)
        return K_stacked.split(n, dim=-2)


class CGPTState(KernelState):
    r"""The kernel matrices and factors of one CGP call, each computed on first use.

    Padding uses the block trick (:func:`~gpattn_ppl.linalg.block_mask`): every kernel matrix has
    its padded rows and columns zeroed, every factorised matrix gets 1 on its padded diagonal, so
    the real-token block equals the computation on the unpadded sequence. All matrices
    ``[B, H, N, N]``, in :class:`~gpattn_ppl.settings.gp_dtype`.

    Factors (:math:`L_o L_o^\top = K_o + \sigma^2 I`, :math:`L_k L_k^\top = K_k + \sigma^2 I`):
    :math:`R_q = L_o^{-1}K_{oq}`, :math:`F_q = L_o^{-\top}R_q = P_o K_{oq}`,
    :math:`R_k = L_o^{-1}K_{ok}`, :math:`F_k = P_o K_{ok}`.
    """

    def __init__(self, q, k, x_o, *, scale_q, scale_k, noise: float, mask=None, where: str = "",
                 kernel: CanonicalSEKernel | None = None, v=None) -> None:
        super().__init__(q, k, x_o, scale_q=scale_q, scale_k=scale_k, noise=noise, mask=mask,
                         where=where, kernel=kernel, v=v)
        #: ``[B, 1, N, N]`` identity on the padded positions (0 without a mask)
        self.pad_eye = (0.0 if mask is None
                        else torch.diag_embed(1.0 - mask.to(self.dtype))[:, None])
        self.eye = torch.eye(q.shape[-2], dtype=self.dtype, device=q.device)

    # -- kernels ----------------------------------------------------------------------------
    def _chol(self, A, name: str, *, pad: bool = True, posterior: bool = False):
        r"""Factor of ``A`` plus the pad identity (``pad=False``: ``A`` has it already; only the
        lower triangle is read). ``posterior=True``: ``A`` is a computed covariance -- a
        difference of PSD matrices, or a Gram matrix without noise -- that rounding leaves
        indefinite more often than not in float32 (measured: CGPT's
        :math:`\Sigma_\text{post}` failed in 240 of 241 demo training steps without it), so
        it carries the :class:`~gpattn_ppl.settings.cholesky_jitter` value as part of the model,
        as gpytorch adds jitter to every :math:`K_{uu}`; escalation starts above it."""
        return linalg.cholesky(A + self.pad_eye if pad and self.mask is not None else A,
                               where=f"{self.where} {name}",
                               head_axis=1, jitter=self.model_jitter if posterior else None)

    def _factors(self, A, name: str, *, pad: bool = True):
        """``(L, L^{-1})`` of ``A`` plus the pad identity, as ``_chol``
        (:func:`~gpattn_ppl.linalg.cholesky_factors`)."""
        return linalg.cholesky_factors(A + self.pad_eye if pad and self.mask is not None else A,
                                       where=f"{self.where} {name}", head_axis=1)

    @cached_property
    def _against_latent(self):
        r"""``(K_qo, K_o, K_ko)``: everything evaluated against the latent inputs, in one product."""
        return self._k_stacked([(self.q, self.log_sq), (self.x_o, None), (self.k, self.log_sk)],
                               self.x_o)

    @cached_property
    def K_o(self):
        return self._against_latent[1]

    @cached_property
    def K_q(self):
        return self._k(self.q, self.q, 2.0 * self.log_sq)

    @cached_property
    def K_k(self):
        return self._k(self.k, self.k, 2.0 * self.log_sk)

    @cached_property
    def K_qo(self):
        return self._against_latent[0]

    @cached_property
    def K_ok(self):
        return self._against_latent[2].mT

    # -- factors ------------------------------------------------------------------------------
    @cached_property
    def factors_o(self):
        r"""``(L_o, Linv_o)``: :math:`L_o` and its inverse :math:`L_o^{-1}`,
        :math:`L_oL_o^\top = K_o + \sigma^2 I`."""
        return self._factors(self.K_o + self.noise_eye, "K_o + s2 I", pad=False)

    @cached_property
    def noise_eye(self):
        r""":math:`\sigma^2 I` on the real tokens plus the pad identity, added in one pass."""
        return self.noise_var * self.eye + self.pad_eye

    @cached_property
    def L_o(self):
        """:math:`L_o` (from :attr:`factors_o` when formed, else a plain factorisation: the
        posterior mean alone needs no inverse)."""
        if "factors_o" in vars(self):
            return self.factors_o[0]
        return self._chol(self.K_o + self.noise_eye, "K_o + s2 I", pad=False)

    @cached_property
    def Linv_o(self):
        r""":math:`L_o^{-1}`, the inverse Cholesky factor of :math:`K_o + \sigma^2 I`."""
        return self.factors_o[1]

    @cached_property
    def factors_k(self):
        r"""``(L_k, Linv_k)``: :math:`L_k` and its inverse :math:`L_k^{-1}`,
        :math:`L_kL_k^\top = K_k + \sigma^2 I`."""
        return self._factors(self.K_k + self.noise_eye, "K_k + s2 I", pad=False)

    @cached_property
    def L_k(self):
        return self.factors_k[0]

    @cached_property
    def Linv_k(self):
        r""":math:`L_k^{-1}`, the inverse Cholesky factor of :math:`K_k + \sigma^2 I`."""
        return self.factors_k[1]

    @cached_property
    def R_q(self):
        return self.Linv_o @ self.K_qo.mT

    @cached_property
    def F_q(self):
        return self.Linv_o.mT @ self.R_q

    @cached_property
    def R_k(self):
        return self.Linv_o @ self.K_ok

    @cached_property
    def F_k(self):
        return self.Linv_o.mT @ self.R_k

    # -- products shared by the covariances -------------------------------------------------------
    @cached_property
    def RR_q(self):
        r""":math:`R_q^\top R_q = K_{qo}P_oK_{oq}`."""
        return self.R_q.mT @ self.R_q

    @cached_property
    def RR_k(self):
        return self.R_k.mT @ self.R_k

    @cached_property
    def FF_q(self):
        return self.F_q.mT @ self.F_q

    @cached_property
    def FF_k(self):
        return self.F_k.mT @ self.F_k

    @cached_property
    def J(self):
        """:math:`J = L_k^{-1}K_{ko}` (whitened key-to-latent cross-covariance)."""
        return self.Linv_k @ self.K_ok.mT

    # -- covariances (symmetric up to rounding: every consumer reads one triangle or a trace) ----
    @cached_property
    def sigma_q(self):
        r""":math:`\Sigma_q = \mathrm{Cov}[z_q\mid z_o] = K_q - K_{qo}P_oK_{oq} = K_q - R_q^\top R_q`."""
        return self.K_q - self.RR_q

    @cached_property
    def sigma_k(self):
        r""":math:`\Sigma_k = \mathrm{Cov}[z_k\mid z_o] = K_k - K_{ko}P_oK_{ok} = K_k - R_k^\top R_k`."""
        return self.K_k - self.RR_k

    @cached_property
    def X_q(self):
        r""":math:`X_q = A_qK_oA_q^\top = F_q^\top K_oF_q = R_q^\top R_q - \sigma^2F_q^\top F_q`
        (:math:`K_oF_q = K_{oq} - \sigma^2F_q`; the covariance of :math:`\mathbb E[z_q\mid z_o]`
        under :math:`z_o\sim\mathcal N(0, K_o)`)."""
        return self.RR_q - self.noise_var * self.FF_q

    @cached_property
    def X_k(self):
        r""":math:`X_k = F_k^\top K_oF_k = R_k^\top R_k - \sigma^2F_k^\top F_k`."""
        return self.RR_k - self.noise_var * self.FF_k

    @cached_property
    def marginal_q(self):
        r""":math:`\Sigma_q + X_q = K_q - \sigma^2F_q^\top F_q`, the covariance of :math:`z_q`
        under :math:`z_o\sim\mathcal N(0, K_o)`."""
        return self.K_q - self.noise_var * self.FF_q

    @cached_property
    def marginal_k(self):
        r""":math:`\Sigma_k + X_k = K_k - \sigma^2F_k^\top F_k`."""
        return self.K_k - self.noise_var * self.FF_k

    @cached_property
    def sigma_post(self):
        r""":math:`\Sigma_\text{post} = \mathrm{Cov}[z_q\mid z_k] = \Sigma_q + A_q\Sigma_oA_q^\top
        = K_q - \sigma^2F_q^\top F_q - G^\top G` with :math:`G = JF_q`
        (:math:`\Sigma_q + F_q^\top K_oF_q = K_q - \sigma^2F_q^\top F_q` and
        :math:`F_q^\top\Sigma_oF_q = F_q^\top K_oF_q - (JF_q)^\top JF_q`); never a second
        moment minus :math:`\nu\nu^\top`."""
        G = self.J @ self.F_q
        return self.marginal_q - G.mT @ G


class CorrelatedHead(CorrelatedScales, GPHead):
    r"""The GP-head steps shared by the exact and the sparse correlated GP.

    The latent ``z`` is the predictive draw itself (its variational distribution is
    :meth:`posterior`, its prior none: KL 0), one joint sample over the tokens of each (b, h),
    or :math:`\nu` in the posterior-mean mode; the posterior is built only when a draw needs it
    (its covariance factor first, so the mean reuses it). The training term ``cgp_loss`` ``[B]``
    is minus the CGP bound (``bound``) summed over heads and columns, or with
    ``reduction="mean"`` averaged per entry: :math:`-\text{bound} / (H D n_b)` (:math:`n_b` real
    tokens), the same maximiser per sequence on the scale of one token's cross-entropy.
    """

    term_names = ("cgp_loss",)
    #: the regulariser (``"none"``: no ``cgp_loss``) and its reduction, ``"sum"`` or ``"mean"``
    loss, reduction = "jensen", "mean"

    def posterior(self, state, v=None, mean=None) -> TokenNormal:
        """The distribution of the head outputs, a :class:`TokenNormal`."""
        raise NotImplementedError

    def draw(self, state: KernelState, sample: Sample) -> torch.Tensor:
        """The local latent ``z`` ``[B, H, N, D]``; sets ``state.nu``, the posterior mean."""
        built = []

        def posterior():
            built.append(self.posterior(state))
            return built[0]

        z = sample("z", posterior, local=True, mean=lambda: self.mean(state))
        state.nu = built[0].mean if built else z
        return z

    def predictive(self, state: KernelState) -> AttentionPredictive:
        """:meth:`posterior` (one token covariance per head) as an AttentionPredictive."""
        return AttentionPredictive.from_token_normal(self.posterior(state))

    def bound(self, state: KernelState) -> torch.Tensor:
        """The CGP bound of the call with the head's options, ``[B]``."""
        raise NotImplementedError

    def training_terms(self, state: KernelState) -> dict[str, torch.Tensor]:
        """``cgp_loss`` ``[B]`` (none with ``loss="none"``); needs :meth:`draw`'s ``nu``."""
        if self.loss == "none":
            return {}
        bound = self.bound(state)
        if self.reduction == "mean":
            mask = state.mask
            n_b = (mask.sum(-1) if mask is not None
                   else torch.full_like(bound, float(state.q.shape[-2]))).to(bound.dtype)
            bound = bound / (self.heads * state.nu.shape[-1] * n_b.clamp_min(1.0))
        return {"cgp_loss": -bound}


class CorrelatedGP(CorrelatedHead):
    r"""Exact correlated-GP attention head (CGPT eqs. 13-29, App. A-B), batched over B x H x D.

    Two GPs are affine input scalings of one canonical GP :math:`z_o \sim \mathcal{GP}(0,\kappa_o)`,
    :math:`z_q(x) = \sigma_q z_o(xW_q)`, :math:`z_k(x) = \sigma_k z_o(xW_k)` (eqs. 13-16), linked
    through the latent outputs :math:`z_o = z_o(x_o)`. With the key observations
    :math:`Z = (K_k + \sigma^2 I)V` (eq. 24) the factor :math:`P_k Z = V` cancels and the
    predictive mean is asymmetric kernel attention with a single solve (eqs. 22-25):

    .. math::
        \nu = \mathbb E[z_q\mid z_k = Z] = K_{qo}(K_o + \sigma^2 I)^{-1}K_{ok}\,V .

    The predictive covariance (App. B, eqs. 45-52 without the second-moment route; the
    :math:`\mu_o\mu_o^\top` parts cancel exactly) is shared by the D columns of a head:

    .. math::
        \Sigma_\text{post} = \Sigma_q + A_q\Sigma_o A_q^\top = \Sigma_q + F_q^\top\Sigma_oF_q,
        \qquad F_q = P_oK_{oq} = A_q^\top,

    with :math:`\Sigma_q = K_q - K_{qo}P_oK_{oq}`, :math:`\Sigma_o = K_o - K_{ok}P_kK_{ko}`,
    :math:`A_q = K_{qo}P_o`. The CGP regulariser is :meth:`lower_bound`.

    :param heads: H (σ_q, σ_k are per head with ``per_head_scales``, else shared).
    :param noise: σ, the observation-noise standard deviation of eqs. 19-20 (σ² enters).
    :param per_head_scales: one (σ_q, σ_k) pair per head instead of one shared pair [ref].
    :param loss: the training term's bound, ``"jensen"``, ``"marginal"``, ``"mc"`` or ``"none"``
        (:meth:`lower_bound`), with ``samples`` MC draws and ``observation_noise``;
        ``reduction``: ``"mean"`` or ``"sum"`` (:class:`CorrelatedHead`).

    Cost per (b, h): O(N³) (Choleskys of :math:`K_o+\sigma^2I`, :math:`K_k+\sigma^2I`,
    :math:`\Sigma_\text{post}`; for the regulariser also :math:`\Sigma_q`, :math:`\Sigma_k`)
    plus O(N² D); memory O(N²). The mean alone needs one Cholesky.

    >>> gp = CorrelatedGP(heads=2)
    >>> q, k, xo, v = torch.randn(4, 3, 2, 5, 4).unbind(0)
    >>> state = gp.prepare(q, k, v, xo)
    >>> gp.mean(state).shape, gp.posterior(state).covariance_matrix.shape
    (torch.Size([3, 2, 5, 4]), torch.Size([3, 2, 5, 5]))
    """

    LOSSES = ("jensen", "marginal", "mc", "none")

    def __init__(self, heads: int, *, noise: float = 1e-2, per_head_scales: bool = False,
                 loss: str = "jensen", samples: int = 1, observation_noise: bool = False,
                 reduction: str = "mean") -> None:
        super().__init__()
        if not 0 < noise <= MAX_NOISE:
            raise ValueError(f"noise must be > 0 and at most {MAX_NOISE:.3g} (sigma of CGPT eqs. "
                             f"19-20; sigma^2 must be a finite float32), got {noise}")
        self.heads, self.noise = int(heads), float(noise)
        self.loss, self.samples, self.observation_noise = loss, int(samples), bool(observation_noise)
        self.reduction = reduction
        self.kernel = CanonicalSEKernel()
        self._init_scales(self.heads, per_head_scales)

    def prepare(self, q, k, v, x_o, *, mask=None, where: str = "") -> CGPTState:
        """The prepared state of one call, its matrices computed on first use (``q, k, v, x_o:
        [B, H, N, D]``, mask ``[B, N]``)."""
        return CGPTState(q, k, x_o, scale_q=self.scale_q, scale_k=self.scale_k, noise=self.noise,
                         mask=mask, where=where, kernel=self.kernel, v=v)

    # -- predictive -------------------------------------------------------------------------
    def mean(self, t: CGPTState, v: torch.Tensor | None = None) -> torch.Tensor:
        r"""Posterior mean :math:`\nu = K_{qo}\,\mathrm{cholsolve}(K_{ok}V, L_o)`, ``[B, H, N, D]``
        (eq. 25 with the :math:`(K_k+\sigma^2I)` factors cancelled): one Cholesky. When the
        covariance path has already formed :math:`F_q = P_oK_{oq}`, :math:`F_q^\top(K_{ok}V)`.
        ``v`` defaults to the state's values."""
        v = (t.v if v is None else v).to(t.dtype)
        if "F_q" in vars(t):  # the covariance path has P_o K_oq already: no further solve
            return t.F_q.mT @ (t.K_ok @ v)
        if "factors_o" in vars(t):
            return t.K_qo @ (t.Linv_o.mT @ (t.Linv_o @ (t.K_ok @ v)))
        return t.K_qo @ linalg.cholesky_solve(t.K_ok @ v, t.L_o)

    def attention_matrix(self, t: CGPTState) -> torch.Tensor:
        r"""The asymmetric attention matrix :math:`\mathcal K = K_{qo}P_oK_{ok}` (eq. 24),
        ``[B, H, N, N]``, with :math:`\nu = \mathcal K V`; padded columns are 0."""
        return t.F_q.mT @ t.K_ok

    def posterior(self, t: CGPTState, v: torch.Tensor | None = None,
                  mean: torch.Tensor | None = None) -> TokenNormal:
        r"""The predictive distribution :math:`z_q\mid z_k \sim` :class:`TokenNormal`
        :math:`(\nu, \Sigma_\text{post})`, batch ``[B, H]``, event ``(N, D)``; padded rows get
        unit variance (they are ignored downstream)."""
        L = t._chol(t.sigma_post, "Sigma_post", posterior=True)
        return TokenNormal(self.mean(t, v) if mean is None else mean, scale_tril=L)

    # -- the CGP regulariser --------------------------------------------------------------------
    def bound(self, state: CGPTState) -> torch.Tensor:
        """:meth:`lower_bound` with the head's options at the draw's mean."""
        return self.lower_bound(state, state.nu, state.v, self.loss, self.samples,
                                observation_noise=self.observation_noise)

    def lower_bound(self, t: CGPTState, nu: torch.Tensor, v: torch.Tensor, kind: str = "jensen",
                    samples: int = 1, *, observation_noise: bool = False) -> torch.Tensor:
        r"""The CGP objective per sequence, summed over heads and output columns, ``[B]``.

        For each head and column a, with :math:`z_a` the a-th column of
        :math:`Z = (K_k + \sigma^2I)V` (eqs. 26-29, 36-44):

        .. math::
            \log\mathbb E_{z_o}\,p(z_q = \nu_a\mid z_o) + \log\mathbb E_{z_o}\,p(z_k = z_a\mid z_o),
            \qquad z_o\sim\mathcal N(0, K_o),

        :math:`p(z_q\mid z_o) = \mathcal N(A_qz_o, \Sigma_q)`,
        :math:`p(z_k\mid z_o) = \mathcal N(A_kz_o, \Sigma_k)`, :math:`A_k = K_{ko}P_o`. ``kind``:

        * ``"jensen"`` (the paper's bound, eqs. 38-44) in closed form -- every term is:
          :math:`-\tfrac12[\nu_a^\top\Sigma_q^{-1}\nu_a + \mathrm{tr}(\Sigma_q^{-1}X_q) +
          \log|\Sigma_q| + n_b\log 2\pi]` with :math:`X_q = A_qK_oA_q^\top = F_q^\top K_oF_q`;
        * ``"marginal"``: the quantity Jensen bounds, itself closed form,
          :math:`\log\mathcal N(\nu_a; 0, \Sigma_q + X_q)` (tighter, ≥ jensen);
        * ``"mc"``: the paper's Monte-Carlo estimator of the Jensen bound (eqs. 42-43) with
          ``samples`` draws :math:`z_o^i\sim\mathcal N(0, K_o)` shared by the columns.

        Constants use the number of real tokens :math:`n_b`. Cost O(N³ + N² D) per (b, h).

        With ``observation_noise`` every :math:`\Sigma_q, \Sigma_k` above becomes
        :math:`\Sigma_q + \sigma^2I, \Sigma_k + \sigma^2I` (ν and Z scored as noisy observations),
        which bounds each term above by :math:`-\tfrac{n_b D}{2}\log(2\pi\sigma^2)`.

        :param nu: the posterior mean ``[B, H, N, D]`` (gradients flow through it).
        :param v: the values ``[B, H, N, D]``.
        :returns: ``[B]``, the bound (to be maximised; the unit reports its negative).
        """
        if kind not in self.LOSSES or kind == "none":
            raise ValueError(f"kind must be one of jensen, marginal, mc; got {kind!r}")
        nu = nu.to(t.dtype)
        v = v.to(t.dtype)
        if t.mask is not None:
            v = v * t.mask[:, None, :, None].to(t.dtype)
        z = t.K_k @ v + t.noise_var * v
        D = nu.shape[-1]
        const = D * t.n_b * _LOG_2PI
        # sigma^2 I on the real block with observation noise; pads keep their unit diagonal
        shift = t.noise_eye if observation_noise else t.pad_eye

        def factors(S, name):  # computed covariances: the model jitter of CGPTState._chol
            return linalg.cholesky_factors(S + shift if torch.is_tensor(shift) else S,
                                           where=f"{t.where} {name}", head_axis=1,
                                           jitter=t.model_jitter)

        if kind == "marginal":
            bound = 0.0
            for target, S, name in ((nu, t.marginal_q, "Sigma_q + X_q"),
                                    (z, t.marginal_k, "Sigma_k + X_k")):
                _, Linv = factors(S, name)
                quad = (Linv @ target).square().sum((-1, -2))
                bound = bound - 0.5 * (quad + D * _logdet(Linv, t.mask) + const)
            return bound.sum(-1)
        Linv_q, Linv_k = factors(t.sigma_q, "Sigma_q")[1], factors(t.sigma_k, "Sigma_k")[1]
        if kind == "jensen":
            bound = 0.0
            # tr(S_q^-1 X_q) = <Linv_q X_q, Linv_q>; on the key side, with Y = Linv_k R_k^T and
            # F_k^T = R_k^T Linv_o: tr(S_k^-1 X_k) = ||Y||^2 - s2 ||Y Linv_o||^2 (F_k is never
            # formed)
            Y = Linv_k @ t.R_k.mT
            traces = (((Linv_q @ t.X_q) * Linv_q).sum((-1, -2)),
                      Y.square().sum((-1, -2))
                      - t.noise_var * (Y @ t.Linv_o).square().sum((-1, -2)))
            for target, Linv, tr in ((nu, Linv_q, traces[0]), (z, Linv_k, traces[1])):
                quad = (Linv @ target).square().sum((-1, -2))
                bound = bound - 0.5 * (quad + D * tr + D * _logdet(Linv, t.mask) + const)
            return bound.sum(-1)
        # "mc": the paper's estimator, z_o ~ N(0, K_o)
        L_0 = t._chol(t.K_o, "K_o", posterior=True)
        eps = torch.randn((int(samples),) + t.K_o.shape[:-1] + (1,), dtype=t.dtype,
                          device=t.device)
        z_o = L_0 @ eps  # [S, B, H, N, 1]
        bound = 0.0
        for target, Linv, F in ((nu, Linv_q, t.F_q), (z, Linv_k, t.F_k)):
            r = target - F.mT @ z_o
            quad = (Linv @ r).square().sum((-1, -2)).mean(0)
            bound = bound - 0.5 * (quad + D * _logdet(Linv, t.mask) + const)
        return bound.sum(-1)


def _logdet(Linv: torch.Tensor, mask: torch.Tensor | None) -> torch.Tensor:
    r""":math:`\log|LL^\top| = -2\sum_i\log(L^{-1})_{ii}` from the inverse factor ``Linv``
    :math:`= L^{-1}` (its diagonal is :math:`1/L_{ii}`, so no gradient reaches :math:`L`), over
    the real tokens only (a padded diagonal entry is 1 plus jitter; leaving it out makes the
    value exactly that of the unpadded sequence)."""
    logs = -Linv.diagonal(dim1=-2, dim2=-1).log()
    if mask is not None:
        logs = logs * mask[:, None, :].to(logs.dtype)
    return 2.0 * logs.sum(-1)
