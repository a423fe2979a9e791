import json
import os
import signal
import subprocess
import sys
import textwrap

import pytest
import torch
import yaml

from gpattn_ppl.infer.checkpoint import CheckpointError, init_from, load_checkpoint, save_atomic
from gpattn_ppl.run.cli import main
from gpattn_ppl.run.experiment import Trainer, evaluate_run
from gpattn_ppl.run.rundir import RunFolderError


def test_fit_writes_run_directory_and_selects_on_validation(tmp_path, tiny_config):
    res = Trainer(tiny_config, tmp_path / "run").fit()
    run = tmp_path / "run"
    for name in ("config.yaml", "run.json", "encoder.json", "last.pt", "best.pt", "history.json",
                 "log.csv", "results.json", "predictions.pt"):
        assert (run / name).exists(), name
    hist = json.loads((run / "history.json").read_text())
    assert [h["epoch"] for h in hist] == [1, 2]
    scores = [h["val/mcc"] for h in hist]
    assert res["best_epoch"] == 1 + max(range(2), key=lambda i: (scores[i], -i))
    assert res["selection"] == {"metric": "mcc", "split": "val", "score": max(scores)}
    assert set(res["test"]) >= {"acc", "mcc", "nll", "ece", "brier", "aurc"}
    det = res["ood"]["cola_ood"]["detection"]
    assert set(det) >= {"max_softmax", "entropy", "energy", "kl_matching"}
    assert res["cost"]["params"] > 0 and res["cost"]["sec_per_epoch"] > 0
    # the whole run's wall time: training passes, validations and the final evaluation
    cost = res["cost"]
    assert all(h["val_seconds"] > 0 for h in hist) and cost["eval_seconds"] > 0
    assert cost["run_seconds"] == pytest.approx(
        sum(h["seconds"] + h["val_seconds"] for h in hist) + cost["eval_seconds"])


def _one_epoch_state(cfg: dict, run_dir) -> dict:
    """The checkpoint state of a run in ``run_dir`` after exactly one training epoch."""
    part = Trainer(cfg, run_dir)
    part._write_static()
    part.train_epoch()
    part.epoch = 1
    part.history.append({"epoch": 1, "seconds": 0.0})
    return part._state()


def test_resume_reproduces_the_uninterrupted_loss_sequence(tmp_path, tiny_config):
    tiny_config["train"]["epochs"] = 3
    full = Trainer(tiny_config, tmp_path / "full")
    full.fit()
    part_cfg = json.loads(json.dumps(tiny_config))
    part_cfg["train"]["epochs"] = 3
    # train exactly one epoch, checkpoint, then resume in a fresh trainer
    save_atomic(_one_epoch_state(part_cfg, tmp_path / "part"), tmp_path / "part" / "last.pt")
    torch.manual_seed(999)  # resuming must restore every RNG, whatever the process did since
    resumed = Trainer(part_cfg, tmp_path / "part", resume=True)
    assert resumed.resume() and resumed.epoch == 1
    while resumed.epoch < 3:
        resumed.train_epoch()
        resumed.epoch += 1
    assert resumed.step_losses == full.step_losses


def test_run_killed_mid_epoch_leaves_a_resumable_checkpoint(tmp_path, tiny_config):
    tiny_config["train"]["epochs"] = 4
    tiny_config["data"]["limit_train"] = 256
    cfg_path = tmp_path / "cfg.yaml"
    cfg_path.write_text(yaml.safe_dump(tiny_config))
    run = tmp_path / "run"
    script = textwrap.dedent(f"""
        import os, signal
        from gpattn_ppl.run.experiment import Trainer
        t = Trainer({str(cfg_path)!r}, {str(run)!r})
        batch, calls = t.bundle.train.batch, []
        def dying_batch(*a, **k):
            if t.epoch == 2:  # in the middle of the third epoch: die without any cleanup
                calls.append(1)
                if len(calls) == 4:
                    os.kill(os.getpid(), signal.SIGKILL)
            return batch(*a, **k)
        t.bundle.train.batch = dying_batch
        t.fit()
    """)
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True)
    assert proc.returncode == -signal.SIGKILL
    state = load_checkpoint(run / "last.pt")
    assert state["epoch"] == 2
    assert not [p for p in os.listdir(run) if p.endswith(".tmp")]
    with pytest.raises(RunFolderError, match="use --resume"):
        Trainer(cfg_path, run)
    res = Trainer(cfg_path, run, resume=True).fit()
    assert json.loads((run / "history.json").read_text())[-1]["epoch"] == 4
    assert res["best_epoch"] >= 1


