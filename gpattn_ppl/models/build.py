"""Declarative model construction."""

from __future__ import annotations

from pathlib import Path

from ..config import ConfigError, load_config
from .classifier import resolve_block_attention
from .text import TextClassifier
from .vit import ViTClassifier

__all__ = ["build_model"]


def build_model(spec: dict | str | Path, **fill):
    """Build a classifier from a model spec (dict, or a YAML file with a ``model:`` section).

    :param spec: the ``model`` section, or a whole config with a ``model`` key, or a YAML path.
    :param fill: values the data decides (``num_classes``, ``vocab_size``, ``feature_dim``),
        used where the spec leaves them unset.
    :raises ConfigError: unknown keys, wrong types, unknown attention kinds or options.

    >>> m = build_model({"arch": "text", "dim": 16, "heads": 2, "depth": 1, "mlp_dim": 32},
    ...                 num_classes=2, vocab_size=100)
    >>> type(m).__name__
    'TextClassifier'
    """
    if isinstance(spec, (str, Path)):
        cfg = load_config(spec)
    elif "model" in spec:
        cfg = load_config(spec)
    else:
        cfg = load_config({"model": spec})
    m = dict(cfg["model"])
    for key, value in fill.items():
        if key not in m:
            raise ConfigError(f"model.{key}: unknown key")
        if m[key] is None:
            m[key] = value
    if m["num_classes"] is None:
        raise ConfigError("model.num_classes: not set (give it in the spec or from the data)")
    attention = resolve_block_attention(m["depth"], m["attention"], m["overrides"])
    common = dict(num_classes=m["num_classes"], dim=m["dim"], depth=m["depth"], heads=m["heads"],
                  mlp_dim=m["mlp_dim"], dropout=m["dropout"], attention=attention,
                  mc_dropout=m["mc_dropout"], attn_dropout=m["attn_dropout"])
    if m["arch"] == "text":
        if (m["vocab_size"] is None) == (m["feature_dim"] is None):
            raise ConfigError("model: a text model needs exactly one of vocab_size or feature_dim")
        return TextClassifier(vocab_size=m["vocab_size"], feature_dim=m["feature_dim"],
                              max_len=m["max_len"], **common)
    return ViTClassifier(image_size=m["image_size"], patch_size=m["patch_size"],
                         channels=m["channels"], **common)
