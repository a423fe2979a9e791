"""Hostile and careless data and config files (issue 28, "silent wrong results"): each is a named
error or a documented behaviour, never a silently different result.

- YAML configs and ``--set`` values: duplicate keys refused, YAML 1.2 integers (``010`` is 10),
  no aliases (no "billion laughs"), a 1 MiB size limit, only the core tags;
- CSV headers naming a column twice and JSON objects with a duplicate key refused; a UTF-8 BOM
  dropped;
- ``.txt`` inputs: BOM dropped, lines split only at ``\\n`` / ``\\r\\n``;
- 16-bit PNGs scaled to 8 bits; symbolic links below a class folder followed, loops and broken
  links refused by name;
- CIFAR-10 python batches through a restricted unpickler: a crafted pickle runs nothing;
- OOD files in the data fingerprint; an OOD set named ``train``/``val``/``test`` refused.
"""

from __future__ import annotations

import builtins
import json
import os
import pickle

import numpy as np
import pytest
import torch
import yaml
from PIL import Image

from gpattn_ppl.data import load_data, read_cifar10, read_image, read_text_lines, read_texts
from gpattn_ppl.errors import DataError
from gpattn_ppl.models.spec import ConfigError, load_yaml, read_yaml_mapping
from gpattn_ppl.run.cli import main
from gpattn_ppl.run.config import load_config

from .conftest import bounded_memory, cli_error, tried, warm_cli

TINY = {"model": {"dim": 8, "depth": 1, "heads": 2, "mlp_dim": 8, "max_len": 16},
        "train": {"epochs": 1, "warmup_epochs": 0, "progress": False},
        "eval": {"mc_samples": 2}}
WORDS = ["good", "bad", "fine", "awful", "great", "poor", "nice", "dull"]


def _rows(n: int, offset: int = 0) -> list[tuple[str, int]]:
    return [(f"review {i + offset} was {WORDS[i % 8]}", i % 2) for i in range(n)]


def _csv(path, rows, header="text,label"):
    path.write_text("\n".join([header, *(f"{t},{y}" for t, y in rows)]) + "\n", encoding="utf-8")
    return path


def _write_config(tmp_path, data: dict, text: str | None = None) -> str:
    path = tmp_path / "cfg.yaml"
    if text is None:
        text = yaml.safe_dump({**TINY, "data": {"max_len": 16, "batch_size": 8, **data}})
    path.write_text(text, encoding="utf-8")
    return str(path)


def _refused(capsys, tmp_path, argv: list[str]) -> str:
    """The one error line of ``train`` refusing before anything is written."""
    out = tmp_path / "run"
    line = cli_error(capsys, main(["train", *argv, "--out", str(out)]))
    assert not (out / "config.yaml").exists()
    return line


# -- YAML configs ------------------------------------------------------------------------------

@pytest.mark.parametrize("text, where, key", [
    ("train: {lr: 0.05}\nmodel: {depth: 1}\ntrain: {epochs: 1}\n", "line 3, column 1", "'train'"),
    ("model:\n  dim: 8\n  heads: 2\n  dim: 16\n", "line 4, column 3", "'dim'"),
    ("data:\n  ood_files: {a: x.csv, b: y.csv, a: z.csv}\n", "line 2, column 35", "'a'"),
])
def test_duplicate_yaml_keys_are_refused(text, where, key, tmp_path, capsys):
    cfg = _write_config(tmp_path, {}, text)
    line = _refused(capsys, tmp_path, [cfg])
    assert f"{cfg}: {where}: duplicate key {key} (first at line" in line, line
    tried("duplicate keys")


@pytest.mark.parametrize("value, expected", [
    ("010", 10), ("0o10", 8), ("0x10", 16), ("+7", 7), ("10", 10),
])
def test_integers_follow_yaml_1_2(value, expected, tmp_path):
    assert load_config(overrides=[f"train.seed={value}"])["train"]["seed"] == expected
    cfg = _write_config(tmp_path, {}, f"train: {{seed: {value}}}\n")
    assert read_yaml_mapping(cfg)["train"]["seed"] == expected
    tried("yaml")


