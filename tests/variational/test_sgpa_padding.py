"""Standard SGPA with pads anywhere in the sequence: the real tokens get the posterior of the
unpadded sequence -- the leading n_b x n_b block of the free covariance factor, not the rows and
columns at their absolute positions (redesign item 6)."""

import torch

from gpattn_ppl.attention import SGPAttention
from gpattn_ppl.linalg import free_cholesky
from gpattn_ppl.settings import posterior_mean

DT = torch.float64


def _unit():
    torch.manual_seed(0)
    unit = SGPAttention(8, 2, variant="standard", max_len=8, outputscale_init=1.0).to(DT).eval()
    with torch.no_grad():                      # a non-trivial covariance factor
        unit.strategy.raw_chol.copy_(0.3 * torch.randn_like(unit.strategy.raw_chol))
    return unit


def _middle_padded():
    g = torch.Generator().manual_seed(1)
    x = torch.randn(2, 7, 8, generator=g, dtype=DT)
    mask = torch.ones(2, 7, dtype=torch.bool)
    mask[0, 1:3] = False                       # pads at positions 1 and 2
    mask[1, 4] = False
    return x, mask


def test_covariance_root_is_the_leading_block_for_any_pad_positions():
    unit = _unit()
    _, mask = _middle_padded()
    R = unit.strategy.covariance_root(7, mask, DT)
    R_full = free_cholesky(unit.strategy.raw_chol[:, :7, :7]).to(DT)
    for b in range(2):
        real = mask[b].nonzero().squeeze(-1)
        n_b = len(real)
        torch.testing.assert_close(R[b][:, real][:, :, real], R_full[:, :n_b, :n_b])
        pads = (~mask[b]).nonzero().squeeze(-1)
        torch.testing.assert_close(R[b][:, pads][:, :, pads],
                                   torch.eye(len(pads), dtype=DT).expand(2, -1, -1))
        assert R[b][:, real][:, :, pads].abs().max() == 0


def test_middle_padded_posterior_equals_the_unpadded_sequence():
    unit = _unit()
    x, mask = _middle_padded()
    pred = unit.predictive(x, mask)
    with posterior_mean():
        out = unit(x, mask)
    for b in range(2):
        real = mask[b].nonzero().squeeze(-1)
        alone = unit.predictive(x[b:b + 1, real])
        torch.testing.assert_close(pred.mean[b][:, real], alone.mean[0])
        cov = pred.mvn.covariance_matrix[b][..., real, :][..., real]
        torch.testing.assert_close(cov, alone.mvn.covariance_matrix[0])
        with posterior_mean():
            torch.testing.assert_close(out[b, real], unit(x[b:b + 1, real])[0])


def test_trailing_pads_keep_the_absolute_positions():
    """For trailing pads the rank of a real token is its position: nothing changes there."""
    unit = _unit()
    mask = torch.ones(1, 7, dtype=torch.bool)
    mask[0, 5:] = False
    R = unit.strategy.covariance_root(7, mask, DT)
    R_full = free_cholesky(unit.strategy.raw_chol[:, :7, :7]).to(DT)
    torch.testing.assert_close(R[0, :, :5, :5], R_full[:, :5, :5])
