"""Experiment configuration: one validated dict with the sections model, data, train, eval.

Unknown keys and wrong types are :class:`ConfigError` naming the key path and the allowed values.
``--set key.path=value`` overrides are parsed as YAML scalars.

>>> cfg = load_config({"model": {"depth": 1}})
>>> cfg["model"]["depth"], cfg["train"]["optimizer"]
(1, 'adam')
"""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import yaml

__all__ = ["ConfigError", "SCHEMA", "load_config", "validate_config", "apply_overrides"]


class ConfigError(ValueError):
    """An invalid configuration; the message names the key path."""


class _Opt:
    """A leaf of the schema: accepted types, default, optional choices."""

    def __init__(self, types, default, choices=None, free: bool = False) -> None:
        self.types = types if isinstance(types, tuple) else (types,)
        self.default, self.choices, self.free = default, choices, free


_NUM = (int, float)
_NONE = type(None)

SCHEMA: dict[str, Any] = {
    "model": {
        "arch": _Opt(str, "text", ("text", "vit")),
        "dim": _Opt(int, 128), "depth": _Opt(int, 2), "heads": _Opt(int, 4),
        "mlp_dim": _Opt(int, 256), "dropout": _Opt(_NUM, 0.1),
        "attn_dropout": _Opt(_NUM + (_NONE,), None),
        "mc_dropout": _Opt(bool, False),
        "max_len": _Opt(int, 64),
        "image_size": _Opt(int, 32), "patch_size": _Opt(int, 4), "channels": _Opt(int, 3),
        "attention": _Opt(dict, {"kind": "softmax"}, free=True),
        "overrides": _Opt(list, [], free=True),
        "num_classes": _Opt((int, _NONE), None), "vocab_size": _Opt((int, _NONE), None),
        "feature_dim": _Opt((int, _NONE), None),
    },
    "data": {
        "name": _Opt(str, "cola"), "protocol": _Opt((str, _NONE), None),
        "root": _Opt((str, _NONE), None), "cr_root": _Opt((str, _NONE), None),
        "encoder": _Opt(str, "learned", ("learned", "minilm")),
        "max_len": _Opt(int, 64), "batch_size": _Opt(int, 32), "eval_batch_size": _Opt(int, 256),
        "cache_dir": _Opt((str, _NONE), None), "limit_train": _Opt((int, _NONE), None),
        "limit_eval": _Opt((int, _NONE), None),
        "split_seed": _Opt(int, 0),
    },
    "train": {
        "epochs": _Opt(int, 50), "lr": _Opt(_NUM, 5e-4), "min_lr": _Opt(_NUM, 1e-5),
        "optimizer": _Opt(str, "adam", ("adam", "adamw")), "weight_decay": _Opt(_NUM, 0.0),
        "schedule": _Opt(str, "cosine", ("cosine", "linear", "constant")),
        "warmup_epochs": _Opt(_NUM, 5), "seed": _Opt(int, 0),
        "grad_clip": _Opt(_NUM + (_NONE,), None),
        "select_metric": _Opt(str, "auto"),
        "mode": _Opt(str, "thin", ("thin", "sites")),
        "objective": _Opt(dict, {}, free=True),
        "init_from": _Opt((str, _NONE), None),
        "progress": _Opt(bool, True), "device": _Opt(str, "auto"),
    },
    "eval": {
        "mc_samples": _Opt(int, 10), "ood": _Opt((list, _NONE), None),
        "metrics": _Opt((list, _NONE), None),
        "average": _Opt(str, "probs", ("probs", "logits")),
        "ood_detectors": _Opt((list, _NONE), None),
    },
}


def _defaults(schema: dict) -> dict:
    return {k: (_defaults(v) if isinstance(v, dict) else copy.deepcopy(v.default))
            for k, v in schema.items()}


def _check(value: Any, schema: dict, path: str) -> dict:
    if not isinstance(value, dict):
        raise ConfigError(f"{path or 'config'}: expected a mapping, got {type(value).__name__}")
    out = _defaults(schema)
    for key, v in value.items():
        where = f"{path}.{key}" if path else str(key)
        if key not in schema:
            raise ConfigError(f"{where}: unknown key; allowed: {', '.join(schema)}")
        spec = schema[key]
        if isinstance(spec, dict):
            out[key] = _check(v if v is not None else {}, spec, where)
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


def validate_config(cfg: dict) -> dict:
    """A complete config (defaults filled in) from a partial one; raises :class:`ConfigError`."""
    out = _check(cfg, SCHEMA, "")
    _check_model(out["model"])
    from .infer.objective import validate_objective

    try:
        validate_objective(out["train"]["objective"])
    except ValueError as err:
        raise ConfigError(f"train.objective: {err}") from None
    return out


def _check_attention(spec: Any, where: str) -> None:
    from .attention import ATTENTION, attention_options

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


def _check_model(model: dict) -> None:
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


def _parse_override(item: str) -> tuple[list[str], Any]:
    if "=" not in item:
        raise ConfigError(f"--set {item!r}: expected key.path=value")
    key, raw = item.split("=", 1)
    return key.strip().split("."), yaml.safe_load(raw)


def apply_overrides(cfg: dict, overrides: list[str]) -> dict:
    """Apply ``["train.lr=1e-3", "model.attention.kind=kernel"]`` to a (raw) config dict."""
    cfg = copy.deepcopy(cfg)
    for item in overrides or []:
        keys, value = _parse_override(item)
        node = cfg
        for k in keys[:-1]:
            node = node.setdefault(k, {})
            if not isinstance(node, dict):
                raise ConfigError(f"--set {item!r}: {k} is not a mapping")
        node[keys[-1]] = value
    return cfg


def load_config(source: str | Path | dict | None = None, overrides: list[str] | None = None
                ) -> dict:
    """Load (YAML path or dict), apply ``--set`` overrides, validate, fill defaults."""
    if source is None:
        raw: dict = {}
    elif isinstance(source, dict):
        raw = copy.deepcopy(source)
    else:
        path = Path(source)
        if not path.is_file():
            raise FileNotFoundError(f"config file not found: {path}")
        raw = yaml.safe_load(path.read_text()) or {}
        if not isinstance(raw, dict):
            raise ConfigError(f"{path}: the top level must be a mapping")
    return validate_config(apply_overrides(raw, overrides or []))
