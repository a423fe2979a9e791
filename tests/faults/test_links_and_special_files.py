"""No write through a link, no write outside: links and special files where a command writes.

Every file a command writes goes through :mod:`gpattn_ppl.safe_files`. A symbolic link
(dangling or not), a folder, a FIFO, a socket or a device where a file goes, a symlinked
folder between the folder the user named and the file, and a lock file that is a link or a
second name of another file are refused with one ``error:`` line (exit 2), ``--force``
included. Each test snapshots an ``outside`` folder (every entry's bytes, size and mtime) before
the command and asserts it is byte-identical afterwards, with no new entry: no byte written
outside.
"""

from __future__ import annotations

import copy
import errno
import hashlib
import os
import shutil
import stat
from pathlib import Path

import pytest
import yaml

from gpattn_ppl import safe_files
from gpattn_ppl.run.cli import main

from ..run.conftest import TINY
from .conftest import cli_error, tried

TEXT = "The book was read by me."


@pytest.fixture
def run(trained, tmp_path):
    out = tmp_path / "run"
    shutil.copytree(trained, out, symlinks=True)
    return out


@pytest.fixture
def outside(tmp_path):
    """A folder outside the run with a file a link may point at (a stand-in for ~/.bashrc)."""
    folder = tmp_path / "outside"
    folder.mkdir()
    (folder / "bashrc").write_text("export PATH=$HOME/bin:$PATH\n")
    return folder


def _snapshot(folder: Path) -> dict:
    """Every entry under ``folder``: kind, size, mtime and (for a file) the SHA-256 of its bytes."""
    out = {}
    for path in sorted(folder.rglob("*")):
        st = path.lstat()
        digest = (hashlib.sha256(path.read_bytes()).hexdigest()
                  if stat.S_ISREG(st.st_mode) else None)
        out[path.relative_to(folder).as_posix()] = (stat.S_IFMT(st.st_mode), st.st_size,
                                                    st.st_mtime_ns, digest)
    return out


def _temps(folder: Path) -> list[str]:
    return [p.name for p in folder.rglob("*.tmp")]


def _same_config(run: Path, tmp_path: Path, **train) -> Path:
    """The run's own config as a config file (``train --resume`` accepts it)."""
    cfg = yaml.safe_load((run / "config.yaml").read_text())
    cfg["train"].update(train)
    path = tmp_path / "same.yaml"
    path.write_text(yaml.safe_dump(cfg))
    return path


# -- the lock ----------------------------------------------------------------------------------
def test_a_lock_symlink_to_an_outside_file_is_refused_by_evaluate(run, outside, capsys):
    """``ln -s ~/.bashrc RUN/.lock; gpattn-ppl evaluate RUN`` truncated ~/.bashrc."""
    (run / ".lock").unlink(missing_ok=True)
    (run / ".lock").symlink_to(outside / "bashrc")
    before, run_before = _snapshot(outside), _snapshot(run)
    line = cli_error(capsys, main(["evaluate", str(run), "--no-plots"]))
    assert f"{run / '.lock'}" in line and "symbolic link" in line, line
    assert _snapshot(outside) == before and _snapshot(run) == run_before
    tried("links and special files")


def test_a_lock_symlink_to_an_outside_file_is_refused_by_train_force(run, outside, tiny_yaml,
                                                                     capsys):
    (run / ".lock").unlink(missing_ok=True)
    (run / ".lock").symlink_to(outside / "bashrc")
    before, run_before = _snapshot(outside), _snapshot(run)
    line = cli_error(capsys, main(["train", str(tiny_yaml), "--out", str(run), "--force"]))
    assert f"{run / '.lock'}" in line and "symbolic link" in line, line
    assert _snapshot(outside) == before and _snapshot(run) == run_before
    tried("links and special files")


