"""Shift and OOD tables over runs (CIFAR-10-C summaries, every detector, severity plots), and
deep ensembles over unlabelled OOD sets."""

import pytest
import torch

from gpattn_ppl.ood import CGPT_CATEGORIES
from gpattn_ppl.run.shift_report import (
    format_ood_markdown,
    format_paired_markdown,
    format_shift_markdown,
    ood_rows,
    paired_rows,
    severity_plots,
    shift_rows,
)

ALL_TYPES = sorted({n for v in CGPT_CATEGORIES.values() for n in v} | {"glass_blur"})


def fake_run(offset: float, ts: bool = False) -> dict:
    """Accuracy 0.9 - 0.1 s + offset on every corruption at severity s (glass blur: 0, which
    only the 15-type mean sees); detection AUROC 0.6 + offset on the far-OOD sets, 0.5 + s/10
    on the severity-s sets."""
    ood = {"digits": {"classification": None,
                      "detection": {"max_softmax": {"auroc": 0.6 + offset, "aupr_in": 0.5,
                                                    "aupr_out": 0.4, "fpr95": 0.9},
                                    "mutual_info": {"auroc": 0.7, "aupr_in": 0.6,
                                                    "aupr_out": 0.5, "fpr95": 0.8}}}}
    for name in ALL_TYPES:
        for s in range(1, 6):
            acc = 0.0 if name == "glass_blur" else 0.9 - 0.1 * s + offset
            ood[f"cifar10c:{name}:{s}"] = {
                "classification": {"acc": acc, "nll": float(s), "ece": 0.01 * s, "brier": 0.1,
                                   "aurc": 0.2},
                "detection": {"max_softmax": {"auroc": 0.5 + s / 10, "aupr_in": 0.5,
                                              "aupr_out": 0.5, "fpr95": 0.5}}}
    r = {"test": {"acc": 0.95 + offset, "nll": 0.2, "ece": 0.01, "brier": 0.1, "aurc": 0.05},
         "ood": ood}
    if ts:
        r["ts"] = {"test": {**r["test"], "nll": 0.1},
                   "ood": {k: {**v, "classification": v["classification"] and {
                       **v["classification"], "nll": 0.5}} for k, v in ood.items()}}
    return r


def test_shift_rows_average_over_runs_and_add_ts_rows():
    rows = shift_rows({"unit": [fake_run(0.0, ts=True), fake_run(0.02, ts=True)]})
    assert [r["method"] for r in rows] == ["unit", "unit + TS"]
    unit, ts = rows
    # 15-type mean: glass blur (acc 0) is one of the 15; severities average 0.6 (+ offset)
    expect = (14 * 0.6 + 0.0) / 15
    assert unit["mean"]["acc"][0] == pytest.approx(expect + 0.01 * 14 / 15)
    assert unit["mean"]["acc"][1] == pytest.approx(0.02 * 14 / 15 / 2 ** 0.5)
    # CGPT's 18 types exclude glass blur: every category averages 0.6 + offset
    for cat in (*CGPT_CATEGORIES, "avg"):
        assert unit["categories"][cat]["acc"][0] == pytest.approx(0.61)
    assert unit["by_severity"][0]["acc"][0] == pytest.approx(0.96)          # clean test
    assert unit["by_severity"][5]["nll"][0] == pytest.approx(5.0)
    assert ts["mean"]["nll"][0] == pytest.approx(0.5) and unit["missing"] == []
    table = format_shift_markdown(rows)
    assert "| unit + TS | 2 | 0.960 ± 0.014 |" in table
    assert "| unit | acc | 0.610 ± 0.014 |" in table


