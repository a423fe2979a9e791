"""Images from your own folders: the ``image_folder`` dataset (protocol ``given``).

The training folder holds one sub-folder per class (class names = sorted sub-folder names, images
anywhere below them, symbolic links to files and folders followed, a link loop or a broken
link refused by name); validation and test folders use the same class names, and a missing one is
replaced by a seeded, label-stratified 10% of the training images. Images are read with Pillow,
converted to RGB and resized (bicubic) to ``image_size x image_size``, like the CIFAR reader's
``uint8 [n, 3, H, W]``.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import torch
from PIL import Image

from ..errors import DataError
from .registry import RawData, register_dataset
from .splits import stratified_split
from .tabular import resolve_path

__all__ = ["IMAGE_EXTENSIONS", "read_image", "read_image_folder", "read_images"]

#: file extensions read as images (compared case-insensitively).
IMAGE_EXTENSIONS = (".png", ".jpg", ".jpeg", ".bmp", ".gif", ".webp")


def read_image(path: str | Path, image_size: int | None = 32) -> torch.Tensor:
    """One image file as ``[3, S, S]`` uint8 RGB (resized bicubic; ``None``: native size).

    16-bit greyscale (Pillow modes ``I;16*`` and ``I``) is scaled to 8 bits as ``round(v / 257)``
    (65535 -> 255, 32768 -> 128), not clipped; 16-bit colour PNGs are reduced by Pillow alike.

    :raises ValueError: naming the file when Pillow cannot read it.
    """
    try:
        with Image.open(path) as im:
            if im.mode == "I" or im.mode.startswith("I;16"):  # 16-bit greyscale PNG
                grey = np.rint(np.asarray(im, dtype=np.float64) / 257.0).clip(0, 255)
                im = Image.fromarray(grey.astype(np.uint8))  # mode L
            elif im.mode in ("P", "PA", "LA", "La") or "transparency" in im.info:
                im = im.convert("RGBA")  # alpha is dropped below, as palettes need
            rgb = im.convert("RGB")
    except (OSError, ValueError, SyntaxError, Image.DecompressionBombError) as err:
        raise DataError(f"{path}: not a readable image ({type(err).__name__}: {err})") from None
    if image_size is not None and rgb.size != (image_size, image_size):
        rgb = rgb.resize((image_size, image_size), Image.Resampling.BICUBIC)
    return torch.from_numpy(np.asarray(rgb).transpose(2, 0, 1).copy())


def read_images(paths: Sequence[str | Path], image_size: int | None = 32) -> torch.Tensor:
    """Image files as ``[n, 3, S, S]`` uint8 (see :func:`read_image`).

    :raises ValueError: an unreadable file, or images of different sizes with ``image_size=None``.
    """
    images = [read_image(p, image_size) for p in paths]
    if not images:
        raise ValueError("no images to read")
    shapes = {tuple(im.shape) for im in images}
    if len(shapes) > 1:
        raise ValueError(f"images of different sizes {sorted(shapes)}; set an image_size")
    return torch.stack(images)


def _is_image(p: Path) -> bool:
    return p.suffix.lower() in IMAGE_EXTENSIONS and not p.name.startswith(".") and p.is_file()


def _dangling(p: Path) -> DataError:
    return DataError(f"{p}: a broken symbolic link (to {os.readlink(p)}); remove it or fix its "
                     "target")


def _images_below(folder: Path) -> list[Path]:
    """The image files anywhere below ``folder``, sorted. Symbolic links to files and folders are
    followed; names starting with a dot are skipped.

    :raises DataError: a link to a folder that contains it (a loop), a broken link, or a folder
        that cannot be listed, each by name.
    """
    found = []
    stack = [(folder, frozenset([folder.resolve()]))]
    while stack:
        here, above = stack.pop()
        try:
            entries = sorted(here.iterdir())
        except OSError as err:
            raise DataError(f"{here}: cannot list the folder ({err.strerror})") from None
        for p in entries:
            if p.name.startswith("."):
                continue
            if p.is_dir():
                real = p.resolve()
                if real in above:
                    raise DataError(f"{p}: a symbolic link to {real}, a folder that contains it "
                                    "(a loop); remove the link")
                stack.append((p, above | {real}))
            elif _is_image(p):
                found.append(p)
            elif p.is_symlink() and not p.exists():
                raise _dangling(p)
    return sorted(found)


def read_image_folder(folder: str | Path, *, image_size: int | None = 32,
                      classes: list[str] | None = None, ood: bool = False
                      ) -> tuple[torch.Tensor, torch.Tensor, list[str]]:
    """Read a folder of images with one sub-folder per class.

    :param folder: the folder; images anywhere below a class sub-folder belong to that class
        (symbolic links to files and folders are followed).
    :param image_size: side ``S`` the images are resized to (bicubic); ``None``: native size.
    :param classes: the class names in index order (a training folder's); ``None``: this is the
        training folder and its sorted sub-folder names are the classes.
    :param ood: an OOD folder: images may also lie directly in it, and images directly in it or
        in a sub-folder that is not a known class get label -1.
    :returns: ``(images [n, 3, S, S] uint8, labels [n] long, classes)``; files in sorted order.
    :raises ValueError: no images, an empty training class folder, fewer than 2 training
        classes, an unknown class sub-folder, images outside class sub-folders (except OOD), an
        unreadable file, a symbolic link loop or a broken link.
    """
    folder = Path(folder)
    for p in folder.iterdir():
        if p.is_symlink() and not p.exists() and not p.name.startswith("."):
            raise _dangling(p)
    subdirs = sorted(p for p in folder.iterdir() if p.is_dir() and not p.name.startswith("."))
    loose = sorted(p for p in folder.iterdir() if _is_image(p))
    exts = " ".join(IMAGE_EXTENSIONS)
    training = classes is None
    if training:
        classes = [p.name for p in subdirs]
        if len(classes) < 2:
            raise DataError(f"{folder}: a training folder needs one sub-folder per class and at "
                             f"least 2 classes, found {len(classes)} ({', '.join(classes)})")
    index = {c: i for i, c in enumerate(classes)}
    if loose and not ood:
        raise DataError(f"{folder}: images must lie in one sub-folder per class, found "
                         f"{len(loose)} directly in it (e.g. {loose[0].name})")
    files: list[tuple[Path, int]] = [(p, -1) for p in loose]
    for sub in subdirs:
        label = index.get(sub.name, -1)
        if label < 0 and not ood:
            raise DataError(f"{sub}: unknown class folder {sub.name!r}; known classes (the "
                             f"training folder's sub-folders): {', '.join(classes)}")
        found = _images_below(sub)
        if not found and training:
            raise DataError(f"{sub}: class folder {sub.name!r} holds no images ({exts})")
        files.extend((p, label) for p in found)
    if not files:
        raise DataError(f"{folder}: no images ({exts})")
    x = read_images([p for p, _ in files], image_size)
    return x, torch.tensor([k for _, k in files], dtype=torch.long), list(classes)


@register_dataset("image_folder", protocols=("given",), modality="image",
                  options=("train_dir", "val_dir", "test_dir", "ood_dirs", "image_size"))
def _build_image_folder(*, protocol: str, root, split_seed: int, cache_dir, train_dir=None,
                        val_dir=None, test_dir=None, ood_dirs=None, image_size: int = 32
                        ) -> RawData:
    if train_dir is None:
        raise ValueError("image_folder needs train_dir=PATH (data.train_dir): a folder with one "
                         "sub-folder of images per class")
    if isinstance(image_size, bool) or not isinstance(image_size, int) or image_size < 1:
        raise ValueError(f"data.image_size must be an int >= 1, got {image_size!r}")
    ood_dirs = {} if ood_dirs is None else ood_dirs
    if not isinstance(ood_dirs, dict):
        raise ValueError(f"data.ood_dirs must map a name to a folder, got {ood_dirs!r}")
    train_path = resolve_path(train_dir, root, "data.train_dir", folder=True)
    given = {s: (None if d is None else resolve_path(d, root, f"data.{s}_dir", folder=True))
             for s, d in (("val", val_dir), ("test", test_dir))}
    ood_paths = {str(k): resolve_path(v, root, f"data.ood_dirs.{k}", folder=True)
                 for k, v in ood_dirs.items()}

    x, y, classes = read_image_folder(train_path, image_size=image_size)
    n_train = len(y)
    missing = {s: 0.1 for s, p in given.items() if p is None}
    splits = (stratified_split(y, missing, split_seed) if missing
              else {"train": torch.arange(n_train)})
    xs, notes = [x], {}
    for split, path in given.items():
        if path is None:
            notes[split] = (f"a seeded stratified 10% of train_dir (split_seed={split_seed}; "
                            f"no {split}_dir given)")
            continue
        images, labels, _ = read_image_folder(path, image_size=image_size, classes=classes)
        start = sum(len(a) for a in xs)
        splits[split] = torch.arange(start, start + len(labels))
        xs.append(images)
        y = torch.cat([y, labels])
        notes[split] = str(path)
    ood = {k: read_image_folder(p, image_size=image_size, classes=classes, ood=True)[:2]
           for k, p in ood_paths.items()}
    held = f" less the held-out {' and '.join(missing)} images" if missing else ""
    info = {"source": str(train_path), "image_size": image_size, "train_dir_images": n_train,
            "split": "; ".join([f"train = train_dir{held}",
                                *(f"{s} = {note}" for s, note in notes.items())]),
            "ood": {k: str(p) for k, p in ood_paths.items()},
            "ood_unlabelled": {k: int((lab < 0).sum()) for k, (_, lab) in ood.items()}}
    if given["test"] is None:
        info["notes"] = ["no test_dir: the test split is a seeded stratified 10% held out of "
                         "train_dir"]
    return RawData(torch.cat(xs), y, {s: splits[s] for s in ("train", "val", "test")}, ood,
                   len(classes), info, classes=classes)
