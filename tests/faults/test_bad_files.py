"""Bad files: configs (invalid YAML, empty, not a mapping, not UTF-8) and data files (IMDB JSON
lines, CoLA and CR TSVs, truncated ``.xz``, out-of-range labels). Each is a named error at load
time, before training: through the command line one ``error:`` line naming the file (and the
line of a malformed row), exit status 2, no traceback."""

from __future__ import annotations

import json
import lzma
import shutil

import pytest
import torch
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gpattn_ppl.data import bundled_cola_root, load_data, read_cola, read_imdb
from gpattn_ppl.errors import DataError, GpattnError
from gpattn_ppl.run.cli import main

from .conftest import cli_error, tried

# hypothesis's failure report imports libcst, which warns on import; keep the failure readable
pytestmark = pytest.mark.filterwarnings("ignore:mypy_extensions.TypedDict:DeprecationWarning")

FAST = settings(max_examples=25, deadline=None, database=None,
                suppress_health_check=[HealthCheck.function_scoped_fixture])

TINY_TRAIN = {"model": {"dim": 8, "depth": 1, "heads": 2, "mlp_dim": 8, "max_len": 16},
              "train": {"epochs": 1, "warmup_epochs": 0, "progress": False},
              "eval": {"mc_samples": 2}}


def _config(tmp_path, data: dict, **sections) -> str:
    path = tmp_path / "cfg.yaml"
    path.write_text(yaml.safe_dump({**TINY_TRAIN, **sections,
                                    "data": {"max_len": 16, "batch_size": 8, **data}}))
    return str(path)


def _train(capsys, tmp_path, cfg: str) -> str:
    out = tmp_path / "run"
    line = cli_error(capsys, main(["train", cfg, "--out", str(out)]))
    assert not (out / "config.yaml").exists()  # refused before anything was written
    return line


# -- config files -----------------------------------------------------------------------------

@pytest.mark.parametrize("content, match", [
    ("model:\n  depth: 2\n train: {epochs: 3\n", "cfg.yaml: line 3, column 2: invalid YAML"),
    ("train: {epochs: [1, 2}\n", "cfg.yaml: line 1, column 22: invalid YAML"),
    ("model:\n\tdepth: 2\n", "cfg.yaml: line 2, column 1: invalid YAML"),
    ("", "cfg.yaml: the file is empty"),
    ("# nothing but a comment\n", "cfg.yaml: the file is empty"),
    ("- model\n- data\n", "cfg.yaml: the top level must be a mapping"),
    ("just a string\n", "cfg.yaml: the top level must be a mapping"),
    (b"train: {lr: 1e-3}\n# caf\xe9\n", "cfg.yaml, line 2: not valid UTF-8 (byte 0xe9)"),
])
def test_bad_config_file_is_named(content, match, tmp_path, capsys):
    path = tmp_path / "cfg.yaml"
    if isinstance(content, bytes):
        path.write_bytes(content)
    else:
        path.write_text(content)
    line = cli_error(capsys, main(["train", str(path), "--out", str(tmp_path / "run")]))
    assert match in line, line
    assert str(path) in line
    tried("config file")


def test_missing_and_unreadable_config(tmp_path, capsys):
    line = cli_error(capsys, main(["train", str(tmp_path / "nope.yaml")]))
    assert f"config file not found: {tmp_path / 'nope.yaml'}" in line
    (tmp_path / "dir.yaml").mkdir()
    line = cli_error(capsys, main(["train", str(tmp_path / "dir.yaml")]))
    assert "config file not found" in line
    tried("config file", 2)


# -- IMDB JSON lines ----------------------------------------------------------------------------

def _imdb_rows(n: int = 20) -> list[str]:
    return [json.dumps({"text": f"review {i} was {'good' if i % 2 else 'bad'}",
                        "label": i % 2}) for i in range(n)]


@pytest.fixture
def imdb_root(tmp_path):
    """A tiny IMDB folder in the compact layout (valid: loads)."""
    root = tmp_path / "imdb"
    root.mkdir()
    for split in ("train", "test"):
        (root / f"imdb_{split}.jsonl").write_text("\n".join(_imdb_rows()) + "\n")
    return root


