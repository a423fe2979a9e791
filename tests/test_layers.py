"""The layout is layered: every import runs from a package to one below it (docs/architecture.rst).

Read from the source of every module (imports inside functions included), so a lazy import
cannot hide a back-edge.
"""

import ast
from pathlib import Path

import gpattn_ppl

ROOT = Path(gpattn_ppl.__file__).parent

#: top of the house first; a package may import only packages of a strictly lower rank
RANK = {
    "run": 100, "models": 90, "infer": 85, "layers": 80, "testing": 75, "attention": 70,
    "variational": 60, "gp": 60, "features": 50, "kernels": 40, "distributions": 40,
    "ppl": 30, "ood": 27, "metrics": 25, "data": 20, "linalg": 10, "settings": 5, "errors": 2, "_version": 1,
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
