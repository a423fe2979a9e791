"""The one GP attention unit: project -> precision -> prepare -> draw -> merge -> output map.

:class:`GPAttentionUnit` runs the GP-head protocol (:class:`~gpattn_ppl.gp.GPHead`) for every
GP unit (SGPA, KEP-SVGP, CGPT, SCGPT): :meth:`~GPAttentionUnit.attend`,
:meth:`~GPAttentionUnit.predictive` and :meth:`~GPAttentionUnit.attention_matrix` are written
here once. A unit supplies its head (:attr:`~GPAttentionUnit.head`), its projections
(:meth:`~GPAttentionUnit.project`) and, if it is not "concatenate heads, then W_O", its output
map (:meth:`~GPAttentionUnit.output`).
"""

from __future__ import annotations

from typing import Any

import torch

from ..distributions import AttentionPredictive
from ..gp.head import GPHead
from ..linalg import gp_precision
from .base import AttentionUnit

__all__ = ["GPAttentionUnit"]


class GPAttentionUnit(AttentionUnit):
    """Base of the GP attention units: a :class:`~gpattn_ppl.gp.GPHead` plus projections and
    an output map.

    One call (:meth:`attend`): the projections (:meth:`project`, under autocast where it is
    on), then in :class:`~gpattn_ppl.settings.gp_dtype` with autocast off the head's prepared
    state, its state terms and its draws (through :meth:`~AttentionUnit.sample`), then the
    output map (:meth:`output`, under autocast again), then -- training only -- the head's
    training terms, cast to the input dtype. :meth:`predictive` is the head's predictive with
    padded tokens exactly 0 (mean, variance and joint); :meth:`attention_matrix` the head's.
    """

    stochastic = True

    @property
    def head(self) -> GPHead:
        """The unit's GP head (a registered submodule; subclasses name it)."""
        raise NotImplementedError

    def project(self, x: torch.Tensor, mask: torch.Tensor | None) -> tuple:
        """The head's inputs from ``x [B, N, C]`` (a tuple passed to :meth:`GPHead.prepare`)."""
        raise NotImplementedError

    def output(self, f: Any, x: torch.Tensor) -> torch.Tensor:
        """``[B, N, C]`` from the head outputs ``[B, H, N, D]``: heads concatenated, cast to the
        input dtype, :math:`W_O` (``out``) and dropout."""
        return self.proj_dropout(self.out(self.merge_heads(f.to(x.dtype))))

    def _where(self) -> str:
        """The module path named in numerics messages (the class name outside a model)."""
        return self.site_prefix or type(self).__name__

    def before_attend(self, inputs: tuple, mask: torch.Tensor | None) -> None:
        """A hook run by :meth:`attend` only, in the GP precision, between the projections and
        the head's state (default none; SCGPT places its inducing inputs here)."""

    def prepare(self, x: torch.Tensor, mask: torch.Tensor | None, *, attend: bool = False):
        """Project ``x`` and prepare the head's state (GP dtype, autocast off); ``attend``: run
        :meth:`before_attend` first."""
        inputs = self.project(x, mask)
        with gp_precision(x.device.type):
            if attend:
                self.before_attend(inputs, mask)
            return self.head.prepare(*inputs, mask=mask, where=self._where())

    # -- contract -------------------------------------------------------------------------------
    def attend(self, x: torch.Tensor, mask: torch.Tensor | None) -> torch.Tensor:
        """One call of the GP-head protocol: prepare, state terms, draw (GP dtype, autocast
        off), output map, then -- training only -- the training terms (input dtype)."""
        head = self.head
        state = self.prepare(x, mask, attend=True)
        with gp_precision(x.device.type):
            for name, value in head.state_terms(state).items():
                self.add_term(name, value)
            f = head.draw(state, self.sample)
        out = self.output(f, x)
        if self.training:
            with gp_precision(x.device.type):
                terms = head.training_terms(state)
            for name, value in terms.items():
                self.add_term(name, value.to(x.dtype))
        return out

    def predictive(self, x: torch.Tensor, mask: torch.Tensor | None = None) -> AttentionPredictive:
        """The posterior of the head outputs ``[B, H, N, D]`` at ``x`` (no sampling); padded
        tokens have mean and variance exactly 0."""
        mask = self._check(x, mask)
        state = self.prepare(x, mask)
        with gp_precision(x.device.type):
            return self.head.predictive(state).masked(mask)

    def attention_matrix(self, x: torch.Tensor, mask: torch.Tensor | None = None) -> torch.Tensor:
        """The head's attention matrix ``[B, H, N, N]`` (GP dtype; padded columns 0)."""
        mask = self._check(x, mask)
        state = self.prepare(x, mask)
        with gp_precision(x.device.type):
            return self.head.attention_matrix(state)
