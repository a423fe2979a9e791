"""``eval.predictive``: ``mc`` (T sampled passes, the default) or ``mean`` (one pass at the units'
posterior means), for a run's evaluation, its per-epoch validation and ``gpattn-ppl evaluate``."""

import json

import pytest
import torch

from gpattn_ppl.run.config import ConfigError, load_config

from .conftest import TINY


def test_the_config_key():
    assert load_config({})["eval"]["predictive"] == "mc"
    assert load_config({"eval": {"predictive": "mean"}})["eval"]["predictive"] == "mean"
    with pytest.raises(ConfigError, match="eval.predictive: 'map' is not allowed"):
        load_config({"eval": {"predictive": "map"}})


@pytest.fixture(scope="module")
def sgpa_run(tmp_path_factory):
    from gpattn_ppl.run.experiment import Trainer

    cfg = json.loads(json.dumps(TINY))
    cfg["model"]["attention"] = {"kind": "sgpa", "num_inducing": 4}
    cfg["eval"].update(mc_samples=3, temperature_scaling=True)
    run = tmp_path_factory.mktemp("pred") / "run"
    return run, Trainer(cfg, run).fit()


def test_mean_evaluation_is_one_pass_without_mutual_information(sgpa_run):
    from gpattn_ppl.run.results import evaluate_run

    run, mc = sgpa_run
    assert mc["test"]["mutual_info"] > 0                     # 3 sampled passes disagree
    mean = evaluate_run(run, overrides=["eval.predictive=mean"])
    assert mean["test"]["mutual_info"] == pytest.approx(0.0, abs=1e-12)
    preds = torch.load(run / "predictions.pt", weights_only=True)
    assert preds["test"]["logits"].shape[0] == 1             # [T = 1, n, K]
    assert mean["test"]["nll"] != mc["test"]["nll"]
    assert "ts" in mean and mean["ts"]["test"]["nll"] > 0    # TS fitted on the mean predictive
    again = evaluate_run(run, overrides=["eval.predictive=mean"])
    assert again["test"] == mean["test"]                     # deterministic
