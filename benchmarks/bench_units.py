"""Every attention unit against softmax: per-layer time ratios, scaling in N and peak memory.

One script for the table of per-layer targets (per layer, forward + backward in train mode, ratio
to our softmax layer of the same run at N = 64 and N = 256, B = 32, C = 128, H = 4):

* ``ratios``: for each N of ``--ratio-ns`` the units are timed in interleaved rounds
  (:func:`~gpattn_ppl.run.benchmarking.time_against_softmax`: softmax, then each unit,
  ``--repeats`` steps each, fewer at long N); a unit's ratio is the median over ``--rounds`` of
  the per-round ratio of medians, with the spread (min, max) of the per-round ratios; targets
  of :data:`TARGETS` are checked at every N;
* ``scaling``: time per sequence at batch ``--scaling-B`` for N in ``--scaling-ns`` and the
  least-squares log-log slope (over all N and over the last two); a unit that runs out of
  memory at an N gets ``null`` there;
* ``memory``: :func:`~gpattn_ppl.run.benchmarking.peak_memory` of one train step at batch
  ``--B`` for each N of ``--ratio-ns`` (tensor bytes on CPU, the caching allocator's peak on
  CUDA), its largest tensor, and the ratio to softmax's peak;
* ``masks``: for each N of ``--mask-ns`` (batch ``--mask-B``, default ``B * 64 // N``) every
  unit, softmax included, is timed with the mask of ``--mask`` and with ``mask=None`` on the
  same input, all in interleaved rounds in one process: the per-round ratio masked / mask-free
  of each unit, and each unit's ratio to softmax with and without the mask (median over rounds,
  with the spread).

``--mask`` chooses the mask of the memory and masks sections: ``full`` (all-true, the default),
``none`` (``mask=None``; the masks section then compares ``full``) or ``pad`` (the last eighth
of every second sequence padded: real padding, the same shapes). The ratio and scaling tables
always use the all-true mask.

A step is ``unit(x, mask)`` -> ``mean(out^2) + sum(objective terms)`` -> ``backward``. On CUDA
(``--device auto`` picks it when available) the defaults become B = 64 and N in {256, 1024}.
Writes ``benchmarks/results/units.json`` (git revision and command line included); prints a
compact table. Nothing here is asserted by tests.

    python benchmarks/bench_units.py                          # full setting
    python benchmarks/bench_units.py --units softmax cgpt     # a subset
    python benchmarks/bench_units.py --sections ratios        # only the ratio table
    python benchmarks/bench_units.py --smoke                  # tiny sizes, JSON to a temp file
    python benchmarks/bench_units.py --sections masks --threads 1 --rounds 9  # masked vs free
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch

from gpattn_ppl.run.allocator import keep_freed_memory
from gpattn_ppl.run.benchmarking import (
    bench_device,
    build_unit,
    layer_inputs,
    loglog_slope,
    peak_memory,
    provenance,
    round_summary,
    spec_step_time,
    time_against_softmax,
    time_fn,
    train_step,
    write_json,
)

#: placeholder of an option equal to the sequence length N (specs are built per N)
SEQ = "<N>"

UNITS: dict[str, dict] = {
    "softmax": {"kind": "softmax"},
    "kernel_sym": {"kind": "kernel", "symmetric": True},
    "kernel_asym": {"kind": "kernel", "symmetric": False},
    "kep_add": {"kind": "kep_svgp", "rank": 10},
    "kep_concat": {"kind": "kep_svgp", "rank": 10, "merge": "concat", "seq_len": SEQ},
    "sgpa_dec_full": {"kind": "sgpa"},
    "sgpa_dec_diag": {"kind": "sgpa", "cov": "diag"},
    "sgpa_std": {"kind": "sgpa", "variant": "standard", "max_len": SEQ},
    "cgpt": {"kind": "cgpt"},
    "scgpt": {"kind": "scgpt", "num_inducing": 8},
    "gumbel": {"kind": "gumbel"},
    "h_gumbel": {"kind": "h_gumbel", "num_centroids": 16},
}

#: unit -> {quantity: (comparison, bound)}: ``ratio`` (time over softmax, at every N of the
#: ratio table), ``ratio_stretch`` (a stretch goal), ``slope`` (log-log slope of the scaling
#: series over all N)
TARGETS: dict[str, dict[str, tuple[str, float]]] = {
    "cgpt": {"ratio": ("<=", 6.0), "ratio_stretch": ("<=", 4.0)},
    "scgpt": {"ratio": ("<=", 2.0), "slope": ("<", 2.0)},
    "sgpa_dec_full": {"ratio": ("<=", 2.0)},
    "h_gumbel": {"ratio": ("<=", 1.25)},
    "gumbel": {"ratio": ("<=", 1.15)},
    "kep_concat": {"ratio": ("<=", 1.1), "slope": ("<=", 1.15)},
    "kep_add": {"ratio": ("<=", 1.05), "slope": ("<=", 1.15)},
}


def make_mask(kind: str, B: int, N: int, device: torch.device) -> torch.Tensor | None:
    """The ``[B, N]`` mask of ``--mask``: ``full`` all true, ``none`` ``None``, ``pad`` the last
    ``max(1, N // 8)`` tokens of every second sequence padded."""
    if kind == "none":
        return None
    mask = torch.ones(B, N, dtype=torch.bool, device=device)
    if kind == "pad":
        mask[1::2, N - max(1, N // 8):] = False
    return mask


def spec_at(spec: dict, n: int) -> dict:
    """``spec`` with every :data:`SEQ` option set to ``n``."""
    return {k: (n if v == SEQ else v) for k, v in spec.items()}


def check(target: tuple[str, float] | None, value: float | None) -> bool | None:
    """Whether ``value`` meets ``target`` (``None`` without a target or a value)."""
    if target is None or value is None:
        return None
    op, bound = target
    return value < bound if op == "<" else value <= bound


def _is_oom(err: BaseException) -> bool:
    return isinstance(err, torch.OutOfMemoryError) or (
        isinstance(err, RuntimeError) and "out of memory" in str(err).lower())


def _free(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.empty_cache()


def _ratio_row(name: str, row: dict) -> dict:
    out = {"unit": name, **round_summary(row)}
    ratios = row["ratios"]["median_s"]
    out.update(ratio_min=min(ratios), ratio_max=max(ratios),
               min_s=statistics.median(row["rounds"]["min_s"]))
    for key in ("ratio", "ratio_stretch"):
        target = TARGETS.get(name, {}).get(key)
        suffix = key.removeprefix("ratio")
        out[f"target{suffix}"] = list(target) if target else None
        out[f"pass{suffix}"] = check(target, out["ratio_to_softmax"])
    return out


def ratios_section(a, units: list[str], device: torch.device) -> dict:
    """Per N: the interleaved-rounds ratio table of ``units`` (softmax first, always)."""
    others = [u for u in units if u != "softmax"]
    out = {}
    for n in a.ratio_ns:
        repeats = min(a.repeats, max(3, a.repeats * 64 // n))
        kw = dict(B=a.B, N=n, dim=a.C, heads=a.H, rounds=a.rounds, repeats=repeats,
                  device=device, keys=("median_s", "min_s"))
        rows: dict[str, dict | None] = {}
        try:
            got = time_against_softmax([spec_at(UNITS[u], n) for u in others], **kw)
            rows = dict(zip(["softmax"] + others, got))
        except RuntimeError as err:  # one unit out of memory: time the others one by one
            if not _is_oom(err):
                raise
            _free(device)
            for u in others:
                try:
                    base, row = time_against_softmax([spec_at(UNITS[u], n)], **kw)
                    rows.setdefault("softmax", base)
                    rows[u] = row
                except RuntimeError as err_u:
                    if not _is_oom(err_u):
                        raise
                    rows[u] = None
                    _free(device)
        out[str(n)] = {"B": a.B, "N": n, "C": a.C, "H": a.H, "rounds": a.rounds,
                       "repeats": repeats,
                       "units": {u: (None if rows.get(u) is None else _ratio_row(u, rows[u]))
                                 for u in ["softmax"] + others}}
        _free(device)
    return out


def scaling_section(a, units: list[str], device: torch.device) -> dict:
    """Per unit: time per sequence against N and its log-log slopes (``None`` where out of
    memory)."""
    ns = list(a.scaling_ns)
    out = {}
    for u in units:
        per_seq: list[float | None] = []
        for n in ns:
            try:
                r = spec_step_time(spec_at(UNITS[u], n), a.scaling_B, n, a.C, a.H, warmup=1,
                                   repeats=min(a.repeats, max(2, a.repeats * 64 // n)),
                                   device=device)
                per_seq.append(r["median_s"] / a.scaling_B)
            except RuntimeError as err:
                if not _is_oom(err):
                    raise
                per_seq.append(None)
            _free(device)
        pts = [(n, t) for n, t in zip(ns, per_seq) if t is not None]
        slope = loglog_slope(*zip(*pts)) if len(pts) > 1 else None
        last_two = (loglog_slope(ns[-2:], per_seq[-2:])
                    if len(ns) > 2 and None not in per_seq[-2:] else None)
        target = TARGETS.get(u, {}).get("slope")
        out[u] = {"N": ns, "s_per_sequence": per_seq, "loglog_slope": slope,
                  "loglog_slope_last_two": last_two, "target": list(target) if target else None,
                  "pass": check(target, slope), "pass_last_two": check(target, last_two)}
    return {"B": a.scaling_B, "C": a.C, "H": a.H, "series": out}


def memory_section(a, units: list[str], device: torch.device) -> dict:
    """Per N: the peak memory of one train step of each unit (and of softmax, the reference)."""
    out = {}
    for n in a.ratio_ns:
        rows: dict[str, dict | None] = {}
        for u in ["softmax"] + [u for u in units if u != "softmax"]:
            try:
                torch.manual_seed(0)
                unit = build_unit(spec_at(UNITS[u], n), a.C, a.H, device=device)
                x, _ = layer_inputs(a.B, n, a.C, device=device)
                step = train_step(unit, x, make_mask(a.mask, a.B, n, device))
                if device.type == "cuda":
                    step()  # lazy allocations (library workspaces) before the measured step
                r = peak_memory(step, device)
                rows[u] = {"peak_bytes": r["peak_bytes"], "peak_mib": r["peak_bytes"] / 2**20,
                           "largest_tensor": r["largest_tensor"]}
                del unit, x, step
            except RuntimeError as err:
                if not _is_oom(err):
                    raise
                rows[u] = None
            _free(device)
        base = (rows["softmax"] or {}).get("peak_bytes")
        for r in rows.values():
            if r is not None:
                r["ratio_to_softmax"] = r["peak_bytes"] / base if base else None
        out[str(n)] = {"B": a.B, "N": n, "C": a.C, "H": a.H, "units": rows}
    return out


def _interleaved(steps: list, rounds: int, repeats: int, warmup: int,
                 device: torch.device) -> list[list[float]]:
    """Median seconds of each of ``steps`` per round, the steps timed in turn in every round
    (the order rotated by one each round, so no step always follows the same one)."""
    times: list[list[float]] = [[] for _ in steps]
    for r in range(rounds):
        order = list(range(len(steps)))
        order = order[r % len(order):] + order[: r % len(order)]
        for i in order:
            times[i].append(time_fn(steps[i], repeats=repeats, warmup=warmup,
                                    device=device)["median_s"])
    return times


def _spread(values: list[float]) -> dict:
    return {"median": statistics.median(values), "min": min(values), "max": max(values)}


def masks_section(a, units: list[str], device: torch.device) -> dict:
    """Per N of ``--mask-ns``: each unit with the ``--mask`` mask and with ``mask=None`` on the
    same input, all in interleaved rounds (softmax included); ratios per round."""
    out = {}
    for n in a.mask_ns:
        B = a.mask_B or max(1, a.B * 64 // n)
        repeats = min(a.repeats, max(3, a.repeats * 64 // n))
        x, _ = layer_inputs(B, n, a.C, device=device)
        mask = make_mask(a.mask if a.mask != "none" else "full", B, n, device)
        names = ["softmax"] + [u for u in units if u != "softmax"]
        steps, t0 = [], time.perf_counter()
        for u in names:
            torch.manual_seed(0)
            unit = build_unit(spec_at(UNITS[u], n), a.C, a.H, device=device)
            steps += [train_step(unit, x, mask), train_step(unit, x, None)]
        times = _interleaved(steps, a.rounds, repeats, 1, device)
        soft_m, soft_f = times[0], times[1]
        rows = {}
        for i, u in enumerate(names):
            tm, tf = times[2 * i], times[2 * i + 1]
            rows[u] = {"masked_s": statistics.median(tm), "free_s": statistics.median(tf),
                       "masked_over_free": _spread([m / f for m, f in zip(tm, tf)]),
                       "ratio_masked": _spread([m / s for m, s in zip(tm, soft_m)]),
                       "ratio_free": _spread([f / s for f, s in zip(tf, soft_f)]),
                       "round_masked_s": tm, "round_free_s": tf}
        out[str(n)] = {"B": B, "N": n, "C": a.C, "H": a.H, "rounds": a.rounds,
                       "repeats": repeats, "mask": a.mask if a.mask != "none" else "full",
                       "wall_s": time.perf_counter() - t0, "units": rows}
        del steps
        _free(device)
    return out


def print_masks(res: dict) -> None:
    for n, table in (res.get("masks") or {}).items():
        print(f"N = {n}, B = {table['B']}, mask {table['mask']}: ratio to softmax (masked / "
              "free), masked over mask-free [min, max]")
        for u, r in table["units"].items():
            mo = r["masked_over_free"]
            print(f"  {u:14s} {r['ratio_masked']['median']:7.2f} {r['ratio_free']['median']:7.2f}"
                  f"   {mo['median']:.3f} [{mo['min']:.3f}, {mo['max']:.3f}]")


def _verdict(name: str, res: dict) -> str:
    """PASS / FAIL over every checked target of ``name`` (``-`` without one)."""
    checks = []
    for table in (res.get("ratios") or {}).values():
        row = table["units"].get(name)
        if row is not None:
            checks.append(row["pass"])
    series = ((res.get("scaling") or {}).get("series") or {}).get(name)
    if series is not None:
        checks.append(series["pass"])
    checks = [c for c in checks if c is not None]
    return "-" if not checks else ("PASS" if all(checks) else "FAIL")


def print_table(res: dict, units: list[str]) -> None:
    ratios, memory = res.get("ratios") or {}, res.get("memory") or {}
    series = (res.get("scaling") or {}).get("series") or {}
    head = (f"{'unit':14s}" + "".join(f" {'ratio@' + n:>10s}" for n in ratios)
            + f" {'slope':>6s}" + "".join(f" {'MiB@' + n:>9s}" for n in memory) + "  target")
    print(head)

    def fmt(v, spec):
        return f"{v:{spec}}" if v is not None else "-"

    for u in ["softmax"] + [u for u in units if u != "softmax"]:
        line = f"{u:14s}"
        for table in ratios.values():
            row = table["units"].get(u)
            line += f" {fmt(row and row['ratio_to_softmax'], '.2f'):>10s}"
        line += f" {fmt((series.get(u) or {}).get('loglog_slope'), '.2f'):>6s}"
        for table in memory.values():
            row = table["units"].get(u)
            line += f" {fmt(row and row['peak_mib'], '.1f'):>9s}"
        print(line + f"  {_verdict(u, res)}")


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--B", type=int, default=None,
                   help="batch of the ratio and memory tables (default 32; 64 on CUDA)")
    p.add_argument("--C", type=int, default=128)
    p.add_argument("--H", type=int, default=4)
    p.add_argument("--ratio-ns", type=int, nargs="+", default=None,
                   help="N of the ratio and memory tables (default 64 256; 256 1024 on CUDA)")
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--repeats", type=int, default=10,
                   help="timed steps per unit and round at N <= 64 (fewer at longer N)")
    p.add_argument("--scaling-B", type=int, default=4)
    p.add_argument("--scaling-ns", type=int, nargs="+", default=[64, 256, 1024])
    p.add_argument("--sections", nargs="+", choices=["ratios", "scaling", "memory", "masks"],
                   default=["ratios", "scaling", "memory"])
    p.add_argument("--mask", choices=["full", "none", "pad"], default="full",
                   help="the mask of the memory and masks sections: all-true (default), None, or "
                        "real padding (the masks section compares it with None)")
    p.add_argument("--mask-ns", type=int, nargs="+", default=[64, 1024],
                   help="N of the masks section")
    p.add_argument("--mask-B", type=int, default=None,
                   help="batch of the masks section (default B * 64 // N: B*N tokens fixed)")
    p.add_argument("--units", nargs="+", choices=list(UNITS), default=list(UNITS),
                   metavar="UNIT", help=f"a subset of: {', '.join(UNITS)}")
    p.add_argument("--device", choices=["auto", "cpu", "cuda"], default="auto")
    p.add_argument("--threads", type=int, default=2,
                   help="torch intra-op threads (0: leave torch's default)")
    p.add_argument("--malloc", choices=["keep", "system"], default="keep",
                   help="allocator policy: keep freed memory as the command line does "
                        "(gpattn_ppl.run.allocator), or glibc's defaults")
    p.add_argument("--smoke", action="store_true",
                   help="tiny sizes (B=2, N in 8 16, C=16, H=2, one round)")
    p.add_argument("--out", default=None,
                   help="JSON path (default benchmarks/results/units.json; a temp file with "
                        "--smoke)")
    return p


def main(argv: list[str] | None = None) -> int:
    p = build_parser()
    a = p.parse_args(argv)
    if a.device == "auto":
        a.device = "cuda" if torch.cuda.is_available() else "cpu"
    if a.device == "cuda" and not torch.cuda.is_available():
        p.error("--device cuda: CUDA is not available")
    cuda = a.device == "cuda"
    if a.smoke:
        a.B, a.ratio_ns, a.C, a.H, a.rounds, a.repeats = 2, [8, 16], 16, 2, 1, 2
        a.scaling_ns, a.scaling_B, a.mask_ns = [8, 16, 32], 2, [8, 16]
    a.B = a.B if a.B is not None else (64 if cuda else 32)
    a.ratio_ns = a.ratio_ns if a.ratio_ns is not None else ([256, 1024] if cuda else [64, 256])
    if a.out is None:
        a.out = (str(Path(tempfile.gettempdir()) / "units_smoke.json") if a.smoke
                 else "benchmarks/results/units.json")
    device = bench_device(a)
    malloc = keep_freed_memory() if a.malloc == "keep" else False
    units = list(dict.fromkeys(a.units))
    res = {**provenance(argv, Path(__file__).resolve().parents[1]), "smoke": a.smoke, "device": str(device), "units": units,
           "malloc_keep_freed_memory": malloc,
           "specs": {u: UNITS[u] for u in units},
           "targets": {u: {k: list(v) for k, v in TARGETS[u].items()}
                       for u in units if u in TARGETS}}
    res["ratios"] = ratios_section(a, units, device) if "ratios" in a.sections else None
    res["scaling"] = scaling_section(a, units, device) if "scaling" in a.sections else None
    res["memory"] = memory_section(a, units, device) if "memory" in a.sections else None
    res["masks"] = masks_section(a, units, device) if "masks" in a.sections else None
    res["threads"] = torch.get_num_threads()
    path = write_json(res, a.out)
    print_table(res, units)
    print_masks(res)
    print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
