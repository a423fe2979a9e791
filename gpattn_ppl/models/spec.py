"""The model spec: the schema of the ``model`` section and its validation against the attention
registry.

A model spec is the ``model`` section of an experiment config. :func:`validate_model_spec`
fills in defaults and checks every key path, type and attention option (each option's value
against the type annotation of its unit's constructor, :func:`check_value`); errors are
:class:`~gpattn_ppl.schema.ConfigError` naming the key path and the allowed values. The schema
machinery itself (:class:`~gpattn_ppl.schema.Option`, :func:`~gpattn_ppl.schema.check_section`,
the YAML reader) is :mod:`gpattn_ppl.schema`; its names are importable from here too.

>>> validate_model_spec({"depth": 1})["attention"]
{'kind': 'softmax'}
"""

from __future__ import annotations

import math
import types
import typing
from collections.abc import Mapping, Sequence
from typing import Any, Literal, Union

from ..schema import (  # the engine's names stay importable from here (the old home)
    MAX_CONFIG_BYTES,  # noqa: F401
    MAX_CONFIG_DEPTH,  # noqa: F401
    MAX_VALUE_DEPTH,  # noqa: F401
    MAX_VALUE_ITEMS,  # noqa: F401
    ConfigError,
    ConfigLoader,  # noqa: F401
    Option,
    check_plain,  # noqa: F401
    check_section,
    describe_value,
    load_yaml,  # noqa: F401
    read_yaml_mapping,  # noqa: F401
)
from .sngp import SNGP_DEFAULTS

__all__ = ["MODEL_SCHEMA", "SNGP_SCHEMA", "check_attention", "check_model", "check_value",
           "validate_model_spec"]

_NUM = (int, float)
_NONE = type(None)


def _at_least(low, types=int, default=None, **kw) -> Option:
    return Option(types, default, low=low, **kw)


#: the largest width (``model.dim``, ``model.feature_dim``): far above any model this library
#: trains, low enough that a typo (``dim: 200000``) is a config error and not an allocation of
#: hundreds of GB
MAX_DIM = 65536
#: the largest sequence length (``model.max_len``, ``data.max_len``) and image side
MAX_LEN = 1_000_000
MAX_IMAGE = 16384


def check_image_pixels(value: int, where: str) -> None:
    """Raise :class:`ConfigError` for an image side whose square has more pixels than Pillow
    decodes without its decompression-bomb warning (``PIL.Image.MAX_IMAGE_PIXELS``, 89478485 by
    default: a side of at most 9459): the most pixels this library reads or makes of one image
    (``model.image_size``, ``data.image_size``; a side of 16384 is 768 MiB per RGB image)."""
    from PIL import Image

    limit = Image.MAX_IMAGE_PIXELS
    if limit is not None and value * value > limit:
        raise ConfigError(f"{where}: {value} x {value} = {value * value} pixels per image, more "
                          f"than {limit}, the most Pillow decodes (PIL.Image.MAX_IMAGE_PIXELS, "
                          f"its decompression-bomb limit); allowed: at most {math.isqrt(limit)}")


#: key -> :class:`Option` of the ``model`` section.
MODEL_SCHEMA: dict[str, Option] = {
    "arch": Option(str, "text", ("text", "vit", "hf")),
    "dim": _at_least(1, default=128, high=MAX_DIM), "depth": _at_least(1, default=2, high=1024),
    "heads": _at_least(1, default=4),  # at most dim: it divides it
    "mlp_dim": _at_least(1, default=256, high=4 * MAX_DIM),
    "dropout": Option(_NUM, 0.1, low=0, high=1, high_open=True),
    "attn_dropout": Option(_NUM + (_NONE,), None, low=0, high=1, high_open=True),
    "mc_dropout": Option(bool, False),
    "max_len": _at_least(1, default=64, high=MAX_LEN),
    "image_size": _at_least(1, default=32, high=MAX_IMAGE, check=check_image_pixels),
    "patch_size": _at_least(1, default=4, high=MAX_IMAGE),
    "channels": _at_least(1, default=3, high=4096),
    "attention": Option(dict, {"kind": "softmax"}, free=True),
    "overrides": Option(list, [], free=True),
    "num_classes": _at_least(2, (int, _NONE), high=1_000_000),
    "vocab_size": _at_least(2, (int, _NONE), high=10_000_000),
    "feature_dim": _at_least(1, (int, _NONE), high=MAX_DIM),
    # arch hf: a pretrained Hugging Face encoder (models/hf.py)
    "checkpoint": Option((str, _NONE), None), "pooling": Option(str, "mean", ("cls", "mean")),
    "freeze": Option(str, "none", ("none", "embeddings", "all-but-swapped")),
    # fine-tune the top layers only; the frozen ones run once per example (models/frozen_prefix.py)
    "train_layers": _at_least(1, (int, _NONE), high=1024),
    "swap": Option(list, [], free=True),
    # the output layer: linear, or SNGP's random-Fourier-feature GP with spectrally normalised
    # residual layers (models/sngp.py, docs/derivations/sngp.rst); model.sngp applies to it only
    "head": Option(str, "linear", ("linear", "sngp")),
    "sngp": Option(dict, {}, free=True),
}


