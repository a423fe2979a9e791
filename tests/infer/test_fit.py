"""The fit loop: step order, one clock move per step, means, step losses; the LR schedule."""

import pytest
import torch

from gpattn_ppl.data import Batch
from gpattn_ppl.infer import PyroProgram, epoch_clock, fit_epoch, lr_lambda
from gpattn_ppl.models import build_model


def _net(seed=0):
    torch.manual_seed(seed)
    return build_model({"dim": 8, "heads": 2, "depth": 1, "mlp_dim": 8, "dropout": 0.1},
                       num_classes=3, vocab_size=20)


def _batches(n=3, B=4, N=5, events=None):
    g = torch.Generator().manual_seed(1)
    for i in range(n):
        if events is not None:
            events.append(f"batch {i}")
        x = torch.randint(1, 20, (B, N), generator=g)
        mask = torch.ones(B, N, dtype=torch.bool)
        mask[0, 3:] = False
        yield Batch(x, torch.randint(0, 3, (B,), generator=g), mask, torch.arange(i * B, i * B + B))


class _Recording(PyroProgram):
    """Logs the clock and loss calls; reports a fake objective term equal to the step index."""

    def __init__(self, *args, events, **kw):
        super().__init__(*args, **kw)
        self.events, self.steps = events, 0

    def set_epoch(self, t):
        self.events.append(f"clock {t:.3f}")
        return super().set_epoch(t)

    def loss(self, *args):
        self.events.append("loss")
        out = super().loss(*args)
        out.register_hook(lambda g: self.events.append("backward"))
        self.last_terms = {"blocks.0.attn.kl": torch.tensor(float(self.steps))}
        self.steps += 1
        return out


def test_lr_schedule_warmup_never_zero_and_decays_to_min():
    f = lr_lambda("cosine", total_steps=100, warmup_steps=10, min_ratio=0.02)
    assert f(0) == pytest.approx(0.1) and f(9) == pytest.approx(1.0)
    assert f(10) == pytest.approx(1.0) and f(100) == pytest.approx(0.02)
    g = lr_lambda("linear", total_steps=100, warmup_steps=0, min_ratio=0.0)
    assert g(50) == pytest.approx(0.5)


def test_each_step_runs_in_order_with_one_clock_move(monkeypatch):
    events = []
    net = _net()
    program = _Recording(net, num_data=12, events=events)

    class Opt(torch.optim.Adam):
        def zero_grad(self, set_to_none=True):
            events.append("zero_grad")
            super().zero_grad(set_to_none=set_to_none)

        def step(self, closure=None):
            events.append("step")
            return super().step(closure)

    opt = Opt(net.parameters(), lr=1e-3)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: 1.0)
    sched_step = sched.step
    monkeypatch.setattr(sched, "step", lambda: (events.append("scheduler"), sched_step()))
    clip = torch.nn.utils.clip_grad_norm_

    def recording_clip(params, max_norm):
        events.append(f"clip {max_norm}")
        return clip(params, max_norm)

    monkeypatch.setattr(torch.nn.utils, "clip_grad_norm_", recording_clip)
    losses = []
    out = fit_epoch(program, opt, _batches(events=events), scheduler=sched, grad_clip=0.5,
                    clock=epoch_clock(2, 3), step_losses=losses)
    per_step = ["loss", "zero_grad", "backward", "clip 0.5", "step", "scheduler"]
    expected = []
    for i, t in enumerate(("2.000", "2.333", "2.667")):
        expected += [f"batch {i}", f"clock {t}"] + per_step
    assert events == expected
    assert program.epoch == pytest.approx(2 + 2 / 3)
    assert len(losses) == 3 and all(isinstance(v, float) for v in losses)
    assert out["loss"] == pytest.approx(sum(losses) / 3)
    assert out["term/blocks.0.attn.kl"] == pytest.approx(1.0)  # mean of 0, 1, 2
    assert sched.last_epoch == 3


def test_matches_a_hand_written_loop_bit_for_bit():
    net = _net()
    ref = _net()
    torch.manual_seed(5)
    losses = []
    fit_epoch(PyroProgram(net, num_data=12), torch.optim.Adam(net.parameters(), lr=1e-2),
              _batches(), step_losses=losses)
    torch.manual_seed(5)
    opt = torch.optim.Adam(ref.parameters(), lr=1e-2)
    ref_program = PyroProgram(ref, num_data=12)
    ref.train()
    manual = []
    for b in _batches():
        loss = ref_program.loss(b.x, b.mask, b.y, b.index)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        manual.append(float(loss.detach()))
    assert losses == manual
    for a, b in zip(net.parameters(), ref.parameters()):
        assert torch.equal(a, b)


def test_non_finite_loss_and_empty_batches_are_errors():
    net = _net()
    program = PyroProgram(net, num_data=12)
    opt = torch.optim.Adam(net.parameters(), lr=1e-3)
    program.loss = lambda *args: net.head.bias.sum() * float("inf")
    with pytest.raises(FloatingPointError, match="epoch 4, step 1"):
        fit_epoch(program, opt, _batches(n=1), epoch=4)
    with pytest.raises(ValueError, match="no batches"):
        fit_epoch(program, opt, [])


def test_infer_takes_a_network_and_imports_no_models_data_or_application():
    import ast
    from pathlib import Path

    import gpattn_ppl.infer as infer

    for path in Path(infer.__file__).parent.glob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and node.level == 2 and node.module:
                assert node.module.split(".")[0] not in {"models", "data", "run"}, path.name
            if isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                assert not node.module.startswith(("gpattn_ppl.models", "gpattn_ppl.data",
                                                   "gpattn_ppl.run")), path.name
