"""experiments/evidence.py at toy size: the rows the evidence table promises, from real runs."""

import importlib.util
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_evidence_table_rows_and_reuse(tmp_path, capsys):
    spec = importlib.util.spec_from_file_location("evidence", ROOT / "experiments" / "evidence.py")
    evidence = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(evidence)
    args = ["cola", "--out", str(tmp_path), "--seeds", "0", "--ensemble", "2",
            "--methods", "softmax", "kep_svgp", "--set", "train.epochs=1",
            "train.warmup_epochs=0", "data.limit_train=64", "data.limit_eval=32",
            "model.dim=16", "model.mlp_dim=16", "eval.mc_samples=2"]
    evidence.main(args)
    table = (tmp_path / "results.md").read_text()
    rows = [line.split(" | ")[0].lstrip("| ") for line in table.splitlines()[2:]]
    assert rows == ["softmax", "softmax + TS", "deep ensemble (2)", "kep_svgp"]
    assert (tmp_path / "softmax" / "seed1" / "results.json").exists()   # the ensemble's member
    assert "(max_softmax)" in table or "(entropy)" in table or "(energy)" in table
    per_seed = (tmp_path / "per_seed.md").read_text()
    assert "| kep_svgp | " in per_seed and "worst seed" in per_seed
    first = capsys.readouterr().out
    evidence.main(args)                       # finished runs are reused: the same table
    assert capsys.readouterr().out == first
