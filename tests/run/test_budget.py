"""train.max_minutes: the number of epochs that fit, and the schedules compressed to end with them."""

import json
import math

import pytest
import torch

from gpattn_ppl.run.budget import MARGIN, BudgetPlan, plan_budget
from gpattn_ppl.run.config import ConfigError, load_config
from gpattn_ppl.run.training import Trainer

from .conftest import TINY


def test_plan_counts_the_epochs_that_fit():
    # 60 s budget, 10 s gone (1 s setup + 9 s... the first epoch of 4 s), 6 s of evaluation:
    # left 44 s, each further epoch 4 * (1 + MARGIN) s
    p = plan_budget(1.0, 100, elapsed_s=10.0, epoch_s=4.0, setup_s=6.0, eval_estimate_s=6.0)
    assert p.epochs == 1 + math.floor(44 / (4 * (1 + MARGIN)))
    assert p.compression == pytest.approx(100 / p.epochs)
    assert isinstance(p, BudgetPlan) and p.as_dict()["epochs_configured"] == 100


def test_plan_never_exceeds_the_configured_epochs_nor_goes_below_one():
    assert plan_budget(60.0, 5, elapsed_s=1, epoch_s=1, setup_s=0, eval_estimate_s=1).epochs == 5
    late = plan_budget(0.1, 50, elapsed_s=30, epoch_s=20, setup_s=10, eval_estimate_s=5)
    assert late.epochs == 1 and late.compression == 50.0


@pytest.mark.parametrize("bad", [dict(max_minutes=0), dict(epochs=0), dict(epoch_s=0.0)])
def test_plan_refuses_nonsense(bad):
    kw = dict(max_minutes=1.0, epochs=3, elapsed_s=1, epoch_s=1.0, setup_s=0, eval_estimate_s=0)
    kw.update(bad)
    m, e = kw.pop("max_minutes"), kw.pop("epochs")
    with pytest.raises(ValueError, match="plan_budget"):
        plan_budget(m, e, **kw)


def test_config_refuses_a_non_positive_budget():
    with pytest.raises(ConfigError, match="max_minutes"):
        load_config(json.loads(json.dumps(TINY)), ["train.max_minutes=0"])


def _cfg(**train):
    cfg = json.loads(json.dumps(TINY))
    cfg["train"].update(epochs=4, warmup_epochs=1, min_lr=1e-5, seed=3, **train)
    cfg["train"]["objective"] = {}
    return cfg


def test_a_budget_that_cuts_nothing_is_the_run_without_it(tmp_path):
    """With E' = E the budgeted run trains exactly the run without a budget."""
    a = Trainer(_cfg(), tmp_path / "a")
    ra = a.fit()
    b = Trainer(_cfg(max_minutes=60.0), tmp_path / "b")
    rb = b.fit()
    assert b.budget is not None and b.budget.epochs == 4 and b.budget.compression == 1.0
    assert a.step_losses == b.step_losses
    assert ra["test"] == rb["test"] and rb["budget"]["epochs"] == 4


def test_a_cut_run_ends_its_schedules_on_its_last_epoch(tmp_path, monkeypatch):
    """Made to plan 2 of 8 epochs: it trains 2, its learning rate reaches min_lr at the last
    step and the program's clock (objective-weight schedules) reaches the configured 8."""
    import gpattn_ppl.run.training as training

    def two_of(max_minutes, epochs, **kw):
        return BudgetPlan(max_minutes, epochs, 2, epochs / 2, kw["epoch_s"], 0.0, 0.0)

    monkeypatch.setattr(training, "plan_budget", two_of)
    cfg = _cfg(max_minutes=1.0)
    cfg["train"]["epochs"] = 8
    tr = Trainer(cfg, tmp_path / "cut")
    res = tr.fit()
    assert len(tr.history) == 2 and res["budget"]["epochs"] == 2
    assert tr.scheduler.get_last_lr()[0] == pytest.approx(cfg["train"]["min_lr"])
    spe = tr.steps_per_epoch
    # the last step's clock: r * (1 + (spe - 1) / spe), r = 4
    assert tr.program.epoch == pytest.approx(4 * (1 + (spe - 1) / spe))
    # a resumed run keeps the plan
    state = torch.load(tmp_path / "cut" / "last.pt", weights_only=True)
    assert state["budget"]["epochs"] == 2
