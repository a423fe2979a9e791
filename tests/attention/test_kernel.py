import pytest
import torch
from gpytorch.kernels import RBFKernel, ScaleKernel

from gpattn_ppl.attention import KernelAttention
from gpattn_ppl.testing import AttentionUnitTestCase


class TestKernelAttentionAsym(AttentionUnitTestCase):
    # normalised attention: the amplitude sigma_f^2 cancels in the row normalisation
    params_without_grad = frozenset({"kernel.raw_outputscale"})

    def make_unit(self, dim, heads):
        return KernelAttention(dim, heads, kernel="exponential", symmetric=False)


class TestKernelAttentionSymRBF(AttentionUnitTestCase):
    params_without_grad = frozenset({"kernel.raw_outputscale"})

    def make_unit(self, dim, heads):
        return KernelAttention(dim, heads, kernel="rbf", symmetric=True)


class TestKernelAttentionUnnormalised(AttentionUnitTestCase):
    def make_unit(self, dim, heads):
        return KernelAttention(dim, heads, kernel="rbf", symmetric=False, normalize=False)


def _x(B=2, N=5, C=8, seed=0):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(B, N, C, generator=g, dtype=torch.float64)


def test_rbf_matrix_equals_gpytorch_kernel():
    unit = KernelAttention(8, 2, kernel="rbf", symmetric=False, normalize=False).double()
    x = _x()
    q, k, _ = unit.project(x)
    ref = ScaleKernel(RBFKernel(ard_num_dims=4, batch_shape=torch.Size([2])),
                      batch_shape=torch.Size([2])).double()
    ref.base_kernel.lengthscale = unit.kernel.base_kernel.lengthscale.detach()
    ref.outputscale = torch.tensor([0.7, 1.3], dtype=torch.float64)
    unit.kernel.outputscale = torch.tensor([0.7, 1.3], dtype=torch.float64)
    expected = ref(q, k).to_dense()
    torch.testing.assert_close(unit.attention_matrix(x, None), expected)


def test_exponential_matrix_equals_definition():
    unit = KernelAttention(8, 2, kernel="exponential", normalize=False).double()
    unit.kernel.base_kernel.lengthscale = torch.rand(2, 1, 4, dtype=torch.float64) + 1.0
    x = _x()
    q, k, _ = unit.project(x)
    ls = unit.kernel.base_kernel.lengthscale
    expected = unit.kernel.outputscale.view(-1, 1, 1) * torch.exp(
        torch.einsum("bhnd,bhmd->bhnm", q / ls**2, k))
    torch.testing.assert_close(unit.attention_matrix(x, None), expected)
    # the gpytorch evaluation path agrees too
    torch.testing.assert_close(unit.kernel(q, k).to_dense(), expected)


@pytest.mark.parametrize("kernel", ["rbf", "exponential"])
def test_symmetric_gram_is_symmetric_psd(kernel):
    unit = KernelAttention(8, 2, kernel=kernel, symmetric=True, normalize=False).double()
    K = unit.attention_matrix(_x(), None)
    torch.testing.assert_close(K, K.mT)
    assert torch.linalg.eigvalsh(K).min() > -1e-10


def test_asymmetric_matrix_is_not_symmetric():
    unit = KernelAttention(8, 2, kernel="rbf", symmetric=False, normalize=False).double()
    K = unit.attention_matrix(_x(), None)
    assert (K - K.mT).abs().max() > 1e-3


def test_normalised_equals_nadaraya_watson_and_pads_get_zero():
    unit = KernelAttention(8, 2, kernel="rbf", symmetric=False, normalize=True).double()
    raw = KernelAttention(8, 2, kernel="rbf", symmetric=False, normalize=False).double()
    raw.load_state_dict(unit.state_dict())
    x = _x()
    mask = torch.tensor([[1, 1, 1, 0, 0], [1, 1, 1, 1, 1]], dtype=torch.bool)
    A = unit.attention_matrix(x, mask)
    K = raw.attention_matrix(x, mask)
    torch.testing.assert_close(A, K / K.sum(-1, keepdim=True))
    torch.testing.assert_close(A.sum(-1), torch.ones_like(A.sum(-1)))
    assert torch.all(A[0, :, :, 3:] == 0) and torch.all(K[0, :, :, 3:] == 0)


def test_unnormalised_output_is_K_V():
    unit = KernelAttention(8, 2, kernel="exponential", normalize=False).double()
    x = _x()
    q, k, v = unit.project(x)
    K = unit.attention_matrix(x, None)
    expected = unit.out(unit.merge_heads(K @ v))
    torch.testing.assert_close(unit(x), expected)


def test_unknown_kernel_names_allowed():
    with pytest.raises(ValueError, match="allowed: exponential, rbf"):
        KernelAttention(8, 2, kernel="matern")
