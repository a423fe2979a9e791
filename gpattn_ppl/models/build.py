"""Declarative model construction: a model spec -> a classifier."""

from __future__ import annotations

from pathlib import Path

from ..schema import ConfigError, read_yaml_mapping
from .classifier import resolve_block_attention
from .spec import validate_model_spec
from .text import TextClassifier
from .vit import ViTClassifier

__all__ = ["assemble_model", "build_model"]


def _read_spec(spec: dict | str | Path) -> dict | None:
    """The model section of a YAML path, a whole config (``model`` key) or a model section."""
    if isinstance(spec, (str, Path)):
        return read_yaml_mapping(spec).get("model")
    if "model" in spec:
        return spec["model"]
    return spec


def build_model(spec: dict | str | Path, **fill):
    """Build a classifier from a model spec (dict, or a YAML file with a ``model:`` section).

    The spec is validated (:func:`~gpattn_ppl.models.spec.validate_model_spec`); of a whole
    config only the ``model`` section is read.

    :param spec: the ``model`` section, or a whole config with a ``model`` key, or a YAML path.
    :param fill: values the data decides (``num_classes``, ``vocab_size``, ``feature_dim``),
        used where the spec leaves them unset.
    :raises ConfigError: unknown keys, wrong types, unknown attention kinds or options.

    >>> m = build_model({"arch": "text", "dim": 16, "heads": 2, "depth": 1, "mlp_dim": 32},
    ...                 num_classes=2, vocab_size=100)
    >>> type(m).__name__
    'TextClassifier'
    """
    return assemble_model(validate_model_spec(_read_spec(spec)), **fill)


def assemble_model(model: dict, **fill):
    """Build a classifier from an already validated model section (no re-validation).

    :param model: a complete model section, as :func:`~gpattn_ppl.models.spec.validate_model_spec`
        (or the experiment config's validation) returns it.
    :param fill: as for :func:`build_model`.
    """
    m = dict(model)
    for key, value in fill.items():
        if key not in m:
            raise ConfigError(f"model.{key}: unknown key")
        if m[key] is None:
            m[key] = value
    if m["num_classes"] is None:
        raise ConfigError("model.num_classes: not set (give it in the spec or from the data)")
    # the output layer: linear, or SNGP's random-feature GP (its options only then)
    head = {"head": m.get("head", "linear"),
            "sngp": m.get("sngp") if m.get("head", "linear") == "sngp" else None}
    if m["arch"] == "hf":
        from .hf import HFClassifier
        return HFClassifier(num_classes=m["num_classes"], checkpoint=m["checkpoint"],
                            pooling=m["pooling"], freeze=m["freeze"], swap=m["swap"],
                            mc_dropout=m["mc_dropout"], train_layers=m["train_layers"], **head)
    attention = resolve_block_attention(m["depth"], m["attention"], m["overrides"])
    common = dict(num_classes=m["num_classes"], dim=m["dim"], depth=m["depth"], heads=m["heads"],
                  mlp_dim=m["mlp_dim"], dropout=m["dropout"], attention=attention,
                  mc_dropout=m["mc_dropout"], attn_dropout=m["attn_dropout"], **head)
    if m["arch"] == "text":
        if (m["vocab_size"] is None) == (m["feature_dim"] is None):
            raise ConfigError("model: a text model needs exactly one of vocab_size or feature_dim")
        net = TextClassifier(vocab_size=m["vocab_size"], feature_dim=m["feature_dim"],
                             max_len=m["max_len"], **common)
    else:
        net = ViTClassifier(image_size=m["image_size"], patch_size=m["patch_size"],
                            channels=m["channels"], **common)
    for ov in m["overrides"]:           # later entries win, as for the attention specs
        for b in ov["blocks"]:
            net.blocks[b % m["depth"]].attn.objective_weights = dict(ov.get("objective") or {})
    return net
