"""Issue 30 (3, 4): cross-key contradictions refused; TensorBoard, one line per epoch, the run's
own peak memory, data.limit_val, train.val_every, train.accumulate and --threads."""

from __future__ import annotations

import copy
import json
import sys

import pytest
import torch

from gpattn_ppl.run.cli import main
from gpattn_ppl.run.config import ConfigError, load_config, validate_config
from gpattn_ppl.run.training import Trainer


# -- contradictions across keys ------------------------------------------------------------------
def test_warmup_not_shorter_than_the_run_is_refused_naming_both_keys_and_the_fix():
    with pytest.raises(ConfigError) as err:
        load_config({"train": {"epochs": 5, "warmup_epochs": 5}})
    msg = str(err.value)
    assert msg.startswith("train.warmup_epochs (5) >= train.epochs (5)")
    assert "--set train.warmup_epochs=0.5" in msg
    with pytest.raises(ConfigError, match=r"train.warmup_epochs \(10\) >= train.epochs \(5\)"):
        load_config({"train": {"epochs": 5, "warmup_epochs": 10}})
    with pytest.raises(ConfigError, match="warmup_epochs=0,"):  # one epoch: no warm-up
        load_config({"train": {"epochs": 1, "warmup_epochs": 1, "schedule": "constant"}})
    load_config({"train": {"epochs": 5, "warmup_epochs": 4.5}})
    load_config({"train": {"epochs": 1, "warmup_epochs": 0}})


def test_the_default_warmup_is_a_tenth_of_the_run_at_most_five_epochs():
    assert load_config({})["train"]["warmup_epochs"] == 5  # train.epochs 50: as before
    assert type(load_config({})["train"]["warmup_epochs"]) is int
    assert load_config({"train": {"epochs": 200}})["train"]["warmup_epochs"] == 5
    assert load_config({"train": {"epochs": 5}})["train"]["warmup_epochs"] == 0.5
    assert load_config({"train": {"epochs": 1}})["train"]["warmup_epochs"] == 0.1


def test_a_saved_run_is_not_refused_for_how_it_was_trained():
    """Run folders trained before the rule (epochs 2, warm-up 5) can still be read back."""
    saved = dict(load_config({"train": {"epochs": 2, "warmup_epochs": 1}}))
    saved["train"] = {**saved["train"], "warmup_epochs": 5}
    assert validate_config(saved, extras=False)["train"]["warmup_epochs"] == 5
    with pytest.raises(ConfigError):
        validate_config(saved)


def test_patience_shorter_than_the_validation_interval_is_refused():
    with pytest.raises(ConfigError) as err:
        load_config({"train": {"patience": 2, "val_every": 3}})
    assert str(err.value).startswith("train.patience (2) < train.val_every (3)")
    load_config({"train": {"patience": 3, "val_every": 3}})
    # harmless combinations stay allowed
    load_config({"train": {"val_every": 100, "epochs": 3, "warmup_epochs": 0}})
    load_config({"train": {"val_mc_samples": 4}, "model": {"dropout": 0.0}})


def test_tensorboard_names_its_extra_before_any_work(monkeypatch):
    from gpattn_ppl.run.config import requires_extras

    cfg = load_config({"train": {"tensorboard": True}}, extras=False)
    assert [(w, e) for w, e, _, _ in requires_extras(cfg)] == [("train.tensorboard",
                                                                 "tensorboard")]
    monkeypatch.setitem(sys.modules, "tensorboard", None)
    with pytest.raises(ConfigError, match=r"^train.tensorboard: TensorBoard logging needs the "
                       r"'tensorboard' extra: pip install 'gpattn-ppl\[tensorboard\]'"):
        load_config({"train": {"tensorboard": True}})


# -- logging -------------------------------------------------------------------------------------
def test_tensorboard_logs_every_scalar_per_epoch_and_the_step_loss(tiny_config, tmp_path):
    pytest.importorskip("tensorboard")
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    from gpattn_ppl.run.rundir import clear_run_files, listed_files

    tiny_config["train"]["tensorboard"] = True
    tiny_config["model"]["attention"] = {"kind": "sgpa", "num_inducing": 4}  # a KL term
    run = tmp_path / "run"
    trainer = Trainer(tiny_config, run)
    trainer.fit()
    assert "tensorboard/" in listed_files(run)
    acc = EventAccumulator(str(run / "tensorboard"))
    acc.Reload()
    tags = set(acc.Tags()["scalars"])
    for tag in ("train/loss", "train/nll", "train/lr", "val/mcc", "val/nll",
                "numerics/escalations", "numerics/checked_reruns", "time/train_seconds",
                "train/step_loss"):
        assert tag in tags, tag
    assert any(t.startswith("train/term/") and t.endswith("kl") for t in tags), tags
    assert [e.step for e in acc.Scalars("train/loss")] == [1, 2]
    losses = [e.value for e in acc.Scalars("train/step_loss")]
    assert losses == pytest.approx(trainer.step_losses, rel=1e-6)
    clear_run_files(run)  # --force removes the event files and the folder
    assert not (run / "tensorboard").exists()