@pytest.mark.parametrize("kind", ["hard link", "FIFO", "folder", "dangling symlink"])
def test_a_lock_that_is_not_a_plain_file_of_its_own_is_refused(kind, run, outside, capsys):
    """A hard link to an outside file (truncating it would change that file), a FIFO (opening
    it must not block), a folder and a dangling link (it would create the file it names)."""
    lock = run / ".lock"
    lock.unlink(missing_ok=True)
    if kind == "hard link":
        os.link(outside / "bashrc", lock)
    elif kind == "FIFO":
        os.mkfifo(lock)
    elif kind == "folder":
        lock.mkdir()
    else:
        lock.symlink_to(outside / "created_by_the_lock")
    before = _snapshot(outside)
    line = cli_error(capsys, main(["evaluate", str(run), "--no-plots"]))
    assert f"{lock}" in line and "refused to write" in line, line
    assert {"hard link": "hard link", "FIFO": "FIFO", "folder": "a folder",
            "dangling symlink": "symbolic link"}[kind] in line, line
    assert _snapshot(outside) == before
    tried("links and special files")


# -- files and folders of the run --------------------------------------------------------------
def test_a_symlink_at_a_plot_is_refused_and_its_target_untouched(run, outside, capsys):
    """A symlink at ``RUN/plots/reliability.png`` was overwritten with a PNG."""
    (run / "plots").mkdir(exist_ok=True)
    (run / "plots" / "reliability.png").unlink(missing_ok=True)
    (run / "plots" / "reliability.png").symlink_to(outside / "bashrc")
    before = _snapshot(outside)
    line = cli_error(capsys, main(["evaluate", str(run)]))
    assert f"{run / 'plots' / 'reliability.png'}" in line and "symbolic link" in line, line
    assert _snapshot(outside) == before
    assert (run / "plots" / "reliability.png").is_symlink()
    assert not _temps(run)
    tried("links and special files")


def test_a_symlinked_plots_folder_is_refused(run, outside, capsys):
    """A symlinked ``RUN/plots/`` received the figures wherever it pointed."""
    if (run / "plots").exists():
        shutil.rmtree(run / "plots")
    (run / "plots").symlink_to(outside, target_is_directory=True)
    before = _snapshot(outside)
    line = cli_error(capsys, main(["evaluate", str(run)]))
    assert f"{run / 'plots'}" in line and "symbolic link" in line, line
    assert _snapshot(outside) == before
    tried("links and special files")


@pytest.mark.parametrize("kind", ["file", "FIFO"])
def test_a_plots_entry_that_is_not_a_folder_is_named(kind, run, capsys):
    if (run / "plots").exists():
        shutil.rmtree(run / "plots")
    if kind == "file":
        (run / "plots").write_text("not a folder")
    else:
        os.mkfifo(run / "plots")
    line = cli_error(capsys, main(["evaluate", str(run)]))
    assert f"{run / 'plots'}: it is {'a file' if kind == 'file' else 'a FIFO'}" in line, line
    tried("links and special files")


def test_force_removes_nothing_through_a_symlinked_plots_folder(run, outside):
    """``--force`` removes the listed ``plots/<name>.png``: through a symlinked ``plots/`` it
    deleted the file of that name (and its orphan-looking temporaries) where the link pointed."""
    from gpattn_ppl.run.rundir import clear_run_files, record_files

    record_files(run, ["plots/reliability.png"])
    if (run / "plots").exists():
        shutil.rmtree(run / "plots")
    (run / "plots").symlink_to(outside, target_is_directory=True)
    (outside / "reliability.png").write_bytes(b"mine")
    (outside / ".reliability.png.1234.tmp").write_bytes(b"mine too")
    before = _snapshot(outside)
    clear_run_files(run)
    assert _snapshot(outside) == before
    assert not (run / "results.json").exists()  # the run's own files are removed
    tried("links and special files")


def test_a_symlinked_tensorboard_folder_is_refused(run, outside, tmp_path, capsys):
    """A symlinked ``RUN/tensorboard/`` received the event files wherever it pointed."""
    pytest.importorskip("tensorboard")
    (run / "tensorboard").symlink_to(outside, target_is_directory=True)
    config = _same_config(run, tmp_path)
    before = _snapshot(outside)
    code = main(["train", str(config), "--out", str(run), "--resume", "--set",
                 "train.tensorboard=true"])
    line = cli_error(capsys, code)
    assert f"{run / 'tensorboard'}" in line and "symbolic link" in line, line
    assert _snapshot(outside) == before
    tried("links and special files")


