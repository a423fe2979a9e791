"""``gpattn-ppl export RUN OUT`` (issue 46, item 5): an ``arch: hf`` run as a Hugging Face folder
that ``AutoModelForSequenceClassification`` and ``transformers.pipeline`` load after ``import
gpattn_ppl.hf``, computing the run's logits; ``predict OUT`` gives the run's probabilities; the
runs and output folders it refuses."""

import json
import shutil

import pytest
import torch

from gpattn_ppl import settings
from gpattn_ppl.run.cli import main

transformers = pytest.importorskip("transformers")

# a tiny run's step-0 terms and a temperature fit at its bound are not these tests' subject
pytestmark = [pytest.mark.filterwarnings("ignore::gpattn_ppl.errors.NumericsWarning"),
              pytest.mark.filterwarnings("ignore::gpattn_ppl.metrics.TemperatureWarning")]

#: the third is longer than the runs' max_len (16 word pieces): truncated alike
TEXTS = ["the cat sat on the mat .", "him went store yesterday quickly",
         "john said that mary seems to be happy and that she bought the dog a mat yesterday , "
         "what did you say ?"]


def _config(checkpoint, **model) -> dict:
    return {"model": {"arch": "hf", "checkpoint": str(checkpoint), **model},
            "data": {"name": "cola", "encoder": "hf", "max_len": 16, "batch_size": 16,
                     "limit_train": 32, "limit_eval": 16},
            "train": {"epochs": 1, "warmup_epochs": 0, "progress": False, "device": "cpu"},
            "eval": {"mc_samples": 2, "temperature_scaling": True}}


@pytest.fixture(scope="module")
def runs(tmp_path_factory, tiny_checkpoint):
    """``{"softmax": run, "cgpt": run}``: the tiny BERT fine-tuned as is (mean pooling), and
    with CGPT swapped into its last layer (cls pooling, ``train_layers: 1``, the posterior-mean
    predictive); both with a fitted temperature."""
    from gpattn_ppl.run.experiment import Trainer

    home = tmp_path_factory.mktemp("export_runs")
    soft = _config(tiny_checkpoint, pooling="mean")
    cgpt = _config(tiny_checkpoint, pooling="cls", train_layers=1,
                   swap=[{"layers": [-1], "attention": {"kind": "cgpt"}}])
    cgpt["eval"]["predictive"] = "mean"
    for name, cfg in (("softmax", soft), ("cgpt", cgpt)):
        Trainer(cfg, home / name).fit()
    return {"softmax": home / "softmax", "cgpt": home / "cgpt"}


@pytest.fixture(scope="module")
def exported(runs, tmp_path_factory):
    """``{name: OUT}``: each run exported by the command line."""
    home = tmp_path_factory.mktemp("exported")
    out = {}
    for name, run in runs.items():
        out[name] = home / name
        assert main(["export", str(run), str(out[name])]) == 0
    return out


def _run_logits(run, texts) -> tuple[torch.Tensor, object]:
    """The run's logits ``[n, K]`` (evaluation mode, the units at their posterior means) on its
    own encoding of ``texts``, and its predictor."""
    from gpattn_ppl.run.predictor import load_run

    predictor = load_run(run)
    x, lengths = predictor.encoder.encode(texts)
    mask = torch.arange(x.shape[1]) < lengths.unsqueeze(1)
    with torch.no_grad(), settings.posterior_mean(True):
        return predictor.program.net(x, mask), predictor


def _error(capsys, code: int) -> str:
    err = capsys.readouterr().err
    assert code == 2 and "Traceback" not in err, err
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("gpattn-ppl export: error: "), err
    return lines[0]


@pytest.mark.parametrize("name", ["softmax", "cgpt"])
def test_the_export_loads_with_the_auto_class_and_computes_the_runs_logits(
        name, runs, exported, quiet_transformers):
    import gpattn_ppl.hf  # noqa: F401 -- registers the swapped types

    out = exported[name]
    logits, predictor = _run_logits(runs[name], TEXTS)
    config = json.loads((out / "config.json").read_text())
    assert config["model_type"] == "gpattn_bert"
    assert config["architectures"] == ["GpattnBertForSequenceClassification"]
    assert config["gpattn_head"] == {"pooling": "mean" if name == "softmax" else "cls",
                                     "dropout": 0.1}
    assert config["id2label"] == {"0": "unacceptable", "1": "acceptable"}
    assert config["label2id"] == {"unacceptable": 0, "acceptable": 1}
    assert config["gpattn_predictive"] == ("mc" if name == "softmax" else "mean")
    assert config["gpattn_temperature"] == predictor.temperature != 1.0
    assert [e["kind"] for e in config["gpattn_swap"]] == ([] if name == "softmax" else ["cgpt"])
    model = transformers.AutoModelForSequenceClassification.from_pretrained(out).eval()
    tokenizer = transformers.AutoTokenizer.from_pretrained(out)
    assert tokenizer.model_max_length == 16
    enc = tokenizer(TEXTS, padding=True, truncation=True, return_tensors="pt")
    x, lengths = predictor.encoder.encode(TEXTS)          # the run's ids, truncated alike
    assert torch.equal(enc["input_ids"], x) and enc["attention_mask"].sum(1).tolist() == \
        lengths.tolist()
    with torch.no_grad(), settings.posterior_mean(True):
        got = model(**enc).logits
    assert torch.allclose(got, logits)
    # the run's tempered probabilities: its predictive divided by the recorded temperature
    probs = predictor.predict_proba(TEXTS, mean=True)[0]
    assert torch.allclose(torch.softmax(got.double() / config["gpattn_temperature"], -1), probs)