def test_the_tiny_imdb_folder_is_valid(imdb_root):
    bundle = load_data("imdb", root=str(imdb_root), max_len=8)
    assert bundle.num_classes == 2 and len(bundle.test) == 20


#: a malformed row written as line 3 of imdb_train.jsonl -> the message after "line 3"
IMDB_ROWS = {
    "not json": '{"text": "x", "label": 1',
    "not an object": "[1, 2]",
    "missing text": '{"label": 1}',
    "null text": '{"text": null, "label": 1}',
    "number text": '{"text": 5, "label": 1}',
    "missing label": '{"text": "x"}',
    "label 0.7": '{"text": "x", "label": 0.7}',
    "label 2": '{"text": "x", "label": 2}',
    "label -1": '{"text": "x", "label": -1}',
    "label pos": '{"text": "x", "label": "pos"}',
    "label true": '{"text": "x", "label": true}',
    "label null": '{"text": "x", "label": null}',
}
IMDB_MESSAGES = {
    "not json": ": invalid JSON (Expecting ',' delimiter at column 25)",
    "not an object": ": expected a JSON object with 'text' and 'label', got list",
    "missing text": ": no key 'text' (keys found: 'label')",
    "null text": ": 'text' must be a string, got null",
    "number text": ": 'text' must be a string, got int",
    "missing label": ": no key 'label' (keys found: 'text')",
    "label 0.7": ", key 'label': the label must be a class index 0..1, got 0.7",
    "label 2": ", key 'label': the label must be a class index 0..1, got 2",
    "label -1": ", key 'label': the label must be a class index 0..1, got -1",
    "label pos": ", key 'label': the label must be a class index 0..1, got \"pos\"",
    "label true": ", key 'label': the label must be a class index 0..1, got true",
    "label null": ", key 'label': the label must be a class index 0..1, got null",
}


@pytest.mark.parametrize("case", sorted(IMDB_ROWS))
def test_imdb_malformed_row_names_file_and_line(case, imdb_root, tmp_path, capsys):
    rows = _imdb_rows()
    rows[2] = IMDB_ROWS[case]
    path = imdb_root / "imdb_train.jsonl"
    path.write_text("\n".join(rows) + "\n")
    line = _train(capsys, tmp_path, _config(tmp_path, {"name": "imdb", "root": str(imdb_root)}))
    assert f"{path}, line 3{IMDB_MESSAGES[case]}" in line, line
    tried("IMDB row")


def test_imdb_label_07_is_not_silently_0(imdb_root):
    """Regression (issue 16): a label 0.7 became class 0."""
    rows = _imdb_rows()
    rows[4] = '{"text": "fine", "label": 0.7}'
    (imdb_root / "imdb_test.jsonl").write_text("\n".join(rows))
    with pytest.raises(DataError, match=r"imdb_test\.jsonl, line 5, key 'label': the label must "
                                        r"be a class index 0\.\.1, got 0\.7"):
        read_imdb(imdb_root)
    tried("IMDB row")


def test_imdb_integral_labels_in_other_spellings_are_read(imdb_root):
    rows = _imdb_rows(4)
    rows[0], rows[1] = '{"text": "a", "label": 1.0}', '{"text": "b", "label": "0"}'
    (imdb_root / "imdb_train.jsonl").write_text("\n".join(rows))
    assert read_imdb(imdb_root)["train"][1][:2].tolist() == [1, 0]


def _accepted_label(value) -> bool:
    if isinstance(value, bool):
        return False
    if isinstance(value, (int, float)):
        return value in (0, 1)
    if isinstance(value, str):
        text = value.strip()
        digits = text[1:] if text[:1] in "+-" else text
        return digits.isascii() and digits.isdigit() and int(text) in (0, 1)
    return False


_JSON = st.recursive(st.none() | st.booleans() | st.integers() | st.text(max_size=6)
                     | st.floats(allow_nan=False, allow_infinity=False),
                     lambda inner: st.lists(inner, max_size=2)
                     | st.dictionaries(st.text(max_size=3), inner, max_size=2), max_leaves=4)


