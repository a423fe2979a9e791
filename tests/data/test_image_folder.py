"""The image_folder dataset: class sub-folders, resizing, held-out splits, OOD, errors."""

import json

import numpy as np
import pytest
import torch
from PIL import Image

from gpattn_ppl.data import (
    DATASETS,
    encoder_from_state,
    load_data,
    read_image,
    read_image_folder,
)


def _image(seed, size=(12, 10)):
    rng = np.random.default_rng(seed)
    return Image.fromarray(rng.integers(0, 256, size=(size[1], size[0], 3), dtype=np.uint8))


def _folder(root, counts, fmt="PNG", start=0):
    """``root/<class>/<i>.<ext>`` with ``counts[class]`` images each."""
    paths = {}
    for k, (name, n) in enumerate(counts.items()):
        (root / name).mkdir(parents=True, exist_ok=True)
        for i in range(n):
            ext = {"PNG": "png", "JPEG": "jpg"}[fmt]
            path = root / name / f"img{i:03d}.{ext}"
            _image(start + 100 * k + i, size=(12 + i % 3, 10)).save(path, format=fmt)
            paths.setdefault(name, []).append(path)
    return paths


def _reference(path, size):
    with Image.open(path) as im:
        im = im.convert("RGB").resize((size, size), Image.Resampling.BICUBIC)
    return torch.from_numpy(np.asarray(im).transpose(2, 0, 1).copy())


def test_read_image_resizes_bicubic_to_rgb(tmp_path):
    path = tmp_path / "a.PNG"  # upper-case extension
    _image(0, (20, 14)).convert("L").save(path)
    x = read_image(path, 8)
    assert x.dtype == torch.uint8 and x.shape == (3, 8, 8)
    assert torch.equal(x, _reference(path, 8))
    assert torch.equal(x[0], x[1])  # grey -> equal RGB channels
    assert read_image(path, None).shape == (3, 14, 20)
    palette = tmp_path / "p.gif"
    Image.new("P", (6, 6), 3).save(palette, transparency=3)
    assert read_image(palette, 4).shape == (3, 4, 4)  # no Pillow warning (errors in tests)


def test_read_image_folder_classes_order_and_labels(tmp_path):
    paths = _folder(tmp_path / "train", {"dog": 3, "cat": 2})
    (tmp_path / "train" / "cat" / "notes.txt").write_text("not an image")
    (tmp_path / "train" / "cat" / "deep").mkdir()
    _image(9).save(tmp_path / "train" / "cat" / "deep" / "x.JPEG", format="JPEG")
    x, y, classes = read_image_folder(tmp_path / "train", image_size=6)
    assert classes == ["cat", "dog"] and y.tolist() == [0, 0, 0, 1, 1, 1]
    assert x.shape == (6, 3, 6, 6) and x.dtype == torch.uint8
    assert torch.equal(x[3], _reference(paths["dog"][0], 6))  # sorted files within a class


def test_load_image_folder_held_out_splits(tmp_path):
    _folder(tmp_path / "train", {"a": 20, "b": 10})
    b = load_data("image_folder", train_dir=str(tmp_path / "train"), image_size=8)
    assert (b.name, b.protocol, b.input_kind, b.num_classes) == ("image_folder", "given",
                                                                  "image", 2)
    assert b.classes == ["a", "b"] and b.vocab_size is None and b.tokenizer is None
    assert (len(b.train), len(b.val), len(b.test)) == (24, 3, 3)
    assert b.val.y.tolist() == [0, 0, 1] and b.test.y.tolist() == [0, 0, 1]  # stratified
    assert b.train.x.shape == (24, 3, 8, 8) and b.train.x.dtype == torch.uint8
    assert "stratified 10% of train_dir" in b.info["split"]
    assert "held out of train_dir" in b.info["notes"][0]
    batch = b.train.batch(torch.arange(4), train=True, generator=torch.Generator().manual_seed(0))
    assert batch.x.dtype == torch.float32 and batch.x.shape == (4, 3, 8, 8)
    # normalisation statistics come from the training images
    pixels = b.train.x.double() / 255
    mean = pixels.mean((0, 2, 3))
    assert torch.allclose(torch.tensor(b.encoder_state["mean"], dtype=torch.float64), mean,
                          atol=1e-5)
    assert abs(float(b.val.batch(torch.arange(3)).x.mean())) < 0.5
    again = load_data("image_folder", train_dir=str(tmp_path / "train"), image_size=8)
    assert again.fingerprint == b.fingerprint and torch.equal(again.val.x, b.val.x)
    other = load_data("image_folder", train_dir=str(tmp_path / "train"), image_size=8,
                      split_seed=2)
    assert other.fingerprint != b.fingerprint


