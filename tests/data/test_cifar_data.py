"""CIFAR-10: compact JPEG and python-batch readers, decode cache, crop+flip, normalisation."""

import io
import lzma
import pickle

import numpy as np
import pytest
import torch
from PIL import Image

from gpattn_ppl.data import cifar, encoder_from_state, load_data
from gpattn_ppl.data.cifar import Normalize, augment, read_cifar10


def _images(n, seed):
    rng = np.random.default_rng(seed)
    base = rng.integers(0, 256, size=(n, 1, 1, 3))
    smooth = np.linspace(0, 60, 32)[None, :, None, None] + base  # JPEG-friendly gradients
    return np.clip(smooth + rng.integers(0, 20, size=(n, 32, 32, 3)), 0, 255).astype(np.uint8)


def _make_npz_xz(root, n_train=20, n_test=10):
    root.mkdir(parents=True, exist_ok=True)
    for split, n in (("train", n_train), ("test", n_test)):
        files = []
        for img in _images(n, seed=n):
            buf = io.BytesIO()
            Image.fromarray(img).save(buf, format="JPEG", quality=75)
            files.append(np.frombuffer(buf.getvalue(), np.uint8))
        offsets = np.concatenate([[0], np.cumsum([len(f) for f in files])]).astype(np.int64)
        out = io.BytesIO()
        np.savez(out, jpeg=np.concatenate(files), offsets=offsets,
                 y=(np.arange(n) % 10).astype(np.uint8), file_index=np.arange(n, dtype=np.int32))
        (root / f"{split}.npz.xz").write_bytes(lzma.compress(out.getvalue()))
        # reference decode, one Image.open per file
        ref = np.stack([np.asarray(Image.open(io.BytesIO(f.tobytes())).convert("RGB"))
                        for f in files])
        np.save(root / f"ref_{split}.npy", ref.transpose(0, 3, 1, 2))
    return root


def _make_batches(root, per_batch=4):
    folder = root / "cifar-10-batches-py"
    folder.mkdir(parents=True)
    names = [f"data_batch_{i}" for i in range(1, 6)] + ["test_batch"]
    arrays = {}
    for k, name in enumerate(names):
        data = _images(per_batch, seed=100 + k).transpose(0, 3, 1, 2).reshape(per_batch, -1)
        labels = [(k + j) % 10 for j in range(per_batch)]
        arrays[name] = (data, labels)
        with open(folder / name, "wb") as f:
            pickle.dump({b"data": data, b"labels": labels, b"batch_label": name.encode()}, f)
    return root, arrays


def test_read_npz_xz_matches_pillow(tmp_path):
    root = _make_npz_xz(tmp_path / "c")
    data = read_cifar10(root)
    for split, n in (("train", 20), ("test", 10)):
        x, y = data[split]
        assert x.dtype == torch.uint8 and x.shape == (n, 3, 32, 32)
        assert y.dtype == torch.long and y.tolist() == [i % 10 for i in range(n)]
        assert np.array_equal(x.numpy(), np.load(root / f"ref_{split}.npy"))


def test_decode_cache_is_used(tmp_path, monkeypatch):
    root = _make_npz_xz(tmp_path / "c")
    first = read_cifar10(root, cache_dir=tmp_path / "cache")
    assert len(list((tmp_path / "cache").glob("*.npy"))) == 4

    def fail(*args, **kwargs):
        raise AssertionError("decoded again despite the cache")

    monkeypatch.setattr(cifar, "decode_jpeg_array", fail)
    second = read_cifar10(root, cache_dir=tmp_path / "cache")
    for split in first:
        assert torch.equal(first[split][0], second[split][0])
        assert torch.equal(first[split][1], second[split][1])


def test_read_python_batches(tmp_path):
    root, arrays = _make_batches(tmp_path)
    data = read_cifar10(root)
    x, y = data["train"]
    assert x.shape == (20, 3, 32, 32) and x.dtype == torch.uint8
    assert np.array_equal(x[:4].reshape(4, -1).numpy(), arrays["data_batch_1"][0])
    assert y[4:8].tolist() == arrays["data_batch_2"][1]
    assert torch.equal(read_cifar10(root / "cifar-10-batches-py")["test"][0], data["test"][0])


def test_missing_and_empty(tmp_path):
    with pytest.raises(FileNotFoundError, match="cifar-10-batches-py"):
        read_cifar10(tmp_path)
    root, _ = _make_batches(tmp_path)
    (root / "cifar-10-batches-py" / "data_batch_3").unlink()
    with pytest.raises(FileNotFoundError, match="data_batch_3"):
        read_cifar10(root)
    with pytest.raises(ValueError, match="needs root"):
        load_data("cifar10")


