"""CIFAR-10 readers (compact JPEG arrays and the standard python batches), the ``cifar10``
dataset (selects checkpoints on validation accuracy) and image augmentation."""

from __future__ import annotations

import hashlib
import io
import lzma
import pickle
import zipfile
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import PIL
import torch
from PIL import Image

from ..errors import DataError
from .batch import to_device
from .corruptions import corrupted_sets, parse_corruption_sets
from .registry import RawData, register_dataset
from .splits import cut, seeded_permutation, stratified_subset
from .vision_ood import vision_ood_sets

__all__ = ["CIFAR10_CLASSES", "CIFAR10_MEAN", "CIFAR10_STD", "Normalize", "augment",
           "decode_jpeg_array", "read_cifar10"]

CIFAR10_CLASSES = ("airplane", "automobile", "bird", "cat", "deer", "dog", "frog", "horse",
                   "ship", "truck")
#: Per-channel mean and standard deviation of the CIFAR-10 training pixels in [0, 1].
CIFAR10_MEAN = (0.4914, 0.4822, 0.4465)
CIFAR10_STD = (0.2470, 0.2435, 0.2616)

_BATCHES = {"train": [f"data_batch_{i}" for i in range(1, 6)], "test": ["test_batch"]}


# -- decoding -----------------------------------------------------------------------------------
def decode_jpeg_array(jpeg: np.ndarray, offsets: np.ndarray, size: int = 32) -> np.ndarray:
    """Decode concatenated RGB JPEG files with Pillow.

    :param jpeg: ``[total_bytes]`` uint8, all files back to back.
    :param offsets: ``[n + 1]`` int, file ``i`` is ``jpeg[offsets[i]:offsets[i + 1]]``.
    :param size: side of the (square) images.
    :returns: ``[n, 3, size, size]`` uint8.
    """
    buf = jpeg.tobytes()
    bounds = np.asarray(offsets, dtype=np.int64).tolist()
    n = len(bounds) - 1
    nbytes = size * size * 3
    parts = []
    for i in range(n):
        data = buf[bounds[i]:bounds[i + 1]]
        try:  # raw decoder call: about twice as fast as Image.open for tiny files
            raw = Image.frombytes("RGB", (size, size), data, "jpeg", "RGB", "").tobytes()
        except (OSError, ValueError):
            raw = b""
        if len(raw) != nbytes:
            with Image.open(io.BytesIO(data)) as im:
                if im.size != (size, size):
                    raise ValueError(f"image {i} is {im.size[0]}x{im.size[1]}, expected "
                                     f"{size}x{size}")
                raw = im.convert("RGB").tobytes()
        parts.append(raw)
    hwc = np.frombuffer(b"".join(parts), dtype=np.uint8).reshape(n, size, size, 3)
    return np.ascontiguousarray(hwc.transpose(0, 3, 1, 2))


def _read_npz_xz(path: Path, cache_dir: Path | None) -> tuple[np.ndarray, np.ndarray]:
    blob = path.read_bytes()
    cache_x = cache_y = None
    if cache_dir is not None:
        key = hashlib.sha256(blob)
        key.update(PIL.__version__.encode())
        stem = f"cifar10_{path.name.split('.')[0]}_{key.hexdigest()[:16]}"
        cache_x, cache_y = cache_dir / f"{stem}.x.npy", cache_dir / f"{stem}.y.npy"
        if cache_x.is_file() and cache_y.is_file():
            return np.load(cache_x), np.load(cache_y)
    try:
        raw = lzma.decompress(blob)
    except (lzma.LZMAError, EOFError) as err:
        raise DataError(f"{path}: not a readable .xz file, truncated or corrupt ({err}); "
                        "download or compress it again") from None
    try:
        z = np.load(io.BytesIO(raw))
    except (OSError, ValueError, EOFError, zipfile.BadZipFile) as err:
        raise DataError(f"{path}: not an .npz archive inside the .xz ({err})") from None
    with z:
        missing = {"jpeg", "offsets", "y"} - set(z.files)
        if missing:
            raise DataError(f"{path}: missing arrays {sorted(missing)} (has {z.files})")
        try:
            x = decode_jpeg_array(z["jpeg"], z["offsets"])
        except (OSError, ValueError) as err:
            raise DataError(f"{path}: {err}") from None
        y = z["y"].astype(np.int64)
    if cache_x is not None:
        from ..safe_files import write_atomic

        for target, arr in ((cache_x, x), (cache_y, y)):
            buf = io.BytesIO()
            np.save(buf, arr)
            write_atomic(target, buf.getvalue())  # atomic, never through a link
    return x, y


