"""``predict``, ``explain`` and ``evaluate`` on a ``save_pretrained`` folder of a swapped Hugging
Face sequence classifier (issue 46, item 5): told from a run folder by its files, loaded by the
library's checked loaders, the same records as for a run; ``evaluate --data`` on a labelled file
or a bundled dataset. The refusals are in ``tests/faults/test_model_folders.py``."""

import json

import pytest
import torch

from gpattn_ppl.run.cli import main

transformers = pytest.importorskip("transformers")

NAMES = ("unacceptable", "acceptable")
TEXTS = ["the cat sat on the mat .", "him went store yesterday quickly", "mary seems happy ."]

# a 1e-5 jitter on a random GP unit's kernel matrix is not these tests' subject
pytestmark = pytest.mark.filterwarnings("ignore::gpattn_ppl.errors.NumericsWarning")


def save_classifier(path, kind: str | None = "sgpa", names=NAMES, *, tokenizer: bool = True,
                    head: str = "BertForSequenceClassification", seed: int = 0):
    """Save into ``path`` a tiny 2-layer BERT (width 16, 4 heads) of ``head`` with ``kind``
    swapped into its last layer (``None``: none, no swap record), its classes named ``names``
    (``None``: transformers' default ``LABEL_k``), and with ``tokenizer`` the word-piece
    tokenizer of the test words beside it. Returns ``path``."""
    from gpattn_ppl.hf import swap
    from tests.conftest import word_piece_tokenizer
    from tests.models.test_swap import SMALL

    path.mkdir(parents=True, exist_ok=True)
    size = word_piece_tokenizer(path) if tokenizer else 64
    torch.manual_seed(seed)
    labels = {} if names is None else {"id2label": dict(enumerate(names)),
                                       "label2id": {n: i for i, n in enumerate(names)}}
    cfg = transformers.BertConfig(vocab_size=size, hidden_size=16, num_hidden_layers=2,
                                  num_attention_heads=4, intermediate_size=32,
                                  max_position_embeddings=64, num_labels=2, **labels)
    model = getattr(transformers, head)(cfg).eval()
    if kind is not None:
        swap(model, kind, layers=[-1], init="random", **SMALL.get(kind, {}))
    model.save_pretrained(path)
    return path


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    return save_classifier(tmp_path_factory.mktemp("saved") / "sgpa_bert")


@pytest.fixture
def inputs(tmp_path):
    path = tmp_path / "in.txt"
    path.write_text("\n".join(TEXTS) + "\n")
    return path


def test_a_folder_is_told_from_a_run_folder(folder, tmp_path):
    from gpattn_ppl.run.saved_model import SavedModelPredictor, is_saved_model, load_predictor

    assert is_saved_model(folder)
    run = tmp_path / "run"
    run.mkdir()
    (run / "config.json").write_text("{}")
    (run / "config.yaml").write_text("model: {}\n")
    assert not is_saved_model(run)                       # a run's file: a run folder
    assert not is_saved_model(tmp_path / "nothing") and not is_saved_model(folder / "config.json")
    predictor = load_predictor(folder)
    assert isinstance(predictor, SavedModelPredictor)
    assert predictor.classes == list(NAMES) and predictor.temperature == 1.0
    assert predictor.stochastic and predictor.max_length == 64


def test_predict_on_a_folder_prints_the_records_of_the_predictor(folder, inputs, capsys,
                                                                 quiet_transformers):
    from gpattn_ppl.run.saved_model import DEFAULT_SAMPLES, load_saved_model

    assert main(["predict", str(folder), "--input", str(inputs), "--seed", "3"]) == 0
    rows = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    predictor = load_saved_model(folder)
    expected = predictor.predict(TEXTS, seed=3)          # the run folder's records, by class
    assert [r.pop("text") for r in rows] == TEXTS
    assert rows == pytest.approx(expected)
    assert list(rows[0]) == list(expected[0])
    assert all(r["mutual_info"] is not None for r in rows)  # T = DEFAULT_SAMPLES passes
    p = predictor.predict_proba(TEXTS, seed=3)
    assert p.shape == (DEFAULT_SAMPLES, 3, 2)
    torch.testing.assert_close(p.sum(-1), torch.ones(DEFAULT_SAMPLES, 3, dtype=p.dtype))
    # --mean: one pass at the posterior means; --samples: that many passes, reproducibly
    assert main(["predict", str(folder), "--input", str(inputs), "--mean"]) == 0
    mean_rows = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert all(r["mutual_info"] is None for r in mean_rows)
    assert predictor.predict_proba(TEXTS, mean=True).shape == (1, 3, 2)
    a = predictor.predict_proba(TEXTS, samples=4, seed=1, batch_size=2)
    torch.testing.assert_close(a, predictor.predict_proba(TEXTS, samples=4, seed=1,
                                                          batch_size=2))


