"""The Pyro runtime the attention units draw through, below the units and above the numerics.

* :mod:`~gpattn_ppl.ppl.sites` -- :func:`draw`, the one way a unit draws a latent, in the
  posterior-mean, thin and sites modes (:class:`~gpattn_ppl.settings.posterior_mean` switches
  the first), with the KL weight applied the same way in thin and sites mode;
* :mod:`~gpattn_ppl.ppl.schedules` -- schedules of weights and temperatures on the program's one
  clock;
* :mod:`~gpattn_ppl.ppl.objective` -- the registry of named objective terms and their weights.
"""

from .objective import (
    CGP_ALPHA_RAMP,
    KL_WARMUP,
    OBJECTIVE_WEIGHTS,
    objective_schedules,
    register_objective_term,
    validate_objective,
)
from .schedules import (
    Schedule,
    ScheduledAttributes,
    apply_schedules,
    build_schedule,
    positive_float,
)
from .sites import (
    MODES,
    SiteContext,
    current_mode,
    current_site_context,
    draw,
    needs_site,
    site_context,
)

__all__ = ["CGP_ALPHA_RAMP", "KL_WARMUP", "MODES", "OBJECTIVE_WEIGHTS", "Schedule",
           "ScheduledAttributes", "SiteContext", "apply_schedules", "build_schedule", "current_mode", "current_site_context", "draw",
           "needs_site", "objective_schedules", "positive_float", "register_objective_term",
           "site_context", "validate_objective"]
