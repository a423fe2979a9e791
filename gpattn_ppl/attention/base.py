"""The attention-unit contract every method implements.

An attention unit maps ``x: [B, N, C]`` and ``mask: [B, N]`` (True on real tokens) to
``[B, N, C]``. Padded keys receive exactly zero weight; padded queries produce finite values that
pooling ignores. Stochastic units draw one sample per call (training and evaluation) through
:meth:`AttentionUnit.sample` and return their posterior mean inside
:class:`~gpattn_ppl.settings.posterior_mean`. Extra objective terms are exposed by name through
:meth:`AttentionUnit.objective_terms` -- a ``[B]`` tensor is a per-sequence (local) term, a 0-d
tensor a global one -- and are weighted and placed by the Pyro program, never added to a loss by
the unit itself.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass

import torch
from torch import nn

from .. import settings
from ..ppl import draw, needs_site

__all__ = ["AttentionUnit", "RotaryPositions", "check_attention_inputs",
           "check_parameter_memory", "MCDropout"]


def _physical_memory_bytes() -> int | None:
    """The machine's physical memory (``None`` where the platform does not say)."""
    import os

    try:
        return os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (AttributeError, ValueError, OSError):
        return None


def check_parameter_memory(elements: int, what: str, bytes_per_element: int = 4) -> None:
    """Refuse a unit whose parameters alone (``elements`` float32 values) would not fit in the
    machine's physical memory, before any of them is allocated: one ``ValueError`` naming the
    options (``what``) and both sizes, instead of gigabytes allocated on the way to an
    allocator failure (an SGPA with ``10**8`` inducing keys took 13 GB before it gave up).

    :raises ValueError: ``elements * bytes_per_element`` exceeds the physical memory.
    """
    need, have = int(elements) * bytes_per_element, _physical_memory_bytes()
    if have is not None and need > have:
        raise ValueError(f"its options ask for more memory than this machine has: {what} need "
                         f"{need / 2**30:.3g} GiB of parameters, the machine has "
                         f"{have / 2**30:.3g} GiB")


def check_attention_inputs(x: torch.Tensor, mask: torch.Tensor | None, dim: int, where: str,
                           dtype: torch.dtype | None = None) -> torch.Tensor | None:
    """Validate ``x: [B, N, C]`` and ``mask: [B, N]``; return the mask as bool.

    :param dtype: the unit's parameter dtype; ``x`` must have it (outside autocast).
    :raises ValueError: wrong rank or width, an empty batch or sequence, a dtype other than the
        unit's, mask shape or dtype, an all-padding row, NaN/inf.
    """
    where = where or type(x).__name__
    if x.dim() != 3 or x.shape[-1] != dim:
        raise ValueError(f"{where}: expected x of shape [B, N, {dim}], got {tuple(x.shape)}")
    if x.shape[0] == 0 or x.shape[1] == 0:
        raise ValueError(f"{where}: empty input (B = {x.shape[0]}, N = {x.shape[1]}); every "
                         "batch needs at least one sequence of at least one token")
    if (dtype is not None and x.dtype != dtype and x.is_floating_point()
            and not torch.is_autocast_enabled(x.device.type)):
        raise ValueError(f"{where}: x is {x.dtype} but the unit's parameters are {dtype}; cast "
                         f"one to the other (e.g. unit.to({x.dtype}))")
    if mask is not None:
        if mask.shape != x.shape[:2]:
            raise ValueError(f"{where}: mask must have shape [B, N] = {tuple(x.shape[:2])}, "
                             f"got {tuple(mask.shape)} (no broadcasting)")
        if mask.dtype != torch.bool:
            raise ValueError(f"{where}: mask must be a bool tensor (True = real token), "
                             f"got {mask.dtype}")
    if settings.validate_args.value():
        if mask is not None:
            empty = ~mask.any(-1)
            if bool(empty.any()):
                rows = empty.nonzero().flatten().tolist()[:5]
                raise ValueError(f"{where}: all-padding sequence(s) at batch rows {rows}: "
                                 "every sequence needs at least one real token")
        if not bool(torch.isfinite(x).all()):
            raise ValueError(f"{where}: input contains NaN or inf")
    return mask


