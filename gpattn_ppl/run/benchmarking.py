"""Timing utilities shared by ``gpattn-ppl bench`` and the scripts in ``benchmarks/``.

Times are medians of repeated runs after warm-up (``torch.cuda.synchronize`` on GPU). Nothing
here is asserted by tests; results are written as JSON. :func:`peak_memory` (the tensor memory
of one call) watches the aten ops through a ``torch.utils._python_dispatch.TorchDispatchMode``.
"""

from __future__ import annotations

import argparse
import gc
import math
import platform
import statistics
import time
import weakref
from pathlib import Path

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten

__all__ = ["time_fn", "split_spec", "build_unit", "layer_inputs", "train_step", "layer_step_time",
           "spec_step_time", "time_against_softmax", "round_summary", "loglog_slope",
           "machine_info", "write_json", "bench_layers", "bench_specs", "bench_arg_parser",
           "bench_device",
           "peak_memory", "provenance"]


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def time_fn(fn, *, repeats: int = 20, warmup: int = 3, device: torch.device | str = "cpu"
            ) -> dict[str, float]:
    """Median / min / mean seconds of ``fn()`` over ``repeats`` runs after ``warmup`` runs.

    :raises ValueError: ``repeats < 1`` or ``warmup < 0``."""
    if isinstance(repeats, bool) or not isinstance(repeats, int) or repeats < 1:
        raise ValueError(f"repeats must be a positive integer, got {repeats!r}")
    if isinstance(warmup, bool) or not isinstance(warmup, int) or warmup < 0:
        raise ValueError(f"warmup must be a non-negative integer, got {warmup!r}")
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


def split_spec(spec: dict) -> tuple[str, dict]:
    """``{"kind": k, **options}`` -> ``(k, options)``, leaving ``spec`` unchanged."""
    return spec["kind"], {k: v for k, v in spec.items() if k != "kind"}


def build_unit(spec: dict, dim: int, heads: int, *, device: torch.device | str = "cpu"
               ) -> torch.nn.Module:
    """The attention unit described by ``spec = {"kind": ..., **options}``, on ``device``, in
    train mode."""
    from ..attention import build_attention

    kind, options = split_spec(spec)
    return build_attention(kind, dim, heads, **options).to(device).train()


