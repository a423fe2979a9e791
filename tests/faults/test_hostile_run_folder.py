"""A run folder from someone else, edited by hand, or written by two processes at once.

Issue 28's cases, tried from the outside as an attacker or a careless user would: a checkpoint
holding a pickled object that runs code when unpickled (``best.pt``, ``last.pt``,
``predictions.pt``, a ``train.init_from`` file), a ``run.json`` naming a plugin file, ``--force``
on a folder of the user's own files or on a manifest that lists files outside the folder, two
writers of one folder, a process killed while holding it, hand-edited ``config.yaml`` /
``calibration.json`` / ``results.json``, a warm start from another model, and a run folder
written before these rules (numpy RNG state in ``last.pt``, no file list in ``run.json``). Every
case must run nothing from the folder, delete nothing the library did not write, and end in one
``error:`` line with exit status 2 (or in the documented behaviour).

The module imports nothing beyond the command line at its top, so that it can be collected and
run against an older version of the library (where the hostile-checkpoint cases fail).
"""

from __future__ import annotations

import copy
import json
import random
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
import torch
import yaml

from gpattn_ppl.run.cli import main

from ..run.conftest import TINY
from .conftest import cli_error, tried


class _Payload:
    """Unpickling this object creates the file named by ``path`` (a stand-in for any code)."""

    def __init__(self, path: str) -> None:
        self.path = path

    def __reduce__(self):
        return (Path.touch, (Path(self.path),))


def _hostile(path: Path, marker: Path, base: dict | None = None) -> None:
    """Replace ``path`` with a checkpoint that holds a valid-looking state plus the payload."""
    obj = dict(base or {"model": {}})
    obj["payload"] = _Payload(str(marker))
    torch.save(obj, path)


@pytest.fixture
def run(trained, tmp_path):
    out = tmp_path / "run"
    shutil.copytree(trained, out)
    return out


# -- 1. nothing from a run folder or checkpoint executes -------------------------------------
@pytest.mark.parametrize("name", ["best.pt", "last.pt", "predictions.pt"])
def test_a_hostile_checkpoint_is_refused_by_every_command_and_runs_nothing(run, texts, tmp_path,
                                                                         capsys, name):
    marker = tmp_path / "pwned"
    base = torch.load(run / name, weights_only=True)
    _hostile(run / name, marker, base)
    commands = {"best.pt": [["evaluate", str(run), "--no-plots"],
                            ["predict", str(run), "--input", str(texts)]],
                "last.pt": [["train", str(run / "config.yaml"), "--out", str(run), "--resume"]],
                "predictions.pt": [["plot", str(run), "--out", str(tmp_path / "plots")]]}[name]
    for argv in commands:
        line = cli_error(capsys, main(argv))
        tried("hostile checkpoint")
        assert f"refused {run / name}" in line and "not plain data" in line, line
        assert not marker.exists(), f"{argv[0]} ran code from {name}"
    if name == "best.pt":
        from gpattn_ppl import load_run
        from gpattn_ppl.infer import UnsafeCheckpointError

        with pytest.raises(UnsafeCheckpointError):
            load_run(run)
        tried("hostile checkpoint")
        assert not marker.exists()


def test_a_hostile_warm_start_file_is_refused(run, tmp_path, capsys):
    marker = tmp_path / "pwned"
    src = tmp_path / "init.pt"
    _hostile(src, marker, torch.load(run / "best.pt", weights_only=True))
    code = main(["train", str(run / "config.yaml"), "--out", str(tmp_path / "new"),
                 "--set", f"train.init_from={src}"])
    line = cli_error(capsys, code)
    tried("hostile checkpoint")
    assert "refused" in line and not marker.exists()


def test_the_hostile_checkpoint_would_have_run_under_the_old_loader(run, tmp_path):
    """The payload is real: ``weights_only=False`` (the old ``load_checkpoint``) runs it."""
    marker = tmp_path / "pwned"
    _hostile(run / "best.pt", marker)
    torch.load(run / "best.pt", weights_only=False)
    assert marker.exists()


def test_run_json_plugins_are_never_imported(run, texts, tmp_path, capsys):
    marker = tmp_path / "pwned"
    plugin = tmp_path / "evil.py"
    plugin.write_text(f"from pathlib import Path\nPath({str(marker)!r}).touch()\n")
    manifest = json.loads((run / "run.json").read_text())
    manifest["plugins"] = [str(plugin), "os"]
    (run / "run.json").write_text(json.dumps(manifest))
    assert main(["predict", str(run), "--input", str(texts)]) == 0
    assert main(["evaluate", str(run), "--no-plots"]) == 0
    from gpattn_ppl import load_run

    load_run(run)
    tried("hostile run.json", 3)
    assert not marker.exists()
    capsys.readouterr()


