"""On a GPU: every registered unit trains on CUDA, the memory and sync tools work there, and the
unit benchmark runs (skipped without CUDA)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

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

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")

ROOT = Path(__file__).resolve().parents[2]
CUDA = torch.device("cuda")


@pytest.mark.parametrize("kind", sorted(ATTENTION))
def test_every_unit_trains_on_cuda(kind):
    """Forward + backward on CUDA: the output, the input's gradient and every parameter's
    gradient are on CUDA and finite."""
    B, N, C, H = 2, 16, 16, 2
    torch.manual_seed(0)
    unit = build_unit({"kind": kind}, C, H, device=CUDA)
    x, mask = layer_inputs(B, N, C, device=CUDA)
    out = unit(x, mask)
    assert out.device.type == "cuda" and out.shape == (B, N, C)
    assert bool(torch.isfinite(out).all())
    loss = out.square().mean() + sum(v.sum() for v in unit.objective_terms().values())
    loss.backward()
    grads = {"x": x.grad, **{n: p.grad for n, p in unit.named_parameters() if p.grad is not None}}
    assert len(grads) > 1, f"{kind}: no parameter received a gradient"
    for name, g in grads.items():
        assert g.device.type == "cuda", f"{kind}.{name}: gradient on {g.device}"
        assert bool(torch.isfinite(g).all()), f"{kind}.{name}: non-finite gradient"


def test_peak_memory_on_cuda():
    kept = []
    r = peak_memory(lambda: kept.append(torch.ones(1 << 20, device=CUDA)), CUDA)
    assert (1 << 22) <= r["peak_bytes"] < (1 << 23)
    assert r["largest_tensor"] == {"shape": [1 << 20], "bytes": 1 << 22}
    torch.manual_seed(0)
    unit = build_unit({"kind": "softmax"}, 16, 2, device=CUDA)
    x, mask = layer_inputs(2, 16, 16, device=CUDA)
    assert peak_memory(train_step(unit, x, mask), CUDA)["peak_bytes"] > 0


def test_sync_counter_sees_device_to_host_copies():
    t = torch.randn(8, device=CUDA)
    with sync_counter() as s:
        (t * 2).exp()
        t.cpu()
        bool(t.any())
    assert s.ops == ["_to_copy", "_local_scalar_dense"]


def test_bench_units_smoke_on_cuda(tmp_path):
    out = tmp_path / "units.json"
    proc = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "bench_units.py"), "--smoke",
                           "--device", "cuda", "--out", str(out)],
                          cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-4000:]
    res = json.loads(out.read_text())
    assert res["device"].startswith("cuda")
    assert set(res["ratios"]) == {"8", "16"}
    assert res["ratios"]["8"]["units"]["softmax"]["ratio_to_softmax"] == 1.0
    assert all(row is not None for row in res["memory"]["16"]["units"].values())
