r"""Reader for CLINC150 (Larson et al., EMNLP-IJCNLP 2019) and the ``clinc150`` dataset.

CLINC150 is the standard benchmark for intent classification with out-of-scope (OOS) queries:
150 intents in 10 domains (15 each), 100 / 20 / 30 training / validation / test queries per
intent (15,000 / 3,000 / 4,500) and 1,000 out-of-scope test queries (label ``oos``). It is
**not** shipped with the package (licence CC BY 3.0, source ``github.com/clinc/oos-eval``, files
``data/data_full.json`` and ``data/domains.json``); pass the folder holding those two files as
``root`` (``data.root`` in a config). Nothing is downloaded.

Protocols (the first is the default):

``standard``
    train = the in-scope ``train`` queries (15,000), validation = ``val`` (3,000), test =
    ``test`` (4,500), 150 classes: the intent names in sorted order. One OOD set, ``oos`` = the
    1,000 ``oos_test`` queries, unlabelled (label ``-1``): it is scored for OOS detection against
    the in-scope test set (AUROC, AUPR-In/Out, FPR95 of every detector). ``oos_train`` and
    ``oos_val`` are not used (the benchmark's "train on in-scope only" setting).
``near_ood``
    :data:`CLINC150_NEAR_OOD_DOMAINS` (2) of the 10 domains of ``domains.json`` are held out
    whole: the domains in sorted name order, permuted by
    :func:`~gpattn_ppl.data.splits.seeded_permutation` with ``split_seed``, the first two held
    out (split_seed 0: ``banking`` and ``kitchen_and_dining``; 1: ``meta`` and ``small_talk``; 2:
    ``travel`` and ``utility``; see :func:`clinc150_held_out_domains`). Train / val / test keep
    the queries of the other 120 intents (12,000 / 2,400 / 3,600), labels re-indexed
    ``0 .. 119`` in the standard class order with the held-out intents dropped (the class names
    are kept). OOD sets: ``held_out_domains`` = the
    held-out intents' ``test`` queries (900, label ``-1``) and ``oos`` as above. Fix
    ``split_seed`` to compare runs over training seeds on the same held-out domains.

Checkpoints are selected on validation accuracy. The source has a few repeated queries across
its splits (2 test and 3 validation queries are also training queries, 4 of the 5 under another
intent there); they are kept as published.

Published reference points on the standard protocol (BERT-base fine-tuned, the
uncertainty-baselines ``clinc_intent`` README): deterministic BERT OOD AUROC 0.942, ECE 0.0218;
BERT-SNGP OOD AUROC 0.969, ECE 0.0104.

The ``clinc150_slice`` dataset is a small, deterministic slice **shipped with the package**
(:func:`bundled_clinc150_slice_root`, with its ``SOURCE.md`` and ``LICENSE``), for tutorials,
tests and smoke runs without the full release: 10 intents (the first two in sorted order of
each of the first five domains in sorted order), all their 1,000 / 200 / 300 train / val / test
queries, and the first 200 ``oos_test`` queries (plus the first 50 ``oos_train`` and ``oos_val``
rows, unused). It is read by :func:`read_clinc150` and built as ``clinc150`` is, with the same
protocols and OOD set names: ``standard`` (10 classes; ``oos``: 200) and ``near_ood`` (2 of its
5 domains held out by ``split_seed``: 6 classes, 600 / 120 / 180; ``held_out_domains``: 120,
``oos``: 200). It takes no ``root``. Its numbers are not comparable to the benchmark's.

The ``clinc150_demo`` dataset, the main job's (``gpattn-ppl demo``), is a second shipped slice
(:func:`bundled_clinc150_demo_root`): the first 5 intents in sorted order of each of the first
6 domains, the first 40 training queries of each intent and all its validation and test
queries (1,200 / 600 / 900), and the first 300 ``oos_test`` queries. Few training queries per
intent keep it off the accuracy ceiling. ``near_ood`` with ``split_seed`` 0 holds out
``credit_cards`` and ``meta``: 20 classes, 800 / 400 / 600; ``held_out_domains``: 300,
``oos``: 300.
"""

