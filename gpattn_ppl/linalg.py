"""The one Cholesky / solve path of the library.

Every factorisation of a kernel matrix goes through :func:`cholesky`: it adds the per-dtype jitter
of :class:`gpattn_ppl.settings.cholesky_jitter`, retries a bounded number of times with ten times
more jitter, and then raises :class:`CholeskyError` naming the module path, the head and the
smallest eigenvalue seen. GP algebra is promoted to :class:`gpattn_ppl.settings.gp_dtype` and runs
with autocast disabled. Nothing here inverts a matrix.
"""

from __future__ import annotations

import contextlib

import torch

from . import settings

__all__ = ["CholeskyError", "cholesky", "cholesky_solve", "triangular_solve", "gp_precision"]


class CholeskyError(RuntimeError):
    """A matrix could not be factorised even after the bounded jitter escalation."""


@contextlib.contextmanager
def gp_precision(device_type: str):
    """Disable autocast for GP linear algebra on ``device_type`` (``"cpu"``, ``"cuda"``)."""
    with torch.autocast(device_type=device_type, enabled=False):
        yield


def _describe_failure(A: torch.Tensor, info: torch.Tensor, where: str, head_dim: int | None) -> str:
    failed = (info > 0).nonzero()
    first = failed[0].tolist() if failed.numel() else []
    msg = f"Cholesky failed in {where or '<unnamed module>'}"
    if head_dim is not None and first:
        msg += f", head {first[head_dim]}"
    if first:
        msg += f" (batch index {tuple(first)})"
        try:
            eig = torch.linalg.eigvalsh(A[tuple(first)].double()).min().item()
            msg += f"; smallest eigenvalue {eig:.3e}"
        except RuntimeError:  # NaN entries make eigvalsh fail too
            msg += "; matrix contains non-finite values"
    return msg


def cholesky(A: torch.Tensor, *, where: str = "", head_dim: int | None = None,
             jitter: float | None = None) -> torch.Tensor:
    r"""Lower Cholesky factor :math:`L L^\top = A + \epsilon I` with bounded jitter escalation.

    :param A: ``[..., n, n]`` symmetric positive (semi-)definite matrices.
    :param where: module path used in the error message (e.g. ``"blocks.1.attn"``).
    :param head_dim: which batch dimension of ``A`` indexes heads, for the error message.
    :param jitter: first jitter; default from :class:`~gpattn_ppl.settings.cholesky_jitter`.
    :returns: ``[..., n, n]`` lower-triangular factor in ``gp_dtype`` (or float64 if ``A`` is).
    :raises CholeskyError: after ``max_tries`` escalations, naming ``where``, head and the
        smallest eigenvalue of the first failing matrix.
    """
    dtype = settings.gp_dtype.resolve(A.dtype)
    with gp_precision(A.device.type):
        A = A.to(dtype)
        eps = settings.cholesky_jitter.value(dtype) if jitter is None else jitter
        eye = torch.eye(A.shape[-1], dtype=dtype, device=A.device)
        L, info = torch.linalg.cholesky_ex(A + eps * eye)
        tries = settings.cholesky_jitter.max_tries()
        for _ in range(tries):
            if not bool((info > 0).any()):
                return L
            eps = eps * 10.0
            L, info = torch.linalg.cholesky_ex(A + eps * eye)
        if bool((info > 0).any()):
            raise CholeskyError(_describe_failure(A, info, where, head_dim)
                                + f"; last jitter {eps:.1e} after {tries} escalations")
        return L


def cholesky_solve(B: torch.Tensor, L: torch.Tensor) -> torch.Tensor:
    r""":math:`A^{-1} B` given the lower Cholesky factor :math:`L` of :math:`A`."""
    with gp_precision(L.device.type):
        return torch.cholesky_solve(B.to(L.dtype), L)


def triangular_solve(B: torch.Tensor, L: torch.Tensor, *, upper: bool = False,
                     transpose: bool = False) -> torch.Tensor:
    r""":math:`L^{-1} B` (or :math:`L^{-\top} B` with ``transpose=True``) for lower-triangular L."""
    with gp_precision(L.device.type):
        if transpose:
            return torch.linalg.solve_triangular(L.mT, B.to(L.dtype), upper=not upper)
        return torch.linalg.solve_triangular(L, B.to(L.dtype), upper=upper)