def test_a_run_that_needs_a_plugin_names_the_import_to_pass(tmp_path, capsys):
    """A run trained with ``--import unit.py`` is not usable without it, and the error says
    which flag to pass; with the flag it works."""
    from gpattn_ppl.attention import ATTENTION
    from gpattn_ppl.run import plugins

    plugin = tmp_path / "myunit.py"
    plugin.write_text(
        "from gpattn_ppl.attention import register_attention\n"
        "from gpattn_ppl.attention.softmax import SoftmaxAttention\n"
        "register_attention('mine_for_hostile_test')(type('Mine', (SoftmaxAttention,), {}))\n")
    cfg = copy.deepcopy(TINY)
    cfg["train"].update(epochs=1, device="cpu")
    cfg["model"]["attention"] = {"kind": "mine_for_hostile_test"}
    path = tmp_path / "c.yaml"
    path.write_text(yaml.safe_dump(cfg))
    try:
        assert main(["--import", str(plugin), "train", str(path), "--out",
                     str(tmp_path / "r")]) == 0
        capsys.readouterr()
        # as in a fresh process, which has not imported it
        ATTENTION.pop("mine_for_hostile_test")
        plugins._IMPORTED.remove(str(plugin.resolve()))
        assert main(["evaluate", str(tmp_path / "r"), "--no-plots"]) == 2
        err = capsys.readouterr().err
        tried("plugins")
        assert "mine_for_hostile_test" in err and f"--import {plugin.resolve()}" in err, err
        assert "Traceback" not in err and len(err.strip().splitlines()) == 2, err
        assert main(["--import", str(plugin), "evaluate", str(tmp_path / "r"),
                     "--no-plots"]) == 0
    finally:
        ATTENTION.pop("mine_for_hostile_test", None)
        if str(plugin.resolve()) in plugins._IMPORTED:
            plugins._IMPORTED.remove(str(plugin.resolve()))
    capsys.readouterr()


# -- 3. nothing deleted or overwritten that the library did not write --------------------------
def test_force_on_a_folder_that_only_looks_like_a_run_deletes_nothing(tmp_path, capsys):
    cfg = copy.deepcopy(TINY)
    cfg["train"].update(epochs=1, device="cpu")
    path = tmp_path / "c.yaml"
    path.write_text(yaml.safe_dump(cfg))
    mine = tmp_path / "mine"
    for files in ({"config.yaml": "# my notes\n"}, {"results.json": "{}"}, {"log.csv": "a,b\n"},
                  {"plots/fig.png": "png"}):
        shutil.rmtree(mine, ignore_errors=True)
        for name, text in files.items():
            (mine / name).parent.mkdir(parents=True, exist_ok=True)
            (mine / name).write_text(text)
        line = cli_error(capsys, main(["train", str(path), "--out", str(mine), "--force"]))
        tried("--force on foreign files")
        assert "no valid gpattn_ppl manifest" in line
        for name, text in files.items():
            assert (mine / name).read_text() == text
        assert not (mine / ".lock").exists()  # the refusal left the folder as it was


def test_force_never_follows_a_manifest_out_of_the_folder(run, tmp_path, capsys):
    victim = tmp_path / "victim.txt"
    victim.write_text("keep")
    manifest = json.loads((run / "run.json").read_text())
    for listed in ("../victim.txt", str(victim), "notes/a.txt"):
        manifest["files"] = ["config.yaml", listed]
        (run / "run.json").write_text(json.dumps(manifest))
        line = cli_error(capsys, main(["train", str(run / "config.yaml"), "--out", str(run),
                                       "--force"]))
        tried("--force on foreign files")
        assert "a file no run writes" in line and victim.read_text() == "keep"


def test_force_removes_the_runs_files_and_keeps_the_users(run, capsys):
    (run / "notes.txt").write_text("mine")
    (run / "plots").mkdir(exist_ok=True)
    (run / "plots" / "mine.png").write_text("mine")
    cfg = yaml.safe_load((run / "config.yaml").read_text())
    cfg["train"]["lr"] = 2e-3
    other = run.parent / "other.yaml"
    other.write_text(yaml.safe_dump(cfg))
    assert main(["train", str(other), "--out", str(run), "--force"]) == 0
    capsys.readouterr()
    assert (run / "notes.txt").read_text() == "mine"
    assert (run / "plots" / "mine.png").read_text() == "mine"
    assert yaml.safe_load((run / "config.yaml").read_text())["train"]["lr"] == 2e-3


