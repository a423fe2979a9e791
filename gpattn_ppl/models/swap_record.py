"""The swap record: what :func:`~gpattn_ppl.models.swap_attention` did to a ``transformers``
model, kept in its config so that ``save_pretrained`` saves it with the weights.

One entry per swap call, in call order, under :data:`SWAP_KEY`::

    "gpattn_swap": [{"kind": "kep_svgp", "layers": [5],
                     "paths": ["bert.encoder.layer.5.attention.unit"],
                     "options": {"rank": 5, "proj_dropout": 0.1}}]

``layers`` are indices into the model's attention layers (as
:func:`~gpattn_ppl.models.find_attention_layers` counts them, made non-negative), ``paths`` the
units' module paths, ``options`` the unit's keyword options as built (the dropouts taken from
the host included), so that a reload does not depend on defaults. Next to it,
:data:`PREDICTIVE_KEY` holds the predictive the swap recommends (``"mean"``: one pass at the
units' posterior means; ``"mc"``: Monte-Carlo passes), which the pipeline and the trainer of
:mod:`gpattn_ppl.hf` read.

A folder exported from an ``arch: hf`` run (``gpattn-ppl export``,
:mod:`~gpattn_ppl.run.export`) also holds :data:`HEAD_KEY`, the run's head
(``{"pooling": "mean" | "cls", "dropout": p}``: the generated ``...ForSequenceClassification``
pools the encoder's last hidden state that way and applies ``dropout`` and a ``classifier``
``nn.Linear`` instead of the host's head; :mod:`~gpattn_ppl.models.swapped_types`), and
:data:`TEMPERATURE_KEY`, the temperature the run's evaluation fitted (1.0 without one), which
the pipeline of :mod:`gpattn_ppl.hf` and ``gpattn-ppl predict`` divide the logits by.

A config saved from ``config.json`` may hold anything: :func:`read_record` checks the shape of
every entry before any of it is used.
"""

from __future__ import annotations

import json
from collections.abc import Sequence

from torch import nn

from ..attention import attention_options
from ..errors import GpattnError

__all__ = ["HEAD_KEY", "PREDICTIVES", "PREDICTIVE_KEY", "SWAP_KEY", "SwapRecordError",
           "TEMPERATURE_KEY", "check_swap_record", "read_head", "read_record",
           "read_temperature"]

#: the config attribute (and ``config.json`` key) holding the swap record
SWAP_KEY = "gpattn_swap"
#: the config attribute (and ``config.json`` key) naming the recommended predictive
PREDICTIVE_KEY = "gpattn_predictive"
#: the predictives: Monte-Carlo passes, or one pass at the units' posterior means
PREDICTIVES = ("mc", "mean")
#: the config attribute (and ``config.json`` key) of an exported run's head
HEAD_KEY = "gpattn_head"
#: the config attribute (and ``config.json`` key) of an exported run's fitted temperature
TEMPERATURE_KEY = "gpattn_temperature"
#: the poolings of :data:`HEAD_KEY` (those of :class:`~gpattn_ppl.models.HFClassifier`)
_POOLINGS = ("cls", "mean")


class SwapRecordError(GpattnError, ValueError):
    """A model's or a folder's swap record is missing, malformed or does not match the model."""


def _entry_ok(e) -> bool:
    """One record entry of the right shape (a hostile ``config.json`` may hold anything)."""
    return (isinstance(e, dict) and {"kind", "layers", "paths", "options"} <= set(e)
            and isinstance(e["kind"], str)
            and isinstance(e["layers"], list) and all(
                isinstance(i, int) and not isinstance(i, bool) for i in e["layers"])
            and isinstance(e["paths"], list) and all(isinstance(p, str) for p in e["paths"])
            and isinstance(e["options"], dict) and all(
                isinstance(k, str) and k.isidentifier() for k in e["options"]))


def read_record(config, where: str) -> list[dict]:
    """The swap record of ``config``, every entry checked for its shape.

    :raises SwapRecordError: no record, or a malformed one.
    """
    rec = getattr(config, SWAP_KEY, None)
    if rec is None:
        raise SwapRecordError(f"{where}: the config has no {SWAP_KEY!r} record (not saved from a "
                              "model swapped with gpattn_ppl.hf.swap)")
    if not isinstance(rec, list) or not all(_entry_ok(e) for e in rec):
        raise SwapRecordError(f"{where}: malformed {SWAP_KEY!r} record (expected a list of "
                              "{kind: str, layers: [int], paths: [str], options: {str: value}} "
                              f"entries), got {str(rec)[:200]}")
    return rec


