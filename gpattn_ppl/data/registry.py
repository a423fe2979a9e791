"""The dataset registry: a reader module registers its builder with :func:`register_dataset`.

A builder reads the files and returns a :class:`RawData` (all examples, index tensors for
train / val / test, and the OOD sets); :func:`~gpattn_ppl.data.load.load_data` then encodes it.
Each dataset declares the validation metric a run selects its checkpoint on (``select_metric``,
used for ``train.select_metric: auto``).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch

__all__ = ["DATASETS", "DatasetSpec", "RawData", "register_dataset"]


@dataclass
class RawData:
    """What a dataset builder returns, before any encoding.

    :ivar x: all examples: a list of ``n`` texts or images ``[n, 3, H, W]`` uint8.
    :ivar y: ``[n]`` long labels.
    :ivar splits: ``"train"``, ``"val"``, ``"test"`` -> long indices into ``x`` (disjoint).
    :ivar ood: name -> ``(x, y)`` of an out-of-distribution set.
    :ivar num_classes: ``K``.
    :ivar info: provenance notes merged into ``info`` of :class:`~gpattn_ppl.data.DataBundle`.
    :ivar classes: the ``K`` label names in index order; ``None``: unnamed.
    :ivar image_stats: images only: per-channel ``(mean, std)`` in [0, 1] units for the
        normalisation; ``None``: computed from the training split.
    """

    x: list[str] | torch.Tensor
    y: torch.Tensor
    splits: dict[str, torch.Tensor]
    ood: dict[str, tuple[Any, torch.Tensor]]
    num_classes: int
    info: dict = field(default_factory=dict)
    classes: list[str] | None = None
    image_stats: tuple[tuple[float, ...], tuple[float, ...]] | None = None


@dataclass(frozen=True)
class DatasetSpec:
    """A registered dataset.

    :ivar builder: ``f(*, protocol, root, split_seed, cache_dir, **options) -> RawData``.
    :ivar protocols: allowed protocols, the first is the default.
    :ivar modality: ``"text"`` or ``"image"``.
    :ivar options: extra keyword arguments of the builder accepted by
        :func:`~gpattn_ppl.data.load_data`.
    :ivar encoder_defaults: defaults for the text encoder's options (e.g. ``max_vocab``).
    :ivar select_metric: the validation metric a run selects its best checkpoint on (a key of
        the validation report: ``acc``, ``mcc``, ``nll``, ``ece``, ``brier``).
    """

    builder: Callable[..., RawData]
    protocols: tuple[str, ...]
    modality: str
    options: tuple[str, ...] = ()
    encoder_defaults: dict = field(default_factory=dict)
    select_metric: str = "acc"


#: dataset name -> :class:`DatasetSpec`; reader modules add entries with :func:`register_dataset`.
DATASETS: dict[str, DatasetSpec] = {}


def register_dataset(name: str, *, protocols: tuple[str, ...], modality: str,
                     options: tuple[str, ...] = (), encoder_defaults: dict | None = None,
                     select_metric: str = "acc"):
    """Decorator registering a builder under ``name`` (see :class:`DatasetSpec`)."""
    if modality not in ("text", "image"):
        raise ValueError(f"modality must be 'text' or 'image', got {modality!r}")

    def deco(builder: Callable[..., RawData]) -> Callable[..., RawData]:
        DATASETS[name] = DatasetSpec(builder, tuple(protocols), modality, tuple(options),
                                     dict(encoder_defaults or {}), select_metric)
        return builder

    return deco
