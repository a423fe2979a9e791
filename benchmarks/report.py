"""Markdown tables from the speed JSONs in ``benchmarks/results/`` (what ``benchmarks/README.md``
shows), so every figure there comes from a file a command wrote.

    python benchmarks/report.py [--results benchmarks/results]
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path


def _load(path: Path) -> dict | None:
    return json.loads(path.read_text()) if path.exists() else None


def revisions_table(d: dict) -> str:
    """Before/after per layer: ms and the ratio to softmax on each side."""
    lines = [f"`{d['old']}` (before) against `{d['new']}` (after), N = {d['N']}, B = {d['B']}, "
             f"allocator `{d.get('malloc', 'system')}`, {d['rounds']} rounds x {d['repeats']} "
             "steps, fresh process per side and round", "",
             "| unit | before ms | after ms | after / before | before / softmax | "
             "after / softmax (range over rounds) |", "|---|---|---|---|---|---|"]
    for name, u in d["units"].items():
        rng = u.get("new_over_softmax_range") or [None, None]
        lines.append(f"| {name} | {u['old_ms']:.1f} | {u['new_ms']:.1f} | {u['new/old']:.2f} | "
                     f"{u.get('old_over_softmax', float('nan')):.2f} | "
                     f"{u.get('new_over_softmax', float('nan')):.2f} "
                     f"[{rng[0]:.2f}, {rng[1]:.2f}] |")
    return "\n".join(lines)


def units_tables(d: dict) -> str:
    """Ratios against targets, slopes and memory of ``bench_units.py``."""
    out = []
    ratios = d.get("ratios") or {}
    targets = d.get("targets") or {}
    if ratios:
        ns = list(ratios)
        out += [f"Per layer, ratio to softmax (median over rounds [min, max]); device "
                f"{d.get('device')}, allocator keeps freed memory: "
                f"{d.get('malloc_keep_freed_memory')}", "",
                "| unit | " + " | ".join(f"N = {n}" for n in ns) + " | target |",
                "|---|" + "---|" * len(ns) + "---|"]
        for u in d["units"]:
            cells = []
            for n in ns:
                row = ratios[n]["units"].get(u)
                if row is None or row.get("ratio_to_softmax") is None:
                    cells.append("-")
                    continue
                lo, hi = row.get("ratio_min"), row.get("ratio_max")
                spread = f" [{lo:.2f}, {hi:.2f}]" if lo is not None and hi is not None else ""
                cells.append(f"{row['ratio_to_softmax']:.2f}{spread}")
            t = (targets.get(u) or {}).get("ratio")
            out.append(f"| {u} | " + " | ".join(cells) + f" | {' '.join(map(str, t)) if t else ''} |")
    series = (d.get("scaling") or {}).get("series") or {}
    if series:
        out += ["", f"Time per sequence against N (B = {d['scaling']['B']}), log-log slope", "",
                "| unit | " + " | ".join(f"N = {n} (ms/seq)" for n in
                                        next(iter(series.values()))["N"])
                + " | slope | slope (last two) | target |", "|---|---|---|---|---|---|---|"]
        for u, s in series.items():
            per = " | ".join("-" if t is None else f"{1e3 * t:.3f}" for t in s["s_per_sequence"])
            slope = s.get("loglog_slope")
            last = s.get("loglog_slope_last_two")
            t = (targets.get(u) or {}).get("slope")
            out.append(f"| {u} | {per} | {'-' if slope is None else f'{slope:.2f}'} | "
                       f"{'-' if last is None else f'{last:.2f}'} | "
                       f"{' '.join(map(str, t)) if t else ''} |")
    memory = d.get("memory") or {}
    if memory:
        ns = list(memory)
        out += ["", "Peak memory of one training step of the layer (MiB; largest tensor)", "",
                "| unit | " + " | ".join(f"N = {n}" for n in ns) + " |",
                "|---|" + "---|" * len(ns)]
        for u in d["units"]:
            cells = []
            for n in ns:
                row = memory[n]["units"].get(u)
                cells.append("-" if row is None or row.get("peak_mib") is None else
                             f"{row['peak_mib']:.1f} ({row['largest_tensor']['shape']})")
            out.append(f"| {u} | " + " | ".join(cells) + " |")
    return "\n".join(out)


def epochs_table(d: dict) -> str:
    lines = [f"CoLA (official protocol, learned embeddings), {d['epochs']} epoch(s) per method, "
             "one process, seconds of the training pass", "",
             "| method | s / epoch | / softmax | peak MiB per step | target |",
             "|---|---|---|---|---|"]
    for m, row in d["methods"].items():
        mem = (row.get("step_memory") or {}).get("peak_mib")
        lines.append(f"| {m} | {row['sec_per_epoch']:.1f} | {row['ratio_to_softmax']:.2f} | "
                     f"{'-' if mem is None else f'{mem:.0f}'} | "
                     f"{'' if m == 'softmax' else '<= ' + str(d['targets'].get(m))} |")
    return "\n".join(lines)


def compile_table(d: dict) -> str:
    lines = [f"torch.compile of the whole unit, training step on the fast path, N = {d['N']}, "
             f"B = {d['B']} (compilation budget {d['timeout_s']:.0f} s)", "",
             "| unit | eager ms | compiled ms | compiled / eager | first call (compile) s |",
             "|---|---|---|---|---|"]
    for u, row in d["units"].items():
        if "error" in row:
            lines.append(f"| {u} | - | - | - | {row['error']} |")
        else:
            eager = 0.5 * (row["eager_ms"] + row["eager_again_ms"])
            lines.append(f"| {u} | {eager:.1f} | {row['compiled_ms']:.1f} | "
                         f"{row['compiled/eager']:.2f} | {row['compile_s']:.0f} |")
    return "\n".join(lines)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--results", default="benchmarks/results")
    root = Path(p.parse_args().results)
    for name in ("speed_layers_n64.json", "speed_layers_n256.json"):
        d = _load(root / name)
        if d:
            print(f"### {name}\n\n{revisions_table(d)}\n")
    d = _load(root / "units.json")
    if d:
        print(f"### units.json\n\n{units_tables(d)}\n")
    d = _load(root / "epochs.json")
    if d:
        print(f"### epochs.json\n\n{epochs_table(d)}\n")
    d = _load(root / "compile.json")
    if d:
        print(f"### compile.json\n\n{compile_table(d)}\n")


if __name__ == "__main__":
    main()
