"""On a GPU: the public unit mixin for every registered unit on CUDA, and a bf16 autocast check
per unit (skipped without CUDA; ``benchmarks/device_check.py`` section (a) runs this module).

* ``TestCudaMixin_<kind>``: :class:`~gpattn_ppl.testing.AttentionUnitTestCase` with
  ``device = "cuda"`` and each kind's defaults (the documented exceptions of
  ``tests/attention/test_registry.py``); the mixin runs in float64 and includes its float32 vs
  float64 check;
* ``test_bf16_autocast_on_cuda``: under ``torch.autocast("cuda", dtype=torch.bfloat16)`` a
  training-mode forward + backward is finite (output, the input's gradient, every parameter's
  gradient), and the posterior-mean output is within :data:`BF16_RTOL` of float32's in relative
  Frobenius norm (measured on the CPU's bf16 autocast at B = 4, N = 32, C = 32, H = 4: at most
  4.6e-3 for every unit, so the bound leaves a factor of 10).
"""

from __future__ import annotations

import pytest
import torch

from gpattn_ppl.attention import ATTENTION, build_attention
from gpattn_ppl.run.benchmarking import layer_inputs
from gpattn_ppl.settings import posterior_mean
from gpattn_ppl.testing import AttentionUnitTestCase
from tests.attention.test_registry import SWEEP_ATTRIBUTES

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")

#: relative Frobenius error of the bf16-autocast output against float32's (posterior mean)
BF16_RTOL = 5e-2

KINDS = sorted(ATTENTION)


def _cuda_class(kind: str) -> type:
    def make_unit(self, dim, heads):
        return build_attention(kind, dim, heads)

    attrs = {"make_unit": make_unit, "device": "cuda",
             "__doc__": f"Mixin checks of {kind!r} with its defaults, on CUDA."}
    attrs.update(SWEEP_ATTRIBUTES.get(kind, {}))
    return type(f"TestCudaMixin_{kind}", (AttentionUnitTestCase,), attrs)


for _kind in KINDS:
    globals()[f"TestCudaMixin_{_kind}"] = _cuda_class(_kind)


@pytest.mark.parametrize("kind", KINDS)
def test_bf16_autocast_on_cuda(kind):
    """bf16 autocast: finite forward + backward in train mode; the posterior-mean output is
    within :data:`BF16_RTOL` (relative Frobenius) of float32's."""
    cuda = torch.device("cuda")
    B, N, C, H = 4, 32, 32, 4
    torch.manual_seed(0)
    unit = build_attention(kind, C, H).to(cuda)
    x, mask = layer_inputs(B, N, C, device=cuda)
    unit.eval()
    with torch.no_grad(), posterior_mean(unit.stochastic):
        ref = unit(x, mask)
        with torch.autocast("cuda", dtype=torch.bfloat16):
            low = unit(x, mask)
    assert bool(torch.isfinite(low).all()), f"{kind}: non-finite bf16 output"
    err = float((low.float() - ref).norm() / ref.norm())
    assert err < BF16_RTOL, f"{kind}: bf16 relative error {err:.3g} >= {BF16_RTOL}"
    unit.train()
    torch.manual_seed(1)
    with torch.autocast("cuda", dtype=torch.bfloat16):
        out = unit(x, mask)
        loss = (out.float().square().mean()
                + sum(v.float().sum() for v in unit.objective_terms().values()))
    assert bool(torch.isfinite(loss)), f"{kind}: non-finite bf16 loss"
    loss.backward()
    grads = {"x": x.grad, **{n: p.grad for n, p in unit.named_parameters() if p.grad is not None}}
    assert len(grads) > 1, f"{kind}: no parameter received a gradient"
    for name, g in grads.items():
        assert bool(torch.isfinite(g).all()), f"{kind}.{name}: non-finite gradient under bf16"
