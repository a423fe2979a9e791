"""The model spec: its schema, the schema machinery, and validation against the attention registry.

A model spec is the ``model`` section of an experiment config. :func:`validate_model_spec`
fills in defaults and checks every key path, type and attention option (each option's value
against the type annotation of its unit's constructor, :func:`check_value`); errors are
:class:`ConfigError` naming the key path and the allowed values.

>>> validate_model_spec({"depth": 1})["attention"]
{'kind': 'softmax'}
"""

from __future__ import annotations

import copy
import math
import re
import types
import typing
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, Literal, Union

import yaml

from ..errors import GpattnError

__all__ = ["ConfigError", "ConfigLoader", "MAX_CONFIG_BYTES", "MAX_CONFIG_DEPTH",
           "MAX_VALUE_DEPTH", "MAX_VALUE_ITEMS", "MODEL_SCHEMA", "Option", "check_model",
           "check_plain", "check_section", "check_value", "load_yaml", "read_yaml_mapping",
           "validate_model_spec"]


class ConfigError(GpattnError, ValueError):
    """An invalid configuration; the message names the key path."""


#: largest config file :func:`read_yaml_mapping` reads (bytes)
MAX_CONFIG_BYTES = 1 << 20
#: deepest nesting of mappings / lists a config may have
MAX_CONFIG_DEPTH = 32

_YAML = "tag:yaml.org,2002:"
_INT_RE = re.compile(r"[-+]?[0-9]+|0o[0-7]+|0x[0-9a-fA-F]+")
_FLOAT_RE = re.compile(r"[-+]?(\.[0-9]+|[0-9]+(\.[0-9]*)?)([eE][-+]?[0-9]+)?")
_INF_NAN = {".inf": math.inf, "+.inf": math.inf, "-.inf": -math.inf, ".nan": math.nan}


class _Refused(yaml.MarkedYAMLError):
    """A YAML construct a config file may not use (message: ``line L, column C: <problem>``)."""

    def __init__(self, mark, problem: str) -> None:
        super().__init__(problem=problem, problem_mark=mark)


