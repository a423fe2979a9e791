"""Run folders that never lie: what a run folder holds, when it may be written, who writes it.

A run folder is created by ``train`` (:class:`~gpattn_ppl.run.training.Trainer`) and read by
``evaluate``, ``predict``, ``plot`` and ``compare`` through one opener,
:func:`~gpattn_ppl.run.runfolder.open_run`:

=====================  =========================================================================
file                   content
=====================  =========================================================================
``run.json``           the manifest, written first: library version, sizes the data decided
                       (``num_classes``, ``classes``, ``input_kind``, ``vocab_size``,
                       ``feature_dim``), the data fingerprint, the modules imported with
                       ``--import`` (recorded, never imported from here), the warm start, and
                       ``files``: every file this run may write into the folder
``config.yaml``        the validated config the run was trained with (every default filled in)
``encoder.json``       how new inputs are encoded (vocabulary and ``max_len``, or MiniLM / image
                       settings): :func:`gpattn_ppl.data.encoder_from_state`
``last.pt``            the full training state, every epoch (atomic)
``best.pt``            the model with the best validation score, with the config it was trained
                       with (compared with ``config.yaml`` when opened)
``log.csv``            per-epoch history (also ``history.json``)
``results.json``       test and OOD metrics of ``best.pt`` (strict JSON); with temperature
                       scaling, the temperature that ``predict`` applies
``calibration.json``   a copy of that temperature, written after ``results.json`` (the two must
                       agree when opened)
``predictions.pt``     per-pass probabilities and logits of every evaluated split
``swap.json``          the swap report of a pretrained encoder
``plots/*.png``        evaluation figures (listed in ``files`` as they are written)
``tensorboard/``       TensorBoard event files (``train.tensorboard``; the folder is listed in
                       ``files`` before it is created, and ``--force`` removes the
                       ``events.out.tfevents.*`` files in it)
``.lock``              held by the process writing the folder (:func:`run_lock`)
=====================  =========================================================================

The rules:

* :func:`check_run_folder`: a folder that holds a run is never trained into silently. With the
  same config it is continued only when asked (``resume``); with a different config it is
  refused with the differing keys named, unless ``force`` starts it afresh. Nothing is written
  before the check but the folder's lock file.
* ``force`` removes only what the run's own manifest lists (:func:`clear_run_files`). A folder
  that holds run-like files (``config.yaml``, ``results.json``, ``plots/``...) but no manifest
  of this library is refused, ``force`` or not: nothing the library did not write is deleted.
* One writer at a time (:func:`run_lock`): a second process gets a one-line refusal; the lock of
  a killed process is released by the operating system, so it never goes stale.
"""

from __future__ import annotations

import json
import os
import re
import time
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from ..errors import GpattnError
from ..safe_files import open_lock_file, rewrite_lock_file

__all__ = ["IGNORED_KEYS", "RUN_FILES", "LOCK_FILE", "RunFolderError", "RunLock", "acquire_lock",
           "check_run_folder",
           "config_differences", "clear_run_files", "holds_run", "listed_files", "read_manifest",
           "record_files", "run_lock", "write_json_atomic"]

#: every file a run writes into its folder, besides its plots (``--force`` removes those the
#: manifest lists)
RUN_FILES = ("config.yaml", "run.json", "encoder.json", "last.pt", "best.pt", "log.csv",
             "history.json", "results.json", "calibration.json", "predictions.pt", "swap.json")

#: the lock file held while a process writes the folder
LOCK_FILE = ".lock"

#: the folder of TensorBoard event files (``train.tensorboard``), listed as ``tensorboard/``
TENSORBOARD_DIR = "tensorboard"

#: names a manifest may list: the run files, the lock, ``plots/<name>.png`` and ``tensorboard/``
_LISTABLE = re.compile(r"^(?:plots/[A-Za-z0-9_.\-]+\.png|\.lock|tensorboard/|"
                       + "|".join(re.escape(f) for f in RUN_FILES) + ")$")

#: config keys that do not change what a run computes; they may differ on resume
IGNORED_KEYS = ("train.progress", "train.device", "data.cache_dir", "train.tensorboard")


class RunFolderError(GpattnError, ValueError):
    """A run folder may not be used as asked (it holds another run or foreign files, another
    process writes it, or one of its files is missing or invalid)."""


def holds_run(run_dir: str | Path) -> bool:
    """Whether ``run_dir`` holds (part of) a run, or files that look like one: any of
    :data:`RUN_FILES` or a ``plots/`` folder."""
    run_dir = Path(run_dir)
    return run_dir.is_dir() and (any((run_dir / f).exists() for f in RUN_FILES)
                                 or (run_dir / "plots").exists()
                                 or (run_dir / TENSORBOARD_DIR).exists())