@pytest.mark.parametrize("dangling", [False, True])
def test_a_symlinked_run_file_is_refused_and_its_target_untouched(dangling, run, outside,
                                                                   capsys):
    """A link at a manifest-listed file (``RUN/results.json``): to an outside file, or dangling
    (a plain ``open(path, "w")`` would create the file it names)."""
    (run / "results.json").unlink()
    target = outside / ("not_there.json" if dangling else "bashrc")
    (run / "results.json").symlink_to(target)
    before = _snapshot(outside)
    line = cli_error(capsys, main(["evaluate", str(run), "--no-plots"]))
    assert f"{run / 'results.json'}" in line and "symbolic link" in line, line
    assert _snapshot(outside) == before and target.exists() is not dangling
    assert not _temps(run)
    tried("links and special files")


def test_a_hard_linked_run_file_is_replaced_not_written_through(run, outside, capsys):
    """A hard link ``RUN/results.json`` = an outside file: the atomic replace gives the run a
    new file; the outside name keeps its bytes."""
    os.link(run / "results.json", outside / "results_copy.json")
    before = _snapshot(outside)
    assert main(["evaluate", str(run), "--no-plots"]) == 0
    capsys.readouterr()
    assert _snapshot(outside) == before
    assert not os.path.samefile(run / "results.json", outside / "results_copy.json")
    tried("links and special files")


def test_a_run_folder_reached_through_a_symlink_is_the_users_choice(run, tmp_path, capsys):
    """The folder the user names may itself be a link (the user chose it): it is written, and
    the links rule applies below it."""
    link = tmp_path / "link_to_run"
    link.symlink_to(run, target_is_directory=True)
    assert main(["evaluate", str(link), "--no-plots"]) == 0
    capsys.readouterr()
    assert (run / "results.json").is_file() and not (run / "results.json").is_symlink()


# -- predict --out, explain --out, plot --out, compare / demo / bench --out -------------------
def _predict(run, texts, out, *extra):
    return ["predict", str(run), "--input", str(texts), "--out", str(out), *extra]


def _special(kind: str, path: Path, outside: Path) -> None:
    if kind == "FIFO":
        os.mkfifo(path)
    elif kind == "character device":
        try:  # the same device as /dev/null, made here: /dev/null itself is never a target
            os.mknod(path, stat.S_IFCHR | 0o666, os.makedev(1, 3))
        except OSError as err:
            pytest.skip(f"cannot make a device node here ({err.strerror})")
    elif kind == "symlink to /dev/null":
        path.symlink_to("/dev/null")
    elif kind == "symlink":
        path.symlink_to(outside / "bashrc")
    elif kind == "dangling symlink":
        path.symlink_to(outside / "created.jsonl")
    elif kind == "folder":
        path.mkdir()


@pytest.mark.parametrize("force", [[], ["--force"]])
@pytest.mark.parametrize("kind", ["FIFO", "character device", "symlink to /dev/null", "symlink",
                                  "dangling symlink", "folder"])
def test_predict_out_onto_a_special_file_or_link_is_refused(kind, force, trained, texts,
                                                            outside, tmp_path, capsys):
    """``predict --out t/null --force`` replaced a character device, a FIFO or a symlink with a
    regular file."""
    out = tmp_path / "t" / "null"
    out.parent.mkdir()
    _special(kind, out, outside)
    mode, before = os.lstat(out).st_mode, _snapshot(outside)
    line = cli_error(capsys, main(_predict(trained, texts, out, *force)))
    assert f"--out {out}: " in line, line
    words = {"FIFO": "FIFO", "character device": "character device", "folder": "a folder",
             "symlink to /dev/null": "symbolic link", "symlink": "symbolic link",
             "dangling symlink": "symbolic link"}[kind]
    assert words in line, line
    assert os.lstat(out).st_mode == mode and _snapshot(outside) == before
    assert os.listdir(out.parent) == ["null"]
    tried("links and special files")


