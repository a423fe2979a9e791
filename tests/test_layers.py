"""The layout is layered: every import runs from a package to one below it (docs/architecture.rst),
and no package imports another package's private (underscore) names or modules.

Read from the source of every module (imports inside functions included), so a lazy import
cannot hide a back-edge.
"""

import ast
from pathlib import Path

import gpattn_ppl

ROOT = Path(gpattn_ppl.__file__).parent

#: top of the house first; a package may import only packages of a strictly lower rank
RANK = {
    "run": 100, "hf": 95, "models": 90, "infer": 85, "layers": 80, "testing": 75, "attention": 70,
    "variational": 65, "gp": 60, "features": 50, "kernels": 40, "distributions": 40,
    "ppl": 30, "ood": 27, "metrics": 25, "data": 20, "linalg": 10, "schema": 7, "settings": 5,
    "safe_files": 3, "errors": 2, "_version": 1,
    "__init__": 0,
}


def _package(module: Path) -> str:
    rel = module.relative_to(ROOT)
    return rel.parts[0].removesuffix(".py") if len(rel.parts) == 1 else rel.parts[0]


def _imported_packages(module: Path) -> set[str]:
    tree = ast.parse(module.read_text())
    here = list(module.relative_to(ROOT).parent.parts)
    out = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom):
            if node.level:
                base = here[: len(here) - (node.level - 1)] if node.level > 1 else here
                parts = base + (node.module.split(".") if node.module else [])
                if not parts:          # "from . import x" at the package root
                    parts = [alias.name for alias in node.names]
            elif node.module and node.module.startswith("gpattn_ppl"):
                parts = node.module.split(".")[1:] or [alias.name for alias in node.names]
            else:
                continue
            for p in ([parts[0]] if parts else []):
                out.add(p)
            if not node.module and node.level == 1 and not here:
                out.update(alias.name for alias in node.names)
        elif isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name.startswith("gpattn_ppl."):
                    out.add(alias.name.split(".")[1])
    return out


def test_every_package_has_a_rank():
    found = {_package(p) for p in ROOT.rglob("*.py")}
    assert found <= set(RANK), found - set(RANK)


def test_no_import_runs_back_up_a_layer():
    bad = []
    for module in sorted(ROOT.rglob("*.py")):
        src = _package(module)
        if src == "__init__":
            continue
        for dst in _imported_packages(module):
            if dst != src and dst in RANK and RANK[dst] >= RANK[src]:
                bad.append(f"{module.relative_to(ROOT)} ({src}) imports {dst}")
    assert not bad, "\n".join(bad)


#: underscore modules that are meant to be imported across packages: ``_version`` holds the one
#: ``__version__`` (read by pyproject); importing it, not the root package, keeps ``run`` from
#: importing ``gpattn_ppl/__init__.py``, which imports ``run`` lazily (``load_run``)
SHARED_PRIVATE_MODULES = ("_version",)


def _is_private(name: str) -> bool:
    return name.startswith("_") and not (name.startswith("__") and name.endswith("__"))


def _private_imports(source: str, path: str) -> list[str]:
    """The imports in ``source``, the module at ``path`` inside gpattn_ppl (``"ood/scores.py"``),
    of an underscore name or module of another top-level package of gpattn_ppl, as
    ``"line N: gpattn_ppl.metrics._validation.as_probs"``. A top-level module (``linalg.py``) is
    a package of its own; the package root (``__init__.py``) holds them all."""
    parts = path.split("/")
    here = parts[:-1]                                     # what a relative import starts from
    own = None if parts == ["__init__.py"] else parts[0].removesuffix(".py")
    bad = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.ImportFrom):
            if node.level:
                if node.level - 1 > len(here):
                    continue                              # above gpattn_ppl: not ours
                target = here[: len(here) - (node.level - 1)] + (
                    node.module.split(".") if node.module else [])
            elif node.module and node.module.split(".")[0] == "gpattn_ppl":
                target = node.module.split(".")[1:]
            else:
                continue
            names = [target + ([a.name] if a.name != "*" else []) for a in node.names]
        elif isinstance(node, ast.Import):
            names = [a.name.split(".")[1:] for a in node.names
                     if a.name.split(".")[0] == "gpattn_ppl"]
        else:
            continue
        for name in names:
            if (own is not None and name and name[0] != own and any(map(_is_private, name))
                    and name[0] not in SHARED_PRIVATE_MODULES):
                bad.append(f"line {node.lineno}: gpattn_ppl.{'.'.join(name)}")
    return bad


def test_the_private_import_check_sees_every_form():
    check = _private_imports
    assert check("from ..metrics._validation import as_probs", "ood/scores.py")
    assert check("from ..metrics.calibration import _bin_index", "run/plotting.py")
    assert check("def f():\n    from ..models.spec import _yaml_problem", "run/config.py")
    assert check("import gpattn_ppl.metrics._validation", "ood/scores.py")
    assert check("from gpattn_ppl.metrics import _validation", "ood/__init__.py")
    assert not check("from .._version import __version__", "run/cli.py")  # the version file
    assert check("from .linalg import _private", "schema.py")
    assert not check("from ._validation import as_probs", "metrics/report.py")  # own package
    assert not check("from ..metrics.inputs import as_probs", "ood/scores.py")   # public
    assert not check("from .. import __version__", "run/cli.py")                  # a dunder
    assert not check("from ._version import __version__", "__init__.py")         # the root
    assert not check("from torch.utils._pytree import tree_map", "run/cli.py")    # not ours


def test_no_package_imports_another_packages_private_names():
    bad = []
    for module in sorted(ROOT.rglob("*.py")):
        path = module.relative_to(ROOT).as_posix()
        bad += [f"{path}, {hit}" for hit in _private_imports(module.read_text(), path)]
    assert not bad, "imports of another package's underscore names:\n" + "\n".join(bad)