def test_ood_rows_every_detector_patterns_and_errors():
    runs = {"unit": [fake_run(0.0), fake_run(0.1)]}
    rows = ood_rows(runs, ["digits"])
    assert [r["detector"] for r in rows] == ["max_softmax", "mutual_info"]
    assert rows[0]["auroc"][0] == pytest.approx(0.65)
    # a pattern is one set: the mean over its matches (severity 5: 0.5 + 0.5)
    (row,) = ood_rows(runs, ["digits", "cifar10c:*:5"])            # MI is not on the C sets
    assert row["per_set"]["cifar10c:*:5"][0] == pytest.approx(1.0)
    assert row["auroc"][0] == pytest.approx((0.65 + 1.0) / 2)
    assert "| unit | max_softmax | 0.825 ± 0.035 |" in format_ood_markdown([row])
    with pytest.raises(ValueError, match="no OOD set 'svhn'"):
        ood_rows(runs, ["svhn"])


def test_severity_plots_write_one_png_per_metric(tmp_path):
    rows = shift_rows({"a": [fake_run(0.0)], "b": [fake_run(0.05)]})
    paths = severity_plots(rows, tmp_path, metrics=("acc", "ece"))
    assert [p.name for p in paths] == ["acc_vs_severity.png", "ece_vs_severity.png"]
    assert all(p.stat().st_size > 1000 for p in paths)


def test_deep_ensembles_skip_classification_on_unlabelled_sets(tmp_path):
    from gpattn_ppl.run.compare import ensemble_results

    g = torch.Generator().manual_seed(0)
    dirs = []
    for m in range(2):
        preds = {}
        for name, labels in (("test", torch.arange(6) % 3), ("val", torch.arange(6) % 3),
                             ("noise", torch.full((4,), -1)), ("shift", torch.arange(4) % 3)):
            logits = torch.randn(2, len(labels), 3, generator=g)
            preds[name] = {"probs": logits.softmax(-1), "logits": logits, "labels": labels}
        d = tmp_path / f"m{m}"
        d.mkdir()
        torch.save(preds, d / "predictions.pt")
        dirs.append(d)
    out = ensemble_results(dirs, {"eval": {"metrics": None}})
    assert out["ood"]["noise"]["classification"] is None
    assert 0 <= out["ood"]["shift"]["classification"]["acc"] <= 1
    assert set(out["ood"]["noise"]["detection"]) == {"max_softmax", "entropy"}


def test_paired_rows_difference_seed_by_seed_against_softmax_and_its_ts_row():
    runs = {"softmax": [fake_run(0.0, ts=True), fake_run(0.02, ts=True)],
            "deep ensemble (2)": [fake_run(0.1)],
            "unit": [fake_run(0.01), fake_run(0.01)],
            "short": [fake_run(0.05)]}                  # one run against two: not paired
    rows = paired_rows(runs)
    assert [(r["method"], r["reference"]) for r in rows] == [("unit", "softmax"),
                                                            ("unit", "softmax + TS")]
    plain, ts = rows
    # clean accuracy 0.95 + offset: unit - softmax = +0.01 on seed 0, -0.01 on seed 1
    assert plain["diffs"][("clean", "acc")] == pytest.approx([0.01, -0.01])
    # the 15 x 5 mean moves by 14/15 of the offset (glass blur stays at 0)
    assert plain["diffs"][("shift", "acc")] == pytest.approx([0.01 * 14 / 15, -0.01 * 14 / 15])
    assert plain["diffs"][("shift", "nll")] == pytest.approx([0.0, 0.0])
    # against softmax + TS: its shift NLL is 0.5 against the unit's mean severity 3.0
    assert ts["diffs"][("shift", "nll")] == pytest.approx([2.5, 2.5])
    assert ts["diffs"][("clean", "nll")] == pytest.approx([0.1, 0.1])
    table = format_paired_markdown(rows)
    # better = higher accuracy (1 of 2 seeds), lower NLL (none of 2 against the TS row)
    assert "| unit | softmax | +0.000 [-0.010, +0.010] 1/2 |" in table
    assert "| unit | softmax + TS | +0.000 [-0.010, +0.010] 1/2 | +0.100 [+0.100, +0.100] 0/2 |" \
        in table
    with pytest.raises(ValueError, match="no runs of the reference 'softmax'"):
        paired_rows({"unit": runs["unit"]})
    assert "no paired comparison" in format_paired_markdown([])