def _flatten(node: Any, prefix: str = "") -> dict[str, Any]:
    if isinstance(node, dict) and node:
        out: dict[str, Any] = {}
        for key, value in node.items():
            out.update(_flatten(value, f"{prefix}.{key}" if prefix else str(key)))
        return out
    return {prefix: node}


def config_differences(old: dict, new: dict, ignore: tuple[str, ...] = IGNORED_KEYS,
                       names: tuple[str, str] = ("run", "now")) -> list[str]:
    """The key paths whose values differ, as ``"train.lr: 0.0005 (run) != 0.1 (now)"``; a key in
    ``ignore`` or under a section named there (``"eval"``) is skipped."""
    a, b = _flatten(old), _flatten(new)
    out = []
    for key in sorted(set(a) | set(b)):
        if key in ignore or key.split(".")[0] in ignore:
            continue
        if a.get(key, "<absent>") == b.get(key, "<absent>"):
            continue
        out.append(f"{key}: {a.get(key, '<absent>')!r} ({names[0]}) != "
                   f"{b.get(key, '<absent>')!r} ({names[1]})")
    return out


def _saved_config(run_dir: Path) -> dict:
    from ..schema import ConfigError, read_yaml_mapping
    from .config import validate_config

    path = run_dir / "config.yaml"
    try:
        raw = read_yaml_mapping(path)
    except (OSError, ConfigError) as err:
        raise RunFolderError(f"{run_dir} holds a run whose config.yaml cannot be read "
                             f"({_first_line(err)})\nhint: use --force to start afresh, or "
                             "another --out folder") from None
    try:
        return dict(validate_config(raw, extras=False))
    except ConfigError as err:
        raise RunFolderError(f"{run_dir} holds a run whose config.yaml is not valid for this "
                             f"version ({_first_line(err)})\nhint: use --force to start afresh, "
                             "or another --out folder") from None


def _first_line(err: BaseException) -> str:
    return (str(err).strip().splitlines() or [type(err).__name__])[0]


def _foreign(run_dir: Path) -> list[str]:
    """The run-like entries of a folder without a manifest of this library."""
    names = [f for f in RUN_FILES if (run_dir / f).exists()]
    return names + [f"{d}/" for d in ("plots", TENSORBOARD_DIR) if (run_dir / d).exists()]


def check_run_folder(run_dir: str | Path, cfg: dict, *, resume: bool = False,
                     force: bool = False) -> str:
    """Decide what training into ``run_dir`` with config ``cfg`` does; writes nothing.

    :returns: ``"new"`` (no run there), ``"resume"`` (same config, ``resume=True``; also a run
        killed before it wrote its config) or ``"fresh"`` (``force=True``: the caller removes
        the old run's listed files, see :func:`clear_run_files`).
    :raises RunFolderError: the folder holds a run and neither flag allows using it (the
        message names every differing key and the flag that would proceed), or it holds
        run-like files that no manifest of this library lists (refused even with ``force``).
    """
    run_dir = Path(run_dir)
    if resume and force:
        raise RunFolderError("--resume and --force exclude each other")
    if run_dir.exists() and not run_dir.is_dir():
        raise RunFolderError(f"{run_dir} exists and is not a folder")
    if not holds_run(run_dir):
        return "new"
    try:
        manifest = read_manifest(run_dir, require_config=False)
    except RunFolderError as err:
        found = ", ".join(_foreign(run_dir))
        raise RunFolderError(
            f"{run_dir} holds {found} but no valid gpattn_ppl manifest ({_first_line(err)}); "
            "nothing there is removed or overwritten, --force included\nhint: use another --out "
            "folder, or move those files away") from None
    if force:
        listed_files(run_dir, manifest)  # refuses a manifest listing files it never writes
        return "fresh"
    if not (run_dir / "config.yaml").is_file():
        if resume:  # killed after run.json, before config.yaml: it trained nothing
            return "resume"
        raise RunFolderError(f"{run_dir} holds an interrupted run that never started (no "
                             "config.yaml)\nhint: use --resume or --force to start it, or "
                             "another --out folder")
    diff = config_differences(_saved_config(run_dir), dict(cfg))
    if diff:
        raise RunFolderError(
            f"{run_dir} holds a run with a different config ({len(diff)} "
            f"{'keys differ' if len(diff) > 1 else 'key differs'}: " + "; ".join(diff) + ")"
            + "\nhint: use another --out folder, or --force to discard that run and start afresh")
    if not resume:
        raise RunFolderError(f"{run_dir} already holds a run with this config\nhint: use "
                             "--resume to continue it (a finished run is only re-evaluated), "
                             "--force to start afresh, or another --out folder")
    return "resume"


