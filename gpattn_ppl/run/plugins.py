"""User code in every command: ``--import MODULE`` and the ``gpattn_ppl.plugins`` entry points.

A plugin module registers its datasets (:func:`gpattn_ppl.data.register_dataset`), attention
units (:func:`gpattn_ppl.attention.register_attention`) and OOD detectors
(:func:`gpattn_ppl.ood.register_ood_detector`) when imported. ``gpattn-ppl --import
mypkg.units train ...`` imports it before the command runs. A run records the modules it was
trained with in ``run.json``, but nothing named by a run folder is ever imported: ``evaluate``,
``predict`` and :func:`~gpattn_ppl.run.predictor.load_run` need the same ``--import`` (or, in
Python, the module imported first), and when it is missing their error names the flag to pass
(:func:`~gpattn_ppl.run.runfolder.open_run`). A folder someone shares cannot run code.
Installed packages can instead declare an entry point in the group ``gpattn_ppl.plugins``
(``[project.entry-points."gpattn_ppl.plugins"] name = "mypkg.units"``); those are imported by
every command.
"""

from __future__ import annotations

import importlib
import sys
from importlib.metadata import entry_points

__all__ = ["ENTRY_POINT_GROUP", "import_plugins", "load_entry_points", "imported_plugins"]

#: the entry-point group whose modules every command imports
ENTRY_POINT_GROUP = "gpattn_ppl.plugins"
_IMPORTED: list[str] = []


def import_plugins(modules: list[str]) -> list[str]:
    """Import each module (by dotted name, or a ``path/to/file.py``) once; remembers them for
    :func:`imported_plugins`.

    :raises ValueError: a module that cannot be imported (its name and the reason).
    """
    for name in modules:
        if name.endswith(".py"):  # recorded as an absolute path, so a later cwd does not matter
            from pathlib import Path

            name = str(Path(name).resolve())
        if name in _IMPORTED:
            continue
        try:
            if name.endswith(".py"):
                _import_file(name)
            else:
                importlib.import_module(name)
        except Exception as err:  # noqa: BLE001 - any failure of user code is reported by name
            raise ValueError(f"--import {name}: cannot import it ({type(err).__name__}: {err})"
                             ) from None
        _IMPORTED.append(name)
    return list(_IMPORTED)


def _import_file(path: str) -> None:
    from importlib.util import module_from_spec, spec_from_file_location
    from pathlib import Path

    file = Path(path).resolve()
    if not file.is_file():
        raise FileNotFoundError(f"no such file: {path}")
    name = f"gpattn_ppl_plugin_{file.stem}"
    spec = spec_from_file_location(name, file)
    module = module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)


def load_entry_points() -> list[str]:
    """Import every module declared in the ``gpattn_ppl.plugins`` entry-point group
    (:data:`~gpattn_ppl.run.plugins.ENTRY_POINT_GROUP`)."""
    names = [ep.value for ep in entry_points(group=ENTRY_POINT_GROUP)]
    return import_plugins(names) if names else []


def imported_plugins() -> list[str]:
    """The modules imported through :func:`import_plugins` in this process, in order."""
    return list(_IMPORTED)
