"""``kill -9`` of a training process, then resume.

The kills land at seeded random moments, before and right after each file write of an epoch
boundary, of the run's start and of the final evaluation, and between epochs. After every kill
the folder holds no partial file: every checkpoint loads, every JSON and YAML file parses, and
the loss log in ``last.pt`` is a prefix of the uninterrupted run's. The resumed run ends with the
uninterrupted run's loss log, parameters, history and test metrics, bit for bit, and leaves no
temporary file.

The training processes are forked from a fork server that has imported torch and the library
once: a fresh interpreter spends about 5 s importing before it trains, a fork about 0.1 s, which
keeps this file within CI time. Each is still a separate process, killed with ``SIGKILL``
(:func:`os.kill` in the process itself at a chosen write, or :meth:`Process.kill` from the test
at a random moment). The kill cases passed are counted in the fault tally (category ``kill -9
then resume``).
"""

from __future__ import annotations

import copy
import csv
import json
import multiprocessing
import os
import random
import signal
import threading
import time
from pathlib import Path

import pyro
import pytest
import torch
import yaml
from tqdm import tqdm

from gpattn_ppl import settings
from gpattn_ppl.infer.checkpoint import load_checkpoint
from gpattn_ppl.metrics import HIGHER_IS_BETTER
from gpattn_ppl.run.experiment import Trainer

from ..run.conftest import TINY
from .conftest import tried

EPOCHS = 4
#: a stochastic unit in each case, so that restoring every RNG state matters
MODELS = {"mc_dropout": {"mc_dropout": True}, "kep_svgp": {"attention": {"kind": "kep_svgp"}}}
#: a hang guard: the most a training process may take before the test gives up on it
#: (seconds; far above a loaded machine's time, never a bound the test checks)
PROCESS_TIMEOUT = 1800


def _config(model: str) -> dict:
    cfg = copy.deepcopy(TINY)
    cfg["model"].update(copy.deepcopy(MODELS[model]))
    cfg["data"]["limit_train"] = 96
    cfg["train"].update(epochs=EPOCHS, device="cpu")
    return cfg


# -- the training process ----------------------------------------------------------------------
def _die() -> None:
    os.kill(os.getpid(), signal.SIGKILL)


def _arm(trainer: Trainer, where: str, epoch: int, phase: str) -> None:
    """Make this process kill itself at ``where``: the start of training epoch ``epoch + 1``
    (``where == "epoch start"``), or the write of the file named ``where`` once ``epoch`` epochs
    are done, ``phase`` ``"before"`` its ``os.replace`` (the temporary file written and synced,
    not renamed) or ``"after"`` it."""
    if where == "epoch start":
        train_epoch = trainer.train_epoch

        def dying_epoch(progress=None):
            if trainer.epoch == epoch:
                _die()
            return train_epoch(progress)

        trainer.train_epoch = dying_epoch
        return
    replace = os.replace  # atomic_write calls os.replace: patched in this process only

    def dying_replace(src, dst, *args, **kwargs):
        hit = Path(dst).name == where and trainer.epoch == epoch
        if hit and phase == "before":
            _die()
        replace(src, dst, *args, **kwargs)
        if hit:
            _die()

    os.replace = dying_replace


def _train(cfg: dict, run_dir: str, resume: bool, kill: tuple | None, marker: str, log: str,
           dtype: torch.dtype) -> None:
    """The body of a training process: train (or resume) ``cfg`` into ``run_dir``, touching
    ``marker`` once the trainer is built; output goes to ``log``."""
    fd = os.open(log, os.O_WRONLY | os.O_CREAT | os.O_APPEND)
    os.dup2(fd, 1)
    os.dup2(fd, 2)
    os.close(fd)
    # tqdm's default lock is a multiprocessing semaphore, which a killed process leaks
    tqdm.set_lock(threading.RLock())
    torch.set_default_dtype(dtype)  # as the test process (GPATTN_PPL_TEST_DTYPE)
    pyro.enable_validation(True)
    with settings.validate_args(True):
        trainer = Trainer(cfg, run_dir, resume=resume)
        if kill is not None:
            _arm(trainer, *kill)
        Path(marker).touch()
        trainer.fit()


