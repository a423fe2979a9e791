"""Save and load a Hugging Face model with swapped attention units, the Hugging Face way.

:func:`swap` is :func:`~gpattn_ppl.models.swap_attention` for a ``transformers``
``PreTrainedModel`` that also records the swap in the model's config, under
:data:`SWAP_KEY`. Because the record lives in the config, every ``model.save_pretrained(folder)``
(yours, the ``Trainer``'s checkpoints, ``push_to_hub``) writes it to ``config.json`` next to
the weights in ``model.safetensors``; nothing else is needed. :func:`from_pretrained` reads
such a folder back: it builds the host from its config, swaps the same units in again with
``init="random"`` and loads every weight from the safetensors files, strictly (no pickle is
read; ``torch.load`` is never called). The folder is checked before ``transformers`` reads it
(:func:`~gpattn_ppl.data.hf_folder.check_model_folder`): no code of it runs
(``trust_remote_code=False``, an ``auto_map`` is refused), ``architectures`` must name a
``PreTrainedModel`` class of the config's model type, shard names are plain file names in the
folder, and a tensor of another dtype kind than the model's (an integer for a float weight) is
refused; a float of another precision is cast.

The record, one entry per :func:`swap` call, in call order::

    "gpattn_swap": [{"kind": "kep_svgp", "layers": [5],
                     "paths": ["bert.encoder.layer.5.attention.unit"],
                     "options": {"rank": 5, "proj_dropout": 0.1}}]

``layers`` are indices into the model's attention layers (as :func:`swap_attention` counts
them, made non-negative), ``paths`` the units' module paths, ``options`` the unit's keyword
options as built (the dropouts taken from the host included), so a reload does not depend on
defaults. ``AutoModel*.from_pretrained`` on such a folder loads the unswapped host and reports
the units' weights as unexpected: load it with :func:`from_pretrained`.

>>> import transformers
>>> from gpattn_ppl.hf import from_pretrained, swap
>>> cfg = transformers.BertConfig(vocab_size=50, hidden_size=16, num_hidden_layers=2,
...                               num_attention_heads=4, intermediate_size=32)
>>> model = transformers.BertForSequenceClassification(cfg)
>>> [r["path"] for r in swap(model, "kep_svgp", layers=[-1], init="random", rank=3)]
['bert.encoder.layer.1.attention.unit']
>>> model.config.gpattn_swap[0]["kind"], model.config.gpattn_swap[0]["layers"]
('kep_svgp', [1])
"""

from __future__ import annotations

import json
import os
from collections.abc import Sequence
from pathlib import Path

import torch
from torch import nn

from ..attention import attention_options
from ..data.hf_folder import (
    HFFolderError,
    check_model_folder,
    dtype_kind,
    transformers_failed,
    weight_files,
)
from ..errors import GpattnError
from ..models.swap import attention_units, find_attention_layers, swap_attention

__all__ = ["SWAP_KEY", "SwapRecordError", "check_swap_record", "from_pretrained", "swap"]

#: the config attribute (and ``config.json`` key) holding the swap record
SWAP_KEY = "gpattn_swap"

_HINT = 'the Hugging Face integration needs the text extra: pip install "gpattn-ppl[text]"'


def _transformers():
    try:
        import transformers
    except ImportError as err:
        raise ImportError(f"{_HINT} (package 'transformers' is missing)") from err
    return transformers


class SwapRecordError(GpattnError, ValueError):
    """A model's or a folder's swap record is missing, malformed or does not match the model."""


def _require_pretrained(model, where: str):
    transformers = _transformers()
    if not isinstance(model, transformers.PreTrainedModel):
        raise TypeError(f"{where}: expected a transformers PreTrainedModel (its config carries "
                        f"the swap record), got {type(model).__name__}; for any other module use "
                        "gpattn_ppl.models.swap_attention")


def _dropouts(units: list[nn.Module], kind: str) -> dict[str, float]:
    """The dropout rates the units were built with, where all agree (``attn_dropout``,
    ``proj_dropout`` when the kind takes them)."""
    out = {}
    for name in ("attn_dropout", "proj_dropout"):
        if name not in attention_options(kind):
            continue
        rates = {float(getattr(u, name).p) for u in units if hasattr(u, name)}
        if len(rates) == 1:
            out[name] = rates.pop()
    return out