class ConfigLoader(yaml.SafeLoader):
    """The one YAML loader of config files and ``--set`` values: YAML 1.2 core schema, strict.

    - scalars: ``true``/``false`` (any case spelling of the core schema) are booleans,
      ``null``/``~``/empty is null, integers are decimal (``010`` is 10), ``0o10`` (8) or
      ``0x1f``; floats ``1e-3``, ``.5``, ``.inf``, ``.nan``. Everything else is a string:
      YAML 1.1's ``yes``/``no``/``on``/``off``, sexagesimal ``1:30``, ``1_000``, ``0b101``,
      dates and the merge key ``<<``;
    - a duplicate key in any mapping is refused (its line, column and name);
    - aliases (``*name``) are refused, so no "billion laughs" expansion; anchors alone are
      harmless; nesting deeper than :data:`MAX_CONFIG_DEPTH` is refused;
    - only the tags ``!!str !!int !!float !!bool !!null !!map !!seq`` are constructed (no
      ``!!python/...``, ``!!binary``, ``!!set``, ``!!timestamp``).

    Every refusal is a ``yaml.YAMLError`` with the position (:func:`read_yaml_mapping`
    turns it into a :class:`ConfigError` naming the file).
    """

    yaml_implicit_resolvers: dict = {}
    yaml_constructors: dict = {}
    _depth = 0

    def compose_node(self, parent, index):
        if self.check_event(yaml.AliasEvent):
            event = self.peek_event()
            raise _Refused(event.start_mark, f"alias *{event.anchor} is not allowed in a config "
                           "file (aliases can expand without bound); write the value out")
        self._depth += 1
        try:
            if self._depth > MAX_CONFIG_DEPTH:
                raise _Refused(self.peek_event().start_mark, "nested deeper than "
                               f"{MAX_CONFIG_DEPTH} levels")
            return super().compose_node(parent, index)
        finally:
            self._depth -= 1

    def construct_mapping(self, node, deep=False):
        if not isinstance(node, yaml.MappingNode):
            raise _Refused(node.start_mark, f"expected a mapping, found {node.id}")
        mapping: dict = {}
        first: dict = {}
        for key_node, value_node in node.value:
            key = self.construct_object(key_node, deep=deep)
            try:
                hash(key)
            except TypeError:
                raise _Refused(key_node.start_mark, "a mapping key must be a scalar") from None
            if key in mapping:
                raise _Refused(key_node.start_mark, f"duplicate key {key!r} (first at line "
                               f"{first[key].line + 1}); each key may appear once per mapping")
            first[key] = key_node.start_mark
            mapping[key] = self.construct_object(value_node, deep=deep)
        return mapping

    def construct_undefined(self, node):
        tag = node.tag.replace(_YAML, "!!", 1) if node.tag.startswith(_YAML) else node.tag
        raise _Refused(node.start_mark, f"the tag {tag} is not allowed in a config file "
                       "(allowed: !!str !!int !!float !!bool !!null !!map !!seq)")

    def _scalar(self, node, pattern, what: str) -> str:
        value = self.construct_scalar(node)
        if not pattern(value):
            raise _Refused(node.start_mark, f"{value!r} is not {what} (YAML 1.2)")
        return value

    def construct_yaml_int(self, node):
        value = self._scalar(node, _INT_RE.fullmatch, "an integer")
        if value[:2] in ("0o", "0x"):
            return int(value[2:], 8 if value[1] == "o" else 16)
        return int(value, 10)

    def construct_yaml_float(self, node):
        value = self._scalar(node, lambda v: v.lower() in _INF_NAN or _FLOAT_RE.fullmatch(v),
                             "a number")
        return _INF_NAN[value.lower()] if value.lower() in _INF_NAN else float(value)

    def construct_yaml_bool(self, node):
        return self._scalar(node, lambda v: v.lower() in ("true", "false"),
                            "true or false").lower() == "true"

    def construct_yaml_null(self, node):
        self._scalar(node, lambda v: v in ("", "~", "null", "Null", "NULL"), "null")


ConfigLoader.yaml_constructors = {
    f"{_YAML}null": ConfigLoader.construct_yaml_null,
    f"{_YAML}bool": ConfigLoader.construct_yaml_bool,
    f"{_YAML}int": ConfigLoader.construct_yaml_int,
    f"{_YAML}float": ConfigLoader.construct_yaml_float,
    f"{_YAML}str": yaml.SafeLoader.construct_yaml_str,
    f"{_YAML}seq": yaml.SafeLoader.construct_yaml_seq,
    f"{_YAML}map": yaml.SafeLoader.construct_yaml_map,
    None: ConfigLoader.construct_undefined,
}
for _tag, _regexp, _first in (
        ("bool", r"^(?:true|True|TRUE|false|False|FALSE)$", "tTfF"),
        ("int", r"^(?:[-+]?[0-9]+|0o[0-7]+|0x[0-9a-fA-F]+)$", "-+0123456789"),
        ("float", r"^(?:[-+]?(?:\.[0-9]+|[0-9]+(?:\.[0-9]*)?)(?:[eE][-+]?[0-9]+)?"
                  r"|[-+]?\.(?:inf|Inf|INF)|\.(?:nan|NaN|NAN))$", "-+.0123456789"),
        ("null", r"^(?:~|null|Null|NULL|)$", ["~", "n", "N", ""])):
    ConfigLoader.add_implicit_resolver(f"{_YAML}{_tag}", re.compile(_regexp), list(_first))


