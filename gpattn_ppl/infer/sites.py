"""How stochastic attention units meet the Pyro program.

A unit never calls ``pyro.sample`` directly: it calls :func:`sample_site` with its variational
distribution ``q`` and its prior ``p``. What happens depends on the active :class:`SiteContext`:

* no context, or ``mode="thin"`` (the fast path, the default of :class:`~gpattn_ppl.infer.PyroProgram`):
  the value is drawn by reparameterisation from ``q`` and ``KL(q || p)`` (analytic where
  ``torch.distributions.kl_divergence`` knows the pair, else the one-sample Monte-Carlo estimate
  ``log q(v) - log p(v)``) is returned for the unit to expose as its ``kl`` term;
* ``mode="sites"``, role ``"guide"``: ``pyro.sample(name, q)``; role ``"model"``:
  ``pyro.sample(name, p)`` (replayed against the guide's value). Local sites are placed inside the
  data plate of the program, global ones outside it. The ELBO then sees every site.
"""

from __future__ import annotations

import contextlib
import threading
from dataclasses import dataclass

import pyro
import torch
from torch.distributions import Distribution, kl_divergence

__all__ = ["SiteContext", "site_context", "current_site_context", "sample_site"]

_local = threading.local()


@dataclass
class SiteContext:
    """The Pyro role of the current forward pass.

    :ivar mode: ``"thin"`` (units reparameterise and report KLs) or ``"sites"`` (Pyro sites).
    :ivar role: ``"model"`` or ``"guide"``.
    :ivar plate: the data plate (``pyro.plate`` object) local sites are placed in.
    """

    mode: str = "thin"
    role: str = "model"
    plate: object | None = None


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


def _kl(q: Distribution, p: Distribution, value: torch.Tensor) -> torch.Tensor:
    try:
        return kl_divergence(q, p)
    except NotImplementedError:
        return q.log_prob(value) - p.log_prob(value)


def _to_event(d: Distribution, n: int) -> Distribution:
    """Reinterpret the rightmost ``n`` batch dims as event dims (Pyro's ``to_event`` for any
    torch distribution)."""
    return pyro.distributions.Independent(d, n) if n > 0 else d


def sample_site(name: str, q: Distribution, prior: Distribution | None, *, local: bool
                ) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Draw the value of site ``name`` and its KL contribution.

    :param name: full site name, the unit's module path plus the site (``"blocks.1.attn.u"``).
    :param q: variational distribution. For ``local`` sites its batch shape starts with ``B``.
    :param prior: prior of the site, or ``None`` when the prior equals ``q`` (the KL is 0).
    :param local: whether the site is per sequence (inside the data plate) or global.
    :returns: ``(value, kl)``; ``kl`` has ``q``'s batch shape (thin mode) or is ``None`` (sites
        mode: the ELBO computes it; or when ``prior`` is ``None``).
    """
    ctx = current_site_context()
    if ctx is None or ctx.mode == "thin":
        value = q.rsample() if q.has_rsample else q.sample()
        return value, (None if prior is None else _kl(q, prior, value))
    dist = q if (ctx.role == "guide" or prior is None) else prior
    if local:
        # local sites: batch shape [B, ...] -> fold everything but B into the event
        dist = _to_event(dist, len(dist.batch_shape) - 1)
        plate = ctx.plate if ctx.plate is not None else contextlib.nullcontext()
        with plate:
            value = pyro.sample(name, dist)
    else:
        dist = _to_event(dist, len(dist.batch_shape))
        value = pyro.sample(name, dist)
    return value, None
