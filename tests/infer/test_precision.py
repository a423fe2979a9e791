"""train.precision: autocast of the forward pass, the fp16 gradient scaler, and a run in bf16."""

import json

import pytest
import torch

from gpattn_ppl.infer import PRECISIONS, autocast, grad_scaler
from gpattn_ppl.run.config import ConfigError, load_config
from gpattn_ppl.run.training import Trainer
from tests.run.conftest import TINY


def test_autocast_and_scaler_per_precision():
    a, b = torch.randn(3, 3), torch.randn(3, 3)
    for name, dtype in PRECISIONS.items():
        with autocast(name, "cpu"):
            assert (a @ b).dtype == (dtype or torch.float32)
    assert grad_scaler("fp32", "cpu") is None and grad_scaler("bf16", "cpu") is None
    assert isinstance(grad_scaler("fp16", "cpu"), torch.amp.GradScaler)
    with pytest.raises(ValueError, match="unknown precision 'fp8'"):
        autocast("fp8", "cpu")


def test_config_names_the_allowed_precisions():
    with pytest.raises(ConfigError, match="precision"):
        load_config(json.loads(json.dumps(TINY)), ["train.precision=half"])


@pytest.mark.parametrize("precision", ["bf16", "fp16"])
def test_a_run_trains_and_evaluates_in_low_precision(tmp_path, precision):
    """A tiny SGPA run (GP algebra inside) trains in bf16 / fp16 (with its scaler) on the CPU:
    finite losses, results written, the scaler's state in last.pt for fp16."""
    cfg = json.loads(json.dumps(TINY))
    cfg["model"]["attention"] = {"kind": "sgpa"}
    cfg["train"].update(precision=precision, epochs=2)
    tr = Trainer(cfg, tmp_path / precision)
    res = tr.fit()
    assert all(torch.isfinite(torch.tensor(tr.step_losses)))
    assert 0.0 <= res["test"]["acc"] <= 1.0 and res["test"]["nll"] > 0
    state = torch.load(tmp_path / precision / "last.pt", weights_only=True)
    assert (state["scaler"] is not None) == (precision == "fp16")
