"""Shared pieces of the fault tests: a tally of the bad inputs tried and of the tracebacks seen.

The tally is printed at the end of the session (``bad inputs tried``), the numbers the closing
note of a fault run reports.
"""

from __future__ import annotations

import collections

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
