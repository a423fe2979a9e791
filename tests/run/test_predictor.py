"""Predict with a trained run: load_run restores model, encoder, classes and temperature."""

import json

import pytest
import torch
import yaml

from gpattn_ppl import load_run
from gpattn_ppl.metrics import PREDICTION_KEYS
from gpattn_ppl.run.cli import main
from gpattn_ppl.run.experiment import Trainer
from gpattn_ppl.run.predictor import read_inputs
from gpattn_ppl.run.rundir import RunFolderError

FIELDS = ["text", "label", "score", "probs", "entropy", "mutual_info"]


# -- reading inputs ----------------------------------------------------------------------------
def test_read_inputs_formats(tmp_path):
    (tmp_path / "a.txt").write_text("one sentence\n\n  two  \n")
    assert read_inputs(tmp_path / "a.txt") == ["one sentence", "two"]
    (tmp_path / "a.csv").write_text('id,text\n1,"hello, world"\n2,"multi\nline"\n')
    assert read_inputs(tmp_path / "a.csv") == ["hello, world", "multi\nline"]
    (tmp_path / "a.tsv").write_text("sentence\tx\nhi there\t1\n")
    assert read_inputs(tmp_path / "a.tsv", "sentence") == ["hi there"]
    (tmp_path / "a.jsonl").write_text('{"text": "a"}\n\n{"text": "b", "y": 1}\n')
    assert read_inputs(tmp_path / "a.jsonl") == ["a", "b"]


@pytest.mark.parametrize("name, content, message", [
    ("b.csv", "id,text\n1,ok\n2\n", r"b.csv, line 3: expected 2 fields"),
    ("c.csv", "id,sentence\n1,ok\n", r"c.csv, line 1: no column 'text' in the header"),
    ("d.csv", "id,text\n1,ok\n2,  \n", r"d.csv, line 3, column 'text': the text is empty"),
    ("e.jsonl", '{"text": "a"}\n{"text": \n', r"e.jsonl, line 2: invalid JSON"),
    ("f.jsonl", '{"text": "a"}\n{"txt": "b"}\n', r"f.jsonl, line 2: no key 'text'"),
    ("g.json", "[]", r"unknown file type '.json'"),
    ("h.csv", "", r"h.csv: empty file"),
])
def test_read_inputs_errors_name_file_and_line(tmp_path, name, content, message):
    (tmp_path / name).write_text(content)
    with pytest.raises(ValueError, match=message):
        read_inputs(tmp_path / name)


def test_read_inputs_bad_utf8_and_missing_file(tmp_path):
    (tmp_path / "x.txt").write_bytes(b"fine\nbad \xff byte\n")
    with pytest.raises(ValueError, match=r"x.txt, line 2: not valid UTF-8"):
        read_inputs(tmp_path / "x.txt")
    with pytest.raises(FileNotFoundError, match="no such file"):
        read_inputs(tmp_path / "none.txt")


# -- a trained run -----------------------------------------------------------------------------
@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    """A tiny CoLA run evaluated on the whole (official) test file, with temperature scaling."""
    from tests.run.conftest import TINY

    cfg = json.loads(json.dumps(TINY))
    cfg["train"]["epochs"] = 1
    cfg["data"]["limit_eval"] = None
    cfg["eval"]["temperature_scaling"] = True
    run = tmp_path_factory.mktemp("pred") / "run"
    Trainer(cfg, run).fit()
    return run


def test_predictions_match_the_evaluated_test_set(trained):
    from gpattn_ppl.data import read_cola

    texts, labels = read_cola()["in_domain_dev"]
    saved = torch.load(trained / "predictions.pt", weights_only=False)["test"]
    assert torch.equal(saved["labels"], labels)
    tau = json.loads((trained / "calibration.json").read_text())["temperature"]
    predictor = load_run(trained)
    assert predictor.temperature == tau and predictor.classes == ["unacceptable", "acceptable"]
    probs = predictor.predict_proba(texts[:40])
    expected = torch.softmax(saved["logits"][:, :40].double() / tau, -1)
    torch.testing.assert_close(probs, expected, atol=1e-5, rtol=0)
    raw = load_run(trained, temperature=False)
    assert raw.temperature == 1.0
    torch.testing.assert_close(raw.predict_proba(texts[:40]), saved["probs"][:, :40],
                               atol=1e-5, rtol=0)


def test_records_are_consistent(trained):
    records = load_run(trained).predict(["The cat sat on the mat.", "Mat the on sat cat the."])
    for r in records:
        assert list(r) == ["label", "score", "probs", "entropy", "mutual_info"]
        assert tuple(r) == PREDICTION_KEYS       # the one schema (gpattn_ppl.metrics.records)
        p = torch.tensor(list(r["probs"].values()), dtype=torch.float64)
        assert abs(float(p.sum()) - 1) < 1e-9
        assert r["label"] == max(r["probs"], key=r["probs"].get)
        assert r["score"] == pytest.approx(float(p.max()))
        assert r["entropy"] == pytest.approx(float(-(p * p.log()).sum()))
        assert r["mutual_info"] is None  # softmax is deterministic: one pass


