"""Schedules for objective-term weights, temperatures and the like, as functions of the epoch.

A schedule is specified as a number (constant) or a mapping:

* ``{kind: constant, value: v}``
* ``{kind: linear, start: a, end: b, epochs: E}`` -- linear ramp from ``a`` at epoch 0 to ``b`` at
  epoch ``E`` (then constant ``b``); ``epochs`` defaults to the whole run, and ``fraction: f``
  (instead of ``epochs``) ends the ramp at ``f`` times the run's length (``0 < f <= 1``);
* ``{kind: switch, value: v, after: E, before: 0.0}`` -- ``before`` until epoch ``E``, then ``v``;
* ``{kind: exponential, start: a, end: b, epochs: E}`` -- geometric interpolation (annealing);
  ``fraction`` as for ``linear``.

Epochs are fractional (``t = epoch + step / steps_per_epoch``). There is one clock: the Pyro
program's (:meth:`gpattn_ppl.infer.PyroProgram.set_epoch`, called once per optimiser step by the
fit loop). It evaluates the weights of the objective terms and, through :func:`apply_schedules`,
every scheduled attribute of the network's modules (:class:`ScheduledAttributes`: the Gumbel
units' temperatures).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

__all__ = ["Schedule", "build_schedule", "ScheduledAttributes", "apply_schedules",
           "positive_float"]


@dataclass(frozen=True)
class Schedule:
    """A scalar as a function of (fractional) epoch ``t``."""

    kind: str = "constant"
    start: float = 1.0
    end: float = 1.0
    epochs: float | None = None
    after: float = 0.0
    fraction: float | None = None

    def __call__(self, t: float, total_epochs: float | None = None) -> float:
        if self.kind == "constant":
            return self.start
        if self.kind == "switch":
            return self.end if t >= self.after else self.start
        span = self.epochs
        if span is None and total_epochs is not None:
            span = total_epochs * (1.0 if self.fraction is None else self.fraction)
        frac = 1.0 if not span else min(max(t / span, 0.0), 1.0)
        if self.kind == "linear":
            return self.start + (self.end - self.start) * frac
        # exponential
        return self.start * (self.end / self.start) ** frac


#: the largest float32 (temperatures and scales beyond it overflow in the units' tensors)
_FLOAT32_MAX = float(torch.finfo(torch.float32).max)

_KEYS = {"constant": {"value"}, "linear": {"start", "end", "epochs", "fraction"},
         "switch": {"value", "after", "before"},
         "exponential": {"start", "end", "epochs", "fraction"}}


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
        if spec.get("epochs") is not None and spec.get("fraction") is not None:
            raise ValueError(f"{where}: give the ramp's length as epochs or as fraction, not both")
        fraction = None if spec.get("fraction") is None else float(spec["fraction"])
        if fraction is not None and not 0.0 < fraction <= 1.0:
            raise ValueError(f"{where}.fraction: must be in (0, 1], got {fraction}")
        sched = Schedule(kind, float(spec["start"]), float(spec["end"]),
                         None if spec.get("epochs") is None else float(spec["epochs"]),
                         fraction=fraction)
    except KeyError as err:
        raise ValueError(f"{where}: missing key {err.args[0]!r} for a {kind} schedule") from None
    if kind == "exponential" and (sched.start <= 0 or sched.end <= 0):
        raise ValueError(f"{where}: exponential schedules need positive start and end")
    return sched


def positive_float(value, name: str) -> float:
    """``float(value)``, refusing values that are not ``> 0`` (temperatures, scales) or not a
    finite float32 (the units' tensors are float32 or wider: a larger value overflows there)."""
    value = float(value)
    if not 0 < value <= _FLOAT32_MAX:
        raise ValueError(f"{name} must be > 0 and a finite float32 (at most {_FLOAT32_MAX:.3g}), "
                         f"got {value}")
    return value


class ScheduledAttributes:
    """Mixin for modules with float attributes that follow a schedule (temperatures).

    Subclasses list the attributes in ``_scheduled_attrs`` and put the :class:`Schedule` of each
    scheduled one in ``self._scheduled`` (unscheduled attributes keep their constant value). The
    program's clock sets them through :func:`apply_schedules`; their current values travel with
    the state dict as the module's extra state, so a checkpoint is evaluated at its own values.
    """

    _scheduled: dict[str, Schedule]
    #: the float attributes saved as extra state, in order
    _scheduled_attrs: tuple[str, ...] = ()

    def get_extra_state(self) -> torch.Tensor:
        """The current values of ``_scheduled_attrs`` (annealed ones included)."""
        return torch.tensor([getattr(self, a) for a in self._scheduled_attrs], dtype=torch.float64)

    def set_extra_state(self, state) -> None:
        for attr, value in zip(self._scheduled_attrs, torch.as_tensor(state).tolist()):
            setattr(self, attr, positive_float(value, attr))

    def apply_schedules(self, epoch: float, total_epochs: float | None = None) -> dict[str, float]:
        """Set every scheduled attribute to its value at ``epoch``; returns the values set."""
        out = {}
        for attr, sched in self._scheduled.items():
            value = float(sched(epoch, total_epochs))
            if not value > 0:
                where = getattr(self, "site_prefix", "") or type(self).__name__
                raise ValueError(f"{where}: schedule of {attr} gave a non-positive value {value} "
                                 f"at epoch {epoch}")
            setattr(self, attr, value)
            out[attr] = value
        return out


def apply_schedules(net: nn.Module, epoch: float, total_epochs: float | None = None
                    ) -> dict[str, float]:
    """Apply the schedules of every :class:`ScheduledAttributes` module of ``net`` at ``epoch``.

    :returns: ``{"<module path>.<attribute>": value}`` (for logging); empty without such modules.
    """
    out: dict[str, float] = {}
    for path, module in net.named_modules():
        if isinstance(module, ScheduledAttributes):
            for attr, value in module.apply_schedules(epoch, total_epochs).items():
                out[f"{path}.{attr}" if path else attr] = value
    return out
