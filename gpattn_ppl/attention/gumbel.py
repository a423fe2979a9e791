r"""sto-trans: Gumbel-softmax (relaxed one-hot) attention, and the temperature-schedule hook."""

from __future__ import annotations

from typing import Literal

import torch
import torch.nn.functional as F
from torch import nn

from ..distributions import AttentionPredictive, SafeRelaxedOneHotCategorical
from ..distributions import relaxed_one_hot as _roh
from ..ppl import Schedule, ScheduledAttributes, build_schedule, positive_float
from ._tiled import TILE, tiled_attention, use_tiles
from .base import AttentionUnit
from .pretrained import SoftmaxWeights, copy_qkv, register_pretrained_init
from .registry import register_attention

__all__ = ["GumbelAttention"]

#: allowed values of the ``prior`` option of the Gumbel units
PRIORS = ("same", "uniform")

_NEG_INF = float("-inf")

#: ``attention_tiles("auto")``: the fused path runs in tiles over keys from this many keys on,
#: per device type; a device type not listed keeps the untiled path. CPU is not listed: measured
#: there (``benchmarks/bench_tiles.py``, ``benchmarks/results/item4_tiles_cpu.json``, 1 thread,
#: one train step, B N = 2048) the tiled step took 2.4x the time of the fused
#: ``scaled_dot_product_attention`` step at N = 256 and 1024 (the noise is drawn twice) and its
#: peak memory was higher (60 against 41 MiB at N = 1024: the fused kernel keeps only the noise)
TILE_MIN_N: dict[str, int] = {}


def _schedule_or_none(spec, where: str) -> Schedule | None:
    return None if spec is None else build_schedule(spec, where=where)