def listed_files(run_dir: str | Path, manifest: dict | None = None) -> list[str]:
    """The files the manifest of ``run_dir`` lists as the run's own (relative names).

    A manifest written before file lists existed (no ``files`` key) owns :data:`RUN_FILES`.

    :raises RunFolderError: a listed name that a run never writes (an absolute path, ``..``,
        another folder): such a manifest was not written by this library.
    """
    run_dir = Path(run_dir)
    manifest = read_manifest(run_dir, require_config=False) if manifest is None else manifest
    files = manifest.get("files", list(RUN_FILES))
    if not isinstance(files, list) or not all(isinstance(f, str) for f in files):
        raise RunFolderError(f"{run_dir / 'run.json'}: 'files' must be a list of file names")
    bad = [f for f in files if not _LISTABLE.match(f)]
    if bad:
        raise RunFolderError(f"{run_dir / 'run.json'} lists {bad[0]!r}, a file no run writes; "
                             "this manifest was not written by gpattn_ppl (nothing removed)")
    return files


def clear_run_files(run_dir: str | Path) -> None:
    """Remove the files the run's manifest lists (:func:`listed_files`) and orphaned
    temporaries of those files; ``plots/`` only if it is then empty; of a listed
    ``tensorboard/``, the ``events.out.tfevents.*`` files in it, and the folder if it is then
    empty; anything else in the folder is left alone. Symbolic links are removed as links (never
    followed), and nothing is removed inside a symlinked ``plots/`` or ``tensorboard/``; the
    manifest goes last, so an interrupted clear is cleared again by the next ``--force``."""
    run_dir = Path(run_dir)
    files = listed_files(run_dir)
    for name in sorted(files, key=lambda f: (f == "run.json", f == LOCK_FILE, f)):
        if name == LOCK_FILE:
            continue  # held by this process now
        path = run_dir / name
        if name.endswith("/"):  # tensorboard/: the writer's event files, then the folder
            if path.is_dir() and not path.is_symlink():
                for event in path.glob("events.out.tfevents.*"):
                    if event.is_symlink() or event.is_file():
                        event.unlink()
                if not any(path.iterdir()):
                    path.rmdir()
            continue
        if path.parent != run_dir and path.parent.is_symlink():
            continue  # plots/ is a link: nothing is removed through it, where it points
        if path.is_symlink() or path.is_file():
            path.unlink()
        for tmp in path.parent.glob(f".{path.name}.*.tmp"):
            tmp.unlink(missing_ok=True)
    plots = run_dir / "plots"
    if plots.is_dir() and not plots.is_symlink() and not any(plots.iterdir()):
        plots.rmdir()


def _check_manifest(manifest: Any, path: Path) -> dict:
    """``run.json``'s schema: raises :class:`RunFolderError` naming the first bad key."""
    def bad(key: str, want: str):
        return RunFolderError(f"{path}: {key} must be {want} (the file is corrupt or was edited)")

    if not isinstance(manifest, dict):
        raise bad("the top level", "a mapping")
    if not isinstance(manifest.get("format"), int) or manifest["format"] < 1:
        raise bad("format", "a positive integer")
    sizes = manifest.get("sizes")
    if not isinstance(sizes, dict):
        raise bad("sizes", "a mapping")
    k = sizes.get("num_classes")
    if not isinstance(k, int) or isinstance(k, bool) or k < 2:
        raise bad("sizes.num_classes", "an integer >= 2")
    if sizes.get("input_kind") not in ("tokens", "features", "image"):
        raise bad("sizes.input_kind", "tokens, features or image")
    for key in ("vocab_size", "feature_dim"):
        v = sizes.get(key)
        if v is not None and (not isinstance(v, int) or isinstance(v, bool) or v < 1):
            raise bad(f"sizes.{key}", "null or a positive integer")
    classes = manifest.get("classes")
    if (not isinstance(classes, list) or len(classes) != k
            or not all(isinstance(c, str) for c in classes)):
        raise bad("classes", f"a list of {k} class names")
    data = manifest.get("data")
    if not isinstance(data, dict) or not isinstance(data.get("fingerprint"), str):
        raise bad("data.fingerprint", "a string")
    split_sizes = data.get("split_sizes", {})
    if not isinstance(split_sizes, dict) or not all(
            isinstance(v, int) and not isinstance(v, bool) and v >= 0
            for v in split_sizes.values()):
        raise bad("data.split_sizes", "a mapping of split names to counts")
    plugins = manifest.get("plugins", [])
    if not isinstance(plugins, list) or not all(isinstance(p, str) for p in plugins):
        raise bad("plugins", "a list of module names")
    return manifest


