"""The canonical SE kernel of the correlated-GP units and its projection initialisation."""

import pytest
import torch
from gpytorch.kernels import RBFKernel

from gpattn_ppl.attention import KernelAttention
from gpattn_ppl.kernels import CanonicalSEKernel, canonical_projection_init_, gram

DT = torch.float64


# -- kernel ---------------------------------------------------------------------------------------
def test_canonical_kernel_is_unit_rbf_without_parameters():
    k = CanonicalSEKernel()
    assert list(k.parameters()) == []
    a, b = torch.randn(2, 6, 3, dtype=DT), torch.randn(2, 4, 3, dtype=DT)
    rbf = RBFKernel().double()
    rbf.lengthscale = 1.0
    torch.testing.assert_close(k(a, b).to_dense(), rbf(a, b).to_dense())
    torch.testing.assert_close(k(a, a, diag=True), torch.ones(2, 6, dtype=DT))
    torch.testing.assert_close(k.log_forward(a, b).exp(), k.forward(a, b))
    far = torch.tensor([[0.0], [1e3]], dtype=DT)
    assert k.forward(far, far)[0, 1] == 0 and torch.isfinite(k.log_forward(far, far)).all()


def test_canonical_projection_init_hits_the_target_distance_and_kernel_attention_uses_it():
    torch.manual_seed(0)
    C, D = 128, 32
    W = canonical_projection_init_(torch.empty(D, C), D)
    x = torch.randn(400, C)
    sq = torch.pdist(x @ W.T).square()
    # E||(x - y) W^T||^2 = 2 ||W||_F^2 = 2 D C s^2, which the init sets to 1.5
    assert 2 * W.square().sum().item() == pytest.approx(1.5, rel=0.05)
    assert sq.mean().item() == pytest.approx(1.5, rel=0.05)
    att = KernelAttention(C, 4, kernel="canonical", normalize=False)
    assert not att.kernel.raw_outputscale.requires_grad
    q, k, _ = att.project(torch.randn(2, 10, C))
    K = gram(att.kernel, q, k)
    torch.testing.assert_close(K, CanonicalSEKernel().forward(q, k))
    assert K.mean() > 0.1  # informative at init (default Linear init gives ~1e-5)
