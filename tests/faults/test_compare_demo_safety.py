"""``compare`` and ``demo`` check everything before they write anything, and never overwrite or
delete what they did not write: a missing or bad config, a bad, repeated or out-of-range seed, an
impossible ``--ensemble``, colliding method names, a run folder holding another config, a user's
``results.md`` / figure / ``compare.json`` in ``--out``: one ``error:`` line, exit 2, nothing
written. ``demo`` refuses a folder holding runs unless ``--resume`` or ``--force``; ``--force``
removes only each run's own files."""

from __future__ import annotations

import json

import pytest
import yaml

from gpattn_ppl.run.cli import main

from .conftest import cli_error, tried


def _compare(*args) -> int:
    return main(["compare", *map(str, args), "--no-progress"])


def _bad_yaml(tmp_path, name="bad.yaml"):
    path = tmp_path / name
    path.write_text(yaml.safe_dump({"model": {"dim": -4}}))
    return path


def _snapshot(folder):
    return {p.relative_to(folder).as_posix(): p.read_bytes()
            for p in sorted(folder.rglob("*")) if p.is_file()}


# -- compare: nothing written before every config, file and seed is checked --------------------
@pytest.mark.parametrize("case", ["missing", "bad", "ood"])
def test_compare_with_a_bad_second_config_writes_nothing(tmp_path, tiny_yaml, capsys, case):
    tried("compare")
    if case == "missing":
        second = tmp_path / "missing.yaml"
    elif case == "bad":
        second = _bad_yaml(tmp_path)
    else:  # an OOD set the dataset does not have: found when the data are loaded, before training
        cfg = yaml.safe_load(tiny_yaml.read_text())
        cfg["eval"]["ood"] = ["no_such_set"]
        second = tmp_path / "ood.yaml"
        second.write_text(yaml.safe_dump(cfg))
    out = tmp_path / "cmp"
    line = cli_error(capsys, _compare(tiny_yaml, second, "--seeds", "0", "--out", out))
    assert {"missing": "missing.yaml", "bad": "bad.yaml: model.dim",
            "ood": "no_such_set"}[case] in line
    assert not out.exists()


@pytest.mark.parametrize("seeds, message", [
    (["0", "-1"], "-1 is out of range"),
    (["0", str(2**32)], "4294967296 is out of range"),
    (["0", "0"], "0 (2 times)"),
    (["3", "1", "3", "3"], "3 (3 times)"),
])
def test_compare_refuses_bad_or_repeated_seeds_before_writing(tmp_path, tiny_yaml, capsys,
                                                              seeds, message):
    tried("compare")
    out = tmp_path / "cmp"
    line = cli_error(capsys, _compare(tiny_yaml, "--seeds", *seeds, "--out", out))
    assert message in line
    assert not out.exists()


@pytest.mark.parametrize("k, message", [("1", "at least 2"), ("-2", "at least 2"),
                                        ("3", "need at least 3 seeds; 2 given")])
def test_compare_refuses_an_impossible_ensemble_before_training(tmp_path, tiny_yaml, capsys, k,
                                                                message):
    tried("compare")
    out = tmp_path / "cmp"
    line = cli_error(capsys, _compare(tiny_yaml, "--seeds", "0", "1", "--ensemble", k,
                                      "--out", out))
    assert message in line
    assert not out.exists()


