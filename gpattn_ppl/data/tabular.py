"""Labelled texts from your own files: the ``csv`` and ``jsonl`` datasets (protocol ``given``).

``csv`` reads delimited files with a header row (``.tsv`` tab, ``.csv`` comma, else sniffed);
``jsonl`` reads one JSON object per line. Both take the training file and, optionally,
validation, test and OOD files; a missing validation or test file is replaced by a seeded,
label-stratified 10% of the training file. The classes are the sorted distinct training labels,
by one rule whatever else a file holds: a label that is an integer literal (an optional sign and
ASCII digits: ``1``, ``01``, ``+1``) is that integer, any other label is its string (``1.0``,
``pos``); the integers come first in numeric order, then the other labels sorted.
Every problem in a file is reported with its path, line number and column. Files are UTF-8 (a
leading byte-order mark is dropped); a header naming a column twice and a JSON object with a
duplicate key are refused rather than one of the two silently kept.
"""

from __future__ import annotations

import codecs
import csv
import io
import re
from pathlib import Path

import torch

from ..errors import DataError
from ._files import decode_utf8, json_line
from .registry import RawData, register_dataset
from .splits import stratified_split

__all__ = ["read_labelled_texts", "read_text_lines", "read_texts", "resolve_path"]

_INT = re.compile(r"[+-]?[0-9]+")
_FORMATS = ("csv", "jsonl")
_SNIFF_BYTES = 65536


def resolve_path(path: str | Path, root: str | Path | None, key: str, *,
                 folder: bool = False) -> Path:
    """``path`` (relative paths are taken under ``root`` when it is given), checked to exist.

    :param key: the config key named in the error, e.g. ``"data.train_file"``.
    :param folder: expect a folder instead of a file.
    :raises FileNotFoundError: ``"<key>: no such file: <path>"``.
    """
    p = Path(path).expanduser()
    if root is not None and not p.is_absolute():
        p = Path(root).expanduser() / p
    if not (p.is_dir() if folder else p.is_file()):
        raise FileNotFoundError(f"{key}: no such {'folder' if folder else 'file'}: {p}")
    return p


def _decode(path: Path) -> str:
    """The file as text: UTF-8 (a leading byte-order mark is dropped)."""
    data = path.read_bytes()
    if data.startswith(codecs.BOM_UTF8):
        data = data[len(codecs.BOM_UTF8):]
    return decode_utf8(path, data)


def _delimiter(path: Path, text: str, delimiter: str) -> str:
    if delimiter != "auto":
        if not isinstance(delimiter, str) or len(delimiter) != 1:
            raise ValueError(f"data.delimiter must be 'auto' or one character, got {delimiter!r}")
        return delimiter
    suffix = path.suffix.lower()
    if suffix == ".tsv":
        return "\t"
    if suffix == ".csv":
        return ","
    try:
        return csv.Sniffer().sniff(text[:_SNIFF_BYTES], delimiters=",\t;|").delimiter
    except csv.Error:
        raise DataError(f"{path}: cannot detect the delimiter (not .csv or .tsv); set "
                         "data.delimiter to it") from None


def _rows_csv(path: Path, text_column: str, label_column: str, delimiter: str,
              need_label: bool) -> tuple[list[str], list, list[int]]:
    """``(texts, raw labels or None, line numbers)`` of a delimited file with a header row."""
    text = _decode(path)
    reader = csv.reader(io.StringIO(text, newline=""), delimiter=_delimiter(path, text, delimiter))
    texts, labels, lines = [], [], []
    header = None
    while True:
        start = reader.line_num + 1
        try:
            row = next(reader)
        except StopIteration:
            break
        except csv.Error as err:
            raise DataError(f"{path}, line {start}: malformed row ({err})") from None
        if not row or (len(row) == 1 and not row[0].strip()):
            continue  # blank line
        if header is None:
            header = [c.strip() for c in row]
            found = ", ".join(repr(c) for c in header)
            twice = sorted({c for c in header if c and header.count(c) > 1})
            if twice:
                raise DataError(f"{path}, line {start}: duplicate column {twice[0]!r} in the "
                                 f"header (columns found: {found}); rename one")
            if text_column not in header:
                raise DataError(f"{path}, line {start}: no column {text_column!r} in the header "
                                 f"(columns found: {found}); set data.text_column")
            if need_label and label_column not in header:
                raise DataError(f"{path}, line {start}: no column {label_column!r} in the header "
                                 f"(columns found: {found}); set data.label_column")
            t_col = header.index(text_column)
            l_col = header.index(label_column) if label_column in header else None
            continue
        if len(row) != len(header):
            raise DataError(f"{path}, line {start}: expected {len(header)} fields (columns: "
                             f"{', '.join(header)}), got {len(row)}; quote fields that contain "
                             "the delimiter")
        texts.append(row[t_col])
        labels.append(None if l_col is None else row[l_col])
        lines.append(start)
    if header is None:
        raise DataError(f"{path}: empty file (no header row, no examples)")
    return texts, labels, lines