def test_a_folder_recording_the_mean_predictive_predicts_one_pass(tmp_path, inputs, capsys,
                                                                   quiet_transformers):
    """``config.gpattn_predictive: mean`` (what the swap recommends) is the folder's default, as
    a run's ``eval.predictive``; asked-for ``--samples`` are Monte-Carlo passes."""
    folder = save_classifier(tmp_path / "mean")
    config = json.loads((folder / "config.json").read_text())
    (folder / "config.json").write_text(json.dumps({**config, "gpattn_predictive": "mean"}))
    assert main(["predict", str(folder), "--input", str(inputs)]) == 0
    rows = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert all(r["mutual_info"] is None for r in rows)
    assert main(["predict", str(folder), "--input", str(inputs), "--samples", "3"]) == 0
    rows = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert all(r["mutual_info"] is not None for r in rows)


def test_predict_out_of_a_folder_is_written_beside_it_never_into_it(folder, inputs, tmp_path,
                                                                    capsys, quiet_transformers):
    out = tmp_path / "preds.jsonl"
    assert main(["predict", str(folder), "--input", str(inputs), "--out", str(out)]) == 0
    assert len(out.read_text().splitlines()) == len(TEXTS)
    before = sorted(p.name for p in folder.iterdir())
    assert main(["predict", str(folder), "--input", str(inputs), "--out",
                 str(folder / "p.jsonl")]) == 2
    assert "inside the model folder" in capsys.readouterr().err
    assert sorted(p.name for p in folder.iterdir()) == before


def test_explain_on_a_folder_defaults_beside_it(folder, capsys, quiet_transformers):
    from gpattn_ppl.run.explain import explain_sentence

    r = explain_sentence(folder, TEXTS[0], samples=2)
    png = folder.parent / f"{folder.name}_explain.png"
    assert r["figure"] == str(png) and png.stat().st_size > 0
    assert r["unit"] == "SGPAttention" and r["samples"] == 2
    with pytest.raises(ValueError, match="inside the model folder"):
        explain_sentence(folder, TEXTS[0], out=folder / "x.png")
    with pytest.raises(ValueError, match="no such attention unit; the model has "
                       "bert.encoder.layer.1.attention.unit"):
        explain_sentence(folder, TEXTS[0], out=folder.parent / "x.png", layer="blocks.0.attn")


def _labelled(path, rows, *, label="label"):
    path.write_text("text," + label + "\n" + "".join(f"{t},{y}\n" for t, y in rows))
    return path


def test_evaluate_a_folder_on_a_labelled_file(folder, tmp_path, capsys, quiet_transformers):
    """The test metrics of a run's evaluation (every metric of classification_report), of the
    predictor's passes on the file's texts; nothing written into the folder."""
    from gpattn_ppl.metrics import classification_report
    from gpattn_ppl.run.saved_model import load_saved_model

    rows = [(t, NAMES[i % 2]) for i, t in enumerate(TEXTS * 3)]
    data = _labelled(tmp_path / "test.csv", rows)
    before = sorted(p.name for p in folder.iterdir())
    assert main(["evaluate", str(folder), "--data", str(data), "--samples", "3",
                 "--seed", "5"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert sorted(p.name for p in folder.iterdir()) == before
    assert out["model_dir"] == str(folder) and out["examples"] == {"test": 9}
    assert out["samples"] == 3 and out["classes"] == list(NAMES) and out["ood"] == {}
    probs = load_saved_model(folder).predict_proba([t for t, _ in rows], samples=3, seed=5)
    labels = torch.tensor([NAMES.index(y) for _, y in rows])
    expected = classification_report(probs, labels)
    assert out["test"] == pytest.approx(expected, nan_ok=True)
    assert set(out["cost"]) == {"eval_seconds", "predict_ms_per_example", "params"}
    # a JSON-lines file with other column names, one pass at the posterior means
    jl = tmp_path / "test.jsonl"
    jl.write_text("".join(json.dumps({"s": t, "y": y}) + "\n" for t, y in rows))
    assert main(["evaluate", str(folder), "--data", str(jl), "--text-column", "s",
                 "--label-column", "y", "--mean"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["samples"] == 1 and out["test"]["mutual_info"] == 0.0


def test_evaluate_a_folder_with_default_class_names_takes_class_indices(tmp_path, capsys,
                                                                          quiet_transformers):
    folder = save_classifier(tmp_path / "unnamed", "kep_svgp", names=None)
    data = _labelled(tmp_path / "t.tsv", [(t, i % 2) for i, t in enumerate(TEXTS)])
    data.write_text(data.read_text().replace(",", "\t"))
    assert main(["evaluate", str(folder), "--data", str(data), "--samples", "2"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["classes"] == ["LABEL_0", "LABEL_1"] and 0.0 <= out["test"]["acc"] <= 1.0


def test_evaluate_a_folder_on_a_bundled_dataset_reports_test_and_ood(folder, capsys,
                                                                     quiet_transformers):
    """``--data cola``: the test split and the OOD set, with the detection metrics a run's
    evaluation reports (the model's id2label are CoLA's class names)."""
    assert main(["evaluate", str(folder), "--data", "cola", "--samples", "2",
                 "--batch-size", "512"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["examples"] == {"val": 855, "test": 527, "cola_ood": 516}
    assert {"acc", "mcc", "nll", "ece"} <= set(out["test"])
    ood = out["ood"]["cola_ood"]
    assert set(ood) == {"classification", "detection"} and ood["classification"]["acc"] >= 0
    assert "max_softmax" in ood["detection"]
