"""The library's kernels under gpytorch's own kernel test case (batch shapes, active dims,
diagonals, indexing, pickling, dtype/device): the checks every gpytorch kernel passes."""

import unittest

import torch
from gpytorch.test.base_kernel_test_case import BaseKernelTestCase

from gpattn_ppl.kernels import ARDRBFKernel, CanonicalSEKernel, ExponentialDotKernel


class TestExponentialDotKernel(unittest.TestCase, BaseKernelTestCase):
    def create_kernel_no_ard(self, **kwargs):
        kernel = ExponentialDotKernel(**kwargs)
        kernel.lengthscale = 3.0          # keeps exp(x x' / l^2) in range for randn data
        return kernel

    def create_kernel_ard(self, num_dims, **kwargs):
        kernel = ExponentialDotKernel(ard_num_dims=num_dims, **kwargs)
        kernel.lengthscale = 3.0
        return kernel


class TestARDRBFKernel(unittest.TestCase, BaseKernelTestCase):
    def create_kernel_no_ard(self, **kwargs):
        return ARDRBFKernel(**kwargs)

    def create_kernel_ard(self, num_dims, **kwargs):
        return ARDRBFKernel(ard_num_dims=num_dims, **kwargs)


class TestCanonicalSEKernel(unittest.TestCase, BaseKernelTestCase):
    def create_kernel_no_ard(self, **kwargs):
        return CanonicalSEKernel(**kwargs)

    @unittest.skip("a kernel without parameters has no device in gpytorch (Kernel.device is None)")
    def test_kernel_dtype_device(self):
        pass


def test_log_forward_is_the_log_of_forward():
    """The log-space evaluation normalised attention uses agrees with the kernel itself."""
    g = torch.Generator().manual_seed(0)
    a, b = torch.randn(2, 5, 4, generator=g, dtype=torch.float64), torch.randn(2, 6, 4, generator=g, dtype=torch.float64)
    for k in (ExponentialDotKernel(ard_num_dims=4), ARDRBFKernel(ard_num_dims=4), CanonicalSEKernel()):
        k = k.double()
        torch.testing.assert_close(k.log_forward(a, b).exp(), k.forward(a, b))
