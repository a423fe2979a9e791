"""Reading data files so that every problem names the file and, for a row, its line."""

from __future__ import annotations

import json
import lzma
import re
from pathlib import Path

from ..errors import DataError
from ..schema import DuplicateKeyError, refuse_duplicate_keys

_INT = re.compile(r"[+-]?[0-9]+")


def read_bytes(path: Path) -> bytes:
    """The file's bytes, decompressed when it ends in ``.xz``.

    :raises DataError: a truncated or corrupt ``.xz`` file (naming it).
    """
    if path.suffix != ".xz":
        return path.read_bytes()
    try:
        return lzma.decompress(path.read_bytes())
    except (lzma.LZMAError, EOFError) as err:
        raise DataError(f"{path}: not a readable .xz file, truncated or corrupt ({err}); "
                        "download or compress it again") from None


def decode_utf8(path: Path, data: bytes) -> str:
    """``data`` (the bytes of ``path``) decoded as UTF-8, exactly.

    :raises DataError: bytes that are not UTF-8 (naming file, line and byte column).
    """
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as err:
        line = data.count(b"\n", 0, err.start) + 1
        col = err.start - (data.rfind(b"\n", 0, err.start) + 1) + 1
        raise DataError(f"{path}, line {line}: not valid UTF-8 (byte 0x{data[err.start]:02x} at "
                        f"byte column {col}); save the file as UTF-8") from None


def utf8_lines(path: Path) -> list[tuple[int, str]]:
    """``(line number, text)`` of every line of a UTF-8 file (``.xz``: decompressed first),
    1-based, line ends removed, a leading byte-order mark dropped.

    :raises DataError: a line that is not valid UTF-8 (naming file, line and byte column), a
        truncated or corrupt ``.xz`` file.
    """
    data = read_bytes(path)
    if data.startswith(b"\xef\xbb\xbf"):
        data = data[3:]
    out = []
    for lineno, raw in enumerate(data.splitlines(), 1):
        try:
            out.append((lineno, raw.decode("utf-8")))
        except UnicodeDecodeError as err:
            raise DataError(f"{path}, line {lineno}: not valid UTF-8 (byte "
                            f"0x{raw[err.start]:02x} at byte column {err.start + 1}); save the "
                            "file as UTF-8") from None
    return out


def json_line(line: str, where: str):
    """One JSON value of a JSON-lines file; ``where`` names the file and line in errors.

    :raises DataError: invalid JSON (with its column) or an object with a duplicate key (JSON
        would silently keep the last).
    """
    try:
        return json.loads(line, object_pairs_hook=refuse_duplicate_keys)
    except DuplicateKeyError as err:
        raise DataError(f"{where}: duplicate key {err.key!r} in a JSON object; each key may "
                        "appear once") from None
    except json.JSONDecodeError as err:
        raise DataError(f"{where}: invalid JSON ({err.msg} at column {err.colno})") from None
    except ValueError as err:  # an integer past Python's 4300-digit conversion limit
        raise DataError(f"{where}: invalid JSON value ({err})") from None
    except RecursionError:
        raise DataError(f"{where}: JSON nested too deeply") from None


def class_label(value, where: str, num_classes: int) -> int:
    """A label read from a file as a class index in ``[0, num_classes)``: an integer, an
    integral float (``1.0``) or a string of one (``"1"``).

    :raises DataError: anything else (``0.7``, ``true``, ``null``, ``"pos"``) or an index out of
        range, naming ``where`` (file and line) and the value as JSON writes it.
    """
    k = None
    if isinstance(value, int) and not isinstance(value, bool):
        k = value
    elif isinstance(value, float) and value.is_integer():
        k = int(value)
    elif isinstance(value, str) and _INT.fullmatch(value.strip()) and len(value.strip()) < 40:
        k = int(value.strip())  # (a longer one is out of range; int() would refuse 4300 digits)
    if k is None or not 0 <= k < num_classes:
        try:  # as the file wrote it (JSON: true, null, "pos")
            shown = json.dumps(value, ensure_ascii=False)
        except (TypeError, ValueError):
            shown = repr(value)
        raise DataError(f"{where}: the label must be a class index 0..{num_classes - 1}, got "
                        f"{shown}")
    return k