# -- one writer per folder ---------------------------------------------------------------------
_HOLD = """
import sys, time
from gpattn_ppl.run.rundir import acquire_lock
lock = acquire_lock(sys.argv[1])
print("locked", flush=True)
time.sleep(600)
"""


def test_a_second_writer_is_refused_and_a_killed_writers_lock_is_recovered(run, capsys):
    holder = subprocess.Popen([sys.executable, "-c", _HOLD, str(run)], stdout=subprocess.PIPE,
                              text=True)
    try:
        assert holder.stdout.readline().strip() == "locked"
        for argv in (["train", str(run / "config.yaml"), "--out", str(run), "--resume"],
                     ["train", str(run / "config.yaml"), "--out", str(run), "--force"],
                     ["evaluate", str(run), "--no-plots"]):
            line = cli_error(capsys, main(argv))
            tried("concurrent writers")
            assert f"is being written by process {holder.pid}" in line, line
    finally:
        holder.send_signal(signal.SIGKILL)
        holder.wait()
        holder.stdout.close()
    # the killed process's lock is gone with it
    assert main(["evaluate", str(run), "--no-plots"]) == 0
    tried("stale lock")
    capsys.readouterr()


def test_two_trainings_started_together_cannot_both_write_one_folder(tmp_path):
    """The audit's case: two ``train --out R`` 0.7 s apart with different learning rates both
    exited 0 and left a best.pt of one and a config.yaml of the other."""
    out = tmp_path / "R"
    procs = []
    for lr in (0.05, 0.001):
        cfg = copy.deepcopy(TINY)
        cfg["train"].update(epochs=2, device="cpu", lr=lr, min_lr=1e-5)
        path = tmp_path / f"lr{lr}.yaml"
        path.write_text(yaml.safe_dump(cfg))
        procs.append(subprocess.Popen([sys.executable, "-m", "gpattn_ppl.run.cli", "train",
                                       str(path), "--out", str(out)], stdout=subprocess.PIPE,
                                      stderr=subprocess.PIPE, text=True))
        time.sleep(0.7)
    results = [(p.wait(timeout=1800), p.stderr.read()) for p in procs]
    for p in procs:
        p.stdout.close()
        p.stderr.close()
    tried("concurrent writers")
    codes = sorted(code for code, _ in results)
    assert codes == [0, 2], results
    loser = next(err for code, err in results if code == 2)
    assert "is being written by process" in loser or "holds a run with a different config" \
        in loser, loser
    saved = yaml.safe_load((out / "config.yaml").read_text())["train"]["lr"]
    best = torch.load(out / "best.pt", weights_only=True)["config"]["train"]["lr"]
    assert saved == best


# -- 4. no silent wrong result: hand-edited files are checked --------------------------------
def test_config_yaml_edited_after_training_is_refused(run, capsys):
    cfg = yaml.safe_load((run / "config.yaml").read_text())
    cfg["model"]["mc_dropout"] = not cfg["model"]["mc_dropout"]
    (run / "config.yaml").write_text(yaml.safe_dump(cfg))
    line = cli_error(capsys, main(["evaluate", str(run), "--no-plots"]))
    tried("hand-edited run files")
    assert "best.pt was trained with another config" in line
    assert "model.mc_dropout" in line


@pytest.mark.parametrize("tau", [0, -1, 1e8, "x", None])
def test_a_temperature_out_of_range_is_refused_with_its_value(run, texts, capsys, tau):
    results = json.loads((run / "results.json").read_text())
    results["temperature_scaling"]["temperature"] = tau
    (run / "results.json").write_text(json.dumps(results))
    (run / "calibration.json").unlink()
    line = cli_error(capsys, main(["predict", str(run), "--input", str(texts)]))
    tried("hand-edited run files")
    assert "temperature" in line and repr(tau) in line, line


def test_calibration_json_that_disagrees_with_results_is_refused(run, texts, capsys):
    """The state a kill -9 between the two writes left before: calibration.json with a
    temperature, results.json without temperature scaling."""
    results = json.loads((run / "results.json").read_text())
    results.pop("temperature_scaling")
    (run / "results.json").write_text(json.dumps(results))
    line = cli_error(capsys, main(["predict", str(run), "--input", str(texts)]))
    tried("kill during calibration")
    assert "calibration.json" in line and "disagrees with results.json" in line
    assert main(["predict", str(run), "--input", str(texts), "--no-temperature"]) == 0
    capsys.readouterr()