@dataclass(frozen=True)
class RotaryPositions:
    r"""The rotary position embeddings (RoPE) of one call, as a host computes them: ``cos`` and
    ``sin`` ``[B or 1, N, D]`` (``D`` the head width), in the rotate-half convention of
    ``transformers`` (GPT-NeoX, Llama, ModernBERT; ``cos = cat(cos θ, cos θ)``):

    .. math::
        \mathrm{rot}(t)_n = t_n \odot \cos_n + \mathrm{rotate\_half}(t_n) \odot \sin_n,
        \qquad \mathrm{rotate\_half}([t_1, t_2]) = [-t_2, t_1]

    so that :math:`\langle \mathrm{rot}(q)_i, \mathrm{rot}(k)_j\rangle` depends on the
    positions through :math:`j - i` only. A unit applies it to its queries and keys inside
    :meth:`AttentionUnit.positions` (:meth:`AttentionUnit.rotate`).
    """

    cos: torch.Tensor
    sin: torch.Tensor

    def apply(self, t: torch.Tensor, token_dim: int = -2, where: str = "") -> torch.Tensor:
        """``t`` (batch first, tokens at ``token_dim``, the head width last: ``[B, H, N, D]``
        by default) rotated per token; computed in at least float32 (as the hosts do), returned
        in ``t``'s dtype.

        :raises ValueError: ``cos``/``sin`` that do not match ``t``'s batch, length or width.
        """
        cos, sin = self.cos, self.sin
        B, N, D = t.shape[0], t.shape[token_dim], t.shape[-1]
        if (cos.dim() != 3 or cos.shape != sin.shape or cos.shape[0] not in (1, B)
                or cos.shape[1] != N or cos.shape[2] != D or D % 2):
            raise ValueError(f"{where or 'RotaryPositions'}: rotary cos/sin of shape "
                             f"{tuple(cos.shape)} / {tuple(sin.shape)} do not fit queries and "
                             f"keys of batch {B}, length {N} and head width {D} (expected "
                             f"[{B} or 1, {N}, {D}], D even)")
        shape = [1] * t.dim()
        shape[0], shape[token_dim], shape[-1] = cos.shape[0], N, D
        work = torch.promote_types(t.dtype, torch.float32)
        cos = cos.to(device=t.device, dtype=work).reshape(shape)
        sin = sin.to(device=t.device, dtype=work).reshape(shape)
        x = t.to(work)
        half = torch.cat((-x[..., D // 2:], x[..., : D // 2]), dim=-1)
        return (x * cos + half * sin).to(t.dtype)


class MCDropout(nn.Dropout):
    """Dropout that stays active at evaluation when ``mc=True`` (Monte-Carlo dropout).

    With ``mc=False`` it is ``nn.Dropout``. The model flag ``mc_dropout`` turns every instance in a
    model into an MC one, which makes the model stochastic (T passes at evaluation).
    """

    def __init__(self, p: float = 0.0, mc: bool = False) -> None:
        super().__init__(p)
        self.mc = mc

    @property
    def active(self) -> bool:
        return self.p > 0 and (self.training or self.mc)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return nn.functional.dropout(x, self.p, training=self.active)


class AttentionUnit(nn.Module):
    """Base class of all multi-head attention units.

    :param dim: model width C.
    :param heads: number of heads H; ``D = C / H`` (``head_dim``).
    :param attn_dropout: dropout on the attention weights; only units that have weights take it
        (softmax, kernel, Gumbel): a GP unit refuses it as an unknown option.
    :param proj_dropout: dropout after the output projection W_O.

    Subclasses implement :meth:`attend` and set ``stochastic = True`` when they sample (every
    draw through :meth:`sample`). Units that have them implement :meth:`predictive` (the one
    predictive type, :class:`~gpattn_ppl.distributions.AttentionPredictive`) and
    :meth:`attention_matrix`. The model sets :attr:`site_prefix` to the unit's module path
    (``"blocks.1.attn"``), which names its Pyro sites and its errors.
    """

    stochastic: bool = False
    #: whether the unit applies :class:`RotaryPositions` to its queries and keys (every
    #: projection of queries, keys or latent inputs calls :meth:`rotate`); a host that rotates
    #: them (ModernBERT) takes only such units. A plug-in unit sets it once its projections do.
    rotary_capable: bool = False
    #: set by a host adapter whose layer rotates queries and keys: the unit then refuses to run
    #: without positions (outside the host's call) rather than attend position-blind
    requires_positions: bool = False
    _rotary: RotaryPositions | None = None

    def __init__(self, dim: int, heads: int, *, attn_dropout: float | None = None,
                 proj_dropout: float = 0.0) -> None:
        super().__init__()
        if dim <= 0 or heads <= 0 or dim % heads:
            raise ValueError(f"dim ({dim}) must be a positive multiple of heads ({heads})")
        self.dim, self.heads, self.head_dim = dim, heads, dim // heads
        if attn_dropout is not None:
            self.attn_dropout = MCDropout(attn_dropout)
        self.proj_dropout = MCDropout(proj_dropout)
        #: module path of the unit in its model (``"blocks.1.attn"``), set by the model; prefixes
        #: the unit's Pyro site names and its error messages
        self.site_prefix = ""
        #: weights of this unit's objective terms replacing ``train.objective``'s for it alone
        #: (config key -> number or schedule spec, e.g. ``{"cgp_alpha": 1e-5}``); set by the
        #: model from a ``model.swap`` / ``model.overrides`` entry's ``objective`` and read by
        #: the Pyro program (the ``SwappedTrainer`` weighs by its own ``term_weights``)
        self.objective_weights: dict = {}
        self._terms: dict[str, torch.Tensor] = {}

    # -- contract -----------------------------------------------------------------------------
    def forward(self, x: torch.Tensor, mask: torch.Tensor | None = None) -> torch.Tensor:
        """``[B, N, C] -> [B, N, C]``; see the module docstring for the mask rules."""
        mask = self._check(x, mask)
        self._terms = {}
        return self.attend(x, mask)

    def _check(self, x: torch.Tensor, mask: torch.Tensor | None) -> torch.Tensor | None:
        param = next(self.parameters(), None)
        return check_attention_inputs(x, mask, self.dim, self.site_prefix or type(self).__name__,
                                      None if param is None else param.dtype)

    def attend(self, x: torch.Tensor, mask: torch.Tensor | None) -> torch.Tensor:
        """The unit's computation ``[B, N, C] -> [B, N, C]``; subclasses implement it.

        :meth:`forward` has validated ``x`` and ``mask`` (bool ``[B, N]`` or ``None``) and reset
        the objective terms before calling it.
        """
        raise NotImplementedError

    def predictive(self, x: torch.Tensor, mask: torch.Tensor | None = None):
        """The predictive distribution of the head outputs ``[B, H, N, D]`` at ``x``, an
        :class:`~gpattn_ppl.distributions.AttentionPredictive`."""
        raise NotImplementedError(f"{type(self).__name__} has no predictive distribution")

    def attention_matrix(self, x: torch.Tensor, mask: torch.Tensor | None = None) -> torch.Tensor:
        """The ``[B, H, N, N]`` matrix the unit's (posterior-mean) output applies to the values,
        for analysis; padded key columns are 0."""
        raise NotImplementedError(f"{type(self).__name__} has no attention matrix")

    def objective_terms(self) -> dict[str, torch.Tensor]:
        """Named extra objective terms of the last call: ``[B]`` local or 0-d global, unscaled."""
        return dict(self._terms)

    @property
    def use_mean(self) -> bool:
        """Whether the unit should return its posterior mean (inside
        :class:`~gpattn_ppl.settings.posterior_mean`)."""
        return settings.posterior_mean.on()

    # -- rotary position embeddings -----------------------------------------------------------
    @contextmanager
    def positions(self, rotary: RotaryPositions | None) -> Iterator[AttentionUnit]:
        """Within the context, the unit rotates its queries and keys (and latent inputs) by
        ``rotary`` (``None``: not at all), as the host layer it stands in for does; the
        previous positions are restored on exit."""
        old, self._rotary = self._rotary, rotary
        try:
            yield self
        finally:
            self._rotary = old

    def rotate(self, *ts: torch.Tensor, token_dim: int = -2) -> tuple[torch.Tensor, ...]:
        """``ts`` rotated by the current :meth:`positions` (unchanged outside the context).

        :raises ValueError: the unit :attr:`requires_positions` and is called outside
            :meth:`positions` (e.g. on inputs captured from a ModernBERT layer).
        """
        rotary = self._rotary
        if rotary is None:
            if self.requires_positions:
                raise ValueError(f"{self.site_prefix or type(self).__name__}: this unit stands "
                                 "in for an attention that rotates its queries and keys by "
                                 "rotary position embeddings; call it through its host model, "
                                 "or inside unit.positions(RotaryPositions(cos, sin))")
            return ts
        where = self.site_prefix or type(self).__name__
        return tuple(rotary.apply(t, token_dim, where) for t in ts)

    # -- helpers for subclasses ---------------------------------------------------------------
    def split_heads(self, t: torch.Tensor) -> torch.Tensor:
        """``[B, N, C] -> [B, H, N, D]`` (head h owns columns h*D ... (h+1)*D - 1)."""
        B, N, _ = t.shape
        return t.view(B, N, self.heads, -1).transpose(1, 2)

    def merge_heads(self, t: torch.Tensor) -> torch.Tensor:
        """``[B, H, N, D] -> [B, N, C]`` (head-major concatenation)."""
        B, H, N, D = t.shape
        return t.transpose(1, 2).reshape(B, N, H * D)

    def add_term(self, name: str, value: torch.Tensor) -> None:
        """Accumulate a named objective term (``[B]`` local or 0-d global).

        Local and global parts of the same term are never summed together (a global term
        broadcast over the batch would be counted once per sequence, i.e. N_data times): when
        a term already holds the other kind, the global part is kept as ``<name>_global``. The
        program weights ``<name>_global`` with the schedule of ``<name>``.
        """
        if value.dim() > 1:
            raise ValueError(f"{self.site_prefix or type(self).__name__}: objective term "
                             f"{name!r} must be [B] or 0-d, got shape {tuple(value.shape)}")
        if name in self._terms and (self._terms[name].dim() == 0) != (value.dim() == 0):
            if value.dim() != 0:  # keep the local part under the plain name
                self._terms[name], value = value, self._terms[name]
            name = f"{name}_global"
        self._terms[name] = self._terms[name] + value if name in self._terms else value

    def sample(self, name: str, q, prior=None, *, local: bool, per_sequence: int | None = None,
               kl: Callable[[], torch.Tensor] | None = None,
               mean: Callable[[], torch.Tensor] | None = None) -> torch.Tensor:
        """Draw the latent ``<site_prefix>.<name>`` in the current mode; its KL becomes ``kl``.

        The one way a unit draws: :func:`gpattn_ppl.ppl.draw` decides between the posterior
        mean, a reparameterised draw with the KL reported here (thin), and Pyro sites scaled by
        the program's KL weight (sites). Local KLs are summed to ``[B]``, global ones to a
        scalar. Parameters as :func:`~gpattn_ppl.ppl.draw`.
        """
        value, kl_value = draw(f"{self.site_prefix}.{name}" if self.site_prefix else name, q,
                               prior, local=local, per_sequence=per_sequence, kl=kl, mean=mean)
        if kl_value is not None:
            if local:
                kl_value = kl_value.reshape(kl_value.shape[0], -1).sum(-1)
            elif kl_value.dim():
                kl_value = kl_value.sum()
            self.add_term("kl", kl_value)
        return value

    def needs_site(self, scored: bool) -> bool:
        """Whether the runtime needs a latent's value (see :func:`gpattn_ppl.ppl.needs_site`):
        a unit may compute its output by a fused path that never materialises it otherwise."""
        return needs_site(scored)