from __future__ import annotations

import bisect
import json
import re
from pathlib import Path

import torch

from ..errors import DataError
from ..schema import DuplicateKeyError, refuse_duplicate_keys
from ._files import decode_utf8, read_bytes
from .registry import RawData, register_dataset
from .splits import seeded_permutation

__all__ = ["CLINC150_FILES", "CLINC150_NEAR_OOD_DOMAINS", "bundled_clinc150_demo_root",
           "bundled_clinc150_slice_root",
           "clinc150_held_out_domains", "read_clinc150"]

#: role -> file name of the oos-eval release (``data/``) read from ``root``.
CLINC150_FILES = {"data": "data_full.json", "domains": "domains.json"}

#: how many of the 10 domains the ``near_ood`` protocol holds out.
CLINC150_NEAR_OOD_DOMAINS = 2

#: the keys of ``data_full.json`` the dataset reads (``oos_train`` / ``oos_val`` are ignored).
_SPLITS = ("train", "val", "test", "oos_test")
_OOS = "oos"
_LICENCE = "CC BY 3.0 (Larson et al. 2019, github.com/clinc/oos-eval)"


def bundled_clinc150_slice_root() -> Path:
    """The folder of the CLINC150 slice shipped inside the package (``data_full.json``,
    ``domains.json``, ``SOURCE.md``, ``LICENSE``); read it with :func:`read_clinc150`.

    >>> files = read_clinc150(bundled_clinc150_slice_root())
    >>> len(files["train"][0]), len(files["test"][0]), len(files["oos_test"][0])
    (1000, 300, 200)
    """
    return Path(__file__).resolve().parent / "clinc150_slice"


def bundled_clinc150_demo_root() -> Path:
    """The folder of the demo's CLINC150 slice shipped inside the package (30 intents of 6
    domains, the first 40 training queries of each; see its ``SOURCE.md``).

    >>> files = read_clinc150(bundled_clinc150_demo_root())
    >>> len(files["train"][0]), len(files["test"][0]), len(files["oos_test"][0])
    (1200, 900, 300)
    """
    return Path(__file__).resolve().parent / "clinc150_demo"


def _skip_ws(text: str, pos: int) -> int:
    while pos < len(text) and text[pos] in " \t\r\n":
        pos += 1
    return pos


