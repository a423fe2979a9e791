r"""The OOD-detector registry: detectors interchangeable by a string name.

A detector is a function ``score(probs, logits=..., templates=...) -> Tensor [n]`` registered
with :func:`register_ood_detector`; :func:`gpattn_ppl.ood.ood_score`, the OOD report
(:func:`gpattn_ppl.ood.ood_report`), the config key ``eval.ood_detectors`` and the figures of
:func:`gpattn_ppl.run.plotting.plot_runs` all look detectors up here, so a detector registered
in a module imported with ``gpattn-ppl --import my_detector.py ...`` works in ``train``,
``evaluate``, ``compare`` and ``plot`` like a built-in one:

.. code-block:: python

    from gpattn_ppl.ood import register_ood_detector

    @register_ood_detector("max_logit", needs=("logits",), label="Max logit")
    def max_logit(probs, logits, templates):
        return logits.mean(0).max(-1).values   # [n], higher = more in-distribution

The function gets the checked probabilities ``probs`` (float64 ``[T, n, K]``, ``T`` passes),
and, only when declared in ``needs``, the checked ``logits`` (float64, same shape) and the
KL-matching ``templates`` (float64 ``[K, K]``, :func:`gpattn_ppl.ood.kl_matching_templates` of
the ID validation predictions); an undeclared input is passed as ``None``.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass

__all__ = ["OOD_DETECTORS", "OODDetector", "register_ood_detector", "DETECTOR_NAMES",
           "SCORE_NAMES", "DETECTOR_NEEDS"]

#: What a detector may declare in ``needs``: ``"logits"`` (the logits must be given),
#: ``"templates"`` (KL-matching class templates from ID validation predictions), ``"passes"``
#: (``T > 1`` stochastic passes; with ``T = 1`` the score would be constant).
DETECTOR_NEEDS: tuple[str, ...] = ("logits", "templates", "passes")


@dataclass(frozen=True)
class OODDetector:
    """A registered OOD detector.

    :ivar name: the detector's name (an alias maps to the detector it aliases).
    :ivar score: ``score(probs, logits=..., templates=...) -> [n]`` (see the module docstring).
    :ivar label: the axis label of its histogram (:func:`~gpattn_ppl.run.plotting.plot_runs`).
    :ivar needs: a subset of :data:`DETECTOR_NEEDS`.
    :ivar higher_is_ood: ``score`` is higher for *more out-of-distribution* inputs;
        :func:`~gpattn_ppl.ood.ood_score` then negates it, so every reported score is higher
        for more in-distribution inputs.
    """

    name: str
    score: Callable
    label: str
    needs: frozenset[str] = frozenset()
    higher_is_ood: bool = False

    @property
    def multi_pass(self) -> bool:
        """Whether the detector needs ``T > 1`` passes."""
        return "passes" in self.needs


#: name -> :class:`OODDetector`, in registration order (the report order); aliases map to the
#: detector they alias. The built-in detectors register on import of :mod:`gpattn_ppl.ood`.
OOD_DETECTORS: dict[str, OODDetector] = {}


def register_ood_detector(name: str, *, needs: Iterable[str] = (), higher_is_ood: bool = False,
                          label: str | None = None, aliases: Iterable[str] = ()):
    """Decorator registering a score function as OOD detector ``name``.

    :param name: the detector's name, as written in ``eval.ood_detectors``.
    :param needs: a subset of :data:`DETECTOR_NEEDS` (``"logits"``, ``"templates"``,
        ``"passes"``); :func:`~gpattn_ppl.ood.ood_score` checks each before calling the function,
        the report's default detector set leaves out detectors whose needs are not met, and the
        figures skip a run with ``T = 1`` for a ``"passes"`` detector.
    :param higher_is_ood: the function's score is higher for more OOD inputs (it is negated).
    :param label: the axis label of its histogram, of the reported (higher = more ID) score
        (default: ``name``, or ``"Negative <name>"`` with ``higher_is_ood``).
    :param aliases: further names for the same detector (not in :data:`DETECTOR_NAMES`).
    :raises ValueError: a name already registered to another function, or unknown ``needs``.
    """
    needs = frozenset([needs] if isinstance(needs, str) else needs)
    unknown = sorted(needs - set(DETECTOR_NEEDS))
    if unknown:
        raise ValueError(f"OOD detector {name!r}: unknown needs {unknown}; allowed: "
                         f"{', '.join(DETECTOR_NEEDS)}")
    names = [name, *([aliases] if isinstance(aliases, str) else aliases)]
    for n in names:
        if not isinstance(n, str) or not n:
            raise ValueError(f"an OOD detector name must be a non-empty string, got {n!r}")

    def wrap(fn: Callable) -> Callable:
        if not callable(fn):
            raise TypeError(f"OOD detector {name!r}: {fn!r} is not callable")
        for n in names:
            if n in OOD_DETECTORS and OOD_DETECTORS[n].score is not fn:
                raise ValueError(f"OOD detector '{n}' is already registered to "
                                 f"{OOD_DETECTORS[n].score!r}")
        text = (f"Negative {name}" if higher_is_ood else name) if label is None else str(label)
        spec = OODDetector(name, fn, text, needs, bool(higher_is_ood))
        for n in names:
            OOD_DETECTORS[n] = spec
        return fn

    return wrap


class _Names(Sequence):
    """A live, read-only tuple-like view of registry names (it follows later registrations)."""

    def __init__(self, aliases: bool, doc: str):
        self._aliases = aliases
        self.__doc__ = doc

    def _names(self) -> tuple[str, ...]:
        return tuple(n for n, d in OOD_DETECTORS.items() if self._aliases or d.name == n)

    def __getitem__(self, i):
        return self._names()[i]

    def __len__(self) -> int:
        return len(self._names())

    def __iter__(self) -> Iterator[str]:
        return iter(self._names())

    def __contains__(self, name) -> bool:
        return name in self._names()

    def __add__(self, other):
        return self._names() + tuple(other)

    def __radd__(self, other):
        return tuple(other) + self._names()

    def __eq__(self, other) -> bool:
        return isinstance(other, (tuple, list, _Names)) and self._names() == tuple(other)

    __hash__ = None  # mutable: it follows the registry

    def __repr__(self) -> str:
        return repr(self._names())


#: The distinct detectors, in report order: the names of :data:`OOD_DETECTORS` without aliases
#: (a live view: it includes detectors registered later).
DETECTOR_NAMES: Sequence[str] = _Names(False, "The distinct OOD detectors, in report order.")
#: Every name accepted by :func:`~gpattn_ppl.ood.ood_score` (aliases included; a live view of
#: the keys of :data:`OOD_DETECTORS`).
SCORE_NAMES: Sequence[str] = _Names(True, "Every name accepted by ood_score (aliases included).")
