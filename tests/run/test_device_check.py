"""``benchmarks/device_check.py`` (the one prepared GPU check) at smoke size on the CPU: the JSON
it writes has every section, each ``ok`` or skipped with a reason; and the backend and device
choice of :mod:`gpattn_ppl.run.runtime` that its torchrun section relies on. No timing is
asserted."""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from gpattn_ppl.run import runtime

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "benchmarks" / "device_check.py"
SECTIONS = {"a": "cuda_tests", "b": "layers", "c": "cifar_steps", "d": "torchrun"}


def _script():
    spec = importlib.util.spec_from_file_location("device_check", SCRIPT)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


#: a budget no smoke run reaches on any machine, however loaded: the smoke test asserts what the
#: script wrote, never that it finished in time (the default 250 s budget is the GPU run's)
UNBOUNDED_S = "1000000"


def _run(out: Path, *args: str) -> subprocess.CompletedProcess:
    # the timeout only guards against a hang (it is not what the test checks)
    return subprocess.run([sys.executable, str(SCRIPT), str(out), *args], cwd=ROOT,
                          capture_output=True, text=True, timeout=3600)


def _check_statuses(res: dict) -> None:
    assert set(res["sections"]) == set(SECTIONS)
    for key, title in SECTIONS.items():
        s = res["sections"][key]
        assert s["title"] == title
        assert s["status"] in ("ok", "skipped"), (key, s.get("status"), s.get("reason"),
                                                  s.get("log_tail"))
        if s["status"] == "skipped":
            assert s["reason"], key


def test_smoke_writes_every_section(tmp_path):
    out = tmp_path / "out"
    proc = _run(out, "--smoke", "--budget-s", UNBOUNDED_S)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    # OUTDIR stays small (the GPU reply brings back at most 8 files)
    assert {p.name for p in out.iterdir()} <= {"device_check.json", "device_check.log",
                                               "cuda_junit.xml"}
    res = json.loads((out / "device_check.json").read_text())
    assert res["smoke"] is True and res["machine"]["status"] == "ok"
    assert res["machine"]["torch"] == torch.__version__
    _check_statuses(res)
    sec = res["sections"]
    # (a) the CUDA tests ran (every one skipped here) and were counted
    counts = sec["a"]["counts"]
    assert counts["total"] > 0 and counts["failed"] == 0 and counts["errors"] == 0
    if not torch.cuda.is_available():
        assert counts["skipped"] == counts["total"]
    # (b) every unit at every N and precision, softmax the reference
    b = sec["b"]
    assert b["units"][0] == "softmax" and len(b["units"]) >= 10
    assert set(b["blocks"]) == {f"{n}/{p}" for n in (8, 16) for p in ("fp32", "bf16")}
    for key, block in b["blocks"].items():
        assert set(block["units"]) == set(b["units"]), key
        assert block["units"]["softmax"]["ratio_to_softmax"] == 1.0
        for unit, row in block["units"].items():
            assert row is not None and "error" not in row, (key, unit, row)
            assert row["median_s"] > 0 and row["peak_mib"] >= 0 and row["syncs_aten"] >= 0
    # (c) every paper preset took its steps
    c = sec["c"]
    assert c["presets"] and "softmax" in c["presets"]
    for name, row in c["presets"].items():
        assert row["status"] == "ok", (name, row)
        assert row["steps"] == 2 and row["median_step_s"] > 0 and row["epoch_s_projected"] > 0
    # (d) two ranks trained and evaluated
    d = sec["d"]
    assert d["backend"] in ("gloo", "nccl") and d["torchrun_returncode"] == 0
    assert d["results_written"] is True
    # the final table is printed last
    tail = proc.stdout[-12000:]
    assert "== device_check (smoke)" in tail and "(b) per-layer" in tail and "(c) CIFAR-10" in tail


def test_budget_exhausted_skips_with_reasons(tmp_path):
    """A budget too small for any section: each is skipped with a reason, nothing runs."""
    out = tmp_path / "out"
    proc = _run(out, "--smoke", "--budget-s", "1", "--sections", "a", "d")
    assert proc.returncode == 0, proc.stderr[-3000:]
    res = json.loads((out / "device_check.json").read_text())
    _check_statuses(res)
    assert res["machine"]["status"] == "skipped"
    assert all(s["status"] == "skipped" for s in res["sections"].values())
    assert "budget" in res["sections"]["a"]["reason"]
    assert "not selected" in res["sections"]["b"]["reason"]


def test_pytest_counts_from_junit_and_progress(tmp_path):
    mod = _script()
    xml = tmp_path / "j.xml"
    xml.write_text('<testsuites><testsuite tests="4" failures="1" errors="0" skipped="1">'
                   '<testcase classname="t.A" name="ok"/>'
                   '<testcase classname="t.A" name="bad"><failure message="boom&#10;more"/>'
                   '</testcase></testsuite></testsuites>')
    counts, failures = mod._junit_counts(xml)
    assert counts == {"passed": 2, "failed": 1, "errors": 0, "skipped": 1, "total": 4}
    assert failures == ["t.A::bad [failure] boom"]
    progress = mod._progress_counts(["..F.s      [ 50%]", "sE", "12 passed in 3s"])
    assert (progress["passed"], progress["failed"], progress["skipped"],
            progress["errors"]) == (3, 1, 2, 1)


@pytest.mark.parametrize("available, count, local, expected", [
    (False, 0, 2, "gloo"), (True, 1, 2, "gloo"), (True, 2, 2, "nccl"), (True, 1, 1, "nccl")])
def test_distributed_backend(monkeypatch, available, count, local, expected):
    monkeypatch.delenv(runtime.BACKEND_ENV, raising=False)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: available)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: count)
    assert runtime.distributed_backend(local) == expected
    monkeypatch.setenv("LOCAL_WORLD_SIZE", str(local))
    assert runtime.distributed_backend() == expected
    monkeypatch.setenv(runtime.BACKEND_ENV, "gloo")
    assert runtime.distributed_backend(local) == "gloo"


def test_select_device_shares_gpus_between_local_ranks(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    monkeypatch.setenv("LOCAL_RANK", "3")
    assert runtime.select_device("auto") == torch.device("cuda", 1)
    monkeypatch.delenv("LOCAL_RANK")
    assert runtime.select_device("auto", rank=2) == torch.device("cuda", 0)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert runtime.select_device("auto") == torch.device("cpu")
    assert runtime.select_device("cpu") == torch.device("cpu")
