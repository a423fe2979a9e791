"""Timing utilities shared by ``gpattn-ppl bench`` and the scripts in ``benchmarks/``.

Times are medians of repeated runs after warm-up (``torch.cuda.synchronize`` on GPU). Nothing
here is asserted by tests; results are written as JSON.
"""

from __future__ import annotations

import json
import math
import platform
import statistics
import time
from pathlib import Path

import torch

__all__ = ["time_fn", "layer_step_time", "loglog_slope", "machine_info", "write_json",
           "bench_layers"]


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def time_fn(fn, *, repeats: int = 20, warmup: int = 3, device: torch.device | str = "cpu"
            ) -> dict[str, float]:
    """Median / min / mean seconds of ``fn()`` over ``repeats`` runs after ``warmup`` runs."""
    device = torch.device(device)
    for _ in range(warmup):
        fn()
    _sync(device)
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        _sync(device)
        times.append(time.perf_counter() - t0)
    return {"median_s": statistics.median(times), "min_s": min(times),
            "mean_s": statistics.fmean(times), "repeats": repeats}


def layer_step_time(unit: torch.nn.Module, B: int, N: int, *, repeats: int = 20,
                    device: torch.device | str = "cpu", seed: int = 0) -> dict[str, float]:
    """Forward + backward time of one attention unit on ``x: [B, N, C]`` with a full mask."""
    device = torch.device(device)
    g = torch.Generator().manual_seed(seed)
    unit = unit.to(device).train()
    x = torch.randn(B, N, unit.dim, generator=g).to(device).requires_grad_(True)
    mask = torch.ones(B, N, dtype=torch.bool, device=device)

    def step():
        out = unit(x, mask)
        loss = out.square().mean() + sum(v.sum() for v in unit.objective_terms().values())
        loss.backward()
        unit.zero_grad(set_to_none=True)
        x.grad = None

    return time_fn(step, repeats=repeats, device=device)


def loglog_slope(ns: list[int], times: list[float]) -> float:
    """Least-squares slope of log(time) against log(N)."""
    lx = [math.log(n) for n in ns]
    ly = [math.log(t) for t in times]
    mx, my = statistics.fmean(lx), statistics.fmean(ly)
    return sum((a - mx) * (b - my) for a, b in zip(lx, ly)) / sum((a - mx) ** 2 for a in lx)


def machine_info() -> dict:
    """What the numbers were measured on."""
    info = {"python": platform.python_version(), "torch": torch.__version__,
            "machine": platform.machine(), "threads": torch.get_num_threads(),
            "device": "cpu"}
    if torch.cuda.is_available():
        info["device"] = torch.cuda.get_device_name()
    return info


def write_json(obj: dict, path: str | Path) -> Path:
    """Write ``obj`` (plus machine info) as indented JSON; returns the path."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    obj = {"machine": machine_info(), **obj}
    path.write_text(json.dumps(obj, indent=1))
    return path


def bench_layers(kinds: list[dict], *, B: int = 32, N: int = 64, dim: int = 128, heads: int = 4,
                 repeats: int = 20, device: str = "cpu") -> dict:
    """Forward+backward time of each attention spec, and its ratio to softmax in the same run."""
    from .attention import build_attention

    torch.manual_seed(0)
    base = layer_step_time(build_attention("softmax", dim, heads), B, N, repeats=repeats,
                           device=device)
    rows = []
    for spec in kinds:
        spec = dict(spec)
        kind = spec.pop("kind")
        r = layer_step_time(build_attention(kind, dim, heads, **spec), B, N, repeats=repeats,
                            device=device)
        rows.append({"kind": kind, "options": spec, **r,
                     "ratio_to_softmax": r["median_s"] / base["median_s"]})
    return {"B": B, "N": N, "C": dim, "H": heads, "softmax": base, "layers": rows}
