"""Reader for the IMDB Large Movie Review dataset (aclImdb v1.0, Maas et al. 2011)."""

from __future__ import annotations

import json
import lzma
import re
from pathlib import Path

import torch

__all__ = ["read_imdb"]

_SPLITS = ("train", "test")
_BR = re.compile(r"<br\s*/?>", re.IGNORECASE)
_FILE = re.compile(r"(\d+)_(\d+)\.txt")


def _clean(text: str, strip_html: bool) -> str:
    return _BR.sub(" ", text) if strip_html else text


def _read_jsonl(path: Path, strip_html: bool) -> tuple[list[str], torch.Tensor]:
    opener = lzma.open if path.suffix == ".xz" else open
    with opener(path, "rb") as f:
        lines = f.read().splitlines()
    texts, labels = [], []
    for line in lines:
        if line.strip():
            row = json.loads(line)
            texts.append(_clean(row["text"], strip_html))
            labels.append(int(row["label"]))
    return texts, torch.tensor(labels, dtype=torch.long)


def _read_folder(split_dir: Path, strip_html: bool) -> tuple[list[str], torch.Tensor]:
    texts, labels = [], []
    for polarity, label in (("pos", 1), ("neg", 0)):
        folder = split_dir / polarity
        if not folder.is_dir():
            raise FileNotFoundError(f"IMDB folder not found: {folder} (expected aclImdb's "
                                    f"'<index>_<rating>.txt' review files)")
        files = []
        for p in folder.iterdir():
            m = _FILE.fullmatch(p.name)
            if m:
                files.append((int(m.group(1)), p))
        for _, p in sorted(files):
            texts.append(_clean(p.read_bytes().decode("utf-8"), strip_html))
            labels.append(label)
    return texts, torch.tensor(labels, dtype=torch.long)


def read_imdb(root: str | Path, *,
              strip_html: bool = True) -> dict[str, tuple[list[str], torch.Tensor]]:
    """Read the labelled IMDB train and test reviews.

    Two layouts are understood:

    - the compact one: ``root/imdb_{train,test}.jsonl.xz`` (or ``.jsonl``), one JSON object per
      line with at least ``text`` and ``label`` (1 = positive);
    - the standard one: ``root/aclImdb/{train,test}/{pos,neg}/<index>_<rating>.txt``, or ``root``
      itself being the ``aclImdb`` folder; the unlabelled ``unsup`` reviews are ignored.

    Both give the same order (positive then negative, by file index), hence the same splits.

    :param root: the folder holding either layout.
    :param strip_html: replace the ``<br />`` tags in the reviews by a space.
    :returns: ``{"train": (texts, labels [n]), "test": (texts, labels [n])}``.
    :raises FileNotFoundError: when neither layout is found under ``root``.
    """
    root = Path(root)
    if not root.is_dir():
        raise FileNotFoundError(f"IMDB folder not found: {root} (expected imdb_train.jsonl.xz + "
                                "imdb_test.jsonl.xz, or the aclImdb/ folder)")
    out = {}
    for split in _SPLITS:
        candidates = [root / f"imdb_{split}.jsonl.xz", root / f"imdb_{split}.jsonl"]
        found = next((p for p in candidates if p.is_file()), None)
        if found is not None:
            out[split] = _read_jsonl(found, strip_html)
            continue
        acl = root / "aclImdb" if (root / "aclImdb").is_dir() else root
        if (acl / split).is_dir():
            out[split] = _read_folder(acl / split, strip_html)
            continue
        raise FileNotFoundError(
            f"IMDB {split} split not found under {root}: expected {candidates[0].name} (compact "
            f"JSON lines) or aclImdb/{split}/{{pos,neg}}/*.txt (the standard layout)")
    for split, (texts, _) in out.items():
        if not texts:
            raise ValueError(f"IMDB {split} split under {root} holds no reviews")
    return out