@register_attention("gumbel")
class GumbelAttention(ScheduledAttributes, AttentionUnit):
    r"""Multi-head stochastic attention with relaxed one-hot weights (sto-trans, STO eqs. 9-11).

    Per head, with :math:`q_i, k_j, v_j \in \mathbb R^D`,

    .. math::
        \ell_{ij} = q_i^\top k_j \;(-\infty \text{ on padded keys}), \qquad
        \hat a_{i\cdot} \sim \mathrm{Concrete}(\ell_{i\cdot}, \tau), \quad
        \hat a_{ij} = \frac{\exp((\ell_{ij} + g_{ij})/\tau)}{\sum_{j'}\exp((\ell_{ij'} + g_{ij'})/\tau)},
        \qquad h_i = \sum_j \hat a_{ij} v_j,

    :math:`g_{ij} \sim \mathrm{Gumbel}(0, 1)` iid, output :math:`\mathrm{concat}_h(h)\,W_O`. There
    is no :math:`1/\sqrt D`: the temperature replaces the scale (STO eq. 7). Fresh noise is drawn
    on every call (training and evaluation); padded keys get weight exactly 0.

    The weights :math:`\hat A \in [0, 1]^{B \times H \times N \times N'}` are one local Pyro site
    ``<module path>.weights`` (batch ``[B, H, N]``, event ``N'``; the data plate over B) with
    guide :class:`~gpattn_ppl.distributions.SafeRelaxedOneHotCategorical` :math:`(\ell, \tau)`.
    The prior is ``"same"`` (the paper: prior = guide, KL exactly 0, the objective is the
    likelihood under stochastic attention) or ``"uniform"`` (uniform Concrete over the real keys
    at the fixed ``prior_temperature``; the Monte-Carlo KL of padded-query rows is masked out and
    the rest enters the ``kl`` term, weighted by ``train.objective.kl_weight``). When nothing but
    the output depends on the weights (thin mode with prior ``same`` and no straight-through, or
    posterior-mean mode) the value attention runs fused through
    :func:`~torch.nn.functional.scaled_dot_product_attention` with the Gumbel draw as an additive
    mask: same draw, same output, no ``[B, H, N, N']`` weights tensor kept for backward.

    Inside :class:`~gpattn_ppl.settings.posterior_mean` the unit is deterministic and returns
    the attention at the modal noise :math:`g = 0`, :math:`\mathrm{softmax}(\ell/\tau)` (softmax
    attention at scale :math:`1/\tau`); it is not the expectation of the sampled output. The output
    has no closed-form predictive distribution: :meth:`predictive` is a Monte-Carlo estimate of
    its mean and marginal variance (no joint), and uncertainty comes from T stochastic passes.

    :param dim: C. :param heads: H.
    :param temperature: :math:`\tau > 0` (IMDB 1 or 40, CoLA 1 in the paper).
    :param temperature_schedule: optional schedule spec for :math:`\tau` (a number or a
        :func:`~gpattn_ppl.ppl.build_schedule` mapping, e.g.
        ``{kind: exponential, start: 5, end: 1}``), applied on the program's clock
        (:meth:`~gpattn_ppl.infer.PyroProgram.set_epoch`); the current value travels with the
        state dict.
    :param prior: ``"same"`` or ``"uniform"``.
    :param prior_temperature: temperature of the uniform prior; ``None``: the initial
        ``temperature`` (kept fixed when :math:`\tau` is annealed).
    :param straight_through: hard one-hot weights forward, relaxed gradients backward.
    :param attn_dropout: dropout on :math:`\hat A`. :param proj_dropout: dropout after W_O.

    Cost O(N N' D) time and O(N N') memory per (b, h), as softmax, plus N N' Gumbel draws.

    >>> att = GumbelAttention(dim=8, heads=2, temperature=1.0)
    >>> att(torch.randn(3, 5, 8)).shape
    torch.Size([3, 5, 8])
    """

    stochastic = True
    rotary_capable = True
    _scheduled_attrs = ("temperature",)

    def __init__(self, dim: int, heads: int, *, temperature: float = 1.0,
                 temperature_schedule: float | dict | None = None,
                 prior: Literal["same", "uniform"] = "same",
                 prior_temperature: float | None = None, straight_through: bool = False,
                 attn_dropout: float = 0.0, proj_dropout: float = 0.0) -> None:
        super().__init__(dim, heads, attn_dropout=attn_dropout, proj_dropout=proj_dropout)
        if prior not in PRIORS:
            raise ValueError(f"prior must be one of {PRIORS}, got {prior!r}")
        self.temperature = positive_float(temperature, "temperature")
        self.prior = prior
        self.prior_temperature = positive_float(
            temperature if prior_temperature is None else prior_temperature, "prior_temperature")
        self.straight_through = bool(straight_through)
        self._scheduled = {}
        sched = _schedule_or_none(temperature_schedule, "temperature_schedule")
        if sched is not None:
            self._scheduled["temperature"] = sched
        self.qkv = nn.Linear(dim, 3 * dim)
        self.out = nn.Linear(dim, dim)

    def extra_repr(self) -> str:
        return (f"temperature={self.temperature}, prior={self.prior!r}, "
                f"straight_through={self.straight_through}")

    def project(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Per-head queries, keys and values, each ``[B, H, N, D]`` (role-major split; queries
        and keys rotated inside :meth:`~gpattn_ppl.attention.AttentionUnit.positions`)."""
        B, N, _ = x.shape
        q, k, v = self.qkv(x).view(B, N, 3, self.heads, self.head_dim).permute(2, 0, 3, 1, 4)
        q, k = self.rotate(q, k)
        return q, k, v

    def logits(self, q: torch.Tensor, k: torch.Tensor, mask: torch.Tensor | None) -> torch.Tensor:
        r"""Attention logits :math:`\ell = q k^\top` ``[B, H, N, N']``, ``-inf`` on padded keys."""
        logits = q @ k.transpose(-1, -2)
        if mask is not None:        # in place: the matmul's backward does not need its output
            logits.masked_fill_(~mask[:, None, None, :], _NEG_INF)
        return logits

    def attention_matrix(self, x: torch.Tensor, mask: torch.Tensor | None = None) -> torch.Tensor:
        """One draw (or, under ``posterior_mean``, the noise-free value) of the weights
        ``[B, H, N, N']``."""
        mask = self._check(x, mask)
        q, k, _ = self.project(x)
        return self._weights("weights", self.logits(q, k, mask), self.temperature, mask)

    def _head_outputs(self, x: torch.Tensor, mask: torch.Tensor | None) -> torch.Tensor:
        q, k, v = self.project(x)
        return self._attend_values(q, k, v, mask)

    def predictive(self, x: torch.Tensor, mask: torch.Tensor | None = None, *,
                   samples: int = 64) -> AttentionPredictive:
        """A Monte-Carlo estimate of the predictive of the head outputs ``[B, H, N, D]``: mean
        and (unbiased) marginal variance over ``samples`` draws; no joint (``mvn`` is ``None``)."""
        if samples < 2:
            raise ValueError(f"samples must be >= 2 for a variance estimate, got {samples}")
        mask = self._check(x, mask)
        draws = torch.stack([self._head_outputs(x, mask) for _ in range(samples)])
        return AttentionPredictive(draws.mean(0), draws.var(0))

    def _weights(self, name: str, logits: torch.Tensor, temperature: float,
                 mask: torch.Tensor | None, prior_temperature: float | None = None
                 ) -> torch.Tensor:
        """Draw site ``name`` with guide Concrete(logits, temperature) over the last axis.

        ``mask`` (``[B, N]``) marks the real tokens indexing the rows (queries, or keys for the
        centroid weights); the KL of padded rows is masked out. ``prior_temperature``: of the
        uniform prior (default ``self.prior_temperature``).
        """
        q = SafeRelaxedOneHotCategorical(temperature, logits=logits,
                                         straight_through=self.straight_through,
                                         validate_args=False)
        unmasked = q                     # the mean-mode value is its modal draw (g = 0)
        prior = None
        if self.prior == "uniform":
            prior = SafeRelaxedOneHotCategorical(
                self.prior_temperature if prior_temperature is None else prior_temperature,
                logits=torch.zeros_like(logits).masked_fill(
                    logits == _NEG_INF, _NEG_INF), validate_args=False)
            if mask is not None:
                rows = mask[:, None, :].expand(logits.shape[:-1])
                q, prior = q.mask(rows), prior.mask(rows)
        return self.sample(name, q, prior, local=True, mean=lambda: unmasked.tempered_probs)

    def _fused(self) -> bool:
        """Whether the value attention may run fused (no weights tensor, no Pyro statement):
        in posterior-mean mode, and whenever the runtime needs no value of the weights site
        (:meth:`~gpattn_ppl.attention.AttentionUnit.needs_site`: prior ``same``, thin mode) and
        there is no straight-through estimator. Then nothing but the output depends on them."""
        return self.use_mean or (not self.straight_through
                                 and not self.needs_site(scored=self.prior != "same"))

    def _attend_values(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                       mask: torch.Tensor | None) -> torch.Tensor:
        r"""Head outputs :math:`\hat a v` ``[B, H, N, D]`` for keys ``k`` (eqs. 9-10 / 16-17).

        Fused path (:meth:`_fused`): :func:`torch.nn.functional.scaled_dot_product_attention`
        with scale :math:`1/\tau` and the additive float mask :math:`g/\tau` (``-inf`` on padded
        keys), which is :math:`\mathrm{softmax}((q k^\top + g)/\tau)\,v` with the same Gumbel
        draw (same shape, same RNG stream) as the site would make; the modal value
        :math:`\mathrm{softmax}(q k^\top/\tau)\,v` in posterior-mean mode. Otherwise the weights
        are materialised as the Pyro site ``weights``.

        Without attention dropout the fused path runs in tiles of ``TILE`` keys where
        :class:`~gpattn_ppl.settings.attention_tiles` says so (no ``[B, H, N, N']`` noise or
        weights kept; the backward redraws each tile's noise from the saved generator state).
        With one tile (N' <= ``TILE``) the draw is the untiled one; with more, each tile
        ``[B, H, N, t]`` is drawn in turn, so the same uniforms land in other places: the same
        iid Gumbel distribution and the same generator state afterwards, not the same values.
        """
        tau = self.temperature
        p = self.attn_dropout.p if self.attn_dropout.active else 0.0
        if self._fused():
            if p == 0.0 and use_tiles(k.shape[-2], k.device, TILE_MIN_N):
                noise = None if self.use_mean else (
                    lambda shape, dtype, device: _roh.sample_gumbel(
                        shape, dtype=dtype, device=device).div_(tau))
                return tiled_attention(lambda a, b: (a @ b.mT).div_(tau), q, k, v, mask,
                                       tile=TILE, noise_fn=noise)
            if self.use_mean:
                bias = None if mask is None else mask[:, None, None, :]
            else:
                B, H, N, _ = q.shape
                bias = _roh.sample_gumbel((B, H, N, k.shape[-2]), dtype=q.dtype, device=q.device)
                bias.div_(tau)
                if mask is not None:
                    bias.masked_fill_(~mask[:, None, None, :], _NEG_INF)
            return F.scaled_dot_product_attention(q, k, v, attn_mask=bias, dropout_p=p,
                                                  scale=1.0 / tau)
        A = self._weights("weights", self.logits(q, k, mask), tau, mask)
        return self.attn_dropout(A) @ v

    def attend(self, x: torch.Tensor, mask: torch.Tensor | None) -> torch.Tensor:
        return self.proj_dropout(self.out(self.merge_heads(self._head_outputs(x, mask))))


# -- initialisation from a pretrained softmax layer (attention/pretrained.py) ------------------

@register_pretrained_init(GumbelAttention)
def _gumbel(unit: GumbelAttention, w: SoftmaxWeights, x, mask) -> dict:
    copy_qkv(unit, w, w.scale)       # no 1/sqrt(D) in the unit: tau takes its place
    return {"copied": ["W_q (x 1/sqrt(D))", "b_q (x 1/sqrt(D))", "W_k", "b_k", "W_v", "b_v",
                       "W_O", "b_O"], "fitted": [], "not_carried": []}
