"""One prepared check of a lent GPU: CUDA tests, per-layer speed, CIFAR-10 step time, torchrun.

Run once on the GPU machine, from the repository root (``--budget-s`` caps the whole run: default
250 s; the sections' limits at that budget are info 30 s, a 80 s, b 95 s, c 65 s, d 45 s, each
cut so that the sections after it keep a reserve)::

    PYTHONPATH=. python benchmarks/device_check.py $OUT

and on a CPU at smoke size (tiny models, under a minute; ``tests/run/test_device_check.py``)::

    python benchmarks/device_check.py OUTDIR --smoke

Writes ``OUTDIR/device_check.json`` (rewritten after every section), ``OUTDIR/device_check.log``
(everything the sections printed) and ``OUTDIR/cuda_junit.xml`` (section a), and prints a
compact table at the end. Every section runs in its own subprocess (its own process group) with
a time limit taken from the budget left; a section that fails, raises or runs out of time is
recorded (status ``failed`` / ``timeout``, with what it had measured so far) and the next one
runs. Sections (``--sections a b c d``, default all; the machine info always comes first):

* ``info``: Python, torch, CUDA and cuDNN versions, the GPU's properties
  (``torch.cuda.get_device_properties``), the driver (``nvidia-smi``), package versions and the
  git revision (:func:`~gpattn_ppl.run.benchmarking.provenance`).
* (a) ``cuda_tests``: ``pytest tests/run/test_cuda.py tests/run/test_cuda_mixin.py`` (they skip
  without CUDA): every unit trains on CUDA, the memory / sync tools and the unit benchmark run
  there, the public unit mixin runs for every registered unit on CUDA (float64, with its float32
  check) and a bf16-autocast check per unit (finite forward + backward, output within 5e-2
  relative Frobenius error of float32's). Pass / fail / skip counts from the JUnit XML, and the
  failed tests' names.
* (b) ``layers``: every unit of ``benchmarks/bench_units.py``'s ``UNITS`` at B = 64, N in {64,
  256, 1024}, C = 128, H = 4, in fp32 and in bf16 autocast: one train step (forward + backward,
  ``train_step(..., fast_path=True)``) timed in interleaved rounds against softmax (torch SDPA)
  in the same process and precision (per-round ratio of medians; median, min and max over the
  rounds' steps), the peak memory of one step (CUDA: the allocator's peak; CPU: tensor bytes,
  :func:`~gpattn_ppl.run.benchmarking.peak_memory`) and its host synchronisations
  (``tests.sync.sync_counter`` at the aten level and, on CUDA, the warnings of
  ``torch.cuda.set_sync_debug_mode("warn")``). Rounds x steps per unit: 3 x 10 at N = 64,
  3 x 6 at 256, 2 x 5 at 1024 (after 3 / 2 / 2 warm-up steps). A unit that fails or runs out of
  memory at an N gets its error's first line instead of numbers; the blocks of (N, precision)
  left when the section's budget runs out are skipped (and say so).
* (c) ``cifar_steps``: each CIFAR-10 paper preset (``experiments/configs/cifar10_paper/*.yaml``)
  built as training builds it
  (``load_config`` -> ``model_and_program`` -> the trainer's optimiser) on synthetic uint8
  images resident on the device (the real step: gather, normalise, crop + flip, loss, backward,
  optimiser step, through :func:`~gpattn_ppl.infer.fit_epoch` in the preset's precision and
  batch size, 100 or 128): the median step time over 25 steps after 5 warm-up steps, the
  projected epoch of 45,000 training images (``ceil(45000 / batch)`` steps: 352 at batch 128)
  and the peak memory. Presets left when the section's budget runs out are skipped (and say
  so).
* (d) ``torchrun``: ``python -m torch.distributed.run --standalone --nproc_per_node 2 -m
  gpattn_ppl.run.cli train`` of a tiny CoLA config (depth 1, dim 16, 64 training examples, one
  epoch) into a temporary folder; the backend is
  :func:`gpattn_ppl.run.runtime.distributed_backend`'s (gloo on one GPU: NCCL cannot run two
  ranks on one device).

Smoke sizes (``--smoke``): (b) B = 2, N in {8, 16}, C = 16, H = 2, one round; (c) depth 1,
dim 16, 2 heads, batch 4, 2 timed steps after 1 warm-up. Nothing here is asserted by tests but
the JSON's structure.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import traceback
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
JSON_NAME, LOG_NAME, JUNIT_NAME = "device_check.json", "device_check.log", "cuda_junit.xml"

#: section key -> (title, time limit in seconds at the default budget)
SECTIONS: dict[str, tuple[str, float]] = {
    "info": ("machine", 30.0),
    "a": ("cuda_tests", 80.0),
    "b": ("layers", 95.0),
    "c": ("cifar_steps", 65.0),
    "d": ("torchrun", 45.0),
}
#: seconds kept for each later section when a section's limit is cut to the budget left
RESERVE = {"info": 0.0, "a": 20.0, "b": 30.0, "c": 20.0, "d": 25.0}
DEFAULT_BUDGET_S = 250.0
#: seconds a section with its own budget (b, c) gets to wrap up after it (hard limit - soft)
GRACE_S = 12.0
#: the smallest time limit worth starting a section with
MIN_LIMIT_S = 8.0

CUDA_TEST_FILES = ["tests/run/test_cuda.py", "tests/run/test_cuda_mixin.py"]
TRAIN_IMAGES = 45_000
PRESET_ORDER = ["softmax", "sgpa", "cgpt", "scgpt", "kep_svgp", "h_gumbel", "gumbel",
                "kernel_asym", "kernel_sym", "mc_dropout"]
SMOKE_MODEL = ["model.depth=1", "model.dim=16", "model.heads=2", "model.mlp_dim=16",
               "data.batch_size=4"]
TINY_COLA = ["model.depth=1", "model.dim=16", "model.heads=2", "model.mlp_dim=16",
             "model.max_len=40", "model.dropout=0.0", "data.max_len=40", "data.limit_train=64",
             "data.limit_eval=32", "data.batch_size=16", "train.epochs=1",
             "train.warmup_epochs=0.5", "train.progress=false", "eval.mc_samples=2"]


# -- small helpers (standard library only: the parent process never imports torch) ------------
def _strict(obj):
    """``obj`` with non-finite floats as ``None`` and tuples as lists (strict JSON)."""
    if isinstance(obj, float):
        return obj if math.isfinite(obj) else None
    if isinstance(obj, dict):
        return {str(k): _strict(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [_strict(v) for v in obj]
    if obj is None or isinstance(obj, (bool, int, str)):
        return obj
    return str(obj)


def _write_json(obj: dict, path: Path) -> None:
    """Write ``obj`` as strict, indented JSON atomically (a reader sees the old or new file)."""
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(_strict(obj), indent=1, allow_nan=False) + "\n")
    os.replace(tmp, path)


def _first_line(err: BaseException) -> str:
    text = str(err).strip()
    line = text.splitlines()[0] if text else ""
    return f"{type(err).__name__}: {line}"[:300]


def _say(*parts) -> None:
    print(*parts, flush=True)


# -- the parent: one subprocess per section ------------------------------------------------------
def _limits(key: str, budget: float, left: float, later: list[str]) -> float:
    """The time limit of section ``key``: its share of the budget, cut so that the later
    sections keep their reserve."""
    own = SECTIONS[key][1] * budget / DEFAULT_BUDGET_S
    return min(own, left - sum(RESERVE[k] for k in later))


def _child_env(smoke: bool = False) -> dict:
    """The environment of a section: the repository on ``PYTHONPATH``, unbuffered output, and
    one OpenMP thread at smoke size (a shared CPU)."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(ROOT), env.get("PYTHONPATH")) if p)
    env["PYTHONUNBUFFERED"] = "1"
    if smoke:
        env["OMP_NUM_THREADS"] = "1"
    return env


