"""The model spec: its schema, the schema machinery, and validation against the attention registry.

A model spec is the ``model`` section of an experiment config (DESIGN §4). :func:`validate_model_spec`
fills in defaults and checks every key path, type and attention option; errors are
:class:`ConfigError` naming the key path and the allowed values.

>>> validate_model_spec({"depth": 1})["attention"]
{'kind': 'softmax'}
"""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import yaml

__all__ = ["ConfigError", "MODEL_SCHEMA", "Option", "check_model", "check_section",
           "read_yaml_mapping", "validate_model_spec"]


class ConfigError(ValueError):
    """An invalid configuration; the message names the key path."""


def read_yaml_mapping(path: str | Path) -> dict:
    """The top-level mapping of a YAML file (empty file: ``{}``).

    :raises FileNotFoundError: no such file. :raises ConfigError: the top level is not a mapping.
    """
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"config file not found: {path}")
    raw = yaml.safe_load(path.read_text()) or {}
    if not isinstance(raw, dict):
        raise ConfigError(f"{path}: the top level must be a mapping")
    return raw


class Option:
    """A leaf of a schema: accepted types, default, optional choices.

    :param free: the value is a mapping / list checked by its own rules (not key by key).
    """

    def __init__(self, types, default, choices=None, free: bool = False) -> None:
        self.types = types if isinstance(types, tuple) else (types,)
        self.default, self.choices, self.free = default, choices, free


_NUM = (int, float)
_NONE = type(None)

#: key -> :class:`Option` of the ``model`` section.
MODEL_SCHEMA: dict[str, Option] = {
    "arch": Option(str, "text", ("text", "vit")),
    "dim": Option(int, 128), "depth": Option(int, 2), "heads": Option(int, 4),
    "mlp_dim": Option(int, 256), "dropout": Option(_NUM, 0.1),
    "attn_dropout": Option(_NUM + (_NONE,), None),
    "mc_dropout": Option(bool, False),
    "max_len": Option(int, 64),
    "image_size": Option(int, 32), "patch_size": Option(int, 4), "channels": Option(int, 3),
    "attention": Option(dict, {"kind": "softmax"}, free=True),
    "overrides": Option(list, [], free=True),
    "num_classes": Option((int, _NONE), None), "vocab_size": Option((int, _NONE), None),
    "feature_dim": Option((int, _NONE), None),
}


def _defaults(schema: dict) -> dict:
    return {k: (_defaults(v) if isinstance(v, dict) else copy.deepcopy(v.default))
            for k, v in schema.items()}


def check_section(value: Any, schema: dict, path: str) -> dict:
    """``value`` checked key by key against ``schema`` (nested mappings of :class:`Option`),
    defaults filled in; ``path`` prefixes the key paths of error messages."""
    if not isinstance(value, dict):
        raise ConfigError(f"{path or 'config'}: expected a mapping, got {type(value).__name__}")
    out = _defaults(schema)
    for key, v in value.items():
        where = f"{path}.{key}" if path else str(key)
        if key not in schema:
            raise ConfigError(f"{where}: unknown key; allowed: {', '.join(schema)}")
        spec = schema[key]
        if isinstance(spec, dict):
            out[key] = check_section(v if v is not None else {}, spec, where)
            continue
        if isinstance(v, str) and float in spec.types and str not in spec.types:
            try:  # YAML 1.1 reads "1e-3" (no dot) as a string
                v = float(v)
            except ValueError:
                pass
        if isinstance(v, bool) and bool not in spec.types:
            raise ConfigError(f"{where}: expected {'/'.join(t.__name__ for t in spec.types)}, "
                              f"got bool {v}")
        if not isinstance(v, spec.types):
            raise ConfigError(f"{where}: expected {'/'.join(t.__name__ for t in spec.types)}, "
                              f"got {type(v).__name__} {v!r}")
        if spec.choices is not None and v not in spec.choices:
            raise ConfigError(f"{where}: {v!r} is not allowed; allowed: {', '.join(spec.choices)}")
        out[key] = v
    return out


def _check_attention(spec: Any, where: str) -> None:
    from ..attention import ATTENTION, attention_options

    if not isinstance(spec, dict) or "kind" not in spec:
        raise ConfigError(f"{where}: expected a mapping with a 'kind' key "
                          f"(allowed kinds: {', '.join(sorted(ATTENTION))})")
    kind = spec["kind"]
    if kind not in ATTENTION:
        raise ConfigError(f"{where}.kind: unknown attention kind {kind!r}; "
                          f"allowed: {', '.join(sorted(ATTENTION))}")
    allowed = attention_options(kind)
    for key in spec:
        if key != "kind" and key not in allowed:
            raise ConfigError(f"{where}.{key}: unknown option for attention kind {kind!r}; "
                              f"allowed: {', '.join(sorted(allowed))}")


def check_model(model: dict) -> None:
    """The rules across keys of a model section whose keys and types are already checked:
    attention kinds and options (from the registry), per-block overrides, ``dim % heads``."""
    _check_attention(model["attention"], "model.attention")
    if not isinstance(model["overrides"], list):
        raise ConfigError("model.overrides: expected a list")
    for i, ov in enumerate(model["overrides"]):
        where = f"model.overrides[{i}]"
        if not isinstance(ov, dict) or set(ov) != {"blocks", "attention"}:
            raise ConfigError(f"{where}: expected a mapping with exactly the keys blocks, attention")
        if not isinstance(ov["blocks"], list) or not all(isinstance(b, int) for b in ov["blocks"]):
            raise ConfigError(f"{where}.blocks: expected a list of block indices (ints)")
        for b in ov["blocks"]:
            if not -model["depth"] <= b < model["depth"]:
                raise ConfigError(f"{where}.blocks: index {b} out of range for depth "
                                  f"{model['depth']} (allowed {-model['depth']}..{model['depth'] - 1})")
        _check_attention(ov["attention"], f"{where}.attention")
    if model["dim"] % model["heads"]:
        raise ConfigError(f"model.dim ({model['dim']}) must be a multiple of model.heads "
                          f"({model['heads']})")


def validate_model_spec(spec: dict | None) -> dict:
    """A complete model section (defaults filled in) from a partial one; raises
    :class:`ConfigError`."""
    out = check_section(spec if spec is not None else {}, MODEL_SCHEMA, "model")
    check_model(out)
    return out
