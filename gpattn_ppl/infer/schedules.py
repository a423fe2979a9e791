"""Schedules for objective-term weights, temperatures and the like, as functions of the epoch.

A schedule is specified as a number (constant) or a mapping:

* ``{kind: constant, value: v}``
* ``{kind: linear, start: a, end: b, epochs: E}`` -- linear ramp from ``a`` at epoch 0 to ``b`` at
  epoch ``E`` (then constant ``b``); ``epochs`` defaults to the whole run;
* ``{kind: switch, value: v, after: E, before: 0.0}`` -- ``before`` until epoch ``E``, then ``v``;
* ``{kind: exponential, start: a, end: b, epochs: E}`` -- geometric interpolation (annealing).

Epochs are fractional (``t = epoch + step / steps_per_epoch``); the trainer updates them per step.
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["Schedule", "build_schedule"]


@dataclass(frozen=True)
class Schedule:
    """A scalar as a function of (fractional) epoch ``t``."""

    kind: str = "constant"
    start: float = 1.0
    end: float = 1.0
    epochs: float | None = None
    after: float = 0.0

    def __call__(self, t: float, total_epochs: float | None = None) -> float:
        if self.kind == "constant":
            return self.start
        if self.kind == "switch":
            return self.end if t >= self.after else self.start
        span = self.epochs if self.epochs is not None else total_epochs
        frac = 1.0 if not span else min(max(t / span, 0.0), 1.0)
        if self.kind == "linear":
            return self.start + (self.end - self.start) * frac
        # exponential
        return self.start * (self.end / self.start) ** frac


_KEYS = {"constant": {"value"}, "linear": {"start", "end", "epochs"},
         "switch": {"value", "after", "before"}, "exponential": {"start", "end", "epochs"}}


def build_schedule(spec, where: str = "schedule") -> Schedule:
    """A :class:`Schedule` from a number or a mapping (see the module docstring)."""
    if isinstance(spec, bool):
        raise ValueError(f"{where}: expected a number or a mapping, got bool")
    if isinstance(spec, (int, float)):
        return Schedule("constant", float(spec), float(spec))
    if not isinstance(spec, dict):
        raise ValueError(f"{where}: expected a number or a mapping, got {type(spec).__name__}")
    kind = spec.get("kind", "linear" if "start" in spec else "constant")
    if kind not in _KEYS:
        raise ValueError(f"{where}.kind: unknown schedule {kind!r}; allowed: {', '.join(_KEYS)}")
    extra = set(spec) - _KEYS[kind] - {"kind"}
    if extra:
        raise ValueError(f"{where}: unknown key(s) {sorted(extra)} for a {kind} schedule; "
                         f"allowed: {', '.join(sorted(_KEYS[kind]))}")
    try:
        if kind == "constant":
            v = float(spec["value"])
            return Schedule("constant", v, v)
        if kind == "switch":
            return Schedule("switch", float(spec.get("before", 0.0)), float(spec["value"]),
                            after=float(spec["after"]))
        sched = Schedule(kind, float(spec["start"]), float(spec["end"]),
                         None if spec.get("epochs") is None else float(spec["epochs"]))
    except KeyError as err:
        raise ValueError(f"{where}: missing key {err.args[0]!r} for a {kind} schedule") from None
    if kind == "exponential" and (sched.start <= 0 or sched.end <= 0):
        raise ValueError(f"{where}: exponential schedules need positive start and end")
    return sched
