"""Reader for CoLA v1.1 raw TSV files (bundled with the package) and the ``cola`` dataset.

The dataset selects checkpoints on validation MCC (the CoLA benchmark's metric).
"""

from __future__ import annotations

from pathlib import Path

import torch

from ..errors import DataError
from ._files import utf8_lines
from .registry import RawData, register_dataset
from .splits import cut, official_split, pool, seeded_permutation

__all__ = ["COLA_CLASSES", "COLA_FILES", "bundled_cola_root", "read_cola"]

#: CoLA's label names in index order (0 = unacceptable, 1 = acceptable).
COLA_CLASSES = ("unacceptable", "acceptable")

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
    for lineno, line in utf8_lines(path):
        if not line:
            continue
        parts = line.split("\t")
        if len(parts) != 4 or parts[1] not in ("0", "1"):
            got = (f"{len(parts)} tab-separated fields" if len(parts) != 4
                   else f"label {parts[1]!r}")
            raise DataError(f"{path}, line {lineno}: expected 'source<TAB>0|1<TAB>mark<TAB>"
                            f"sentence', got {got}: {line[:80]!r}")
        labels.append(int(parts[1]))
        texts.append(parts[3])
    if not texts:
        raise DataError(f"{path} holds no sentences")
    return texts, torch.tensor(labels, dtype=torch.long)


def read_cola(root: str | Path | None = None) -> dict[str, tuple[list[str], torch.Tensor]]:
    """Read the three CoLA splits.

    :param root: a folder with ``in_domain_train.tsv``, ``in_domain_dev.tsv`` and
        ``out_of_domain_dev.tsv`` (``source\\tlabel\\tmark\\tsentence``, no header); ``None``
        reads the copy bundled with the package.
    :returns: split name (keys of :data:`COLA_FILES`) -> ``(sentences, labels [n])``; labels are
        1 = acceptable, 0 = not. File order is kept.
    :raises FileNotFoundError: when a file is missing.
    :raises DataError: a malformed line (naming the file and line: not UTF-8, not four fields,
        a label other than 0 / 1) or a file without sentences.
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


def _pooled_712(n: int, seed: int) -> dict[str, torch.Tensor]:
    n_test, n_val = round(0.2 * n), round(0.1 * n)
    return cut(seeded_permutation(n, seed), {"train": n - n_val - n_test, "val": n_val,
                                             "test": n_test})


@register_dataset("cola", protocols=("official", "712", "sto"), modality="text",
                  select_metric="mcc")
def _build_cola(*, protocol: str, root, split_seed: int, cache_dir) -> RawData:
    files = read_cola(root)
    x, y, n_tr, n = pool(files["in_domain_train"], files["in_domain_dev"])
    if protocol == "official":
        splits = official_split(n_tr, n, split_seed)
        note = "train/val = seeded 90/10 of in_domain_train; test = in_domain_dev"
    else:  # "712" (ours) and "sto" (sto-trans): 7:1:2 of the pooled in-domain sentences
        splits = _pooled_712(n, split_seed)
        note = "seeded 7:1:2 of in_domain_train + in_domain_dev pooled"
    return RawData(x, y, splits, {"cola_ood": files["out_of_domain_dev"]}, 2,
                   {"source": str(bundled_cola_root() if root is None else Path(root)),
                    "split": note, "ood": "cola_ood = out_of_domain_dev"},
                   classes=list(COLA_CLASSES))