#: key -> :class:`Option` of ``model.sngp`` (the options of ``head: sngp``, checked by
#: :func:`check_model`; defaults :data:`~gpattn_ppl.models.sngp.SNGP_DEFAULTS`)
SNGP_SCHEMA: dict[str, Option] = {
    "num_features": _at_least(1, default=SNGP_DEFAULTS["num_features"], high=MAX_DIM),
    "ridge": Option(_NUM, SNGP_DEFAULTS["ridge"], low=0, low_open=True, high=1e12),
    "mean_field_factor": Option(_NUM, SNGP_DEFAULTS["mean_field_factor"], low=0, high=1e6),
    "length_scale": Option(_NUM, SNGP_DEFAULTS["length_scale"], low=0, low_open=True,
                           high=1e6),
    "spectral_norm": Option(bool, SNGP_DEFAULTS["spectral_norm"]),
    "norm_bound": Option(_NUM, SNGP_DEFAULTS["norm_bound"], low=0, low_open=True, high=1e6),
    # BERT-SNGP: a spectrally normalised dense + tanh before the GP layer; LayerNorm on its input
    "pooler": Option(bool, SNGP_DEFAULTS["pooler"]),
    "input_norm": Option(bool, SNGP_DEFAULTS["input_norm"]),
    # phi = sqrt(2/D_L) cos(.) or cos(.) (the reference code's scale_random_features)
    "scale_features": Option(bool, SNGP_DEFAULTS["scale_features"]),
    # None: the exact sum over each epoch (reset at its start); m: a moving average
    "momentum": Option(_NUM + (_NONE,), SNGP_DEFAULTS["momentum"], low=0, high=1,
                       high_open=True),
}
_SNGP_DEFAULT_SECTION = {k: SNGP_DEFAULTS[k] for k in SNGP_SCHEMA}

# -- values against type annotations -------------------------------------------------------------

_SEQUENCES = (list, tuple, Sequence, typing.Sequence)  # typing.X are aliases: for get_origin
_MAPPINGS = (dict, Mapping, typing.Mapping)
_UNIONS = (Union, types.UnionType)


class _Mismatch(Exception):
    """``value`` does not match an annotation (internal; :func:`check_value` words the message)."""


def _choices(values) -> str:
    return ", ".join("None" if v is None else str(v) for v in values)


def _describe(ann: Any) -> str:
    """A reader's name of annotation ``ann`` (``"int"``, ``"float or None"``, ``"a list of int"``)."""
    if ann is None or ann is type(None):
        return "None"
    origin, args = typing.get_origin(ann), typing.get_args(ann)
    if origin is Literal:
        return "one of " + _choices(args)
    if origin in _UNIONS:
        return " or ".join(_describe(a) for a in args)
    if origin is typing.Annotated:
        return _describe(args[0])
    if origin in _SEQUENCES or ann in _SEQUENCES:
        items = [a for a in args if a is not Ellipsis]
        return "a list" + (f" of {' / '.join(_describe(a) for a in dict.fromkeys(items))}"
                           if items else "")
    if origin in _MAPPINGS or ann in _MAPPINGS:
        return "a mapping"
    return getattr(ann, "__name__", str(ann))