def read_manifest(run_dir: str | Path, *, require_config: bool = True) -> dict:
    """``run.json`` of a run folder, its schema checked.

    :raises RunFolderError: not a run folder (no ``config.yaml`` with ``require_config``), a
        folder written before manifests existed, or a corrupt / edited ``run.json``.
    """
    run_dir = Path(run_dir)
    if require_config and not (run_dir / "config.yaml").is_file():
        raise RunFolderError(f"{run_dir} is not a run folder (no config.yaml)")
    path = run_dir / "run.json"
    if not path.is_file():
        raise RunFolderError(f"{run_dir} has no run.json (written by an older version, or not "
                             "a run folder)")
    try:
        manifest = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as err:
        raise RunFolderError(f"{path} is corrupt: {_first_line(err)}") from None
    return _check_manifest(manifest, path)


def record_files(run_dir: str | Path, names: list[str]) -> None:
    """Add ``names`` to the ``files`` list of ``run_dir``'s manifest (atomically; before the
    files themselves are written, so that ``--force`` can always remove them)."""
    run_dir = Path(run_dir)
    manifest = read_manifest(run_dir, require_config=False)
    files = listed_files(run_dir, manifest)
    new = [n for n in names if n not in files]
    if new:
        for n in new:
            if not _LISTABLE.match(n):
                raise ValueError(f"record_files: {n!r} is not a file a run writes")
        manifest["files"] = files + new
        write_json_atomic(manifest, run_dir / "run.json")


class RunLock:
    """A held run-folder lock (:func:`acquire_lock`)."""

    def __init__(self, fh, path: Path, created_dir: bool, created_file: bool) -> None:
        self.fh, self.path = fh, path
        self.created_dir, self.created_file = created_dir, created_file

    def release(self, *, remove: bool = False) -> None:
        """Release the lock; ``remove`` (nothing was written): also delete the lock file and the
        folder where this lock created them (the folder only if empty), so a refused run leaves
        a folder as it found it."""
        if self.fh is None:
            return
        if remove:
            if self.created_file:
                self.path.unlink(missing_ok=True)
            if self.created_dir:
                try:
                    self.path.parent.rmdir()
                except OSError:
                    pass
        self.fh.close()  # closing the descriptor releases the flock
        self.fh = None


def acquire_lock(run_dir: str | Path) -> RunLock:
    """Take ``run_dir``'s write lock (creating the folder); see :func:`run_lock`.

    :raises RunFolderError: another process holds it (one line naming its pid and start).
    :raises gpattn_ppl.safe_files.UnsafePathError: ``.lock`` is a link, a folder, a FIFO, a
        socket, a device or a second name of another file (nothing written to it).
    """
    run_dir = Path(run_dir)
    if run_dir.exists() and not run_dir.is_dir():
        raise RunFolderError(f"{run_dir} exists and is not a folder")
    created = not run_dir.exists()
    try:
        run_dir.mkdir(parents=True, exist_ok=True)
    except OSError as err:
        raise RunFolderError(f"cannot create the run folder {run_dir}: {err.strerror}") from None
    path = run_dir / LOCK_FILE
    try:
        import fcntl
    except ImportError:  # not POSIX: no advisory locks; one writer is then the user's duty
        fh, new_file = open_lock_file(path)
        return RunLock(fh, path, created, new_file)
    while True:
        # never through a link, onto a special file or a second name of another file
        fh, new_file = open_lock_file(path)
        try:
            fcntl.flock(fh.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            fh.seek(0)
            holder = fh.read().strip() or "another process"
            fh.close()
            raise RunFolderError(f"{run_dir} is being written by {holder}; wait for it to "
                                 "finish, or use another --out folder") from None
        # the file we locked must still be the one at the path (a refused first run removes it)
        try:
            same = os.lstat(path).st_ino == os.fstat(fh.fileno()).st_ino
        except FileNotFoundError:
            same = False
        if same:
            break
        fh.close()
    try:
        rewrite_lock_file(fh, f"process {os.getpid()} (since "
                          f"{time.strftime('%Y-%m-%d %H:%M:%S')})", path)
    except BaseException:
        fh.close()
        raise
    return RunLock(fh, path, created, new_file)


@contextmanager
def run_lock(run_dir: str | Path):
    """Hold ``run_dir``'s write lock for the block: an advisory ``flock`` on ``run_dir/.lock``
    (the folder is created). A second writer gets a :class:`RunFolderError` at once; the lock
    of a process that died (even by ``kill -9``) is released by the operating system."""
    lock = acquire_lock(run_dir)
    try:
        yield lock
    finally:
        lock.release()


def write_json_atomic(obj: Any, path: str | Path) -> Path:
    """Write strict JSON (``NaN`` / infinities become ``null``) atomically
    (:func:`~gpattn_ppl.infer.checkpoint.atomic_write`): a reader never sees a partial file."""
    from ..infer import atomic_write
    from .output import dumps

    text = dumps(obj) + "\n"
    return atomic_write(path, lambda fh: fh.write(text), binary=False)