def _rows_jsonl(path: Path, text_column: str, label_column: str,
                need_label: bool) -> tuple[list[str], list, list[int]]:
    """``(texts, raw labels or None, line numbers)`` of a JSON-lines file."""
    texts, labels, lines = [], [], []
    for lineno, line in enumerate(_decode(path).split("\n"), 1):
        if not line.strip():
            continue
        obj = json_line(line, f"{path}, line {lineno}")
        if not isinstance(obj, dict):
            raise DataError(f"{path}, line {lineno}: expected a JSON object, got "
                             f"{type(obj).__name__}")
        found = ", ".join(repr(k) for k in obj)
        if text_column not in obj:
            raise DataError(f"{path}, line {lineno}: no key {text_column!r} (keys found: "
                             f"{found}); set data.text_column")
        if need_label and label_column not in obj:
            raise DataError(f"{path}, line {lineno}: no key {label_column!r} (keys found: "
                             f"{found}); set data.label_column")
        if not isinstance(obj[text_column], str):
            raise DataError(f"{path}, line {lineno}, column {text_column!r}: the text must be a "
                             f"string, got {type(obj[text_column]).__name__}")
        for key in (text_column, label_column):
            _no_surrogate(obj.get(key), f"{path}, line {lineno}, column {key!r}")
        texts.append(obj[text_column])
        labels.append(obj.get(label_column))
        lines.append(lineno)
    return texts, labels, lines


def _no_surrogate(value, where: str) -> None:
    """Raise :class:`DataError` for a string holding a lone surrogate (a JSON escape such as
    ``\\ud800`` that is no character: no tokenizer or UTF-8 file can take it)."""
    if not isinstance(value, str):
        return
    try:
        value.encode("utf-8")
    except UnicodeEncodeError as err:
        raise DataError(f"{where}: a lone surrogate U+{ord(value[err.start]):04X} (a JSON \\u "
                        f"escape of half a character) at character {err.start + 1}; write the "
                        "character itself or its escaped pair") from None


def _label_string(value, where: str) -> str | None:
    """A raw label as a stripped string (``None`` / empty -> ``None``)."""
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (str, int)):
        raise DataError(f"{where}: a label must be a string or an integer, got {value!r}")
    value = str(value).strip()
    return value or None


def _canonical(label: str) -> str:
    """The class a (stripped) label names, one rule whatever else the file holds: an integer
    literal (an optional sign and ASCII digits) is that integer, written shortest (``01``,
    ``+1`` and ``1`` are ``1``; ``-0`` is ``0``); any other string is itself (``1.0``,
    ``one``, ``pos``)."""
    if not _INT.fullmatch(label):
        return label
    digits = label.lstrip("+-").lstrip("0") or "0"
    return "-" + digits if label.startswith("-") and digits != "0" else digits


def _class_order(label: str) -> tuple:
    """Sort key of canonical labels: the integers first, in numeric order (compared as digit
    strings, so no length limit applies), then the other labels as strings."""
    if not _INT.fullmatch(label):
        return (1, label)
    if label.startswith("-"):
        digits = label[1:]
        return (0, 0, -len(digits), tuple(-int(c) for c in digits))
    return (0, 1, len(label), label)


def _class_list(labels: list[str]) -> list[str]:
    """The distinct classes of ``labels`` (:func:`_canonical`): integers in numeric order, then
    the other labels sorted."""
    return sorted({_canonical(v) for v in labels}, key=_class_order)


