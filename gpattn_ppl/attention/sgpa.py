"""Sparse Gaussian-process attention (SGPA; Chen & Li, ICLR 2023), standard and decoupled."""

from __future__ import annotations

import math
from typing import Literal

import torch
from torch import nn

from ..kernels import KERNELS, make_attention_kernel
from ..variational.sgpa_strategy import DecoupledSGPAStrategy, SGPAStrategy
from .base import check_parameter_memory
from .gp_unit import GPAttentionUnit
from .pretrained import (
    SoftmaxWeights,
    copy_output_projection,
    dropped_biases,
    fit_value_gain,
    register_pretrained_init,
    require_exponential_kernel,
    search_query_scale,
    shrink_noise,
)
from .registry import register_attention

__all__ = ["SGPAttention"]


@register_attention("sgpa")
class SGPAttention(GPAttentionUnit):
    r"""SGPA attention: per head, a sparse GP whose posterior mean is kernel attention.

    Tied projection :math:`q = X W_{qk}` (:math:`W_q = W_k`, so the kernel is a covariance of the
    tokens), values :math:`v = X W_v`, both ``Linear(C, C, bias=False)`` fused role-major; per
    head h and channel c = 1..D an independent GP with kernel
    :math:`\sigma_f^2\kappa` (``kernel``: exponential scaled dot product or ARD RBF, per head).

    * ``variant="standard"`` [ours] (:class:`~gpattn_ppl.variational.SGPAStrategy`):
      the keys are the inducing inputs, :math:`u_c = f_c(q)`, whitened
      :math:`q(u_{w,c}) = \mathcal N(L^\top v_c, R R^\top)` with :math:`LL^\top = K + \epsilon\,\mathrm{diag}(K)`,
      so that

      .. math::
          f_c = L u_{w,c}:\quad \mathbb E f_c = L L^\top v_c \;(= K v_c + \epsilon\,\mathrm{diag}(K) v_c),\quad
          \mathrm{Cov} f_c = L R R^\top L^\top,

      the mean being unnormalised symmetric kernel attention. KL local (per sequence).
    * ``variant="decoupled"`` [paper KEP §4.1, ref]
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
    :class:`~gpattn_ppl.settings.posterior_mean` the mean. ``cov="full"`` (default) samples the
    exact joint over tokens; ``cov="diag"`` (decoupled only) draws the conditional part
    :math:`\xi_c \sim \mathcal N(0, K_{qq} - Q_{qq})` independently per token -- an
    approximation with exact marginal variances that skips the n x n Cholesky. Stacked SGPA
    blocks propagate samples (each block conditions on the sample its input carries).

    **Sites and terms.** The whitened inducing values are the latent ``<prefix>.u``, drawn through
    :meth:`~gpattn_ppl.attention.AttentionUnit.sample`: standard -- local, a
    :class:`~gpattn_ppl.distributions.TokenNormal` with batch ``[B, H]``, event ``(N, D)``;
    decoupled -- global, batch ``[H, D]``, event ``M``, drawn independently per sequence with its
    KL counted once, and the conditional part of the function sample,
    :math:`\xi \sim \mathcal N(0, K_{qq} - A^\top A)`, the local latent ``<prefix>.xi`` (its
    prior is itself: KL 0), so thin and sites mode draw the same numbers. Objective terms: ``kl`` ``[B]`` (standard KL; decoupled γ
    part) and, decoupled only, ``kl_global`` (0-d, β part, placed outside the data plate; sites
    mode: computed by the ELBO instead). All are weighted by ``train.objective.kl_weight``.

    **Predictive.** :meth:`predictive` is the posterior of the head outputs
    (:class:`~gpattn_ppl.distributions.AttentionPredictive`, with the joint over tokens per head
    and channel); :meth:`attention_matrix` is the matrix the posterior mean applies to the
    values (standard: :math:`LL^\top`; decoupled: :math:`K_{qq} - A^\top A`, the mean adding
    :math:`A^\top L_\beta^\top a_\beta`).

    **Numerics.** GP algebra in :class:`~gpattn_ppl.settings.gp_dtype` with autocast off; every
    factorisation through :func:`gpattn_ppl.linalg.cholesky` (bounded jitter escalation, then a
    :class:`~gpattn_ppl.linalg.CholeskyError` naming ``site_prefix``, the matrix and the head).
    Pads: block trick (:func:`~gpattn_ppl.linalg.block_mask`), so pad keys have no influence and
    contribute no KL.

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
    :param proj_dropout: dropout after :math:`W_O`. (SGPA has no attention weights, so it takes
        no ``attn_dropout``.)

    Cost per (b, h): standard O(n³ + n²D); decoupled O(n²D + nMD + M³), plus O(n³) with
    ``cov="full"``. Memory O(n²).

    >>> att = SGPAttention(dim=8, heads=2, variant="decoupled", num_inducing=4)
    >>> x = torch.randn(3, 5, 8)
    >>> att(x).shape, att.objective_terms()["kl"].shape
    (torch.Size([3, 5, 8]), torch.Size([3]))
    """

    rotary_capable = True

    def __init__(self, dim: int, heads: int, *,
                 variant: Literal["standard", "decoupled"] = "decoupled", num_inducing: int = 16,
                 kernel: Literal["exponential", "rbf", "canonical"] = "exponential",
                 cov: Literal["full", "diag"] = "full", max_len: int = 128,
                 outputscale_init: float = math.exp(-4.0), proj_dropout: float = 0.0) -> None:
        super().__init__(dim, heads, proj_dropout=proj_dropout)
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
        if not 0 < outputscale_init <= torch.finfo(torch.float32).max:
            raise ValueError(f"outputscale_init must be > 0 and a finite float32, got "
                             f"{outputscale_init}")
        D = dim // heads
        # the variational parameters: S's Cholesky over max_len tokens (standard), or the
        # inducing keys [H, M, C], their weights [H, M, D] and S's Cholesky [H, D, M, M]
        check_parameter_memory(
            heads * max_len * max_len if variant == "standard"
            else heads * num_inducing * (dim + D + D * num_inducing),
            f"SGPA ({variant}) with max_len {max_len}" if variant == "standard"
            else f"SGPA ({variant}) with num_inducing {num_inducing}")
        self.variant, self.cov, self.kernel_name = variant, cov, kernel
        self.num_inducing, self.max_len = num_inducing, max_len
        self.proj = nn.Linear(dim, 2 * dim, bias=False)
        k = make_attention_kernel(kernel, heads, self.head_dim)
        if k.raw_outputscale.requires_grad:  # the canonical kernel's amplitude stays fixed at 1
            k.outputscale = torch.full((heads,), float(outputscale_init))
        if variant == "standard":
            self.strategy = SGPAStrategy(k, heads, max_len)
        else:
            self.strategy = DecoupledSGPAStrategy(k, heads, self.head_dim, dim, num_inducing,
                                                  cov=cov)
        self.out = nn.Linear(dim, dim)

    @property
    def kernel(self):
        """The ``[H]``-batched gpytorch ScaleKernel (owned by the strategy)."""
        return self.strategy.kernel

    @property
    def qk_weight(self) -> torch.Tensor:
        """The tied projection :math:`W_{qk}` viewed per head, ``[H, D, C]``."""
        return self.proj.weight[: self.dim].view(self.heads, self.head_dim, self.dim)

    @property
    def head(self) -> SGPAStrategy | DecoupledSGPAStrategy:
        """The GP head: the variant's strategy."""
        return self.strategy

    def project(self, x: torch.Tensor, mask: torch.Tensor | None = None) -> tuple:
        """Tied queries/keys and values ``[B, H, N, D]`` (role-major split of the fused weight);
        decoupled: also :math:`W_{qk}` ``[H, D, C]``, which projects the global inducing keys.
        The tied queries/keys are rotated inside
        :meth:`~gpattn_ppl.attention.AttentionUnit.positions`; the global inducing keys carry
        no position."""
        B, N, _ = x.shape
        q, v = self.proj(x).view(B, N, 2, self.heads, self.head_dim).permute(2, 0, 3, 1, 4)
        q, = self.rotate(q)
        return (q, v) if self.variant == "standard" else (q, v, self.qk_weight)


