import pytest
import torch

from gpattn_ppl import linalg, settings
from gpattn_ppl.errors import NumericsWarning


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
    A = v @ v.T  # rank 1: plain Cholesky fails at jitter 0 (the first try adds none)
    linalg.reset_numerics_stats(warned=True)
    with settings.cholesky_jitter(float64=1e-14, max_tries=8), \
            pytest.warns(NumericsWarning, match="escalated"):
        L = linalg.cholesky(A)
    assert torch.isfinite(L).all()
    assert linalg.numerics_stats()["escalations"] == 1
    linalg.reset_numerics_stats(warned=True)


def test_failure_names_module_head_and_eigenvalue():
    A = torch.stack([_spd(), -torch.eye(5, dtype=torch.float64)])[None]  # [1, H=2, 5, 5]
    with settings.cholesky_jitter(max_tries=2):
        with pytest.raises(linalg.CholeskyError, match=r"blocks\.1\.attn, head 1.*smallest eigenvalue -1"):
            linalg.cholesky(A, where="blocks.1.attn", head_axis=1)


def test_nan_matrix_error_is_named():
    A = torch.full((3, 3), float("nan"), dtype=torch.float64)
    with pytest.raises(linalg.CholeskyError, match="blocks.0.attn"):
        linalg.cholesky(A, where="blocks.0.attn")


def test_shared_pieces_of_the_gp_heads():
    """block_mask / mask_rows decouple pads; free_cholesky is lower with positive diagonal;
    scaled_cholesky factors A + eps diag(d); symmetrise averages with the transpose."""
    A = _spd(4)[None, None]                                   # [1, 1, 4, 4]
    mask = torch.tensor([[True, False, True, True]])
    Am = linalg.block_mask(A, mask)
    torch.testing.assert_close(Am[0, 0, 1], torch.tensor([0.0, 1.0, 0.0, 0.0], dtype=A.dtype))
    torch.testing.assert_close(Am[0, 0][[0, 2, 3]][:, [0, 2, 3]], A[0, 0][[0, 2, 3]][:, [0, 2, 3]])
    t = torch.ones(1, 2, 4, 3, dtype=A.dtype)
    assert linalg.mask_rows(t, mask)[:, :, 1].abs().sum() == 0
    raw = torch.randn(3, 3, dtype=A.dtype)
    R = linalg.free_cholesky(raw)
    assert torch.equal(R, R.tril()) and (R.diagonal() > 0).all()
    torch.testing.assert_close(R.diagonal(), raw.diagonal().exp())
    d = A[0, 0].diagonal()
    L = linalg.scaled_cholesky(A, d[None, None], where="x", head_axis=1)
    eps = settings.cholesky_jitter.value(A.dtype)
    torch.testing.assert_close(L @ L.mT, A + eps * torch.diag_embed(d)[None, None])
    B = torch.randn(3, 3, dtype=A.dtype)
    torch.testing.assert_close(linalg.symmetrise(B), 0.5 * (B + B.T))



# -- inverse factors and deferred checks ---------------------------------------------------------
def test_cholesky_factors_match_torch_and_their_backward_is_torchs():
    """(L, W) equal torch's factor and its triangular inverse; the matmul-only backward equals
    torch's autograd through cholesky + solve_triangular (any mix of L and W used), and passes
    gradcheck."""
    g = torch.Generator().manual_seed(1)
    X = torch.randn(2, 3, 6, 6, generator=g, dtype=torch.float64)
    A0 = X @ X.mT + 0.5 * torch.eye(6, dtype=torch.float64)
    weights = torch.randn(2, 6, 6, generator=g, dtype=torch.float64)

    def loss(L, W, use):
        out = (L * weights[0]).sum() if "L" in use else 0.0
        out = out + ((W ** 2) * weights[1]).sum() if "W" in use else out
        return out + L.diagonal(dim1=-2, dim2=-1).log().sum() if "logdet" in use else out

    for use in (("L",), ("W",), ("L", "W"), ("W", "logdet")):
        A = A0.clone().requires_grad_(True)
        L, W = linalg.cholesky_factors(A)
        loss(L, W, use).backward()
        ours = A.grad
        A = A0.clone().requires_grad_(True)
        Lt = torch.linalg.cholesky(A)
        Wt = torch.linalg.solve_triangular(Lt, torch.eye(6, dtype=A.dtype).expand_as(Lt),
                                           upper=False)
        loss(Lt, Wt, use).backward()
        torch.testing.assert_close(L, Lt.detach(), rtol=0, atol=1e-12)
        torch.testing.assert_close(W, Wt.detach(), rtol=1e-10, atol=1e-12)
        torch.testing.assert_close(ours, A.grad, rtol=1e-9, atol=1e-11)
    assert torch.autograd.gradcheck(
        lambda A: linalg.cholesky_factors(linalg.symmetrise(A))[1], (A0.clone().requires_grad_(),))


def test_cholesky_reads_only_the_lower_triangle_and_adds_no_jitter_when_it_succeeds():
    A = _spd(5)
    noisy_upper = A + torch.triu(torch.full_like(A, 7.0), 1)
    torch.testing.assert_close(linalg.cholesky(noisy_upper), torch.linalg.cholesky(A),
                               rtol=0, atol=0)


def test_deferred_checks_record_failures_without_raising_and_the_checked_call_rescues():
    A = torch.stack([_spd(4), -torch.eye(4, dtype=torch.float64)])
    with linalg.deferred_checks() as box:
        linalg.cholesky(A)                     # no error, no escalation: recorded
        linalg.cholesky(_spd(4))
    assert box.calls == 2 and bool(box.failed())
    assert linalg.numerics_stats()["escalations"] == 0
    with linalg.deferred_checks() as box:
        linalg.cholesky_factors(_spd(4))
    assert box.calls == 1 and not bool(box.failed())
    with pytest.raises(linalg.CholeskyError):  # outside the block: checked at once
        linalg.cholesky(A)
