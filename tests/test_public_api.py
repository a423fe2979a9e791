"""``__all__`` of every subpackage: complete, unique, resolvable (one check per subpackage)."""

import importlib
import pkgutil

import pytest

import gpattn_ppl

SUBPACKAGES = sorted(m.name for m in pkgutil.iter_modules(gpattn_ppl.__path__) if m.ispkg)
MODULES = ["gpattn_ppl.errors", "gpattn_ppl.linalg", "gpattn_ppl.safe_files", "gpattn_ppl.schema",
           "gpattn_ppl.settings"]


def test_the_layout_has_the_documented_subpackages():
    assert set(SUBPACKAGES) == {"attention", "data", "distributions", "features", "gp", "hf",
                                "infer",
                                "kernels", "layers", "metrics", "models", "ood", "ppl", "run",
                                "testing", "variational"}


@pytest.mark.parametrize("name", [f"gpattn_ppl.{p}" for p in SUBPACKAGES] + MODULES)
def test_all_is_complete_unique_and_resolvable(name):
    """Every name in ``__all__`` exists and is listed once, and every public name a submodule
    exports through its own ``__all__`` is re-exported by the subpackage."""
    pkg = importlib.import_module(name)
    exported = getattr(pkg, "__all__", None)
    assert exported is not None, f"{name} has no __all__"
    assert len(exported) == len(set(exported)), f"{name}.__all__ lists a name twice"
    missing = [n for n in exported if not hasattr(pkg, n)]
    assert not missing, f"{name}.__all__ names undefined objects {missing}"
    if not hasattr(pkg, "__path__"):
        return
    for mod in pkgutil.iter_modules(pkg.__path__):
        if mod.name.startswith("_") or mod.ispkg:
            continue
        sub = importlib.import_module(f"{name}.{mod.name}")
        for public in getattr(sub, "__all__", []):
            assert public in exported, f"{name}.{mod.name}.{public} is not in {name}.__all__"