_FORKSERVER: list = []


def _context():
    """The fork server context; the server imports this module (torch, the library) once."""
    if not _FORKSERVER:
        ctx = multiprocessing.get_context("forkserver")
        ctx.set_forkserver_preload([__name__, "torch._dynamo", "sklearn.metrics"])
        _FORKSERVER.append(ctx)
    return _FORKSERVER[0]


class Child:
    """One training process of a kill series in ``tmp``."""

    def __init__(self, tmp: Path, cfg: dict, run: Path, index: int | str, *, resume: bool,
                 kill: tuple | None = None) -> None:
        self.marker = tmp / f"started-{index}"
        self.log = tmp / f"process-{index}.log"
        self.proc = _context().Process(
            target=_train, args=(cfg, str(run), resume, kill, str(self.marker), str(self.log),
                                 torch.get_default_dtype()), daemon=True)
        self.proc.start()

    def wait_started(self) -> bool:
        """Wait until the trainer is built (``True``) or the process ended (``False``)."""
        deadline = time.monotonic() + PROCESS_TIMEOUT
        while not self.marker.exists():
            if not self.proc.is_alive() or time.monotonic() > deadline:
                return self.marker.exists()
            time.sleep(0.01)
        return True

    def join(self) -> int:
        self.proc.join(PROCESS_TIMEOUT)
        if self.proc.is_alive():
            self.proc.kill()
            self.proc.join()
            pytest.fail(f"a training process ran over {PROCESS_TIMEOUT} s:\n{self.output()}")
        code = self.proc.exitcode
        self.proc.close()
        return code

    def output(self) -> str:
        return self.log.read_text()[-4000:] if self.log.exists() else "(no output)"


# -- the reference and the checks --------------------------------------------------------------
#: the wall-clock fields of a history row (they differ between any two processes)
WALL_CLOCK = ("seconds", "val_seconds")


def _no_seconds(rows: list[dict]) -> list[dict]:
    return [{k: v for k, v in row.items() if k not in WALL_CLOCK} for row in rows]


def _results(run: Path) -> dict:
    """``results.json`` without ``cost`` (time and memory differ between processes)."""
    results = json.loads((run / "results.json").read_text())
    results.pop("cost")
    return results


@pytest.fixture(scope="module")
def reference(tmp_path_factory):
    """model name -> what an uninterrupted run (in this process) leaves in its folder."""
    refs = {}

    def get(model: str) -> dict:
        if model not in refs:
            tmp = tmp_path_factory.mktemp(f"reference-{model}")
            run = tmp / "run"
            with settings.validate_args(True):
                trainer = Trainer(_config(model), run)
                trainer.fit()
            last = load_checkpoint(run / "last.pt")
            history = json.loads((run / "history.json").read_text())
            ref = refs[model] = {
                "step_losses": last["step_losses"], "steps": trainer.steps_per_epoch,
                "model": last["model"], "best": load_checkpoint(run / "best.pt")["model"],
                "history": _no_seconds(history), "log": _no_seconds(_read_csv(run / "log.csv")),
                "results": _results(run), "improved": _improved(history, trainer.select_metric)}
            # the same run in a training process: how long its fit takes (the scale of the
            # random kills), and that a process on its own reproduces this one
            child = Child(tmp, _config(model), tmp / "uninterrupted", "uninterrupted",
                          resume=False)
            assert child.wait_started(), child.output()
            start = time.perf_counter()
            assert child.join() == 0, child.output()
            ref["seconds"] = time.perf_counter() - start
            ref["train_share"] = min(1.0, sum(
                row["seconds"] for row in json.loads(
                    (tmp / "uninterrupted" / "history.json").read_text())) / ref["seconds"])
            _check_finished(tmp / "uninterrupted", ref, f"{model}: an uninterrupted process")
        return refs[model]

    return get


