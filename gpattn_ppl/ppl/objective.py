"""Named objective terms and their weights.

Units expose terms by name (``kl``, ``ksvd_loss``, ``cgp_loss``); the config's ``train.objective``
section gives each a weight schedule under the key of :data:`OBJECTIVE_WEIGHTS`. The per-datum loss
the trainer minimises is

.. math::
    \\mathcal L = \\frac1B\\sum_{i\\in\\text{batch}}\\big[\\mathrm{CE}_i + \\sum_t w_t\\,\\ell_{t,i}\\big]
    + \\sum_t w_t\\,\\frac{\\ell_{t}^{\\text{glob}}}{N_\\text{data}}

with the per-sequence terms placed inside the data plate and the global ones outside it.
"""

from __future__ import annotations

from .schedules import Schedule, build_schedule

__all__ = ["OBJECTIVE_WEIGHTS", "register_objective_term", "validate_objective",
           "objective_schedules"]

#: term name -> (config key of its weight, default weight)
OBJECTIVE_WEIGHTS: dict[str, tuple[str, float]] = {
    "kl": ("kl_weight", 1.0),
    "ksvd_loss": ("ksvd_weight", 1.0),
    "cgp_loss": ("cgp_alpha", 1.0),
}


def register_objective_term(term: str, key: str, default: float = 1.0) -> None:
    """Declare a new named term (e.g. a unit's regulariser) and the config key of its weight."""
    OBJECTIVE_WEIGHTS[term] = (key, default)


def validate_objective(spec: dict) -> None:
    """Raise ``ValueError`` for unknown weight keys or malformed schedules."""
    keys = {k for k, _ in OBJECTIVE_WEIGHTS.values()}
    for key, value in spec.items():
        if key not in keys:
            raise ValueError(f"unknown key {key!r}; allowed: {', '.join(sorted(keys))}")
        build_schedule(value, where=key)


def objective_schedules(spec: dict) -> dict[str, Schedule]:
    """Term name -> weight schedule (defaults filled in)."""
    validate_objective(spec)
    out = {}
    for term, (key, default) in OBJECTIVE_WEIGHTS.items():
        out[term] = build_schedule(spec.get(key, default), where=key)
    return out