_RECONSTRUCT = np.ndarray.__reduce__(np.zeros(1))[0]  # numpy's _reconstruct, where it lives
#: (module, name) -> object: the only globals a CIFAR-10 python batch may name
_BATCH_GLOBALS = {("numpy.core.multiarray", "_reconstruct"): _RECONSTRUCT,
                  ("numpy._core.multiarray", "_reconstruct"): _RECONSTRUCT,
                  ("numpy", "ndarray"): np.ndarray, ("numpy", "dtype"): np.dtype}


class _BatchUnpickler(pickle.Unpickler):
    """Unpickles a CIFAR-10 python batch: dicts, lists, bytes, numbers and numpy arrays only;
    any other global (``os.system``, ``builtins.eval``...) is refused before it is called."""

    def __init__(self, file, path: Path) -> None:
        super().__init__(file, encoding="bytes")  # the official batches are python 2 pickles
        self.path = path

    def find_class(self, module: str, name: str):
        found = _BATCH_GLOBALS.get((module, name))
        if found is None:
            raise DataError(f"{self.path}: refused to unpickle the global {module}.{name}; a "
                            "CIFAR-10 python batch holds only dicts, lists, bytes and numpy "
                            "arrays (a crafted or foreign file)")
        return found


def _read_batch(path: Path) -> tuple[np.ndarray, np.ndarray]:
    """``(images [n, 3, 32, 32] uint8, labels [n])`` of one python batch, unpickled by
    :class:`_BatchUnpickler`."""
    try:
        with open(path, "rb") as f:
            d = _BatchUnpickler(f, path).load()
        if not isinstance(d, dict):
            raise TypeError(f"expected a dict, got {type(d).__name__}")
        data = d[b"data"]
        if not isinstance(data, np.ndarray) or data.dtype != np.uint8:
            raise TypeError(f"b'data' must be a uint8 array, got {type(data).__name__} "
                            f"{getattr(data, 'dtype', '')}".rstrip())
        x = data.reshape(-1, 3, 32, 32)
        y = np.asarray(d[b"labels"], dtype=np.int64)
        if y.shape != (len(x),):
            raise ValueError(f"{len(x)} images but labels of shape {y.shape}")
    except (pickle.UnpicklingError, EOFError, KeyError, TypeError, ValueError, AttributeError,
            IndexError) as err:
        if isinstance(err, DataError):
            raise
        raise DataError(f"{path}: not a CIFAR-10 python batch, truncated or corrupt "
                        f"({type(err).__name__}: {err})") from None
    return x, y


def _read_batches(folder: Path, names: list[str]) -> tuple[np.ndarray, np.ndarray]:
    xs, ys = [], []
    for name in names:
        path = folder / name
        if not path.is_file():
            raise FileNotFoundError(f"CIFAR-10 batch not found: {path} (expected the python "
                                    f"pickles {', '.join(_BATCHES['train'] + _BATCHES['test'])})")
        x, y = _read_batch(path)
        xs.append(x)
        ys.append(y)
    return np.concatenate(xs), np.concatenate(ys)