def layer_inputs(B: int, N: int, dim: int, *, device: torch.device | str = "cpu", seed: int = 0
                 ) -> tuple[torch.Tensor, torch.Tensor]:
    """``x: [B, N, dim]`` (standard normal from a CPU generator seeded with ``seed``, requiring
    grad) and a full ``[B, N]`` boolean mask, both on ``device``."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(B, N, dim, generator=g).to(device).requires_grad_(True)
    return x, torch.ones(B, N, dtype=torch.bool, device=device)


def train_step(unit: torch.nn.Module, x: torch.Tensor, mask: torch.Tensor, *,
               fast_path: bool = False):
    """A closure running one benchmark step of ``unit``: ``unit(x, mask)`` ->
    ``mean(out^2) + sum(objective terms)`` -> ``backward``, then the gradients are cleared.

    :param fast_path: run the step as the fit loop's fast path does: argument checks off and
        factorisations unchecked (:class:`~gpattn_ppl.linalg.deferred_checks`).
    """
    from .. import linalg, settings

    def run():
        out = unit(x, mask)
        loss = out.square().mean() + sum(v.sum() for v in unit.objective_terms().values())
        loss.backward()
        unit.zero_grad(set_to_none=True)
        x.grad = None

    def step():
        if not fast_path:
            return run()
        with linalg.deferred_checks(), settings.validate_args(False):
            return run()

    return step


def provenance(argv: list[str] | None, root: str | Path) -> dict:
    """The git revision of the checkout at ``root`` (``git describe --always --dirty``, ``None``
    outside git) and the command line of this run (``argv``: default ``sys.argv[1:]``)."""
    import shlex
    import subprocess
    import sys

    try:
        rev = subprocess.run(["git", "describe", "--always", "--dirty"], cwd=root, check=True,
                             capture_output=True, text=True, timeout=30).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        rev = None
    args = sys.argv[1:] if argv is None else list(argv)
    return {"git_revision": rev, "command": shlex.join(["python", sys.argv[0], *args])}


def layer_step_time(unit: torch.nn.Module, B: int, N: int, *, repeats: int = 20, warmup: int = 3,
                    device: torch.device | str = "cpu", seed: int = 0, timer=time_fn) -> dict:
    """Forward + backward time of one attention unit on ``x: [B, N, C]`` with a full mask.

    ``timer(fn, repeats=, warmup=, device=)`` measures the step (default :func:`time_fn`); its
    result is returned.
    """
    device = torch.device(device)
    unit = unit.to(device).train()
    x, mask = layer_inputs(B, N, unit.dim, device=device, seed=seed)
    return timer(train_step(unit, x, mask), repeats=repeats, warmup=warmup, device=device)


def spec_step_time(spec: dict, B: int, N: int, dim: int, heads: int, *, repeats: int = 20,
                   warmup: int = 3, device: torch.device | str = "cpu", seed: int = 0,
                   timer=time_fn) -> dict:
    """:func:`layer_step_time` of the unit built from ``spec`` after ``torch.manual_seed(seed)``;
    the unit and its inputs are freed on return (useful for series over growing N)."""
    torch.manual_seed(seed)
    return layer_step_time(build_unit(spec, dim, heads), B, N, repeats=repeats, warmup=warmup,
                           device=device, seed=seed, timer=timer)


def time_against_softmax(specs: list[dict], *, B: int, N: int, dim: int, heads: int, rounds: int,
                         repeats: int, warmup: int = 2, device: torch.device | str = "cpu",
                         timer=time_fn, keys: tuple[str, ...] = ("median_s",)) -> list[dict]:
    """Time softmax and each of ``specs`` in interleaved rounds; per-round ratios to softmax.

    The units (softmax first, then ``specs``, built after ``torch.manual_seed(0)``) share one
    input from :func:`layer_inputs`. Each of the ``rounds`` rounds times every unit in turn with
    ``timer(step, repeats=repeats, warmup=warmup, device=device)`` on :func:`train_step`, so a
    change of load on a shared machine hits all units alike; a unit's ratio in a round is its
    time over softmax's time in that same round.

    :param keys: entries of the timer's result to record (default: :func:`time_fn`'s median).
    :returns: one row per unit, softmax first: ``{"kind", "options", "rounds": {key: [value per
        round]}, "ratios": {key: [ratio to softmax per round]}}``; see :func:`round_summary`.
    """
    device = torch.device(device)
    specs = [{"kind": "softmax"}] + list(specs)
    x, mask = layer_inputs(B, N, dim, device=device)
    torch.manual_seed(0)
    steps = [train_step(build_unit(spec, dim, heads, device=device), x, mask) for spec in specs]
    times = [{k: [] for k in keys} for _ in specs]
    for _ in range(rounds):
        for step, t in zip(steps, times):
            r = timer(step, repeats=repeats, warmup=warmup, device=device)
            for k in keys:
                t[k].append(r[k])
    rows = []
    for spec, t in zip(specs, times):
        kind, options = split_spec(spec)
        rows.append({"kind": kind, "options": options, "rounds": t,
                     "ratios": {k: [a / b for a, b in zip(t[k], times[0][k])] for k in keys}})
    return rows


def round_summary(row: dict, key: str = "median_s") -> dict:
    """A row of :func:`time_against_softmax` as written to JSON: ``kind``, ``options``,
    ``median_s`` (median over rounds of ``key``), ``round_medians_s`` (the per-round values) and
    ``ratio_to_softmax`` (median over rounds of the per-round ratio)."""
    return {"kind": row["kind"], "options": row["options"],
            "median_s": statistics.median(row["rounds"][key]),
            "round_medians_s": row["rounds"][key],
            "ratio_to_softmax": statistics.median(row["ratios"][key])}


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
    """Write ``obj`` (plus machine info) as indented strict JSON (non-finite numbers become
    ``null``); returns the path."""
    from ..safe_files import write_atomic
    from .output import dumps

    obj = {"machine": machine_info(), **obj}
    return write_atomic(path, dumps(obj) + "\n")  # never through a link, atomic


_SPEC_EXAMPLE = '\'{"kind": "kernel", "symmetric": true}\''


def bench_specs(words: list[str], dim: int | None = None, heads: int | None = None
                ) -> list[dict]:
    """The attention specs of ``gpattn-ppl bench``'s words: a kind name (``sgpa``) or a JSON
    object with a ``"kind"`` key and the unit's options (``{"kind": "kernel", "symmetric":
    true}``), each checked against the attention registry (kind, option names and types);
    given ``dim`` and ``heads``, each unit is also built once (RNG state kept), so that its own
    rules on the values (``temperature must be > 0``) fail here.

    :raises ~gpattn_ppl.schema.ConfigError: naming the word as ``kinds[i]``: invalid JSON,
        not an object, no ``"kind"``, an unknown kind or option, a value of the wrong type or
        refused by the unit.
    """
    import json

    from ..models.spec import check_attention
    from ..schema import ConfigError

    specs = []
    for i, word in enumerate(words):
        where = f"kinds[{i}]"
        if word.lstrip().startswith("{"):
            try:
                spec = json.loads(word)
            except json.JSONDecodeError as err:
                raise ConfigError(f"{where}: {word!r} is not valid JSON ({err.msg}, column "
                                  f"{err.colno}); e.g. {_SPEC_EXAMPLE}") from None
            if not isinstance(spec, dict) or "kind" not in spec:
                raise ConfigError(f"{where}: {word!r} has no \"kind\" key; e.g. {_SPEC_EXAMPLE}")
        else:
            spec = {"kind": word}
        spec = check_attention(spec, where)
        if dim is not None and heads is not None:
            with torch.random.fork_rng(devices=[]):
                try:
                    build_unit(spec, dim, heads)
                except (ValueError, TypeError) as err:
                    raise ConfigError(f"{where} (kind {spec['kind']!r}): {err}") from None
        specs.append(spec)
    return specs


def bench_layers(kinds: list[dict], *, B: int = 32, N: int = 64, dim: int = 128, heads: int = 4,
                 repeats: int = 20, device: str = "cpu") -> dict:
    """Forward+backward time of each attention spec, and its ratio to softmax in the same run.

    :raises ValueError: a size or ``repeats`` that is not a positive integer, or ``dim`` not a
        multiple of ``heads``."""
    for name, value in (("B", B), ("N", N), ("dim", dim), ("heads", heads),
                        ("repeats", repeats)):
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ValueError(f"{name} must be a positive integer, got {value!r}")
    if dim % heads:
        raise ValueError(f"dim ({dim}) must be a multiple of heads ({heads})")
    base = spec_step_time({"kind": "softmax"}, B, N, dim, heads, repeats=repeats, device=device)
    rows = []
    for spec in kinds:
        kind, options = split_spec(spec)
        r = spec_step_time(spec, B, N, dim, heads, repeats=repeats, device=device)
        rows.append({"kind": kind, "options": options, **r,
                     "ratio_to_softmax": r["median_s"] / base["median_s"]})
    return {"B": B, "N": N, "C": dim, "H": heads, "softmax": base, "layers": rows}


def bench_arg_parser(description: str, *, rounds: int, repeats: int, out: str
                     ) -> argparse.ArgumentParser:
    """The options shared by the interleaved-rounds scripts in ``benchmarks/``: the layer setting
    ``--B --N --C --H`` (default 32, 64, 128, 4), ``--rounds``, ``--repeats``, ``--device``,
    ``--threads``, ``--smoke`` and ``--out``; a script adds its own options to the result."""
    p = argparse.ArgumentParser(description=description)
    p.add_argument("--B", type=int, default=32)
    p.add_argument("--N", type=int, default=64)
    p.add_argument("--C", type=int, default=128)
    p.add_argument("--H", type=int, default=4)
    p.add_argument("--rounds", type=int, default=rounds)
    p.add_argument("--repeats", type=int, default=repeats)
    p.add_argument("--device", default="cpu")
    p.add_argument("--threads", type=int, default=1,
                   help="torch intra-op threads (1 keeps timings stable on a shared machine)")
    p.add_argument("--smoke", action="store_true")
    p.add_argument("--out", default=out)
    return p


def bench_device(args: argparse.Namespace) -> torch.device:
    """Apply ``--threads`` (when positive) and return the ``--device`` of
    :func:`bench_arg_parser`'s arguments."""
    if args.threads > 0:
        from .runtime import usable_cpus

        torch.set_num_threads(min(args.threads, usable_cpus()))  # a huge count crashes OpenMP
    return torch.device(args.device)