def load_yaml(text: str):
    """``text`` parsed by :class:`ConfigLoader` (YAML 1.2 core schema, strict).

    :raises ~yaml.YAMLError: invalid YAML, a duplicate key, an alias, a refused tag (with the
        position; :func:`read_yaml_mapping` names the file with it).

    >>> load_yaml("seed: 010\\nmode: 0o10\\nflag: yes\\nlr: 1e-3")
    {'seed': 10, 'mode': 8, 'flag': 'yes', 'lr': 0.001}
    """
    return yaml.load(text, Loader=ConfigLoader)  # a SafeLoader subclass: no python objects


def read_yaml_mapping(path: str | Path) -> dict:
    """The top-level mapping of a YAML config file, read by :class:`ConfigLoader`.

    :raises FileNotFoundError: no such file.
    :raises ConfigError: naming the file: larger than :data:`MAX_CONFIG_BYTES` (1 MiB), not
        UTF-8, invalid YAML, a duplicate key, an alias, a refused tag (with its line and column),
        empty, or a top level that is not a mapping.
    """
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"config file not found: {path}")
    with open(path, "rb") as f:
        data = f.read(MAX_CONFIG_BYTES + 1)
    if len(data) > MAX_CONFIG_BYTES:
        raise ConfigError(f"{path}: larger than {MAX_CONFIG_BYTES} bytes (1 MiB), the limit for "
                          "a config file")
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as err:
        line = data.count(b"\n", 0, err.start) + 1
        raise ConfigError(f"{path}, line {line}: not valid UTF-8 (byte "
                          f"0x{data[err.start]:02x}); save the file as UTF-8") from None
    try:
        raw = load_yaml(text)
    except yaml.YAMLError as err:
        raise ConfigError(f"{path}: {_yaml_problem(err)}") from None
    if raw is None:
        raise ConfigError(f"{path}: the file is empty (no settings); write '{{}}' for every "
                          "default")
    if not isinstance(raw, dict):
        raise ConfigError(f"{path}: the top level must be a mapping of the sections model, data, "
                          f"train, eval; got {type(raw).__name__}")
    return raw


def _yaml_problem(err: yaml.YAMLError) -> str:
    """``"line L, column C: invalid YAML (<problem>)"`` of a PyYAML error (1-based position);
    a construct :class:`ConfigLoader` refuses reads ``"line L, column C: <problem>"``."""
    mark = getattr(err, "problem_mark", None) or getattr(err, "context_mark", None)
    problem = getattr(err, "problem", None) or str(err).splitlines()[0]
    where = f"line {mark.line + 1}, column {mark.column + 1}: " if mark is not None else ""
    return f"{where}{problem}" if isinstance(err, _Refused) else f"{where}invalid YAML ({problem})"


class Option:
    """A leaf of a schema: accepted types, default, optional choices and range.

    :param free: the value is a mapping / list checked by its own rules (not key by key).
    :param low: smallest allowed number (``None``: unbounded); ``low_open``: excluded itself.
    :param high: largest allowed number (``None``: unbounded); ``high_open``: excluded itself.
    :param check: ``check(value, where)`` raising :class:`ConfigError` for a value of the right
        type that is still not allowed (called for every value but ``None``).

    A number must also be finite. :meth:`allowed` words the rule for messages.
    """

    def __init__(self, types, default, choices=None, free: bool = False, *, low=None,
                 high=None, low_open: bool = False, high_open: bool = False,
                 check=None) -> None:
        self.types = types if isinstance(types, tuple) else (types,)
        self.default, self.choices, self.free = default, choices, free
        self.low, self.high, self.low_open, self.high_open = low, high, low_open, high_open
        self.check = check

    @property
    def numeric(self) -> bool:
        """Whether the option takes a number."""
        return int in self.types or float in self.types

    def allowed(self) -> str:
        """The allowed range in words: ``">= 1"``, ``"> 0"``, ``"in [0, 1)"``, ``"None or > 0"``."""
        lo = None if self.low is None else (">" if self.low_open else ">=") + f" {self.low}"
        hi = None if self.high is None else ("<" if self.high_open else "<=") + f" {self.high}"
        if lo and hi:
            text = (f"in {'(' if self.low_open else '['}{self.low}, {self.high}"
                    f"{')' if self.high_open else ']'}")
        else:
            text = lo or hi or "a finite number"
        return f"None or {text}" if type(None) in self.types else text

    def check_range(self, value: Any, where: str) -> None:
        """Raise :class:`ConfigError` for a number (not ``None``) outside the range."""
        if value is None or isinstance(value, bool) or not isinstance(value, (int, float)):
            return
        if isinstance(value, float) and not math.isfinite(value):
            raise ConfigError(f"{where}: {value!r} is not a finite number; allowed: "
                              f"{self.allowed()}")
        bad = False
        if self.low is not None:
            bad = bad or (value <= self.low if self.low_open else value < self.low)
        if self.high is not None:
            bad = bad or (value >= self.high if self.high_open else value > self.high)
        if bad:
            raise ConfigError(f"{where}: {value!r} is out of range; allowed: {self.allowed()}")


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
    "image_size": _at_least(1, default=32, high=MAX_IMAGE),
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
    "swap": Option(list, [], free=True),
}