def swap(model, kind: str, layers: Sequence[int] = (-1,), init: str = "pretrained",
         calibration=None, **options) -> list[dict]:
    """:func:`~gpattn_ppl.models.swap_attention` on a ``PreTrainedModel``, recorded in
    ``model.config`` under :data:`SWAP_KEY` so that ``save_pretrained`` saves it.

    Parameters and returns as :func:`~gpattn_ppl.models.swap_attention`; ``model`` is the
    ``PreTrainedModel`` itself (e.g. a ``BertForSequenceClassification``), so the recorded unit
    paths are those of its state dict.

    :raises TypeError: ``model`` is not a ``PreTrainedModel``.
    :raises SwapRecordError: ``options`` that JSON cannot hold, or a model holding units that
        were swapped in without a record (by :func:`~gpattn_ppl.models.swap_attention`).
    """
    _require_pretrained(model, "swap")
    check_swap_record(model, where="swap")
    try:
        json.dumps(options)
    except TypeError as err:
        raise SwapRecordError(f"swap: the unit options must be JSON values to be saved with the "
                              f"config ({err})") from None
    L = len(find_attention_layers(model))
    records = swap_attention(model, kind, layers=layers, init=init, calibration=calibration,
                             **options)
    units = attention_units(model)
    for r in records:
        # the adapter is a new module, in training mode whatever the model's mode: give it the
        # mode its unit took from the replaced layer (a later swap of the layer reads it)
        unit = units[r["path"]]
        adapter = model.get_submodule(r["path"].rpartition(".")[0])
        if getattr(adapter, "unit", None) is unit:
            adapter.training = unit.training
    built = dict(options)
    for name, rate in _dropouts([units[r["path"]] for r in records], kind).items():
        built.setdefault(name, rate)
    # swap_attention has checked the indices: make them non-negative, in the order it swapped
    absolute = []
    for i in layers:
        if i % L not in absolute:
            absolute.append(i % L)
    entry = {"kind": kind, "layers": absolute, "paths": [r["path"] for r in records],
             "options": built}
    setattr(model.config, SWAP_KEY, [*(getattr(model.config, SWAP_KEY, None) or []), entry])
    return records


def _record(config, where: str) -> list[dict]:
    rec = getattr(config, SWAP_KEY, None)
    if rec is None:
        raise SwapRecordError(f"{where}: the config has no {SWAP_KEY!r} record (not saved from a "
                              "model swapped with gpattn_ppl.hf.swap)")
    if not isinstance(rec, list) or not all(_entry_ok(e) for e in rec):
        raise SwapRecordError(f"{where}: malformed {SWAP_KEY!r} record (expected a list of "
                              "{kind: str, layers: [int], paths: [str], options: {str: value}} "
                              f"entries), got {str(rec)[:200]}")
    return rec


def _entry_ok(e) -> bool:
    """One record entry of the right shape (a hostile ``config.json`` may hold anything)."""
    return (isinstance(e, dict) and {"kind", "layers", "paths", "options"} <= set(e)
            and isinstance(e["kind"], str)
            and isinstance(e["layers"], list) and all(
                isinstance(i, int) and not isinstance(i, bool) for i in e["layers"])
            and isinstance(e["paths"], list) and all(isinstance(p, str) for p in e["paths"])
            and isinstance(e["options"], dict) and all(
                isinstance(k, str) and k.isidentifier() for k in e["options"]))


def check_swap_record(model, where: str = "check_swap_record") -> list[dict]:
    """The swap record of ``model``; raises :class:`SwapRecordError` unless the units in the
    model are exactly the ones it records (by module path and kind)."""
    rec = getattr(model.config, SWAP_KEY, None)
    rec = [] if rec is None else _record(model.config, where)
    recorded = {}
    for entry in rec:
        for path in entry["paths"]:
            recorded[path] = entry["kind"]          # a later swap of a layer replaces it
    actual = {path: type(u).kind for path, u in attention_units(model).items()}
    if recorded != actual:
        unrecorded = sorted(set(actual) - set(recorded))
        hint = (" (swapped by gpattn_ppl.models.swap_attention: use gpattn_ppl.hf.swap, which "
                "records the swap in the config)" if unrecorded else "")
        raise SwapRecordError(f"{where}: the model's units {actual} do not match its "
                              f"{SWAP_KEY!r} record {recorded}{hint}")
    return rec


def _state_dict_files(folder: Path) -> list[Path]:
    """The safetensors files of ``folder``, confined to it
    (:func:`~gpattn_ppl.data.hf_folder.weight_files`: shard names are plain file names)."""
    return weight_files(folder)


def _model_class(config, where: str):
    """The ``transformers`` model class ``config.architectures[0]`` names: a
    ``PreTrainedModel`` subclass whose config class is the config's (never another callable)."""
    transformers = _transformers()
    names = getattr(config, "architectures", None) or []
    name = names[0] if isinstance(names, list) and names else None
    if not isinstance(name, str) or not name.isidentifier():
        raise SwapRecordError(f"{where}: the config names no transformers model class "
                              f"(architectures={str(names)[:120]}); pass model_class")
    try:
        cls = getattr(transformers, name, None)
    except (ImportError, AttributeError, RuntimeError):
        cls = None
    config_class = getattr(cls, "config_class", None)
    if not (isinstance(cls, type) and issubclass(cls, transformers.PreTrainedModel)
            and isinstance(config_class, type) and isinstance(config, config_class)
            and getattr(config_class, "model_type", None) == config.model_type):
        raise SwapRecordError(f"{where}: architectures[0] {name!r} is not a transformers model "
                              f"class for model_type {config.model_type!r} (a PreTrainedModel "
                              "subclass of that config); not built. Pass model_class")
    return cls


