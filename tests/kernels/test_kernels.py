"""The attention kernels: gpytorch evaluation, log-space path, batch shapes, constraints."""

import math

import pytest
import torch
from gpytorch.constraints import Positive
from gpytorch.kernels import RBFKernel

from gpattn_ppl.kernels import (
    KERNELS,
    ARDRBFKernel,
    ExponentialDotKernel,
    gram,
    log_gram,
    make_attention_kernel,
)

H, D = 3, 4


def _xy(B=2, N=5, M=6, seed=0, scale=0.5):
    g = torch.Generator().manual_seed(seed)
    return (scale * torch.randn(B, H, N, D, generator=g, dtype=torch.float64),
            scale * torch.randn(B, H, M, D, generator=g, dtype=torch.float64))


def _kernel(name, seed=0):
    torch.manual_seed(seed)
    k = make_attention_kernel(name, H, D).double()
    k.outputscale = 0.5 + torch.rand(H, dtype=torch.float64)
    if k.base_kernel.has_lengthscale:
        k.base_kernel.lengthscale = 0.8 + torch.rand(H, 1, D, dtype=torch.float64)
    return k


@pytest.mark.parametrize("name", ["exponential", "rbf"])
def test_gram_equals_gpytorch_evaluation(name):
    k = _kernel(name)
    x, y = _xy()
    G = gram(k, x, y)
    assert G.shape == (2, H, 5, 6)
    torch.testing.assert_close(G, k(x, y).to_dense(), rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(log_gram(k, x, y).exp(), G, rtol=1e-12, atol=1e-12)


def test_exponential_dot_equals_definition():
    k = _kernel("exponential")
    x, y = _xy()
    sf2 = k.outputscale.view(-1, 1, 1)
    ls = k.base_kernel.lengthscale                                        # [H, 1, D]
    expected = sf2 * torch.exp(torch.einsum("bhnd,bhmd->bhnm", x / ls ** 2, y))
    torch.testing.assert_close(gram(k, x, y), expected, rtol=1e-12, atol=1e-12)
    base = k.base_kernel
    torch.testing.assert_close(base.log_forward(x, y), torch.einsum("bhnd,bhmd->bhnm", x / ls ** 2, y))


def test_ard_rbf_equals_gpytorch_rbf_and_definition():
    k = _kernel("rbf")
    x, y = _xy()
    ref = RBFKernel(ard_num_dims=D, batch_shape=torch.Size([H])).double()
    ref.lengthscale = k.base_kernel.lengthscale.detach()
    torch.testing.assert_close(k.base_kernel(x, y).to_dense(), ref(x, y).to_dense())
    ls = k.base_kernel.lengthscale
    diff = (x / ls).unsqueeze(-2) - (y / ls).unsqueeze(-3)                # [B, H, N, M, D]
    torch.testing.assert_close(k.base_kernel.log_forward(x, y), -0.5 * diff.square().sum(-1),
                               rtol=1e-10, atol=1e-12)
    # the expanded form never goes positive (clamped distances)
    assert (k.base_kernel.log_forward(x, x) <= 0).all()


@pytest.mark.parametrize("name", ["exponential", "rbf"])
def test_diag_mode_and_symmetry(name):
    k = _kernel(name)
    x, _ = _xy()
    full = k(x, x).to_dense()
    torch.testing.assert_close(k(x, x, diag=True), full.diagonal(dim1=-2, dim2=-1))
    torch.testing.assert_close(full, full.mT)
    assert (torch.linalg.eigvalsh(full) > -1e-10).all()                   # PSD


@pytest.mark.parametrize("name", ["exponential", "rbf"])
def test_batch_shapes(name):
    k = _kernel(name)
    assert k.batch_shape == (H,) and k.base_kernel.batch_shape == (H,)
    x, y = _xy()
    assert gram(k, x[0], y[0]).shape == (H, 5, 6)                         # [H, N, D] inputs
    assert gram(k, x, y).shape == (2, H, 5, 6)                            # [B, H, N, D] inputs
    assert gram(k, x[:1], y).shape == (2, H, 5, 6)                        # broadcasting over B
    # per-head hyperparameters act per head: changing head 1 leaves heads 0 and 2 alone
    before = gram(k, x, y)
    k.outputscale = k.outputscale.detach() * torch.tensor([1.0, 3.0, 1.0], dtype=torch.float64)
    after = gram(k, x, y)
    torch.testing.assert_close(after[:, [0, 2]], before[:, [0, 2]])
    torch.testing.assert_close(after[:, 1], 3.0 * before[:, 1])


@pytest.mark.parametrize("name", ["exponential", "rbf"])
def test_positivity_constraints(name):
    k = _kernel(name)
    assert isinstance(k.raw_outputscale_constraint, Positive)
    assert isinstance(k.base_kernel.raw_lengthscale_constraint, Positive)
    with torch.no_grad():
        k.raw_outputscale.fill_(-30.0)
        k.base_kernel.raw_lengthscale.normal_(-5.0, 3.0)
    assert (k.outputscale > 0).all() and (k.base_kernel.lengthscale > 0).all()
    x, y = _xy()
    assert torch.isfinite(log_gram(k, x, y)).all()


@pytest.mark.parametrize("name", ["exponential", "rbf"])
def test_gradients_reach_hyperparameters(name):
    k = _kernel(name)
    x, y = _xy()
    gram(k, x, y).sum().backward()
    for pname, p in k.named_parameters():
        assert p.grad is not None and torch.isfinite(p.grad).all() and p.grad.abs().sum() > 0, pname


def test_initialisation_is_scaled_dot_product_and_unit_scale_rbf():
    x, y = _xy()
    k = make_attention_kernel("exponential", H, D).double()
    torch.testing.assert_close(log_gram(k, x, y), x @ y.mT / math.sqrt(D))
    r = make_attention_kernel("rbf", H, D).double()
    sq = (x.unsqueeze(-2) - y.unsqueeze(-3)).square().sum(-1)
    torch.testing.assert_close(log_gram(r, x, y), -0.5 * sq / D)
    assert torch.allclose(k.outputscale, torch.ones(H, dtype=torch.float64))


def test_unknown_kernel_raises():
    with pytest.raises(ValueError, match="allowed"):
        make_attention_kernel("laplace", H, D)
    assert {"exponential", "rbf"} <= set(KERNELS)


def test_kernel_classes_are_gpytorch_kernels():
    e = ExponentialDotKernel(ard_num_dims=D, batch_shape=torch.Size([H]))
    r = ARDRBFKernel(ard_num_dims=D, batch_shape=torch.Size([H]))
    assert e.lengthscale.shape == (H, 1, D) and r.lengthscale.shape == (H, 1, D)
    x = torch.randn(H, 5, D)
    assert e(x).to_dense().shape == (H, 5, 5) and r(x).to_dense().shape == (H, 5, 5)