def _match(value: Any, ann: Any, where: str, coerce: bool) -> Any:
    """``value`` checked against ``ann`` (possibly converted: a numeric string for a float); raises
    :class:`_Mismatch` for this value, :class:`ConfigError` for an element of a container."""
    if ann is Any or ann is object:
        return value
    if ann is None or ann is type(None):
        if value is None:
            return value
        raise _Mismatch
    origin, args = typing.get_origin(ann), typing.get_args(ann)
    if origin is typing.Annotated:
        return _match(value, args[0], where, coerce)
    if origin is Literal:
        # 1 == True == 1.0: compare the type too, so that True is not taken for 1
        if any(value == a and type(value) is type(a) for a in args):
            return value
        raise _Mismatch
    if origin in _UNIONS:
        inner = None  # the first error inside a container member, the most telling message
        for attempt in ((False, True) if coerce else (False,)):  # an exact member first
            for member in args:
                try:
                    return _match(value, member, where, attempt)
                except _Mismatch:
                    pass
                except ConfigError as err:
                    inner = inner or err
        if inner is not None:
            raise inner
        raise _Mismatch
    if ann is bool:
        if isinstance(value, bool):
            return value
        raise _Mismatch
    if ann is int:
        if isinstance(value, int) and not isinstance(value, bool):
            return value
        raise _Mismatch
    if ann is float:
        number = None
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            number = value  # YAML gives 1 for 1.0: the constructors take int where float is expected
        elif coerce and isinstance(value, str):
            try:  # YAML 1.1 reads "1e-3" (no dot) as a string
                number = float(value)
            except ValueError:
                pass
        if number is None:
            raise _Mismatch
        if isinstance(number, float) and not math.isfinite(number):
            # no option takes NaN or inf (a NaN rate passes every `p < 0 or p > 1` check)
            raise ConfigError(f"{where}: {value!r} is not a finite number; give a finite float")
        return number
    if ann is str:
        if isinstance(value, str):
            return value
        raise _Mismatch
    if origin in _SEQUENCES or ann in _SEQUENCES:
        if not isinstance(value, (list, tuple)):  # not str, though str is a Sequence
            raise _Mismatch
        if not args:
            return value
        if origin is tuple and not (len(args) == 2 and args[1] is Ellipsis):
            if len(value) != len(args):
                raise ConfigError(f"{where}: expected {len(args)} items, got {len(value)}")
            items = args
        else:
            items = (args[0],) * len(value)
        return type(value)(check_value(v, a, f"{where}[{i}]")
                           for i, (v, a) in enumerate(zip(value, items)))
    if origin in _MAPPINGS or ann in _MAPPINGS:
        if not isinstance(value, dict):
            raise _Mismatch
        if len(args) != 2:
            return value
        return {check_value(k, args[0], f"{where} (key {k!r})"): check_value(v, args[1], f"{where}.{k}")
                for k, v in value.items()}
    return value  # a class, Callable, a torch type, ...: the constructor remains the judge


def check_value(value: Any, annotation: Any, where: str) -> Any:
    """``value`` checked against type ``annotation`` (as resolved by :func:`typing.get_type_hints`);
    returns it, a numeric string given for a float converted (YAML 1.1 reads ``1e-3`` as a string).

    Understood: ``int`` (``bool`` is not one), ``float`` (an ``int`` is one, as YAML writes ``1``
    for ``1.0``; NaN and infinities are refused: no option takes them), ``bool``, ``str``, ``None``, ``Optional`` / ``X | None`` and other unions,
    ``Literal[...]`` (the message lists the allowed values), ``list`` / ``tuple`` / ``Sequence``
    ``[...]`` (YAML gives a list; a tuple is taken too; items checked as ``where[i]``), ``dict`` /
    ``Mapping[K, V]``, ``Annotated[X, ...]``. Anything else (``Any``, a class, ``Callable``, a
    torch type) accepts every value: the constructor remains the judge.

    :param where: the key path, which starts every message (``"model.attention.num_inducing"``).
    :raises ConfigError: ``"<where>: expected int, got str 'abc'"``, or for a ``Literal``
        (``Literal[...] | None``) ``"<where>: 'foo' is not allowed; allowed: a, b"``.

    >>> check_value(1, float, "x"), check_value("1e-3", float | None, "x")
    (1, 0.001)
    >>> check_value(True, int, "model.attention.rank")
    Traceback (most recent call last):
    ...
    gpattn_ppl.schema.ConfigError: model.attention.rank: expected int, got bool True
    """
    try:
        return _match(value, annotation, where, coerce=True)
    except _Mismatch:
        pass
    members = (typing.get_args(annotation) if typing.get_origin(annotation) in _UNIONS
               else (annotation,))
    literals = [a for a in members if typing.get_origin(a) is Literal]
    if literals and all(typing.get_origin(a) is Literal or a is type(None) for a in members):
        allowed = [v for lit in literals for v in typing.get_args(lit)]
        if type(None) in members:
            allowed.append(None)
        raise ConfigError(f"{where}: {value!r} is not allowed; allowed: {_choices(allowed)}")
    raise ConfigError(f"{where}: expected {_describe(annotation)}, got {describe_value(value)}")