def test_yaml_1_1_spellings_are_strings_not_booleans_or_sexagesimals():
    got = load_yaml("a: yes\nb: off\nc: 1:30\nd: 1_000\ne: 2024-01-02\nf: true\ng: FALSE\n"
                    "h: 1e-3\ni: ~\nj: .inf\n")
    assert got == {"a": "yes", "b": "off", "c": "1:30", "d": "1_000", "e": "2024-01-02",
                   "f": True, "g": False, "h": 0.001, "i": None, "j": float("inf")}
    # so a config value written the YAML 1.1 way is a named type error, not a silent boolean
    with pytest.raises(ConfigError, match="train.progress: expected bool, got str 'no'"):
        load_config(overrides=["train.progress=no"])
    tried("yaml", 2)


def test_set_values_use_the_config_loader():
    with pytest.raises(ConfigError, match="duplicate key 'a'"):
        load_config(overrides=["data.ood_files={a: x.csv, a: y.csv}"])
    with pytest.raises(ConfigError, match=r"alias \*x is not allowed"):
        load_config(overrides=["data.ood_files=*x"])
    tried("yaml", 2)


def test_yaml_bomb_is_refused_at_the_first_alias(tmp_path, capsys):
    lines = ['a: &a ["lol","lol","lol","lol","lol","lol","lol","lol","lol"]']
    for i, name in enumerate("bcdefghi"):
        prev = "abcdefghi"[i]
        lines.append(f"{name}: &{name} [{','.join([f'*{prev}'] * 9)}]")
    text = "data:\n  ood_files:\n" + "".join(f"    {line}\n" for line in lines)
    cfg = _write_config(tmp_path, {}, text)
    warm_cli(tmp_path, capsys)
    with bounded_memory(32):
        line = _refused(capsys, tmp_path, [cfg])
    assert f"{cfg}: line 4, column 12: alias *a is not allowed in a config file" in line, line
    tried("yaml")


def test_oversized_deep_and_tagged_configs_are_refused(tmp_path, capsys):
    big = tmp_path / "big.yaml"
    big.write_text("train: {epochs: 1}\n" + "# padding\n" * 110_000)
    assert "larger than 1048576 bytes (1 MiB)" in _refused(capsys, tmp_path, [str(big)])
    deep = _write_config(tmp_path, {}, "data: " + "[" * 40 + "]" * 40 + "\n")
    assert "nested deeper than 32 levels" in _refused(capsys, tmp_path, [deep])
    marker = tmp_path / "pwned"
    for tag in (f"!!python/object/apply:os.system ['touch {marker}']", "!!set {a}",
                "!!timestamp 2024-01-02", "!!binary aGk="):
        cfg = _write_config(tmp_path, {}, f"train:\n  seed: {tag}\n")
        line = _refused(capsys, tmp_path, [cfg])
        assert f"{cfg}: line 2, column 9: the tag !!" in line and "not allowed" in line, line
    assert not marker.exists()
    tried("yaml", 6)


# -- CSV / JSON lines: duplicates and BOM ------------------------------------------------------

def test_csv_header_naming_a_column_twice_is_refused(tmp_path, capsys):
    train = _csv(tmp_path / "train.csv", [(t, f"{y},{1 - y}") for t, y in _rows(20)],
                 header="text,label,label")
    line = _refused(capsys, tmp_path, [_write_config(
        tmp_path, {"name": "csv", "train_file": str(train)})])
    assert f"{train}, line 1: duplicate column 'label' in the header" in line, line
    with pytest.raises(DataError, match="duplicate column 'label'"):
        read_texts(train)  # predict's reader too
    tried("duplicate keys", 2)


