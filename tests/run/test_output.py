"""Strict JSON: no bare NaN anywhere; one summary schema."""

import json
import math

import pytest

from gpattn_ppl.run.output import dumps, strict, summary


def test_strict_replaces_every_non_finite_float_and_keeps_the_rest():
    obj = {"a": math.nan, "b": [1.0, -math.inf, {"c": math.inf}], "d": (2, "x"), "e": None,
           "f": True, "g": 3}
    assert strict(obj) == {"a": None, "b": [1.0, None, {"c": None}], "d": [2, "x"], "e": None,
                           "f": True, "g": 3}
    text = dumps(obj)
    assert "NaN" not in text and "Infinity" not in text
    assert json.loads(text)["b"][0] == 1.0


def test_python_json_would_write_bare_nan_which_dumps_does_not():
    assert "NaN" in json.dumps({"x": math.nan})  # the bug this module exists for
    assert dumps({"x": math.nan}, indent=None) == '{"x": null}'
    with pytest.raises(ValueError):  # allow_nan=False guards anything strict() could miss
        json.dumps({"x": math.nan}, allow_nan=False)


def test_summary_has_one_schema():
    res = {"test": {"acc": 0.5, "eaurc": math.nan}, "ood": {}, "best_epoch": 2,
           "cost": {"params": 3}, "_other": 1}
    out = summary(res, "runs/x")
    assert list(out) == ["run_dir", "best_epoch", "test", "ood", "cost"]
    assert out["test"]["eaurc"] is None
    res["temperature_scaling"] = {"temperature": 1.3}
    assert "temperature_scaling" in summary(res, "runs/x")