@FAST
@given(label=_JSON.filter(lambda v: not _accepted_label(v)), at=st.integers(1, 20))
def test_imdb_any_bad_label_is_named(imdb_root, label, at):
    rows = _imdb_rows()
    rows[at - 1] = json.dumps({"text": "x", "label": label})
    path = imdb_root / "imdb_train.jsonl"
    path.write_text("\n".join(rows))
    with pytest.raises(DataError) as err:
        read_imdb(imdb_root)
    assert str(err.value).startswith(f"{path}, line {at}, key 'label': the label must be")
    tried("IMDB label (hypothesis)")


def test_imdb_non_utf8_names_file_and_line(imdb_root, tmp_path, capsys):
    rows = [r.encode() for r in _imdb_rows()]
    rows[6] = b'{"text": "caf\xe9", "label": 1}'
    path = imdb_root / "imdb_train.jsonl"
    path.write_bytes(b"\n".join(rows))
    line = _train(capsys, tmp_path, _config(tmp_path, {"name": "imdb", "root": str(imdb_root)}))
    assert f"{path}, line 7: not valid UTF-8 (byte 0xe9 at byte column 14)" in line
    tried("encoding")


def test_truncated_xz_is_named(imdb_root, tmp_path, capsys):
    for split in ("train", "test"):
        plain = imdb_root / f"imdb_{split}.jsonl"
        blob = lzma.compress(plain.read_bytes())
        plain.unlink()
        (imdb_root / f"imdb_{split}.jsonl.xz").write_bytes(blob[: len(blob) // 2]
                                                           if split == "train" else blob)
    path = imdb_root / "imdb_train.jsonl.xz"
    line = _train(capsys, tmp_path, _config(tmp_path, {"name": "imdb", "root": str(imdb_root)}))
    assert f"{path}: not a readable .xz file, truncated or corrupt" in line
    path.write_bytes(b"not xz at all")
    line = _train(capsys, tmp_path, _config(tmp_path, {"name": "imdb", "root": str(imdb_root)}))
    assert f"{path}: not a readable .xz file" in line
    tried("truncated .xz", 2)


def test_truncated_cifar_xz_is_named(tmp_path, capsys):
    import io

    import numpy as np

    buf = io.BytesIO()
    np.savez(buf, jpeg=np.zeros(4, np.uint8), offsets=np.array([0, 4]), y=np.array([0]))
    blob = lzma.compress(buf.getvalue())
    root = tmp_path / "cifar"
    root.mkdir()
    (root / "train.npz.xz").write_bytes(blob[:-20])
    (root / "test.npz.xz").write_bytes(blob)
    line = _train(capsys, tmp_path, _config(
        tmp_path, {"name": "cifar10", "root": str(root)},
        model={"arch": "vit", "dim": 8, "depth": 1, "heads": 2, "mlp_dim": 8, "image_size": 32,
               "patch_size": 8}))
    assert f"{root / 'train.npz.xz'}: not a readable .xz file, truncated or corrupt" in line
    tried("truncated .xz")


# -- CoLA and CR TSVs ---------------------------------------------------------------------------

@pytest.fixture
def cola_root(tmp_path):
    root = tmp_path / "cola"
    shutil.copytree(bundled_cola_root(), root)
    return root


def _replace_line(path, lineno: int, new: bytes) -> None:
    lines = path.read_bytes().split(b"\n")
    lines[lineno - 1] = new
    path.write_bytes(b"\n".join(lines))


@pytest.mark.parametrize("new, message", [
    (b"gj04\t1\t\tthe caf\xe9 is open", "line 5: not valid UTF-8 (byte 0xe9 at byte column 16)"),
    (b"gj04\t1\tthe cafe is open", "line 5: expected 'source<TAB>0|1<TAB>mark<TAB>sentence', "
                                   "got 3 tab-separated fields"),
    (b"gj04\t2\t\tthe cafe is open", "line 5: expected 'source<TAB>0|1<TAB>mark<TAB>sentence', "
                                     "got label '2'"),
])
def test_cola_malformed_row_names_file_and_line(new, message, cola_root, tmp_path, capsys):
    path = cola_root / "in_domain_train.tsv"
    _replace_line(path, 5, new)
    line = _train(capsys, tmp_path, _config(tmp_path, {"name": "cola", "root": str(cola_root),
                                                       "limit_train": 16, "limit_eval": 8}))
    assert f"{path}, {message}" in line, line
    tried("CoLA row")


@FAST
@given(bad=st.binary(min_size=1, max_size=6).filter(
    lambda b: b"\n" not in b and b"\r" not in b and not _utf8(b)), at=st.integers(1, 40))
def test_cola_any_invalid_utf8_names_the_line(cola_root, bad, at):
    path = cola_root / "out_of_domain_dev.tsv"
    lines = (bundled_cola_root() / path.name).read_bytes().split(b"\n")
    lines[at - 1] = lines[at - 1] + bad
    path.write_bytes(b"\n".join(lines))
    with pytest.raises(DataError, match=rf"out_of_domain_dev\.tsv, line {at}: not valid UTF-8"):
        read_cola(cola_root)
    tried("encoding (hypothesis)")


def _utf8(data: bytes) -> bool:
    try:
        data.decode("utf-8")
    except UnicodeDecodeError:
        return False
    return True


def test_cr_malformed_row_names_file_and_line(imdb_root, tmp_path, capsys):
    cr = tmp_path / "cr"
    cr.mkdir()
    (cr / "CR.test").write_text("a fine camera\t1\nit broke\tneg\n")
    line = _train(capsys, tmp_path, _config(tmp_path, {"name": "imdb", "root": str(imdb_root),
                                                       "cr_root": str(cr)}))
    assert f"{cr / 'CR.test'}, line 2: expected 'sentence<TAB>0|1', got 'it broke\\tneg'" in line
    tried("CR row")


# -- labels outside the classes -----------------------------------------------------------------

@pytest.fixture
def toy_dataset():
    """Registers ``toy_bad_labels``: labels from ``toy_dataset.labels`` for 2 classes."""
    from gpattn_ppl.data import DATASETS, RawData, register_dataset

    state = {"labels": [0, 1] * 10, "ood": [0, 1]}

    @register_dataset("toy_bad_labels", protocols=("a",), modality="text")
    def _build(*, protocol, root, split_seed, cache_dir):
        n = len(state["labels"])
        y = torch.tensor(state["labels"])
        return RawData([f"text {i}" for i in range(n)], y,
                       {"train": torch.arange(0, n - 4), "val": torch.arange(n - 4, n - 2),
                        "test": torch.arange(n - 2, n)},
                       {"toy_ood": (["a", "b"], torch.tensor(state["ood"]))}, 2)

    yield state
    DATASETS.pop("toy_bad_labels", None)


@pytest.mark.parametrize("labels, ood, message", [
    ([0, 1] * 9 + [2, 0], [0, 1], "label 2 of example 18 (test split; 1 such) is outside the "
                                  "classes 0..1"),
    ([-1] + [0, 1] * 9 + [1], [0, 1], "label -1 of example 0 (train split; 1 such)"),
    ([0.5, 1.0] * 10, [0, 1], "labels must be integer class indices, got torch.float32"),
    ([0, 1] * 10, [0, 3], "OOD set 'toy_ood': label 3 of example 1 is neither -1"),
])
def test_labels_outside_the_classes_are_named_at_load_time(toy_dataset, labels, ood, message,
                                                           tmp_path, capsys):
    toy_dataset["labels"], toy_dataset["ood"] = labels, ood
    with pytest.raises(DataError, match="toy_bad_labels: "):
        load_data("toy_bad_labels", max_len=8)
    line = _train(capsys, tmp_path, _config(tmp_path, {"name": "toy_bad_labels"}))
    assert message in line, line
    tried("label range")


def test_data_errors_are_library_errors_and_value_errors():
    assert issubclass(DataError, GpattnError) and issubclass(DataError, ValueError)