def test_corrupt_and_missing_checkpoints_are_named(tmp_path, tiny_config):
    bad = tmp_path / "last.pt"
    bad.write_bytes(b"not a checkpoint")
    with pytest.raises(CheckpointError, match=f"corrupt checkpoint {bad}"):
        load_checkpoint(bad)
    with pytest.raises(CheckpointError, match="checkpoint not found"):
        load_checkpoint(tmp_path / "nope.pt")
    tiny_config["train"]["epochs"] = 1
    run = tmp_path / "run"
    first = Trainer(tiny_config, run).fit()
    (run / "last.pt").write_bytes(b"garbage")
    with pytest.raises(CheckpointError, match="corrupt checkpoint"):
        Trainer(tiny_config, run, resume=True).fit()
    # evaluation needs best.pt only: a corrupt last.pt does not stop it
    assert evaluate_run(run)["test"] == first["test"]
    (run / "best.pt").write_bytes(b"garbage")
    with pytest.raises(CheckpointError, match="corrupt checkpoint"):
        evaluate_run(run)


def test_warm_start_loads_by_name_and_fails_loudly_on_zero(tmp_path, tiny_config):
    tiny_config["train"]["epochs"] = 1
    src = Trainer(tiny_config, tmp_path / "src")
    src.fit()
    cfg = json.loads(json.dumps(tiny_config))
    cfg["train"]["init_from"] = str(tmp_path / "src")
    cfg["train"]["seed"] = 5
    warm = Trainer(cfg, tmp_path / "warm")
    assert warm.warm_start["loaded"] and not warm.warm_start["shape_mismatch"]
    best = load_checkpoint(tmp_path / "src" / "best.pt")["model"]
    for name, value in warm.net.state_dict().items():
        torch.testing.assert_close(value, best[name])
    other = torch.nn.Linear(3, 3)
    with pytest.raises(CheckpointError, match="matched 0 of 2 tensors"):
        init_from(other, tmp_path / "src")


def test_missing_data_path_and_empty_dataset_errors(tmp_path):
    with pytest.raises(FileNotFoundError, match="imdb"):
        Trainer({"data": {"name": "imdb", "root": str(tmp_path / "missing")}}, tmp_path / "r")
    from gpattn_ppl.data import ArrayDataset

    with pytest.raises(ValueError, match="empty"):
        ArrayDataset(torch.zeros(0, 4, dtype=torch.long), torch.zeros(0), torch.zeros(0))


def test_cli_train_evaluate_compare(tmp_path, tiny_config, capsys):
    tiny_config["train"]["epochs"] = 1
    cfg = tmp_path / "tiny.yaml"
    cfg.write_text(yaml.safe_dump(tiny_config))
    assert main(["train", str(cfg), "--out", str(tmp_path / "run"), "--set", "train.lr=2e-3"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["run_dir"] == str(tmp_path / "run")
    assert yaml.safe_load((tmp_path / "run" / "config.yaml").read_text())["train"]["lr"] == 2e-3
    assert main(["evaluate", str(tmp_path / "run")]) == 0
    again = json.loads(capsys.readouterr().out)
    assert again["test"] == out["test"]
    assert main(["compare", str(cfg), "--seeds", "0", "1", "--out", str(tmp_path / "cmp"),
                 "--no-progress", "--ensemble", "2"]) == 0
    table = (tmp_path / "cmp" / "results.md").read_text()
    assert "| tiny | 2 |" in table and "tiny (ensemble of 2)" in table and " ± " in table
    assert (tmp_path / "cmp" / "results.csv").exists()
    assert main(["train", str(cfg), "--set", "model.attention.kind=nope"]) == 2
    assert "unknown attention kind 'nope'" in capsys.readouterr().err
    assert main(["evaluate", str(tmp_path / "run"), "--ood", "svhn"]) == 2
    assert "unknown OOD set" in capsys.readouterr().err
    # the run folder is never trained into with another config, and is left as it was
    before = {p.name: p.read_bytes() for p in (tmp_path / "run").iterdir() if p.is_file() and p.name != ".lock"}
    assert main(["train", "--set", "train.lr=0.1", str(cfg), "--out", str(tmp_path / "run")]) == 2
    err = capsys.readouterr().err
    assert "train.lr: 0.002 (run) != 0.1 (now)" in err and "--force" in err
    assert {p.name: p.read_bytes() for p in (tmp_path / "run").iterdir() if p.is_file() and p.name != ".lock"} == before
    # compare checks each of its runs the same way
    assert main(["compare", str(cfg), "--seeds", "0", "--out", str(tmp_path / "cmp"),
                 "--no-progress", "--set", "train.epochs=2"]) == 2
    assert "train.epochs: 1 (run) != 2 (now)" in capsys.readouterr().err


def test_evaluate_run_requires_a_run_directory(tmp_path):
    with pytest.raises(RunFolderError, match="not a run folder"):
        evaluate_run(tmp_path)


def test_ddp_two_processes_gloo(tmp_path, tiny_config):
    """torchrun-style DDP on CPU: 2 ranks with gloo end with identical weights; rank 0 writes."""
    tiny_config["train"]["epochs"] = 1
    tiny_config["model"]["dropout"] = 0.0
    cfg = tmp_path / "tiny.yaml"
    cfg.write_text(yaml.safe_dump(tiny_config))
    script = textwrap.dedent(f"""
        import torch, torch.distributed as dist
        from gpattn_ppl.run.experiment import Trainer
        t = Trainer({str(cfg)!r}, {str(tmp_path / "run")!r})
        t.fit()
        flat = torch.cat([p.detach().flatten() for p in t.net.parameters()])
        gathered = [torch.zeros_like(flat) for _ in range(2)]
        dist.all_gather(gathered, flat)
        assert torch.equal(gathered[0], gathered[1]), "ranks diverged"
        assert t.steps_per_epoch == 2  # 64 examples / 2 ranks / batch 16
        # release the DDP reducer before its process group, and leave together: destroying the
        # group under a live reducer can abort at exit ("terminate called without an active
        # exception", seen under load)
        del t
        import gc
        gc.collect()
        dist.barrier()
        dist.destroy_process_group()
    """)
    path = tmp_path / "ddp.py"
    path.write_text(script)
    proc = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--nproc_per_node=2",
                           "--master_port=29533", str(path)],
                          capture_output=True, text=True, timeout=1800)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert (tmp_path / "run" / "results.json").exists()