def _kill_group(proc: subprocess.Popen) -> None:
    """SIGTERM then SIGKILL to the process group of ``proc`` (which started a new session):
    the section and whatever it started (pytest, torchrun and its workers)."""
    for sig, wait in ((signal.SIGTERM, 5.0), (signal.SIGKILL, 5.0)):
        try:
            os.killpg(proc.pid, sig)
        except (ProcessLookupError, PermissionError):
            return
        try:
            proc.wait(timeout=wait)
        except subprocess.TimeoutExpired:
            continue
        if sig == signal.SIGTERM:  # the leader left: make sure nothing it started stays
            try:
                os.killpg(proc.pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass
            return


def _log_tail(log: Path, start: int, lines: int = 6) -> list[str]:
    with open(log, "rb") as fh:
        fh.seek(start)
        text = fh.read().decode("utf-8", "replace")
    return [ln[:300] for ln in text.strip().splitlines()[-lines:]]


def run_section(key: str, limit: float, a, parts: Path, log: Path) -> dict:
    """Run section ``key`` in a subprocess with ``limit`` seconds; its record (status,
    seconds, what it wrote to its part file)."""
    part = parts / f"{key}.json"
    soft = max(limit - GRACE_S, limit * 0.6) if key in ("b", "c") else limit - 3.0
    cmd = [sys.executable, str(Path(__file__).resolve()), str(a.outdir), "--_section", key,
           "--_part", str(part), "--_budget", f"{soft:.1f}"] + (["--smoke"] if a.smoke else [])
    with open(log, "ab") as fh:
        fh.write(f"\n===== section {key} ({SECTIONS[key][0]}): limit {limit:.0f} s "
                 f"=====\n".encode())
        fh.flush()
        start = fh.tell()
        t0 = time.perf_counter()
        proc = subprocess.Popen(cmd, stdout=fh, stderr=subprocess.STDOUT, cwd=ROOT,
                                env=_child_env(a.smoke), start_new_session=True)
        timed_out = False
        try:
            proc.wait(timeout=limit)
        except subprocess.TimeoutExpired:
            timed_out = True
        _kill_group(proc)
        seconds = time.perf_counter() - t0
    try:
        data = json.loads(part.read_text())
    except (OSError, ValueError):
        data = {}
    rec = {"title": SECTIONS[key][0], "seconds": round(seconds, 2),
           "limit_s": round(limit, 1), "returncode": proc.returncode}
    status = data.pop("status", None)
    if timed_out:
        rec["status"] = "timeout"
        rec["reason"] = f"killed after {limit:.0f} s (partial results kept)"
        rec["log_tail"] = _log_tail(log, start)
    elif status is None or proc.returncode != 0:
        rec["status"] = "failed"
        rec["reason"] = data.pop("reason", None) or f"exit code {proc.returncode}"
        rec["log_tail"] = _log_tail(log, start)
    else:
        rec["status"] = status
        if "reason" in data:
            rec["reason"] = data.pop("reason")
    rec.update(data)
    return rec


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("outdir", type=Path)
    p.add_argument("--smoke", action="store_true", help="tiny sizes (the CPU test)")
    p.add_argument("--sections", nargs="+", choices=["a", "b", "c", "d"],
                   default=["a", "b", "c", "d"])
    p.add_argument("--budget-s", type=float, default=DEFAULT_BUDGET_S,
                   help=f"wall-clock cap of the whole run (default {DEFAULT_BUDGET_S:.0f})")
    p.add_argument("--_section", choices=list(SECTIONS), help=argparse.SUPPRESS)
    p.add_argument("--_part", type=Path, help=argparse.SUPPRESS)
    p.add_argument("--_budget", type=float, help=argparse.SUPPRESS)
    a = p.parse_args(argv)
    if a._section:
        return child_main(a)
    t0 = time.perf_counter()
    a.outdir = a.outdir.resolve()  # the sections run from the repository root
    a.outdir.mkdir(parents=True, exist_ok=True)
    out, log = a.outdir / JSON_NAME, a.outdir / LOG_NAME
    log.write_text("")
    res = {"format": 1, "smoke": a.smoke, "budget_s": a.budget_s,
           "command": " ".join(["python", "benchmarks/device_check.py",
                                *(sys.argv[1:] if argv is None else argv)]),
           "started": time.strftime("%Y-%m-%dT%H:%M:%S%z"), "machine": None,
           "sections": {}, "total_seconds": None}
    _write_json(res, out)
    order = ["info"] + [k for k in ("a", "b", "c", "d") if k in a.sections]
    with tempfile.TemporaryDirectory(prefix="device_check_") as parts:
        for i, key in enumerate(order):
            left = a.budget_s - (time.perf_counter() - t0)
            limit = _limits(key, a.budget_s, left, order[i + 1:])
            if limit < MIN_LIMIT_S:
                rec = {"title": SECTIONS[key][0], "status": "skipped",
                       "reason": f"budget: {max(left, 0):.0f} s left of {a.budget_s:.0f} s"}
            else:
                try:
                    rec = run_section(key, limit, a, Path(parts), log)
                except Exception as err:  # noqa: BLE001 -- recorded, the next section runs
                    rec = {"title": SECTIONS[key][0], "status": "failed",
                           "reason": f"device_check itself: {_first_line(err)}"}
            if key == "info":
                res["machine"] = rec
            else:
                res["sections"][key] = rec
            res["total_seconds"] = round(time.perf_counter() - t0, 1)
            _write_json(res, out)
            _say(f"[{key}] {rec['title']}: {rec['status']} "
                 f"({rec.get('seconds', 0):.1f} s){'  ' + rec['reason'] if 'reason' in rec else ''}")
    for key in ("a", "b", "c", "d"):
        if key not in res["sections"]:
            res["sections"][key] = {"title": SECTIONS[key][0], "status": "skipped",
                                    "reason": "not selected (--sections)"}
    res["sections"] = dict(sorted(res["sections"].items()))
    res["total_seconds"] = round(time.perf_counter() - t0, 1)
    _write_json(res, out)
    try:
        print_table(res)
    except Exception as err:  # noqa: BLE001 -- the JSON is written; say so and show the statuses
        _say(f"(table failed: {_first_line(err)})")
        for key, s in res["sections"].items():
            _say(f"[{key}] {s.get('title')}: {s.get('status')} {s.get('reason') or ''}")
    _say(f"wrote {out} and {log}")
    return 0


# -- the final table ------------------------------------------------------------------------------
def _fmt(v, spec: str = ".2f") -> str:
    return "-" if v is None else format(v, spec)


def _mib(v) -> str:
    return "-" if v is None else (f"{v:.0f}" if v >= 10 else f"{v:.2g}")


def print_table(res: dict) -> None:
    m = res.get("machine") or {}
    gpu = (m.get("cuda") or {}).get("device_name") or "no CUDA"
    lines = [f"== device_check ({'smoke' if res['smoke'] else 'full'}): {gpu} | torch "
             f"{m.get('torch')} | CUDA {(m.get('cuda') or {}).get('version')} | driver "
             f"{(m.get('cuda') or {}).get('driver')} | rev {m.get('git_revision')} | "
             f"{res['total_seconds']} s"]
    for key, s in sorted(res["sections"].items()):
        head = f"[{key}] {s['title']:12s} {s['status']:8s} {s.get('seconds', 0):6.1f} s"
        if s.get("reason"):
            head += f"  {s['reason']}"
        lines.append(head)
        if s.get("log_tail"):
            lines.extend(f"      | {ln[:150]}" for ln in s["log_tail"][-3:])
    a = res["sections"].get("a", {})
    if a.get("counts"):
        c = a["counts"]
        lines.append(f"(a) pytest: {c.get('passed')} passed, {c.get('failed')} failed, "
                     f"{c.get('errors')} errors, {c.get('skipped')} skipped")
        lines.extend(f"    FAIL {f[:160]}" for f in a.get("failures", [])[:12])
    b = res["sections"].get("b", {})
    if b.get("blocks"):
        lines.extend(_layers_table(b))
    c = res["sections"].get("c", {})
    if c.get("presets"):
        lines.append(f"(c) CIFAR-10 paper presets on {c.get('device')}: median step at the "
                     f"preset's batch, epoch = ceil({TRAIN_IMAGES}/batch) steps, peak MiB")
        lines.append(f"{'preset':12s} {'prec':4s} {'batch':>5s} {'step ms':>8s} "
                     f"{'epoch s':>8s} {'peak MiB':>9s}  status")
        for name, r in c["presets"].items():
            st = r.get("status", "?")
            note = "" if st == "ok" else f"  {(r.get('error') or r.get('reason') or '')[:80]}"
            if r.get("checked_reruns"):
                note += f"  ({r['checked_reruns']} checked re-runs)"
            step = r.get("median_step_s")
            lines.append(f"{name:12s} {str(r.get('precision', '-')):4s} "
                         f"{_fmt(r.get('batch_size'), 'd'):>5s} "
                         f"{_fmt(step and step * 1e3, '.1f'):>8s} "
                         f"{_fmt(r.get('epoch_s_projected'), '.1f'):>8s} "
                         f"{_fmt(r.get('peak_mib'), '.0f'):>9s}  {st}{note}")
    d = res["sections"].get("d", {})
    if d.get("backend"):
        lines.append(f"(d) torchrun 2 ranks: backend {d.get('backend')}, exit "
                     f"{d.get('torchrun_returncode')}, {_fmt(d.get('torchrun_seconds'), '.1f')} s, "
                     f"results.json {d.get('results_written')}, test acc "
                     f"{_fmt(d.get('test_acc'), '.3f')}")
    _say("\n".join(lines))


def _layers_table(b: dict) -> list[str]:
    blocks = b["blocks"]
    ns = sorted({blk["N"] for blk in blocks.values()})
    lines = [f"(b) per-layer train step on {b.get('device')}, B={b.get('B')} C={b.get('C')} "
             f"H={b.get('H')}: ratio to softmax fp32/bf16 per N; peak MiB at the largest N "
             "fp32/bf16; syncs = max aten / cuda-warn"]
    lines.append(f"{'unit':14s}" + "".join(f" {'N=' + str(n):>11s}" for n in ns)
                 + f" {'MiB@' + str(ns[-1]) if ns else 'MiB':>13s} {'syncs':>7s}")
    units = b.get("units", [])
    for u in units:
        line = f"{u:14s}"
        for n in ns:
            r = [((blocks.get(f"{n}/{prec}") or {}).get("units") or {}).get(u) or {}
                 for prec in ("fp32", "bf16")]
            line += f" {_fmt(r[0].get('ratio_to_softmax')):>5s}/{_fmt(r[1].get('ratio_to_softmax')):5s}"
        mem = [((blocks.get(f"{ns[-1]}/{prec}") or {}).get("units") or {}).get(u) or {}
               for prec in ("fp32", "bf16")] if ns else [{}, {}]
        line += f" {_mib(mem[0].get('peak_mib')):>6s}/{_mib(mem[1].get('peak_mib')):6s}"
        aten = [r.get("syncs_aten") for blk in blocks.values()
                for r in [(blk.get("units") or {}).get(u) or {}] if r.get("syncs_aten") is not None]
        warn = [r.get("syncs_cuda_warn") for blk in blocks.values()
                for r in [(blk.get("units") or {}).get(u) or {}]
                if r.get("syncs_cuda_warn") is not None]
        line += f" {_fmt(max(aten) if aten else None, 'd'):>3s}/{_fmt(max(warn) if warn else None, 'd'):3s}"
        lines.append(line)
    line = f"{'(softmax ms)':14s}"
    for n in ns:
        ms = [(((blocks.get(f"{n}/{prec}") or {}).get("units") or {}).get("softmax") or {})
              .get("median_s") for prec in ("fp32", "bf16")]
        ms = [_fmt(v and v * 1e3, ".2f") for v in ms]
        line += f" {ms[0]:>5s}/{ms[1]:5s}"
    lines.append(line)
    errors = [(k, u, r.get("error") or f"probes: {r.get('probe_error')}")
              for k, blk in blocks.items()
              for u, r in (blk.get("units") or {}).items()
              if r and (r.get("error") or r.get("probe_error"))]
    for k, u, e in errors[:10]:
        lines.append(f"    {u} @ {k}: {e[:120]}")
    if len(errors) > 10:
        lines.append(f"    ... {len(errors) - 10} more errors in the JSON")
    skipped = [f"{k}: {blk['reason']}" for k, blk in blocks.items() if blk.get("reason")]
    lines.extend(f"    {s[:150]}" for s in skipped)
    return lines


# -- the children: one section each --------------------------------------------------------------
class Part:
    """A section's results, written to its part file after every step (the parent reads what
    is there, also after a timeout)."""

    def __init__(self, path: Path) -> None:
        self.path, self.data = path, {}

    def save(self) -> None:
        _write_json(self.data, self.path)


def child_main(a) -> int:
    part = Part(a._part)
    t0 = time.perf_counter()
    deadline = t0 + a._budget
    sys.path[:0] = [str(ROOT), str(ROOT / "benchmarks")]
    try:
        {"info": section_info, "a": section_cuda_tests, "b": section_layers,
         "c": section_cifar, "d": section_torchrun}[a._section](a, part, deadline)
    except BaseException as err:  # noqa: BLE001 -- recorded, then the parent goes on
        traceback.print_exc()
        part.data["status"] = "failed"
        part.data["reason"] = _first_line(err)
        part.save()
        return 1
    part.data.setdefault("status", "ok")
    part.save()
    return 0


def _device():
    import torch

    return torch.device("cuda" if torch.cuda.is_available() else "cpu")


def _sync(device) -> None:
    import torch

    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _free(device) -> None:
    import gc

    import torch

    gc.collect()
    if device.type == "cuda":
        torch.cuda.empty_cache()


def section_info(a, part: Part, deadline: float) -> None:
    import platform
    from importlib import metadata

    import torch

    from gpattn_ppl.run.benchmarking import machine_info, provenance

    d = part.data
    d.update(python=platform.python_version(), torch=torch.__version__,
             platform=platform.platform(), cpu_count=os.cpu_count(),
             torch_threads=torch.get_num_threads())
    versions = {}
    for pkg in ("gpytorch", "linear-operator", "pyro-ppl", "transformers", "numpy"):
        try:
            versions[pkg] = metadata.version(pkg)
        except metadata.PackageNotFoundError:
            versions[pkg] = None
    d["packages"] = versions
    d["git_revision"] = provenance([], ROOT)["git_revision"]
    part.save()
    cuda = {"available": torch.cuda.is_available(), "version": torch.version.cuda,
            "cudnn": torch.backends.cudnn.version() if torch.backends.cudnn.is_available()
            else None}
    if cuda["available"]:
        props = torch.cuda.get_device_properties(0)
        cuda["device_count"] = torch.cuda.device_count()
        cuda["device_name"] = props.name
        cuda["total_memory_gib"] = round(props.total_memory / 2**30, 1)
        cuda["capability"] = [props.major, props.minor]
        cuda["properties"] = {}
        for k in dir(props):
            try:
                v = getattr(props, k)
            except Exception:  # noqa: BLE001 -- a property this build cannot read
                continue
            if not k.startswith("_") and isinstance(v, (int, float, str, bool)):
                cuda["properties"][k] = v
        cuda["bf16_supported"] = torch.cuda.is_bf16_supported()
        cuda["matmul_allow_tf32"] = torch.backends.cuda.matmul.allow_tf32
        try:
            cuda["driver"] = subprocess.run(
                ["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
                capture_output=True, text=True, timeout=15).stdout.strip() or None
        except (OSError, subprocess.SubprocessError):
            cuda["driver"] = None
    d["cuda"] = cuda
    d["machine_info"] = machine_info()
    _say(json.dumps(_strict(d), indent=1))


# (a) ---------------------------------------------------------------------------------------------
#: commands a section runs in their own process group (killed with the section on SIGTERM)
_STARTED: list[subprocess.Popen] = []


def _on_sigterm(signum, frame) -> None:
    """The parent's time limit: take the commands this section started down with it."""
    for proc in _STARTED:
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
    os._exit(128 + signum)


def _tee(cmd: list[str], timeout: float, env: dict | None = None) -> tuple[int | None, list[str]]:
    """Run ``cmd`` (its output copied to ours and kept); ``(returncode, lines)``, returncode
    ``None`` when it ran past ``timeout`` (then it and its own children are killed)."""
    signal.signal(signal.SIGTERM, _on_sigterm)
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, cwd=ROOT,
                            env=env, text=True, errors="replace", start_new_session=True)
    _STARTED.append(proc)
    lines: list[str] = []

    def pump():
        for line in proc.stdout:
            sys.stdout.write(line)
            lines.append(line.rstrip("\n"))
        sys.stdout.flush()

    reader = threading.Thread(target=pump, daemon=True)
    reader.start()
    try:
        proc.wait(timeout=max(timeout, 1.0))
    except subprocess.TimeoutExpired:
        _kill_group(proc)
        reader.join(timeout=5)
        return None, lines
    _kill_group(proc)  # whatever it left behind (a stray worker)
    reader.join(timeout=5)
    return proc.returncode, lines


def _junit_counts(path: Path) -> tuple[dict, list[str]]:
    import xml.etree.ElementTree as ET

    root = ET.parse(path).getroot()
    suites = [root] if root.tag == "testsuite" else list(root.iter("testsuite"))
    counts = {k: sum(int(s.get(k, 0)) for s in suites)
              for k in ("tests", "failures", "errors", "skipped")}
    failures = []
    for case in root.iter("testcase"):
        for tag in ("failure", "error"):
            el = case.find(tag)
            if el is not None:
                msg = (el.get("message") or "").strip().splitlines()
                failures.append(f"{case.get('classname', '')}::{case.get('name', '')} "
                                f"[{tag}] {msg[0][:160] if msg else ''}")
    out = {"passed": counts["tests"] - counts["failures"] - counts["errors"] - counts["skipped"],
           "failed": counts["failures"], "errors": counts["errors"],
           "skipped": counts["skipped"], "total": counts["tests"]}
    return out, failures


def _progress_counts(lines: list[str]) -> dict:
    """Counts from pytest's ``-q`` progress characters (a run cut off before its summary)."""
    progress = [ln.split(" [")[0].strip() for ln in lines]
    chars = "".join(p for p in progress if p and set(p) <= set(".FEsxX"))
    return {"passed": chars.count("."), "failed": chars.count("F"), "errors": chars.count("E"),
            "skipped": chars.count("s") + chars.count("x"), "total": len(chars),
            "incomplete": True}


def section_cuda_tests(a, part: Part, deadline: float) -> None:
    junit = a.outdir / JUNIT_NAME
    if junit.exists():
        junit.unlink()
    cmd = [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-o", "addopts=", "-q",
           "-rfE", "--tb=short", f"--junitxml={junit}", *CUDA_TEST_FILES]
    d = part.data
    d["command"] = " ".join(cmd[1:])
    part.save()
    env = dict(os.environ)
    env.pop("GPATTN_PPL_TEST_DEVICE", None)
    rc, lines = _tee(cmd, deadline - time.perf_counter() - 2.0, env=env)
    d["pytest_returncode"] = rc
    if rc is not None and junit.exists():
        d["counts"], d["failures"] = _junit_counts(junit)
    else:
        d["counts"], d["failures"] = _progress_counts(lines), [
            ln[:200] for ln in lines if ln.startswith(("FAILED", "ERROR"))]
    summary = [ln for ln in lines if " in " in ln and ("passed" in ln or "skipped" in ln
                                                       or "failed" in ln)]
    d["summary"] = summary[-1].strip("= ") if summary else None
    c = d["counts"]
    if rc is None:
        d["status"], d["reason"] = "timeout", "pytest ran past the section's budget"
    elif rc == 0 or (rc == 5 and c.get("total", 0) == 0):
        d["status"] = "ok"
        if c.get("total") and c.get("skipped") == c.get("total"):
            d["reason"] = "every test skipped (no CUDA here)"
    else:
        d["status"] = "failed"
        d["reason"] = (f"pytest exit {rc}: {c.get('failed')} failed, {c.get('errors')} "
                       "errors")


# (b) ---------------------------------------------------------------------------------------------
def _layer_plan(smoke: bool, cuda: bool) -> dict:
    if smoke:
        return {"B": 2, "C": 16, "H": 2,
                "ns": {8: (1, 2, 1), 16: (1, 2, 1)}}  # N -> (rounds, repeats, warmup)
    return {"B": 64, "C": 128, "H": 4,
            "ns": {64: (3, 10, 3), 256: (3, 6, 2), 1024: (2, 5, 2)} if cuda
            else {64: (2, 3, 1), 256: (2, 2, 1), 1024: (1, 1, 1)}}


def _timed(step, repeats: int, warmup: int, device, precision: str) -> list[float]:
    """Seconds of ``repeats`` runs of ``step`` under ``precision``'s autocast, after
    ``warmup`` runs (a device synchronisation closes each run)."""
    from gpattn_ppl.infer.precision import autocast

    for _ in range(warmup):
        with autocast(precision, device):
            step()
    _sync(device)
    times = []
    for _ in range(repeats):
        t = time.perf_counter()
        with autocast(precision, device):
            step()
        _sync(device)
        times.append(time.perf_counter() - t)
    return times


def _step_probes(step, device, precision: str) -> dict:
    """Peak memory and host synchronisations of one step."""
    import warnings

    import torch

    from gpattn_ppl.infer.precision import autocast
    from gpattn_ppl.run.benchmarking import peak_memory
    from tests.sync import sync_counter

    def run():
        with autocast(precision, device):
            step()

    out = {}
    r = peak_memory(run, device)
    out["peak_mib"] = r["peak_bytes"] / 2**20
    with sync_counter() as s:
        run()
    out["syncs_aten"] = s.count
    out["sync_ops"] = sorted(set(s.ops))[:8]
    if device.type == "cuda":
        _sync(device)
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            torch.cuda.set_sync_debug_mode("warn")
            try:
                run()
            finally:
                torch.cuda.set_sync_debug_mode(0)
        _sync(device)
        # the first use of the debug mode also warns that it is a prototype: not a sync
        msgs = [str(w.message) for w in caught if "synchroniz" in str(w.message).lower()
                and "prototype feature" not in str(w.message)]
        out["syncs_cuda_warn"] = len(msgs)
        out["cuda_warn_first"] = msgs[0][:200] if msgs else None
    return out


def _layer_rows(rows: dict, times: dict) -> dict:
    """The per-unit rows of a block from the timings so far (softmax's rounds are the
    reference of each round's ratio)."""
    out = {}
    base = [statistics.median(t) for t in times.get("softmax", [])]
    for u, row in rows.items():
        per_round = times.get(u) or []
        if per_round:
            med = [statistics.median(t) for t in per_round]
            flat = [v for t in per_round for v in t]
            row = {**row, "median_s": statistics.median(med), "min_s": min(flat),
                   "max_s": max(flat), "round_medians_s": med}
            if len(base) == len(med):
                ratios = [m / b for m, b in zip(med, base)]
                row.update(ratio_to_softmax=statistics.median(ratios), ratio_min=min(ratios),
                           ratio_max=max(ratios))
        out[u] = row or None
    return out


def _layer_block(units: dict, n: int, precision: str, plan: dict, device, deadline: float,
                 part: Part, key: str) -> None:
    """Every unit at one N and precision: interleaved rounds against softmax (the block saved
    after each round), then peak memory and syncs of one step each."""
    import torch

    from gpattn_ppl.run.benchmarking import build_unit, layer_inputs, train_step

    rounds, repeats, warmup = plan["ns"][n]
    B, C, H = plan["B"], plan["C"], plan["H"]
    rows: dict[str, dict] = {u: {} for u in units}
    block = {"N": n, "precision": precision, "B": B, "C": C, "H": H, "rounds": 0,
             "repeats": repeats, "warmup": warmup, "units": {}}
    part.data["blocks"][key] = block
    steps = {}
    x, mask = layer_inputs(B, n, C, device=device)
    for u, spec in units.items():
        try:
            torch.manual_seed(0)
            steps[u] = train_step(build_unit(spec, C, H, device=device), x, mask,
                                  fast_path=True)
        except Exception as err:  # noqa: BLE001 -- OOM or any error: null, go on
            rows[u] = {"error": "build: " + _first_line(err)}
            _free(device)
    times: dict[str, list[list[float]]] = {u: [] for u in steps}
    for r in range(rounds):
        if r and time.perf_counter() > deadline:
            block["reason_rounds"] = f"{r} of {rounds} rounds (budget)"
            break
        for u in list(steps):
            try:
                times[u].append(_timed(steps[u], repeats, warmup if r == 0 else 1, device,
                                       precision))
            except Exception as err:  # noqa: BLE001
                rows[u] = {"error": _first_line(err)}
                del steps[u]
                times.pop(u, None)
                _free(device)
        block["rounds"] = r + 1
        block["units"] = _layer_rows(rows, times)
        part.save()
    for u in list(steps):
        if time.perf_counter() > deadline + GRACE_S / 3:
            rows[u]["probes"] = "skipped: over budget"
            continue
        try:
            rows[u].update(_step_probes(steps[u], device, precision))
        except Exception as err:  # noqa: BLE001
            rows[u]["probe_error"] = _first_line(err)
            _free(device)
    block["units"] = _layer_rows(rows, times)
    part.save()
    del steps, x, mask
    _free(device)


def section_layers(a, part: Part, deadline: float) -> None:
    import bench_units
    import torch

    from gpattn_ppl.run.allocator import keep_freed_memory

    if a.smoke:
        torch.set_num_threads(1)
    keep_freed_memory()
    device = _device()
    plan = _layer_plan(a.smoke, device.type == "cuda")
    names = ["softmax"] + [u for u in bench_units.UNITS if u != "softmax"]
    d = part.data
    d.update(device=str(device), B=plan["B"], C=plan["C"], H=plan["H"], units=names,
             plan={str(n): dict(zip(("rounds", "repeats", "warmup"), v))
                   for n, v in plan["ns"].items()},
             specs={u: bench_units.UNITS[u] for u in names}, blocks={})
    part.save()
    t0 = time.perf_counter()
    for n in plan["ns"]:
        for precision in ("fp32", "bf16"):
            key = f"{n}/{precision}"
            # a bf16 block costs about what the fp32 block of its N cost
            est = (d["blocks"].get(f"{n}/fp32") or {}).get("seconds", 0.0) * 0.8 \
                if precision == "bf16" else 0.0
            if time.perf_counter() + est > deadline:
                d["blocks"][key] = {"N": n, "precision": precision, "units": {},
                                    "reason": f"skipped: over the section's budget "
                                              f"({time.perf_counter() - t0:.0f} s used"
                                              + (f", about {est:.0f} s needed)" if est
                                                 else ")")}
                part.save()
                continue
            units = {u: bench_units.spec_at(bench_units.UNITS[u], n) for u in names}
            tb = time.perf_counter()
            _say(f"-- layers N={n} {precision}")
            _layer_block(units, n, precision, plan, device, deadline, part, key)
            d["blocks"][key]["seconds"] = round(time.perf_counter() - tb, 2)
            part.save()
    skipped = [k for k, blk in d["blocks"].items() if blk.get("reason")]
    if skipped:
        d["reason"] = f"over budget: skipped {', '.join(skipped)}"


# (c) ---------------------------------------------------------------------------------------------
def paper_presets() -> list[Path]:
    """The CIFAR-10 paper presets, ``softmax`` first then :data:`PRESET_ORDER`."""
    found = sorted((ROOT / "experiments" / "configs" / "cifar10_paper").glob("*.yaml"))

    def rank(p: Path) -> tuple[int, str]:
        name = p.stem
        return (PRESET_ORDER.index(name) if name in PRESET_ORDER else len(PRESET_ORDER), name)

    return sorted(found, key=rank)


def _cifar_preset(path: Path, overrides: list[str], device, warmup: int, steps: int) -> dict:
    import inspect
    from functools import partial

    import pyro
    import torch

    from gpattn_ppl.data.cifar import Normalize, augment
    from gpattn_ppl.data.dataset import ArrayDataset
    from gpattn_ppl.infer import fit_epoch
    from gpattn_ppl.infer.precision import autocast, grad_scaler
    from gpattn_ppl.run.assembly import model_and_program, parameter_groups
    from gpattn_ppl.run.config import load_config
    from gpattn_ppl.run.runtime import peak_memory_mb, seed_everything

    cfg = load_config(path, overrides)
    t, m = cfg["train"], cfg["model"]
    precision = t.get("precision", "fp32")
    bs = cfg["data"]["batch_size"]
    row = {"config": str(path.relative_to(ROOT)), "precision": precision, "batch_size": bs,
           "depth": m["depth"], "dim": m["dim"], "heads": m["heads"],
           "attention": m["attention"].get("kind"),
           "overrides": [o.get("attention", {}).get("kind") for o in m.get("overrides") or []]}
    pyro.clear_param_store()
    seed_everything(t["seed"])
    sizes = {"num_classes": 10, "input_kind": "image", "vocab_size": None, "feature_dim": None}
    net, _, program = model_and_program(cfg, sizes, TRAIN_IMAGES, device, 1, warm_start=False)
    opt_cls = torch.optim.AdamW if t["optimizer"] == "adamw" else torch.optim.Adam
    opt = opt_cls(parameter_groups(net, t), lr=t["lr"], weight_decay=t["weight_decay"],
                  fused=device.type in ("cpu", "cuda"))
    scaler = grad_scaler(precision, device)
    n_img = bs * (warmup + steps)
    g = torch.Generator().manual_seed(0)
    images = torch.randint(0, 256, (n_img, 3, 32, 32), dtype=torch.uint8, generator=g)
    labels = torch.randint(0, 10, (n_img,), generator=g)
    normalize = Normalize()
    train = ArrayDataset(images, labels, name="synthetic_cifar10_train",
                         augment=partial(augment, fill=normalize.black),
                         transform=normalize).to(device)
    spe = math.ceil(TRAIN_IMAGES / bs)
    gen = torch.Generator().manual_seed(1)
    order = torch.randperm(n_img, generator=gen)

    def batches(first: int, k: int):
        for i in range(first, first + k):
            yield train.batch(order[i * bs:(i + 1) * bs], train=True,
                              generator=gen).to(device)

    has_precision = "precision" in inspect.signature(fit_epoch).parameters
    kw = dict(grad_clip=t["grad_clip"], clock=lambda i: 1.0 + i / spe)
    if has_precision:
        kw.update(precision=precision, scaler=scaler)

    def fit(first: int, k: int, progress=None) -> dict:
        if has_precision:
            return fit_epoch(program, opt, batches(first, k), progress=progress, **kw)
        with autocast(precision, device):  # a fit loop without precision=
            return fit_epoch(program, opt, batches(first, k), progress=progress, **kw)

    fit(0, warmup)
    _sync(device)
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
    stamps = [time.perf_counter()]

    class Stamp:
        def update(self, _n: int) -> None:
            stamps.append(time.perf_counter())

    stats = fit(warmup, steps, Stamp())
    _sync(device)
    total = time.perf_counter() - stamps[0]
    diffs = [b - a for a, b in zip(stamps, stamps[1:])]
    med = statistics.median(diffs)
    row.update(warmup=warmup, steps=steps, median_step_s=med, min_step_s=min(diffs),
               max_step_s=max(diffs), mean_step_s=total / steps, steps_per_epoch=spe,
               epoch_s_projected=med * spe, epoch_s_projected_mean=total / steps * spe,
               peak_mib=peak_memory_mb(device),
               peak_kind="cuda max_memory_allocated" if device.type == "cuda"
               else "process max RSS", loss=stats.get("loss"),
               checked_reruns=stats.get("checked_reruns"),
               precision_via="fit_epoch(precision=)" if has_precision else "torch.autocast",
               params=sum(p.numel() for p in net.parameters()))
    return row


def section_cifar(a, part: Part, deadline: float) -> None:
    import torch

    from gpattn_ppl.run.allocator import keep_freed_memory

    if a.smoke:
        torch.set_num_threads(1)
    keep_freed_memory()
    device = _device()
    warmup, steps = (1, 2) if a.smoke else (5, 25)
    overrides = ["data.corruptions=null"]
    overrides += SMOKE_MODEL if a.smoke else []
    presets = paper_presets()
    d = part.data
    d.update(device=str(device), warmup=warmup, steps=steps, train_images=TRAIN_IMAGES,
             overrides=overrides, presets={})
    part.save()
    if not presets:
        d["status"], d["reason"] = "skipped", "no paper presets found"
        return
    last = 0.0
    skipped = []
    for path in presets:
        name = path.stem
        left = deadline - time.perf_counter()
        if left < last * 1.2 or left <= 0:
            d["presets"][name] = {"status": "skipped",
                                  "reason": f"over budget ({max(left, 0):.0f} s left, the last "
                                            f"preset took {last:.0f} s)"}
            skipped.append(name)
            part.save()
            continue
        _say(f"-- cifar preset {name}")
        tp = time.perf_counter()
        try:
            row = _cifar_preset(path, overrides, device, warmup, steps)
            row["status"] = "ok"
        except Exception as err:  # noqa: BLE001 -- recorded, next preset
            traceback.print_exc()
            row = {"status": "failed", "error": _first_line(err)}
        last = time.perf_counter() - tp
        row["seconds"] = round(last, 2)
        d["presets"][name] = row
        _free(device)
        part.save()
    if skipped:
        d["reason"] = f"over budget: skipped {', '.join(skipped)}"


# (d) ---------------------------------------------------------------------------------------------
def section_torchrun(a, part: Part, deadline: float) -> None:
    from gpattn_ppl.run.runtime import distributed_backend

    d = part.data
    env = _child_env(a.smoke)
    env["OMP_NUM_THREADS"] = "1"
    for k in ("WORLD_SIZE", "RANK", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_ADDR",
              "MASTER_PORT"):
        env.pop(k, None)
    saved = os.environ.pop("LOCAL_WORLD_SIZE", None)
    try:
        d["backend"] = distributed_backend(local_world_size=2)
    finally:
        if saved is not None:
            os.environ["LOCAL_WORLD_SIZE"] = saved
    d["backend_override"] = os.environ.get("GPATTN_DIST_BACKEND") or None
    config = "experiments/configs/cola/softmax.yaml"
    tmp = Path(tempfile.mkdtemp(prefix="device_check_ddp_"))
    try:
        run_dir = tmp / "run"
        cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone",
               "--nproc_per_node", "2", "-m", "gpattn_ppl.run.cli", "train", config,
               "--out", str(run_dir), "--set", *TINY_COLA]
        d["command"] = " ".join(["python", *cmd[1:]]).replace(str(tmp), "$TMP")
        part.save()
        t0 = time.perf_counter()
        rc, lines = _tee(cmd, deadline - time.perf_counter() - 2.0, env=env)
        d["torchrun_seconds"] = round(time.perf_counter() - t0, 2)
        d["torchrun_returncode"] = rc
        results = run_dir / "results.json"
        d["results_written"] = results.is_file()
        if results.is_file():
            r = json.loads(results.read_text())
            d["test_acc"] = (r.get("test") or {}).get("acc")
            d["sec_per_epoch"] = (r.get("cost") or {}).get("sec_per_epoch")
        if rc is None:
            d["status"], d["reason"] = "timeout", "torchrun ran past the section's budget"
        elif rc != 0 or not d["results_written"]:
            errs = [ln for ln in lines if "error" in ln.lower()]
            d["status"] = "failed"
            d["reason"] = f"torchrun exit {rc}" + (f": {errs[0][:200]}" if errs else "")
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