def _object_of_lists(path: Path) -> dict[str, list[tuple[object, int]]]:
    """A JSON file holding one object whose values are lists: key -> ``[(item, line)]``, each
    item with the line it starts on (a value that is not a list: ``[(value, line)]`` flagged by
    a line of ``-line``).

    :raises DataError: bytes that are not UTF-8, invalid JSON, a top level that is not an
        object, a duplicate key (naming the file and line).
    """
    text = decode_utf8(path, read_bytes(path))
    if text.startswith("\ufeff"):
        text = text[1:]
    decoder = json.JSONDecoder(object_pairs_hook=refuse_duplicate_keys)
    newlines = [m.start() for m in re.finditer("\n", text)]

    def line(pos: int) -> int:
        return bisect.bisect_left(newlines, pos) + 1

    def fail(pos: int, what: str):
        raise DataError(f"{path}, line {line(pos)}: {what}")

    def value(pos: int):
        try:
            return decoder.raw_decode(text, pos)
        except json.JSONDecodeError as err:
            raise DataError(f"{path}, line {err.lineno}: invalid JSON ({err.msg} at column "
                            f"{err.colno})") from None
        except DuplicateKeyError as err:
            fail(pos, f"duplicate key {err.key!r} in a JSON object (in the value starting "
                      "here); each key may appear once")

    out: dict[str, list[tuple[object, int]]] = {}
    pos = _skip_ws(text, 0)
    if not text.startswith("{", pos):
        fail(pos, "expected one JSON object (of lists) at the top level")
    pos = _skip_ws(text, pos + 1)
    if text.startswith("}", pos):
        fail(pos, "the JSON object is empty")
    while True:
        if not text.startswith('"', pos):
            fail(pos, "expected a key (a JSON string)")
        key, pos = value(pos)
        if key in out:
            fail(pos, f"duplicate key {key!r} in a JSON object; each key may appear once")
        pos = _skip_ws(text, pos)
        if not text.startswith(":", pos):
            fail(pos, f"expected ':' after the key {key!r}")
        pos = _skip_ws(text, pos + 1)
        if text.startswith("[", pos):
            items = []
            pos = _skip_ws(text, pos + 1)
            if text.startswith("]", pos):
                pos += 1
            else:
                while True:
                    start = pos
                    item, pos = value(pos)
                    items.append((item, line(start)))
                    pos = _skip_ws(text, pos)
                    if text.startswith(",", pos):
                        pos = _skip_ws(text, pos + 1)
                    elif text.startswith("]", pos):
                        pos += 1
                        break
                    else:
                        fail(pos, f"expected ',' or ']' in the list of key {key!r}")
            out[key] = items
        else:
            start = pos
            item, pos = value(pos)
            out[key] = [(item, -line(start))]
        pos = _skip_ws(text, pos)
        if text.startswith(",", pos):
            pos = _skip_ws(text, pos + 1)
        elif text.startswith("}", pos):
            pos = _skip_ws(text, pos + 1)
            if pos != len(text):
                fail(pos, "extra data after the JSON object")
            return out
        else:
            fail(pos, "expected ',' or '}' after a value of the top-level object")


def _require_list(path: Path, key: str, items: list[tuple[object, int]], what: str) -> None:
    if len(items) == 1 and items[0][1] < 0:
        found = items[0][0]
        shown = ("null" if found is None else "true / false" if isinstance(found, bool)
                 else {"dict": "an object", "str": "a string"}.get(type(found).__name__,
                                                                   "a number"))
        raise DataError(f"{path}, line {-items[0][1]}: key {key!r} must hold a list of {what}, "
                        f"got {shown}")


def _read_data(path: Path) -> dict[str, tuple[list[str], list[str]]]:
    """``data_full.json``: split -> ``(texts, intents)`` for the keys of :data:`_SPLITS`."""
    raw = _object_of_lists(path)
    missing = [k for k in _SPLITS if k not in raw]
    if missing:
        raise DataError(f"{path}: no key {missing[0]!r} (keys found: "
                        f"{', '.join(map(repr, raw)) or 'none'}); expected the oos-eval "
                        f"data_full.json with keys {', '.join(_SPLITS)}")
    out = {}
    for split in _SPLITS:
        _require_list(path, split, raw[split], "[text, intent] pairs")
        texts, intents = [], []
        for row, line in raw[split]:
            where = f"{path}, line {line}, key {split!r}"
            if not (isinstance(row, list) and len(row) == 2
                    and all(isinstance(v, str) for v in row)):
                raise DataError(f"{where}: expected a [text, intent] pair of two strings, got "
                                f"{json.dumps(row, ensure_ascii=False)[:80]}")
            text, intent = row
            if not text.strip() or not intent.strip():
                raise DataError(f"{where}: empty {'text' if not text.strip() else 'intent'} in "
                                f"{json.dumps(row, ensure_ascii=False)[:80]}")
            if (intent == _OOS) != (split == "oos_test"):
                raise DataError(f"{where}: intent {intent!r} in the "
                                f"{'out-of-scope' if split == 'oos_test' else 'in-scope'} split "
                                f"(oos_test holds intent {_OOS!r} only, the others never)")
            texts.append(text)
            intents.append(intent)
        if not texts:
            raise DataError(f"{path}: key {split!r} holds no queries")
        out[split] = (texts, intents)
    classes = set(out["train"][1])
    for split in ("val", "test"):
        for text, intent in zip(*out[split]):
            if intent not in classes:
                raise DataError(f"{path}, key {split!r}: intent {intent!r} (query {text!r}) has "
                                "no training queries")
    return out


