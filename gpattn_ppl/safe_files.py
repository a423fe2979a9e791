"""Writing files safely: every file the library writes goes through this module.

The rules (also in the architecture page, "Checkpoints and exact resume"):

* **No write through a link, no write outside.** A file is written to a temporary file in its
  own folder (created ``O_EXCL | O_NOFOLLOW``), synced, then renamed onto its name
  (:func:`write_atomic`): a process killed at any moment leaves the old file or the new one.
  The rename happens only onto a regular file or onto nothing; a target that is a symbolic link
  (dangling or not), a folder, a FIFO, a socket or a device is refused with one line naming the
  path and what it is, before anything is written -- ``--force`` included, which replaces
  regular files only. A hard link is replaced by a new file (the other name keeps its
  content), never written in place.
* **Folders are real folders inside the one the user named.** Every folder between ``root``
  (the folder the user named: a run folder, ``--out``, a cache folder; it may itself be a link,
  the user's own choice) and the file is created if missing and opened without following
  links (``O_DIRECTORY | O_NOFOLLOW``, relative to its parent's descriptor): a symlinked
  ``RUN/plots/`` or ``RUN/tensorboard/`` is refused, and nothing can swap a folder for a link
  between the check and the write.
* **The lock file** (:func:`open_lock_file`) is created ``O_EXCL`` or opened ``O_NOFOLLOW``, and
  refused unless it is a regular file with one name: it is the only file written in place.
* **The user's umask**: files get ``0o666 & ~umask`` (:func:`file_mode`), as a plain ``open``
  would give them (the temporary file is private while it is written).
* **Disk full**: ``ENOSPC`` / ``EDQUOT`` while writing becomes :class:`DiskFullError`, one line
  naming the path and the bytes wanted; the temporary file is removed.

>>> import os, tempfile
>>> folder = tempfile.mkdtemp()
>>> write_atomic(os.path.join(folder, "a.txt"), "hello\\n").read_text()
'hello\\n'
>>> os.symlink(os.path.join(folder, "a.txt"), os.path.join(folder, "link.txt"))
>>> write_atomic(os.path.join(folder, "link.txt"), "x")  # doctest: +ELLIPSIS
Traceback (most recent call last):
...
gpattn_ppl.safe_files.UnsafePathError: refused to write .../link.txt: it is a symbolic link...
"""

from __future__ import annotations

import errno
import os
import secrets
import stat
from pathlib import Path

from .errors import GpattnError

__all__ = ["DiskFullError", "UnsafePathError", "check_output_file", "ensure_dir", "file_mode",
           "open_lock_file", "path_kind", "rewrite_lock_file", "umask", "write_atomic"]

_NOFOLLOW = getattr(os, "O_NOFOLLOW", 0)
_DIRECTORY = getattr(os, "O_DIRECTORY", 0)
_CLOEXEC = getattr(os, "O_CLOEXEC", 0)
_NONBLOCK = getattr(os, "O_NONBLOCK", 0)
#: whether folders can be walked by descriptor (POSIX); elsewhere by path, checked with lstat
_BY_FD = (_NOFOLLOW != 0 and _DIRECTORY != 0
          and {os.open, os.mkdir, os.stat, os.unlink, os.rename} <= os.supports_dir_fd)
#   (os.replace takes src_dir_fd / dst_dir_fd where os.rename does; it is not listed)
_FULL = {errno.ENOSPC, getattr(errno, "EDQUOT", errno.ENOSPC)}


class UnsafePathError(GpattnError, ValueError):
    """A path the library will not write: a symbolic link, a folder, a FIFO, a socket or a
    device where a file goes (``--force`` included), a link or a non-folder among the folders
    between the named folder and the file, or an existing output file without ``--force``."""


class DiskFullError(GpattnError, OSError):
    """No space left (or the disk quota reached) while writing a file; the message names the
    path and the bytes wanted, and no temporary file is left."""

    def __init__(self, message: str, path: str | os.PathLike, code: int = errno.ENOSPC) -> None:
        super().__init__(message)
        self.errno, self.filename = code, str(path)

    def __str__(self) -> str:
        return str(self.args[0])


def _umask_now() -> int | None:
    """The process's umask from ``/proc/self/status`` (Linux >= 4.7), without changing it."""
    try:
        with open("/proc/self/status", "rb") as fh:
            for line in fh:
                if line.startswith(b"Umask:"):
                    return int(line.split()[1], 8)
    except (OSError, ValueError, IndexError):
        pass
    return None