def test_compare_refuses_colliding_method_names(tmp_path, tiny_yaml, capsys):
    tried("compare", 4)
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    a, b = tmp_path / "a" / "m.yaml", tmp_path / "b" / "m.yaml"
    a.write_text(tiny_yaml.read_text())
    b.write_text(tiny_yaml.read_text())
    out = tmp_path / "cmp"
    line = cli_error(capsys, _compare(a, b, "--seeds", "0", "--out", out))
    assert str(a) in line and str(b) in line and "rename" in line
    line = cli_error(capsys, _compare(tiny_yaml, tiny_yaml, "--seeds", "0", "--out", out))
    assert "given twice" in line
    plots = tmp_path / "plots.yaml"  # a method's folder would be the figures' folder
    plots.write_text(tiny_yaml.read_text())
    assert "own outputs" in cli_error(capsys, _compare(plots, "--seeds", "0", "--out", out))
    assert not out.exists()

    from gpattn_ppl.run.compare import run_compare
    from gpattn_ppl.run.config import ConfigError

    with pytest.raises(ConfigError, match="name the same method"):  # names differing in case
        run_compare([tiny_yaml, tiny_yaml], [0], out, names=["x", "X"], progress=False)
    assert not out.exists()


def test_compare_checks_every_run_folder_before_training_any(tmp_path, tiny_yaml, capsys):
    """seed 1's folder holds a run of another config: refused before seed 0 trains."""
    from gpattn_ppl.run.config import load_config

    tried("compare")
    out = tmp_path / "cmp"
    other = dict(load_config(tiny_yaml, ["train.seed=1", "train.lr=0.5"]))
    (out / "tiny" / "seed1").mkdir(parents=True)
    (out / "tiny" / "seed1" / "config.yaml").write_text(yaml.safe_dump(other))
    line = cli_error(capsys, _compare(tiny_yaml, "--seeds", "0", "1", "--out", out))
    assert "seed1" in line
    assert not (out / "tiny" / "seed0").exists()
    assert _snapshot(out) == {"tiny/seed1/config.yaml": yaml.safe_dump(other).encode()}


# -- compare: its own outputs only -------------------------------------------------------------
@pytest.mark.parametrize("name", ["results.md", "results.csv", "plots/reliability.png",
                                  "compare.json"])
def test_compare_keeps_a_users_file_in_out(tmp_path, tiny_yaml, capsys, name):
    tried("compare")
    out = tmp_path / "cmp"
    mine = out / name
    mine.parent.mkdir(parents=True)
    mine.write_text('{"mine": true}')
    line = cli_error(capsys, _compare(tiny_yaml, "--seeds", "0", "--out", out))
    assert name.split("/")[-1] in line and "--force" in line
    assert _snapshot(out) == {name: b'{"mine": true}'}  # nothing trained, nothing written


def test_compare_reruns_over_its_own_folder_and_force_overwrites(tmp_path, tiny_yaml, capsys):
    out = tmp_path / "cmp"
    assert _compare(tiny_yaml, "--seeds", "0", "--out", out) == 0
    manifest = json.loads((out / "compare.json").read_text())
    assert manifest["methods"] == ["tiny"] and manifest["seeds"] == [0]
    assert manifest["runs"] == ["tiny/seed0"]
    assert {"results.md", "results.csv", "plots/reliability.png"} <= set(manifest["files"])
    run = out / "tiny" / "seed0"
    best = (run / "best.pt").read_bytes()
    # the same compare again: its own tables are rewritten, the finished run reused
    assert _compare(tiny_yaml, "--seeds", "0", "--out", out) == 0
    assert (run / "best.pt").read_bytes() == best
    # an interrupted run (no results.json yet) is resumed
    (run / "results.json").unlink()
    assert _compare(tiny_yaml, "--seeds", "0", "--out", out) == 0
    assert (run / "results.json").is_file() and (run / "best.pt").read_bytes() == best
    capsys.readouterr()
    # a user's own figure next to compare's: refused; --force overwrites it
    (out / "plots" / "ood_mine.png").write_bytes(b"mine")
    tried("compare")
    assert "ood_mine.png" in cli_error(capsys, _compare(tiny_yaml, "--seeds", "0", "--out",
                                                        out))
    assert (out / "plots" / "ood_mine.png").read_bytes() == b"mine"
    notes = run / "notes.txt"
    notes.write_text("mine")
    assert _compare(tiny_yaml, "--seeds", "0", "--out", out, "--force") == 0
    assert notes.read_text() == "mine"  # --force removes only the run's own files
    assert "plots/ood_mine.png" not in json.loads((out / "compare.json").read_text())["files"]