def test_one_line_per_epoch_on_stderr_and_no_bar_outside_a_terminal(tiny_config, tmp_path,
                                                                    capsys):
    tiny_config["train"]["progress"] = True  # but stderr is not a terminal here
    Trainer(tiny_config, tmp_path / "run", label="tiny").fit()
    err = capsys.readouterr().err
    lines = [line for line in err.splitlines() if line.strip()]
    assert len(lines) == 2, err  # no tqdm bar, one line per epoch
    assert lines[0].startswith("tiny epoch 1/2: loss ")
    assert ", val mcc " in lines[0] and " s train + " in lines[0] and lines[0].endswith(" s val")


def test_evaluate_prints_the_temperature_scaled_metrics(tiny_config, tmp_path, capsys):
    Trainer(tiny_config, tmp_path / "run").fit()
    capsys.readouterr()
    assert main(["evaluate", str(tmp_path / "run"), "--no-plots", "--set",
                 "eval.temperature_scaling=true"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["temperature_scaling"]["temperature"] > 0
    assert set(out["ts"]) == {"test", "ood"} and "nll" in out["ts"]["test"]
    assert out["ts"]["test"]["nll"] != out["test"]["nll"]


def test_peak_memory_is_the_runs_own(tiny_config, tmp_path):
    """cost.peak_mem says what was measured: the run's own peak, from its start."""
    cost = Trainer(tiny_config, tmp_path / "run").fit()["cost"]
    peak = cost["peak_mem"]
    assert cost["peak_mem_mb"] == peak["peak_mb"] >= peak["start_mb"] > 0
    assert peak["increase_mb"] == pytest.approx(peak["peak_mb"] - peak["start_mb"])
    assert "sampled" in peak["what"] and "run's start" in peak["what"]


def test_run_memory_sees_a_peak_inside_the_run():
    import mmap
    import time

    from gpattn_ppl.run.runtime import RunMemory

    with RunMemory("cpu", interval=0.01) as memory:
        # 100 MB of fresh pages, touched: an anonymous mapping is new to the resident set
        # whatever the allocator kept from earlier tests (a freed 100 MB tensor is reused
        # from the heap, and the resident set does not move)
        block = mmap.mmap(-1, 100 * 2**20)
        block.write(b"\x01" * len(block))
        # wait for the sampling thread's reading, however busy the machine (the deadline
        # only guards against a hang; no time is asserted)
        deadline = time.monotonic() + 600
        while memory.max_bytes - memory.start_bytes <= 50 * 2**20 \
                and time.monotonic() < deadline:
            time.sleep(0.01)
        block.close()
    assert memory.summary()["increase_mb"] > 50


# -- validation cost -----------------------------------------------------------------------------
def test_limit_val_shrinks_the_per_epoch_validation_only(tiny_config, tmp_path):
    tiny_config["data"]["limit_val"] = 10
    trainer = Trainer(tiny_config, tmp_path / "run")
    val = trainer.bundle.val
    assert len(trainer.val_set) == 10 and len(val) == 32 and len(trainer.bundle.test) == 32
    # label-stratified: the share of each label within one example of the whole's
    assert abs(int(trainer.val_set.y.sum()) - 10 * float(val.y.float().mean())) <= 1
    assert all(len(s) == 32 for s in trainer.bundle.ood.values())  # OOD untouched
    trainer.fit()
    preds = torch.load(tmp_path / "run" / "predictions.pt", weights_only=True)
    assert preds["val"]["labels"].shape[0] == 32  # the evaluation (and TS) keep all of val
    assert preds["test"]["labels"].shape[0] == 32


def test_val_every_validates_every_kth_and_the_last_epoch(tiny_config, tmp_path):
    tiny_config["train"].update(epochs=5, val_every=2)
    trainer = Trainer(tiny_config, tmp_path / "run")
    results = trainer.fit()
    validated = [r["epoch"] for r in trainer.history if "val/mcc" in r]
    assert validated == [2, 4, 5]
    assert all(r["val_seconds"] == 0.0 for r in trainer.history if r["epoch"] in (1, 3))
    assert results["best_epoch"] in validated
    assert results["cost"]["run_seconds"] is not None


def test_val_every_leaves_the_default_run_as_it_was(tiny_config, tmp_path):
    """val_every 1 and accumulate 1 written out change nothing (the defaults)."""
    a = Trainer(tiny_config, tmp_path / "a").fit()
    tiny_config["train"].update(val_every=1, accumulate=1)
    tiny_config["data"]["limit_val"] = 10_000
    b = Trainer(tiny_config, tmp_path / "b").fit()
    assert a["test"] == b["test"] and a["ood"] == b["ood"]


# -- gradient accumulation -----------------------------------------------------------------------
def _assert_same_weights(a, b) -> None:
    """Equal weights up to float summation order, except the key bias of softmax attention: its
    gradient is zero in exact arithmetic (a constant added to every score of a row), so Adam
    normalises rounding noise of either order into steps of size lr; its query and value
    parts must agree."""
    for (name, p), q in zip(a.net.state_dict().items(), b.net.state_dict().values()):
        if name.endswith("attn.qkv.bias"):
            d = p.shape[0] // 3
            p, q = torch.cat([p[:d], p[2 * d:]]), torch.cat([q[:d], q[2 * d:]])
        torch.testing.assert_close(q, p, rtol=1e-5, atol=1e-6, msg=name)


def _deterministic(cfg: dict) -> dict:
    cfg = copy.deepcopy(cfg)
    cfg["model"]["dropout"] = 0.0
    cfg["train"].update(epochs=2, warmup_epochs=0.5, schedule="cosine")
    cfg["data"]["limit_train"] = 64
    return cfg


def test_accumulating_k_micro_batches_is_one_k_times_larger_batch(tiny_config, tmp_path):
    """A deterministic network: k = 2 micro-batches of 8 per step is a batch of 16, step for step
    (same data order, same learning-rate schedule over optimiser steps)."""
    big = _deterministic(tiny_config)
    big["data"]["batch_size"] = 16
    small = copy.deepcopy(big)
    small["data"]["batch_size"] = 8
    small["train"]["accumulate"] = 2
    a, b = Trainer(big, tmp_path / "big"), Trainer(small, tmp_path / "small")
    assert a.steps_per_epoch == b.steps_per_epoch == 4 and b.batches_per_epoch == 8
    ra, rb = a.fit(), b.fit()
    assert rb["test"]["acc"] == ra["test"]["acc"]
    _assert_same_weights(a, b)
    assert b.step_losses == pytest.approx(a.step_losses, rel=1e-5)
    assert len(b.step_losses) == 8
    assert [r["lr"] for r in b.history] == pytest.approx([r["lr"] for r in a.history])


def test_accumulation_with_a_short_last_step_weights_by_examples(tiny_config, tmp_path):
    """60 examples, batches of 8, k = 3: 8 micro-batches, steps of 24, 24 and 12 examples
    (the last of two micro-batches, 8 + 4): equal to batches of 24 with a last one of 12."""
    big = _deterministic(tiny_config)
    big["data"].update(limit_train=60, batch_size=24)
    small = copy.deepcopy(big)
    small["data"]["batch_size"] = 8
    small["train"]["accumulate"] = 3
    a, b = Trainer(big, tmp_path / "big"), Trainer(small, tmp_path / "small")
    n = len(a.bundle.train)
    assert a.steps_per_epoch == b.steps_per_epoch == -(-n // 24)
    a.fit(), b.fit()
    _assert_same_weights(a, b)
    assert b.step_losses == pytest.approx(a.step_losses, rel=1e-5)


# -- threads -------------------------------------------------------------------------------------
def test_threads_option_sets_torch_threads_anywhere_on_the_line(capsys):
    before = torch.get_num_threads()
    try:
        for argv in (["--threads", "1", "train", "missing.yaml"],
                     ["train", "missing.yaml", "--threads=1"]):
            torch.set_num_threads(2)
            assert main(argv) == 2  # the config is missing; the threads were set first
            assert torch.get_num_threads() == 1
        with pytest.raises(SystemExit) as exc:
            main(["--threads", "0", "train", "x.yaml"])
        assert exc.value.code == 2
    finally:
        torch.set_num_threads(before)
    assert "argument --threads: must be a positive integer, got 0" in capsys.readouterr().err


# -- the variance budget over training -------------------------------------------------------------
def test_track_uncertainty_adds_the_budget_and_changes_nothing_else(tiny_config, tmp_path):
    """Every validated epoch gets ``val/budget/...`` entries of the unit and the network; the
    run's draws are untouched (the same test and OOD results as without the budget)."""
    tiny_config["model"]["attention"] = {"kind": "sgpa", "num_inducing": 3}
    a = Trainer(tiny_config, tmp_path / "a").fit()
    tiny_config["train"]["track_uncertainty"] = True
    b = Trainer(tiny_config, tmp_path / "b").fit()
    assert a["test"] == b["test"] and a["ood"] == b["ood"]
    history = json.loads((tmp_path / "b" / "history.json").read_text())
    for row in history:
        keys = {k for k in row if k.startswith("val/budget/")}
        assert keys == {f"val/budget/{k}" for k in (
            "features_rel_var", "logit_std", "mutual_info", "blocks.0.attn/output_rel_var",
            "blocks.0.attn/block_rel_var", "blocks.0.attn/head_snr",
            "blocks.0.attn/head_var_ratio")}, keys
        assert 0 < row["val/budget/blocks.0.attn/head_var_ratio"] and row[
            "val/budget/mutual_info"] >= 0
