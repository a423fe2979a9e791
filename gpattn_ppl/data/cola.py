"""Reader for CoLA v1.1 raw TSV files (bundled with the package)."""

from __future__ import annotations

from pathlib import Path

import torch

__all__ = ["COLA_FILES", "bundled_cola_root", "read_cola"]

#: split name -> file name of the CoLA v1.1 public release (``raw/``).
COLA_FILES = {
    "in_domain_train": "in_domain_train.tsv",
    "in_domain_dev": "in_domain_dev.tsv",
    "out_of_domain_dev": "out_of_domain_dev.tsv",
}


def bundled_cola_root() -> Path:
    """The folder of the CoLA files shipped inside the package."""
    return Path(__file__).resolve().parent / "cola"


def _read_tsv(path: Path) -> tuple[list[str], torch.Tensor]:
    texts, labels = [], []
    with open(path, encoding="utf-8") as f:
        for lineno, line in enumerate(f, 1):
            line = line.rstrip("\r\n")
            if not line:
                continue
            parts = line.split("\t")
            if len(parts) != 4 or parts[1] not in ("0", "1"):
                raise ValueError(f"{path}:{lineno}: expected 'source<TAB>0|1<TAB>mark<TAB>"
                                 f"sentence', got {line[:80]!r}")
            labels.append(int(parts[1]))
            texts.append(parts[3])
    if not texts:
        raise ValueError(f"{path} holds no sentences")
    return texts, torch.tensor(labels, dtype=torch.long)


def read_cola(root: str | Path | None = None) -> dict[str, tuple[list[str], torch.Tensor]]:
    """Read the three CoLA splits.

    :param root: a folder with ``in_domain_train.tsv``, ``in_domain_dev.tsv`` and
        ``out_of_domain_dev.tsv`` (``source\\tlabel\\tmark\\tsentence``, no header); ``None``
        reads the copy bundled with the package.
    :returns: split name (keys of :data:`COLA_FILES`) -> ``(sentences, labels [n])``; labels are
        1 = acceptable, 0 = not. File order is kept.
    :raises FileNotFoundError: when a file is missing.
    """
    folder = bundled_cola_root() if root is None else Path(root)
    out = {}
    for split, name in COLA_FILES.items():
        path = folder / name
        if not path.is_file():
            raise FileNotFoundError(
                f"CoLA file not found: {path} (expected the CoLA v1.1 raw TSVs "
                f"{', '.join(COLA_FILES.values())} in {folder})")
        out[split] = _read_tsv(path)
    return out
