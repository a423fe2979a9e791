"""Shared pieces of the fault tests: a tally of the bad inputs tried and of the tracebacks seen.

The tally is printed at the end of the session (``bad inputs tried``), the numbers the closing
note of a fault run reports.
"""

from __future__ import annotations

import collections
import contextlib
import tracemalloc

import pytest

#: category -> number of bad inputs tried in this session
TRIED: collections.Counter = collections.Counter()
#: tracebacks that reached a user without --debug (the target is 0)
TRACEBACKS: list[str] = []


def tried(category: str, n: int = 1) -> None:
    """Count ``n`` bad inputs of ``category``."""
    TRIED[category] += n


def cli_error(capsys, code: int, expected: int = 2) -> str:
    """The one error line of a command that failed with ``expected``; asserts that stderr holds
    exactly one ``error:`` line and no traceback."""
    err = capsys.readouterr().err
    if "Traceback" in err:
        TRACEBACKS.append(err)
    assert code == expected, err
    assert "Traceback" not in err, err
    lines = [line for line in err.splitlines() if "error:" in line]
    assert len(lines) == 1, err
    return lines[0]


@contextlib.contextmanager
def bounded_memory(limit_mib: float):
    """Assert that the block allocates at most ``limit_mib`` MiB at its peak (Python heap, by
    :mod:`tracemalloc`): the load-independent form of "refused at once" (a bomb that expands
    allocates gigabytes; a wall-clock bound fails on a busy machine). Warm the code path first
    (:func:`warm_cli`) so that first imports do not count."""
    tracemalloc.start()
    try:
        yield
        peak = tracemalloc.get_traced_memory()[1] / 2**20
    finally:
        tracemalloc.stop()
    assert peak <= limit_mib, f"peak {peak:.1f} MiB > {limit_mib} MiB"


def warm_cli(tmp_path, capsys) -> None:
    """Run ``train`` once on a small refused config, so the command line's imports are done
    before a :func:`bounded_memory` block measures it."""
    from gpattn_ppl.run.cli import main

    path = tmp_path / "warm.yaml"
    path.write_text("data:\n  name: csv\n  train_file: t.csv\n  no_such_key: 1\n")
    assert main(["train", str(path), "--out", str(tmp_path / "warm_run")]) == 2
    capsys.readouterr()


def train_argv(config, tmp_path, *pairs) -> list[str]:
    """``train CONFIG --out TMP/run --set PAIRS...``."""
    return ["train", str(config), "--out", str(tmp_path / "run"), "--set", *pairs]


def refused_run(capsys, argv, tmp_path, *needles) -> str:
    """Run ``argv``; assert one error line, exit 2, the needles in it and no ``TMP/run``."""
    from gpattn_ppl.run.cli import main

    line = cli_error(capsys, main(argv))
    for needle in needles:
        assert needle in line, line
    assert not (tmp_path / "run").exists()
    return line


def pytest_terminal_summary(terminalreporter):
    if TRIED:
        total = sum(TRIED.values())
        parts = ", ".join(f"{k} {v}" for k, v in sorted(TRIED.items()))
        terminalreporter.write_line(f"faults: {total} bad inputs tried ({parts}); tracebacks "
                                    f"seen without --debug: {len(TRACEBACKS)}")


@pytest.fixture
def tiny_yaml(tmp_path):
    """A tiny valid CoLA config file (validation errors need no training)."""
    import yaml

    cfg = {"model": {"dim": 8, "depth": 1, "heads": 2, "mlp_dim": 8, "max_len": 16},
           "data": {"name": "cola", "max_len": 16, "batch_size": 16, "limit_train": 32,
                    "limit_eval": 16},
           "train": {"epochs": 1, "warmup_epochs": 0, "progress": False},
           "eval": {"mc_samples": 2}}
    path = tmp_path / "tiny.yaml"
    path.write_text(yaml.safe_dump(cfg))
    return path


@pytest.fixture(scope="session")
def trained(tmp_path_factory):
    """A tiny CoLA run (one epoch), evaluated with temperature scaling; copy it before changing
    it (the ``run`` fixtures of the fault modules do)."""
    import copy

    from gpattn_ppl.run.experiment import Trainer

    from ..run.conftest import TINY

    cfg = copy.deepcopy(TINY)
    cfg["train"].update(epochs=1, device="cpu")
    cfg["eval"]["temperature_scaling"] = True
    run = tmp_path_factory.mktemp("faults") / "run"
    Trainer(cfg, run).fit()
    return run


@pytest.fixture
def texts(tmp_path):
    """Two sentences in a ``.txt`` file, one per line."""
    path = tmp_path / "in.txt"
    path.write_text("The cat sat on the mat.\nMat the on sat cat the.\n")
    return path
