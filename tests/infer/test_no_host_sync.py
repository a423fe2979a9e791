"""No host synchronisation in any unit's training step on the fit loop's fast path.

A synchronisation is an op that reads a tensor to the host: ``.item()``, ``float(t)``,
``bool(t)`` (``aten._local_scalar_dense``, ``aten.is_nonzero``), ``aten.nonzero`` and friends.
On CPU they cost little; on a GPU each one stalls the stream. The counter is a dispatch mode, so
it sees them on CPU too (:func:`tests.sync.sync_counter`).
"""

from __future__ import annotations

import pytest
import torch

from gpattn_ppl import linalg, settings
from gpattn_ppl.attention import ATTENTION, build_attention
from gpattn_ppl.infer import PyroProgram, fit_epoch
from gpattn_ppl.models import build_model
from tests.sync import sync_counter


def test_the_counter_sees_a_sync_and_nothing_else():
    t = torch.randn(4)
    with sync_counter() as s:
        u = t * 2 + 1
    assert s.ops == []
    with sync_counter() as s:
        bool(u.sum() > 0)
    assert s.ops == ["_local_scalar_dense"]


_OPTIONS = {"kep_svgp": [{"rank": 4}, {"rank": 4, "merge": "concat", "seq_len": 6}],  # D = 4
            "sgpa": [{}, {"variant": "standard", "max_len": 6}, {"cov": "diag"}],
            "h_gumbel": [{"num_centroids": 3}, {"num_centroids": 3, "centroid_init": "kmeans"}],
            "scgpt": [{"num_inducing": 3}], "gumbel": [{}, {"prior": "uniform"}]}
_CASES = [(kind, opts) for kind in sorted(ATTENTION) for opts in _OPTIONS.get(kind, [{}])]


@pytest.mark.parametrize(("kind", "options"), _CASES,
                         ids=[f"{k}-{i}" for k, o in _CASES for i in [len(o)]])
def test_unit_training_step_reads_nothing_to_the_host(kind, options):
    """Forward (regularisers included) and backward of every registered unit under the fast
    path's settings (argument checks off, factorisations deferred): zero host reads, and the
    deferred factorisations are recorded for the loop's one check."""
    torch.manual_seed(0)
    unit = build_attention(kind, 8, 2, **options).train()
    x = torch.randn(3, 6, 8, requires_grad=True)
    mask = torch.ones(3, 6, dtype=torch.bool)
    mask[0, 4:] = False
    unit(x, mask)  # first call: one-off data initialisations (inducing inputs, k-means) may read
    with linalg.deferred_checks() as box, settings.validate_args(False), sync_counter() as s:
        out = unit(x, mask)
        loss = out.square().mean() + sum(v.sum() for v in unit.objective_terms().values())
        loss.backward()
    assert s.ops == [], f"{kind} {options}: host reads {s.ops}"
    assert not bool(box.failed())


def test_fit_loop_reads_the_host_once_per_step_of_its_own():
    """Over a whole step (forward, backward, fused Adam) the only host reads are Pyro's ELBO's
    own: ``torch_item`` twice and its NaN warning on the loss and on its gradient. The loop's one
    read per step (loss and factorisations together) goes through ``tolist``, which the
    dispatcher does not see."""
    torch.manual_seed(0)
    net = build_model({"dim": 8, "heads": 2, "depth": 1, "mlp_dim": 8, "dropout": 0.0,
                       "attention": {"kind": "cgpt"}}, num_classes=2, vocab_size=12)
    program = PyroProgram(net, num_data=12)
    opt = torch.optim.Adam(net.parameters(), lr=1e-3, fused=True)  # as the trainer builds it

    class B:
        def __init__(self, i):
            g = torch.Generator().manual_seed(i)
            self.x = torch.randint(1, 12, (4, 5), generator=g)
            self.mask = torch.ones(4, 5, dtype=torch.bool)
            self.y = torch.randint(0, 2, (4,), generator=g)
            self.index = torch.arange(4 * i, 4 * i + 4)

    batches = [B(i) for i in range(3)]
    fit_epoch(program, opt, batches[:1])  # warm-up
    with sync_counter() as s:
        out = fit_epoch(program, opt, batches, checks=False)
    assert out["checked_reruns"] == 0
    # 4 per step from Pyro; 3 at the end of the epoch (the means of the cross-entropy, of the
    # terms and of their weighted shares, which history.json records)
    assert s.ops == ["_local_scalar_dense"] * 4 * len(batches) + ["_local_scalar_dense"] * 3, \
        s.ops
    # the default objective-scale check reads nothing more: it uses those shares
    with sync_counter() as s:
        fit_epoch(program, opt, batches)
    assert s.ops == ["_local_scalar_dense"] * (4 * len(batches) + 3), s.ops
