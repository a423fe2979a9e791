"""shift_summary: per set, per severity, the 15 x 5 mean and the category means."""

import pytest

from gpattn_ppl.data import CORRUPTION_CATEGORIES
from gpattn_ppl.ood import shift_summary


def fake_results(skip=()):
    ood = {"digits": {"classification": None, "detection": {}}}
    for cat, names in CORRUPTION_CATEGORIES.items():
        for name in names:
            for s in range(1, 6):
                if (name, s) in skip:
                    continue
                acc = 0.9 - 0.1 * s - (0.05 if cat == "noise" else 0.0)
                ood[f"cifar10c:{name}:{s}"] = {"classification": {"acc": acc, "nll": s,
                                                                  "ece": 0.01 * s, "brier": 0}}
    ood["cifar10c:saturate:3"] = {"classification": {"acc": 0.0, "nll": 0, "ece": 0,
                                                     "brier": 0}}           # an extra type
    return {"test": {"acc": 0.95, "nll": 0.2, "ece": 0.01, "brier": 0.1}, "ood": ood}


def test_summary_means():
    out = shift_summary(fake_results())
    assert out["by_severity"][0]["acc"] == 0.95
    n_noise = len(CORRUPTION_CATEGORIES["noise"])
    n_all = sum(len(v) for v in CORRUPTION_CATEGORIES.values())
    expect_s1 = 0.8 - 0.05 * n_noise / n_all           # the extra type is not in the means
    assert out["by_severity"][1]["acc"] == pytest.approx(expect_s1)
    assert out["mean"]["nll"] == pytest.approx(3.0)
    assert out["categories"]["noise"]["acc"] == pytest.approx(0.9 - 0.3 - 0.05)
    assert out["categories"]["blur"]["acc"] == pytest.approx(0.6)
    assert out["missing"] == []
    assert out["sets"][("saturate", 3)]["acc"] == 0.0


def test_missing_sets_are_listed_and_no_sets_is_an_error():
    out = shift_summary(fake_results(skip={("fog", 5)}))
    assert out["missing"] == [("fog", 5)]
    with pytest.raises(ValueError, match="no cifar10c"):
        shift_summary({"test": {}, "ood": {"digits": {"classification": None}}})
