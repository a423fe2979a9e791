r"""How stochastic units draw their latents: one function, three modes.

A unit never calls ``pyro.sample`` itself: it calls :func:`draw` (through
:meth:`gpattn_ppl.attention.AttentionUnit.sample`) with its variational distribution ``q`` and
its prior. What happens depends on the mode of the pass (:func:`current_mode`):

* ``"mean"`` (inside :class:`gpattn_ppl.settings.posterior_mean`): the value is the mean of ``q``
  (or the unit's ``mean`` override, e.g. the modal value of a Concrete); no site is drawn; the
  KL is returned where it has a closed form.
* ``"thin"`` (no Pyro program, or the program's default fast path): the value is drawn by
  reparameterisation from ``q``; :math:`\mathrm{KL}(q\,\|\,p)` (analytic where
  ``torch.distributions.kl_divergence`` knows the pair, else the one-sample estimate
  :math:`\log q(v) - \log p(v)`) is returned for the unit to expose as its ``kl`` term, which the
  program places as a factor under ``poutine.scale(w)``.
* ``"sites"``: ``pyro.sample(name, q)`` in the guide, ``pyro.sample(name, p)`` in the model, local
  sites inside the data plate, global ones outside it, both under ``poutine.scale(w)``: the ELBO
  computes the KL and weights it by the same :math:`w` as the thin mode.

:math:`w` is the current weight of the ``kl`` term on the program's clock (its
``train.objective.kl_weight`` schedule), read from the :class:`SiteContext`; a weight of 0 masks
the site instead (``poutine.scale`` needs a positive scale). A *per-sequence* global site
(``per_sequence=B``) is drawn independently for each of the ``B`` sequences -- an unbiased,
lower-variance estimate of the same ELBO -- with its KL counted once: in thin mode the KL of the
unexpanded ``q``, in sites mode the expanded site under a further ``poutine.scale(1/B)``. In both
modes the value is ``q.expand([B, ...]).rsample()``, so the two modes draw the same numbers.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Callable
from dataclasses import dataclass

import pyro
import pyro.poutine as poutine
import torch
from torch.distributions import Distribution, kl_divergence

from .. import settings

__all__ = ["SiteContext", "site_context", "current_site_context", "current_mode", "draw",
           "needs_site", "MODES"]

#: the modes of a pass: posterior mean, reparameterised draws with unit-side KL, Pyro sites
MODES = ("mean", "thin", "sites")

_local = threading.local()


@dataclass
class SiteContext:
    """The Pyro role of the current forward pass.

    :ivar mode: ``"thin"`` (units reparameterise and report KLs) or ``"sites"`` (Pyro sites).
    :ivar role: ``"model"`` or ``"guide"``.
    :ivar plate: the data plate (``pyro.plate`` object) local sites are placed in.
    :ivar weight: term name -> its current weight (the program's clock); ``None``: weight 1.
    """

    mode: str = "thin"
    role: str = "model"
    plate: object | None = None
    weight: Callable[[str], float] | None = None


@contextlib.contextmanager
def site_context(ctx: SiteContext):
    """Activate ``ctx`` for the forward passes run inside the ``with`` block."""
    old = getattr(_local, "ctx", None)
    _local.ctx = ctx
    try:
        yield ctx
    finally:
        _local.ctx = old


def current_site_context() -> SiteContext | None:
    """The active :class:`SiteContext` (``None`` outside any Pyro program)."""
    return getattr(_local, "ctx", None)


def current_mode() -> str:
    """``"mean"`` inside :class:`~gpattn_ppl.settings.posterior_mean`, else the site context's
    mode (``"thin"`` outside any program)."""
    if settings.posterior_mean.on():
        return "mean"
    ctx = current_site_context()
    return "thin" if ctx is None else ctx.mode


def needs_site(scored: bool) -> bool:
    """Whether the runtime needs a latent's value as a site: in sites mode always, in thin mode
    when its KL is ``scored`` (a prior other than ``q``), never in mean mode. A unit that can
    compute its output without materialising the latent (a fused kernel) may do so otherwise."""
    mode = current_mode()
    return mode == "sites" or (mode == "thin" and scored)


def _resolve(d):
    return d() if callable(d) and not isinstance(d, Distribution) else d


def _kl(q: Distribution, p: Distribution, value: torch.Tensor | None) -> torch.Tensor | None:
    try:
        return kl_divergence(q, p)
    except NotImplementedError:
        if value is None:
            return None
        return q.log_prob(value) - p.log_prob(value)


def _to_event(d: Distribution, n: int) -> Distribution:
    """Reinterpret the rightmost ``n`` batch dims as event dims (Pyro's ``to_event``)."""
    return pyro.distributions.Independent(d, n) if n > 0 else d


def _weight(term: str) -> float:
    ctx = current_site_context()
    return 1.0 if ctx is None or ctx.weight is None else float(ctx.weight(term))


def _weighted(scale: float):
    """``poutine.scale(scale)``, or a mask for a zero weight (Pyro scales must be positive)."""
    if scale == 0:
        return poutine.mask(mask=False)
    return poutine.scale(scale=scale) if scale != 1 else contextlib.nullcontext()


def draw(name: str, q, prior=None, *, local: bool, per_sequence: int | None = None,
         kl: Callable[[], torch.Tensor] | None = None,
         mean: Callable[[], torch.Tensor] | None = None
         ) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Draw latent ``name`` in the current mode (see the module docstring).

    :param name: full site name, the unit's module path plus the site (``"blocks.1.attn.u"``).
    :param q: variational distribution, or a zero-argument callable building it (so a mean-mode
        pass that has a ``mean`` override never builds it). Local sites: batch shape ``[B, ...]``.
    :param prior: prior of the site (same kind), or ``None`` when the prior is ``q`` (KL 0).
    :param local: per sequence (inside the data plate) or global.
    :param per_sequence: for a global site, draw it independently for this many sequences.
    :param kl: closed-form ``KL(q || prior)`` (thin and mean modes), if cheaper than torch's.
    :param mean: the mean-mode value, if not ``q.mean``.
    :returns: ``(value, kl)``; ``kl`` has ``q``'s batch shape, or is ``None`` (sites mode: the
        ELBO computes it; no prior; or no closed form in mean mode).
    """
    mode = current_mode()
    if mode == "mean":
        value = mean() if mean is not None else _resolve(q).mean
        if kl is not None:
            return value, kl()
        if prior is None:
            return value, None
        return value, _kl(_resolve(q), _resolve(prior), None)
    q = _resolve(q)
    dist = q.expand(torch.Size([per_sequence]) + q.batch_shape) if per_sequence else q
    if mode == "thin":
        value = dist.rsample() if dist.has_rsample else dist.sample()
        if kl is not None:
            return value, kl()
        if prior is None:
            return value, None
        if per_sequence:
            prior = _resolve(prior)
            try:
                return value, kl_divergence(q, prior)
            except NotImplementedError:
                return value, (q.log_prob(value) - prior.log_prob(value)).mean(0)
        return value, _kl(q, _resolve(prior), value)
    ctx = current_site_context()
    if ctx.role == "model" and prior is not None:
        prior = _resolve(prior)
        dist = prior.expand(torch.Size([per_sequence]) + prior.batch_shape) if per_sequence else prior
    # the KL weight of this site's unit (its own, or train.objective's): "<unit path>.kl"
    scale = _weight(f"{name.rpartition('.')[0]}.kl".lstrip(".")) / (per_sequence or 1)
    with _weighted(scale):
        if local:
            dist = _to_event(dist, len(dist.batch_shape) - 1)
            with ctx.plate if ctx.plate is not None else contextlib.nullcontext():
                value = pyro.sample(name, dist)
        else:
            value = pyro.sample(name, _to_event(dist, len(dist.batch_shape)))
    return value, None
