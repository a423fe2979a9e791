"""Temperature scaling: LBFGS fit against brute-force grid searches and known temperatures."""

from __future__ import annotations

import math

import pytest
import torch

from gpattn_ppl import metrics
from gpattn_ppl.metrics import accuracy, apply_temperature, fit_temperature


def _nll(z: torch.Tensor, y: torch.Tensor, tau) -> torch.Tensor:
    """Reference objective: NLL of the mean over passes of softmax(z_t / tau), for a float tau
    (0-d result) or a float64 vector of taus ``[G]`` (result ``[G]``)."""
    z = (z if z.dim() == 3 else z.unsqueeze(0)).double()
    tau = torch.as_tensor(tau, dtype=torch.float64)
    pbar = torch.softmax(z / tau.reshape(*tau.shape, 1, 1, 1), -1).mean(-3)  # [..., n, K]
    return -pbar[..., torch.arange(len(y)), y].log().mean(-1)


def _grid_fit(z, y, lo: float = -4.0, hi: float = 4.0, points: int = 2001) -> float:
    """Dense grid over log tau, then a second dense grid around the best coarse point."""
    for _ in range(2):
        grid = torch.linspace(lo, hi, points, dtype=torch.float64)
        values = torch.cat([_nll(z, y, chunk.exp()) for chunk in grid.split(100)])
        best = int(values.argmin())
        assert 0 < best < points - 1, "grid minimum on the boundary: widen the range"
        step = (hi - lo) / (points - 1)
        lo, hi = float(grid[best]) - 2 * step, float(grid[best]) + 2 * step
    return math.exp(float(grid[best]))


def _synthetic(n: int, k: int, tau0: float, *, t: int = 1, scale: float = 4.0, seed: int = 0):
    """Logits ``[T, n, K]`` and labels drawn from the model-average softmax(z_t / tau0)."""
    g = torch.Generator().manual_seed(seed)
    base = scale * torch.randn(1, n, k, generator=g, dtype=torch.float64)
    z = base + (0.0 if t == 1 else 1.5 * torch.randn(t, n, k, generator=g, dtype=torch.float64))
    pbar = torch.softmax(z / tau0, -1).mean(0)
    y = torch.multinomial(pbar, 1, generator=g).squeeze(-1)
    return z, y


@pytest.mark.parametrize("tau0", [0.3, 1.0, 2.5])
def test_single_pass_fit_matches_grid_search(tau0):
    z, y = _synthetic(1500, 4, tau0, seed=3)
    fitted = fit_temperature(z[0], y)
    assert fitted == pytest.approx(_grid_fit(z[0], y), rel=1e-3)


@pytest.mark.parametrize("tau0", [0.5, 2.0, 4.0])
def test_recovers_the_temperature_the_labels_were_drawn_with(tau0):
    z, y = _synthetic(20000, 5, tau0, scale=6.0, seed=int(10 * tau0))
    assert fit_temperature(z, y) == pytest.approx(tau0, rel=0.04)


def test_calibrated_logits_give_temperature_one():
    z, y = _synthetic(20000, 3, 1.0, seed=11)
    assert fit_temperature(z, y) == pytest.approx(1.0, rel=0.03)


def test_argmax_and_accuracy_unchanged():
    z, y = _synthetic(800, 6, 0.5, seed=5)  # labels sharper than softmax(z): underconfident
    tau = fit_temperature(z, y)
    assert 0.0 < tau < 1.0
    tempered = apply_temperature(z, tau)
    assert torch.equal(tempered.argmax(-1), z.argmax(-1))
    assert accuracy(torch.softmax(tempered, -1), y) == accuracy(torch.softmax(z, -1), y)
    z2, y2 = _synthetic(5000, 6, 3.0, seed=6)  # labels flatter than softmax(z): overconfident
    assert fit_temperature(z2, y2) > 1.0


def test_multi_pass_fit_matches_grid_search_of_the_averaged_objective():
    z, y = _synthetic(1200, 3, 1.7, t=4, seed=7)
    fitted = fit_temperature(z, y)
    assert fitted == pytest.approx(_grid_fit(z, y), rel=1e-3)
    # the objective is the averaged *probabilities*: a single pass of the mean logits differs
    assert _nll(z, y, fitted) < _nll(z, y, fit_temperature(z.mean(0), y))


