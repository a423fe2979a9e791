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


# -- the blocked factorisation (settings.blocked_cholesky) ------------------------------------
@pytest.fixture
def small_blocks(monkeypatch):
    """The blocked path with base case 4, so 2-3 levels of recursion at n = 9-13."""
    monkeypatch.setattr(linalg, "BLOCK", 4)
    with settings.blocked_cholesky("on"):
        yield


def _spd_batch(shape, n, seed=0, dtype=torch.float64):
    g = torch.Generator().manual_seed(seed)
    X = torch.randn(*shape, n, n, generator=g, dtype=dtype)
    return X @ X.mT / n + 0.3 * torch.eye(n, dtype=dtype)


def test_blocked_factor_inverse_and_info_match_lapack():
    """L and W = L^{-1} equal LAPACK's factor and its inverse (odd sizes, uneven splits), and
    info is LAPACK's per matrix, wherever the first bad pivot is (leading block, Schur
    complement, last pivot, NaN)."""
    A = _spd_batch((2, 3), 13)
    L, W, info = linalg._blocked(A, 4)
    torch.testing.assert_close(L, torch.linalg.cholesky(A), rtol=0, atol=1e-12)
    torch.testing.assert_close(W, torch.linalg.inv(torch.linalg.cholesky(A)), rtol=0, atol=1e-10)
    assert torch.equal(L, L.tril()) and torch.equal(W, W.tril()) and not info.any()
    bad = _spd_batch((6,), 13, seed=1)
    for i, pivot in enumerate((0, 2, 5, 9, 12)):    # a non-positive pivot at position `pivot`
        bad[i, pivot, pivot] = -5.0
    bad[5, 7, 7] = float("nan")
    _, _, info = linalg._blocked(bad, 4)
    assert torch.equal(info, torch.linalg.cholesky_ex(bad)[1]), info
    assert info.tolist()[:5] == [1, 3, 6, 10, 13] and info[5] > 0


def test_blocked_cholesky_matches_torch_with_a_symmetric_gradient(small_blocks):
    """Values, and gradients equal torch's (symmetric, from the lower triangle) for uses of L
    and of (L, W) through cholesky_factors, in float64 and float32; only the lower triangle
    is read."""
    A0 = _spd_batch((2,), 11, seed=3)
    g = torch.randn(2, 11, 11, dtype=torch.float64)
    for dtype, tol in ((torch.float64, 1e-9), (torch.float32, 2e-4)):
        A = A0.to(dtype).clone().requires_grad_(True)
        with settings.gp_dtype(dtype):
            L = linalg.cholesky(A + torch.triu(torch.ones_like(A), 1))   # upper: never read
        assert L.dtype == dtype
        (L * g.to(dtype)).sum().backward()
        At = A0.to(dtype).clone().requires_grad_(True)
        (torch.linalg.cholesky(At) * g.to(dtype)).sum().backward()
        torch.testing.assert_close(L.detach(), torch.linalg.cholesky(A0.to(dtype)),
                                   rtol=tol, atol=tol)
        torch.testing.assert_close(A.grad, At.grad, rtol=tol, atol=tol)
    A = A0.clone().requires_grad_(True)
    L, W = linalg.cholesky_factors(A)
    ((W ** 2) * g).sum().add(L.diagonal(dim1=-2, dim2=-1).log().sum()).backward()
    with settings.blocked_cholesky("off"):
        At = A0.clone().requires_grad_(True)
        Lt, Wt = linalg.cholesky_factors(At)
        ((Wt ** 2) * g).sum().add(Lt.diagonal(dim1=-2, dim2=-1).log().sum()).backward()
    torch.testing.assert_close(W.detach(), Wt.detach(), rtol=1e-10, atol=1e-10)
    torch.testing.assert_close(A.grad, At.grad, rtol=1e-9, atol=1e-10)


def test_blocked_cholesky_escalates_only_the_failing_matrices_and_names_errors(small_blocks):
    """A matrix failing in its Schur complement gets the jitter, the others keep their
    factors bit for bit; a hopeless one is named (head, eigenvalue); NaN is named; inside
    deferred_checks the failure is recorded without a host synchronisation."""
    from tests.sync import sync_counter

    good = _spd_batch((1, 3), 10, seed=4)
    v = torch.randn(10, 1, dtype=torch.float64)
    A = good.clone()
    A[0, 1] = v @ v.T + torch.diag_embed(torch.tensor([1.0] * 6 + [0.0] * 4, dtype=A.dtype))
    assert linalg._blocked(A, 4)[2].tolist() == [[0, linalg._blocked(A, 4)[2][0, 1].item(), 0]]
    assert linalg._blocked(A, 4)[2][0, 1] > 6                     # fails past the first block
    linalg.reset_numerics_stats(warned=True)
    with pytest.warns(NumericsWarning, match=r"K_o: .* 1 of 3 matrices \(first head 1"):
        L = linalg.cholesky(A, where="K_o", head_axis=1)
    assert linalg.numerics_stats()["escalations"] == 1
    L_good = linalg.cholesky(good)
    assert torch.equal(L[0, 0], L_good[0, 0]) and torch.equal(L[0, 2], L_good[0, 2])
    eps = linalg.numerics_stats()["max_jitter"]
    torch.testing.assert_close(L[0, 1] @ L[0, 1].T, A[0, 1] + eps * torch.eye(10, dtype=A.dtype))
    linalg.reset_numerics_stats(warned=True)
    hopeless = good.clone()
    hopeless[0, 2] = -torch.eye(10, dtype=A.dtype)
    with settings.cholesky_jitter(max_tries=2), pytest.raises(
            linalg.CholeskyError, match=r"blocks\.0\.attn, head 2.*smallest eigenvalue -1"):
        linalg.cholesky(hopeless, where="blocks.0.attn", head_axis=1)
    nan = good.clone()
    nan[0, 0, 7, 2] = float("nan")
    with pytest.raises(linalg.NonFiniteError, match=r"blocks\.0\.attn, head 0.*NaN"):
        linalg.cholesky(nan, where="blocks.0.attn", head_axis=1)
    with linalg.deferred_checks() as box, sync_counter() as s:
        linalg.cholesky_factors(hopeless)
        failed = box.failed()
    assert s.count == 0, s.ops
    assert bool(failed) and linalg.numerics_stats()["escalations"] == 0


def test_blocked_dispatch_rule():
    """'auto' on CPU blocks from CPU_BLOCKED_MIN_N, never at or below the base case; 'off'
    never; 'on' above the base case; other values are refused."""
    big = torch.empty(1, linalg.CPU_BLOCKED_MIN_N, linalg.CPU_BLOCKED_MIN_N)
    small = torch.empty(1, linalg.BLOCK, linalg.BLOCK)
    mid = torch.empty(1, linalg.BLOCK + 1, linalg.BLOCK + 1)
    assert linalg.use_blocked_cholesky(big) and not linalg.use_blocked_cholesky(small)
    with settings.blocked_cholesky("off"):
        assert not linalg.use_blocked_cholesky(big)
    with settings.blocked_cholesky("on"):
        assert linalg.use_blocked_cholesky(mid) and not linalg.use_blocked_cholesky(small)
    with pytest.raises(ValueError, match="blocked_cholesky"):
        settings.blocked_cholesky("yes")