@pytest.mark.parametrize("name", ["softmax", "cgpt"])
def test_transformers_pipelines_on_the_export(name, runs, exported, quiet_transformers):
    """``text-classification``: the untempered softmax of the run's logits (at the posterior
    means); ``uncertainty-classification``: the run's tempered predictive."""
    import gpattn_ppl.hf  # noqa: F401

    out = exported[name]
    logits, predictor = _run_logits(runs[name], TEXTS)
    classify = transformers.pipeline("text-classification", model=str(out), top_k=None)
    with settings.posterior_mean(True):
        rows = classify(TEXTS, truncation=True)
    got = torch.tensor([[{r["label"]: r["score"] for r in row}[c] for c in predictor.classes]
                        for row in rows], dtype=torch.float64)
    assert torch.allclose(got, torch.softmax(logits.double(), -1), atol=1e-6)
    pipe = transformers.pipeline("uncertainty-classification", model=str(out))
    assert pipe.temperature == predictor.temperature
    records = pipe(TEXTS, truncation=True, max_length=16)
    expected = predictor.predict(TEXTS)                   # the run's default predictive
    assert [r["probs"] for r in records] == pytest.approx([e["probs"] for e in expected])


@pytest.mark.parametrize("name", ["softmax", "cgpt"])
def test_predict_on_the_export_prints_the_runs_records(name, runs, exported, tmp_path, capsys,
                                                       quiet_transformers):
    inputs = tmp_path / "in.txt"
    inputs.write_text("\n".join(TEXTS) + "\n")
    rows = {}
    for what, folder in (("run", runs[name]), ("export", exported[name])):
        assert main(["predict", str(folder), "--input", str(inputs)]) == 0
        rows[what] = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert rows["export"] == pytest.approx(rows["run"])
    assert all(r["mutual_info"] is None for r in rows["export"])   # one pass, as the run's
    assert main(["predict", str(exported[name]), "--input", str(inputs),
                 "--no-temperature"]) == 0
    raw = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    logits, _ = _run_logits(runs[name], TEXTS)
    assert [r["score"] for r in raw] == pytest.approx(
        torch.softmax(logits.double(), -1).max(-1).values.tolist())


def test_the_exports_weights_are_loaded_strictly(exported, tmp_path, quiet_transformers):
    """A folder with ``gpattn_head`` misses no weight silently: without the classifier, the Auto
    class refuses it (``transformers`` would initialise the head at random)."""
    from safetensors.torch import load_file, save_file

    import gpattn_ppl.hf  # noqa: F401
    from gpattn_ppl.hf import SwapRecordError

    folder = tmp_path / "no_head"
    shutil.copytree(exported["softmax"], folder)
    state = load_file(str(folder / "model.safetensors"))
    save_file({k: v for k, v in state.items() if not k.startswith("classifier.")},
              str(folder / "model.safetensors"), metadata={"format": "pt"})
    with pytest.raises(SwapRecordError, match="missing.*classifier"):
        transformers.AutoModelForSequenceClassification.from_pretrained(folder)


def test_a_swapped_classifier_without_the_run_head_keeps_the_hosts(quiet_transformers):
    """No ``gpattn_head``: the generated class's forward is the host's, signature included."""
    import inspect

    from gpattn_ppl.hf import swap

    cfg = transformers.BertConfig(vocab_size=30, hidden_size=16, num_hidden_layers=2,
                                  num_attention_heads=4, intermediate_size=32, num_labels=3)
    host = transformers.BertForSequenceClassification
    model = host(cfg).eval()
    swap(model, "kep_svgp", layers=[-1], init="random", rank=3)
    assert inspect.signature(type(model).forward) == inspect.signature(host.forward)
    assert "token_type_ids" in inspect.signature(model.forward).parameters
    assert getattr(model.config, "gpattn_head", None) is None
    assert model.classifier.out_features == 3
    x = torch.randint(0, 30, (2, 5))
    with torch.no_grad(), settings.posterior_mean(True):
        assert torch.equal(model(input_ids=x).logits, host.forward(model, input_ids=x).logits)
        assert model.bert.pooler is not None


# -- refusals ----------------------------------------------------------------------------------

