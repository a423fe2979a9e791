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

import math

from .schedules import Schedule, build_schedule

__all__ = ["CGP_ALPHA_RAMP", "KL_WARMUP", "OBJECTIVE_WEIGHTS", "register_objective_term", "validate_objective",
           "objective_schedules"]

#: the library's default KL schedule: a warm-up, linear 0 -> 1 over the first half of the run
#: (Bowman et al. 2016; Sønderby et al. 2016). Not the papers' CoLA recipe (a constant 1), with
#: which SGPA's local KL pulls q(u) onto the prior; ``{kl_weight: 1.0}`` restores it.
KL_WARMUP: dict = {"kind": "linear", "start": 0.0, "end": 1.0, "fraction": 0.5}

#: the library's default CGP-regulariser schedule: α linear 0 -> 1 over the whole run (CGPT §5.1;
#: the reference code's CoLA weight is a constant 1). See ``docs/derivations/cgpt.rst``.
CGP_ALPHA_RAMP: dict = {"kind": "linear", "start": 0.0, "end": 1.0}

#: term name -> (config key of its weight, default weight schedule)
OBJECTIVE_WEIGHTS: dict[str, tuple[str, float | dict]] = {
    "kl": ("kl_weight", KL_WARMUP),
    "ksvd_loss": ("ksvd_weight", 1.0),
    "cgp_loss": ("cgp_alpha", CGP_ALPHA_RAMP),
}


def register_objective_term(term: str, key: str, default: float | dict = 1.0) -> None:
    """Declare a new named term (e.g. a unit's regulariser), the config key of its weight and
    the weight's default schedule (a number or a :func:`~gpattn_ppl.ppl.build_schedule` spec)."""
    build_schedule(default, where=key)
    OBJECTIVE_WEIGHTS[term] = (key, default)


def validate_objective(spec: dict) -> None:
    """Raise ``ValueError`` for unknown weight keys, malformed schedules, or a weight that is
    negative or not finite somewhere (a schedule is checked at its ends, between which it is
    monotone; a negative weight would reward the term it should penalise)."""
    keys = {k for k, _ in OBJECTIVE_WEIGHTS.values()}
    for key, value in spec.items():
        if key not in keys:
            raise ValueError(f"unknown key {key!r}; allowed: {', '.join(sorted(keys))}")
        sched = build_schedule(value, where=key)
        for end in (sched.start, sched.end):
            if not math.isfinite(end) or end < 0:
                raise ValueError(f"{key}: a weight must be finite and >= 0, got {end} "
                                 f"(from {value!r})")


def objective_schedules(spec: dict) -> dict[str, Schedule]:
    """Term name -> weight schedule (defaults filled in)."""
    validate_objective(spec)
    out = {}
    for term, (key, default) in OBJECTIVE_WEIGHTS.items():
        out[term] = build_schedule(spec.get(key, default), where=key)
    return out
