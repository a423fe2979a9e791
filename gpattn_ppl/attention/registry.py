"""The attention registry: units interchangeable by a string key."""

from __future__ import annotations

import inspect

__all__ = ["ATTENTION", "register_attention", "build_attention", "attention_options"]

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