def test_a_kill_between_results_and_calibration_leaves_agreeing_files(run, texts, monkeypatch,
                                                                      capsys):
    """``evaluate`` interrupted at the write of calibration.json (after results.json): the
    temperature predict applies is the one results.json reports."""
    import gpattn_ppl.run.results as results_module

    real = results_module.write_json_atomic

    def dying(obj, path):
        if Path(path).name == "calibration.json":
            raise KeyboardInterrupt
        return real(obj, path)

    monkeypatch.setattr(results_module, "write_json_atomic", dying)
    assert main(["evaluate", str(run), "--no-plots"]) == 130
    tried("kill during calibration")
    monkeypatch.undo()
    from gpattn_ppl import load_run

    tau = json.loads((run / "results.json").read_text())["temperature_scaling"]["temperature"]
    assert not (run / "calibration.json").exists()
    assert load_run(run).temperature == pytest.approx(tau)
    capsys.readouterr()


def test_corrupt_run_files_are_named_in_one_line(run, texts, capsys):
    cases = {"encoder.json": "{broken", "history.json": "[1, 2", "run.json": "{}",
             "config.yaml": "model: [\n"}
    for name, text in cases.items():
        saved = (run / name).read_bytes()
        (run / name).write_text(text)
        cmd = (["evaluate", str(run), "--no-plots"] if name == "history.json"
               else ["predict", str(run), "--input", str(texts)])
        line = cli_error(capsys, main(cmd))
        tried("corrupt run files")
        assert name in line, line
        (run / name).write_bytes(saved)


def test_a_checkpoint_of_another_model_is_named_in_one_line(run, texts, tmp_path, capsys):
    from gpattn_ppl.run.experiment import Trainer

    cfg = copy.deepcopy(TINY)
    cfg["model"]["dim"] = 24
    cfg["train"].update(epochs=1, device="cpu")
    Trainer(cfg, tmp_path / "wide").fit()
    shutil.copy(tmp_path / "wide" / "best.pt", run / "best.pt")
    line = cli_error(capsys, main(["predict", str(run), "--input", str(texts)]))
    tried("corrupt run files")
    assert "best.pt" in line


def test_warm_start_reports_what_matched_and_refuses_another_model(run, tmp_path, capsys):
    from gpattn_ppl.infer import CheckpointError
    from gpattn_ppl.run.experiment import Trainer

    cfg = copy.deepcopy(TINY)
    cfg["train"].update(epochs=1, device="cpu", init_from=str(run))
    cfg["model"]["dim"] = 24  # another width: a few tensors (biases of the head) still match
    with pytest.raises(CheckpointError, match=r"matched [1-9]\d* of \d+ tensors .* below the 50%"):
        Trainer(cfg, tmp_path / "wider")
    tried("warm start")
    assert not (tmp_path / "wider").exists()
    cfg["model"]["dim"] = 16
    res = Trainer(cfg, tmp_path / "same").fit()
    assert res["warm_start"]["share"] == 1.0 and res["warm_start"]["missing"] == 0
    # evaluate needs only the run folder: the warm-start source may be gone
    moved = tmp_path / "moved"
    shutil.move(run, moved)
    assert main(["evaluate", str(tmp_path / "same"), "--no-plots"]) == 0
    tried("warm start")
    capsys.readouterr()


def test_an_ood_set_named_like_a_split_is_refused(run, capsys):
    line = cli_error(capsys, main(["evaluate", str(run), "--ood", "test", "--no-plots"]))
    tried("ood names")
    assert "may not be named 'test'" in line


def test_a_temperature_fit_at_its_bound_warns_and_stops_there():
    from gpattn_ppl.metrics.temperature import (
        TEMPERATURE_RANGE,
        TemperatureWarning,
        fit_temperature,
    )

    # confidently wrong on half, right on half: the NLL falls all the way to tau -> infinity
    z = torch.tensor([[9.0, -9.0], [-9.0, 9.0]] * 4)
    y = torch.tensor([0, 0] * 4)
    with pytest.warns(TemperatureWarning, match="reached the bound"):
        tau = fit_temperature(z, y)
    assert tau == TEMPERATURE_RANGE[1]
    tried("temperature fit")