def test_multi_pass_differs_from_fitting_on_averaged_logits():
    # two passes that disagree strongly: z_1 = x + D, z_2 = x - D (D along class 0 vs 1). The
    # mean logits are x (weakly informative); the averaged probabilities are dominated by the
    # disagreement, so the two objectives want different temperatures.
    g = torch.Generator().manual_seed(8)
    n = 4000
    x = 1.0 * torch.randn(n, 2, generator=g, dtype=torch.float64)
    d = 6.0 * torch.randn(n, 1, generator=g, dtype=torch.float64) * torch.tensor([1.0, -1.0])
    z = torch.stack([x + d, x - d])
    y = torch.multinomial(torch.softmax(x, -1), 1, generator=g).squeeze(-1)
    tau_passes = fit_temperature(z, y)
    tau_mean = fit_temperature(z.mean(0), y)
    assert tau_mean == pytest.approx(1.0, rel=0.1)  # the labels follow softmax(x)
    assert tau_passes == pytest.approx(_grid_fit(z, y), rel=1e-3)
    assert abs(math.log(tau_passes / tau_mean)) > math.log(2.0)


def test_shapes_dtypes_and_no_gradient_leak():
    z, y = _synthetic(300, 4, 2.0, seed=9)
    z2 = z[0].float().clone().requires_grad_(True)
    tau = fit_temperature(z2, y)
    assert isinstance(tau, float) and z2.grad is None
    assert tau == pytest.approx(fit_temperature(z, y), rel=1e-4)  # float32 vs float64 input
    assert fit_temperature(z[0], y) == fit_temperature(z, y)  # [n, K] is T = 1
    with torch.no_grad():  # works inside an evaluation context
        assert fit_temperature(z, y) == pytest.approx(tau, rel=1e-4)


class _FakeLBFGS:
    """Replaces the optimiser: sets log tau to ``value`` instead of optimising."""

    value = float("nan")

    def __init__(self, params, **kwargs):
        self.params = list(params)

    def zero_grad(self):
        pass

    def step(self, closure):
        with torch.no_grad():
            self.params[0].fill_(self.value)


@pytest.mark.parametrize("value", [float("nan"), float("inf"), -1e6, 3.0])
def test_rejected_fit_returns_one(monkeypatch, value):
    # nan/inf: not finite; -1e6: tau = 0; 3.0: tau = e^3 on calibrated data, worse NLL than 1
    z, y = _synthetic(500, 3, 1.0, seed=12)
    monkeypatch.setattr(_FakeLBFGS, "value", value)
    monkeypatch.setattr(torch.optim, "LBFGS", _FakeLBFGS)
    assert fit_temperature(z, y) == 1.0


def test_bad_inputs_raise():
    z = torch.randn(2, 10, 3)
    y = torch.zeros(10, dtype=torch.long)
    cases = [
        (torch.randn(10), y, "shape"),
        (torch.randn(1, 2, 10, 3), y, "shape"),
        (torch.randn(0, 3), torch.zeros(0, dtype=torch.long), "empty"),
        (torch.ones(10, 3, dtype=torch.long), y, "floating"),
        (torch.full((10, 3), float("nan")), y, "NaN"),
        (z, torch.zeros(9, dtype=torch.long), "length 9"),
        (z, torch.full((10,), 3), r"\[0, 3\)"),
        (z, torch.zeros(10), "integer"),
        (z, torch.zeros(10, 1, dtype=torch.long), "shape"),
        (None, y, "required"),
    ]
    for logits, labels, match in cases:
        with pytest.raises(ValueError, match=match):
            fit_temperature(logits, labels)
    for bad in (0, -3, 1.5, True):
        with pytest.raises(ValueError, match="max_iter"):
            fit_temperature(z, y, max_iter=bad)


def test_apply_temperature():
    z = torch.tensor([[2.0, -1.0, 0.5]])
    assert torch.equal(apply_temperature(z, 2.0), z / 2.0)
    assert torch.equal(apply_temperature(z, torch.tensor(4.0)), z / 4.0)
    w = z.clone().requires_grad_(True)
    apply_temperature(w, 2.0).sum().backward()  # differentiable, like z / tau
    assert torch.allclose(w.grad, torch.full_like(z, 0.5))
    for bad in (0.0, -1.0, float("nan"), float("inf"), True, "warm", None):
        with pytest.raises(ValueError, match="temperature"):
            apply_temperature(z, bad)
    with pytest.raises(ValueError, match="floating"):
        apply_temperature(torch.tensor([1, 2]), 2.0)


def test_exported():
    assert {"fit_temperature", "apply_temperature"} <= set(metrics.__all__)