def test_select_metric_auto_is_the_datasets_declared_metric(tmp_path, tiny_config):
    from gpattn_ppl.data import DATASETS, RawData, register_dataset

    words = ["good", "bad", "fine", "poor", "great", "awful", "nice", "dull"]
    texts = [f"{words[i % 8]} {words[(i * 3) % 8]} day" for i in range(48)]
    labels = torch.tensor([i % 2 for i in range(48)])

    @register_dataset("toy_brier_select", protocols=("a",), modality="text",
                      select_metric="brier")
    def _toy(*, protocol, root, split_seed, cache_dir):
        return RawData(texts, labels, {"train": torch.arange(32), "val": torch.arange(32, 40),
                                       "test": torch.arange(40, 48)}, {}, 2)

    try:
        tiny_config["data"] = {"name": "toy_brier_select", "max_len": 8, "batch_size": 16}
        tiny_config["train"]["epochs"] = 3
        res = Trainer(tiny_config, tmp_path / "toy").fit()
        hist = json.loads((tmp_path / "toy" / "history.json").read_text())
        scores = [h["val/brier"] for h in hist]
        # brier: lower is better, the first of equal scores wins
        assert res["selection"] == {"metric": "brier", "split": "val", "score": min(scores)}
        assert res["best_epoch"] == 1 + min(range(3), key=lambda i: (scores[i], i))
        explicit = json.loads(json.dumps(tiny_config))
        explicit["train"]["select_metric"] = "acc"
        assert Trainer(explicit, tmp_path / "acc").select_metric == "acc"
        explicit["train"]["select_metric"] = "aurc"
        with pytest.raises(ValueError, match="train.select_metric: 'aurc' is not a validation"):
            Trainer(explicit, tmp_path / "bad")
    finally:
        del DATASETS["toy_brier_select"]


def test_evaluate_run_builds_no_optimiser(tmp_path, tiny_config, monkeypatch):
    tiny_config["train"]["epochs"] = 1
    first = Trainer(tiny_config, tmp_path / "run").fit()

    def no_optimiser(*args, **kwargs):
        raise AssertionError("evaluate_run built an optimiser")

    for name in ("Adam", "AdamW"):
        monkeypatch.setattr(torch.optim, name, no_optimiser)
    monkeypatch.setattr(torch.optim.lr_scheduler, "LambdaLR", no_optimiser)
    again = evaluate_run(tmp_path / "run")
    assert again["test"] == first["test"] and again["ood"] == first["ood"]
    assert again["selection"] == first["selection"] and again["best_epoch"] == first["best_epoch"]


