"""Shared random-data helpers for the metric tests (float64, fixed seeds)."""

from __future__ import annotations

import pytest
import torch


def make_probs(t: int, n: int, k: int, seed: int = 0, scale: float = 2.0) -> torch.Tensor:
    """Softmax of scaled Gaussian logits: probabilities ``[T, n, K]`` in float64."""
    g = torch.Generator().manual_seed(seed)
    logits = scale * torch.randn(t, n, k, generator=g, dtype=torch.float64)
    return torch.softmax(logits, -1)


def make_labels(n: int, k: int, seed: int = 1) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return torch.randint(0, k, (n,), generator=g)


@pytest.fixture
def random_data():
    """``(probs [3, 200, 4], labels [200])`` with roughly 50% accuracy."""
    probs = make_probs(3, 200, 4, seed=0)
    labels = probs.mean(0).argmax(-1).clone()
    g = torch.Generator().manual_seed(2)
    flip = torch.rand(200, generator=g) < 0.5
    labels[flip] = torch.randint(0, 4, (int(flip.sum()),), generator=g)
    return probs, labels


@pytest.fixture
def probs_factory():
    """The :func:`make_probs` helper as a fixture (test modules do not import conftest)."""
    return make_probs
