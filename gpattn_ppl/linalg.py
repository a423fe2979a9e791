"""The one Cholesky / solve path of the library.

Every factorisation of a kernel matrix goes through :func:`cholesky`: it adds the per-dtype jitter
of :class:`gpattn_ppl.settings.cholesky_jitter`, retries a bounded number of times with ten times
more jitter, and then raises :class:`CholeskyError` naming the module path, the head and the
smallest eigenvalue seen. GP algebra is promoted to :class:`gpattn_ppl.settings.gp_dtype` and runs
with autocast disabled. Nothing here inverts a matrix.

The pieces every GP head shares live here once: the block trick for padded tokens
(:func:`block_mask`, :func:`mask_rows`), :func:`symmetrise`, the free lower-triangular
parameterisation :func:`free_cholesky` and the relative-jitter factorisation
:func:`scaled_cholesky`.
"""

from __future__ import annotations

import contextlib

import torch

from . import settings
from .errors import GpattnError

__all__ = ["CholeskyError", "block_mask", "cholesky", "cholesky_solve", "free_cholesky", "gp_precision",
           "mask_rows", "scaled_cholesky", "symmetrise", "triangular_solve"]


class CholeskyError(GpattnError, RuntimeError):
    """A matrix could not be factorised even after the bounded jitter escalation."""


@contextlib.contextmanager
def gp_precision(device_type: str):
    """Disable autocast for GP linear algebra on ``device_type`` (``"cpu"``, ``"cuda"``)."""
    with torch.autocast(device_type=device_type, enabled=False):
        yield


def _describe_failure(A: torch.Tensor, info: torch.Tensor, where: str, head_axis: int | None) -> str:
    failed = (info > 0).nonzero()
    first = failed[0].tolist() if failed.numel() else []
    msg = f"Cholesky failed in {where or '<unnamed module>'}"
    if head_axis is not None and first:
        msg += f", head {first[head_axis]}"
    if first:
        msg += f" (batch index {tuple(first)})"
        try:
            eig = torch.linalg.eigvalsh(A[tuple(first)].double()).min().item()
            msg += f"; smallest eigenvalue {eig:.3e}"
        except RuntimeError:  # NaN entries make eigvalsh fail too
            msg += "; matrix contains non-finite values"
    return msg


def cholesky(A: torch.Tensor, *, where: str = "", head_axis: int | None = None,
             jitter: float | None = None) -> torch.Tensor:
    r"""Lower Cholesky factor :math:`L L^\top = A + \epsilon I` with bounded jitter escalation.

    :param A: ``[..., n, n]`` symmetric positive (semi-)definite matrices.
    :param where: module path used in the error message (e.g. ``"blocks.1.attn"``).
    :param head_axis: which batch dimension of ``A`` indexes heads, for the error message.
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
            raise CholeskyError(_describe_failure(A, info, where, head_axis)
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


# -- shared pieces of the GP heads -------------------------------------------------------------
def symmetrise(A: torch.Tensor) -> torch.Tensor:
    r""":math:`\tfrac12(A + A^\top)` over the last two dimensions."""
    return 0.5 * (A + A.mT)


def block_mask(A: torch.Tensor, mask: torch.Tensor | None) -> torch.Tensor:
    r"""The block trick: zero pad rows/columns of ``A: [B, H, N, N]`` and put 1 on the pad diagonal.

    .. math:: \tilde A = A \odot (m m^\top) + \mathrm{diag}(1 - m)

    Padded tokens then decouple from real ones in any factorisation, solve or determinant, and
    the real block equals the computation on the unpadded sequence.
    """
    if mask is None:
        return A
    m = mask[:, None, :].to(A.dtype)                                  # [B, 1, N]
    pair = m.unsqueeze(-1) * m.unsqueeze(-2)                           # [B, 1, N, N]
    return A * pair + torch.diag_embed(1.0 - m)


def mask_rows(t: torch.Tensor, mask: torch.Tensor | None) -> torch.Tensor:
    """Zero the pad token rows of ``t: [B, H, N, *]`` (``mask: [B, N]``, True = real)."""
    if mask is None:
        return t
    return t.masked_fill(~mask[:, None, :, None], 0.0)


def free_cholesky(raw: torch.Tensor) -> torch.Tensor:
    r"""Lower-triangular factor with positive diagonal from an unconstrained square tensor.

    .. math:: R = \mathrm{tril}(\text{raw}, -1) + \mathrm{diag}(\exp \mathrm{diag}\,\text{raw})

    ``raw = 0`` gives :math:`R = I`. The strict upper triangle of ``raw`` is unused.
    """
    return torch.tril(raw, -1) + torch.diag_embed(raw.diagonal(dim1=-2, dim2=-1).exp())


def scaled_cholesky(A: torch.Tensor, d: torch.Tensor, *, where: str, head_axis: int
                    ) -> torch.Tensor:
    r"""Cholesky factor with a jitter *relative* to ``d`` (the prior variances), by equilibration.

    .. math::
        L = \Delta^{1/2}\,\mathrm{chol}\big(\Delta^{-1/2} A \Delta^{-1/2} + \epsilon I\big), \qquad
        LL^\top = A + \epsilon\Delta, \quad \Delta = \mathrm{diag}(d)

    through :func:`cholesky` (its jitter, bounded escalation and named error). The factorised
    matrix has entries of order one whatever the kernel's amplitude, so a singular kernel matrix
    is rescued by the escalation in float32 too. No host synchronisation.

    :param A: ``[..., n, n]``. :param d: ``[..., n]`` positive scales (pads: 1).
    """
    s = d.clamp_min(torch.finfo(d.dtype).tiny).rsqrt()
    L = cholesky(A * (s.unsqueeze(-1) * s.unsqueeze(-2)), where=where, head_axis=head_axis)
    return L * (1.0 / s).unsqueeze(-1).to(L.dtype)