def _defaults(schema: dict) -> dict:
    return {k: (_defaults(v) if isinstance(v, dict) else copy.deepcopy(v.default))
            for k, v in schema.items()}


#: the most values (mapping entries and list items, nested ones included) and the deepest
#: nesting one config value may hold: a config value is a short mapping or list, and a YAML
#: "billion laughs" (aliases of aliases) must not reach a deep copy or ``json.dumps``
MAX_VALUE_ITEMS = 10_000
#: see :data:`MAX_VALUE_ITEMS`
MAX_VALUE_DEPTH = 16
_SCALARS = (str, int, float, bool, type(None))


def check_plain(value: Any, where: str) -> None:
    """Raise :class:`ConfigError` unless ``value`` is plain data: mappings with string keys,
    lists, and ``str`` / ``int`` / ``float`` / ``bool`` / ``None`` leaves (no dates, bytes or
    other YAML types), at most :data:`MAX_VALUE_ITEMS` entries in all and
    :data:`MAX_VALUE_DEPTH` levels deep. The walk stops at the limit, so a YAML bomb costs
    nothing."""
    count = 0
    stack = [(value, where, 0)]
    while stack:
        node, at, depth = stack.pop()
        if isinstance(node, _SCALARS):
            continue
        if depth >= MAX_VALUE_DEPTH:
            raise ConfigError(f"{where}: nested more than {MAX_VALUE_DEPTH} levels deep; a config "
                              "value is a short mapping or list")
        if isinstance(node, dict):
            items = []
            for k, v in node.items():
                if not isinstance(k, str):
                    raise ConfigError(f"{at}: key {_got(k)} is not a string; write names as "
                                      "strings")
                items.append((v, f"{at}.{k}"))
        elif isinstance(node, list):
            items = [(v, f"{at}[{i}]") for i, v in enumerate(node)]
        else:
            raise ConfigError(f"{at}: expected a str, number, bool, null, mapping or list, got "
                              f"{type(node).__name__} {node!r:.60}")
        count += len(items)
        if count > MAX_VALUE_ITEMS:
            raise ConfigError(f"{where}: more than {MAX_VALUE_ITEMS} values (a YAML alias bomb?); "
                              "a config value is a short mapping or list")
        stack.extend((v, a, depth + 1) for v, a in items)


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
                              f"got {_got(v)}")
        if isinstance(v, (dict, list)):
            check_plain(v, where)
        if spec.choices is not None and v not in spec.choices:
            raise ConfigError(f"{where}: {v!r} is not allowed; allowed: {', '.join(spec.choices)}")
        spec.check_range(v, where)
        if spec.check is not None and v is not None:
            spec.check(v, where)
        out[key] = v
    return out


# -- values against type annotations -------------------------------------------------------------