def test_the_cli_validates_the_config_once(tmp_path, tiny_config, monkeypatch):
    import gpattn_ppl.models.spec as spec
    import gpattn_ppl.run.config as config

    calls = {"config": 0, "model": 0}
    validate_config, validate_model_spec = config.validate_config, spec.validate_model_spec

    def counting_config(cfg, **kw):
        calls["config"] += 1
        return validate_config(cfg, **kw)

    def counting_model(model):
        calls["model"] += 1
        return validate_model_spec(model)

    monkeypatch.setattr(config, "validate_config", counting_config)
    monkeypatch.setattr(spec, "validate_model_spec", counting_model)
    monkeypatch.setattr("gpattn_ppl.models.build.validate_model_spec", counting_model)
    tiny_config["train"]["epochs"] = 1
    path = tmp_path / "tiny.yaml"
    path.write_text(yaml.safe_dump(tiny_config))
    assert main(["train", str(path), "--out", str(tmp_path / "run")]) == 0
    assert calls == {"config": 1, "model": 0}


def test_patience_stops_early_and_a_resumed_run_stays_stopped(tmp_path, tiny_config, monkeypatch):
    """``train.patience: 2`` with validation MCC 0.1, 0.3, 0.2, 0.2, (0.5): training ends after
    epoch 4, two epochs past the best (epoch 2), which is the checkpoint evaluated; resuming the
    stopped run trains nothing more."""
    scores = iter([0.1, 0.3, 0.2, 0.2, 0.5, 0.5])
    monkeypatch.setattr(Trainer, "validate", lambda self: {"mcc": next(scores)})
    tiny_config["train"].update(epochs=6, patience=2)
    tiny_config["data"]["limit_train"] = 32
    res = Trainer(tiny_config, tmp_path / "run").fit()
    hist = json.loads((tmp_path / "run" / "history.json").read_text())
    assert [h["epoch"] for h in hist] == [1, 2, 3, 4]
    assert res["best_epoch"] == 2
    again = Trainer(tiny_config, tmp_path / "run", resume=True)
    again.fit()
    assert again.epoch == 4 and len(json.loads((tmp_path / "run" / "history.json").read_text())) == 4
    # without patience every epoch runs
    scores = iter([0.1, 0.3, 0.2, 0.2, 0.5, 0.5])
    tiny_config["train"]["patience"] = None
    Trainer(tiny_config, tmp_path / "all").fit()
    assert len(json.loads((tmp_path / "all" / "history.json").read_text())) == 6


def test_patience_must_be_positive(tiny_config):
    from gpattn_ppl.run.config import ConfigError, load_config

    with pytest.raises(ConfigError, match="train.patience"):
        load_config({"train": {"patience": 0}})


def test_resume_accepts_a_checkpoint_written_before_an_option_existed(tmp_path, tiny_config):
    """A key the schema gained after the run was written (here ``train.patience``, at its
    default) is no difference: the run resumes; a real difference is still refused."""
    tiny_config["train"]["epochs"] = 2
    state = _one_epoch_state(tiny_config, tmp_path / "run")
    del state["config"]["train"]["patience"]          # as an older version wrote it
    save_atomic(state, tmp_path / "run" / "last.pt")
    resumed = Trainer(tiny_config, tmp_path / "run", resume=True)
    assert resumed.resume() and resumed.epoch == 1
    state["config"]["train"]["lr"] = 0.123
    save_atomic(state, tmp_path / "run" / "last.pt")
    with pytest.raises(RunFolderError, match=r"train.lr: 0.123 \(last.pt\)"):
        Trainer(tiny_config, tmp_path / "run", resume=True).resume()


def test_val_mc_samples_sets_the_validation_passes_only(tmp_path, tiny_config, monkeypatch):
    """``train.val_mc_samples`` is the T of the per-epoch validation; left out it is
    ``eval.mc_samples``; the test evaluation uses ``eval.mc_samples`` either way."""
    import gpattn_ppl.run.evaluate as evaluate
    import gpattn_ppl.run.training as training

    seen = []

    def recording(program, dataset, *, num_samples, **kw):
        seen.append(num_samples)
        return real(program, dataset, num_samples=num_samples, **kw)

    real = training.predict
    monkeypatch.setattr(training, "predict", recording)
    monkeypatch.setattr(evaluate, "predict", recording)
    tiny_config["train"].update(epochs=1, val_mc_samples=2)
    tiny_config["eval"]["mc_samples"] = 3
    tiny_config["data"]["limit_train"] = 32
    trainer = Trainer(tiny_config, tmp_path / "run")
    trainer.fit()
    assert seen[0] == 2 and len(seen) > 1 and set(seen[1:]) == {3}   # validation, then test
    seen.clear()
    tiny_config["train"]["val_mc_samples"] = None
    Trainer(tiny_config, tmp_path / "default").validate()
    assert seen == [3]


def test_val_mc_samples_must_be_positive():
    from gpattn_ppl.run.config import ConfigError, load_config

    with pytest.raises(ConfigError, match="train.val_mc_samples"):
        load_config({"train": {"val_mc_samples": 0}})
