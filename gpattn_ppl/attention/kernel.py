"""Kernel attention, symmetric (W_q = W_k) and asymmetric."""

from __future__ import annotations

import math
from typing import Literal

import torch
from torch import nn

from ..distributions import AttentionPredictive
from ..kernels import KERNELS, canonical_projection_init_, log_gram, make_attention_kernel
from ._tiled import TILE, tiled_attention, use_tiles
from .base import AttentionUnit
from .pretrained import (
    SoftmaxWeights,
    copy_output_projection,
    dropped_biases,
    fit_value_gain,
    register_pretrained_init,
    require_exponential_kernel,
    search_query_scale,
)
from .registry import register_attention

__all__ = ["KernelAttention"]

#: ``attention_tiles("auto")``: the tiled path from this many keys on, per device type; a device
#: type not listed keeps the untiled path. CPU is not listed: measured there
#: (``benchmarks/bench_tiles.py``, ``benchmarks/results/item4_tiles_cpu.json``, 1 thread, one
#: train step, B N = 2048) the tiled step took 1.61x the untiled one's time at N = 256 and 1.22x
#: at N = 1024, for half its peak memory at N = 1024 (52 against 103 MiB)
TILE_MIN_N: dict[str, int] = {}


@register_attention("kernel")
class KernelAttention(AttentionUnit):
    r"""Kernel attention :math:`V^+ = \mathcal K V` (CGPT eqs. 6-7; Tsai et al. 2019).

    .. math::
        \mathcal K_{ab} = \sigma_f^2\,\kappa(x_a W_q, x_b W_k), \qquad
        V^+ = \begin{cases} \mathrm{diag}(\mathcal K \mathbf 1)^{-1}\mathcal K V & \text{normalize}\\
        \mathcal K V & \text{otherwise}\end{cases}

    ``symmetric=True`` ties :math:`W_q = W_k`, so :math:`\mathcal K` is a Gram matrix (the mean of
    a GP); otherwise it is an asymmetric similarity. The normalised form is computed in log
    space (a softmax of :math:`\log\mathcal K`), so it cannot overflow; the unnormalised form
    (the papers') zeroes the padded key columns of :math:`\mathcal K`.

    :param kernel: ``"exponential"`` (scaled dot product, text) or ``"rbf"`` (ARD, images); both
        are gpytorch kernels with one hyperparameter set per head. ``"canonical"``: CGPT's
        parameter-free SE (the "Kernel (asym)/(sym)" baselines and the CGPT pre-training model);
        its query/key projections start small (:func:`~gpattn_ppl.kernels.canonical_projection_init_`).
    :param symmetric: tie the query and key projections.
    :param normalize: row-normalise (default) or return the papers' unnormalised :math:`\mathcal K V`.
    :param attn_dropout: dropout on :math:`\mathcal K` (kept on at test under MC dropout).
    :param proj_dropout: dropout after :math:`W_O`.

    Cost O(N² D) time and O(N²) memory per (b, h); in tiles over keys
    (:class:`~gpattn_ppl.settings.attention_tiles`, without attention dropout) O(N t) memory
    for tile width t and one more evaluation of the logits in the backward.
    """

    rotary_capable = True

    def __init__(self, dim: int, heads: int, *,
                 kernel: Literal["exponential", "rbf", "canonical"] = "exponential",
                 symmetric: bool = False, normalize: bool = True, attn_dropout: float = 0.0,
                 proj_dropout: float = 0.0) -> None:
        super().__init__(dim, heads, attn_dropout=attn_dropout, proj_dropout=proj_dropout)
        if kernel not in KERNELS:
            raise ValueError(f"unknown kernel '{kernel}'; allowed: {', '.join(KERNELS)}")
        self.symmetric, self.normalize, self.kernel_name = symmetric, normalize, kernel
        self.n_proj = 2 if symmetric else 3
        self.proj = nn.Linear(dim, self.n_proj * dim, bias=False)
        self.kernel = make_attention_kernel(kernel, heads, self.head_dim)
        if kernel == "canonical":  # no lengthscale: start with informative distances
            canonical_projection_init_(self.proj.weight[: (self.n_proj - 1) * dim], self.head_dim)
        self.out = nn.Linear(dim, dim)

    def project(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Per-head queries, keys and values ``[B, H, N, D]`` (keys = queries if symmetric;
        queries and keys rotated inside :meth:`~gpattn_ppl.attention.AttentionUnit.positions`)."""
        B, N, _ = x.shape
        parts = self.proj(x).view(B, N, self.n_proj, self.heads, self.head_dim).permute(2, 0, 3, 1, 4)
        if self.symmetric:
            q, = self.rotate(parts[0])
            return q, q, parts[1]
        q, k = self.rotate(parts[0], parts[1])
        return q, k, parts[2]

    def attention_matrix(self, x: torch.Tensor, mask: torch.Tensor | None = None) -> torch.Tensor:
        """The (normalised or raw) attention matrix ``[B, H, N, N]``; pad columns are exactly 0."""
        mask = self._check(x, mask)
        q, k, _ = self.project(x)
        return self._matrix(q, k, mask)

    def predictive(self, x: torch.Tensor, mask: torch.Tensor | None = None) -> AttentionPredictive:
        """The (deterministic) head outputs ``[B, H, N, D]`` as a zero-variance predictive."""
        mask = self._check(x, mask)
        q, k, v = self.project(x)
        return AttentionPredictive.point(self._matrix(q, k, mask) @ v)

    def _matrix(self, q, k, mask):
        # the pad keys' logits are set to -inf in place (the sum that forms them keeps nothing
        # for its backward): exp gives the unnormalised form's exact 0 there
        logits = log_gram(self.kernel, q, k)
        if mask is not None:
            logits.masked_fill_(~mask[:, None, None, :], float("-inf"))
        return torch.softmax(logits, dim=-1) if self.normalize else torch.exp(logits)

    def attend(self, x: torch.Tensor, mask: torch.Tensor | None) -> torch.Tensor:
        q, k, v = self.project(x)
        if not self.attn_dropout.active and use_tiles(k.shape[-2], k.device, TILE_MIN_N):
            heads = tiled_attention(lambda a, b: log_gram(self.kernel, a, b), q, k, v, mask,
                                    params=[p for p in self.kernel.parameters()
                                            if p.requires_grad],
                                    normalize=self.normalize, tile=TILE)
        else:
            heads = self.attn_dropout(self._matrix(q, k, mask)) @ v
        return self.proj_dropout(self.out(self.merge_heads(heads)))


# -- initialisation from a pretrained softmax layer (attention/pretrained.py) ------------------

@register_pretrained_init(KernelAttention)
def _kernel(unit: KernelAttention, w: SoftmaxWeights, x, mask) -> dict:
    C = unit.dim
    require_exponential_kernel(unit)
    qk = [w.q_weight] if unit.symmetric else [w.q_weight, w.k_weight]
    scale = w.scale * math.sqrt(unit.head_dim)      # the exponential kernel scales by 1/sqrt(D)
    unit.kernel.outputscale = torch.ones(unit.heads)
    v_rows = slice((unit.n_proj - 1) * C, unit.n_proj * C)

    def trial(c: float) -> None:
        unit.proj.weight.copy_(torch.cat([t * (c * math.sqrt(scale)) for t in qk] + [w.v_weight]))
        copy_output_projection(unit, w, fold_value_bias=True)
        if x is not None and not unit.normalize:
            fit_value_gain(unit, w, x, mask, v_rows)

    fitted = []
    if x is None or not unit.symmetric:
        trial(1.0)
    else:               # tied W_q = W_k: the self term q.q dominates at c = 1
        c = search_query_scale(unit, w, x, mask, trial)
        fitted.append(f"W_qk scale c = {c:g} (searched)")
    if x is not None and not unit.normalize:
        fitted.append("W_v (per-head gain)")
    return {"copied": ["W_qk <- W_q" if unit.symmetric else "W_q", *([] if unit.symmetric
                       else ["W_k"]), "W_v", "W_O", "b_O + W_O b_v"], "fitted": fitted,
            "not_carried": dropped_biases(w, ("q", "k")) + (["W_k"] if unit.symmetric else [])}
