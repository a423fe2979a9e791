"""Run folders that never lie: what a run folder holds and when it may be written.

A run folder is created by ``train`` (:class:`~gpattn_ppl.run.experiment.Trainer`) and read by
``evaluate``, ``predict``, ``plot`` and ``compare``:

=====================  =========================================================================
file                   content
=====================  =========================================================================
``config.yaml``        the validated config the run was trained with (every default filled in)
``run.json``           the manifest: library version, sizes the data decided (``num_classes``,
                       ``classes``, ``input_kind``, ``vocab_size``, ``feature_dim``), the data
                       fingerprint, the modules imported with ``--import``
``encoder.json``       how new inputs are encoded (vocabulary and ``max_len``, or MiniLM / image
                       settings): :func:`gpattn_ppl.data.encoder_from_state`
``last.pt``            the full training state, every epoch (atomic)
``best.pt``            the model with the best validation score
``log.csv``            per-epoch history (also ``history.json``)
``results.json``       test and OOD metrics of ``best.pt`` (strict JSON)
``calibration.json``   the fitted temperature, when ``eval.temperature_scaling`` is on
``predictions.pt``     per-pass probabilities and logits of every evaluated split
=====================  =========================================================================

The rule (:func:`check_run_folder`): a folder that holds a run is never trained into silently.
With the same config it is continued only when asked (``resume``); with a different config it
is refused with the differing keys named, unless ``force`` starts it afresh (the run's files are
removed first). Nothing is written before the check.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import yaml

from ..errors import GpattnError

__all__ = ["RUN_FILES", "RunFolderError", "check_run_folder", "config_differences",
           "clear_run_files", "read_manifest", "write_json_atomic", "holds_run"]

#: every file a run writes into its folder (``--force`` removes exactly these, plus temporaries)
RUN_FILES = ("config.yaml", "run.json", "encoder.json", "last.pt", "best.pt", "log.csv",
             "history.json", "results.json", "calibration.json", "predictions.pt", "swap.json")

#: config keys that do not change what a run computes; they may differ on resume
IGNORED_KEYS = ("train.progress", "train.device", "data.cache_dir")


class RunFolderError(GpattnError, ValueError):
    """A run folder may not be used as asked (it holds another run, or lacks a file)."""


def holds_run(run_dir: str | Path) -> bool:
    """Whether ``run_dir`` holds (part of) a run: any of :data:`RUN_FILES`."""
    run_dir = Path(run_dir)
    return run_dir.is_dir() and any((run_dir / f).exists() for f in RUN_FILES)


def _flatten(node: Any, prefix: str = "") -> dict[str, Any]:
    if isinstance(node, dict) and node:
        out: dict[str, Any] = {}
        for key, value in node.items():
            out.update(_flatten(value, f"{prefix}.{key}" if prefix else str(key)))
        return out
    return {prefix: node}


def config_differences(old: dict, new: dict, ignore: tuple[str, ...] = IGNORED_KEYS
                       ) -> list[str]:
    """The key paths whose values differ, as ``"train.lr: 0.0005 (run) != 0.1 (now)"``."""
    a, b = _flatten(old), _flatten(new)
    out = []
    for key in sorted(set(a) | set(b)):
        if key in ignore or a.get(key, "<absent>") == b.get(key, "<absent>"):
            continue
        out.append(f"{key}: {a.get(key, '<absent>')!r} (run) != {b.get(key, '<absent>')!r} (now)")
    return out


def _saved_config(run_dir: Path) -> dict:
    from .config import ConfigError, validate_config

    path = run_dir / "config.yaml"
    try:
        raw = yaml.safe_load(path.read_text())
    except (OSError, yaml.YAMLError) as err:
        raise RunFolderError(f"{run_dir} holds a run whose config.yaml cannot be read ({err}); "
                             "use --force to start afresh or another --out folder") from None
    try:
        return dict(validate_config(raw if isinstance(raw, dict) else {}))
    except ConfigError as err:
        raise RunFolderError(f"{run_dir} holds a run whose config.yaml is not valid for this "
                             f"version ({err}); use --force to start afresh or another --out "
                             "folder") from None


def check_run_folder(run_dir: str | Path, cfg: dict, *, resume: bool = False,
                     force: bool = False) -> str:
    """Decide what training into ``run_dir`` with config ``cfg`` does; writes nothing.

    :returns: ``"new"`` (no run there), ``"resume"`` (same config, ``resume=True``) or
        ``"fresh"`` (``force=True``: the caller removes the old run's files, see
        :func:`clear_run_files`).
    :raises RunFolderError: the folder holds a run and neither flag allows using it; the message
        names every differing key and the flag that would proceed.
    """
    run_dir = Path(run_dir)
    if resume and force:
        raise RunFolderError("--resume and --force exclude each other")
    if run_dir.exists() and not run_dir.is_dir():
        raise RunFolderError(f"{run_dir} exists and is not a folder")
    if not holds_run(run_dir):
        return "new"
    if force:
        return "fresh"
    if not (run_dir / "config.yaml").is_file():
        raise RunFolderError(f"{run_dir} holds run files but no config.yaml (an incomplete or "
                             "foreign folder); use --force to start afresh or another --out "
                             "folder")
    diff = config_differences(_saved_config(run_dir), dict(cfg))
    if diff:
        raise RunFolderError(
            f"{run_dir} holds a run with a different config ({len(diff)} "
            f"{'keys differ' if len(diff) > 1 else 'key differs'}):\n  " + "\n  ".join(diff)
            + "\nuse another --out folder, or --force to discard that run and start afresh")
    if not resume:
        raise RunFolderError(f"{run_dir} already holds a run with this config; use --resume to "
                             "continue it (a finished run is only re-evaluated), --force to "
                             "start afresh, or another --out folder")
    return "resume"


def clear_run_files(run_dir: str | Path) -> None:
    """Remove the files a run wrote (:data:`RUN_FILES`, ``plots/`` and orphaned temporaries);
    anything else in the folder is left alone."""
    import shutil

    run_dir = Path(run_dir)
    for name in RUN_FILES:
        (run_dir / name).unlink(missing_ok=True)
    for tmp in run_dir.glob(".*.tmp"):
        tmp.unlink(missing_ok=True)
    shutil.rmtree(run_dir / "plots", ignore_errors=True)


def read_manifest(run_dir: str | Path) -> dict:
    """``run.json`` of a run folder.

    :raises RunFolderError: not a run folder, or a folder written before manifests existed.
    """
    run_dir = Path(run_dir)
    if not (run_dir / "config.yaml").is_file():
        raise RunFolderError(f"{run_dir} is not a run folder (no config.yaml)")
    path = run_dir / "run.json"
    if not path.is_file():
        raise RunFolderError(f"{run_dir} has no run.json (written by an older version, or the "
                             "run was interrupted before it started); train it again")
    try:
        return json.loads(path.read_text())
    except (OSError, json.JSONDecodeError) as err:
        raise RunFolderError(f"{path} is corrupt: {err}") from None


def write_json_atomic(obj: Any, path: str | Path) -> Path:
    """Write strict JSON (``NaN`` / infinities become ``null``) atomically
    (:func:`~gpattn_ppl.infer.checkpoint.atomic_write`): a reader never sees a partial file."""
    from ..infer import atomic_write
    from .output import dumps

    text = dumps(obj) + "\n"
    return atomic_write(path, lambda fh: fh.write(text), binary=False)