def check_attention(spec: Any, where: str) -> dict:
    """The attention spec at ``where`` checked (kind, option names, option values against the
    unit's annotations); returns a copy with the values :func:`check_value` converted.

    The check of every ``attention`` mapping of a model section (and of ``gpattn-ppl bench``'s
    specs): ``{"kind": <registered kind>, <option>: <value>, ...}``.

    :raises ~gpattn_ppl.schema.ConfigError: not a mapping with a ``kind``, an unknown kind or
        option, a value of the wrong type; the message starts with ``where``.
    """
    from ..attention import ATTENTION, attention_options
    from ..attention.registry import attention_option_types

    if not isinstance(spec, dict) or "kind" not in spec:
        raise ConfigError(f"{where}: expected a mapping with a 'kind' key "
                          f"(allowed kinds: {', '.join(sorted(ATTENTION))})")
    kind = spec["kind"]
    if not isinstance(kind, str) or kind not in ATTENTION:
        raise ConfigError(f"{where}.kind: unknown attention kind {kind!r}; "
                          f"allowed: {', '.join(sorted(ATTENTION))}")
    allowed = attention_options(kind)
    for key in spec:
        if key != "kind" and key not in allowed:
            raise ConfigError(f"{where}.{key}: unknown option for attention kind {kind!r}; "
                              f"allowed: {', '.join(sorted(allowed))}")
    hints = attention_option_types(kind)
    return {key: value if key == "kind" else check_value(value, hints[key], f"{where}.{key}")
            for key, value in spec.items()}


_SWAP_KEYS = ("layers", "attention", "init", "objective")


def check_unit_objective(entry: dict, where: str) -> None:
    """An entry's optional ``objective``: weights of its units' objective terms, under the keys
    of ``train.objective`` (``cgp_alpha``, ``kl_weight``, ...), replacing that section's weight
    for these units only (e.g. one CGP weight per layer, as the step-0 terms of ``swap.json``
    call for when the layers' terms differ by orders of magnitude)."""
    from ..ppl.objective import validate_objective

    spec = entry.setdefault("objective", {})
    if not isinstance(spec, Mapping):
        raise ConfigError(f"{where}.objective: expected a mapping of objective weights "
                          "(the keys of train.objective), got "
                          f"{type(spec).__name__}")
    try:
        validate_objective(dict(spec))
    except ValueError as err:
        raise ConfigError(f"{where}.objective: {err}") from None
    entry["objective"] = dict(spec)


def _check_hf(model: dict) -> None:
    """The rules of ``arch: hf``: a checkpoint, swap entries, no keys of the other archs' own
    blocks (attention, overrides)."""
    if model["checkpoint"] is None:
        raise ConfigError("model.checkpoint: arch 'hf' needs a checkpoint ('all-MiniLM-L6-v2' or "
                          "a local Hugging Face model folder)")
    if model["attention"] != {"kind": "softmax"} or model["overrides"]:
        raise ConfigError("model.attention / model.overrides: arch 'hf' keeps the checkpoint's "
                          "softmax layers; put units into it with model.swap: [{layers: [-1], "
                          "attention: {kind: ...}}]")
    if not isinstance(model["swap"], list):
        raise ConfigError("model.swap: expected a list")
    model["swap"] = [dict(e) if isinstance(e, dict) else e for e in model["swap"]]
    for i, entry in enumerate(model["swap"]):
        where = f"model.swap[{i}]"
        if not isinstance(entry, dict) or "attention" not in entry:
            raise ConfigError(f"{where}: expected a mapping with the keys layers, attention "
                              "(and optionally init, objective)")
        unknown = [k for k in entry if k not in _SWAP_KEYS]
        if unknown:
            raise ConfigError(f"{where}.{unknown[0]}: unknown key; allowed: {', '.join(_SWAP_KEYS)}")
        layers = entry.setdefault("layers", [-1])
        if not isinstance(layers, list) or not layers or not all(
                isinstance(b, int) and not isinstance(b, bool) for b in layers):
            raise ConfigError(f"{where}.layers: expected a non-empty list of layer indices (ints)")
        init = entry.setdefault("init", "pretrained")
        if init not in ("pretrained", "random"):
            raise ConfigError(f"{where}.init: {init!r} is not allowed; allowed: pretrained, random")
        entry["attention"] = check_attention(entry["attention"], f"{where}.attention")
        check_unit_objective(entry, where)
    if model["train_layers"] is not None and model["freeze"] != "none":
        raise ConfigError(f"model.train_layers and model.freeze: {model['freeze']!r}: give one "
                          "of them (train_layers freezes the layers below the top ones)")


