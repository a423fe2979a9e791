import pytest
import torch

from gpattn_ppl import linalg, settings


def _spd(n=5, seed=0, dtype=torch.float64):
    g = torch.Generator().manual_seed(seed)
    A = torch.randn(n, n, generator=g, dtype=dtype)
    return A @ A.T + n * torch.eye(n, dtype=dtype)


def test_cholesky_matches_torch_and_solves():
    A = _spd()
    L = linalg.cholesky(A)
    torch.testing.assert_close(L @ L.T, A + settings.cholesky_jitter.value(torch.float64) * torch.eye(5, dtype=A.dtype))
    b = torch.randn(5, 2, dtype=torch.float64)
    torch.testing.assert_close(linalg.cholesky_solve(b, L), torch.linalg.solve(A, b), rtol=1e-6, atol=1e-8)
    torch.testing.assert_close(L @ linalg.triangular_solve(b, L), b)
    torch.testing.assert_close(L.T @ linalg.triangular_solve(b, L, transpose=True), b)


def test_escalation_rescues_a_singular_psd_matrix():
    v = torch.randn(6, 1, dtype=torch.float64)
    A = v @ v.T  # rank 1: plain Cholesky fails at jitter 0
    with settings.cholesky_jitter(float64=1e-14, max_tries=8):
        L = linalg.cholesky(A)
    assert torch.isfinite(L).all()


def test_failure_names_module_head_and_eigenvalue():
    A = torch.stack([_spd(), -torch.eye(5, dtype=torch.float64)])[None]  # [1, H=2, 5, 5]
    with settings.cholesky_jitter(max_tries=2):
        with pytest.raises(linalg.CholeskyError, match=r"blocks\.1\.attn, head 1.*smallest eigenvalue -1"):
            linalg.cholesky(A, where="blocks.1.attn", head_dim=1)


def test_nan_matrix_error_is_named():
    A = torch.full((3, 3), float("nan"), dtype=torch.float64)
    with pytest.raises(linalg.CholeskyError, match="blocks.0.attn"):
        linalg.cholesky(A, where="blocks.0.attn")


def test_gp_dtype_promotes_half_precision_and_restores():
    A = _spd(dtype=torch.float32).half()
    assert linalg.cholesky(A).dtype == torch.float32
    with settings.gp_dtype(torch.float64):
        assert linalg.cholesky(A).dtype == torch.float64
    assert settings.gp_dtype.value() == torch.float32
    with pytest.raises(ValueError):
        settings.gp_dtype(torch.float16)


def test_settings_are_scoped():
    assert settings.validate_args.value() is True
    with settings.validate_args(False):
        assert settings.validate_args.value() is False
    assert settings.validate_args.value() is True
    with settings.num_mc_samples(3):
        assert settings.num_mc_samples.value() == 3
    with pytest.raises(ValueError):
        settings.num_mc_samples(0)
