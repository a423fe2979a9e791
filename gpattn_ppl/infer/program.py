"""The model and guide of the Pyro program, assembled from the network's units."""

from __future__ import annotations

import contextlib

import pyro
import pyro.distributions as dist
import pyro.poutine as poutine
import torch
import torch.nn.functional as F
from pyro.infer import TraceMeanField_ELBO
from torch import nn

from ..ppl import (
    OBJECTIVE_WEIGHTS,
    Schedule,
    SiteContext,
    apply_schedules,
    build_schedule,
    objective_schedules,
    site_context,
    validate_objective,
)

__all__ = ["PyroProgram", "unit_schedules"]


def unit_schedules(net: nn.Module) -> dict[str, dict[str, Schedule]]:
    """Module path -> {term: weight schedule} of the modules of ``net`` (its attention units)
    that carry their own ``objective_weights`` (config keys, as ``train.objective``'s:
    ``{"cgp_alpha": 1e-5}``).

    :raises ValueError: an unknown key or a malformed weight, naming the unit.
    """
    term_of = {key: term for term, (key, _) in OBJECTIVE_WEIGHTS.items()}
    out = {}
    for path, unit in net.named_modules():
        own = getattr(unit, "objective_weights", None) or {}
        if not own:
            continue
        try:
            validate_objective(dict(own))
        except ValueError as err:
            raise ValueError(f"{path}: objective_weights: {err}") from None
        out[path] = {term_of[key]: build_schedule(value, where=f"{path}.{key}")
                     for key, value in own.items()}
    return out


