"""One entry point for every dataset: :func:`load_data` -> :class:`DataBundle`.

:func:`load_data` calls the builder registered in :data:`~gpattn_ppl.data.registry.DATASETS`
(a :class:`~gpattn_ppl.data.registry.RawData`: all examples, split indices, OOD sets), then
encodes text (learned word vocabulary or frozen MiniLM features) or wraps images, and hands out
:class:`~gpattn_ppl.data.dataset.ArrayDataset` objects.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from functools import partial

import torch

from .cifar import Normalize, augment
from .dataset import ArrayDataset
from .pretrained import MiniLMEncoder
from .registry import DATASETS
from .splits import seeded_permutation
from .tokenizer import WordTokenizer

__all__ = ["TEXT_ENCODERS", "DataBundle", "load_data"]

#: text encoder -> the extra keyword arguments :func:`load_data` passes on to it.
TEXT_ENCODERS: dict[str, tuple[str, ...]] = {
    "learned": ("min_freq", "max_vocab"),
    "minilm": ("batch_size", "device"),
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


# -- the entry point ---------------------------------------------------------------------------------
def load_data(name: str, *, protocol: str | None = None, root: str | None = None,
              encoder: str = "learned", max_len: int = 64, seed: int = 0,
              cache_dir: str | None = None, limit_train: int | None = None,
              **kw) -> DataBundle:
    """Load a registered dataset, split by ``protocol``, encoded for a model.

    ============  ===========================  ==================================================
    name          protocols (first = default)  splits (train / val / test; OOD)
    ============  ===========================  ==================================================
    ``cola``      ``official``                 in_domain_train less a seeded 10% / that 10% /
                                               in_domain_dev (527); ``cola_ood`` (516)
    ``cola``      ``712``, ``sto``             seeded 6354 / 908 / 1816 of the 9078 in-domain
                                               sentences; ``cola_ood`` (516)
    ``imdb``      ``official``                 22,500 / 2,500 / 25,000; ``cr`` (CR.test, 500)
    ``imdb``      ``kep``                      35,000 / 5,000 / 10,000 of the merged 50k
    ``cifar10``   ``official``                 45,000 / 5,000 / 10,000
    ============  ===========================  ==================================================

    :param name: a key of :data:`DATASETS`.
    :param protocol: split protocol (see the table).
    :param root: folder with the files; ``None`` = the bundled copy (CoLA only).
    :param encoder: text only: ``"learned"`` (word ids, vocabulary from the train split;
        options ``min_freq``, ``max_vocab``) or ``"minilm"`` (frozen 384-d per-token features;
        options ``batch_size``, ``device``; needs the ``text`` extra).
    :param max_len: text only: tokens kept per text (MiniLM: word pieces incl. [CLS]/[SEP]).
    :param seed: seeds the split permutation (unless ``split_seed`` is given) and
        ``limit_train``.
    :param cache_dir: where decoded images / MiniLM features are cached; ``None`` = no cache.
    :param limit_train: keep a seeded subset of this many training examples (smoke runs).
    :param kw: ``split_seed`` (a split fixed across training seeds), the dataset's options
        (``imdb``: ``cr_root`` = CR folder, ``False`` for none; default: looked up next to
        ``root``) and the encoder's options.
    :raises ValueError: unknown name / protocol / encoder (the message lists allowed values).
    :raises TypeError: unknown keyword arguments.
    :raises FileNotFoundError: missing files.

    >>> bundle = load_data("cola")
    >>> len(bundle.train), len(bundle.val), len(bundle.test), len(bundle.ood["cola_ood"])
    (7696, 855, 527, 516)
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
    if limit_train is not None and limit_train < 1:
        raise ValueError(f"limit_train must be >= 1, got {limit_train}")
    split_seed = seed if kw.get("split_seed") is None else int(kw["split_seed"])
    raw = spec.builder(protocol=protocol, root=root, split_seed=split_seed, cache_dir=cache_dir,
                       **{k: kw[k] for k in spec.options if k in kw})
    splits = dict(raw.splits)
    if limit_train is not None and limit_train < len(splits["train"]):
        keep = seeded_permutation(len(splits["train"]), seed)[:limit_train]
        splits["train"] = splits["train"][keep.sort().values]
    for split in ("train", "val", "test"):
        if len(splits[split]) == 0:
            raise ValueError(f"{name} ({protocol}): the {split} split is empty")

    info = {"name": name, "protocol": protocol, "seed": seed, "split_seed": split_seed,
            "limit_train": limit_train, **raw.info}
    if spec.modality == "text":
        enc_kw = {**spec.encoder_defaults, **{k: kw[k] for k in enc_options if k in kw}}
        enc_kw = {k: v for k, v in enc_kw.items() if k in enc_options}
        sets, ood, extra, notes = _encode_text(name, raw, splits, encoder, max_len, cache_dir,
                                               enc_kw)
        info.update(notes)
    else:
        sets, ood = _wrap_images(name, raw, splits)
        extra = {"input_kind": "image", "vocab_size": None, "feature_dim": None,
                 "tokenizer": None}
    info["sizes"] = {s: len(d) for s, d in sets.items()} | {k: len(d) for k, d in ood.items()}
    info["load_seconds"] = round(time.perf_counter() - start, 3)
    return DataBundle(train=sets["train"], val=sets["val"], test=sets["test"], ood=ood,
                      num_classes=raw.num_classes, input_kind=extra["input_kind"],
                      vocab_size=extra["vocab_size"], feature_dim=extra["feature_dim"],
                      tokenizer=extra["tokenizer"], name=name, protocol=protocol, info=info,
                      select_metric=spec.select_metric)