def read_text_lines(path: str | Path) -> list[str]:
    """The non-blank lines of a UTF-8 text file, one input each (``predict`` on a ``.txt``).

    Rule: a leading UTF-8 byte-order mark is dropped; lines end only at ``\\n`` or ``\\r\\n``
    (form feed, ``\\x1c``-``\\x1e``, ``\\x85``, ``\\u2028``, ``\\u2029`` and a lone ``\\r``
    stay inside the line, unlike :meth:`str.splitlines`); each line is stripped of surrounding
    whitespace and blank lines are skipped (a file of blank lines gives ``[]``).

    :raises FileNotFoundError: no such file.
    :raises DataError: bytes that are not UTF-8 (naming file, line and byte column).
    """
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"no such file: {path}")
    data = path.read_bytes()
    if data.startswith(codecs.BOM_UTF8):
        data = data[len(codecs.BOM_UTF8):]
    text = decode_utf8(path, data)
    return [s for s in (line.strip() for line in text.split("\n")) if s]


def read_texts(path: str | Path, *, fmt: str = "csv", text_column: str = "text",
               delimiter: str = "auto") -> list[str]:
    """The texts of a CSV/TSV or JSON-lines file, other columns ignored (inputs to predict).

    :raises FileNotFoundError: no such file.
    :raises ValueError: as :func:`read_labelled_texts`, naming the file, line and column.
    """
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"no such file: {path}")
    if fmt not in _FORMATS:
        raise ValueError(f"fmt must be one of {', '.join(_FORMATS)}, got {fmt!r}")
    if fmt == "csv":
        texts, _, lines = _rows_csv(path, text_column, "", delimiter, False)
    else:
        texts, _, lines = _rows_jsonl(path, text_column, "", False)
    if not texts:
        raise DataError(f"{path}: no examples (empty file)")
    for text, line in zip(texts, lines):
        if not text.strip():
            raise DataError(f"{path}, line {line}, column {text_column!r}: the text is empty")
    return texts


def read_labelled_texts(path: str | Path, *, fmt: str = "csv", text_column: str = "text",
                        label_column: str = "label", delimiter: str = "auto",
                        classes: list[str] | None = None, ood: bool = False
                        ) -> tuple[list[str], torch.Tensor, list[str]]:
    """Read one CSV/TSV or JSON-lines file of labelled texts.

    :param path: the file (UTF-8; CSV/TSV with a header row, JSON lines one object per line).
    :param fmt: ``"csv"`` or ``"jsonl"``.
    :param text_column: the column / key holding the text.
    :param label_column: the column / key holding the label (a string or an integer).
    :param delimiter: CSV only: ``"auto"`` (``.tsv`` tab, ``.csv`` comma, else sniffed) or
        one character.
    :param classes: the label names in index order (a training file's classes); ``None``: this
        is the training file, its distinct labels become the classes (integer literals read as
        their integer, ``01`` = ``+1`` = ``1``, in numeric order, then the other labels sorted;
        the module docstring has the rule).
    :param ood: an OOD file: the label column may be missing and labels outside ``classes``
        (or empty) read as -1.
    :returns: ``(texts, labels [n] long, classes)``.
    :raises ValueError: naming the file, line and column: a malformed row, a missing column,
        an empty text or label, an unknown label, bad UTF-8, invalid JSON, an empty file, or a
        training file with fewer than 2 classes.
    """
    path = Path(path)
    if fmt not in _FORMATS:
        raise ValueError(f"fmt must be one of {', '.join(_FORMATS)}, got {fmt!r}")
    need_label = not ood
    if fmt == "csv":
        texts, raw, lines = _rows_csv(path, text_column, label_column, delimiter, need_label)
    else:
        texts, raw, lines = _rows_jsonl(path, text_column, label_column, need_label)
    if not texts:
        raise DataError(f"{path}: no examples (empty file)")
    for text, line in zip(texts, lines):
        if not text.strip():
            raise DataError(f"{path}, line {line}, column {text_column!r}: the text is empty")
    strings = []
    for value, line in zip(raw, lines):
        where = f"{path}, line {line}, column {label_column!r}"
        label = _label_string(value, where)
        if label is None and not ood:
            raise DataError(f"{where}: the label is empty")
        strings.append(label)
    if classes is None:
        classes = _class_list(strings)
        if len(classes) < 2:
            raise DataError(f"{path}: a training file needs at least 2 classes in column "
                             f"{label_column!r}, found {len(classes)} ({', '.join(classes)})")
    classes = [str(c) for c in classes]
    index: dict[str, int] = {}
    for i, c in enumerate(classes):
        key = _canonical(c)
        if key in index:
            raise DataError(f"{path}: the classes {classes[index[key]]!r} and {c!r} are one "
                            f"label, the integer {key} (labels that are integer literals are "
                            "read as that integer); train the run again on its files")
        index[key] = i
    labels = torch.full((len(texts),), -1, dtype=torch.long)
    for i, (label, line) in enumerate(zip(strings, lines)):
        if label is None:
            continue
        k = index.get(_canonical(label))
        if k is None and not ood:
            raise DataError(f"{path}, line {line}, column {label_column!r}: unknown label "
                             f"{label!r}; known classes (from the training file): "
                             f"{', '.join(classes)}")
        labels[i] = -1 if k is None else k
    return texts, labels, classes