# -- old run folders -----------------------------------------------------------------------
def test_a_run_folder_from_before_these_rules_still_loads_and_resumes(run, texts, capsys):
    """``last.pt`` with numpy's RNG state as an ndarray (admitted by name), ``run.json`` of
    format 1 without a file list (owning the run files), no ``warm_start``."""
    state = torch.load(run / "last.pt", weights_only=True)
    random.seed(0)
    state["rng"]["numpy"] = np.random.get_state()
    torch.save(state, run / "last.pt")
    manifest = json.loads((run / "run.json").read_text())
    manifest["format"] = 1
    for key in ("files", "warm_start"):
        manifest.pop(key)
    (run / "run.json").write_text(json.dumps(manifest))
    manifest["data"]["fingerprint"] = _v1_fingerprint(run)  # the splits only, as then
    (run / "run.json").write_text(json.dumps(manifest))
    for name in ("results.json", "calibration.json"):  # an interrupted old run: resume
        (run / name).unlink()                          # evaluates it
    assert main(["predict", str(run), "--input", str(texts)]) == 0
    assert main(["train", str(run / "config.yaml"), "--out", str(run), "--resume"]) == 0
    assert main(["evaluate", str(run), "--no-plots"]) == 0
    tried("old run folders", 3)
    capsys.readouterr()


def _v1_fingerprint(run):
    from gpattn_ppl.run.assembly import load_bundle
    from gpattn_ppl.run.config import load_config

    return load_bundle(load_config(run / "config.yaml")).fingerprint_v1


def test_crafted_files_at_other_entry_points(tmp_path):
    """The library functions refuse too (not only the command line)."""
    from gpattn_ppl.infer import (
        CheckpointError,
        UnsafeCheckpointError,
        load_checkpoint,
        load_predictions,
    )
    from gpattn_ppl.run.rundir import RunFolderError

    marker = tmp_path / "pwned"
    path = tmp_path / "x.pt"
    _hostile(path, marker)
    for fn in (load_checkpoint, load_predictions):
        with pytest.raises(UnsafeCheckpointError, match="not plain data"):
            fn(path)
        tried("hostile checkpoint")
    assert not marker.exists()
    torch.save({"test": {"probs": torch.zeros(1, 2, 2)}}, path)
    with pytest.raises(CheckpointError, match="'logits' is not a 3-d tensor"):
        load_predictions(path)
    with pytest.raises(RunFolderError):
        from gpattn_ppl.run.runfolder import open_run

        open_run(tmp_path)


def test_predict_on_a_txt_drops_the_bom_and_splits_only_at_newlines(run, tmp_path, capsys):
    """4 lines with a BOM and ``\\x0c``, ``\\x85``, ``\\u2028``, ``\\x1e`` inside them: 4
    predictions (8 before), and the first text without the BOM."""
    path = tmp_path / "odd.txt"
    path.write_bytes("\ufeffThe cat sat.\nA\x0cb.\r\nC\x85d\u2028e.\nF\x1eg.\n".encode())
    assert main(["predict", str(run), "--input", str(path)]) == 0
    records = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    tried("text input", 2)
    assert [r["text"] for r in records] == ["The cat sat.", "A\x0cb.", "C\x85d\u2028e.", "F\x1eg."]
    plain = tmp_path / "plain.txt"
    plain.write_text("The cat sat.\n")
    assert main(["predict", str(run), "--input", str(plain)]) == 0
    alone = json.loads(capsys.readouterr().out)["probs"]
    assert alone == pytest.approx(records[0]["probs"], abs=1e-6)  # batch-size rounding only


def test_compare_reusing_a_folder_with_a_hostile_predictions_file_runs_nothing(tmp_path, capsys):
    """``compare`` over its own folder reuses finished runs (their results.json) and pools their
    ``predictions.pt`` for the deep ensemble: a crafted one there is refused unread."""
    cfg = copy.deepcopy(TINY)
    cfg["train"].update(epochs=1, device="cpu")
    path = tmp_path / "m.yaml"
    path.write_text(yaml.safe_dump(cfg))
    argv = ["compare", str(path), "--seeds", "0", "1", "--ensemble", "2", "--out",
            str(tmp_path / "cmp"), "--no-progress", "--no-plots"]
    assert main(argv) == 0
    capsys.readouterr()
    marker = tmp_path / "pwned"
    victim = tmp_path / "cmp" / "m" / "seed1" / "predictions.pt"
    _hostile(victim, marker, torch.load(victim, weights_only=True))
    line = cli_error(capsys, main(argv))
    tried("hostile checkpoint")
    assert f"refused {victim}" in line and not marker.exists()
