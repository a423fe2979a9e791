r"""The GP-head type: the protocol every GP attention unit computes a call by.

A GP head owns the algebra of one call of a GP attention unit; the unit
(:class:`~gpattn_ppl.attention.gp_unit.GPAttentionUnit`) owns the projections, the output map
and the mode, and runs the steps below once for every unit (``docs/architecture.rst``,
"The protocol of a GP head"):

1. :meth:`GPHead.prepare` -- the typed prepared state of the call: kernel matrices, factors,
   masks (block trick), in :class:`~gpattn_ppl.settings.gp_dtype`, shared by every later step;
2. :meth:`GPHead.state_terms` -- the objective terms of the state alone, reported before any
   draw;
3. :meth:`GPHead.draw` -- the latents, drawn through the unit's
   :meth:`~gpattn_ppl.attention.AttentionUnit.sample` (so the mode -- posterior mean, thin,
   Pyro sites -- and the KL are the runtime's), and the function values given them;
4. :meth:`GPHead.training_terms` -- the objective terms that need the draw (the CGP bounds),
   reported in training mode only;
5. :meth:`GPHead.mean`, :meth:`GPHead.predictive` (the one
   :class:`~gpattn_ppl.distributions.AttentionPredictive`, of the head outputs) and
   :meth:`GPHead.attention_matrix`, for analysis.

"Terms" are objective terms only (named ``[B]`` local or 0-d global tensors, unscaled); the
prepared matrices are the *state*. The two term hooks exist so that every unit reports its
terms -- and hence its Pyro factor sites -- in one fixed order.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import gpytorch
import torch

from ..distributions import AttentionPredictive

__all__ = ["GPHead", "Sample"]

#: the unit's draw, :meth:`gpattn_ppl.attention.AttentionUnit.sample`
Sample = Callable[..., torch.Tensor]


class GPHead(gpytorch.Module):
    """Base of the GP heads (a gpytorch module holding the kernel and the GP parameters).

    Subclasses implement :meth:`prepare`, :meth:`draw`, :meth:`mean` and :meth:`predictive`;
    :meth:`state_terms`, :meth:`training_terms` and :meth:`attention_matrix` are optional.
    :attr:`term_names` lists the objective terms a call may report, in the order it reports
    them.
    """

    #: names of the objective terms a call may report, in order
    term_names: tuple[str, ...] = ()

    def prepare(self, *inputs: Any, mask: torch.Tensor | None = None, where: str = "") -> Any:
        """The prepared state of one call from the unit's projections ``[B, H, N, D]`` (or
        features) and the mask ``[B, N]``; ``where`` names the unit in numerics messages."""
        raise NotImplementedError

    def state_terms(self, state: Any) -> dict[str, torch.Tensor]:
        """Objective terms of the prepared state, reported before the draws (default none)."""
        return {}

    def draw(self, state: Any, sample: Sample) -> Any:
        """Draw the latents through ``sample`` and return the function values given them, in
        the GP dtype (the posterior mean in the posterior-mean mode)."""
        raise NotImplementedError

    def training_terms(self, state: Any) -> dict[str, torch.Tensor]:
        """Objective terms that need the draw of this call (training mode only; default none)."""
        return {}

    def mean(self, state: Any) -> torch.Tensor:
        """The posterior mean of the function values, without drawing."""
        raise NotImplementedError

    def predictive(self, state: Any) -> AttentionPredictive:
        """The predictive distribution of the head outputs ``[B, H, N, D]`` (no sampling)."""
        raise NotImplementedError

    def attention_matrix(self, state: Any) -> torch.Tensor:
        """The ``[B, H, N, N]`` matrix the posterior mean applies to the values."""
        raise NotImplementedError(f"{type(self).__name__} has no attention matrix")