def _build_files(fmt: str, *, protocol: str, root, split_seed: int, train_file=None,
                 val_file=None, test_file=None, ood_files=None, text_column: str = "text",
                 label_column: str = "label", delimiter: str = "auto") -> RawData:
    name = "csv" if fmt == "csv" else "jsonl"
    if train_file is None:
        raise ValueError(f"{name} needs train_file=PATH (data.train_file), a {fmt} file with "
                         f"columns {text_column!r} and {label_column!r}")
    for key, value in (("text_column", text_column), ("label_column", label_column)):
        if not isinstance(value, str) or not value:
            raise ValueError(f"data.{key} must be a non-empty string, got {value!r}")
    if text_column == label_column:
        raise ValueError(f"data.text_column and data.label_column are both {text_column!r}")
    ood_files = {} if ood_files is None else ood_files
    if not isinstance(ood_files, dict):
        raise ValueError(f"data.ood_files must map a name to a file, got {ood_files!r}")
    read = dict(fmt=fmt, text_column=text_column, label_column=label_column, delimiter=delimiter)
    train_path = resolve_path(train_file, root, "data.train_file")
    given = {s: (None if f is None else resolve_path(f, root, f"data.{s}_file"))
             for s, f in (("val", val_file), ("test", test_file))}
    ood_paths = {str(k): resolve_path(v, root, f"data.ood_files.{k}") for k, v in ood_files.items()}

    x, y, classes = read_labelled_texts(train_path, **read)
    n_train = len(x)
    missing = {s: 0.1 for s, p in given.items() if p is None}
    splits = (stratified_split(y, missing, split_seed) if missing
              else {"train": torch.arange(n_train)})
    notes = {}
    for split, path in given.items():
        if path is None:
            notes[split] = (f"a seeded stratified 10% of train_file (split_seed={split_seed}; "
                            f"no {split}_file given)")
            continue
        texts, labels, _ = read_labelled_texts(path, classes=classes, **read)
        splits[split] = torch.arange(len(x), len(x) + len(texts))
        x, y = x + texts, torch.cat([y, labels])
        notes[split] = str(path)
    ood, unknown = {}, {}
    for key, path in ood_paths.items():
        texts, labels, _ = read_labelled_texts(path, classes=classes, ood=True, **read)
        ood[key] = (texts, labels)
        unknown[key] = int((labels < 0).sum())
    held = f" less the held-out {' and '.join(missing)} rows" if missing else ""
    info = {"source": str(train_path), "format": fmt, "train_file_rows": n_train,
            "split": "; ".join([f"train = train_file{held}",
                                *(f"{s} = {note}" for s, note in notes.items())]),
            "ood": {k: str(p) for k, p in ood_paths.items()},
            "ood_unlabelled": unknown,
            "columns": {"text": text_column, "label": label_column}}
    if given["test"] is None:
        info["notes"] = ["no test_file: the test split is a seeded stratified 10% held out of "
                         "train_file"]
    return RawData(x, y, {s: splits[s] for s in ("train", "val", "test")}, ood, len(classes),
                   info, classes=classes)


@register_dataset("csv", protocols=("given",), modality="text",
                  options=("train_file", "val_file", "test_file", "ood_files", "text_column",
                           "label_column", "delimiter"))
def _build_csv(*, protocol: str, root, split_seed: int, cache_dir, **options) -> RawData:
    return _build_files("csv", protocol=protocol, root=root, split_seed=split_seed, **options)


@register_dataset("jsonl", protocols=("given",), modality="text",
                  options=("train_file", "val_file", "test_file", "ood_files", "text_column",
                           "label_column"))
def _build_jsonl(*, protocol: str, root, split_seed: int, cache_dir, **options) -> RawData:
    return _build_files("jsonl", protocol=protocol, root=root, split_seed=split_seed, **options)
