"""One entry point for every dataset: :func:`load_data` -> :class:`DataBundle`.

:func:`load_data` calls the builder registered in :data:`~gpattn_ppl.data.registry.DATASETS`
(a :class:`~gpattn_ppl.data.registry.RawData`: all examples, split indices, OOD sets), then
encodes text (learned word vocabulary or frozen MiniLM features) or wraps images, and hands out
:class:`~gpattn_ppl.data.dataset.ArrayDataset` objects.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import operator
import time
from dataclasses import dataclass, field
from functools import partial

import numpy as np
import torch

from ..errors import DataError
from .cifar import augment
from .dataset import ArrayDataset
from .encoders import HFTokenEncoder, ImageEncoder, LearnedTextEncoder, MiniLMTextEncoder
from .pretrained import MiniLMEncoder
from .registry import DATASETS, RawData
from .splits import stratified_subset
from .tokenizer import WordTokenizer

__all__ = ["TEXT_ENCODERS", "DataBundle", "check_labels", "checkpoint_positions", "data_fingerprint",
           "load_data"]

#: text encoder -> the extra keyword arguments :func:`load_data` passes on to it.
TEXT_ENCODERS: dict[str, tuple[str, ...]] = {
    "learned": ("min_freq", "max_vocab"),
    "minilm": ("batch_size", "device"),
    "hf": ("checkpoint",),
}


@dataclass
class DataBundle:
    """Everything a training run needs from one dataset under one protocol.

    :ivar train: training split (augmented batches when ``train=True`` for images).
    :ivar val: validation split (model selection only).
    :ivar test: in-distribution test split.
    :ivar ood: name -> out-of-distribution test set (same encoding as ``train``).
    :ivar num_classes: ``K``.
    :ivar input_kind: ``"tokens"`` (``x [n, N]`` long ids), ``"features"`` (``x [n, N, F]``
        stored float16, float32 in batches) or ``"image"`` (``x [n, 3, H, W]`` uint8, normalised
        float32 in batches).
    :ivar vocab_size: embedding rows for ``"tokens"``, else ``None``.
    :ivar feature_dim: ``F`` for ``"features"``, else ``None``.
    :ivar tokenizer: the fitted :class:`WordTokenizer` for ``"tokens"``, else ``None``.
    :ivar name: dataset name.
    :ivar protocol: split protocol.
    :ivar info: split sizes, seeds, source folder, encoder and notes (JSON-able).
    :ivar select_metric: the validation metric the dataset declares for checkpoint selection
        (``select_metric`` of :class:`~gpattn_ppl.data.DatasetSpec`).
    :ivar classes: the ``K`` label names in index order (``None``: the dataset names none).
    :ivar fingerprint: sha256 hex digest of the name, protocol, split indices and the examples
        and labels of train / val / test and of every OOD set (see :func:`data_fingerprint`):
        equal digests, equal data.
    :ivar encoder_state: JSON-able description of how inputs were encoded; new inputs encoded
        by :func:`~gpattn_ppl.data.encoder_from_state` match the splits' rows exactly.
    """

    train: ArrayDataset
    val: ArrayDataset
    test: ArrayDataset
    ood: dict[str, ArrayDataset]
    num_classes: int
    input_kind: str
    vocab_size: int | None
    feature_dim: int | None
    tokenizer: WordTokenizer | None
    name: str
    protocol: str
    info: dict = field(default_factory=dict)
    select_metric: str = "acc"
    classes: list[str] | None = None
    fingerprint: str = ""
    encoder_state: dict = field(default_factory=dict)
    #: the version-1 digest (splits only) that run folders written before OOD sets counted hold
    fingerprint_v1: str = ""

    def to(self, device: torch.device | str) -> DataBundle:
        """The same bundle with every split and OOD set held on ``device``
        (:meth:`~gpattn_ppl.data.dataset.ArrayDataset.to`; ``data.resident``)."""
        return dataclasses.replace(self, train=self.train.to(device), val=self.val.to(device),
                                   test=self.test.to(device),
                                   ood={k: v.to(device) for k, v in self.ood.items()})


def data_fingerprint(name: str, protocol: str, x: list[str] | torch.Tensor, y: torch.Tensor,
                     splits: dict[str, torch.Tensor],
                     ood: dict[str, tuple] | None = None, *, version: int = 2) -> str:
    """sha256 hex digest of ``name``, ``protocol``, per split (train, val, test) its indices,
    labels and examples (texts as UTF-8, images as their bytes), and every OOD set's name,
    labels and examples, so that editing any file read, OOD files included, changes it.

    Digests written before OOD sets counted (``version=1``: the splits only) differ from today's
    (``version=2``) for the same files; :class:`DataBundle` carries both, so a run folder of
    either kind is checked against its own (a version-1 run cannot see an edited OOD file).

    :param x: all examples (a list of texts or images ``[n, 3, H, W]``).
    :param y: ``[n]`` labels.
    :param splits: ``"train"``, ``"val"``, ``"test"`` -> indices into ``x``.
    :param ood: name -> ``(examples, labels)`` of each OOD set as evaluated (after
        ``limit_eval``); ``None``: no OOD sets.
    """
    if version not in (1, 2):
        raise ValueError(f"data_fingerprint: unknown version {version!r}; allowed: 1, 2")
    h = hashlib.sha256(json.dumps(["gpattn_ppl.data", version, name, protocol]).encode())
    for split in ("train", "val", "test"):
        idx = torch.as_tensor(splits[split], dtype=torch.long)
        h.update(f"\0{split}:{len(idx)}\0".encode())
        h.update(idx.numpy().astype("<i8").tobytes())
        examples = x[idx] if isinstance(x, torch.Tensor) else [x[i] for i in idx.tolist()]
        _hash_examples(h, examples, y[idx])
    for key in sorted(ood if version > 1 and ood else {}, key=str):
        ood_x, ood_y = ood[key]
        ood_y = torch.as_tensor(ood_y)
        h.update(f"\0ood:{json.dumps(str(key))}:{len(ood_y)}\0".encode())
        _hash_examples(h, ood_x, ood_y)
    return h.hexdigest()


def _hash_examples(h, x, y: torch.Tensor) -> None:
    """Add labels and examples (an image array, or a sequence of texts) to the hash ``h``."""
    h.update(torch.as_tensor(y).numpy().astype("<i8").tobytes())
    if isinstance(x, (torch.Tensor, np.ndarray)):
        x = torch.as_tensor(x)
        h.update(f"{x.dtype}{tuple(x.shape[1:])}".encode())
        h.update(np.ascontiguousarray(x.numpy()))
    else:
        h.update(json.dumps(list(x), ensure_ascii=False).encode("utf-8", "surrogatepass"))


# -- the entry point ---------------------------------------------------------------------------------
def load_data(name: str, *, protocol: str | None = None, root: str | None = None,
              encoder: str = "learned", max_len: int = 64, seed: int = 0,
              cache_dir: str | None = None, limit_train: int | None = None,
              limit_eval: int | None = None, **kw) -> DataBundle:
    """Load a registered dataset, split by ``protocol``, encoded for a model.

    ==================  =======================  ==================================================
    name                protocols (first =       splits (train / val / test; OOD)
                        default)
    ==================  =======================  ==================================================
    ``cola``            ``official``             in_domain_train less a seeded 10% / that 10% /
                                                 in_domain_dev (527); ``cola_ood`` (516)
    ``cola``            ``712``, ``sto``         seeded 6354 / 908 / 1816 of the 9078 in-domain
                                                 sentences; ``cola_ood`` (516)
    ``imdb``            ``official``             22,500 / 2,500 / 25,000; ``cr`` (CR.test, 500)
    ``imdb``            ``kep``                  35,000 / 5,000 / 10,000 of the merged 50k
    ``cifar10``         ``official``             45,000 / 5,000 / 10,000; ``digits``,
                                                 ``photo_patches``, ``gaussian_noise``,
                                                 ``uniform_noise`` (no download:
                                                 :mod:`~gpattn_ppl.data.vision_ood`)
    ``clinc150``        ``standard``             15,000 / 3,000 / 4,500 in-scope; ``oos`` (1,000)
    ``clinc150``        ``near_ood``             12,000 / 2,400 / 3,600 (2 of 10 domains held out,
                                                 by ``split_seed``); ``held_out_domains`` (900),
                                                 ``oos`` (1,000)
    ``clinc150_slice``  ``standard``             1,000 / 200 / 300 (10 intents, shipped with the
                                                 package); ``oos`` (200)
    ``clinc150_slice``  ``near_ood``             600 / 120 / 180 (2 of 5 domains held out);
                                                 ``held_out_domains`` (120), ``oos`` (200)
    ``csv``             ``given``                ``train_file`` / ``val_file`` / ``test_file``
                                                 (a missing one: a seeded stratified 10% of
                                                 ``train_file``); ``ood_files``
    ``jsonl``           ``given``                as ``csv``, one JSON object per line
    ``image_folder``    ``given``                ``train_dir`` / ``val_dir`` / ``test_dir`` (a
                                                 missing one: a seeded stratified 10% of
                                                 ``train_dir``); ``ood_dirs``
    ==================  =======================  ==================================================

    :param name: a key of :data:`DATASETS`.
    :param protocol: split protocol (see the table).
    :param root: folder with the files; ``None`` = the bundled copy (CoLA; ``clinc150_slice``
        takes none). For ``csv``, ``jsonl`` and ``image_folder``, relative file and folder
        options are taken under it.
    :param encoder: text only: ``"learned"`` (word ids, vocabulary from the train split;
        options ``min_freq``, ``max_vocab``) or ``"minilm"`` (frozen 384-d per-token features;
        options ``batch_size``, ``device``; needs the ``text`` extra) or ``"hf"`` (word-piece ids
        of a pretrained checkpoint's tokenizer for :class:`~gpattn_ppl.models.HFClassifier`;
        option ``checkpoint``; needs the ``text`` extra).
    :param max_len: text only: tokens kept per text (MiniLM: word pieces incl. [CLS]/[SEP]).
    :param seed: seeds the split permutation (unless ``split_seed`` is given) and
        ``limit_train``.
    :param cache_dir: where decoded images / MiniLM features are cached; ``None`` = no cache.
    :param limit_train: keep a seeded, label-stratified subset of this many training examples
        (smoke runs); the text vocabulary is fitted on it.
    :param limit_eval: keep a seeded (by the split seed), label-stratified subset of this many
        examples of val, test and every OOD set.
    :param kw: ``split_seed`` (a split fixed across training seeds), the dataset's options
        (``imdb``: ``cr_root`` = CR folder, ``False`` for none; default: looked up next to
        ``root``; ``csv``: ``train_file``, ``val_file``, ``test_file``, ``ood_files``,
        ``text_column``, ``label_column``, ``delimiter``; ``jsonl``: the same less
        ``delimiter``; ``image_folder``: ``train_dir``, ``val_dir``, ``test_dir``, ``ood_dirs``,
        ``image_size``; an OOD set may not be named ``train``, ``val`` or ``test``) and the
        encoder's options.
    :raises ValueError: unknown name / protocol / encoder (the message lists allowed values),
        malformed files (a :class:`~gpattn_ppl.errors.DataError` naming file, line and column),
        labels outside ``[0, num_classes)`` (:func:`check_labels`).
    :raises TypeError: unknown keyword arguments.
    :raises FileNotFoundError: missing files.

    >>> bundle = load_data("cola")
    >>> len(bundle.train), len(bundle.val), len(bundle.test), len(bundle.ood["cola_ood"])
    (7696, 855, 527, 516)
    >>> bundle.classes
    ['unacceptable', 'acceptable']
    >>> small = load_data("cola", limit_train=100, limit_eval=50)
    >>> len(small.train), len(small.val), len(small.test), len(small.ood["cola_ood"])
    (100, 50, 50, 50)
    """
    start = time.perf_counter()
    if name not in DATASETS:
        raise ValueError(f"unknown dataset {name!r}; allowed: {', '.join(sorted(DATASETS))}")
    spec = DATASETS[name]
    protocol = spec.protocols[0] if protocol is None else protocol
    if protocol not in spec.protocols:
        raise ValueError(f"unknown protocol {protocol!r} for {name}; allowed: "
                         f"{', '.join(spec.protocols)}")
    if spec.modality == "text" and encoder not in TEXT_ENCODERS:
        raise ValueError(f"unknown encoder {encoder!r}; allowed: {', '.join(TEXT_ENCODERS)}")
    if spec.modality != "text" and encoder != "learned":
        raise ValueError(f"encoder={encoder!r} applies to text datasets only; {name} is "
                         f"{spec.modality}")
    enc_options = TEXT_ENCODERS[encoder] if spec.modality == "text" else ()
    allowed = ("split_seed", *spec.options, *enc_options)
    unknown = sorted(set(kw) - set(allowed))
    if unknown:
        raise TypeError(f"load_data({name!r}, encoder={encoder!r}) got unexpected keyword "
                        f"arguments {unknown}; allowed: {', '.join(allowed)}")
    for key, limit in (("limit_train", limit_train), ("limit_eval", limit_eval)):
        if limit is not None and limit < 1:
            raise ValueError(f"{key} must be >= 1, got {limit}")
    for option in ("ood_files", "ood_dirs"):  # checked before any file is read
        if isinstance(kw.get(option), dict):
            _check_ood_names(kw[option], f"data.{option}.{{key}}")
    split_seed = seed if kw.get("split_seed") is None else int(kw["split_seed"])
    raw = spec.builder(protocol=protocol, root=root, split_seed=split_seed, cache_dir=cache_dir,
                       **{k: kw[k] for k in spec.options if k in kw})
    if raw.classes is not None and len(raw.classes) != raw.num_classes:
        raise ValueError(f"{name}: {len(raw.classes)} class names for {raw.num_classes} classes")
    _check_ood_names(raw.ood, f"{name}: OOD set {{key}}")
    check_labels(name, raw)
    splits = dict(raw.splits)
    ood = dict(raw.ood)
    if limit_train is not None:
        splits["train"] = _limit(splits["train"], raw.y, limit_train, seed)
    if limit_eval is not None:
        for split in ("val", "test"):
            splits[split] = _limit(splits[split], raw.y, limit_eval, split_seed)
        for key, (ood_x, ood_y) in ood.items():
            keep = stratified_subset(ood_y, limit_eval, split_seed)
            ood[key] = ([ood_x[i] for i in keep.tolist()] if isinstance(ood_x, list)
                        else ood_x[keep], ood_y[keep])
    for split in ("train", "val", "test"):
        if len(splits[split]) == 0:
            raise ValueError(f"{name} ({protocol}): the {split} split is empty")
    fingerprint = data_fingerprint(name, protocol, raw.x, raw.y, splits, ood)  # before encoding
    fingerprint_v1 = data_fingerprint(name, protocol, raw.x, raw.y, splits, version=1)

    info = {"name": name, "protocol": protocol, "seed": seed, "split_seed": split_seed,
            "limit_train": limit_train, "limit_eval": limit_eval, **raw.info}
    if spec.modality == "text":
        enc_kw = {**spec.encoder_defaults, **{k: kw[k] for k in enc_options if k in kw}}
        enc_kw = {k: v for k, v in enc_kw.items() if k in enc_options}
        sets, ood, extra, notes = _encode_text(name, raw, splits, ood, encoder, max_len,
                                               cache_dir, enc_kw)
        info.update(notes)
    else:
        sets, ood, extra = _wrap_images(name, raw, splits, ood)
        info["normalize"] = {k: extra["encoder_state"][k] for k in ("mean", "std")}
    info["sizes"] = {s: len(d) for s, d in sets.items()} | {k: len(d) for k, d in ood.items()}
    info["load_seconds"] = round(time.perf_counter() - start, 3)
    return DataBundle(train=sets["train"], val=sets["val"], test=sets["test"], ood=ood,
                      num_classes=raw.num_classes, input_kind=extra["input_kind"],
                      vocab_size=extra["vocab_size"], feature_dim=extra["feature_dim"],
                      tokenizer=extra["tokenizer"], name=name, protocol=protocol, info=info,
                      select_metric=spec.select_metric,
                      classes=None if raw.classes is None else [str(c) for c in raw.classes],
                      fingerprint=fingerprint, encoder_state=extra["encoder_state"],
                      fingerprint_v1=fingerprint_v1)


#: names an OOD set may not have: they would be taken for (and replace) the splits' results
_RESERVED_OOD_NAMES = ("train", "val", "test")


def _check_ood_names(names, where: str) -> None:
    """:raises DataError: an OOD set named ``train``, ``val`` or ``test``; the message starts with
        ``where``, its ``{key}`` replaced by the name."""
    for key in names:
        if str(key) in _RESERVED_OOD_NAMES:
            raise DataError(f"{where.replace('{key}', str(key))}: an OOD set may not be named "
                            f"{str(key)!r} (train, val and test are the splits' names); rename it")


def check_labels(name: str, raw: RawData) -> None:
    """Labels a model can train on: integers in ``[0, num_classes)`` in train / val / test,
    and ``-1`` (unlabelled) or in range in the OOD sets.

    :raises DataError: naming the dataset, split, example index and value.
    """
    try:
        k = operator.index(raw.num_classes)
    except TypeError:
        k = None
    if k is None or isinstance(raw.num_classes, bool) or k < 2:
        raise DataError(f"{name}: num_classes must be an integer >= 2, got {raw.num_classes!r}")
    y = torch.as_tensor(raw.y)
    if y.is_floating_point() or y.is_complex() or y.dtype == torch.bool:
        raise DataError(f"{name}: labels must be integer class indices, got {y.dtype}")
    if y.dim() != 1 or len(y) != len(raw.x):
        raise DataError(f"{name}: {tuple(y.shape)} labels for {len(raw.x)} examples")
    for split in ("train", "val", "test"):
        idx = torch.as_tensor(raw.splits[split], dtype=torch.long)
        bad = idx[(y[idx] < 0) | (y[idx] >= k)]
        if len(bad):
            i = int(bad[0])
            raise DataError(f"{name}: label {int(y[i])} of example {i} ({split} split; "
                            f"{len(bad)} such) is outside the classes 0..{k - 1}")
    for key, (_, ood_y) in raw.ood.items():
        ood_y = torch.as_tensor(ood_y)
        bad = ((ood_y < -1) | (ood_y >= k)).nonzero().flatten()
        if len(bad) or ood_y.is_floating_point():
            i = int(bad[0]) if len(bad) else 0
            raise DataError(f"{name}: OOD set {key!r}: label {ood_y[i].item()} of example {i} is "
                            f"neither -1 (unlabelled) nor a class 0..{k - 1}")


def _limit(index: torch.Tensor, y: torch.Tensor, size: int, seed: int) -> torch.Tensor:
    """A seeded label-stratified subset of ``size`` of the examples at ``index``."""
    return index[stratified_subset(y[index], size, seed)]


#: ``model_type`` of checkpoints whose position ids start after the padding index (RoBERTa's
#: scheme): they take ``max_position_embeddings - pad_token_id - 1`` tokens
_OFFSET_POSITIONS = ("roberta", "xlm-roberta", "xlm-roberta-xl", "camembert", "longformer",
                     "roberta-prelayernorm", "data2vec-text", "ibert", "mpnet")


def checkpoint_positions(checkpoint) -> int | None:
    """The most tokens (word pieces, specials included) a pretrained checkpoint's encoder takes:
    its learned absolute positions, ``max_position_embeddings`` of its ``config.json`` (less
    ``pad_token_id + 1`` for RoBERTa-style position ids); ``None`` when it states none (or has
    relative positions only, DeBERTa's ``position_biased_input: false``) or the file cannot be
    read (the loaders name that)."""
    from .hf_folder import resolve_checkpoint, swapped_host_type

    try:
        config = json.loads((resolve_checkpoint(checkpoint) / "config.json")
                            .read_text(encoding="utf-8"))
    except (OSError, ValueError, ImportError):
        return None
    if not isinstance(config, dict) or config.get("position_biased_input") is False:
        return None
    n = config.get("max_position_embeddings")
    if isinstance(n, bool) or not isinstance(n, int):
        return None
    pad = config.get("pad_token_id")
    model_type = config.get("model_type")
    model_type = swapped_host_type(model_type) or model_type   # a swapped host: the host's
    if model_type in _OFFSET_POSITIONS and isinstance(pad, int):
        n -= pad + 1
    return n if n >= 2 else None


def _cap_to_positions(max_len: int, checkpoint) -> int:
    """``max_len``, or the checkpoint's positions (:func:`checkpoint_positions`) when it asks
    for more, with a warning: a longer sequence has no position embedding to look up."""
    n = checkpoint_positions(checkpoint)
    if n is None or max_len <= n:
        return max_len
    import warnings

    warnings.warn(f"data.max_len {max_len} is more than the {n} positions of checkpoint "
                  f"{str(checkpoint)!r} (max_position_embeddings in its config.json); texts are "
                  f"cut at {n} word pieces", UserWarning, stacklevel=3)
    return n


def _encode_text(name, raw, splits, raw_ood, encoder, max_len, cache_dir, enc_kw):
    used = torch.cat([splits[s] for s in ("train", "val", "test")]).unique()  # sorted
    pos = torch.full((len(raw.x),), -1, dtype=torch.long)
    pos[used] = torch.arange(len(used))
    texts = [raw.x[i] for i in used.tolist()]
    if encoder == "learned":
        tokenizer = WordTokenizer.fit([raw.x[i] for i in splits["train"].tolist()], **enc_kw)
        input_encoder = LearnedTextEncoder(tokenizer, max_len)
        extra = {"vocab_size": tokenizer.vocab_size, "feature_dim": None, "tokenizer": tokenizer}
    elif encoder == "hf":
        if enc_kw.get("checkpoint") is None:
            raise ValueError("encoder='hf' needs checkpoint= (the pretrained model whose "
                             "tokenizer encodes the texts)")
        max_len = _cap_to_positions(max_len, enc_kw["checkpoint"])
        input_encoder = HFTokenEncoder(enc_kw["checkpoint"], max_len)
        extra = {"vocab_size": input_encoder.vocab_size, "feature_dim": None, "tokenizer": None}
    else:
        max_len = _cap_to_positions(max_len, "all-MiniLM-L6-v2")
        input_encoder = MiniLMTextEncoder(max_len, cache_dir=cache_dir, **enc_kw)
        extra = {"vocab_size": None, "feature_dim": MiniLMEncoder.feature_dim, "tokenizer": None}
    extra["input_kind"] = input_encoder.input_kind
    extra["encoder_state"] = input_encoder.state_dict()
    x, lengths = input_encoder.encode(texts)
    to_float = input_encoder.transform  # MiniLM features are stored as float16
    sets = {}
    for split in ("train", "val", "test"):
        rows = pos[splits[split]]
        sets[split] = ArrayDataset(x[rows], raw.y[splits[split]], lengths[rows],
                                   name=f"{name}_{split}", transform=to_float)
    ood = {}
    for key, (ood_x, ood_y) in raw_ood.items():
        ood_ids, ood_len = input_encoder.encode(list(ood_x))
        ood[key] = ArrayDataset(ood_ids, ood_y, ood_len, name=key, transform=to_float)
    at_max = float((lengths == max_len).float().mean())
    notes = {"encoder": encoder, "max_len": max_len, "encoder_options": enc_kw,
             "vocab_size": extra["vocab_size"], "fraction_at_max_len": round(at_max, 4)}
    return sets, ood, extra, notes


def _channel_stats(x: torch.Tensor) -> tuple[tuple[float, ...], tuple[float, ...]]:
    """Per-channel mean and standard deviation of uint8 images ``[n, C, H, W]`` in [0, 1]
    units (in chunks of about 4M values; the deviation is at least 1e-3)."""
    n, c, h, w = x.shape
    total, squares = torch.zeros(c, dtype=torch.float64), torch.zeros(c, dtype=torch.float64)
    for chunk in x.split(max(1, (1 << 22) // (c * h * w))):
        values = chunk.double()
        total += values.sum((0, 2, 3))
        squares += values.square().sum((0, 2, 3))
    count = n * h * w
    mean = total / count / 255.0
    std = (squares / count / 255.0**2 - mean.square()).clamp(min=0).sqrt().clamp(min=1e-3)
    return tuple(round(float(v), 6) for v in mean), tuple(round(float(v), 6) for v in std)


def _wrap_images(name, raw, splits, raw_ood):
    mean, std = (raw.image_stats if raw.image_stats is not None
                 else _channel_stats(raw.x[splits["train"]]))
    height, width = raw.x.shape[2:]
    input_encoder = ImageEncoder(height if height == width else None, mean, std)
    normalize = input_encoder.transform
    crop_flip = partial(augment, fill=normalize.black)  # transform runs first: pad with black
    sets = {}
    for split in ("train", "val", "test"):
        idx = splits[split]
        sets[split] = ArrayDataset(raw.x[idx], raw.y[idx], name=f"{name}_{split}",
                                   augment=crop_flip if split == "train" else None,
                                   transform=normalize)
    ood = {key: ArrayDataset(x, y, name=key, transform=normalize)
           for key, (x, y) in raw_ood.items()}
    extra = {"input_kind": "image", "vocab_size": None, "feature_dim": None, "tokenizer": None,
             "encoder_state": input_encoder.state_dict()}
    return sets, ood, extra
