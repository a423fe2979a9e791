"""The sweep (``demo --all-units``) at smoke size: both tasks' tables, plots and verdicts; runs
in --out refused by default, --resume re-uses them, --force retrains them. The main job (the
fine-tuned recipe) is tests/run/test_demo_recipe.py."""

import pytest

from gpattn_ppl.run.sweep import DEMO_TASKS, demo_methods, laplace_available, verdict
from gpattn_ppl.run.sweep import run_sweep as run_demo


def test_every_registered_kind_is_in_the_demo():
    from gpattn_ppl.attention import ATTENTION

    kinds = set()
    for patch in demo_methods().values():
        kinds |= {patch["attention"]["kind"]} | {o["attention"]["kind"]
                                                for o in patch.get("overrides", [])}
    assert kinds == set(ATTENTION)
    assert demo_methods()["sngp"]["head"] == "sngp"      # the baselines beside the units


def test_smoke_demo_writes_outputs_and_refuses_or_retrains_existing_runs(tmp_path):
    from gpattn_ppl.run.rundir import RunFolderError

    out = run_demo(tmp_path, smoke=True, methods=["softmax", "sngp"], progress=False)
    assert out.count("| softmax | 1 |") == 2 and out.count("| sngp | 1 |") == 2
    assert ("| softmax + LLA | 1 |" in out) == laplace_available()
    for task in DEMO_TASKS:
        for name in ("results.md", "results.csv", "reliability.png", "risk_coverage.png"):
            assert (tmp_path / task / name).stat().st_size > 0
        assert f"{task}: Beat softmax + TS (" in out       # one verdict per task and reference
    assert "ood_oos_max_softmax_roc.png" in out
    stale = tmp_path / "cola" / "softmax" / "seed0" / "stale_marker"
    stale.write_text("from an earlier run")
    run_demo(tmp_path, smoke=True, methods=["softmax"], progress=False, resume=True)
    assert stale.exists()  # --resume re-uses the finished run folder
    with pytest.raises(RunFolderError, match="--resume.*--force"):
        run_demo(tmp_path, smoke=True, methods=["softmax"], progress=False)
    assert stale.exists()  # the default refuses a folder holding runs and deletes nothing
    results = tmp_path / "cola" / "softmax" / "seed0" / "results.json"
    results.write_text("{}")
    run_demo(tmp_path, smoke=True, methods=["softmax"], progress=False, force=True)
    assert results.read_text() != "{}"  # --force retrains ...
    assert stale.exists()  # ... removing only the run's own files


def test_unknown_demo_method_or_task_is_named(tmp_path):
    with pytest.raises(ValueError, match="no_such_unit"):
        run_demo(tmp_path, smoke=True, methods=["no_such_unit"], progress=False)
    with pytest.raises(ValueError, match="task.*imdb.*available: cola, clinc150_slice"):
        run_demo(tmp_path, smoke=True, tasks=["imdb"], progress=False)
    with pytest.raises(ValueError, match="more than once: cola"):
        run_demo(tmp_path, smoke=True, tasks=["cola", "cola"], progress=False)
    assert not any(tmp_path.iterdir())


def _row(method, nll, ece, auroc):
    return {"method": method, "NLL": (nll, None), "ECE": (ece, None),
            "OOD AUROC (MSP)": (auroc, None)}


def test_verdict_names_who_beats_each_reference_on_each_metric():
    rows = [_row("softmax", 0.60, 0.05, 0.80), _row("softmax + TS", 0.50, 0.02, 0.79),
            _row("softmax + LLA", 0.55, 0.03, 0.81), _row("a", 0.40, 0.01, 0.90),
            _row("b", 0.52, 0.01, 0.85), _row("c", 0.45, None, 0.70)]
    ts, lla = verdict(rows)
    assert ts.startswith("Beat softmax + TS (NLL 0.500, ECE 0.020, OOD AUROC 0.790) on NLL, ECE "
                         "and OOD AUROC together: a.")
    assert "NLL: a, c; ECE: a, b; OOD AUROC: a, b." in ts    # c's missing ECE is not a win
    assert "together: a, b. On each alone -- NLL: a, b, c; ECE: a, b; OOD AUROC: a, b." in lla
    assert verdict(rows[:1] + rows[3:]) == []                 # no reference row: no sentence
    assert len(verdict([r for r in rows if r["method"] != "softmax + LLA"])) == 1