def read_head(config, where: str) -> dict | None:
    """The :data:`HEAD_KEY` head of ``config`` (``None`` when it has none), checked: a mapping
    with ``pooling`` (``"mean"`` or ``"cls"``) and optionally ``dropout`` (a rate in
    ``[0, 1)``; default the config's ``hidden_dropout_prob``, else 0.1, as the run's).

    :raises SwapRecordError: any other value.
    """
    head = getattr(config, HEAD_KEY, None)
    if head is None:
        return None
    p = head.get("dropout", getattr(config, "hidden_dropout_prob", 0.1)) \
        if isinstance(head, dict) else None
    if (not isinstance(head, dict) or set(head) - {"pooling", "dropout"}
            or head.get("pooling") not in _POOLINGS
            or isinstance(p, bool) or not isinstance(p, (int, float)) or not 0 <= p < 1):
        raise SwapRecordError(f"{where}: malformed {HEAD_KEY!r} (expected {{pooling: "
                              f"{' | '.join(_POOLINGS)}, dropout: a rate in [0, 1)}}), got "
                              f"{str(head)[:200]}")
    return {"pooling": head["pooling"], "dropout": float(p)}


def read_temperature(config, where: str) -> float:
    """The :data:`TEMPERATURE_KEY` temperature of ``config`` (1.0 when it has none), in
    :data:`~gpattn_ppl.metrics.temperature.TEMPERATURE_RANGE`.

    :raises SwapRecordError: not a number, or outside the range.
    """
    from ..metrics.temperature import check_temperature

    tau = getattr(config, TEMPERATURE_KEY, None)
    if tau is None:
        return 1.0
    try:
        return check_temperature(tau, f"{where}: {TEMPERATURE_KEY}")
    except ValueError as err:
        raise SwapRecordError(str(err)) from None


def _base_relative(model: nn.Module, path: str) -> str:
    """``path`` without the model's base-model prefix (``bert.``): a unit path recorded by a
    swap of the base model (``model.bert``) and one recorded by a swap of the whole model name
    the same unit."""
    prefix = getattr(model, "base_model_prefix", "") or ""
    return path[len(prefix) + 1:] if prefix and path.startswith(prefix + ".") else path


def _same_paths(model: nn.Module, a: Sequence[str], b: Sequence[str]) -> bool:
    """Whether two lists of unit paths name the same units of ``model`` (up to its base-model
    prefix, see :func:`check_swap_record`)."""
    return [_base_relative(model, p) for p in a] == [_base_relative(model, p) for p in b]


def check_swap_record(model: nn.Module, where: str = "check_swap_record") -> list[dict]:
    """The swap record of ``model`` (``[]`` when it has none); raises :class:`SwapRecordError`
    unless the units in the model are exactly the ones it records (by module path and kind).

    Paths compare without the base-model prefix: the config of a ``...ForSequenceClassification``
    is its base model's, so a swap of ``model.bert`` records ``encoder.layer.5...`` for the unit
    that ``model`` holds at ``bert.encoder.layer.5...``.
    """
    from .swap import attention_units

    rec = getattr(model.config, SWAP_KEY, None)
    rec = [] if rec is None else read_record(model.config, where)
    recorded = {}
    for entry in rec:
        for path in entry["paths"]:
            recorded[_base_relative(model, path)] = entry["kind"]  # a later swap replaces it
    actual = {_base_relative(model, path): type(u).kind
              for path, u in attention_units(model).items()}
    if recorded != actual:
        unrecorded = sorted(set(actual) - set(recorded))
        hint = (" (swapped into a part of the model that is not a transformers "
                "PreTrainedModel: swap the PreTrainedModel itself with gpattn_ppl.hf.swap, "
                "which records the swap in its config)" if unrecorded else "")
        raise SwapRecordError(f"{where}: the model's units {actual} do not match its "
                              f"{SWAP_KEY!r} record {recorded}{hint}")
    return rec


def _check_options(options: dict, where: str) -> None:
    """Refuse unit options that ``config.json`` cannot hold."""
    try:
        json.dumps(options)
    except (TypeError, ValueError) as err:
        raise SwapRecordError(f"{where}: the unit options must be JSON values to be saved with "
                              f"the config ({err})") from None


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


def _append_entry(model: nn.Module, kind: str, layers: Sequence[int], n_layers: int,
                  records: list[dict], options: dict) -> dict:
    """Append the entry of one swap of ``model`` (its ``records``, as
    :func:`~gpattn_ppl.models.swap_attention` returns them) to ``model.config``'s record;
    returns the entry."""
    from .swap import attention_units

    units = attention_units(model)
    built = dict(options)
    for name, rate in _dropouts([units[r["path"]] for r in records], kind).items():
        built.setdefault(name, rate)
    # the indices were checked by the swap: non-negative, in the order it swapped them
    absolute = []
    for i in layers:
        if i % n_layers not in absolute:
            absolute.append(i % n_layers)
    entry = {"kind": kind, "layers": absolute, "paths": [r["path"] for r in records],
             "options": built}
    setattr(model.config, SWAP_KEY, [*(getattr(model.config, SWAP_KEY, None) or []), entry])
    return entry