def test_jsonl_duplicate_keys_are_refused(tmp_path, capsys):
    rows = [json.dumps({"text": t, "label": y}) for t, y in _rows(20)]
    rows[2] = '{"text": "a", "text": "b", "label": 1}'
    train = tmp_path / "train.jsonl"
    train.write_text("\n".join(rows) + "\n")
    line = _refused(capsys, tmp_path, [_write_config(
        tmp_path, {"name": "jsonl", "train_file": str(train)})])
    assert f"{train}, line 3: duplicate key 'text' in a JSON object" in line, line
    imdb = tmp_path / "imdb"
    imdb.mkdir()
    for split in ("train", "test"):
        (imdb / f"imdb_{split}.jsonl").write_text("\n".join(rows) + "\n")
    with pytest.raises(DataError, match=r"imdb_train.jsonl, line 3: duplicate key 'text'"):
        load_data("imdb", root=str(imdb), max_len=8)
    tried("duplicate keys", 2)


def test_a_bom_before_the_header_is_dropped(tmp_path):
    train = _csv(tmp_path / "train.csv", _rows(20))
    train.write_bytes(b"\xef\xbb\xbf" + train.read_bytes())
    bundle = load_data("csv", train_file=str(train), max_len=8)
    assert bundle.num_classes == 2
    lines = [json.dumps({"text": t, "label": y}) for t, y in _rows(20)]
    jl = tmp_path / "train.jsonl"
    jl.write_bytes(b"\xef\xbb\xbf" + "\n".join(lines).encode())
    assert load_data("jsonl", train_file=str(jl), max_len=8).num_classes == 2
    assert read_texts(train)[0] == "review 0 was good"
    tried("text input", 2)


# -- .txt inputs -------------------------------------------------------------------------------

def test_text_lines_drop_the_bom_and_split_only_at_newlines(tmp_path):
    path = tmp_path / "in.txt"
    path.write_bytes("\ufeffa great\x0cfilm\r\nawful\x85really\n\n  \nsplit\u2028not\x1ehere"
                     "\u2029\x1c\x1d ok \r\nlone\rcr\n".encode())
    assert read_text_lines(path) == ["a great\x0cfilm", "awful\x85really",
                                     "split\u2028not\x1ehere\u2029\x1c\x1d ok", "lone\rcr"]
    empty = tmp_path / "empty.txt"
    empty.write_bytes(b"\xef\xbb\xbf\n \n")
    assert read_text_lines(empty) == []
    tried("text input", 2)


def test_text_lines_name_invalid_utf8_and_a_missing_file(tmp_path):
    path = tmp_path / "in.txt"
    path.write_bytes(b"fine\nfine too\nbad \xff byte\n")
    with pytest.raises(DataError, match=rf"{path}, line 3: not valid UTF-8 \(byte 0xff at byte "
                                        r"column 5\)"):
        read_text_lines(path)
    with pytest.raises(FileNotFoundError, match="no such file"):
        read_text_lines(tmp_path / "nope.txt")
    tried("text input", 2)


# -- images ------------------------------------------------------------------------------------

def _png16(path, values):
    Image.fromarray(np.asarray(values, dtype=np.uint16)).save(path)
    with Image.open(path) as im:
        assert im.mode.startswith("I")  # really a 16-bit greyscale PNG
    return path


def test_16_bit_png_is_scaled_not_clipped(tmp_path):
    path = _png16(tmp_path / "g.png", [[32768, 65535], [0, 257]])
    x = read_image(path, image_size=None)
    assert x.shape == (3, 2, 2) and x.dtype == torch.uint8
    assert x[0].tolist() == [[128, 255], [0, 1]] and torch.equal(x[0], x[2])
    tried("images")


def test_16_bit_pngs_in_an_image_folder(tmp_path):
    for cls, grey in (("dark", 8192), ("light", 49152)):
        (tmp_path / "train" / cls).mkdir(parents=True)
        for i in range(10):
            _png16(tmp_path / "train" / cls / f"{i}.png", np.full((4, 4), grey + i))
    b = load_data("image_folder", train_dir=str(tmp_path / "train"), image_size=4)
    means = {int(k): float(b.train.x[b.train.y == k].float().mean()) for k in (0, 1)}
    assert 31 < means[0] < 33 and 190 < means[1] < 192  # 8192/257 ~ 32, 49152/257 ~ 191
    tried("images")


