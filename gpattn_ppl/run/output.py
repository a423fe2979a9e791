"""What commands print and write: strict JSON and the one run summary.

Every JSON file and every printed summary is strict JSON (RFC 8259): a metric that is undefined
(``nan``, e.g. ``eaurc`` when every prediction is wrong) is ``null``, never a bare ``NaN``.
``train`` and ``evaluate`` print the same :func:`summary` of a run.

>>> dumps({"mcc": float("nan"), "acc": 0.5})
'{\\n "mcc": null,\\n "acc": 0.5\\n}'
"""

from __future__ import annotations

import json
import math
from typing import Any

__all__ = ["strict", "dumps", "summary"]


def strict(obj: Any) -> Any:
    """``obj`` with every non-finite float replaced by ``None`` (dicts, lists, tuples walked)."""
    if isinstance(obj, float):
        return obj if math.isfinite(obj) else None
    if isinstance(obj, dict):
        return {k: strict(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [strict(v) for v in obj]
    return obj


def dumps(obj: Any, indent: int | None = 1) -> str:
    """Strict JSON text of ``obj`` (``allow_nan=False`` after :func:`strict`)."""
    return json.dumps(strict(obj), indent=indent, allow_nan=False)


def summary(results: dict, run_dir) -> dict:
    """The summary ``train`` and ``evaluate`` print: run folder, best epoch, test metrics, per
    OOD set its classification and detection metrics, temperature scaling (when on: the
    temperature, and under ``ts`` every metric again for the tempered predictive), last-layer
    Laplace (when on: under ``laplace``) and cost."""
    out = {"run_dir": str(run_dir), "best_epoch": results.get("best_epoch"),
           "test": results["test"], "ood": results["ood"]}
    if "temperature_scaling" in results:
        out["temperature_scaling"] = results["temperature_scaling"]
    if "ts" in results:
        out["ts"] = results["ts"]
    if "laplace" in results:
        out["laplace"] = results["laplace"]
    if results.get("warnings"):
        out["warnings"] = results["warnings"]
    out["cost"] = results.get("cost", {})
    return strict(out)