def _umask_by_setting() -> int:
    mask = os.umask(0o022)  # racy with threads: read once, at import, where /proc is missing
    os.umask(mask)
    return mask


_IMPORT_UMASK = _umask_now()
if _IMPORT_UMASK is None:
    _IMPORT_UMASK = _umask_by_setting()


def umask() -> int:
    """The process's umask: read from ``/proc/self/status`` where it is there (never changed to
    read it), else the one the process had when this module was imported."""
    now = _umask_now()
    return _IMPORT_UMASK if now is None else now


def file_mode() -> int:
    """The permission bits a plain ``open(path, "w")`` would give a new file:
    ``0o666 & ~umask``."""
    return 0o666 & ~umask()


def path_kind(mode: int) -> str | None:
    """What a ``st_mode`` (of ``lstat``) is, in words; ``None`` for a regular file."""
    if stat.S_ISREG(mode):
        return None
    for test, words in ((stat.S_ISLNK, "a symbolic link"), (stat.S_ISDIR, "a folder"),
                        (stat.S_ISFIFO, "a FIFO (named pipe)"), (stat.S_ISSOCK, "a socket"),
                        (stat.S_ISCHR, "a character device"), (stat.S_ISBLK, "a block device")):
        if test(mode):
            return words
    return "not a regular file"


def _refuse(path, what: str, *, lock: bool = False) -> UnsafePathError:
    hint = (f"\nhint: gpattn-ppl never makes its lock a link; remove {path} (it is re-created "
            "as a plain file) and run again") if lock else ""
    return UnsafePathError(f"refused to write {path}: it is {what}, and gpattn-ppl writes only "
                           "regular files, never through a link (--force included); nothing "
                           "was written" + hint)


def check_output_file(path: str | os.PathLike, *, force: bool, option: str = "--out",
                      example: str = "out.txt") -> None:
    """The overwrite rule of a file the user names (``predict --out``, ``explain --out``):
    nothing there, or a regular file with ``force``; writes nothing.

    :raises UnsafePathError: a folder, a link, a FIFO, a socket or a device (``force``
        included), or an existing file without ``force`` (one line naming the option and path).
    """
    path = Path(path)
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        return
    except NotADirectoryError:
        raise UnsafePathError(f"{option} {path}: a part of that path is not a folder") from None
    kind = path_kind(st.st_mode)
    if kind == "a folder":
        raise UnsafePathError(f"{option} {path}: a folder; give a file name, e.g. "
                              f"{path}/{example}")
    if kind is not None:
        raise UnsafePathError(f"{option} {path}: it is {kind}; gpattn-ppl replaces regular "
                              "files only, never through a link (--force included)")
    if not force:
        raise UnsafePathError(f"{option} {path}: the file exists; pass --force to overwrite it")


# -- folders -----------------------------------------------------------------------------------
def _inside(folder: Path, root: Path) -> tuple[str, ...]:
    """The parts of ``folder`` below ``root`` (lexically; ``..`` refused)."""
    try:
        parts = folder.relative_to(root).parts
    except ValueError:
        raise ValueError(f"{folder} is not inside {root}") from None
    if ".." in parts:
        raise UnsafePathError(f"refused to write into {folder}: '..' leaves {root}")
    return parts


def _make_root(root: Path) -> None:
    """The folder the user named (it may be a link to a folder: the user's choice)."""
    try:
        root.mkdir(parents=True, exist_ok=True)
    except FileExistsError:
        raise UnsafePathError(f"refused to write into {root}: it exists and is not a folder"
                              ) from None


def _open_folder(folder: Path, root: Path) -> int:
    """A descriptor of ``folder`` (created), every part below ``root`` a real folder."""
    _make_root(root)
    fd = os.open(root, os.O_RDONLY | _DIRECTORY | _CLOEXEC)
    here = root
    try:
        for part in _inside(folder, root):
            here = here / part
            try:
                os.mkdir(part, 0o777, dir_fd=fd)
            except FileExistsError:
                pass
            try:
                sub = os.open(part, os.O_RDONLY | _DIRECTORY | _NOFOLLOW | _CLOEXEC, dir_fd=fd)
            except OSError as err:
                if err.errno not in (errno.ELOOP, errno.ENOTDIR, errno.EMLINK):
                    raise
                st = os.stat(part, dir_fd=fd, follow_symlinks=False)
                raise UnsafePathError(
                    f"refused to write into {here}: it is {path_kind(st.st_mode) or 'a file'}, "
                    "not a folder "
                    f"inside {root} (gpattn-ppl writes nothing through a link); nothing was "
                    "written") from None
            os.close(fd)
            fd = sub
    except BaseException:
        os.close(fd)
        raise
    return fd


