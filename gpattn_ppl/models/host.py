"""What a network offers the Pyro program and the evaluation: its attention units, their
objective terms, whether it is stochastic, and Monte-Carlo dropout."""

from __future__ import annotations

import torch
from torch import nn

from ..attention.base import AttentionUnit, MCDropout

__all__ = ["AttentionHost"]


class AttentionHost(nn.Module):
    """Mixin of every classifier (:class:`~gpattn_ppl.models.TransformerClassifier`,
    :class:`~gpattn_ppl.models.HFClassifier`): the units are found by type wherever they sit."""

    mc_dropout: bool = False

    def attention_units(self) -> dict[str, AttentionUnit]:
        """Module path -> attention unit (``"blocks.1.attn"``)."""
        return {n: m for n, m in self.named_modules() if isinstance(m, AttentionUnit)}

    def set_mc_dropout(self, enabled: bool) -> None:
        """Turn Monte-Carlo dropout on or off for every dropout in the model."""
        self.mc_dropout = bool(enabled)
        for m in self.modules():
            if isinstance(m, MCDropout):
                m.mc = self.mc_dropout

    @property
    def stochastic(self) -> bool:
        """Whether two evaluation passes can differ (a stochastic unit, or MC dropout)."""
        mc = self.mc_dropout and any(m.p > 0 for m in self.modules() if isinstance(m, MCDropout))
        return mc or any(u.stochastic for u in self.attention_units().values())

    def objective_terms(self) -> dict[str, torch.Tensor]:
        """All units' terms of the last forward pass, keyed ``"<path>.<term>"``."""
        return {f"{path}.{name}": value for path, unit in self.attention_units().items()
                for name, value in unit.objective_terms().items()}
