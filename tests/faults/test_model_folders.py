"""A ``save_pretrained`` folder in place of a run folder (``predict``, ``explain``,
``evaluate``), refused with one line and exit status 2 when it cannot be used as one: no
tokenizer beside the model, no swap record, not a sequence classifier, no weights, ``evaluate``
without labelled data or with a run folder's arguments (and a run folder with a folder's), data
that is neither a labelled file nor a bundled dataset, labels that are not the model's classes.
Nothing is written into the folder."""

from __future__ import annotations

import shutil

import pytest

from gpattn_ppl.run.cli import main

from ..run.test_model_folder import save_classifier
from .conftest import cli_error, tried

pytest.importorskip("transformers")
pytestmark = pytest.mark.filterwarnings("ignore::gpattn_ppl.errors.NumericsWarning")


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    return save_classifier(tmp_path_factory.mktemp("refusals") / "model")


@pytest.fixture
def inputs(tmp_path):
    path = tmp_path / "in.txt"
    path.write_text("the cat sat on the mat .\n")
    return path


@pytest.fixture
def labelled(tmp_path):
    path = tmp_path / "test.csv"
    path.write_text("text,label\nthe cat sat .,acceptable\nmat the on .,unacceptable\n")
    return path


def _commands(folder, inputs, labelled, tmp_path) -> dict[str, list[str]]:
    return {"predict": ["predict", str(folder), "--input", str(inputs)],
            "explain": ["explain", str(folder), "the cat sat .", "--out",
                        str(tmp_path / "why.png")],
            "evaluate": ["evaluate", str(folder), "--data", str(labelled)]}


def _unchanged(folder, before) -> None:
    assert sorted(p.name for p in folder.iterdir()) == before


def test_a_folder_without_its_tokenizer_is_one_line(tmp_path, inputs, labelled, capsys,
                                                    quiet_transformers):
    bare = save_classifier(tmp_path / "bare", tokenizer=False)
    before = sorted(p.name for p in bare.iterdir())
    for name, argv in _commands(bare, inputs, labelled, tmp_path).items():
        line = cli_error(capsys, main(argv))
        assert line.startswith(f"gpattn-ppl {name}: error: {bare}: no tokenizer saved beside "
                               "the model"), line
        assert "tokenizer.save_pretrained(folder)" in line
        _unchanged(bare, before)
    assert not (tmp_path / "why.png").exists()
    tried("model folder: no tokenizer", 3)


@pytest.mark.parametrize("case, needle", [
    ("unswapped", "no 'gpattn_swap' record"),
    ("encoder", "not a sequence classifier"),
    ("no weights", "no model.safetensors"),
    ("pickled", "the weights are pickled only"),
])
def test_a_folder_that_is_not_a_swapped_classifier_is_one_line(case, needle, tmp_path, inputs,
                                                               labelled, capsys,
                                                               quiet_transformers):
    path = tmp_path / "m"
    if case == "unswapped":
        save_classifier(path, kind=None)
    elif case == "encoder":
        save_classifier(path, head="BertModel")
    else:
        save_classifier(path)
        (path / "model.safetensors").unlink()
        if case == "pickled":
            (path / "pytorch_model.bin").write_bytes(b"not read")
    before = sorted(p.name for p in path.iterdir())
    for argv in _commands(path, inputs, labelled, tmp_path).values():
        line = cli_error(capsys, main(argv))
        assert needle in line, line
        _unchanged(path, before)
    tried("model folder: not a swapped classifier", 3)


def test_evaluate_arguments_that_do_not_fit_the_folder_kind(folder, tmp_path, labelled, capsys):
    """A folder: --data needed, a run folder's --ood / --set / --checkpoint refused; a run
    folder: a folder's --data / --samples / --seed refused (with the run's way to say it); all
    before anything is loaded."""
    line = cli_error(capsys, main(["evaluate", str(folder)]))
    assert "holds no data; name labelled data with --data" in line
    for extra in (["--ood", "cola_ood"], ["--set", "eval.mc_samples=3"],
                  ["--checkpoint", str(folder)], ["--allow-changed-data"]):
        line = cli_error(capsys, main(["evaluate", str(folder), "--data", str(labelled),
                                       *extra]))
        assert f"evaluate {extra[0]}: applies to a run folder" in line
    line = cli_error(capsys, main(["evaluate", str(folder), "--data", str(labelled), "--mean",
                                   "--samples", "2"]))
    assert "--mean and --samples exclude each other" in line
    run = tmp_path / "run"
    run.mkdir()
    (run / "config.yaml").write_text("model: {}\n")
    for extra, needle in ((["--data", str(labelled)], "--data"),
                          (["--samples", "3"], "--set eval.mc_samples=N"),
                          (["--seed", "0"], "train.seed"),
                          (["--device", "cpu"], "--set train.device=NAME")):
        line = cli_error(capsys, main(["evaluate", str(run), *extra]))
        assert "applies to a save_pretrained model folder" in line and needle in line
    line = cli_error(capsys, main(["predict", str(folder), "--input", str(labelled),
                                   "--checkpoint", str(folder)]))
    assert "holds its own weights; --checkpoint applies to arch: hf run folders" in line
    tried("model folder: evaluate arguments", 11)


@pytest.mark.parametrize("data, needle", [
    ("test.txt", "neither a labelled .csv / .tsv / .jsonl file nor a registered text dataset"),
    ("no_such_dataset", "neither a labelled .csv / .tsv / .jsonl file nor a registered"),
    ("missing.csv", "no such file"),
    ("cifar10", "an image dataset"),
    ("csv", "give the labelled file itself"),
    ("unknown_label", "unknown label 'maybe'; known classes (the model's id2label): "
                      "unacceptable, acceptable"),
    ("bad_column", "no column 'label'"),
])
def test_bad_evaluate_data_is_one_line(data, needle, folder, tmp_path, capsys,
                                       quiet_transformers):
    path = data
    if data == "test.txt":
        path = tmp_path / data
        path.write_text("the cat sat .\n")
    elif data == "missing.csv":
        path = tmp_path / data
    elif data == "unknown_label":
        path = tmp_path / "u.csv"
        path.write_text("text,label\nthe cat sat .,maybe\n")
    elif data == "bad_column":
        path = tmp_path / "b.csv"
        path.write_text("text,y\nthe cat sat .,acceptable\n")
    line = cli_error(capsys, main(["evaluate", str(folder), "--data", str(path)]))
    assert needle in line, line
    tried("model folder: evaluate data")


def test_dataset_classes_that_are_not_the_models_are_refused(tmp_path, capsys,
                                                             quiet_transformers):
    other = save_classifier(tmp_path / "other", names=("no", "yes"))
    line = cli_error(capsys, main(["evaluate", str(other), "--data", "cola"]))
    assert "the dataset's classes (unacceptable, acceptable) are not the model's id2label " \
           "(no, yes)" in line
    shutil.rmtree(other)
    tried("model folder: dataset classes")