def _folder_with_links(tmp_path):
    train = tmp_path / "train"
    for cls in ("cat", "dog"):
        (train / cls).mkdir(parents=True)
        for i in range(3):
            Image.new("RGB", (4, 4), (i, 0, 0)).save(train / cls / f"{i}.png")
    extra = tmp_path / "extra_cats"
    extra.mkdir()
    for i in range(5):
        Image.new("RGB", (4, 4), (0, i, 0)).save(extra / f"{i}.png")
    os.symlink(extra, train / "cat" / "more")  # a linked sub-folder
    os.symlink(extra / "0.png", train / "dog" / "linked.png")  # a linked file
    return train


def test_symlinked_subfolders_and_files_are_followed(tmp_path):
    from gpattn_ppl.data import read_image_folder

    train = _folder_with_links(tmp_path)
    x, y, classes = read_image_folder(train, image_size=4)
    assert classes == ["cat", "dog"]
    assert (int((y == 0).sum()), int((y == 1).sum())) == (3 + 5, 3 + 1)
    tried("images")


def test_symlink_loops_and_broken_links_are_named(tmp_path):
    from gpattn_ppl.data import read_image_folder

    train = _folder_with_links(tmp_path)
    loop = train / "cat" / "more_again"
    os.symlink(train / "cat", loop)
    with pytest.raises(DataError, match=rf"{loop}: a symbolic link to .*cat, a folder that "
                                        "contains it \\(a loop\\)"):
        read_image_folder(train, image_size=4)
    loop.unlink()
    broken = train / "dog" / "gone.png"
    os.symlink(tmp_path / "nowhere.png", broken)
    with pytest.raises(DataError, match=rf"{broken}: a broken symbolic link"):
        read_image_folder(train, image_size=4)
    broken.unlink()
    top = train / "bird"
    os.symlink(tmp_path / "no_such_folder", top)
    with pytest.raises(DataError, match=rf"{top}: a broken symbolic link"):
        read_image_folder(train, image_size=4)
    tried("images", 3)


# -- CIFAR-10 python batches -------------------------------------------------------------------

def _py2_batch(data: np.ndarray, labels: list[int]) -> bytes:
    """A CIFAR-10 python batch pickled as the official files are (python 2, protocol 0:
    ``numpy.core.multiarray._reconstruct``, ``numpy.ndarray``, ``numpy.dtype``, byte strings)."""
    def s(b: bytes) -> str:
        return "S'" + "".join(f"\\x{c:02x}" for c in b) + "'\n"

    n, d = data.shape
    text = ("(dp0\n" + s(b"data") + "cnumpy.core.multiarray\n_reconstruct\n(cnumpy\nndarray\n"
            f"(I0\ntS'b'\ntR(I1\n(I{n}\nI{d}\ntcnumpy\ndtype\n(S'u1'\nI0\nI1\ntR(I3\nS'|'\n"
            "NNNI-1\nI-1\nI0\ntbI00\n" + s(data.tobytes()) + "tbs" + s(b"labels") + "(l"
            + "".join(f"I{k}\na" for k in labels) + "s" + s(b"batch_label") + s(b"synthetic")
            + "s.")
    return text.encode("latin-1")


def _cifar_folder(tmp_path, replace: dict | None = None):
    folder = tmp_path / "cifar" / "cifar-10-batches-py"
    folder.mkdir(parents=True)
    rng = np.random.default_rng(0)
    arrays = {}
    for name in [f"data_batch_{i}" for i in range(1, 6)] + ["test_batch"]:
        data = rng.integers(0, 256, (4, 3072), dtype=np.uint8)
        labels = [int(k) for k in rng.integers(0, 10, 4)]
        arrays[name] = (data, labels)
        (folder / name).write_bytes(_py2_batch(data, labels))
    for name, blob in (replace or {}).items():
        (folder / name).write_bytes(blob)
    return tmp_path / "cifar", arrays


