"""Gradient accumulation in the fit loop: k micro-batches per optimiser step are one k times
larger batch (deterministic network, SGD: the gradient itself, up to summation order)."""

import pytest
import torch

from gpattn_ppl.data import Batch
from gpattn_ppl.infer import PyroProgram, epoch_clock, fit_epoch
from gpattn_ppl.models import build_model


def _net():
    torch.manual_seed(0)
    return build_model({"dim": 8, "heads": 2, "depth": 1, "mlp_dim": 8, "dropout": 0.0},
                       num_classes=3, vocab_size=20)


def _data(n=22, N=5):
    g = torch.Generator().manual_seed(1)
    x = torch.randint(1, 20, (n, N), generator=g)
    y = torch.randint(0, 3, (n,), generator=g)
    return x, y


def _batches(size: int, n=22, N=5):
    x, y = _data(n, N)
    for s in range(0, n, size):
        idx = torch.arange(s, min(s + size, n))
        yield Batch(x[idx], y[idx], torch.ones(len(idx), N, dtype=torch.bool), idx)


def _fit(batch_size: int, accumulate: int, events: list | None = None):
    net = _net()
    program = PyroProgram(net, num_data=22)
    opt = torch.optim.SGD(net.parameters(), lr=0.5)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: 1.0 / (1 + s))
    losses, clocks = [], []
    set_epoch = program.set_epoch
    program.set_epoch = lambda t: (clocks.append(t), set_epoch(t))[1]
    out = fit_epoch(program, opt, _batches(batch_size), scheduler=sched, clock=epoch_clock(0, 3),
                    step_losses=losses, accumulate=accumulate,
                    on_step=None if events is None else lambda i, v: events.append((i, v)))
    return net, out, losses, clocks, sched


@pytest.mark.parametrize("k", [2, 4])
def test_k_micro_batches_per_step_equal_one_k_times_larger_batch(k):
    """22 examples: batches of 8 (8, 8, 6) against micro-batches of 8 // k accumulated k at a
    time; the short last step is weighted by its examples, as the short big batch is."""
    big_net, big, big_losses, big_clocks, big_sched = _fit(8, 1)
    events = []
    net, out, losses, clocks, sched = _fit(8 // k, k, events)
    assert len(losses) == len(big_losses) == 3 and sched.last_epoch == big_sched.last_epoch == 3
    assert losses == pytest.approx(big_losses, rel=1e-6)
    assert clocks == big_clocks  # one clock move per optimiser step
    assert out["loss"] == pytest.approx(big["loss"], rel=1e-6)
    assert out["nll"] == pytest.approx(big["nll"], rel=1e-6)
    assert [i for i, _ in events] == [0, 1, 2]
    assert [v for _, v in events] == losses
    for (name, p), q in zip(big_net.named_parameters(), net.parameters()):
        torch.testing.assert_close(q, p, rtol=1e-5, atol=1e-6, msg=name)


def test_accumulate_one_is_the_plain_loop_bit_for_bit():
    a_net, a, a_losses, _, _ = _fit(8, 1)
    net = _net()
    program = PyroProgram(net, num_data=22)
    opt = torch.optim.SGD(net.parameters(), lr=0.5)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: 1.0 / (1 + s))
    losses = []
    b = fit_epoch(program, opt, _batches(8), scheduler=sched, clock=epoch_clock(0, 3),
                  step_losses=losses)
    assert losses == a_losses and b == a
    for p, q in zip(a_net.parameters(), net.parameters()):
        assert torch.equal(p, q)


def test_accumulate_must_be_positive():
    net = _net()
    with pytest.raises(ValueError, match="accumulate must be >= 1"):
        fit_epoch(PyroProgram(net, num_data=22), torch.optim.SGD(net.parameters(), lr=0.1),
                  _batches(8), accumulate=0)