def _improved(history: list[dict], metric: str) -> list[int]:
    """The epochs after which ``fit`` wrote ``best.pt`` (its rule, on the history)."""
    higher, best, out = HIGHER_IS_BETTER.get(metric, True), None, []
    for row in history:
        score = row[f"val/{metric}"]
        if best is None or (score > best if higher else score < best):
            best = score
            out.append(row["epoch"])
    return out


def _read_csv(path: Path) -> list[dict]:
    with path.open(newline="") as fh:
        return list(csv.DictReader(fh))


def _check_after_kill(run: Path, ref: dict, what: str) -> None:
    """No partial file in ``run``: every checkpoint loads, every JSON / YAML / CSV file parses,
    ``last.pt`` holds a prefix of the reference's loss log and history."""
    for path in run.glob("*.pt"):
        if path.name == "predictions.pt":  # per-pass predictions, not a checkpoint
            assert isinstance(torch.load(path, weights_only=False), dict), what
        else:
            load_checkpoint(path)
    for path in run.glob("*.json"):
        json.loads(path.read_text())
    if (run / "config.yaml").exists():
        assert isinstance(yaml.safe_load((run / "config.yaml").read_text()), dict), what
    if (run / "log.csv").exists():
        _read_csv(run / "log.csv")
    if (run / "last.pt").exists():
        last = load_checkpoint(run / "last.pt")
        done = last["epoch"]
        assert last["step_losses"] == ref["step_losses"][:done * ref["steps"]], what
        assert _no_seconds(last["history"]) == ref["history"][:done], what
    if (run / "history.json").exists():
        history = _no_seconds(json.loads((run / "history.json").read_text()))
        assert history == ref["history"][:len(history)], what


def _check_finished(run: Path, ref: dict, what: str) -> None:
    """The resumed run equals the uninterrupted one and left no temporary file."""
    last = load_checkpoint(run / "last.pt")
    assert last["step_losses"] == ref["step_losses"], what
    assert last["model"].keys() == ref["model"].keys(), what
    for name, tensor in last["model"].items():
        assert torch.equal(tensor, ref["model"][name]), f"{what}: parameter {name}"
    best = load_checkpoint(run / "best.pt")["model"]
    for name, tensor in best.items():
        assert torch.equal(tensor, ref["best"][name]), f"{what}: best.pt parameter {name}"
    assert _no_seconds(json.loads((run / "history.json").read_text())) == ref["history"], what
    assert _no_seconds(_read_csv(run / "log.csv")) == ref["log"], what
    assert _results(run) == ref["results"], what
    assert not [p.name for p in run.iterdir() if p.name.endswith(".tmp")], what


# -- the tests ---------------------------------------------------------------------------------
def _kill_series(model: str, improved: list[int]) -> list[list[tuple]]:
    """Series of kill points ``(where, epochs done, phase)``, each series in one folder.

    A process that resumes from ``last.pt`` of epoch ``e`` (``L`` below) rewrites the files of
    the run's start, trains epochs ``e + 1, ...`` and writes, after each, ``best.pt`` (when
    better), ``last.pt``, ``history.json``, ``log.csv``; at the end ``predictions.pt`` and
    ``results.json``. A kill at a write of epoch ``e`` therefore needs ``L < e``: the kills
    before ``last.pt``'s rename leave ``L`` as it was, the later ones advance it, so the writes
    after ``last.pt`` are spread over the epochs. Together the series kill before and after
    the rename of every file the run writes (``calibration.json`` is not written here), and
    between epochs; the kep_svgp series is a subset.
    """
    b = max(e for e in improved if e > 1) if len(improved) > 1 else None  # a later best.pt
    both = ("before", "after")
    # the run's start writes run.json (the manifest, listing every file) first
    first = [("run.json", 0, "before"), ("run.json", 0, "after"), ("config.yaml", 0, "after"),
             ("encoder.json", 0, "after"), ("best.pt", 1, "before"), ("best.pt", 1, "after"),
             ("last.pt", 1, "before"), ("history.json", 1, "before"), ("log.csv", 2, "before"),
             ("epoch start", 2, ""), ("history.json", 3, "after"), ("last.pt", EPOCHS, "after"),
             *[(name, EPOCHS, phase) for name in ("predictions.pt", "results.json")
               for phase in both]]
    later_best = [("best.pt", b, phase) for phase in both] if b else []
    second = [("config.yaml", 0, "before"), ("encoder.json", 0, "before"),
              ("last.pt", 1, "after"), *(later_best if b == 2 else []), ("log.csv", 2, "after"),
              *(later_best if b and b > 2 else []), ("history.json", EPOCHS, "before")]
    if model == "mc_dropout":
        return [first, second]
    return [[("run.json", 0, "before"), ("last.pt", 1, "after"), *(later_best if b == 2 else []),
             ("epoch start", 2, ""), *(later_best if b and b > 2 else []),
             ("last.pt", EPOCHS, "after"), ("results.json", EPOCHS, "before")]]