def test_official_format_batches_load(tmp_path):
    root, arrays = _cifar_folder(tmp_path)
    data = read_cifar10(root)
    x, y = data["train"]
    assert x.shape == (20, 3, 32, 32) and x.dtype == torch.uint8
    want = np.concatenate([arrays[f"data_batch_{i}"][0] for i in range(1, 6)])
    assert np.array_equal(x.numpy(), want.reshape(-1, 3, 32, 32))
    assert y.tolist() == sum((arrays[f"data_batch_{i}"][1] for i in range(1, 6)), [])
    assert data["test"][1].tolist() == arrays["test_batch"][1]


class _Reduce:
    def __init__(self, fn, *args):
        self.fn, self.args = fn, args

    def __reduce__(self):
        return self.fn, self.args


@pytest.mark.parametrize("make", ["os.system", "builtins.exec", "builtins.eval", "protocol 0",
                                  "numpy.load", "top level"])
def test_a_crafted_cifar_pickle_runs_nothing(make, tmp_path, capsys):
    marker = tmp_path / "pwned"
    code = f"open({str(marker)!r}, 'w').close()"
    payload = {"os.system": (os.system, f"touch {marker}"), "builtins.exec": (builtins.exec, code),
               "builtins.eval": (builtins.eval, code), "numpy.load": (np.load, str(marker))}
    if make == "protocol 0":  # hand-written: cos\nsystem
        blob = f"(dp0\nS'data'\ncos\nsystem\n(S'touch {marker}'\ntRs.".encode()
        refused = "os.system"
    elif make == "top level":
        blob = pickle.dumps(_Reduce(os.system, f"touch {marker}"), protocol=2)
        refused = f"{os.system.__module__}.system"
    else:
        fn, arg = payload[make]
        blob = pickle.dumps({b"data": _Reduce(fn, arg), b"labels": [0]}, protocol=4)
        refused = f"{fn.__module__}.{fn.__name__}"
    root, _ = _cifar_folder(tmp_path, {"data_batch_1": blob})
    with pytest.raises(DataError, match=rf"data_batch_1: refused to unpickle the global "
                                        rf"{refused}"):
        read_cifar10(root)
    assert not marker.exists()
    vit = {"arch": "vit", "dim": 8, "depth": 1, "heads": 2, "mlp_dim": 8, "image_size": 32,
           "patch_size": 8}
    cfg = _write_config(tmp_path, {}, yaml.safe_dump(
        {**TINY, "model": vit, "data": {"name": "cifar10", "root": str(root), "batch_size": 8}}))
    line = _refused(capsys, tmp_path, [cfg])
    assert f"data_batch_1: refused to unpickle the global {refused}" in line, line
    assert not marker.exists()
    tried("cifar pickle")


def test_a_batch_of_the_wrong_shape_is_named(tmp_path):
    good = _py2_batch(np.zeros((2, 3072), np.uint8), [0, 1])
    bad = good.replace(b"I1\na", b"I1\naI2\na")  # 3 labels for 2 images
    root, _ = _cifar_folder(tmp_path, {"test_batch": bad})
    with pytest.raises(DataError, match="test_batch: not a CIFAR-10 python batch.*2 images but "
                                        "labels of shape"):
        read_cifar10(root)
    tried("cifar pickle")


# -- OOD sets: fingerprint and reserved names --------------------------------------------------