def _check_folders(folder: Path, root: Path) -> None:
    """Without descriptor-relative calls: create and ``lstat`` each part below ``root``."""
    _make_root(root)
    here = root
    for part in _inside(folder, root):
        here = here / part
        try:
            here.mkdir()
        except FileExistsError:
            pass
        kind = path_kind(os.lstat(here).st_mode)
        if kind != "a folder":
            raise UnsafePathError(f"refused to write into {here}: it is {kind or 'a file'}, "
                                  f"not a folder inside {root}; nothing was written")


def ensure_dir(folder: str | os.PathLike, *, root: str | os.PathLike | None = None) -> Path:
    """Create ``folder`` (and the folders between ``root`` and it); each must be a real folder
    inside ``root`` (default: ``folder`` itself, which may be a link: the user named it).

    :raises UnsafePathError: a link, a file or a special file among them.
    """
    folder = Path(folder)
    root = folder if root is None else Path(root)
    if _BY_FD:
        os.close(_open_folder(folder, root))
    else:
        _check_folders(folder, root)
    return folder


# -- files -------------------------------------------------------------------------------------
def _check_entry(path: Path, st_of, *, overwrite: bool) -> None:
    try:
        st = st_of()
    except FileNotFoundError:
        return
    kind = path_kind(st.st_mode)
    if kind is not None:
        raise _refuse(path, kind)
    if not overwrite:
        raise UnsafePathError(f"refused to write {path}: the file exists (nothing was written)")


def _write_chunk(fd: int, view: memoryview) -> int:
    return os.write(fd, view)


def _disk_full(path: Path, size: int, err: OSError) -> DiskFullError:
    why = "the disk quota is exceeded" if err.errno != errno.ENOSPC else "no space left on device"
    return DiskFullError(f"cannot write {path}: {why} ({size} bytes wanted); free some space or "
                         "write elsewhere (nothing was written)", path, err.errno)


def _fill(fd: int, data: bytes, path: Path) -> None:
    """Write ``data`` to ``fd``, give it the umask's permissions and sync it."""
    view = memoryview(data)
    try:
        while view:
            view = view[_write_chunk(fd, view):]
        os.fchmod(fd, file_mode())
        os.fsync(fd)
    except OSError as err:
        if err.errno in _FULL:
            raise _disk_full(path, len(data), err) from None
        raise


def _temp_name(name: str) -> str:
    return f".{name}.{secrets.token_hex(4)}.tmp"  # the pattern --force clears (``.NAME.*.tmp``)


#: a new private temporary file: never an existing one, never through a link
_CREATE = (os.O_WRONLY | os.O_CREAT | os.O_EXCL | _NOFOLLOW | _CLOEXEC
           | getattr(os, "O_BINARY", 0))


def _create_temp(name: str, create) -> tuple[str, int]:
    """``(temporary name, descriptor)`` of a new temporary file for ``name``, made by
    ``create(temporary name)`` (``O_EXCL``: a name taken meanwhile is drawn again)."""
    while True:
        tmp = _temp_name(name)
        try:
            return tmp, create(tmp)
        except FileExistsError:
            continue


def _write_by_fd(path: Path, data: bytes, root: Path, overwrite: bool) -> None:
    dfd = _open_folder(path.parent, root)
    name = path.name
    try:
        def lstat():
            return os.stat(name, dir_fd=dfd, follow_symlinks=False)

        _check_entry(path, lstat, overwrite=overwrite)
        tmp, fd = _create_temp(name, lambda t: os.open(t, _CREATE, 0o600, dir_fd=dfd))
        try:
            try:
                _fill(fd, data, path)
            finally:
                os.close(fd)
            _check_entry(path, lstat, overwrite=overwrite)  # again, just before the rename
            os.replace(tmp, name, src_dir_fd=dfd, dst_dir_fd=dfd)
        except BaseException:
            try:
                os.unlink(tmp, dir_fd=dfd)
            except FileNotFoundError:
                pass
            raise
        try:
            os.fsync(dfd)  # the rename itself survives a power cut
        except OSError:
            pass
    finally:
        os.close(dfd)


