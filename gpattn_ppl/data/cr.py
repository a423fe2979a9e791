"""Reader for the CR customer-review sentences (Hu & Liu 2004; Hendrycks & Gimpel's splits)."""

from __future__ import annotations

from pathlib import Path

import torch

from ..errors import DataError
from ._files import utf8_lines

__all__ = ["read_cr"]

_SPLITS = ("train", "dev", "test")


def _read(path: Path) -> tuple[list[str], torch.Tensor]:
    texts, labels = [], []
    for lineno, line in utf8_lines(path):
        if not line.strip():
            continue
        parts = line.rsplit("\t", 1)
        if len(parts) != 2 or parts[1].strip() not in ("0", "1"):
            raise DataError(f"{path}, line {lineno}: expected 'sentence<TAB>0|1', "
                            f"got {line[:80]!r}")
        texts.append(parts[0].strip())
        labels.append(int(parts[1]))
    if not texts:
        raise DataError(f"{path} holds no sentences")
    return texts, torch.tensor(labels, dtype=torch.long)


def read_cr(root: str | Path,
            splits: tuple[str, ...] = _SPLITS) -> dict[str, tuple[list[str], torch.Tensor]]:
    """Read CR sentences from ``root/CR.{train,dev,test}``.

    Each line is ``sentence<TAB>label`` (1 = positive, 0 = negative); the sentences are already
    lower-cased and tokenised.

    :param root: the folder holding the ``CR.*`` files.
    :param splits: which of ``"train"``, ``"dev"``, ``"test"`` to read.
    :returns: split -> ``(sentences, labels [n])``.
    :raises FileNotFoundError: when a requested file is missing.
    :raises DataError: a malformed line (naming the file and line) or an empty file.
    """
    root = Path(root)
    out = {}
    for split in splits:
        if split not in _SPLITS:
            raise ValueError(f"unknown CR split {split!r}; allowed: {', '.join(_SPLITS)}")
        path = root / f"CR.{split}"
        if not path.is_file():
            raise FileNotFoundError(f"CR file not found: {path} (expected Hendrycks & Gimpel's "
                                    "'sentence<TAB>label' file CR.{train,dev,test})")
        out[split] = _read(path)
    return out