# -- memory and host synchronisations, seen at the aten level -------------------------------------
def _tensors(tree) -> list[torch.Tensor]:
    return [t for t in tree_flatten(tree)[0] if isinstance(t, torch.Tensor)]


def _storage(t: torch.Tensor):
    """``t``'s untyped storage, or ``None`` for tensors without one (sparse, nested, ...)."""
    try:
        return t.untyped_storage()
    except (RuntimeError, NotImplementedError, TypeError):
        return None


def _storage_key(s) -> tuple[str, int]:
    return str(s.device), s.data_ptr()


class _AllocationTracker(TorchDispatchMode):
    """The storages of the outputs of every aten op (forward and backward) that are not storages
    of the op's inputs and not already tracked: their running total of bytes, its peak and the
    largest one; a ``weakref.finalize`` on each storage takes it off the total when it is freed."""

    def __init__(self) -> None:
        super().__init__()
        self.live: dict[tuple[str, int], int] = {}
        self.current = 0
        self.peak = 0
        self.largest: dict | None = None
        self._finalizers: list[weakref.finalize] = []

    def _free(self, key: tuple[str, int]) -> None:
        self.current -= self.live.pop(key, 0)

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        out = func(*args, **kwargs)
        inputs = {_storage_key(s) for s in map(_storage, _tensors((args, kwargs))) if s is not None}
        for t in _tensors(out):
            s = _storage(t)
            if s is None or s.device.type == "meta":
                continue
            key, nbytes = _storage_key(s), s.nbytes()
            if nbytes == 0 or key in self.live or key in inputs:  # a view, in place, or empty
                continue
            self.live[key] = nbytes
            self.current += nbytes
            self.peak = max(self.peak, self.current)
            if self.largest is None or nbytes > self.largest["bytes"]:
                self.largest = {"shape": list(t.shape), "bytes": nbytes}
            self._finalizers.append(weakref.finalize(s, self._free, key))
        return out

    def detach(self) -> None:
        """Stop watching the storages still alive (they stay counted in ``peak``)."""
        for f in self._finalizers:
            f.detach()
        self._finalizers.clear()