def from_pretrained(folder: str | Path, model_class=None, *, device: str | torch.device = "cpu"):
    """The swapped model saved in ``folder`` by ``save_pretrained``, in evaluation mode.

    Builds ``model_class`` (default: the class named by the config's ``architectures``, from
    ``transformers``) from ``config.json`` with random weights, replays the record's swaps with
    ``init="random"`` and loads the safetensors weights with ``strict=True``: the loaded model
    computes exactly what the saved one did. The caller's random state is left as it was.

    :param folder: a folder holding ``config.json`` (with :data:`SWAP_KEY`) and
        ``model.safetensors`` (or a sharded ``model.safetensors.index.json``).
    :param model_class: a ``PreTrainedModel`` class, when the config names none or another.
    :param device: where the weights are loaded.
    :raises FileNotFoundError: no folder, ``config.json`` or safetensors weights.
    :raises ~gpattn_ppl.data.hf_folder.HFFolderError: a folder that asks to run its own code
        (``auto_map``) or names a model type ``transformers`` does not ship, a shard name that
        is not a plain file name in the folder, a file linking out of it, a malformed index or
        safetensors header, pickled weights only
        (:func:`~gpattn_ppl.data.hf_folder.check_model_folder`).
    :raises SwapRecordError: no or a malformed swap record, an unknown attention kind, a swap
        that does not give the recorded paths, ``architectures`` naming anything but a
        ``PreTrainedModel`` class of the config's model type, or weights that do not match the
        rebuilt model (missing, unexpected, differently shaped tensors, or tensors of another
        dtype kind: an integer or bool tensor for a float one, or the other way round; a float
        of another precision is cast to the model's), named.
    """
    transformers = _transformers()
    from safetensors import SafetensorError
    from safetensors.torch import load_file

    folder = Path(folder)
    if not os.path.lexists(folder / "config.json"):
        raise FileNotFoundError(f"{folder}: no config.json (not a saved Hugging Face model)")
    where = f"from_pretrained({str(folder)!r})"
    check_model_folder(folder, weights=True)  # no code of the folder runs; shards confined
    try:
        config = transformers.AutoConfig.from_pretrained(str(folder), local_files_only=True,
                                                         trust_remote_code=False)
    except Exception as err:  # noqa: BLE001 -- a config value of the wrong type or range
        raise transformers_failed(folder, "read its config.json", err) from None
    rec = _record(config, where)
    if model_class is None:
        model_class = _model_class(config, where)
    files = _state_dict_files(folder)
    with torch.random.fork_rng(devices=[]):
        try:
            model = model_class(config)
        except Exception as err:  # noqa: BLE001 -- a config the class cannot be built from
            raise transformers_failed(folder, "build the model from its config.json", err
                                      ) from None
        setattr(model.config, SWAP_KEY, None)
        for entry in rec:
            try:
                got = swap(model, entry["kind"], layers=list(entry["layers"]), init="random",
                           **entry["options"])
            except (ValueError, TypeError) as err:
                raise SwapRecordError(f"{where}: cannot replay the swap {entry}: {err}") from err
            if [r["path"] for r in got] != list(entry["paths"]):
                raise SwapRecordError(f"{where}: replaying {entry} put units at "
                                      f"{[r['path'] for r in got]}, not at the recorded paths")
    state = {}
    for f in files:
        try:
            state.update(load_file(str(f), device=str(device)))
        except (SafetensorError, OSError) as err:  # the header was checked: a corrupt body
            first = (str(err).strip() or type(err).__name__).splitlines()[0]
            raise HFFolderError(f"{where}: {f.name} is not a readable safetensors file "
                                f"({first})") from None
    model.to(device)
    _load_strict(model, state, where)
    return model.eval()


def _load_strict(model: nn.Module, state: dict, where: str) -> None:
    own = model.state_dict()
    # a tied weight (one tensor under two names) is saved once: the loaded name fills the other
    saved_ptrs = {own[k].data_ptr() for k in set(own) & set(state)}
    missing = sorted(k for k in set(own) - set(state) if own[k].data_ptr() not in saved_ptrs)
    unexpected = sorted(set(state) - set(own))
    shapes = sorted(f"{k}: saved {tuple(state[k].shape)}, model {tuple(own[k].shape)}"
                    for k in set(own) & set(state) if state[k].shape != own[k].shape)
    # a float of another precision is cast (fp16 saved for fp32); another kind is not
    kinds = sorted(f"{k}: saved {state[k].dtype}, model {own[k].dtype}"
                   for k in set(own) & set(state)
                   if dtype_kind(state[k].dtype) != dtype_kind(own[k].dtype))
    if missing or unexpected or shapes or kinds:
        parts = [f"{name} {vals[:5]}{' ...' if len(vals) > 5 else ''}"
                 for name, vals in (("missing", missing), ("unexpected", unexpected),
                                    ("shape mismatch", shapes), ("dtype kind mismatch", kinds))
                 if vals]
        raise SwapRecordError(f"{where}: the saved weights do not match the rebuilt model: "
                              + "; ".join(parts))
    model.load_state_dict(state, strict=False)