@pytest.mark.parametrize("model", list(MODELS))
def test_kill_during_and_after_each_write_then_resume(tmp_path, reference, model):
    ref = reference(model)
    cfg = _config(model)
    for s, kills in enumerate(_kill_series(model, ref["improved"])):
        run = tmp_path / f"run-{s}"
        for i, kill in enumerate(kills):
            what = f"{model}, series {s}: kill {i + 1} at {kill}"
            child = Child(tmp_path, cfg, run, f"{s}-{i}", resume=i > 0, kill=kill)
            code = child.join()
            assert code == -signal.SIGKILL, f"{what}: exit status {code}\n{child.output()}"
            tmps = [p.name for p in run.glob(".*.tmp")]
            if kill[2] == "before":  # the temporary file was written, not renamed
                assert [n for n in tmps if n.startswith(f".{kill[0]}.")], f"{what}: {tmps}"
            _check_after_kill(run, ref, what)
        child = Child(tmp_path, cfg, run, f"{s}-end", resume=True)
        code = child.join()
        assert code == 0, f"{model}, series {s}: the last resume failed\n{child.output()}"
        _check_finished(run, ref, f"{model}, series {s}, after the kills {kills}")
        tried("kill -9 then resume", len(kills))


@pytest.mark.parametrize("model, seed", [(m, s) for s, m in enumerate(list(MODELS) * 4)],
                         ids=lambda v: f"seed={v}" if isinstance(v, int) else v)
def test_kill_at_random_moments_then_resume(tmp_path, reference, model, seed):
    """SIGKILL at a random moment once the trainer is built, resume, repeat (at most
    ``max_kills`` times) until a process completes the run. The delay is uniform over the time
    the fit left takes without a kill (epochs not done, validation and evaluation)."""
    ref = reference(model)
    rng = random.Random(seed)
    max_kills = 6
    cfg, run = _config(model), tmp_path / "run"
    kills: list[str] = []
    for i in range(max_kills + 1):
        done = load_checkpoint(run / "last.pt")["epoch"] if (run / "last.pt").exists() else 0
        delay = rng.uniform(0.0, ref["seconds"] * (1 - ref["train_share"] * done / EPOCHS))
        child = Child(tmp_path, cfg, run, i, resume=i > 0)
        if i < max_kills and child.wait_started():
            time.sleep(delay)
            if child.proc.is_alive():
                child.proc.kill()
        code = child.join()
        if code == 0:
            break
        where = (f"{delay:.2f} s into a fit resumed at epoch {done}: last.pt at epoch "
                 + (str(load_checkpoint(run / "last.pt")["epoch"])
                    if (run / "last.pt").exists() else "-")
                 + (", results.json" if (run / "results.json").exists() else "")
                 + "".join(f", {p.name}" for p in run.glob(".*.tmp")))
        kills.append(where)
        what = f"{model}, seed {seed}: kill {len(kills)}, {where}"
        assert code == -signal.SIGKILL, f"{what}: exit status {code}\n{child.output()}"
        _check_after_kill(run, ref, what)
    assert code == 0, f"the run did not complete: {code}\n{child.output()}"
    _check_finished(run, ref, f"{model}, seed {seed}, kills: {kills}")
    tried("kill -9 then resume", len(kills))
