"""The attention registry: units interchangeable by a string key."""

from __future__ import annotations

import inspect
import typing
from typing import Any

__all__ = ["ATTENTION", "register_attention", "build_attention", "attention_options",
           "attention_option_types"]

#: kind -> unit class. Later units register themselves on import of :mod:`gpattn_ppl.attention`.
ATTENTION: dict[str, type] = {}


def register_attention(kind: str):
    """Class decorator registering an :class:`~gpattn_ppl.attention.base.AttentionUnit` as ``kind``."""

    def wrap(cls):
        if kind in ATTENTION and ATTENTION[kind] is not cls:
            raise ValueError(f"attention kind '{kind}' is already registered to {ATTENTION[kind]}")
        ATTENTION[kind] = cls
        cls.kind = kind
        return cls

    return wrap


def attention_options(kind: str) -> dict[str, object]:
    """The keyword options of unit ``kind`` with their defaults (``dim`` and ``heads`` excluded)."""
    if kind not in ATTENTION:
        raise KeyError(kind)
    sig = inspect.signature(ATTENTION[kind].__init__)
    return {n: p.default for n, p in sig.parameters.items()
            if n not in ("self", "dim", "heads") and p.kind == p.KEYWORD_ONLY}


def attention_option_types(kind: str) -> dict[str, Any]:
    """The keyword options of unit ``kind`` (as :func:`attention_options`) with their resolved
    type annotations, for validating config values
    (:func:`~gpattn_ppl.models.spec.check_value`).

    The annotations of ``__init__`` are evaluated in the unit's module (the modules use
    ``from __future__ import annotations``, so they are strings until then). An option without an
    annotation, or one whose annotation cannot be evaluated, maps to ``typing.Any``: every
    value passes the config check and the constructor remains the judge.
    """
    if kind not in ATTENTION:
        raise KeyError(kind)
    init = ATTENTION[kind].__init__
    try:
        hints = typing.get_type_hints(init)
    except Exception:  # noqa: BLE001 -- one unresolvable annotation: resolve the others one by one
        hints = {}
        namespace = getattr(init, "__globals__", {})
        for name, ann in getattr(init, "__annotations__", {}).items():
            try:
                hints[name] = eval(ann, namespace) if isinstance(ann, str) else ann  # noqa: S307
            except Exception:  # noqa: BLE001
                hints[name] = Any
    return {name: hints.get(name, Any) for name in attention_options(kind)}


def build_attention(kind: str, dim: int, heads: int, *, where: str = "attention", **options):
    """Instantiate unit ``kind``; unknown kinds or options raise ``ValueError`` naming the allowed ones.

    :param where: the config key path, for error messages (``"model.overrides[0].attention"``).
    """
    if kind not in ATTENTION:
        raise ValueError(f"{where}.kind: unknown attention kind '{kind}'; "
                         f"allowed: {', '.join(sorted(ATTENTION))}")
    allowed = attention_options(kind)
    unknown = sorted(set(options) - set(allowed))
    if unknown:
        raise ValueError(f"{where}: unknown option(s) {unknown} for attention kind '{kind}'; "
                         f"allowed: {', '.join(sorted(allowed))}")
    return ATTENTION[kind](dim, heads, **options)