def test_given_val_test_and_ood_dirs(tmp_path):
    _folder(tmp_path / "train", {"a": 4, "b": 4})
    _folder(tmp_path / "val", {"b": 2}, fmt="JPEG", start=500)
    _folder(tmp_path / "test", {"a": 1, "b": 1}, start=600)
    ood = tmp_path / "ood"
    _folder(ood, {"b": 1, "zebra": 2}, start=700)
    _image(800).save(ood / "loose.bmp")
    b = load_data("image_folder", root=str(tmp_path), train_dir="train", val_dir="val",
                  test_dir="test", ood_dirs={"odd": "ood"}, image_size=5)
    assert (len(b.train), len(b.val), len(b.test)) == (8, 2, 2)
    assert b.val.y.tolist() == [1, 1] and b.test.y.tolist() == [0, 1]
    # loose file first, then sub-folders in order: known class b, unknown zebra -> -1
    assert b.ood["odd"].y.tolist() == [-1, 1, -1, -1]
    assert b.info["ood_unlabelled"] == {"odd": 3}
    assert b.ood["odd"].x.shape == (4, 3, 5, 5)


def test_image_folder_errors(tmp_path):
    with pytest.raises(FileNotFoundError, match="data.train_dir: no such folder"):
        load_data("image_folder", train_dir=str(tmp_path / "missing"))
    with pytest.raises(ValueError, match="needs train_dir"):
        load_data("image_folder")
    _folder(tmp_path / "one", {"only": 3})
    with pytest.raises(ValueError, match="at least 2 classes"):
        load_data("image_folder", train_dir=str(tmp_path / "one"))
    train = tmp_path / "train"
    _folder(train, {"a": 3, "b": 3})
    bad = train / "b" / "broken.png"
    bad.write_bytes(b"not a png at all")
    with pytest.raises(ValueError) as err:
        load_data("image_folder", train_dir=str(train))
    assert str(bad) in str(err.value) and "not a readable image" in str(err.value)
    bad.unlink()
    _folder(tmp_path / "val", {"c": 1})
    with pytest.raises(ValueError) as err:
        load_data("image_folder", train_dir=str(train), val_dir=str(tmp_path / "val"))
    assert "unknown class folder 'c'" in str(err.value) and "a, b" in str(err.value)
    (train / "empty").mkdir()
    with pytest.raises(ValueError, match="'empty' holds no images"):
        read_image_folder(train)
    (train / "empty").rmdir()
    _image(1).save(train / "stray.png")
    with pytest.raises(ValueError, match="found 1 directly in it"):
        read_image_folder(train)
    with pytest.raises(ValueError, match="image_size must be an int"):
        load_data("image_folder", train_dir=str(train), image_size=0)


def test_image_encoder_round_trip(tmp_path):
    paths = _folder(tmp_path / "train", {"a": 10, "b": 10})
    b = load_data("image_folder", train_dir=str(tmp_path / "train"), image_size=7)
    state = json.loads(json.dumps(b.encoder_state))
    assert state["kind"] == "image" and state["image_size"] == 7
    enc = encoder_from_state(state)
    assert enc.input_kind == "image"
    raw = DATASETS["image_folder"].builder(protocol="given", root=None, split_seed=0,
                                           cache_dir=None, train_dir=str(tmp_path / "train"),
                                           image_size=7)
    files = paths["a"] + paths["b"]
    rows = raw.splits["val"].tolist()
    ds = enc.dataset([files[i] for i in rows])
    assert torch.equal(ds.x, b.val.x) and ds.y.tolist() == [-1] * len(rows)
    assert torch.equal(ds.batch(torch.arange(2)).x, b.val.batch(torch.arange(2)).x)
    # a uint8 tensor of another size is resized like a file
    with Image.open(files[0]) as im:
        big = torch.from_numpy(np.array(im.convert("RGB")).transpose(2, 0, 1))
    assert torch.equal(enc.dataset(big[None].contiguous()).x[0], _reference(files[0], 7))
    with pytest.raises(ValueError, match="uint8"):
        enc.dataset(torch.zeros(1, 3, 7, 7))
