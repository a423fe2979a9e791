"""The config-schema engine: the strict YAML reader of config files and the checks of a section.

Generic: it knows nothing of models or runs. A schema is a mapping of key -> :class:`Option`
(nested mappings for nested sections); :func:`check_section` checks a mapping against it key by
key, fills in the defaults and raises :class:`ConfigError` naming the key path and what is
allowed; :func:`check_plain` bounds a free-form value (plain data, size, depth). Config files
and ``--set`` values are read by :class:`ConfigLoader` (YAML 1.2 core schema, strict:
:func:`load_yaml`, :func:`read_yaml_mapping`). The sections themselves live with their owners:
the model section in :mod:`gpattn_ppl.models.spec`, the others in :mod:`gpattn_ppl.run.config`.

>>> schema = {"depth": Option(int, 2, low=1), "dim": Option(int, 128)}
>>> check_section({"depth": 3}, schema, "model")
{'depth': 3, 'dim': 128}
>>> check_section({"depth": 0}, schema, "model")
Traceback (most recent call last):
...
gpattn_ppl.schema.ConfigError: model.depth: 0 is out of range; allowed: >= 1
"""

from __future__ import annotations

import copy
import math
import re
from pathlib import Path
from typing import Any

import yaml

from .errors import GpattnError

__all__ = ["ConfigError", "ConfigLoader", "MAX_CONFIG_BYTES", "MAX_CONFIG_DEPTH",
           "MAX_VALUE_DEPTH", "MAX_VALUE_ITEMS", "Option", "check_plain", "check_section",
           "DuplicateKeyError", "describe_value", "load_yaml", "read_yaml_mapping",
           "refuse_duplicate_keys", "yaml_problem"]

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


class DuplicateKeyError(ValueError):
    """A JSON object names a key twice (``json`` would silently keep the last); ``key`` is it."""

    def __init__(self, key: str) -> None:
        super().__init__(f"duplicate key {key!r}")
        self.key = key


def refuse_duplicate_keys(pairs: list[tuple[str, object]]) -> dict:
    """``object_pairs_hook`` of :func:`json.loads`: the object as a dict, refusing a repeated key
    (:class:`DuplicateKeyError`), as :class:`ConfigLoader` refuses one in YAML."""
    out: dict = {}
    for key, value in pairs:
        if key in out:
            raise DuplicateKeyError(key)
        out[key] = value
    return out


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
        raise ConfigError(f"{path}: {yaml_problem(err)}") from None
    if raw is None:
        raise ConfigError(f"{path}: the file is empty (no settings); write '{{}}' for every "
                          "default")
    if not isinstance(raw, dict):
        raise ConfigError(f"{path}: the top level must be a mapping of the sections model, data, "
                          f"train, eval; got {type(raw).__name__}")
    return raw


def yaml_problem(err: yaml.YAMLError) -> str:
    """``"line L, column C: invalid YAML (<problem>)"`` of a PyYAML error (1-based position);
    a construct :class:`ConfigLoader` refuses reads ``"line L, column C: <problem>"``. The
    messages of :func:`read_yaml_mapping` and of ``--set`` values name the place with it.

    >>> try:
    ...     load_yaml("a: 1\\na: 2")
    ... except yaml.YAMLError as err:
    ...     print(yaml_problem(err))
    line 2, column 1: duplicate key 'a' (first at line 1); each key may appear once per mapping
    """
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
                    raise ConfigError(f"{at}: key {describe_value(k)} is not a string; write "
                                      "names as strings")
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
                              f"got {describe_value(v)}")
        if isinstance(v, (dict, list)):
            check_plain(v, where)
        if spec.choices is not None and v not in spec.choices:
            raise ConfigError(f"{where}: {v!r} is not allowed; allowed: {', '.join(spec.choices)}")
        spec.check_range(v, where)
        if spec.check is not None and v is not None:
            spec.check(v, where)
        out[key] = v
    return out


def describe_value(value: Any) -> str:
    """How a message shows a value it refuses: ``"None"``, or its type name and its ``repr``
    cut to 60 characters (``"str 'abc'"``, ``"float 1.5"``).

    >>> describe_value("abc"), describe_value(None)
    ("str 'abc'", 'None')
    """
    if value is None:
        return "None"
    text = repr(value)
    return f"{type(value).__name__} {text if len(text) <= 60 else text[:57] + '...'}"