def read_cifar10(root: str | Path, *, cache_dir: str | Path | None = None
                 ) -> dict[str, tuple[torch.Tensor, torch.Tensor]]:
    """Read the CIFAR-10 train (50k) and test (10k) images.

    Two layouts are understood:

    - the compact one: ``root/{train,test}.npz.xz``, xz-compressed ``.npz`` with ``jpeg``
      (concatenated JPEG files), ``offsets`` ``[n + 1]`` and ``y``; decoded with Pillow;
    - the standard one: ``root/cifar-10-batches-py/{data_batch_1..5,test_batch}`` (or ``root``
      being that folder), the python pickles of cifar-10-python.tar.gz, read by a restricted
      unpickler: the only globals admitted are numpy's ``_reconstruct``, ``ndarray`` and
      ``dtype``, anything else is a :class:`~gpattn_ppl.errors.DataError` naming the file and
      the global, raised before it could run.

    :param root: the folder holding either layout.
    :param cache_dir: where the decoded JPEG arrays are kept as ``.npy`` (keyed by the
        compressed file's hash and the Pillow version); ``None``: decode every time.
    :returns: split -> ``(images [n, 3, 32, 32] uint8, labels [n] long)``.
    :raises FileNotFoundError: when neither layout is found.
    """
    root = Path(root)
    cache = None if cache_dir is None else Path(cache_dir)
    if all((root / f"{s}.npz.xz").is_file() for s in _BATCHES):
        arrays = {s: _read_npz_xz(root / f"{s}.npz.xz", cache) for s in _BATCHES}
    else:
        folder = root / "cifar-10-batches-py"
        folder = folder if folder.is_dir() else root
        if not (folder / "test_batch").is_file():
            raise FileNotFoundError(
                f"CIFAR-10 not found under {root}: expected train.npz.xz + test.npz.xz (compact "
                "JPEG arrays) or cifar-10-batches-py/{data_batch_1..5,test_batch}")
        arrays = {s: _read_batches(folder, names) for s, names in _BATCHES.items()}
    out = {}
    for split, (x, y) in arrays.items():
        if len(y) == 0:
            raise ValueError(f"CIFAR-10 {split} split under {root} holds no images")
        out[split] = (torch.from_numpy(x), torch.from_numpy(y).long())
    return out


@register_dataset("cifar10", protocols=("official",), modality="image", select_metric="acc",
                  options=("corruptions", "corruption_images"))
def _build_cifar10(*, protocol: str, root, split_seed: int, cache_dir,
                   corruptions=None, corruption_images=None) -> RawData:
    if root is None:
        raise ValueError("cifar10 needs root=PATH: a folder with train.npz.xz + test.npz.xz or "
                         "cifar-10-batches-py/ (nothing is downloaded)")
    files = read_cifar10(root, cache_dir=cache_dir)
    (tr_x, tr_y), (te_x, te_y) = files["train"], files["test"]
    n_tr, n = len(tr_y), len(tr_y) + len(te_y)
    n_val = round(0.1 * n_tr)
    splits = cut(seeded_permutation(n_tr, split_seed), {"val": n_val, "train": n_tr - n_val})
    splits["test"] = torch.arange(n_tr, n)
    # OOD sets that need no download (vision_ood.py; seed 0 whatever the split seed)
    ood = vision_ood_sets(size=tr_x.shape[-1], seed=0)
    # CIFAR-10-C regenerated from the test images (labelled shift sets, cached on disk)
    # (on a seeded, label-stratified subset of ``corruption_images`` test images when set:
    # the same images for every corruption and severity)
    if corruptions is not None:
        c_x, c_y = te_x, te_y
        if corruption_images is not None:
            if isinstance(corruption_images, bool) or not isinstance(corruption_images, int) \
                    or not 1 <= corruption_images <= len(te_y):
                raise ValueError(f"corruption_images must be an integer in 1..{len(te_y)} (the "
                                 f"test images), got {corruption_images!r}")
            keep = stratified_subset(te_y, corruption_images, seed=0)
            c_x, c_y = te_x[keep], te_y[keep]
        ood |= corrupted_sets(c_x, c_y, parse_corruption_sets(corruptions), seed=0,
                              cache_dir=cache_dir)
    return RawData(torch.cat([tr_x, te_x]), torch.cat([tr_y, te_y]), splits, ood, 10,
                   {"source": str(Path(root)),
                    "split": "train/val = seeded 90/10 of the official train; test = official",
                    "ood": "digits (scikit-learn, upsampled), photo_patches (scikit-learn's "
                           "sample photos), gaussian_noise, uniform_noise; seed 0; see "
                           "gpattn_ppl/data/vision_ood.py"},
                   classes=list(CIFAR10_CLASSES), image_stats=(CIFAR10_MEAN, CIFAR10_STD))