def test_explain_out_onto_an_existing_file_needs_force(trained, tmp_path, capsys):
    """``explain RUN "text" --out existing.txt`` overwrote any file with a PNG without
    ``--force``: the rule of ``predict --out`` now."""
    out = tmp_path / "existing.txt"
    out.write_text("my notes\n")
    line = cli_error(capsys, main(["explain", str(trained), TEXT, "--out", str(out)]))
    assert line.endswith(f"--out {out}: the file exists; pass --force to overwrite it"), line
    assert out.read_text() == "my notes\n"
    assert main(["explain", str(trained), TEXT, "--out", str(out), "--force",
                 "--samples", "2"]) == 0
    capsys.readouterr()
    assert out.read_bytes().startswith(b"\x89PNG\r\n\x1a\n")
    assert not _temps(tmp_path)
    tried("links and special files")


@pytest.mark.parametrize("kind", ["symlink", "FIFO"])
def test_explain_out_onto_a_link_or_fifo_is_refused_with_force(kind, trained, outside,
                                                                tmp_path, capsys):
    out = tmp_path / "why.png"
    _special(kind, out, outside)
    before = _snapshot(outside)
    line = cli_error(capsys, main(["explain", str(trained), TEXT, "--out", str(out),
                                   "--force"]))
    assert f"--out {out}: " in line and ("symbolic link" in line or "FIFO" in line), line
    assert _snapshot(outside) == before
    tried("links and special files")


def test_plot_out_with_a_symlinked_figure_is_refused(trained, outside, tmp_path, capsys):
    out = tmp_path / "figures"
    out.mkdir()
    (out / "reliability.png").symlink_to(outside / "bashrc")
    before = _snapshot(outside)
    line = cli_error(capsys, main(["plot", str(trained), "--out", str(out)]))
    assert f"{out / 'reliability.png'}" in line and "symbolic link" in line, line
    assert _snapshot(outside) == before and not _temps(out)
    tried("links and special files")


@pytest.mark.parametrize("where", ["results.md", "compare.json", "plots", "method folder",
                                   "seed folder"])
def test_compare_out_with_a_link_is_refused_before_training(where, tiny_yaml, outside,
                                                            tmp_path, capsys):
    """A symlinked table, manifest (dangling: it is written last, after every run trained),
    figures folder or run folder in ``compare --out``: refused before any run trains,
    ``--force`` included."""
    out = tmp_path / "cmp"
    out.mkdir()
    link = {"results.md": out / "results.md", "compare.json": out / "compare.json",
            "plots": out / "plots", "method folder": out / "tiny",
            "seed folder": out / "tiny" / "seed0"}[where]
    if where == "results.md":
        link.symlink_to(outside / "bashrc")
    elif where == "compare.json":
        link.symlink_to(outside / "compare.json")
    elif where == "seed folder":
        link.parent.mkdir()
        link.symlink_to(outside, target_is_directory=True)
    else:
        link.symlink_to(outside, target_is_directory=True)
    before = _snapshot(outside)
    line = cli_error(capsys, main(["compare", str(tiny_yaml), "--seeds", "0", "--out", str(out),
                                   "--force", "--no-progress"]))
    assert f"{link}" in line and "symbolic link" in line, line
    assert _snapshot(outside) == before
    assert sorted(p.name for p in out.iterdir()) == [link.relative_to(out).parts[0]]
    assert not list(outside.glob("seed*")) and not (outside / "compare.json").exists()
    tried("links and special files")


def test_demo_task_folder_through_a_link_is_refused(outside, tmp_path):
    from gpattn_ppl.run.sweep import run_sweep as run_demo

    out = tmp_path / "demo"
    out.mkdir()
    (out / "cola").symlink_to(outside, target_is_directory=True)
    before = _snapshot(outside)
    with pytest.raises(safe_files.UnsafePathError, match=r"cola: it is a symbolic link"):
        run_demo(out, smoke=True, methods=["softmax"], tasks=["cola"], progress=False,
                 force=True)
    assert _snapshot(outside) == before
    tried("links and special files")


