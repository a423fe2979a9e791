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


def test_restricted_auroc_rescores_saved_predictions(tmp_path):
    # test: two long confident examples and one short unsure one; OOD: two unsure ones
    test_probs = torch.tensor([[[0.9, 0.1], [0.95, 0.05], [0.6, 0.4]]]).repeat(2, 1, 1)
    ood_probs = torch.tensor([[[0.7, 0.3], [0.5, 0.5]]]).repeat(2, 1, 1)
    torch.save({"test": {"probs": test_probs, "logits": test_probs.log()},
                "cr": {"probs": ood_probs, "logits": ood_probs.log()}}, tmp_path / "predictions.pt")
    r = _module().restricted_auroc(tmp_path, torch.tensor([100, 90, 10]), "cr", [50])
    assert r["max_softmax"]["all"] == pytest.approx(5 / 6)   # 0.6 beats only 0.5
    assert r["max_softmax"][50] == pytest.approx(1 / 2)      # the short example alone
    assert r["mutual_info"]["all"] == pytest.approx(0.5)     # equal passes: MI 0 everywhere
    with pytest.raises(ValueError, match="3 test predictions but 2 test lengths"):
        _module().restricted_auroc(tmp_path, torch.tensor([100, 90]), "cr", [50])


def test_runs_without_predictions_are_refused_before_the_data_loads(tmp_path, capsys):
    (tmp_path / "done").mkdir()
    (tmp_path / "done" / "predictions.pt").write_bytes(b"")
    (tmp_path / "training").mkdir()
    with pytest.raises(SystemExit):
        _module().main(["no-such-config.yaml", "--runs", str(tmp_path / "done"),
                        str(tmp_path / "training")])
    err = capsys.readouterr().err
    assert f"no predictions.pt in {tmp_path / 'training'}" in err
    assert str(tmp_path / "done") + "," not in err          # only the unfinished one is named