# -- demo ---------------------------------------------------------------------------------------
@pytest.fixture
def learned(monkeypatch):
    """The demo with learned embeddings (no MiniLM features: seconds)."""
    monkeypatch.setattr("gpattn_ppl.run.sweep.demo_encoder", lambda: "learned")


def _demo(out, *flags) -> int:
    return main(["demo", "--all-units", "--smoke", "--methods", "softmax", "--tasks", "cola",
                 "--out", str(out), "--no-progress", *flags])


def test_demo_refuses_existing_runs_and_keeps_users_files(tmp_path, capsys, learned):
    from gpattn_ppl.run.sweep import run_sweep as run_demo

    out = tmp_path / "d"
    run_demo(out, smoke=True, methods=["softmax"], progress=False, tasks=["cola"])
    run = out / "cola" / "softmax" / "seed0"
    (run / "notes.txt").write_text("mine")
    (out / "notes.txt").write_text("mine")
    before = _snapshot(out)
    tried("demo")
    line = cli_error(capsys, _demo(out))
    assert str(out) in line and "cola/softmax/seed0" in line and "--resume" in line \
        and "--force" in line
    assert _snapshot(out) == before  # nothing deleted, nothing written
    tried("demo")
    with pytest.raises(SystemExit) as exit_:  # argparse: the flags exclude each other
        _demo(out, "--resume", "--force")
    assert "not allowed with" in cli_error(capsys, exit_.value.code)
    tried("demo")
    assert "more than once" in cli_error(capsys, main(["demo", "--smoke", "--methods", "softmax",
                                                       "softmax", "--out", str(out)]))
    assert _snapshot(out) == before
    assert _demo(out, "--force") == 0
    assert (run / "notes.txt").read_text() == "mine" == (out / "notes.txt").read_text()
    assert (run / "results.json").is_file()


def test_demo_keeps_a_users_results_file(tmp_path, capsys, learned):
    tried("demo", 2)
    out = tmp_path / "d"
    (out / "cola").mkdir(parents=True)
    (out / "cola" / "results.md").write_text("my table")
    line = cli_error(capsys, _demo(out))
    assert "results.md" in line and "--force" in line
    assert _snapshot(out) == {"cola/results.md": b"my table"}
    (out / "cola" / "results.md").unlink()
    (out / "cola" / "reliability.png").write_bytes(b"mine")
    assert "reliability.png" in cli_error(capsys, _demo(out))
    assert _snapshot(out) == {"cola/reliability.png": b"mine"}


def test_ci_demo_smoke_twice(tmp_path, capsys):
    """CI's ``gpattn-ppl demo --smoke --out DIR --no-progress`` (the fine-tuned recipe; here
    softmax alone): works on an empty folder; run again, it refuses without flags and works
    with --force and with --resume."""
    out = tmp_path / "x"
    assert main(["demo", "--smoke", "--out", str(out), "--no-progress",
                 "--methods", "softmax"]) == 0
    assert "| softmax + TS |" in capsys.readouterr().out
    tried("demo")
    assert "--resume" in cli_error(capsys, main(["demo", "--smoke", "--out", str(out),
                                                 "--no-progress", "--methods", "softmax"]))
    assert main(["demo", "--smoke", "--out", str(out), "--no-progress", "--methods", "softmax",
                 "--force"]) == 0
    best = (out / "softmax" / "seed0" / "best.pt").read_bytes()
    assert main(["demo", "--smoke", "--out", str(out), "--no-progress", "--methods", "softmax",
                 "--resume"]) == 0
    assert best == (out / "softmax" / "seed0" / "best.pt").read_bytes()
    assert "| softmax + TS |" in capsys.readouterr().out
