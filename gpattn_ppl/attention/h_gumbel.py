r"""h-sto-trans: hierarchical Gumbel-softmax attention through learnable key centroids."""

from __future__ import annotations

import math
from typing import Literal

import torch
from torch import nn

from ..ppl import positive_float
from .gumbel import GumbelAttention, _schedule_or_none
from .pretrained import SoftmaxWeights, pretrained_rule, register_pretrained_init
from .registry import register_attention

__all__ = ["HierarchicalGumbelAttention"]

#: allowed values of the ``centroid_init`` option
CENTROID_INITS = ("normal", "kmeans")


@register_attention("h_gumbel")
class HierarchicalGumbelAttention(GumbelAttention):
    r"""Hierarchical stochastic attention (h-sto-trans, STO eqs. 14-17, Algorithm 1).

    Per head, with keys :math:`k \in \mathbb R^{N \times D}` and learnable centroids
    :math:`Z \in \mathbb R^{D \times c}` (the paper's :math:`C`; ``centroids`` in the code, Z here
    since C is the model width):

    .. math::
        \hat a_c &\sim \mathrm{Concrete}(k Z,\ \tau_1) \in [0, 1]^{N \times c}
            &&\text{(eq. 14: each key attends to the centroids)}\\
        \hat k &= \hat a_c Z^\top \in \mathbb R^{N \times D}
            &&\text{(eq. 15: keys become random mixtures of centroids)}\\
        \hat a_v &\sim \mathrm{Concrete}(q \hat k^\top \;(-\infty \text{ on padded keys}),\ \tau_2)
            &&\text{(eq. 16)}\\
        h &= \hat a_v v &&\text{(eq. 17)}

    with row-wise Concrete (Gumbel-softmax) draws as in :class:`GumbelAttention`
    (:math:`\mathrm{Concrete}(\ell, \tau)_{i\cdot} = \mathrm{softmax}((\ell_{i\cdot} + g_{i\cdot})/\tau)`).
    Padded keys get value weight exactly 0; their centroid weights are drawn but never used.

    Pyro sites (local, in the data plate): ``<module path>.centroid_weights`` (batch
    ``[B, H, N]``, event c) and ``<module path>.weights`` (batch ``[B, H, N]``, event N'), with
    the same ``prior`` choice as :class:`GumbelAttention` (``"same"``: KL exactly 0; ``"uniform"``:
    uniform Concrete priors at fixed temperatures, MC KL of padded rows masked out).

    Inside :class:`~gpattn_ppl.settings.posterior_mean`: both draws are replaced by their values
    at the modal noise :math:`g = 0`, :math:`\hat a_c = \mathrm{softmax}(kZ/\tau_1)`,
    :math:`\hat a_v = \mathrm{softmax}(q\hat k^\top/\tau_2)` (deterministic).

    Proposition 3.1 (STO eq. 18): with shared noise,
    :math:`\|\hat a_c(k_i) - \hat a_c(k_j)\|_2 \le \|k_i - k_j\|_2\,\|Z\|_2/\tau_1`.

    :param dim: C. :param heads: H.
    :param temperature: :math:`\tau_2`, the value-attention temperature (IMDB 20 or 30, CoLA 1).
    :param centroid_temperature: :math:`\tau_1`, the centroid-attention temperature (paper: 1).
    :param temperature_schedule: optional schedule spec for :math:`\tau_2`.
    :param centroid_temperature_schedule: optional schedule spec for :math:`\tau_1`.
    :param num_centroids: c (not reported by the paper; default 16).
    :param centroids_per_head: one ``[D, c]`` matrix per head instead of one shared by the heads
        (the paper's notation has a single centroid matrix).
    :param centroid_init: ``"normal"`` (:math:`Z_{dj} \sim \mathcal N(0, 1/D)`) or ``"kmeans"``
        (k-means of the real keys of the first training batch, see :meth:`init_centroids`).
    :param prior: ``"same"`` or ``"uniform"``. :param prior_temperature: temperature of the
        uniform prior over keys (``None``: ``temperature``).
    :param centroid_prior_temperature: temperature of the uniform prior over centroids
        (``None``: ``centroid_temperature``).
    :param straight_through: hard one-hot draws forward (both levels), relaxed gradients backward.
    :param attn_dropout: dropout on the value attention :math:`\hat a_v`.
    :param proj_dropout: dropout after :math:`W_O`.

    Cost O(N c D + N N' D) time and O(N N' + N c) memory per (b, h).

    >>> att = HierarchicalGumbelAttention(dim=8, heads=2, num_centroids=4)
    >>> att(torch.randn(3, 5, 8)).shape
    torch.Size([3, 5, 8])
    """

    _scheduled_attrs = ("temperature", "centroid_temperature")

    def __init__(self, dim: int, heads: int, *, temperature: float = 1.0,
                 centroid_temperature: float = 1.0,
                 temperature_schedule: float | dict | None = None,
                 centroid_temperature_schedule: float | dict | None = None, num_centroids: int = 16,
                 centroids_per_head: bool = False,
                 centroid_init: Literal["normal", "kmeans"] = "normal",
                 prior: Literal["same", "uniform"] = "same", prior_temperature: float | None = None,
                 centroid_prior_temperature: float | None = None,
                 straight_through: bool = False, attn_dropout: float = 0.0,
                 proj_dropout: float = 0.0) -> None:
        super().__init__(dim, heads, temperature=temperature,
                         temperature_schedule=temperature_schedule, prior=prior,
                         prior_temperature=prior_temperature, straight_through=straight_through,
                         attn_dropout=attn_dropout, proj_dropout=proj_dropout)
        if num_centroids < 1:
            raise ValueError(f"num_centroids must be >= 1, got {num_centroids}")
        if centroid_init not in CENTROID_INITS:
            raise ValueError(f"centroid_init must be one of {CENTROID_INITS}, got {centroid_init!r}")
        self.centroid_temperature = positive_float(centroid_temperature,
                                                       "centroid_temperature")
        self.centroid_prior_temperature = positive_float(
            centroid_temperature if centroid_prior_temperature is None
            else centroid_prior_temperature, "centroid_prior_temperature")
        sched = _schedule_or_none(centroid_temperature_schedule, "centroid_temperature_schedule")
        if sched is not None:
            self._scheduled["centroid_temperature"] = sched
        self.num_centroids, self.centroids_per_head = num_centroids, bool(centroids_per_head)
        self.centroid_init = centroid_init
        shape = (heads, self.head_dim, num_centroids) if centroids_per_head else \
            (self.head_dim, num_centroids)
        self.centroids = nn.Parameter(torch.randn(shape) / math.sqrt(self.head_dim))
        # k-means initialisation pending (a buffer, so it survives state_dict round trips), and
        # its host-side mirror, read instead of the buffer in every training step (no sync)
        self.register_buffer("centroids_pending", torch.tensor(centroid_init == "kmeans"))
        self._pending: bool | None = None

    def _load_from_state_dict(self, *args, **kwargs):
        self._pending = None  # re-read centroids_pending after any load
        return super()._load_from_state_dict(*args, **kwargs)

    def extra_repr(self) -> str:
        return (f"temperature={self.temperature}, centroid_temperature="
                f"{self.centroid_temperature}, num_centroids={self.num_centroids}, "
                f"centroids_per_head={self.centroids_per_head}, prior={self.prior!r}")

    # -- centroids ----------------------------------------------------------------------------
    def _centroids(self) -> torch.Tensor:
        """Z broadcastable against ``[B, H, N, D]`` keys: ``[D, c]`` or ``[H, D, c]``."""
        return self.centroids

    @torch.no_grad()
    def init_centroids(self, x: torch.Tensor, mask: torch.Tensor | None = None,
                       iters: int = 10) -> None:
        r"""k-means initialisation of Z from the keys of the real tokens of ``x`` ``[B, N, C]``.

        Lloyd's algorithm, ``iters`` iterations, started from c keys drawn without replacement
        (with replacement when there are fewer than c real keys); empty clusters keep their
        previous centroid. Keys of all heads are pooled for a shared Z, clustered per head
        (batched) otherwise. Clears the pending flag of ``centroid_init="kmeans"``.
        """
        _, k, _ = self.project(x)                                        # [B, H, N, D]
        real = (torch.ones(k.shape[0], k.shape[2], dtype=torch.bool, device=k.device)
                if mask is None else mask)
        keys = k.permute(1, 0, 2, 3)[:, real]                            # [H, P, D]
        if not self.centroids_per_head:
            keys = keys.reshape(1, -1, keys.shape[-1])                   # [1, H P, D]
        G, P, D = keys.shape
        c = self.num_centroids
        idx = (torch.randperm(P, device=keys.device)[:c] if P >= c
               else torch.randint(P, (c,), device=keys.device))
        cent = keys[:, idx]                                              # [G, c, D]
        for _ in range(iters):
            assign = torch.cdist(keys, cent).argmin(-1)                  # [G, P]
            onehot = torch.nn.functional.one_hot(assign, c).to(keys.dtype)  # [G, P, c]
            counts = onehot.sum(1)                                       # [G, c]
            sums = onehot.transpose(1, 2) @ keys                         # [G, c, D]
            cent = torch.where(counts[..., None] > 0, sums / counts.clamp_min(1)[..., None], cent)
        cent = cent.transpose(1, 2)                                      # [G, D, c]
        self.centroids.copy_(cent if self.centroids_per_head else cent[0])
        self.centroids_pending.fill_(False)
        self._pending = False

    # -- forward ------------------------------------------------------------------------------
    def centroid_logits(self, k: torch.Tensor) -> torch.Tensor:
        r"""Key-to-centroid logits :math:`k Z` ``[B, H, N, c]`` (eq. 14)."""
        Z = self._centroids()
        if Z.dim() == 2:            # shared Z: one [B H N, D] x [D, c] GEMM (cheap backward)
            return (k.reshape(-1, k.shape[-1]) @ Z).view(*k.shape[:-1], Z.shape[-1])
        return k @ Z

    def hierarchical_keys(self, k: torch.Tensor, mask: torch.Tensor | None) -> torch.Tensor:
        r"""New keys :math:`\hat k = \hat a_c Z^\top` ``[B, H, N, D]`` (eqs. 14-15), one draw."""
        a_c = self._weights("centroid_weights", self.centroid_logits(k),
                            self.centroid_temperature, mask, self.centroid_prior_temperature)
        Z = self._centroids()
        if Z.dim() == 2:
            return (a_c.reshape(-1, a_c.shape[-1]) @ Z.T).view(*a_c.shape[:-1], Z.shape[0])
        return a_c @ Z.transpose(-1, -2)

    def attention_matrix(self, x: torch.Tensor, mask: torch.Tensor | None = None) -> torch.Tensor:
        """One draw (or the noise-free value) of the value attention ``[B, H, N, N']``."""
        mask = self._check(x, mask)
        q, k, _ = self.project(x)
        k_hat = self.hierarchical_keys(k, mask)
        return self._weights("weights", self.logits(q, k_hat, mask), self.temperature, mask)

    def _head_outputs(self, x: torch.Tensor, mask: torch.Tensor | None) -> torch.Tensor:
        q, k, v = self.project(x)
        return self._attend_values(q, self.hierarchical_keys(k, mask), v, mask)

    def attend(self, x: torch.Tensor, mask: torch.Tensor | None) -> torch.Tensor:
        if self.training and self.centroid_init == "kmeans":
            if self._pending is None:  # one read of the buffer after construction or a load
                self._pending = bool(self.centroids_pending)
            if self._pending:
                self.init_centroids(x, mask)
        return self.proj_dropout(self.out(self.merge_heads(self._head_outputs(x, mask))))


# -- initialisation from a pretrained softmax layer (attention/pretrained.py) ------------------

@register_pretrained_init(HierarchicalGumbelAttention)
def _h_gumbel(unit: HierarchicalGumbelAttention, w: SoftmaxWeights, x, mask) -> dict:
    report = pretrained_rule(GumbelAttention)(unit, w, x, mask)
    if x is not None:
        unit.init_centroids(x, mask)
        report["fitted"] = ["centroids (k-means of the pretrained keys)"]
    return report