def _float32(x: torch.Tensor) -> torch.Tensor:
    return x.float()


def _encode_text(name, raw, splits, encoder, max_len, cache_dir, enc_kw):
    used = torch.cat([splits[s] for s in ("train", "val", "test")]).unique()  # sorted
    pos = torch.full((len(raw.x),), -1, dtype=torch.long)
    pos[used] = torch.arange(len(used))
    texts = [raw.x[i] for i in used.tolist()]
    if encoder == "learned":
        tokenizer = WordTokenizer.fit([raw.x[i] for i in splits["train"].tolist()], **enc_kw)
        encode = partial(tokenizer.encode, max_len=max_len)
        extra = {"input_kind": "tokens", "vocab_size": tokenizer.vocab_size,
                 "feature_dim": None, "tokenizer": tokenizer}
    else:
        model = MiniLMEncoder(cache_dir, **enc_kw)
        encode = partial(model.encode, max_len=max_len)
        extra = {"input_kind": "features", "vocab_size": None,
                 "feature_dim": MiniLMEncoder.feature_dim, "tokenizer": None}
    x, lengths = encode(texts)
    to_float = _float32 if extra["input_kind"] == "features" else None  # stored as float16
    sets = {}
    for split in ("train", "val", "test"):
        rows = pos[splits[split]]
        sets[split] = ArrayDataset(x[rows], raw.y[splits[split]], lengths[rows],
                                   name=f"{name}_{split}", transform=to_float)
    ood = {}
    for key, (ood_x, ood_y) in raw.ood.items():
        ood_ids, ood_len = encode(list(ood_x))
        ood[key] = ArrayDataset(ood_ids, ood_y, ood_len, name=key, transform=to_float)
    at_max = float((lengths == max_len).float().mean())
    notes = {"encoder": encoder, "max_len": max_len, "encoder_options": enc_kw,
             "vocab_size": extra["vocab_size"], "fraction_at_max_len": round(at_max, 4)}
    return sets, ood, extra, notes


def _wrap_images(name, raw, splits):
    normalize = Normalize()
    crop_flip = partial(augment, fill=normalize.black)  # transform runs first: pad with black
    sets = {}
    for split in ("train", "val", "test"):
        idx = splits[split]
        sets[split] = ArrayDataset(raw.x[idx], raw.y[idx], name=f"{name}_{split}",
                                   augment=crop_flip if split == "train" else None,
                                   transform=normalize)
    ood = {key: ArrayDataset(x, y, name=key, transform=normalize)
           for key, (x, y) in raw.ood.items()}
    return sets, ood
