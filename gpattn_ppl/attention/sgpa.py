"""Sparse Gaussian-process attention (SGPA; Chen & Li, ICLR 2023), standard and decoupled."""

from __future__ import annotations

import math

import torch
from torch import nn

from ..infer.sites import current_site_context, sample_site
from ..kernels import KERNELS, make_attention_kernel
from ..linalg import gp_precision
from ..variational.sgpa_strategy import DecoupledSGPAStrategy, SGPAStrategy
from .base import AttentionUnit
from .registry import register_attention

__all__ = ["SGPAttention"]


@register_attention("sgpa")
class SGPAttention(AttentionUnit):
    r"""SGPA attention: per head, a sparse GP whose posterior mean is kernel attention.

    Tied projection :math:`q = X W_{qk}` (:math:`W_q = W_k`, so the kernel is a covariance of the
    tokens), values :math:`v = X W_v`, both ``Linear(C, C, bias=False)`` fused role-major; per
    head h and channel c = 1..D an independent GP with kernel
    :math:`\sigma_f^2\kappa` (``kernel``: exponential scaled dot product or ARD RBF, per head).

    * ``variant="standard"`` [ours, METHODS §1.3] (:class:`~gpattn_ppl.variational.SGPAStrategy`):
      the keys are the inducing inputs, :math:`u_c = f_c(q)`, whitened
      :math:`q(u_{w,c}) = \mathcal N(L^\top v_c, R R^\top)` with :math:`LL^\top = K + \epsilon\,\mathrm{diag}(K)`,
      so that

      .. math::
          f_c = L u_{w,c}:\quad \mathbb E f_c = L L^\top v_c \;(= K v_c + \epsilon\,\mathrm{diag}(K) v_c),\quad
          \mathrm{Cov} f_c = L R R^\top L^\top,

      the mean being unnormalised symmetric kernel attention. KL local (per sequence).
    * ``variant="decoupled"`` [paper KEP §4.1, ref; METHODS §1.4]
      (:class:`~gpattn_ppl.variational.DecoupledSGPAStrategy`): the tokens (amortised, weights
      :math:`v_c`) plus M global inducing keys per head, projected by that head's own rows of
      :math:`W_{qk}`:

      .. math::
          \mu_c = K_{qq}v_c - K_{q\beta}K_{\beta\beta}^{-1}K_{\beta q}v_c + K_{q\beta}a_{\beta,c},
          \quad \Sigma_c = K_{qq} - K_{q\beta}K_{\beta\beta}^{-1}K_{\beta q}
          + K_{q\beta}L_\beta^{-\top}\tilde S_c L_\beta^{-1}K_{\beta q}.

      The γ (token) KL part is local, the β part global.

    The head outputs ``[B, H, N, D]`` are concatenated and passed through
    :math:`W_O` = ``Linear(C, C)`` and dropout.

    **Sampling.** One sample per call, in training and evaluation; inside
    :func:`~gpattn_ppl.attention.posterior_mean` the mean. ``cov="full"`` (default) samples the
    exact joint over tokens; ``cov="diag"`` (decoupled only) draws the conditional part
    :math:`\xi_c \sim \mathcal N(0, K_{qq} - Q_{qq})` independently per token -- an
    approximation with exact marginal variances that skips the n x n Cholesky. Stacked SGPA
    blocks propagate samples (each block conditions on the sample its input carries).

    **Sites and terms.** The whitened inducing values are the Pyro site ``<prefix>.u``:
    standard -- local, batch ``[B, H, D]``, event ``N``; decoupled -- global, batch ``[H, D]``,
    event ``M`` (in thin mode drawn independently per sequence, its KL counted once, METHODS
    §3.2). Objective terms: ``kl`` ``[B]`` (standard KL; decoupled γ part) and, decoupled only,
    ``kl_global`` (0-d, β part, placed outside the data plate; sites mode: computed by the ELBO
    instead). Both are weighted by ``train.objective.kl_weight``.

    **Numerics.** GP algebra in :class:`~gpattn_ppl.settings.gp_dtype` with autocast off; every
    factorisation through :func:`gpattn_ppl.linalg.cholesky` (bounded jitter escalation, then a
    :class:`~gpattn_ppl.linalg.CholeskyError` naming ``site_prefix``, the matrix and the head).
    Pads: block trick (METHODS §0), so pad keys have no influence and contribute no KL.

    :param dim: C. :param heads: H.
    :param variant: ``"standard"`` or ``"decoupled"`` (default).
    :param num_inducing: M global inducing keys per head (decoupled; ``0`` = amortised part only).
    :param kernel: ``"exponential"`` (default, text) or ``"rbf"`` (images).
    :param cov: ``"full"`` (default) or ``"diag"`` (decoupled only, see above).
    :param max_len: N_max of the standard form's free covariance factor ``[H, N_max, N_max]``.
    :param outputscale_init: initial kernel amplitude :math:`\sigma_f^2` of every head; default
        :math:`e^{-4}` [ref]. The unit then starts close to zero (small mean and small noise), so
        the residual stream carries the signal at first. With :math:`\sigma_f^2 = 1` (the kernel
        attention init) CoLA training stayed at the majority class for 9 epochs (measured, KL
        weight 1; see ``docs/derivations/sgpa.rst``).
    :param attn_dropout: accepted for interface compatibility; SGPA has no attention weights to
        drop, so it is unused. :param proj_dropout: dropout after :math:`W_O`.

    Cost per (b, h): standard O(n³ + n²D); decoupled O(n²D + nMD + M³), plus O(n³) with
    ``cov="full"``. Memory O(n²).

    >>> att = SGPAttention(dim=8, heads=2, variant="decoupled", num_inducing=4)
    >>> x = torch.randn(3, 5, 8)
    >>> att(x).shape, att.objective_terms()["kl"].shape
    (torch.Size([3, 5, 8]), torch.Size([3]))
    """

    stochastic = True

    def __init__(self, dim: int, heads: int, *, variant: str = "decoupled", num_inducing: int = 16,
                 kernel: str = "exponential", cov: str = "full", max_len: int = 128,
                 outputscale_init: float = math.exp(-4.0), attn_dropout: float = 0.0,
                 proj_dropout: float = 0.0) -> None:
        super().__init__(dim, heads, attn_dropout=attn_dropout, proj_dropout=proj_dropout)
        if variant not in ("standard", "decoupled"):
            raise ValueError(f"variant must be 'standard' or 'decoupled', got {variant!r}")
        if kernel not in KERNELS:
            raise ValueError(f"unknown kernel {kernel!r}; allowed: {', '.join(KERNELS)}")
        if cov not in ("full", "diag"):
            raise ValueError(f"cov must be 'full' or 'diag', got {cov!r}")
        if cov == "diag" and variant == "standard":
            raise ValueError("cov='diag' exists for variant='decoupled' only: the standard form's "
                             "covariance L S L^T needs the n x n Cholesky either way")
        if num_inducing < 0:
            raise ValueError(f"num_inducing must be >= 0, got {num_inducing}")
        if not outputscale_init > 0:
            raise ValueError(f"outputscale_init must be > 0, got {outputscale_init}")
        self.variant, self.cov, self.kernel_name = variant, cov, kernel
        self.num_inducing, self.max_len = num_inducing, max_len
        self.proj = nn.Linear(dim, 2 * dim, bias=False)
        k = make_attention_kernel(kernel, heads, self.head_dim)
        if k.raw_outputscale.requires_grad:  # the canonical kernel's amplitude stays fixed at 1
            k.outputscale = torch.full((heads,), float(outputscale_init))
        if variant == "standard":
            self.strategy = SGPAStrategy(k, heads, max_len)
        else:
            self.strategy = DecoupledSGPAStrategy(k, heads, self.head_dim, dim, num_inducing)
        self.out = nn.Linear(dim, dim)

    @property
    def kernel(self):
        """The ``[H]``-batched gpytorch ScaleKernel (owned by the strategy)."""
        return self.strategy.kernel

    @property
    def qk_weight(self) -> torch.Tensor:
        """The tied projection :math:`W_{qk}` viewed per head, ``[H, D, C]``."""
        return self.proj.weight[: self.dim].view(self.heads, self.head_dim, self.dim)

    def project(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Tied queries/keys and values ``[B, H, N, D]`` (role-major split of the fused weight)."""
        B, N, _ = x.shape
        q, v = self.proj(x).view(B, N, 2, self.heads, self.head_dim).permute(2, 0, 3, 1, 4)
        return q, v

    def _where(self) -> str:
        return self.site_prefix or type(self).__name__

    # -- variants -------------------------------------------------------------------------------
    def _thin(self) -> bool:
        """Whether sites are reparameterised here (thin mode / no Pyro program) or Pyro's."""
        ctx = current_site_context()
        return self.use_mean or ctx is None or ctx.mode == "thin"

    def _standard(self, q, v, mask):
        strat = self.strategy
        state = strat.prepare(q, v, mask, where=self._where())
        q_u = strat.variational_distribution(state)
        p_u = strat.prior_distribution(q_u)
        if self._thin():
            # the site's thin-mode semantics (reparameterised draw + analytic KL), with the
            # channels as columns of one matmul: R is shared by the D channels, and
            # q_u.rsample() would expand it to [B, H, D, N, N]
            self.add_term("kl", torch.distributions.kl_divergence(q_u, p_u).flatten(1).sum(-1))
            if self.use_mean:
                u_w = state.m_w
            else:
                u_w = state.m_w + state.R @ torch.randn_like(state.m_w)
            u_w = u_w.mT                                                # site layout [B, H, D, N]
        else:
            u_w = self.sample("u", q_u, p_u, local=True)
        if self.use_mean or not self.training:
            self.last_distribution = strat(state)
        return strat.propagate(state, u_w)

    def _decoupled(self, q, v, mask):
        strat = self.strategy
        state = strat.prepare(q, v, self.qk_weight, mask, where=self._where())
        self.add_term("kl", strat.kl_gamma(state).flatten(1).sum(-1))
        u_w = None
        if self.num_inducing > 0:
            q_u = strat.variational_distribution(state)
            u_w = self._global_site(q_u, strat.prior_distribution(q_u), q.shape[0])
        if self.use_mean or not self.training:
            self.last_distribution = strat(state)
        return strat.propagate(state, u_w, cov=self.cov, sample=not self.use_mean,
                               where=self._where())

    def _global_site(self, q_u, p_u, batch: int) -> torch.Tensor:
        """The global whitened β values ``[B|1, H, D, M]``; thin mode: one draw per sequence."""
        if self._thin():
            # 0-d after the [B] gamma part: AttentionUnit.add_term keeps it as ``kl_global``
            self.add_term("kl", torch.distributions.kl_divergence(q_u, p_u).sum())
            if self.use_mean:
                return q_u.loc.unsqueeze(0)
            # = q_u.expand([B, H, D]).rsample(), as one contraction over (h, d)
            eps = torch.randn((batch,) + q_u.loc.shape, dtype=q_u.loc.dtype, device=q_u.loc.device)
            return q_u.loc + torch.einsum("hdij,bhdj->bhdi", q_u.scale_tril, eps)
        name = f"{self.site_prefix}.u" if self.site_prefix else "u"
        value, _ = sample_site(name, q_u, p_u, local=False)
        return value.unsqueeze(0)

    # -- contract -------------------------------------------------------------------------------
    def attend(self, x: torch.Tensor, mask: torch.Tensor | None) -> torch.Tensor:
        q, v = self.project(x)
        self.last_distribution = None
        with gp_precision(x.device.type):
            if self.variant == "standard":
                f = self._standard(q, v, mask)
            else:
                f = self._decoupled(q, v, mask)
        return self.proj_dropout(self.out(self.merge_heads(f.to(x.dtype))))
