"""Experiment configuration: one validated dict with the sections model, data, train, eval.

Unknown keys and wrong types are :class:`ConfigError` naming the key path and the allowed values.
``--set key.path=value`` overrides are parsed as YAML scalars. The ``model`` section's schema and
rules belong to the models (:mod:`gpattn_ppl.models.spec`); this module adds the other sections.
A config is validated once, by :func:`load_config` / :func:`validate_config`, which return a
:class:`Config`; the application hands that on without validating it again.

>>> cfg = load_config({"model": {"depth": 1}})
>>> cfg["model"]["depth"], cfg["train"]["optimizer"]
(1, 'adam')
"""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import yaml

from ..models.spec import (
    MODEL_SCHEMA,
    ConfigError,
    Option,
    check_model,
    check_section,
    read_yaml_mapping,
)

# ConfigError is defined in gpattn_ppl.models.spec and importable from here too
__all__ = ["Config", "SCHEMA", "load_config", "validate_config", "apply_overrides"]


class Config(dict):
    """A validated config: the four sections with every default filled in.

    A plain ``dict`` in every other respect; the type records that validation happened, so the
    experiment and the model builder take it as it is. Store ``dict(cfg)`` where only plain
    dicts may go (YAML, checkpoints).
    """


_NUM = (int, float)
_NONE = type(None)

SCHEMA: dict[str, Any] = {
    "model": MODEL_SCHEMA,
    "data": {
        "name": Option(str, "cola"), "protocol": Option((str, _NONE), None),
        "root": Option((str, _NONE), None), "cr_root": Option((str, _NONE), None),
        "encoder": Option(str, "learned", ("learned", "minilm")),
        "max_len": Option(int, 64), "batch_size": Option(int, 32),
        "eval_batch_size": Option(int, 256),
        "cache_dir": Option((str, _NONE), None), "limit_train": Option((int, _NONE), None),
        "limit_eval": Option((int, _NONE), None),
        "split_seed": Option(int, 0),
        # options of the csv / jsonl datasets (``None``: the dataset's default)
        "train_file": Option((str, _NONE), None), "val_file": Option((str, _NONE), None),
        "test_file": Option((str, _NONE), None), "ood_files": Option((dict, _NONE), None),
        "text_column": Option((str, _NONE), None), "label_column": Option((str, _NONE), None),
        "delimiter": Option((str, _NONE), None),
        # options of the image_folder dataset
        "train_dir": Option((str, _NONE), None), "val_dir": Option((str, _NONE), None),
        "test_dir": Option((str, _NONE), None), "ood_dirs": Option((dict, _NONE), None),
        "image_size": Option((int, _NONE), None),
    },
    "train": {
        "epochs": Option(int, 50), "lr": Option(_NUM, 5e-4), "min_lr": Option(_NUM, 1e-5),
        "optimizer": Option(str, "adam", ("adam", "adamw")), "weight_decay": Option(_NUM, 0.0),
        "schedule": Option(str, "cosine", ("cosine", "linear", "constant")),
        "warmup_epochs": Option(_NUM, 5), "seed": Option(int, 0),
        "grad_clip": Option(_NUM + (_NONE,), None),
        "select_metric": Option(str, "auto"),
        "mode": Option(str, "thin", ("thin", "sites")),
        "objective": Option(dict, {}, free=True),
        "init_from": Option((str, _NONE), None),
        "progress": Option(bool, True), "device": Option(str, "auto"),
    },
    "eval": {
        "mc_samples": Option(int, 10), "ood": Option((list, _NONE), None),
        "metrics": Option((list, _NONE), None),
        "average": Option(str, "probs", ("probs", "logits")),
        "ood_detectors": Option((list, _NONE), None),
        "temperature_scaling": Option(bool, False),
    },
}


def validate_config(cfg: dict) -> Config:
    """A complete config (defaults filled in) from a partial one; raises :class:`ConfigError`."""
    out = check_section(cfg, SCHEMA, "")
    check_model(out["model"])
    from ..ppl.objective import validate_objective

    try:
        validate_objective(out["train"]["objective"])
    except ValueError as err:
        raise ConfigError(f"train.objective: {err}") from None
    return Config(out)


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
                ) -> Config:
    """Load (YAML path or dict), apply ``--set`` overrides, validate, fill defaults."""
    if source is None:
        raw: dict = {}
    elif isinstance(source, dict):
        raw = copy.deepcopy(dict(source))
    else:
        raw = read_yaml_mapping(source)
    return validate_config(apply_overrides(raw, overrides or []))