def test_load_cifar10_bundle(tmp_path):
    root = _make_npz_xz(tmp_path / "c")
    b = load_data("cifar10", root=str(root), seed=3)
    assert b.input_kind == "image" and b.num_classes == 10 and b.tokenizer is None
    assert {k: b.info["sizes"][k] for k in ("train", "val", "test")} == {
        "train": 18, "val": 2, "test": 10}
    assert set(b.ood) == {"digits", "photo_patches", "gaussian_noise", "uniform_noise"}
    assert b.ood["digits"].x.shape == (1797, 3, 32, 32) and (b.ood["digits"].y == -1).all()
    assert b.train.augment is not None and b.val.augment is None and b.test.augment is None
    train_val = torch.cat([b.train.x, b.val.x]).reshape(20, -1)
    full = read_cifar10(root)["train"][0].reshape(20, -1)
    assert sorted(map(tuple, train_val.tolist())) == sorted(map(tuple, full.tolist()))
    batch = b.train.batch(torch.arange(4), train=True, generator=torch.Generator().manual_seed(0))
    assert batch.x.dtype == torch.float32 and batch.x.shape == (4, 3, 32, 32)
    assert batch.mask is None
    assert b.classes == list(cifar.CIFAR10_CLASSES) and b.classes[3] == "cat"
    assert b.encoder_state == {"kind": "image", "image_size": 32,
                               "mean": list(cifar.CIFAR10_MEAN), "std": list(cifar.CIFAR10_STD)}
    # new images through the stored encoder: the same normalised batch
    new = encoder_from_state(b.encoder_state).dataset(b.test.x)
    assert torch.equal(new.batch(torch.arange(3)).x, b.test.batch(torch.arange(3)).x)
    assert new.y.tolist() == [-1] * 10


def _crop_flip_reference(x, padding, fill):
    """All 2 * (2p + 1)^2 crops of one image [C, H, W] (brute force)."""
    C, H, W = x.shape
    padded = torch.full((C, H + 2 * padding, W + 2 * padding), fill, dtype=x.dtype)
    padded[:, padding:padding + H, padding:padding + W] = x
    out = []
    for dy in range(2 * padding + 1):
        for dx in range(2 * padding + 1):
            crop = padded[:, dy:dy + H, dx:dx + W]
            out += [crop, crop.flip(-1)]
    return out


@pytest.mark.parametrize("dtype", [torch.uint8, torch.float32])
def test_augment_is_a_crop_or_flip_of_each_image(dtype):
    g = torch.Generator().manual_seed(0)
    x = torch.randint(1, 255, (16, 3, 8, 8)).to(dtype)  # no zeros: padding is visible
    out = augment(x, g, padding=2)
    assert out.shape == x.shape and out.dtype == dtype and out.device == x.device
    for img, res in zip(x, out):
        assert any(torch.equal(res, ref) for ref in _crop_flip_reference(img, 2, 0))
    # flips and shifts both happen; identity happens for some image among many
    many = augment(x.repeat(8, 1, 1, 1), g, padding=2)
    same = (many == x.repeat(8, 1, 1, 1)).flatten(1).all(1)
    assert 0 < int(same.sum()) < len(many)
    assert ((many == 0).flatten(1).any(1)).any()


def test_augment_padding_zero_only_flips_and_fill_per_channel():
    x = torch.rand(32, 3, 6, 6)
    out = augment(x, torch.Generator().manual_seed(1), padding=0)
    flipped = x.flip(-1)
    is_id = (out == x).flatten(1).all(1)
    is_flip = (out == flipped).flatten(1).all(1)
    assert (is_id | is_flip).all() and is_id.any() and is_flip.any()
    fill = (-1.0, -2.0, -3.0)
    out = augment(torch.zeros(64, 3, 4, 4) + 5, torch.Generator().manual_seed(2), padding=2,
                  fill=fill, flip=False)
    for c, v in enumerate(fill):
        assert set(out[:, c].unique().tolist()) <= {5.0, v}
        assert (out[:, c] == v).any()


def test_augment_deterministic_and_device_agnostic():
    x = torch.randint(0, 256, (8, 3, 32, 32), dtype=torch.uint8)
    a = augment(x, torch.Generator().manual_seed(5))
    b = augment(x, torch.Generator().manual_seed(5))
    assert torch.equal(a, b)
    meta = augment(x.to("meta"), torch.Generator().manual_seed(5))
    assert meta.device.type == "meta" and meta.shape == x.shape
    if torch.cuda.is_available():
        c = augment(x.cuda(), torch.Generator().manual_seed(5))
        assert torch.equal(c.cpu(), a)


