r"""sto-trans: Gumbel-softmax (relaxed one-hot) attention, and the temperature-schedule hook."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from ..distributions import SafeRelaxedOneHotCategorical
from ..distributions import relaxed_one_hot as _roh
from ..infer.schedules import Schedule, build_schedule
from ..infer.sites import current_site_context
from .base import AttentionUnit
from .registry import register_attention

__all__ = ["GumbelAttention", "update_temperatures", "PRIORS"]

#: allowed values of the ``prior`` option of the Gumbel units
PRIORS = ("same", "uniform")

_NEG_INF = float("-inf")


def _schedule_or_none(spec, where: str) -> Schedule | None:
    return None if spec is None else build_schedule(spec, where=where)


def update_temperatures(net: nn.Module, epoch: float, total_epochs: float | None = None
                        ) -> dict[str, float]:
    r"""Set the scheduled temperatures of every Gumbel unit in ``net`` for (fractional) ``epoch``.

    The trainer already does this per step through each unit's ``set_epoch(t, total_epochs)``
    (``Trainer._set_epoch_hooks``); this function is the same for a whole network, for custom
    loops::

        from gpattn_ppl.attention.gumbel import update_temperatures
        update_temperatures(net, epoch + step / steps_per_epoch, total_epochs)

    Units without a schedule keep their constant temperature; calling it on a network without
    Gumbel units is a no-op. Evaluation uses the temperatures last set; they travel with the
    state dict (the unit's extra state), so a checkpoint is evaluated at its own temperatures.

    :returns: ``{"<module path>.<attribute>": value}`` of the temperatures set (for logging).
    """
    out: dict[str, float] = {}
    for path, module in net.named_modules():
        if isinstance(module, _TemperatureScheduled):
            for attr, value in module.set_epoch(epoch, total_epochs).items():
                out[f"{path}.{attr}" if path else attr] = value
    return out


class _TemperatureScheduled:
    """Mixin: ``<attr>_schedule`` options that overwrite float attributes per epoch."""

    _scheduled: dict[str, Schedule]
    #: the float temperature attributes, saved as the module's extra state
    _temperature_attrs: tuple[str, ...] = ("temperature",)

    def get_extra_state(self) -> torch.Tensor:
        """The current temperatures (annealed ones included), in ``_temperature_attrs`` order."""
        return torch.tensor([getattr(self, a) for a in self._temperature_attrs],
                            dtype=torch.float64)

    def set_extra_state(self, state) -> None:
        for attr, value in zip(self._temperature_attrs, torch.as_tensor(state).tolist()):
            setattr(self, attr, _check_temperature(value, attr))

    def set_epoch(self, epoch: float, total_epochs: float | None = None) -> dict[str, float]:
        """Apply every temperature schedule at ``epoch``; returns the values set."""
        out = {}
        for attr, sched in self._scheduled.items():
            value = float(sched(epoch, total_epochs))
            if not value > 0:
                raise ValueError(f"{self.site_prefix or type(self).__name__}: schedule of {attr} "
                                 f"gave a non-positive temperature {value} at epoch {epoch}")
            setattr(self, attr, value)
            out[attr] = value
        return out


def _check_temperature(value, name: str) -> float:
    value = float(value)
    if not value > 0:
        raise ValueError(f"{name} must be > 0, got {value}")
    return value


@register_attention("gumbel")
class GumbelAttention(_TemperatureScheduled, AttentionUnit):
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

    Inside :func:`~gpattn_ppl.attention.posterior_mean` the unit is deterministic and returns
    the attention at the modal noise :math:`g = 0`, :math:`\mathrm{softmax}(\ell/\tau)` (softmax
    attention at scale :math:`1/\tau`); it is not the expectation of the sampled output. The output
    has no closed-form predictive distribution, so :attr:`last_distribution` stays ``None``;
    uncertainty comes from T stochastic passes.

    :param dim: C. :param heads: H.
    :param temperature: :math:`\tau > 0` (IMDB 1 or 40, CoLA 1 in the paper).
    :param temperature_schedule: optional schedule spec for :math:`\tau` (a number or a
        :func:`~gpattn_ppl.infer.schedules.build_schedule` mapping, e.g.
        ``{kind: exponential, start: 5, end: 1}``), applied by :func:`update_temperatures`.
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

    def __init__(self, dim: int, heads: int, *, temperature: float = 1.0,
                 temperature_schedule=None, prior: str = "same",
                 prior_temperature: float | None = None, straight_through: bool = False,
                 attn_dropout: float = 0.0, proj_dropout: float = 0.0) -> None:
        super().__init__(dim, heads, attn_dropout=attn_dropout, proj_dropout=proj_dropout)
        if prior not in PRIORS:
            raise ValueError(f"prior must be one of {PRIORS}, got {prior!r}")
        self.temperature = _check_temperature(temperature, "temperature")
        self.prior = prior
        self.prior_temperature = _check_temperature(
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
        """Per-head queries, keys and values, each ``[B, H, N, D]`` (role-major split)."""
        B, N, _ = x.shape
        q, k, v = self.qkv(x).view(B, N, 3, self.heads, self.head_dim).permute(2, 0, 3, 1, 4)
        return q, k, v

    def logits(self, q: torch.Tensor, k: torch.Tensor, mask: torch.Tensor | None) -> torch.Tensor:
        r"""Attention logits :math:`\ell = q k^\top` ``[B, H, N, N']``, ``-inf`` on padded keys."""
        logits = q @ k.transpose(-1, -2)
        if mask is not None:        # in place: the matmul's backward does not need its output
            logits.masked_fill_(~mask[:, None, None, :], _NEG_INF)
        return logits

    def attention_weights(self, x: torch.Tensor, mask: torch.Tensor | None) -> torch.Tensor:
        """One draw (or, under ``posterior_mean``, the noise-free value) of ``[B, H, N, N']``."""
        q, k, _ = self.project(x)
        return self._weights("weights", self.logits(q, k, mask), self.temperature, mask)

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
        if self.use_mean:
            return q.tempered_probs
        prior = None
        if self.prior == "uniform":
            prior = SafeRelaxedOneHotCategorical(
                self.prior_temperature if prior_temperature is None else prior_temperature,
                logits=torch.zeros_like(logits).masked_fill(
                    logits == _NEG_INF, _NEG_INF), validate_args=False)
            if mask is not None:
                rows = mask[:, None, :].expand(logits.shape[:-1])
                q, prior = q.mask(rows), prior.mask(rows)
        return self.sample(name, q, prior, local=True)

    def _fused(self) -> bool:
        """Whether the value attention may run fused (no weights tensor, no Pyro statement).

        True in thin mode (or outside any program) with prior ``same`` and no straight-through,
        and in ``posterior_mean`` mode: then nothing but the output depends on the weights.
        """
        if self.use_mean:
            return True
        ctx = current_site_context()
        return (self.prior == "same" and not self.straight_through
                and (ctx is None or ctx.mode == "thin"))

    def _attend_values(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                       mask: torch.Tensor | None) -> torch.Tensor:
        r"""Head outputs :math:`\hat a v` ``[B, H, N, D]`` for keys ``k`` (eqs. 9-10 / 16-17).

        Fused path (:meth:`_fused`): :func:`torch.nn.functional.scaled_dot_product_attention`
        with scale :math:`1/\tau` and the additive float mask :math:`g/\tau` (``-inf`` on padded
        keys), which is :math:`\mathrm{softmax}((q k^\top + g)/\tau)\,v` with the same Gumbel
        draw (same shape, same RNG stream) as the site would make; the modal value
        :math:`\mathrm{softmax}(q k^\top/\tau)\,v` in posterior-mean mode. Otherwise the weights
        are materialised as the Pyro site ``weights``.
        """
        tau = self.temperature
        p = self.attn_dropout.p if self.attn_dropout.active else 0.0
        if self._fused():
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
        q, k, v = self.project(x)
        h = self._attend_values(q, k, v, mask)
        return self.proj_dropout(self.out(self.merge_heads(h)))