def test_an_edited_ood_file_changes_the_fingerprint(tmp_path):
    train = _csv(tmp_path / "train.csv", _rows(40))
    ood = _csv(tmp_path / "ood.csv", _rows(10, offset=100))
    kw = dict(train_file=str(train), ood_files={"shift": str(ood)}, max_len=8)
    base = load_data("csv", **kw).fingerprint
    assert load_data("csv", **kw).fingerprint == base
    prints = {base}
    for rows in (_rows(10, offset=101), [(t, 1 - y) for t, y in _rows(10, offset=100)],
                 _rows(9, offset=100)):
        _csv(ood, rows)
        prints.add(load_data("csv", **kw).fingerprint)
    _csv(ood, _rows(10, offset=100))
    prints.add(load_data("csv", **{**kw, "ood_files": {"renamed": str(ood)}}).fingerprint)
    prints.add(load_data("csv", train_file=str(train), max_len=8).fingerprint)
    assert len(prints) == 6
    tried("fingerprint", 5)


def test_an_edited_ood_image_changes_the_fingerprint(tmp_path):
    for cls in ("a", "b"):
        (tmp_path / "train" / cls).mkdir(parents=True)
        for i in range(10):
            Image.new("RGB", (4, 4), (i, 0, 0)).save(tmp_path / "train" / cls / f"{i}.png")
    (tmp_path / "ood").mkdir()
    Image.new("RGB", (4, 4), (9, 9, 9)).save(tmp_path / "ood" / "x.png")
    kw = dict(train_dir=str(tmp_path / "train"), ood_dirs={"far": str(tmp_path / "ood")},
              image_size=4)
    base = load_data("image_folder", **kw).fingerprint
    Image.new("RGB", (4, 4), (9, 9, 10)).save(tmp_path / "ood" / "x.png")
    assert load_data("image_folder", **kw).fingerprint != base
    tried("fingerprint")


def test_evaluate_refuses_a_run_whose_ood_file_changed(tmp_path, capsys):
    train = _csv(tmp_path / "train.csv", _rows(40))
    ood = _csv(tmp_path / "ood.csv", _rows(10, offset=100))
    cfg = _write_config(tmp_path, {"name": "csv", "train_file": str(train),
                                   "ood_files": {"shift": str(ood)}})
    out = tmp_path / "run"
    assert main(["train", cfg, "--out", str(out)]) == 0
    capsys.readouterr()
    _csv(ood, _rows(10, offset=200))
    line = cli_error(capsys, main(["evaluate", str(out), "--no-plots"]))
    assert "the data changed since this run was trained" in line, line
    tried("fingerprint")


@pytest.mark.parametrize("name", ["test", "val", "train"])
def test_an_ood_set_named_like_a_split_is_refused(name, tmp_path, capsys):
    train = _csv(tmp_path / "train.csv", _rows(40))
    ood = _csv(tmp_path / "ood.csv", _rows(10, offset=100))
    cfg = _write_config(tmp_path, {"name": "csv", "train_file": str(train),
                                   "ood_files": {name: str(ood)}})
    line = _refused(capsys, tmp_path, [cfg])  # the config check or load_data's, both name it
    assert f"data.ood_files.{name}: " in line and "OOD set" in line, line
    (tmp_path / "imgs" / "a").mkdir(parents=True)
    with pytest.raises(DataError, match=f"data.ood_dirs.{name}: an OOD set may not be named"):
        load_data("image_folder", train_dir=str(tmp_path / "imgs"),
                  ood_dirs={name: str(tmp_path / "imgs")})
    tried("OOD name", 2)


def test_a_builder_returning_an_ood_set_named_test_is_refused():
    from gpattn_ppl.data import DATASETS, RawData, register_dataset

    @register_dataset("toy_ood_named_test", protocols=("a",), modality="text")
    def _build(*, protocol, root, split_seed, cache_dir):
        y = torch.tensor([0, 1] * 10)
        return RawData([f"text {i}" for i in range(20)], y,
                       {"train": torch.arange(16), "val": torch.arange(16, 18),
                        "test": torch.arange(18, 20)},
                       {"test": (["a", "b"], torch.tensor([0, 1]))}, 2)

    try:
        with pytest.raises(DataError, match="toy_ood_named_test: OOD set test: an OOD set may "
                                            "not be named 'test'"):
            load_data("toy_ood_named_test", max_len=4)
    finally:
        DATASETS.pop("toy_ood_named_test", None)
    tried("OOD name")