def test_normalize_and_black_padding():
    norm = Normalize()
    x = torch.zeros(2, 3, 4, 4, dtype=torch.uint8)
    assert torch.allclose(norm(x)[0, :, 0, 0], torch.tensor(norm.black))
    white = norm(torch.full((1, 3, 1, 1), 255, dtype=torch.uint8)).flatten()
    expected = [(1 - m) / s for m, s in zip(norm.mean, norm.std)]
    assert torch.allclose(white, torch.tensor(expected))
    # augment after normalise with fill=black == normalise after padding with black pixels
    img = torch.randint(0, 256, (4, 3, 8, 8), dtype=torch.uint8)
    a = augment(norm(img), torch.Generator().manual_seed(0), fill=norm.black)
    b = norm(augment(img, torch.Generator().manual_seed(0), fill=0))
    assert torch.allclose(a, b, atol=1e-6)


def test_cifar10c_shift_sets_are_generated_labelled_and_cached(tmp_path):
    from gpattn_ppl.data import corrupt

    root = _make_npz_xz(tmp_path / "c")
    cache = tmp_path / "cache"
    b = load_data("cifar10", root=str(root), cache_dir=str(cache),
                  corruptions=["fog:5", "gaussian_noise:1"])
    assert {"cifar10c:fog:5", "cifar10c:gaussian_noise:1"} <= set(b.ood)
    fog = b.ood["cifar10c:fog:5"]
    torch.testing.assert_close(fog.y, b.test.y)                     # the test labels
    test_x = read_cifar10(root)["test"][0]
    torch.testing.assert_close(fog.x, corrupt(test_x, "fog", 5, seed=0))
    files = sorted(cache.glob("c10c_*.npy"))
    assert len(files) == 2
    mtimes = [f.stat().st_mtime_ns for f in files]
    again = load_data("cifar10", root=str(root), cache_dir=str(cache), corruptions=["fog:5"])
    torch.testing.assert_close(again.ood["cifar10c:fog:5"].x, fog.x)
    assert [f.stat().st_mtime_ns for f in files] == mtimes           # read, not rewritten


def test_corruptions_on_a_subset_of_the_test_images(tmp_path):
    from gpattn_ppl.data import corrupt

    root = _make_npz_xz(tmp_path / "c")
    full = load_data("cifar10", root=str(root))
    b = load_data("cifar10", root=str(root), corruptions=["contrast:2", "fog:1"],
                  corruption_images=6)
    fog, contrast = b.ood["cifar10c:fog:1"], b.ood["cifar10c:contrast:2"]
    assert len(fog) == len(contrast) == 6 and len(b.test) == len(full.test)   # test: all of it
    torch.testing.assert_close(fog.y, contrast.y)            # the same images for every set
    # contrast has no randomness: each corrupted image is one test image's, with its label
    test_x, test_y = read_cifar10(root)["test"]
    each = corrupt(test_x, "contrast", 2)
    rows = [next(i for i in range(len(test_y)) if torch.equal(each[i], c)) for c in contrast.x]
    assert len(set(rows)) == 6 and torch.equal(test_y[rows], contrast.y)
    with pytest.raises(ValueError, match=r"corruption_images must be an integer in 1\.\.10"):
        load_data("cifar10", root=str(root), corruptions=["fog:1"], corruption_images=11)


def test_corruption_specs():
    from gpattn_ppl.data import CORRUPTIONS, parse_corruption_sets
    from gpattn_ppl.run.config import ConfigError, load_config

    assert len(parse_corruption_sets("all")) == 5 * len(CORRUPTIONS)
    assert parse_corruption_sets(["fog"]) == [("fog", s) for s in range(1, 6)]
    assert parse_corruption_sets("severity5")[0][1] == 5
    with pytest.raises(ValueError, match="unknown corruption 'rain'"):
        parse_corruption_sets(["rain:1"])
    with pytest.raises(ValueError, match="severity '7'"):
        parse_corruption_sets(["fog:7"])
    with pytest.raises(ConfigError, match="data.corruptions: unknown corruption"):
        load_config({"data": {"name": "cifar10", "root": "x", "corruptions": ["rain"]},
                     "model": {"arch": "vit"}})
    with pytest.raises(ConfigError, match="data.corruptions: not an option of dataset 'cola'"):
        load_config({"data": {"corruptions": "all"}})
