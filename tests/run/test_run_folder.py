"""Run folders never lie: the check before any write, the differing keys named, --force."""

import os

import pytest
import yaml

from gpattn_ppl.run.config import load_config
from gpattn_ppl.run.rundir import (
    RUN_FILES,
    RunFolderError,
    check_run_folder,
    clear_run_files,
    config_differences,
    holds_run,
    read_manifest,
    write_json_atomic,
)


def _manifest(**extra):
    return {"format": 2, "gpattn_ppl": "0.1.0", "sizes": {"num_classes": 2,
            "input_kind": "tokens", "vocab_size": 10, "feature_dim": None},
            "classes": ["a", "b"], "data": {"name": "cola", "fingerprint": "f" * 64,
                                           "split_sizes": {"train": 4}}, "plugins": [], **extra}


def _run(folder, cfg):
    folder.mkdir(parents=True, exist_ok=True)
    write_json_atomic(_manifest(files=list(RUN_FILES)), folder / "run.json")
    (folder / "config.yaml").write_text(yaml.safe_dump(dict(cfg)))
    return folder


def test_new_folder_and_folder_without_run_files_are_new(tmp_path):
    cfg = load_config({})
    assert check_run_folder(tmp_path / "absent", cfg) == "new"
    (tmp_path / "other").mkdir()
    (tmp_path / "other" / "notes.txt").write_text("mine")
    assert check_run_folder(tmp_path / "other", cfg) == "new"
    assert not holds_run(tmp_path / "other")


def test_a_different_config_is_refused_naming_every_differing_key(tmp_path):
    run = _run(tmp_path / "run", load_config({}))
    new = load_config({}, ["train.lr=0.1", "data.max_len=16"])
    for resume in (False, True):
        with pytest.raises(RunFolderError) as err:
            check_run_folder(run, new, resume=resume)
        msg = str(err.value)
        assert "train.lr: 0.0005 (run) != 0.1 (now)" in msg
        assert "data.max_len: 64 (run) != 16 (now)" in msg and "2 keys differ" in msg
        assert "--force" in msg and len(msg.splitlines()) == 2  # one line, one hint line
    assert check_run_folder(run, new, force=True) == "fresh"


def test_the_same_config_needs_resume_and_ignores_progress_and_device(tmp_path):
    cfg = load_config({})
    run = _run(tmp_path / "run", cfg)
    with pytest.raises(RunFolderError, match="already holds a run with this config\nhint: use --resume"):
        check_run_folder(run, cfg)
    same = load_config({}, ["train.progress=false", "train.device=cpu"])
    assert check_run_folder(run, same, resume=True) == "resume"
    with pytest.raises(RunFolderError, match="exclude each other"):
        check_run_folder(run, cfg, resume=True, force=True)


def test_run_files_without_manifest_or_config_or_with_an_invalid_config_are_refused(tmp_path):
    cfg = load_config({})
    (tmp_path / "a").mkdir()
    (tmp_path / "a" / "last.pt").write_bytes(b"x")
    for flags in ({"resume": True}, {"force": True}, {}):  # foreign: even --force keeps it
        with pytest.raises(RunFolderError, match="no valid gpattn_ppl manifest"):
            check_run_folder(tmp_path / "a", cfg, **flags)
    assert (tmp_path / "a" / "last.pt").read_bytes() == b"x"
    write_json_atomic(_manifest(), tmp_path / "a" / "run.json")
    with pytest.raises(RunFolderError, match="no config.yaml"):
        check_run_folder(tmp_path / "a", cfg)
    assert check_run_folder(tmp_path / "a", cfg, resume=True) == "resume"  # never started
    run = tmp_path / "b"
    run.mkdir()
    write_json_atomic(_manifest(), run / "run.json")
    (run / "config.yaml").write_text("train: {lr: fast}\n")
    with pytest.raises(RunFolderError, match="not valid for this version"):
        check_run_folder(run, cfg, resume=True)
    (tmp_path / "file").write_text("x")
    with pytest.raises(RunFolderError, match="not a folder"):
        check_run_folder(tmp_path / "file", cfg)


def test_config_differences_lists_absent_keys():
    assert config_differences({"a": {"b": 1}}, {"a": {"b": 1}}) == []
    diff = config_differences({"a": {"b": 1}}, {"a": {"c": 2}})
    assert diff == ["a.b: 1 (run) != '<absent>' (now)", "a.c: '<absent>' (run) != 2 (now)"]


