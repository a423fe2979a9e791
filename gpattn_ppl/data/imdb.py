"""Reader for the IMDB Large Movie Review dataset (aclImdb v1.0, Maas et al. 2011) and the
``imdb`` dataset (OOD set: the CR test sentences); it selects checkpoints on validation accuracy.
"""

from __future__ import annotations

import re
from pathlib import Path

import torch

from ..errors import DataError
from ._files import class_label, decode_utf8, json_line, utf8_lines
from .cr import read_cr
from .registry import RawData, register_dataset
from .splits import cut, official_split, pool, seeded_permutation

__all__ = ["IMDB_CLASSES", "read_imdb"]

#: IMDB's (and CR's) label names in index order (0 = negative, 1 = positive).
IMDB_CLASSES = ("negative", "positive")

_SPLITS = ("train", "test")
_BR = re.compile(r"<br\s*/?>", re.IGNORECASE)
_FILE = re.compile(r"(\d+)_(\d+)\.txt")


def _clean(text: str, strip_html: bool) -> str:
    return _BR.sub(" ", text) if strip_html else text


def _read_jsonl(path: Path, strip_html: bool) -> tuple[list[str], torch.Tensor]:
    texts, labels = [], []
    for lineno, line in utf8_lines(path):
        if not line.strip():
            continue
        where = f"{path}, line {lineno}"
        row = json_line(line, where)
        if not isinstance(row, dict):
            raise DataError(f"{where}: expected a JSON object with 'text' and 'label', got "
                            f"{type(row).__name__}")
        for key in ("text", "label"):
            if key not in row:
                raise DataError(f"{where}: no key {key!r} (keys found: "
                                f"{', '.join(map(repr, row)) or 'none'})")
        if not isinstance(row["text"], str):
            raise DataError(f"{where}: 'text' must be a string, got "
                            f"{'null' if row['text'] is None else type(row['text']).__name__}")
        texts.append(_clean(row["text"], strip_html))
        labels.append(class_label(row["label"], f"{where}, key 'label'", len(IMDB_CLASSES)))
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
            texts.append(_clean(decode_utf8(p, p.read_bytes()), strip_html))
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
    :raises DataError: naming the file and line: a truncated ``.xz``, bytes that are not UTF-8,
        invalid JSON, a missing or non-string ``text``, a label that is not 0 or 1.
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
            raise DataError(f"IMDB {split} split under {root} holds no reviews")
    return out


def _find_cr(root: Path) -> Path | None:
    for folder in (root, root / "cr", root.parent / "cr"):
        if (folder / "CR.test").is_file():
            return folder
    return None


@register_dataset("imdb", protocols=("official", "kep"), modality="text", options=("cr_root",),
                  encoder_defaults={"max_vocab": 30000}, select_metric="acc")
def _build_imdb(*, protocol: str, root, split_seed: int, cache_dir, cr_root=None) -> RawData:
    if root is None:
        raise ValueError("imdb needs root=PATH: a folder with imdb_{train,test}.jsonl.xz or "
                         "aclImdb/ (nothing is downloaded)")
    files = read_imdb(root)
    x, y, n_tr, n = pool(files["train"], files["test"])
    if protocol == "official":
        splits = official_split(n_tr, n, split_seed)
        note = "train/val = seeded 90/10 of the official train; test = official test"
    else:  # KEP-SVGP: 35k/5k/10k of the merged 50k
        n_val, n_test = round(0.1 * n), round(0.2 * n)
        splits = cut(seeded_permutation(n, split_seed), {"train": n - n_val - n_test,
                                                         "val": n_val, "test": n_test})
        note = "seeded 70/10/20 of train + test merged"
    info = {"source": str(Path(root)), "split": note}
    ood = {}
    if cr_root is None:
        found = _find_cr(Path(root))
        if found is None:
            info["notes"] = ["no CR.test found next to the IMDB folder: ood is empty "
                             "(pass cr_root=PATH)"]
    else:
        found = None if cr_root is False else Path(cr_root)
    if found is not None:
        ood["cr"] = read_cr(found, ("test",))["test"]
        info["ood"] = f"cr = {found / 'CR.test'}"
    return RawData(x, y, splits, ood, 2, info, classes=list(IMDB_CLASSES))