def _edited_run(run, tmp_path, old: str, new: str):
    """A copy of ``run`` whose config.yaml says ``new`` for ``old`` (the refusals read the
    config only, before any weight)."""
    copy = tmp_path / "edited"
    shutil.copytree(run, copy)
    text = (copy / "config.yaml").read_text()
    assert old in text
    (copy / "config.yaml").write_text(text.replace(old, new))
    return copy


@pytest.mark.parametrize("old, new, needle", [
    ("  head: linear\n", "  head: sngp\n", "has an SNGP head (model.head: sngp"),
    ("  mc_dropout: false\n", "  mc_dropout: true\n", "predicts with MC dropout"),
])
def test_a_run_the_export_cannot_compute_is_refused(old, new, needle, runs, tmp_path, capsys):
    run = _edited_run(runs["softmax"], tmp_path, old, new)
    line = _error(capsys, main(["export", str(run), str(tmp_path / "out")]))
    assert needle in line and "only" in line
    assert not (tmp_path / "out").exists()


def test_a_run_without_best_pt_is_refused(runs, tmp_path, capsys):
    run = tmp_path / "run"
    shutil.copytree(runs["softmax"], run)
    (run / "best.pt").unlink()
    line = _error(capsys, main(["export", str(run), str(tmp_path / "out")]))
    assert "has no best.pt" in line and not (tmp_path / "out").exists()


def test_a_run_of_another_arch_is_refused_with_what_to_do(tmp_path, capsys):
    from gpattn_ppl.run.experiment import Trainer
    from tests.run.conftest import TINY

    cfg = {**TINY, "data": {**TINY["data"], "limit_train": 16, "limit_eval": 16},
           "train": {**TINY["train"], "epochs": 1}}
    Trainer(cfg, tmp_path / "text").fit()
    capsys.readouterr()
    line = _error(capsys, main(["export", str(tmp_path / "text"), str(tmp_path / "out")]))
    assert "is an arch: text run; only arch: hf runs" in line
    assert "use the run folder itself with predict" in line and "model.arch=hf" in line
    assert not (tmp_path / "out").exists()


def test_out_rules(runs, exported, tmp_path, capsys, quiet_transformers):
    run = runs["softmax"]
    # a link (to an empty folder), --force included
    (tmp_path / "real").mkdir()
    (tmp_path / "link").symlink_to(tmp_path / "real")
    for force in ([], ["--force"]):
        line = _error(capsys, main(["export", str(run), str(tmp_path / "link"), *force]))
        assert "it is a symbolic link" in line
    assert list((tmp_path / "real").iterdir()) == []
    # a file; the run folder itself, or a folder inside it
    (tmp_path / "file").write_text("x")
    assert "it is a file" in _error(capsys, main(["export", str(run), str(tmp_path / "file")]))
    for out in (run, run / "hf"):
        line = _error(capsys, main(["export", str(run), str(out), "--force"]))
        assert "the run folder" in line
    assert not (run / "hf").exists()
    # a folder that holds files: refused without --force, nothing changed
    out = tmp_path / "out"
    out.mkdir()
    (out / "notes.txt").write_text("mine")
    line = _error(capsys, main(["export", str(run), str(out)]))
    assert "the folder is not empty; pass --force" in line
    assert [p.name for p in out.iterdir()] == ["notes.txt"]
    # --force: the export's files replaced, another file left alone
    shutil.copy(exported["cgpt"] / "config.json", out / "config.json")
    assert main(["export", str(run), str(out), "--force"]) == 0
    capsys.readouterr()
    assert (out / "notes.txt").read_text() == "mine"
    assert (out / "config.json").read_bytes() == (exported["softmax"] / "config.json").read_bytes()
    # ... but not beside a weight file a loader would read
    (out / "pytorch_model.bin").write_bytes(b"")
    line = _error(capsys, main(["export", str(run), str(out), "--force"]))
    assert "holds pytorch_model.bin, which a loader would read" in line
    # a folder holding a run
    line = _error(capsys, main(["export", str(run), str(runs["cgpt"]), "--force"]))
    assert "holds a run" in line


@pytest.mark.parametrize("key, value, needle", [
    ("gpattn_temperature", "hot", "gpattn_temperature: expected a number"),
    ("gpattn_temperature", 1e9, "is outside the sane range"),
    ("gpattn_head", {"pooling": "max"}, "malformed 'gpattn_head'"),
    ("gpattn_head", {"pooling": "mean", "dropout": 2}, "malformed 'gpattn_head'"),
])
def test_a_malformed_export_config_is_refused_with_one_line(key, value, needle, exported,
                                                            tmp_path, capsys):
    folder = tmp_path / "edited"
    shutil.copytree(exported["softmax"], folder)
    config = json.loads((folder / "config.json").read_text())
    (folder / "config.json").write_text(json.dumps({**config, key: value}))
    inputs = tmp_path / "in.txt"
    inputs.write_text("the cat sat on the mat .\n")
    capsys.readouterr()
    assert main(["predict", str(folder), "--input", str(inputs)]) == 2
    err = capsys.readouterr().err
    assert needle in err and "Traceback" not in err and len(err.strip().splitlines()) == 1