def test_clear_run_files_removes_only_what_the_manifest_lists(tmp_path):
    for name in RUN_FILES:
        (tmp_path / name).write_text("x")
    write_json_atomic(_manifest(files=[*RUN_FILES, "plots/a.png"]), tmp_path / "run.json")
    (tmp_path / ".last.pt.abc.tmp").write_text("x")
    (tmp_path / "plots").mkdir()
    (tmp_path / "plots" / "a.png").write_text("x")
    (tmp_path / "mine.txt").write_text("keep")
    clear_run_files(tmp_path)
    assert sorted(os.listdir(tmp_path)) == ["mine.txt"]
    # a user's own plot beside the run's: the folder stays, with it
    for name in RUN_FILES:
        (tmp_path / name).write_text("x")
    write_json_atomic(_manifest(files=[*RUN_FILES, "plots/a.png"]), tmp_path / "run.json")
    (tmp_path / "plots").mkdir()
    (tmp_path / "plots" / "a.png").write_text("x")
    (tmp_path / "plots" / "mine.png").write_text("keep")
    clear_run_files(tmp_path)
    assert sorted(os.listdir(tmp_path)) == ["mine.txt", "plots"]
    assert os.listdir(tmp_path / "plots") == ["mine.png"]


def test_manifest_errors_and_strict_atomic_json(tmp_path):
    with pytest.raises(RunFolderError, match="not a run folder"):
        read_manifest(tmp_path)
    (tmp_path / "config.yaml").write_text("{}")
    with pytest.raises(RunFolderError, match="no run.json"):
        read_manifest(tmp_path)
    (tmp_path / "run.json").write_text("{broken")
    with pytest.raises(RunFolderError, match="corrupt"):
        read_manifest(tmp_path)
    write_json_atomic({"x": float("nan"), "y": [float("inf"), 1.5]}, tmp_path / "run.json")
    assert (tmp_path / "run.json").read_text() == '{\n "x": null,\n "y": [\n  null,\n  1.5\n ]\n}\n'
    with pytest.raises(RunFolderError, match="format must be a positive integer"):
        read_manifest(tmp_path)
    write_json_atomic(_manifest(), tmp_path / "run.json")
    assert read_manifest(tmp_path) == _manifest()
    assert not list(tmp_path.glob(".*.tmp"))


# -- under faults: changed data, orphaned temporaries ------------------------------------------
def _csv_run(tmp_path):
    import csv

    words = ["good", "bad", "fine", "poor", "great", "awful", "nice", "dull"]
    with open(tmp_path / "train.csv", "w", newline="") as fh:
        w = csv.writer(fh)
        w.writerow(["text", "label"])
        for i in range(60):
            w.writerow([f"{words[i % 8]} {words[(i * 3) % 8]} day", "odd" if i % 2 else "even"])
    return {"model": {"dim": 16, "depth": 1, "heads": 2, "mlp_dim": 16, "max_len": 8},
            "data": {"name": "csv", "train_file": str(tmp_path / "train.csv"), "max_len": 8,
                     "batch_size": 16},
            "train": {"epochs": 1, "warmup_epochs": 0, "progress": False},
            "eval": {"mc_samples": 2}}


def test_changed_data_is_refused_on_resume_and_evaluate_unless_allowed(tmp_path):
    from gpattn_ppl.run.cli import main
    from gpattn_ppl.run.experiment import Trainer, evaluate_run

    cfg = _csv_run(tmp_path)
    first = Trainer(cfg, tmp_path / "run").fit()
    text = (tmp_path / "train.csv").read_text().splitlines()
    text[5] = text[5].replace("even", "odd") if "even" in text[5] else text[5].replace("odd", "even")
    (tmp_path / "train.csv").write_text("\n".join(text) + "\n")
    with pytest.raises(RunFolderError, match="the data changed since this run was trained"):
        Trainer(cfg, tmp_path / "run", resume=True)
    with pytest.raises(RunFolderError, match="--allow-changed-data"):
        evaluate_run(tmp_path / "run")
    assert main(["evaluate", str(tmp_path / "run"), "--no-plots"]) == 2
    res = evaluate_run(tmp_path / "run", allow_changed_data=True)
    assert any("evaluated on changed data" in w for w in res["warnings"])
    assert res["best_epoch"] == first["best_epoch"]


def test_orphaned_temporaries_are_removed_when_a_run_starts(tmp_path):
    from gpattn_ppl.run.experiment import Trainer

    cfg = _csv_run(tmp_path)
    Trainer(cfg, tmp_path / "run").fit()
    orphan = tmp_path / "run" / ".last.pt.k1ll3d.tmp"
    orphan.write_bytes(b"partial")
    Trainer(cfg, tmp_path / "run", resume=True).fit()
    assert not orphan.exists()