def _write_by_path(path: Path, data: bytes, root: Path, overwrite: bool) -> None:
    _check_folders(path.parent, root)
    _check_entry(path, lambda: os.lstat(path), overwrite=overwrite)
    name, fd = _create_temp(path.name, lambda t: os.open(path.parent / t, _CREATE, 0o600))
    tmp = path.parent / name
    try:
        try:
            _fill(fd, data, path)
        finally:
            os.close(fd)
        _check_entry(path, lambda: os.lstat(path), overwrite=overwrite)
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


def write_atomic(path: str | os.PathLike, data: bytes | str, *,
                 root: str | os.PathLike | None = None, overwrite: bool = True) -> Path:
    """Write ``data`` (``str``: UTF-8) to ``path`` atomically: a temporary file in the same
    folder (``O_EXCL | O_NOFOLLOW``, private while written), synced, given the umask's
    permissions, then renamed onto ``path``. A reader sees the old file or the new one, a
    process killed at any moment leaves no partial file, and no temporary file is left on an
    error.

    :param root: the folder the user named (default ``path``'s folder): the folders between it
        and ``path`` are created, and each must be a real folder (no link).
    :param overwrite: replace an existing regular file (``False``: refuse it).
    :raises UnsafePathError: ``path`` is a link, a folder, a FIFO, a socket or a device, or a
        folder on the way is not a real folder (nothing written).
    :raises DiskFullError: no space left / quota exceeded (names the path and the bytes).
    """
    path = Path(path)
    if not path.name or path.name in (".", ".."):
        raise UnsafePathError(f"refused to write {path}: not a file name")
    root = path.parent if root is None else Path(root)
    if isinstance(data, str):
        data = data.encode("utf-8")
    (_write_by_fd if _BY_FD else _write_by_path)(path, bytes(data), root, overwrite)
    return path


def open_lock_file(path: str | os.PathLike):
    """Open (or create, ``O_EXCL``) a lock file for reading and writing, never following a link;
    returns ``(file object, created)``. The caller may truncate and write it: it is checked to be
    a regular file with one name (a hard link to another file is refused too).

    :raises UnsafePathError: a link, a folder, a FIFO, a socket, a device, or a hard link.
    """
    path = Path(path)
    flags = os.O_RDWR | _NOFOLLOW | _CLOEXEC | _NONBLOCK
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        st = None
    if st is not None and path_kind(st.st_mode) is not None:  # refused before it is opened
        raise _refuse(path, path_kind(st.st_mode), lock=True)
    try:
        fd, created = os.open(path, flags | os.O_CREAT | os.O_EXCL, 0o666), True
    except FileExistsError:
        try:
            fd, created = os.open(path, flags), False
        except OSError as err:
            if err.errno not in (errno.ELOOP, errno.EISDIR, errno.ENXIO, errno.EMLINK):
                raise
            raise _refuse(path, path_kind(os.lstat(path).st_mode) or "not a regular file",
                          lock=True) from None
    st = os.fstat(fd)
    kind = path_kind(st.st_mode)
    if kind is None and st.st_nlink > 1:
        kind = f"a hard link ({st.st_nlink} names: writing it would change another file)"
    if kind is not None:
        os.close(fd)
        raise _refuse(path, kind, lock=True)
    if _NONBLOCK:
        import fcntl

        fcntl.fcntl(fd, fcntl.F_SETFL, fcntl.fcntl(fd, fcntl.F_GETFL) & ~_NONBLOCK)
    return os.fdopen(fd, "r+"), created


def rewrite_lock_file(fh, text: str, path: str | os.PathLike) -> None:
    """Replace the content of a lock file opened by :func:`open_lock_file` (and locked) with
    ``text``, in place: the one file written in place.

    :raises DiskFullError: no space left / quota exceeded (names the path and the bytes).
    """
    try:
        fh.seek(0)
        fh.truncate()
        fh.write(text)
        fh.flush()
    except OSError as err:
        if err.errno in _FULL:
            raise _disk_full(Path(path), len(text.encode()), err) from None
        raise