def peak_memory(fn, device: torch.device | str = "cpu") -> dict:
    """Run ``fn()`` once; the peak tensor memory it allocated and its largest tensor.

    Counted: the storages of tensors created by aten ops inside ``fn`` -- forward and backward,
    autograd's saved tensors and gradients included -- while they are alive (a freed
    intermediate counts towards the peak until it is freed). A view or an in-place result shares
    its input's storage and is not counted again; storages that existed before ``fn`` (inputs,
    parameters, their in-place updates) do not count. What ``fn`` allocates and keeps (a
    returned tensor, ``.grad``) counts.

    * CPU: the running total of those storages' ``nbytes`` (no allocator fragmentation or
      rounding, no workspace a kernel allocates and frees internally, no Python objects);
    * CUDA: ``torch.cuda.max_memory_allocated`` minus the memory allocated before ``fn``, i.e.
      what the caching allocator handed out (block rounding and library workspaces included,
      its reserved-but-free cache excluded).

    :returns: ``{"peak_bytes": int, "largest_tensor": {"shape": [...], "bytes": int}}``: the
        largest single storage allocated inside ``fn`` and the shape of the tensor that
        created it (``{"shape": None, "bytes": 0}`` if ``fn`` allocated nothing).
    """
    device = torch.device(device)
    tracker = _AllocationTracker()
    try:
        if device.type == "cuda":
            # garbage of earlier work freed inside fn would lower the baseline under the peak
            gc.collect()
            torch.cuda.synchronize(device)
            torch.cuda.reset_peak_memory_stats(device)
            before = torch.cuda.memory_allocated(device)
            with tracker:
                fn()
            torch.cuda.synchronize(device)
            peak = torch.cuda.max_memory_allocated(device) - before
        else:
            with tracker:
                fn()
            peak = tracker.peak
    finally:
        tracker.detach()
    return {"peak_bytes": int(peak),
            "largest_tensor": tracker.largest or {"shape": None, "bytes": 0}}
