"""Summaries of a run's metrics under distribution shift (CIFAR-10-C style).

A run evaluated with ``data.corruptions`` has one labelled shift set per corruption and
severity in its results, ``results["ood"]["cifar10c:<name>:<severity>"]["classification"]``.
:func:`shift_summary` arranges them: per set, per severity (mean over the corruption types),
the KEP-SVGP summary (mean over the 15 benchmark types x 5 severities) and the CGPT category
means (noise / blur / weather / digital, each over its types and the 5 severities; with
``categories=CGPT_CATEGORIES``, over CGPT's 18 types).
"""

from __future__ import annotations

import statistics

__all__ = ["CGPT_CATEGORIES", "SHIFT_METRICS", "shift_summary"]

#: the metrics summarised (the keys of a classification report)
SHIFT_METRICS = ("acc", "nll", "ece", "brier", "aurc")

#: CGPT's categories (its Table II): the 18 released CIFAR-10-C types (the 15 + the 4 extra,
#: without glass blur), each extra in the category of its family
CGPT_CATEGORIES: dict[str, tuple[str, ...]] = {
    "noise": ("gaussian_noise", "shot_noise", "impulse_noise", "speckle_noise"),
    "blur": ("defocus_blur", "motion_blur", "zoom_blur", "gaussian_blur"),
    "weather": ("snow", "frost", "fog", "brightness", "spatter"),
    "digital": ("contrast", "elastic_transform", "pixelate", "jpeg_compression", "saturate"),
}


def _parse(name: str) -> tuple[str, int] | None:
    parts = name.split(":")
    if len(parts) != 3 or parts[0] != "cifar10c" or parts[2] not in ("1", "2", "3", "4", "5"):
        return None
    return parts[1], int(parts[2])


def shift_summary(results: dict, metrics=SHIFT_METRICS, categories=None) -> dict:
    """The shift metrics of one run's ``results`` (as ``results.json`` holds them).

    :param metrics: classification metrics to summarise.
    :param categories: ``{category: corruption names}`` (default: the benchmark's 15 types,
        :data:`gpattn_ppl.data.CORRUPTION_CATEGORIES`).
    :returns: ``{"sets": {(name, severity): {metric: value}}, "by_severity": {0 (clean),
        1..5: {metric: mean over the benchmark types present}}, "mean": {metric: mean over the
        benchmark types x severities present}, "categories": {category: {metric: mean}},
        "missing": [benchmark (name, severity) pairs the run does not have]}``.
    :raises ValueError: no ``cifar10c:`` set with classification metrics in ``results``.
    """
    if categories is None:
        from ..data.corruptions import CORRUPTION_CATEGORIES as categories
    benchmark = {n for names in categories.values() for n in names}
    sets = {}
    for key, entry in (results.get("ood") or {}).items():
        parsed = _parse(key)
        cls = (entry or {}).get("classification")
        if parsed is None or not cls:
            continue
        sets[parsed] = {m: cls[m] for m in metrics if m in cls}
    if not sets:
        raise ValueError("no cifar10c:<name>:<severity> set with classification metrics in the "
                         "results (evaluate with data.corruptions)")

    def mean(pairs, m):
        vals = [sets[p][m] for p in pairs if p in sets and sets[p].get(m) is not None]
        return statistics.fmean(vals) if vals else None

    in_bench = [p for p in sets if p[0] in benchmark]
    by_sev = {0: {m: (results.get("test") or {}).get(m) for m in metrics}}
    for s in range(1, 6):
        pairs = [p for p in in_bench if p[1] == s]
        if pairs:
            by_sev[s] = {m: mean(pairs, m) for m in metrics}
    cats = {}
    for cat, names in categories.items():
        pairs = [p for p in in_bench if p[0] in names]
        if pairs:
            cats[cat] = {m: mean(pairs, m) for m in metrics}
    missing = sorted((n, s) for n in benchmark for s in range(1, 6) if (n, s) not in sets)
    return {"sets": sets, "by_severity": by_sev,
            "mean": {m: mean(in_bench, m) for m in metrics}, "categories": cats,
            "missing": missing}
