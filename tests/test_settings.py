import pytest
import torch

from gpattn_ppl import linalg, settings


def _spd(n=5, seed=0, dtype=torch.float64):
    g = torch.Generator().manual_seed(seed)
    A = torch.randn(n, n, generator=g, dtype=dtype)
    return A @ A.T + n * torch.eye(n, dtype=dtype)


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
    assert settings.posterior_mean.on() is False
    with settings.posterior_mean():
        assert settings.posterior_mean.on() is True
        with settings.posterior_mean(False):
            assert settings.posterior_mean.on() is False
    assert settings.posterior_mean.on() is False
    assert not hasattr(settings, "num_mc_samples")      # dead setting removed: T is eval.mc_samples
