"""``peak_memory`` (tensor bytes allocated inside a call) and ``sync_counter`` (host syncs)."""

from __future__ import annotations

import math

import pytest
import torch

from gpattn_ppl.attention import ATTENTION
from gpattn_ppl.run.benchmarking import (
    build_unit,
    layer_inputs,
    peak_memory,
    train_step,
)
from tests.sync import sync_counter

F32 = torch.float32


def test_a_kept_tensor_counts_once():
    kept = []
    r = peak_memory(lambda: kept.append(torch.ones(1000, dtype=F32)))
    assert 4000 <= r["peak_bytes"] < 8000
    assert r["largest_tensor"] == {"shape": [1000], "bytes": 4000}


def test_a_freed_intermediate_counts_a_pre_existing_tensor_does_not():
    big = torch.ones(250_000, dtype=F32)  # 1 MB, allocated before

    def fn():
        big.add_(1.0)                               # in place on a pre-existing storage
        big.view(500, 500).mul_(2.0)                # a view of it
        tmp = torch.ones(100_000, dtype=F32)        # 400 kB, freed before the end
        s = tmp.sum()
        del tmp
        return s

    r = peak_memory(fn)
    assert 400_000 <= r["peak_bytes"] < 1_000_000
    assert r["largest_tensor"]["shape"] == [100_000]


def test_views_are_not_counted_twice():
    kept = []

    def fn():
        a = torch.ones(1000, dtype=F32)
        kept.extend([a, a.view(10, 100), a[::2], a.unsqueeze(0).expand(3, 1000),
                     a.view(100, 10).t()])

    r = peak_memory(fn)
    assert 4000 <= r["peak_bytes"] < 8000


def test_largest_tensor_shape():
    kept = []

    def fn():
        kept.append(torch.zeros(4, 4, dtype=F32))
        kept.append(torch.zeros(3, 5, 7, dtype=F32))
        kept.append(torch.zeros(10, dtype=F32))

    r = peak_memory(fn)
    assert r["largest_tensor"] == {"shape": [3, 5, 7], "bytes": 3 * 5 * 7 * 4}
    assert r["peak_bytes"] == (16 + 105 + 10) * 4


def test_backward_saved_tensors_and_gradients_count():
    x = torch.randn(1000, dtype=F32, requires_grad=True)

    def fn():
        (x * 2).exp().sum().backward()  # exp saves its [1000] output for backward

    r = peak_memory(fn)
    assert r["peak_bytes"] >= 2 * 4000   # x * 2 and exp(.) alive together
    assert x.grad is not None


def test_nothing_allocated():
    r = peak_memory(lambda: None)
    assert r == {"peak_bytes": 0, "largest_tensor": {"shape": None, "bytes": 0}}


@pytest.mark.parametrize("kind", sorted(ATTENTION))
def test_no_bhdnn_intermediates(kind):
    """One train step (forward + backward) of every registered unit, default options, allocates
    no tensor as large as a ``[B, H, D, N, N]`` one. N = 16 (not smaller): it must be at least
    the default number of inducing points (16), else SGPA's variational Cholesky ``[H, D, M, M]``
    (parameter-sized, not an intermediate) reaches the bound."""
    B, N, C, H = 2, 16, 16, 2
    torch.manual_seed(0)
    unit = build_unit({"kind": kind}, C, H)
    x, mask = layer_inputs(B, N, C)
    r = peak_memory(train_step(unit, x, mask))
    assert r["peak_bytes"] > 0
    largest = r["largest_tensor"]
    assert math.prod(largest["shape"]) < B * H * (C // H) * N * N, (kind, largest)


def test_sync_counter_counts_a_bool_of_a_tensor():
    t = torch.randn(5)
    with sync_counter() as s:
        bool(t.any())
    assert s.count == 1
    assert s.ops == ["_local_scalar_dense"]


def test_sync_counter_pure_arithmetic_counts_nothing():
    t = torch.randn(5, requires_grad=True)
    with sync_counter() as s:
        ((t * 2 + 1).exp() / t.sum()).sum().backward()
    assert s.count == 0 and s.ops == []


def test_sync_counter_item_float_and_boolean_indexing():
    t = torch.randn(6)
    with sync_counter() as s:
        t.sum().item()
        float(t.max())
        t[t > 0]
        torch.equal(t, t)
    assert s.ops == ["_local_scalar_dense", "_local_scalar_dense", "index", "equal"]