# -- transforms ---------------------------------------------------------------------------------
class Normalize:
    """Images to float and per-channel standardisation: ``(x / 255 - mean) / std``.

    Used as :class:`~gpattn_ppl.data.dataset.ArrayDataset` ``transform``; runs on the batch's
    device.

    :param mean: ``[channels]`` channel means in [0, 1] units.
    :param std: ``[channels]`` channel standard deviations in [0, 1] units.
    """

    def __init__(self, mean: Sequence[float] = CIFAR10_MEAN,
                 std: Sequence[float] = CIFAR10_STD) -> None:
        self.mean, self.std = tuple(map(float, mean)), tuple(map(float, std))
        self._stats: dict[str, tuple[torch.Tensor, torch.Tensor]] = {}

    @property
    def black(self) -> tuple[float, ...]:
        """The normalised value of a zero pixel per channel (the padding fill after this)."""
        return tuple(-m / s for m, s in zip(self.mean, self.std))

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        """``x [B, channels, height, width]`` uint8 (0..255) or float (0..1) -> float32
        standardised."""
        x = x.float() / 255.0 if x.dtype == torch.uint8 else x.float()
        key = str(x.device)
        if key not in self._stats:  # made once per device: no host copy per batch
            self._stats[key] = (torch.tensor(self.mean).view(-1, 1, 1).to(x.device),
                                torch.tensor(self.std).view(-1, 1, 1).to(x.device))
        mean, std = self._stats[key]
        return (x - mean) / std

    def __repr__(self) -> str:
        return f"Normalize(mean={self.mean}, std={self.std})"


def augment(x: torch.Tensor, generator: torch.Generator | None = None, *, padding: int = 4,
            fill: float | Sequence[float] = 0.0, flip: bool = True) -> torch.Tensor:
    """Random crop with zero padding plus random horizontal flip, per image, batched.

    Equivalent to torchvision's ``RandomCrop(height, padding)`` + ``RandomHorizontalFlip()`` applied
    to each image independently; one gather, no Python loop over the batch.

    :param x: ``[B, channels, height, width]`` images, any dtype, any device.
    :param generator: source of the crop offsets and flips (on its own device; the draws are
        moved to ``x.device``).
    :param padding: pixels added on every side before cropping back to ``height x width``.
    :param fill: value of the padded pixels, a scalar or one per channel (for images already
        normalised, :attr:`Normalize.black` reproduces black padding).
    :param flip: also flip each image left-right with probability 1/2.
    :returns: ``[B, channels, height, width]``, same dtype and device as ``x``.
    """
    B, _, height, width = x.shape
    device = x.device
    gen_device = generator.device if generator is not None else torch.device("cpu")
    shifts = torch.randint(0, 2 * padding + 1, (2, B), generator=generator, device=gen_device)
    flips = torch.rand(B, generator=generator, device=gen_device) < 0.5
    shifts, flips = to_device(shifts, device) - padding, to_device(flips, device) & flip
    rows = shifts[0, :, None] + torch.arange(height, device=device)  # [B, height] source rows
    cols = shifts[1, :, None] + torch.arange(width, device=device)  # [B, width] source columns
    cols = torch.where(flips[:, None], cols.flip(-1), cols)
    inside = (((rows >= 0) & (rows < height))[:, :, None]
              & ((cols >= 0) & (cols < width))[:, None, :])
    batch = torch.arange(B, device=device)[:, None, None]
    out = x[batch, :, rows.clamp(0, height - 1)[:, :, None], cols.clamp(0, width - 1)[:, None, :]]
    out = out.permute(0, 3, 1, 2)  # [B, height, width, channels] -> [B, channels, height, width]
    if isinstance(fill, (int, float)):
        value = torch.full((), float(fill), dtype=x.dtype, device=device)
    else:
        value = to_device(torch.as_tensor(fill, dtype=x.dtype), device).view(-1, 1, 1)
    return torch.where(inside[:, None], out, value).contiguous()

