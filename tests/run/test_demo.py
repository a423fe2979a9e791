"""The demo (main job) at smoke size: table, plots; runs in --out refused by default, --resume
re-uses them, --force retrains them."""

import pytest

from gpattn_ppl.run.demo import demo_methods, run_demo


def test_every_registered_kind_is_in_the_demo():
    from gpattn_ppl.attention import ATTENTION

    kinds = set()
    for patch in demo_methods().values():
        kinds |= {patch["attention"]["kind"]} | {o["attention"]["kind"]
                                                for o in patch.get("overrides", [])}
    assert kinds == set(ATTENTION)


def test_smoke_demo_writes_outputs_and_refuses_or_retrains_existing_runs(tmp_path):
    from gpattn_ppl.run.rundir import RunFolderError

    out = run_demo(tmp_path, smoke=True, methods=["softmax"], progress=False)
    assert "| softmax | 1 |" in out
    for name in ("results.md", "results.csv", "reliability.png", "risk_coverage.png"):
        assert (tmp_path / name).stat().st_size > 0
    stale = tmp_path / "softmax" / "seed0" / "stale_marker"
    stale.write_text("from an earlier run")
    run_demo(tmp_path, smoke=True, methods=["softmax"], progress=False, resume=True)
    assert stale.exists()  # --resume re-uses the finished run folder
    with pytest.raises(RunFolderError, match="--resume.*--force"):
        run_demo(tmp_path, smoke=True, methods=["softmax"], progress=False)
    assert stale.exists()  # the default refuses a folder holding runs and deletes nothing
    results = tmp_path / "softmax" / "seed0" / "results.json"
    results.write_text("{}")
    run_demo(tmp_path, smoke=True, methods=["softmax"], progress=False, force=True)
    assert results.read_text() != "{}"  # --force retrains ...
    assert stale.exists()  # ... removing only the run's own files


def test_unknown_demo_method_is_named(tmp_path):
    with pytest.raises(ValueError, match="no_such_unit"):
        run_demo(tmp_path, smoke=True, methods=["no_such_unit"], progress=False)