_SEQUENCES = (list, tuple, Sequence, typing.Sequence)  # typing.X are aliases: for get_origin
_MAPPINGS = (dict, Mapping, typing.Mapping)
_UNIONS = (Union, types.UnionType)


class _Mismatch(Exception):
    """``value`` does not match an annotation (internal; :func:`check_value` words the message)."""


def _got(value: Any) -> str:
    if value is None:
        return "None"
    text = repr(value)
    return f"{type(value).__name__} {text if len(text) <= 60 else text[:57] + '...'}"


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
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            return value  # YAML gives 1 for 1.0: the constructors take int where float is expected
        if coerce and isinstance(value, str):
            try:  # YAML 1.1 reads "1e-3" (no dot) as a string
                return float(value)
            except ValueError:
                pass
        raise _Mismatch
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
    for ``1.0``), ``bool``, ``str``, ``None``, ``Optional`` / ``X | None`` and other unions,
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
    gpattn_ppl.models.spec.ConfigError: model.attention.rank: expected int, got bool True
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
    raise ConfigError(f"{where}: expected {_describe(annotation)}, got {_got(value)}")


def _check_attention(spec: Any, where: str) -> dict:
    """The attention spec at ``where`` checked (kind, option names, option values against the
    unit's annotations); returns a copy with the values :func:`check_value` converted."""
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


_SWAP_KEYS = ("layers", "attention", "init")


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
                              "(and optionally init)")
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
        entry["attention"] = _check_attention(entry["attention"], f"{where}.attention")


def check_model(model: dict) -> None:
    """The rules across keys of a model section whose keys and types are already checked:
    attention kinds, options and option values (from the registry and the units' annotations),
    per-block overrides, ``dim % heads``.

    ``model["attention"]`` and ``model["overrides"]`` are replaced by checked copies (a numeric
    string given for a float option converted, see :func:`check_value`); the specs they were
    copied from are left as they were."""
    model["attention"] = _check_attention(model["attention"], "model.attention")
    if model["arch"] == "hf":
        _check_hf(model)
    elif model["swap"] or model["checkpoint"] is not None:
        raise ConfigError(f"model.{'swap' if model['swap'] else 'checkpoint'}: applies to "
                          f"arch 'hf' only (arch is {model['arch']!r})")
    if not isinstance(model["overrides"], list):
        raise ConfigError("model.overrides: expected a list")
    model["overrides"] = [dict(ov) if isinstance(ov, dict) else ov for ov in model["overrides"]]
    for i, ov in enumerate(model["overrides"]):
        where = f"model.overrides[{i}]"
        if not isinstance(ov, dict) or set(ov) != {"blocks", "attention"}:
            raise ConfigError(f"{where}: expected a mapping with exactly the keys blocks, attention")
        if not isinstance(ov["blocks"], list) or not all(
                isinstance(b, int) and not isinstance(b, bool) for b in ov["blocks"]):
            raise ConfigError(f"{where}.blocks: expected a list of block indices (ints)")
        for b in ov["blocks"]:
            if not -model["depth"] <= b < model["depth"]:
                raise ConfigError(f"{where}.blocks: index {b} out of range for depth "
                                  f"{model['depth']} (allowed {-model['depth']}..{model['depth'] - 1})")
        ov["attention"] = _check_attention(ov["attention"], f"{where}.attention")
    if model["arch"] == "vit" and model["image_size"] % model["patch_size"]:
        raise ConfigError(f"model.image_size ({model['image_size']}) must be a multiple of "
                          f"model.patch_size ({model['patch_size']})")
    if model["dim"] % model["heads"]:
        raise ConfigError(f"model.dim ({model['dim']}) must be a multiple of model.heads "
                          f"({model['heads']})")


def validate_model_spec(spec: dict | None) -> dict:
    """A complete model section (defaults filled in) from a partial one; raises
    :class:`ConfigError`."""
    out = check_section(spec if spec is not None else {}, MODEL_SCHEMA, "model")
    check_model(out)
    return out