# -- initialisation from a pretrained softmax layer (attention/pretrained.py) ------------------

@register_pretrained_init(SGPAttention)
def _sgpa(unit: SGPAttention, w: SoftmaxWeights, x, mask) -> dict:
    C = unit.dim
    require_exponential_kernel(unit)
    # the symmetric kernel sees q.q: W_qk = c sqrt(s sqrt(D)) W_q (c = 1 keeps the logits' scale)
    base = w.q_weight * math.sqrt(w.scale * math.sqrt(unit.head_dim))
    copy_output_projection(unit, w, fold_value_bias=True)
    fitted = []
    if unit.variant == "decoupled" and unit.num_inducing > 0:
        unit.strategy.inducing_weights.zero_()      # the mean is then linear in the values
        fitted.append("inducing weights a_beta = 0")
        if x is not None:
            tokens = x[mask] if mask is not None else x.reshape(-1, C)
            idx = torch.randperm(tokens.shape[0], device=x.device)
            M = unit.num_inducing
            idx = idx[:M] if idx.numel() >= M else idx[torch.arange(M, device=x.device) % idx.numel()]
            Z = unit.strategy.inducing.inducing_inputs                  # [H, M, C]
            Z.copy_(tokens[idx].unsqueeze(0).expand_as(Z))
            fitted.append("inducing keys Z_beta (tokens of the calibration batch)")

    def trial(c: float) -> None:
        unit.proj.weight.copy_(torch.cat([base * c, w.v_weight]))
        copy_output_projection(unit, w, fold_value_bias=True)
        if x is not None:
            fit_value_gain(unit, w, x, mask, slice(C, 2 * C))

    if x is None:
        trial(1.0)
    else:
        c = search_query_scale(unit, w, x, mask, trial)
        a = shrink_noise(unit, w, x, mask, slice(C, 2 * C))
        fitted += [f"W_qk scale c = {c:g} (searched)", "W_v (per-head gain)",
                   f"noise: W_v x {a:.3g}, W_O / {a:.3g}"]
    return {"copied": ["W_qk <- W_q", "W_v", "W_O", "b_O + W_O b_v"], "fitted": fitted,
            "not_carried": ["W_k"] + dropped_biases(w, ("q", "k"))}
