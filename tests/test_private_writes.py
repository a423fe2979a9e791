"""No module writes another module's private state (issue of encapsulation, checked from source).

An assignment to ``obj._name`` (or an in-place call ``obj._name.op_()``) on anything but
``self`` / ``cls`` / ``super()`` is allowed only where the module
owns ``_name``: it uses ``self._name`` itself (the same class's state, as in
``torch.distributions``' ``expand`` idiom), or no other module of the package mentions
``._name`` (a private attribute the module puts on objects it makes, such as a cache on a
tensor). Read from the source with :mod:`ast`, so a write hidden in a rarely run branch counts.
"""

import ast
import re
from pathlib import Path

import gpattn_ppl

ROOT = Path(gpattn_ppl.__file__).parent

#: names owned by a third-party base class whose documented idiom writes them on a new instance
EXTERNAL = {"_validate_args"}   # torch.distributions.Distribution.expand


def _sources() -> dict[Path, str]:
    return {p: p.read_text() for p in sorted(ROOT.rglob("*.py"))}


def _private_touches(tree: ast.AST):
    """``(line, name, what)`` of every private attribute written or mutated in place on an
    object other than ``self`` / ``cls`` / ``super()``."""
    def foreign(attr: ast.Attribute) -> bool:
        base = attr.value
        own = (isinstance(base, ast.Name) and base.id in ("self", "cls")) or (
            isinstance(base, ast.Call) and isinstance(base.func, ast.Name)
            and base.func.id == "super")
        return attr.attr.startswith("_") and not attr.attr.startswith("__") and not own

    for node in ast.walk(tree):
        targets = []
        if isinstance(node, ast.Assign):
            targets = node.targets
        elif isinstance(node, (ast.AugAssign, ast.AnnAssign)):
            targets = [node.target]
        for t in targets:
            for sub in ast.walk(t):
                if isinstance(sub, ast.Attribute) and foreign(sub):
                    yield node.lineno, sub.attr, "assigned"
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute):
            f = node.func
            if (isinstance(f.value, ast.Attribute) and foreign(f.value)
                    and f.attr.endswith("_") and not f.attr.startswith("_")):
                yield node.lineno, f.value.attr, f"mutated ({f.attr})"


def _violations(sources: dict[Path, str]) -> list[str]:
    bad = []
    for path, text in sources.items():
        for line, name, what in _private_touches(ast.parse(text)):
            if name in EXTERNAL or re.search(rf"\bself\.{name}\b", text):
                continue
            others = [p for p, t in sources.items() if p != path and f".{name}" in t]
            if others:
                bad.append(f"{path.relative_to(ROOT)}:{line}: {name} {what}, owned by "
                           f"{others[0].relative_to(ROOT)}")
    return bad


def test_no_module_writes_another_modules_private_state():
    assert _violations(_sources()) == []


def test_the_check_finds_a_cross_module_private_write():
    """The check is live: the write the pretrained rules made before they moved next to their
    units (``unit._inducing_ready = True`` in attention/pretrained.py) is found."""
    sources = _sources()
    path = ROOT / "attention" / "pretrained.py"
    sources[path] += "\n\ndef _bad(unit):\n    unit._inducing_ready = True\n"
    assert any("_inducing_ready assigned, owned by attention/scgpt.py" in v
               for v in _violations(sources))
    sources[path] += "\n\ndef _worse(unit):\n    unit._pending.fill_(True)\n"
    assert any("_pending mutated (fill_), owned by attention/h_gumbel.py" in v
               for v in _violations(sources))