def test_demo_feature_cache_through_a_link_is_refused(outside, tmp_path):
    from gpattn_ppl.run.sweep import run_sweep as run_demo

    out = tmp_path / "demo"
    out.mkdir()
    (out / "features").symlink_to(outside, target_is_directory=True)
    before = _snapshot(outside)
    with pytest.raises(safe_files.UnsafePathError, match=r"features: it is a symbolic link"):
        run_demo(out, smoke=True, methods=["softmax"], tasks=["cola"], encoder="minilm",
                 progress=False)
    assert _snapshot(outside) == before
    tried("links and special files")


def test_bench_out_onto_a_symlink_is_refused_before_timing(outside, tmp_path, capsys):
    out = tmp_path / "layers.json"
    out.symlink_to(outside / "bashrc")
    before = _snapshot(outside)
    line = cli_error(capsys, main(["bench", "--out", str(out), "--repeats", "1"]))
    assert f"--out {out}: " in line and "symbolic link" in line, line
    assert _snapshot(outside) == before
    tried("links and special files")


# -- the primitive itself ----------------------------------------------------------------------
@pytest.mark.parametrize("kind", ["symlink", "dangling symlink", "FIFO", "socket", "folder",
                                  "character device"])
def test_write_atomic_refuses_every_non_regular_target(kind, outside, tmp_path, monkeypatch):
    import socket

    target = tmp_path / "t"
    sock = socket.socket(socket.AF_UNIX)
    try:
        if kind == "socket":
            monkeypatch.chdir(tmp_path)  # a relative name: no limit on tmp_path's length
            sock.bind("t")
        else:
            _special(kind, target, outside)
        before, mode = _snapshot(outside), os.lstat(target).st_mode
        with pytest.raises(safe_files.UnsafePathError) as err:
            safe_files.write_atomic(target, b"x")
    finally:
        sock.close()
    assert str(err.value).startswith(f"refused to write {target}: it is ")
    assert os.lstat(target).st_mode == mode and _snapshot(outside) == before
    assert sorted(os.listdir(tmp_path)) == ["outside", "t"]  # no temporary file
    tried("links and special files")


def test_a_symlinked_folder_between_root_and_file_is_refused(outside, tmp_path):
    root = tmp_path / "root"
    (root / "a").mkdir(parents=True)
    (root / "a" / "b").symlink_to(outside, target_is_directory=True)
    before = _snapshot(outside)
    with pytest.raises(safe_files.UnsafePathError, match=r"b: it is a symbolic link, not a "
                       r"folder inside"):
        safe_files.write_atomic(root / "a" / "b" / "c" / "f.txt", "x", root=root)
    assert _snapshot(outside) == before
    tried("links and special files")


# -- the umask ---------------------------------------------------------------------------------
@pytest.mark.parametrize("mask", [0o022, 0o077, 0o002])
def test_files_are_created_with_the_users_umask(mask, trained, texts, tmp_path, capsys):
    """Run files were created 0600 whatever the umask (``mkstemp``'s mode)."""
    from gpattn_ppl.run.rundir import acquire_lock, write_json_atomic

    old = os.umask(mask)
    try:
        assert main(_predict(trained, texts, tmp_path / "p.jsonl")) == 0
        write_json_atomic({"a": 1}, tmp_path / "run" / "run.json")
        acquire_lock(tmp_path / "run").release()
        (tmp_path / "run" / "results.json").write_text("{}")
        write_json_atomic({"a": 2}, tmp_path / "run" / "results.json")  # a replaced file too
    finally:
        os.umask(old)
    capsys.readouterr()
    want = 0o666 & ~mask
    for path in (tmp_path / "p.jsonl", tmp_path / "run" / "run.json",
                 tmp_path / "run" / ".lock", tmp_path / "run" / "results.json"):
        assert oct(stat.S_IMODE(path.stat().st_mode)) == oct(want), path


# -- disk full ---------------------------------------------------------------------------------
def _full_after(monkeypatch, nbytes: int, code: int = errno.ENOSPC) -> None:
    """Every write fails with ``code`` once ``nbytes`` bytes of it are written."""
    def write(fd, view):
        if len(view) > nbytes:
            os.write(fd, view[:nbytes])
            raise OSError(code, os.strerror(code))
        return os.write(fd, view)

    monkeypatch.setattr(safe_files, "_write_chunk", write)