def _read_domains(path: Path, intents: list[str]) -> dict[str, list[str]]:
    """``domains.json``: domain -> its intents; every intent of ``intents`` in exactly one."""
    raw = _object_of_lists(path)
    known = set(intents)
    owner: dict[str, str] = {}
    out = {}
    for domain, items in raw.items():
        _require_list(path, domain, items, "intent names")
        names = []
        for intent, line in items:
            where = f"{path}, line {line}, domain {domain!r}"
            if not isinstance(intent, str):
                raise DataError(f"{where}: an intent name must be a string, got "
                                f"{json.dumps(intent)[:80]}")
            if intent not in known:
                raise DataError(f"{where}: intent {intent!r} is not an in-scope intent of "
                                "data_full.json")
            if intent in owner:
                raise DataError(f"{where}: intent {intent!r} is already in domain "
                                f"{owner[intent]!r}")
            owner[intent] = domain
            names.append(intent)
        out[domain] = names
    lost = sorted(known - set(owner))
    if lost:
        raise DataError(f"{path}: {len(lost)} intents of data_full.json are in no domain "
                        f"(first: {lost[0]!r})")
    return out


def _path(root: Path, role: str) -> Path:
    path = root / CLINC150_FILES[role]
    if not path.is_file():
        raise FileNotFoundError(
            f"CLINC150 file not found: {path} (expected {' and '.join(CLINC150_FILES.values())} "
            f"of github.com/clinc/oos-eval data/ in {root}; set data.root to that folder)")
    return path


def read_clinc150(root: str | Path, *, domains: bool = True) -> dict:
    """Read CLINC150's ``data_full.json`` (and ``domains.json``).

    :param root: the folder holding ``data_full.json`` and ``domains.json`` of the oos-eval
        release (each key of ``data_full.json`` a list of ``[text, intent]`` pairs).
    :param domains: also read ``domains.json`` (domain -> its intents).
    :returns: ``{"train", "val", "test", "oos_test"}`` -> ``(texts, intents)`` (file order), and
        ``"domains"`` -> ``{domain: [intent, ...]}`` when ``domains`` (file order).
    :raises FileNotFoundError: a missing folder or file (naming its path).
    :raises DataError: naming the file and line: bytes that are not UTF-8, invalid JSON, a
        duplicate key, a row that is not a ``[text, intent]`` pair of non-empty strings,
        ``oos`` in an in-scope split or another intent in ``oos_test``, a validation or test
        intent without training queries; in ``domains.json`` an intent that is unknown, in two
        domains or in none.
    """
    root = Path(root).expanduser()
    if not root.is_dir():
        raise FileNotFoundError(f"CLINC150 folder not found: {root} (expected "
                                f"{' and '.join(CLINC150_FILES.values())} of github.com/clinc/"
                                "oos-eval data/; set data.root to that folder)")
    out: dict = dict(_read_data(_path(root, "data")))
    if domains:
        out["domains"] = _read_domains(_path(root, "domains"), sorted(set(out["train"][1])))
    return out


def clinc150_held_out_domains(domains, split_seed: int) -> list[str]:
    """The domains the ``near_ood`` protocol holds out: ``domains`` (names) in sorted order,
    permuted by :func:`~gpattn_ppl.data.splits.seeded_permutation` with ``split_seed``, the first
    :data:`CLINC150_NEAR_OOD_DOMAINS`; returned sorted.

    >>> names = ["auto_and_commute", "banking", "credit_cards", "home", "kitchen_and_dining",
    ...          "meta", "small_talk", "travel", "utility", "work"]
    >>> [clinc150_held_out_domains(names, seed) for seed in (0, 1, 2)]
    [['banking', 'kitchen_and_dining'], ['meta', 'small_talk'], ['travel', 'utility']]
    """
    names = sorted(domains)
    if len(names) <= CLINC150_NEAR_OOD_DOMAINS:
        raise DataError(f"near_ood holds out {CLINC150_NEAR_OOD_DOMAINS} domains and needs "
                        f"more than that, got {len(names)}")
    pick = seeded_permutation(len(names), split_seed)[:CLINC150_NEAR_OOD_DOMAINS]
    return sorted(names[i] for i in pick.tolist())


