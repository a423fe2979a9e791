r"""A wall-clock budget for a run (``train.max_minutes``): how many epochs fit, and the compression
of the epoch-denominated schedules that makes them end with the last epoch that fits.

The first epoch runs on the configured schedule. Its measured time (training, validation and
checkpointing), and an estimate of the final evaluation from the validation pass, give the number
of epochs ``E'`` that fit in what is left of the budget:

.. math::

    E' = \min\Big(E,\; \max\Big(1,\; 1 + \Big\lfloor
         \frac{60\,m - t_{\text{so far}} - t_{\text{eval}}}{t_{\text{epoch}}} \Big\rfloor\Big)\Big),
    \qquad
    t_{\text{eval}} = t_{\text{val}}\,\frac{n_{\text{val}} + n_{\text{test}} + n_{\text{ood}}}
    {n_{\text{val}}}\,\frac{T_{\text{eval}}}{T_{\text{val}}}.

with a margin ``\mu`` = :data:`MARGIN` for epochs slower than the first (a shared machine; measured:
a CPU run whose later epochs took 16 % longer than its first overran a 60 s budget by 8 % without
it). With ``r = E / E'`` the run then trains ``E'`` epochs and every schedule written in epochs is
compressed by ``r``: the learning-rate warm-up lasts ``warmup_epochs / r`` epochs and its decay
ends at epoch ``E'``, and the objective weights' schedules (KL warm-up, annealing) read the
clock ``r x epoch``, so each ends where it would have ended at epoch ``E``. Epoch 1 counts as
``r`` epochs of the compressed clock (it ran before the budget was known). A run the budget
leaves uncut (``E' = E``) is exactly the run without a budget.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass

__all__ = ["MARGIN", "BudgetPlan", "plan_budget"]

#: the share by which later epochs are assumed slower than the first
MARGIN = 0.15


@dataclass(frozen=True)
class BudgetPlan:
    """The outcome of :func:`plan_budget`, saved in ``last.pt`` (a resumed run keeps it) and in
    ``results.json`` under ``"budget"``.

    :ivar max_minutes: the budget.
    :ivar epochs_configured: ``E`` (``train.epochs``).
    :ivar epochs: ``E'``, the epochs the run trains.
    :ivar compression: ``r = E / E'`` (1: the schedules are as configured).
    :ivar epoch_seconds: the first epoch's measured time (train + validation + checkpoint).
    :ivar eval_seconds_estimate: ``t_eval``, the estimated final evaluation.
    :ivar seconds_before_first_epoch: setup (data, model) up to the first step.
    """

    max_minutes: float
    epochs_configured: int
    epochs: int
    compression: float
    epoch_seconds: float
    eval_seconds_estimate: float
    seconds_before_first_epoch: float

    def as_dict(self) -> dict:
        return asdict(self)


def plan_budget(max_minutes: float, epochs: int, *, elapsed_s: float, epoch_s: float,
                setup_s: float, eval_estimate_s: float) -> BudgetPlan:
    """The number of epochs that fit in ``max_minutes`` (module docstring).

    :param elapsed_s: seconds since the run started, after its first epoch.
    :param epoch_s: the first epoch's seconds.
    :param setup_s: seconds before the first epoch began (reported only).
    :param eval_estimate_s: the estimated seconds of the final evaluation.
    :raises ValueError: a non-positive budget, epoch count or epoch time.
    """
    if not max_minutes > 0 or epochs < 1 or not epoch_s > 0:
        raise ValueError(f"plan_budget: need max_minutes > 0, epochs >= 1, epoch_s > 0 (got "
                         f"{max_minutes}, {epochs}, {epoch_s})")
    left = 60.0 * max_minutes - elapsed_s - eval_estimate_s
    fit = 1 + math.floor(left / ((1 + MARGIN) * epoch_s)) if left > 0 else 1
    n = max(1, min(epochs, fit))
    return BudgetPlan(max_minutes=float(max_minutes), epochs_configured=int(epochs), epochs=n,
                      compression=epochs / n, epoch_seconds=round(epoch_s, 3),
                      eval_seconds_estimate=round(eval_estimate_s, 3),
                      seconds_before_first_epoch=round(setup_s, 3))