def test_stochastic_run_mutual_information_and_seeding(tmp_path):
    from tests.run.conftest import TINY

    cfg = json.loads(json.dumps(TINY))
    cfg["train"]["epochs"] = 1
    cfg["model"]["mc_dropout"] = True
    cfg["model"]["dropout"] = 0.3
    trained = Trainer(cfg, tmp_path / "mc").fit()
    # the evaluation's MC passes are seeded: a later evaluate gives the numbers train printed
    from gpattn_ppl.run.experiment import evaluate_run

    assert evaluate_run(tmp_path / "mc")["test"] == trained["test"]
    predictor = load_run(tmp_path / "mc")
    texts = ["The cat sat on the mat.", "Mat the on sat cat the.", "Who did you see?"]
    p = predictor.predict_proba(texts, samples=8)
    assert p.shape == (8, 3, 2) and not torch.allclose(p[0], p[1])
    a, b = predictor.predict(texts, samples=8), predictor.predict(texts, samples=8)
    assert a == b  # seeded
    assert predictor.predict(texts, samples=8, seed=1) != a
    for r, pt in zip(a, p.unbind(1)):
        mean = pt.mean(0)
        h = float(-(mean * mean.log()).sum())
        eh = float(-(pt * pt.log()).sum(-1).mean())
        assert r["mutual_info"] == pytest.approx(h - eh, abs=1e-9) and r["mutual_info"] > 0
    # the mean predictive: one pass with dropout off, whatever the seed; MC dropout stays on
    m = predictor.predict_proba(texts, mean=True)
    assert m.shape == (1, 3, 2) and torch.equal(m, predictor.predict_proba(texts, mean=True, seed=1))
    assert all(r["mutual_info"] is None for r in predictor.predict(texts, mean=True))
    with pytest.raises(ValueError, match="one pass"):
        predictor.predict_proba(texts, mean=True, samples=4)
    predictor.config["eval"]["predictive"] = "mean"       # a run whose default is the mean
    assert predictor.predict_proba(texts).shape == (1, 3, 2)
    assert predictor.predict_proba(texts, samples=4).shape == (4, 3, 2)   # asked-for draws
    predictor.config["eval"]["predictive"] = "mc"
    assert predictor.program.net.mc_dropout
    predictor.program.net.set_mc_dropout(False)
    torch.testing.assert_close(predictor.predict_proba(texts), m, rtol=0, atol=0)
    predictor.program.net.set_mc_dropout(True)
    inp = tmp_path / "in.txt"
    inp.write_text("\n".join(texts) + "\n")
    assert main(["predict", str(tmp_path / "mc"), "--input", str(inp), "--mean",
                 "--samples", "4"]) == 2
    out = tmp_path / "mean.jsonl"
    assert main(["predict", str(tmp_path / "mc"), "--input", str(inp), "--mean", "--out",
                 str(out)]) == 0
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    assert [r["probs"] for r in rows] == [r["probs"] for r in predictor.predict(texts, mean=True)]


def test_load_run_errors(tmp_path, trained):
    with pytest.raises(RunFolderError, match="not a run folder"):
        load_run(tmp_path)
    predictor = load_run(trained)
    with pytest.raises(TypeError, match="list of texts"):
        predictor.predict("one string")
    with pytest.raises(ValueError, match="empty"):
        predictor.predict([])


def test_cli_predict_writes_json_lines(trained, tmp_path, capsys):
    inp = tmp_path / "new.csv"
    inp.write_text("sentence\nThe book was read by John.\nJohn book the read.\n")
    out = tmp_path / "preds.jsonl"
    assert main(["predict", str(trained), "--input", str(inp), "--text-column", "sentence",
                 "--out", str(out)]) == 0
    lines = out.read_text().splitlines()
    assert len(lines) == 2
    rows = [json.loads(line) for line in lines]
    assert [list(r) for r in rows] == [FIELDS, FIELDS]
    assert rows[0]["text"] == "The book was read by John."
    assert main(["predict", str(trained), "--input", str(inp), "--text-column", "sentence"]) == 0
    printed = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert printed == rows
    assert main(["predict", str(trained), "--input", str(tmp_path / "no.txt")]) == 2
    assert "no such file" in capsys.readouterr().err
    assert yaml.safe_load((trained / "config.yaml").read_text())["model"]["num_classes"] is None
    assert json.loads((trained / "run.json").read_text())["sizes"]["num_classes"] == 2
