"""experiments/length_ood_baseline.py: a length-only OOD detector, both directions."""

import importlib.util
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

ROOT = Path(__file__).resolve().parents[2]


def _module():
    spec = importlib.util.spec_from_file_location(
        "length_ood_baseline", ROOT / "experiments" / "length_ood_baseline.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_length_separates_long_test_from_short_ood():
    bundle = SimpleNamespace(name="toy", test=SimpleNamespace(lengths=torch.tensor([50, 60, 70, 8])),
                             ood={"short": SimpleNamespace(lengths=torch.tensor([5, 9, 10]))})
    r = _module().length_baseline(bundle)["short"]
    # ID lengths 50, 60, 70 beat every OOD length; ID 8 beats only 5: 10 of 12 pairs
    assert r["longer_is_id"]["auroc"] == pytest.approx(10 / 12)
    assert r["shorter_is_id"]["auroc"] == pytest.approx(2 / 12)
    assert r["mean_length_test"] == pytest.approx(47.0) and r["median_length_ood"] == 9


def test_images_have_no_lengths():
    bundle = SimpleNamespace(name="cifar10", test=SimpleNamespace(lengths=None), ood={})
    with pytest.raises(ValueError, match="no token lengths"):
        _module().length_baseline(bundle)