class PyroProgram:
    r"""Pyro ``model`` / ``guide`` for a classifier whose attention units may be stochastic.

    * **model**: runs the network (units draw their sites, see :mod:`~gpattn_ppl.ppl.sites`),
      places every named objective term as ``pyro.factor(name, -value)`` under
      ``poutine.scale(w)`` with its scheduled weight :math:`w` (skipped when :math:`w = 0`) -- per
      sequence terms inside ``pyro.plate("data", num_data, subsample=index)``, global ones
      outside -- and observes ``y ~ Categorical(logits)`` in the plate. ``logits`` is recorded as
      a deterministic site for :class:`pyro.infer.Predictive`. In sites mode the units' latent
      sites are scaled by the same ``kl`` weight, so both modes train the same objective.
    * **guide**: empty in ``mode="thin"`` (units reparameterise internally and report their KL);
      in ``mode="sites"`` it runs the network in the guide role so every variational site is a
      Pyro sample site and the ELBO computes the KLs.

    The ELBO is :class:`pyro.infer.TraceMeanField_ELBO`; :meth:`loss` returns the per-datum loss
    :math:`-\mathrm{ELBO}/N_\text{data}`.

    :param net: a :class:`~gpattn_ppl.models.TransformerClassifier`.
    :param num_data: training-set size N_data (the plate size).
    :param objective: the ``train.objective`` config section (weights of named terms).
    :param mode: ``"thin"`` (default, fast) or ``"sites"``.
    :param use_param_store: register the network with ``pyro.module`` (needed for plain
        :class:`pyro.infer.SVI` with a Pyro optimiser; the trainer's torch optimiser does not need it).
    :param total_epochs: the length of the run, for schedules whose span defaults to it.

    **The clock.** :meth:`set_epoch` is the one clock of a run: it sets the fractional epoch at
    which the objective weights are evaluated and applies every scheduled attribute of the
    network (:func:`~gpattn_ppl.ppl.apply_schedules`, e.g. Gumbel temperatures).
    """

    def __init__(self, net: nn.Module, num_data: int, objective: dict | None = None,
                 mode: str = "thin", use_param_store: bool = False,
                 total_epochs: float | None = None) -> None:
        if mode not in ("thin", "sites"):
            raise ValueError(f"mode must be 'thin' or 'sites', got {mode!r}")
        if num_data < 1:
            raise ValueError(f"num_data must be >= 1, got {num_data}")
        missing = [a for a in ("objective_terms", "stochastic")
                   if not hasattr(net, a)]
        if missing:
            raise TypeError(
                f"PyroProgram: {type(net).__name__} lacks {', '.join(missing)}: a network "
                "trained as a Pyro program must mix in gpattn_ppl.models.AttentionHost "
                f"(class {type(net).__name__}(AttentionHost): ...; docs/architecture.rst, "
                "'Your own network'), which finds its attention units wherever they sit")
        self.net, self.num_data, self.mode = net, int(num_data), mode
        #: what the forward pass calls: the network, or its DistributedDataParallel wrapper
        self.forward_module: nn.Module = net
        self.schedules: dict[str, Schedule] = objective_schedules(objective or {})
        #: unit path -> {term: schedule} for the units with their own ``objective_weights``
        #: (replacing :attr:`schedules` for those terms of that unit)
        self.unit_schedules: dict[str, dict[str, Schedule]] = unit_schedules(net)
        self._unit_terms_checked = not self.unit_schedules
        self.use_param_store = use_param_store
        self.epoch, self.total_epochs = 0.0, total_epochs
        self.elbo = TraceMeanField_ELBO()
        #: the last model run's objective terms (detached, averaged over the batch), the
        #: factor turning each into its per-datum share of the loss (its weight, divided by
        #: N_data for a global term) and the mean cross-entropy of the labels (the term ``y``)
        self.last_terms: dict[str, torch.Tensor] = {}
        self.last_scales: dict[str, float] = {}
        self.last_nll: torch.Tensor | None = None

    # -- the clock ------------------------------------------------------------------------------
    def set_epoch(self, t: float) -> dict[str, float]:
        """Move the clock to fractional epoch ``t``: objective weights and every scheduled
        attribute of the network follow it. Returns the scheduled attributes set (for logs)."""
        self.epoch = float(t)
        return apply_schedules(self.net, self.epoch, self.total_epochs)

    # -- weights --------------------------------------------------------------------------------
    def weight(self, site: str) -> float:
        """Current weight of objective term ``site`` (``"blocks.1.attn.kl"`` -> the schedule of
        ``kl``: the unit ``blocks.1.attn``'s own where it has one, else ``train.objective``'s)."""
        path, _, term = site.rpartition(".")
        term = term.removesuffix("_global")
        own = self.unit_schedules.get(path, {})
        if term in own:
            return own[term](self.epoch, self.total_epochs)
        if term not in self.schedules:
            raise KeyError(f"objective term {site!r} has no registered weight; register it with "
                           "gpattn_ppl.ppl.register_objective_term")
        return self.schedules[term](self.epoch, self.total_epochs)

    def _check_unit_terms(self, names) -> None:
        """On the first training pass: every unit weight given names a term its unit produces
        (a weight for a term the unit does not have would be ignored silently). In sites mode
        a KL is the ELBO's, from the latent sites, not a reported term: ``kl`` is not checked."""
        produced: dict[str, set[str]] = {}
        for name in names:
            path, _, term = name.rpartition(".")
            produced.setdefault(path, set()).add(term.removesuffix("_global"))
        unseen = {"kl"} if self.mode == "sites" else set()
        for path, own in self.unit_schedules.items():
            missing = sorted(set(own) - produced.get(path, set()) - unseen)
            if missing:
                keys = ", ".join(OBJECTIVE_WEIGHTS[t][0] for t in missing)
                has = ", ".join(sorted(produced.get(path, ()))) or "none"
                raise ValueError(f"{path}: objective weight(s) {keys} given for this unit, whose "
                                 f"objective terms are: {has} (remove them from its entry's "
                                 "objective)")
        self._unit_terms_checked = True

    def _plate(self, batch_size: int, index: torch.Tensor | None):
        if index is None:
            return pyro.plate("data", batch_size)
        return pyro.plate("data", self.num_data, subsample=index)

    # -- Pyro program -------------------------------------------------------------------------
    def model(self, x, mask=None, y=None, index=None):
        """The generative program; returns logits ``[B, K]``."""
        if self.use_param_store:
            pyro.module("net", self.net)
        plate = self._plate(x.shape[0], index)
        with site_context(SiteContext(self.mode, "model", plate, self.weight)):
            logits = self.forward_module(x, mask)
        if logits.dtype in (torch.bfloat16, torch.float16):  # the likelihood in float32
            logits = logits.float()
        self.last_terms, self.last_scales = {}, {}
        terms = self.net.objective_terms()
        if not self._unit_terms_checked and self.net.training:
            self._check_unit_terms(terms)
        for name, value in terms.items():
            self.last_terms[name] = value.detach().mean()
            w = self.weight(name)
            self.last_scales[name] = w if value.dim() else w / self.num_data
            if w == 0:
                continue
            scale = poutine.scale(scale=w) if w != 1 else contextlib.nullcontext()
            with scale, (plate if value.dim() else contextlib.nullcontext()):
                pyro.factor(name, -value)
        with plate:
            pyro.deterministic("logits", logits, event_dim=1)
            pyro.sample("y", dist.Categorical(logits=logits), obs=y)
        if y is not None:
            lg = logits.detach()
            self.last_nll = F.cross_entropy(lg.reshape(-1, lg.shape[-1]),
                                            y.expand(lg.shape[:-1]).reshape(-1))
        return logits

    def guide(self, x, mask=None, y=None, index=None):
        """Variational program: empty in thin mode; runs the units' guide sites otherwise."""
        if self.use_param_store:
            pyro.module("net", self.net)
        if self.mode == "thin" or not self.net.stochastic:
            return None
        plate = self._plate(x.shape[0], index)
        with site_context(SiteContext(self.mode, "guide", plate, self.weight)):
            self.forward_module(x, mask)
        return None

    # -- objective ------------------------------------------------------------------------------
    def loss(self, x, mask, y, index) -> torch.Tensor:
        """Differentiable per-datum loss :math:`-\\mathrm{ELBO}/N_\\text{data}` on a minibatch."""
        return self.elbo.differentiable_loss(self.model, self.guide, x, mask, y, index) / self.num_data