def check_model(model: dict) -> None:
    """The rules across keys of a model section whose keys and types are already checked:
    attention kinds, options and option values (from the registry and the units' annotations),
    per-block overrides, ``dim % heads``.

    ``model["attention"]`` and ``model["overrides"]`` are replaced by checked copies (a numeric
    string given for a float option converted, see :func:`check_value`); the specs they were
    copied from are left as they were."""
    model["attention"] = check_attention(model["attention"], "model.attention")
    if model["arch"] == "hf":
        _check_hf(model)
    elif model["swap"] or model["checkpoint"] is not None or model["train_layers"] is not None:
        key = ("swap" if model["swap"] else "checkpoint" if model["checkpoint"] is not None
               else "train_layers")
        raise ConfigError(f"model.{key}: applies to "
                          f"arch 'hf' only (arch is {model['arch']!r})")
    if not isinstance(model["overrides"], list):
        raise ConfigError("model.overrides: expected a list")
    model["overrides"] = [dict(ov) if isinstance(ov, dict) else ov for ov in model["overrides"]]
    for i, ov in enumerate(model["overrides"]):
        where = f"model.overrides[{i}]"
        if not isinstance(ov, dict) or not {"blocks", "attention"} <= set(ov) <= {
                "blocks", "attention", "objective"}:
            raise ConfigError(f"{where}: expected a mapping with the keys blocks, attention "
                              "(and optionally objective)")
        if not isinstance(ov["blocks"], list) or not all(
                isinstance(b, int) and not isinstance(b, bool) for b in ov["blocks"]):
            raise ConfigError(f"{where}.blocks: expected a list of block indices (ints)")
        for b in ov["blocks"]:
            if not -model["depth"] <= b < model["depth"]:
                raise ConfigError(f"{where}.blocks: index {b} out of range for depth "
                                  f"{model['depth']} (allowed {-model['depth']}..{model['depth'] - 1})")
        ov["attention"] = check_attention(ov["attention"], f"{where}.attention")
        check_unit_objective(ov, where)
    if model["arch"] == "vit" and model["image_size"] % model["patch_size"]:
        raise ConfigError(f"model.image_size ({model['image_size']}) must be a multiple of "
                          f"model.patch_size ({model['patch_size']})")
    if model["arch"] == "vit" and (model["image_size"] // model["patch_size"]) ** 2 > MAX_LEN:
        n = (model["image_size"] // model["patch_size"]) ** 2
        raise ConfigError(f"model.image_size: {model['image_size']} with model.patch_size "
                          f"{model['patch_size']} makes {n} patches per image, the ViT's "
                          f"sequence; allowed: at most {MAX_LEN} (the longest sequence, as "
                          "model.max_len); raise model.patch_size or lower model.image_size")
    if not isinstance(model["sngp"], dict):
        raise ConfigError("model.sngp: expected a mapping")
    model["sngp"] = check_section(model["sngp"], SNGP_SCHEMA, "model.sngp")
    if model["head"] != "sngp" and model["sngp"] != _SNGP_DEFAULT_SECTION:
        changed = next(k for k, v in model["sngp"].items() if v != _SNGP_DEFAULT_SECTION[k])
        raise ConfigError(f"model.sngp.{changed}: applies to model.head 'sngp' only (head is "
                          f"{model['head']!r}); set model.head: sngp")
    if model["dim"] % model["heads"]:
        raise ConfigError(f"model.dim ({model['dim']}) must be a multiple of model.heads "
                          f"({model['heads']})")


def validate_model_spec(spec: dict | None) -> dict:
    """A complete model section (defaults filled in) from a partial one; raises
    :class:`ConfigError`."""
    out = check_section(spec if spec is not None else {}, MODEL_SCHEMA, "model")
    check_model(out)
    return out
