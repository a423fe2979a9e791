"""Collect the CIFAR-10 paper-preset runs of one GPU session into one JSON file and a table.

For every run folder under ``RUNS`` (one per unit, trained by ``benchmarks/device_session.sh``
with ``train.max_minutes``): test accuracy, NLL, ECE and Brier without and with temperature
scaling, mutual information, the epochs reached against the configured ones (the budget plan),
seconds per epoch, the whole run's seconds and the peak GPU memory; a run that failed is listed
with the last lines of its log.

    python benchmarks/paper_runs.py RUNS OUT.json
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

KEYS = ("acc", "nll", "ece", "brier", "mutual_info")


def collect(runs: Path) -> dict:
    out = {}
    for folder in sorted(p for p in runs.iterdir() if p.is_dir()):
        res = folder / "results.json"
        if not res.is_file():
            log = runs / f"{folder.name}.log"
            tail = log.read_text(errors="replace").splitlines()[-8:] if log.is_file() else []
            out[folder.name] = {"status": "failed", "log_tail": tail}
            continue
        r = json.loads(res.read_text())
        hist = json.loads((folder / "history.json").read_text())
        out[folder.name] = {
            "status": "ok",
            "test": {k: r["test"].get(k) for k in KEYS},
            "ts": {k: r["ts"]["test"].get(k) for k in KEYS} if "ts" in r else None,
            "temperature": r.get("temperature_scaling", {}).get("temperature"),
            "budget": r.get("budget"), "best_epoch": r["best_epoch"],
            "epochs": len(hist), "epoch_seconds": [round(h["seconds"], 2) for h in hist],
            "val_acc": [round(h.get("val/acc", float("nan")), 4) for h in hist],
            "cost": r["cost"],
        }
    return out


def table(rows: dict) -> str:
    lines = [f"{'unit':<12} {'ep':>4} {'acc':>6} {'nll':>6} {'ece':>6} {'brier':>6} | "
             f"{'TS nll':>6} {'TS ece':>6} {'s/ep':>6} {'MB':>6}"]
    for name, r in rows.items():
        if r["status"] != "ok":
            lines.append(f"{name:<12} FAILED: {(r['log_tail'] or ['?'])[-1][:80]}")
            continue
        t, ts = r["test"], r["ts"] or {}
        lines.append(f"{name:<12} {r['epochs']:>4} {t['acc']:>6.4f} {t['nll']:>6.4f} "
                     f"{t['ece']:>6.4f} {t['brier']:>6.4f} | {ts.get('nll', float('nan')):>6.4f} "
                     f"{ts.get('ece', float('nan')):>6.4f} {r['cost']['sec_per_epoch']:>6.1f} "
                     f"{r['cost']['peak_mem_mb']:>6.0f}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 2:
        print(__doc__.strip().splitlines()[-1].strip(), file=sys.stderr)
        return 2
    rows = collect(Path(args[0]))
    Path(args[1]).write_text(json.dumps(rows, indent=1))
    print(table(rows))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