@register_dataset("clinc150", protocols=("standard", "near_ood"), modality="text",
                  select_metric="acc")
def _build_clinc150(*, protocol: str, root, split_seed: int, cache_dir) -> RawData:
    if root is None:
        raise ValueError("clinc150 needs root=PATH (data.root): the folder with data_full.json "
                         "and domains.json of github.com/clinc/oos-eval (not shipped with the "
                         "package; nothing is downloaded; the bundled 10-intent slice is the "
                         "dataset clinc150_slice)")
    return _build(Path(root).expanduser(), protocol, split_seed, {"licence": _LICENCE})


def _register_bundled(name: str, root_of, about: str) -> None:
    """Register a slice shipped inside the package as dataset ``name`` (it takes no root)."""

    @register_dataset(name, protocols=("standard", "near_ood"), modality="text",
                      select_metric="acc")
    def build(*, protocol: str, root, split_seed: int, cache_dir) -> RawData:
        if root is not None:
            raise ValueError(f"{name} reads the slice shipped with the package and takes no "
                             f"root (data.root), got {root!r}; for the full release in a folder "
                             "use the dataset clinc150 with data.root")
        return _build(root_of(), protocol, split_seed,
                      {"licence": f"{_LICENCE}; {about}, see its SOURCE.md"})


_register_bundled("clinc150_slice", bundled_clinc150_slice_root, "a 10-intent slice")
_register_bundled("clinc150_demo", bundled_clinc150_demo_root, "the demo's 30-intent slice")


def _build(root: Path, protocol: str, split_seed: int, info: dict) -> RawData:
    """``clinc150`` and the bundled slices from the release's files in ``root`` (module
    docstring: the protocols)."""
    files = read_clinc150(root, domains=protocol == "near_ood")
    classes = sorted(set(files["train"][1]))
    info = {"source": str(root), **info}
    oos_texts = files["oos_test"][0]
    if protocol == "standard":
        held: list[str] = []
        info["split"] = ("train / val / test = the in-scope train / val / test queries; "
                         "oos_train and oos_val unused")
        info["ood"] = "oos = oos_test (unlabelled)"
    else:
        held = clinc150_held_out_domains(files["domains"], split_seed)
        info["held_out_domains"] = held
        info["split"] = (f"the in-scope train / val / test queries of the intents outside the "
                         f"held-out domains {', '.join(held)} (seeded by split_seed "
                         f"{split_seed}); oos_train and oos_val unused")
        info["ood"] = ("held_out_domains = the test queries of the held-out domains' intents; "
                       "oos = oos_test (both unlabelled)")
    dropped = {i for d in held for i in files["domains"][d]}
    kept = [c for c in classes if c not in dropped]
    index = {c: k for k, c in enumerate(kept)}
    x: list[str] = []
    y: list[int] = []
    splits = {}
    for split in ("train", "val", "test"):
        start = len(x)
        for text, intent in zip(*files[split]):
            if intent in index:
                x.append(text)
                y.append(index[intent])
        splits[split] = torch.arange(start, len(x))
    ood = {}
    if held:
        held_texts = [t for t, i in zip(*files["test"]) if i in dropped]
        ood["held_out_domains"] = (held_texts, torch.full((len(held_texts),), -1,
                                                          dtype=torch.long))
    ood["oos"] = (list(oos_texts), torch.full((len(oos_texts),), -1, dtype=torch.long))
    return RawData(x, torch.tensor(y, dtype=torch.long), splits, ood, len(kept), info,
                   classes=kept)