@pytest.mark.parametrize("code", [errno.ENOSPC, errno.EDQUOT])
def test_disk_full_during_predict_out_is_one_line_naming_the_path_and_bytes(
        code, trained, texts, tmp_path, monkeypatch, capsys):
    _full_after(monkeypatch, 10, code)
    out = tmp_path / "p.jsonl"
    line = cli_error(capsys, main(_predict(trained, texts, out)))
    assert f"cannot write {out}: " in line and " bytes wanted)" in line, line
    assert not out.exists() and not _temps(tmp_path)
    tried("disk full")


def test_disk_full_during_evaluate_leaves_the_run_as_it_was(run, monkeypatch, capsys):
    """A torch checkpoint (``predictions.pt``) hit the raw torch error, reported as a bug."""
    before = _snapshot(run)
    _full_after(monkeypatch, 100)
    line = cli_error(capsys, main(["evaluate", str(run), "--no-plots"]))
    assert "no space left on device (" in line and " bytes wanted)" in line, line
    assert f"cannot write {run}" in line, line
    wanted = int(line.split(" bytes wanted)")[0].rsplit("(", 1)[1])
    assert wanted > 100
    after = _snapshot(run)
    after.pop(".lock"), before.pop(".lock")  # the lock names the process that held it
    assert after == before and not _temps(run)
    tried("disk full")


def test_disk_full_while_writing_the_lock_names_the_lock_and_bytes(tmp_path):
    class Full:
        def seek(self, _):
            pass

        def truncate(self):
            pass

        def write(self, text):
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    with pytest.raises(safe_files.DiskFullError, match=r"^cannot write .*\.lock: no space left "
                       r"on device \(11 bytes wanted\)"):
        safe_files.rewrite_lock_file(Full(), "process 123", tmp_path / ".lock")
    tried("disk full")


# -- TensorBoard after a kill mid-epoch ----------------------------------------------------------
def test_resume_after_a_kill_mid_epoch_truncates_tensorboard_to_the_resumed_step(
        tmp_path, monkeypatch):
    """After SIGKILL mid-epoch and ``--resume``, TensorBoard kept the killed epoch's steps
    (each step twice in the curves). The kill is an exception two steps into epoch 2, after
    those steps reached the event file; the resume rewrites the event files without the steps
    after ``last.pt``, and its writer purges from the first of them."""
    pytest.importorskip("tensorboard")
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
    from torch.utils.tensorboard import SummaryWriter

    from gpattn_ppl.run.experiment import Trainer

    class Killed(BaseException):
        pass

    cfg = copy.deepcopy(TINY)
    cfg["train"].update(tensorboard=True, device="cpu")
    run = tmp_path / "run"
    first = Trainer(cfg, run)
    spe = first.steps_per_epoch
    add = SummaryWriter.add_scalar

    def dying(self, tag, value, step=None, *args, **kwargs):
        add(self, tag, value, step, *args, **kwargs)
        if tag == "train/step_loss" and step == spe + 2:
            self.flush()
            raise Killed

    monkeypatch.setattr(SummaryWriter, "add_scalar", dying)
    with pytest.raises(Killed):
        first.fit()
    monkeypatch.setattr(SummaryWriter, "add_scalar", add)
    resumed = Trainer(cfg, run, resume=True)
    resumed.fit()
    # as TensorBoard shows it, and as the files hold it (no purge by the reader): each step once
    for purge in (True, False):
        acc = EventAccumulator(str(run / "tensorboard"), purge_orphaned_data=purge)
        acc.Reload()
        steps = [e.step for e in acc.Scalars("train/step_loss")]
        assert steps == list(range(1, 2 * spe + 1)), (purge, steps)
        values = [e.value for e in acc.Scalars("train/step_loss")]
        assert values == pytest.approx(resumed.step_losses, rel=1e-6)
        assert [e.step for e in acc.Scalars("train/loss")] == [1, 2]
    assert not _temps(run)
    tried("kill -9 then resume")
