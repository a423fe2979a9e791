"""The one Cholesky / solve path of the library.

Every factorisation of a kernel matrix goes through :func:`cholesky` with a ``where`` (module
path and matrix) and reports itself:

* the first factorisation adds no jitter (a caller may pass a jitter that is part of its model);
* a matrix with NaN or inf entries raises :class:`NonFiniteError` at once, naming ``where``, the
  head and batch index, the NaN / inf counts and, for inf, the overflow (no jitter is tried);
* a finite matrix that fails -- only that matrix: the others keep their factors bit for bit --
  gets the jitter of :class:`gpattn_ppl.settings.cholesky_jitter`, multiplied by 10 up to
  ``max_tries`` times (as gpytorch's ``psd_safe_cholesky``); every matrix rescued so is counted
  (:func:`numerics_stats`) and warned about once per ``where``
  (:class:`~gpattn_ppl.errors.NumericsWarning`);
* one that fails after the last escalation raises :class:`CholeskyError` naming ``where``, the
  head and the smallest eigenvalue.

Host synchronisations: outside :class:`deferred_checks` the check costs one per call (one
boolean over the batch). Inside it (the trainer's fast path) there is none: each call records its
``info`` on the device and the loop reads all of them with the loss, in its one synchronisation
per step, re-running a step whose factorisations failed with the checks on (and so with the
escalation). GP algebra is promoted to :class:`gpattn_ppl.settings.gp_dtype` and runs with
autocast disabled. Nothing here inverts a matrix; :func:`cholesky_factors` forms the inverse of
a triangular factor by a triangular solve, as gpytorch's variational strategy does.

The pieces every GP head shares live here once: the block trick for padded tokens
(:func:`block_mask`, :func:`mask_rows`), :func:`symmetrise`, the free lower-triangular
parameterisation :func:`free_cholesky` and the relative-jitter factorisation
:func:`scaled_cholesky`.
"""

from __future__ import annotations

import contextlib
import copy
import threading
import warnings

import torch
from torch.autograd.function import once_differentiable

from . import settings
from .errors import GpattnError, NumericsWarning

__all__ = ["CholeskyError", "NonFiniteError", "block_mask", "cholesky", "cholesky_factors",
           "cholesky_solve", "deferred_checks", "free_cholesky", "gp_precision", "mask_rows",
           "numerics_stats", "reset_numerics_stats", "scaled_cholesky", "symmetrise",
           "triangular_solve", "use_blocked_cholesky"]


class CholeskyError(GpattnError, RuntimeError):
    """A matrix could not be factorised even after the bounded jitter escalation."""


class NonFiniteError(CholeskyError):
    """A matrix handed to :func:`cholesky` has NaN or inf entries (inf: an overflow)."""


# -- the process-wide escalation counter --------------------------------------------------------
_STATS: dict = {"escalations": 0, "max_jitter": 0.0, "by_where": {}}
_WARNED: set[str] = set()


def numerics_stats() -> dict:
    """Jitter escalations since the last :func:`reset_numerics_stats`: ``{"escalations": number
    of matrices that needed more than the first jitter, "max_jitter": the largest jitter used
    (0.0 if none), "by_where": {where: escalations}}`` (a copy)."""
    return copy.deepcopy(_STATS)


def reset_numerics_stats(*, warned: bool = False) -> None:
    """Zero the counter of :func:`numerics_stats`; ``warned=True`` also forgets which ``where``
    were warned about, so each warns again on its next escalation (a new run)."""
    _STATS.update(escalations=0, max_jitter=0.0, by_where={})
    if warned:
        _WARNED.clear()


def _record(where: str, count: int, jitter: float, total: int, first: str) -> None:
    where, jitter = where or "<unnamed>", float(f"{jitter:.6g}")  # 1e-4, not 9.999999999999999e-05
    _STATS["escalations"] += count
    _STATS["max_jitter"] = max(_STATS["max_jitter"], jitter)
    _STATS["by_where"][where] = _STATS["by_where"].get(where, 0) + count
    if where not in _WARNED:
        _WARNED.add(where)
        warnings.warn(f"{where}: Cholesky jitter escalated to {jitter:.0e} for {count} of {total} "
                      f"matrices ({first}) -- a near-singular kernel matrix; counted in "
                      "gpattn_ppl.linalg.numerics_stats() and the run's numerics log (warned "
                      "once per place)", NumericsWarning, stacklevel=4)


@contextlib.contextmanager
def gp_precision(device_type: str):
    """Disable autocast for GP linear algebra on ``device_type`` (``"cpu"``, ``"cuda"``)."""
    with torch.autocast(device_type=device_type, enabled=False):
        yield


def _position(flat: int, batch_shape: torch.Size, head_axis: int | None) -> str:
    """``"head h (batch index (..))"`` of the flat batch index ``flat``."""
    index, rest = [], flat
    for size in reversed(batch_shape):
        index.append(rest % size)
        rest //= size
    index = tuple(reversed(index))
    head = f"head {index[head_axis]} " if head_axis is not None and head_axis < len(index) else ""
    return f"{head}(batch index {index})" if index else "the matrix"


def _nonfinite_message(M: torch.Tensor, where: str, pos: str, affected: int, total: int) -> str:
    """What is wrong with the non-finite matrix ``M`` (NaN / inf counts, overflow)."""
    M = M.detach()
    nan, inf, n = int(torch.isnan(M).sum()), int(torch.isinf(M).sum()), M.numel()
    parts = []
    if inf:
        parts.append(f"{inf} of {n} entries are inf: the values overflow {_name(M.dtype)} (max "
                     f"{torch.finfo(M.dtype).max:.1e})")
    if nan:
        parts.append(f"{nan} of {n} entries are NaN")
    msg = (f"non-finite matrix in {where or '<unnamed module>'}, {pos}: " + " and ".join(parts)
           + f" ({affected} of {total} matrices; no jitter tried)")
    if inf:
        msg += "; lower the input scale (normalise the inputs)"
        if M.dtype != torch.float64:
            msg += " or compute in float64 (settings.gp_dtype(torch.float64))"
    else:
        msg += "; the NaN comes from upstream (a NaN input or parameter, or an earlier overflow)"
    return msg


def _name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


def _describe_failure(A: torch.Tensor, flat: int, batch_shape: torch.Size, where: str,
                      head_axis: int | None) -> str:
    A = A.detach()
    msg = f"Cholesky failed in {where or '<unnamed module>'}"
    pos = _position(flat, batch_shape, head_axis)
    msg += f", {pos}" if batch_shape else ""
    try:
        eig = torch.linalg.eigvalsh(A.double()).min().item()
        msg += f"; smallest eigenvalue {eig:.3e}"
    except RuntimeError:  # pragma: no cover -- A is finite here
        pass
    big = float(A.abs().max())
    if big > torch.finfo(A.dtype).max / max(A.shape[-1], 1):
        msg += (f"; entries up to {big:.1e} overflow {_name(A.dtype)} in the factorisation "
                "(lower the input scale or use settings.gp_dtype(torch.float64))")
    return msg


# -- deferred checks -----------------------------------------------------------------------------
_LOCAL = threading.local()


class deferred_checks(contextlib.ContextDecorator):
    """Inside this block :func:`cholesky` does not synchronise: each call records its LAPACK
    ``info`` on the device and returns its factor unchecked (a failed factor is garbage).

    The caller reads :meth:`failed` once -- together with its loss, in one synchronisation --
    and re-runs a computation whose factorisations failed outside the block, where the failing
    matrices get their jitter (or a named error). The fit loop does this every step
    (:func:`gpattn_ppl.infer.fit_epoch`).

    >>> with deferred_checks() as box:
    ...     L = cholesky(-torch.eye(2))
    >>> bool(box.failed())
    True
    """

    def __init__(self) -> None:
        self._infos: list[torch.Tensor] = []
        self._outer = None

    def __enter__(self) -> deferred_checks:
        self._infos = []
        self._outer = getattr(_LOCAL, "deferred", None)
        _LOCAL.deferred = self
        return self

    def __exit__(self, *exc) -> bool:
        _LOCAL.deferred = self._outer
        return False

    def record(self, info: torch.Tensor) -> None:
        """Keep one call's ``info`` (no synchronisation)."""
        self._infos.append(info.reshape(-1))

    @property
    def calls(self) -> int:
        """How many factorisations ran unchecked in the block."""
        return len(self._infos)

    def failed(self) -> torch.Tensor:
        """A 0-d bool device tensor: whether any factorisation of the block failed (no
        synchronisation; ``False`` when there was none)."""
        if not self._infos:
            return torch.tensor(False)
        return torch.cat(self._infos).gt(0).any()


def _deferred() -> deferred_checks | None:
    return getattr(_LOCAL, "deferred", None)


def cholesky(A: torch.Tensor, *, where: str = "", head_axis: int | None = None,
             jitter: float | None = None, _inverse: bool = False) -> torch.Tensor:
    r"""Lower Cholesky factor :math:`L L^\top = A` with per-matrix jitter only where it fails.

    Only the lower triangle of ``A`` is read (the upper one need not be formed exactly); the
    gradient is symmetric, as torch's. Large matrices are factorised by recursive 2 x 2 blocks
    where that is faster (:class:`~gpattn_ppl.settings.blocked_cholesky`,
    :func:`use_blocked_cholesky`), with the same checks.

    :param A: ``[..., n, n]`` symmetric positive (semi-)definite matrices.
    :param where: module path and matrix, named in warnings and errors (``"blocks.1.attn K_kk"``).
    :param head_axis: which batch dimension of ``A`` indexes heads, for the messages.
    :param jitter: a jitter :math:`\epsilon_0` that is part of the caller's model, added to every
        matrix (default 0: none). Escalation then starts from 10 :math:`\epsilon_0`.
    :returns: ``[..., n, n]`` lower-triangular factor in ``gp_dtype`` (or float64 if ``A`` is).
        A matrix that failed gets :math:`L_iL_i^\top = A_i + \epsilon_i I` with the smallest
        :math:`\epsilon_i = 10^t\epsilon` (``cholesky_jitter``) that factorises it; the others
        are untouched.
    :raises NonFiniteError: ``A`` has NaN or inf entries (named, with the overflow for inf).
    :raises CholeskyError: a matrix still fails after ``max_tries`` escalations (names ``where``,
        the head and its smallest eigenvalue).

    (``_inverse=True``, for :func:`cholesky_factors`: return ``(L, W)`` with ``W = L^{-1}``
    where the blocked factorisation formed it, else ``None``; every factorisation of the
    library stays one call of this function.)
    """
    out = _checked_cholesky(A, where, head_axis, jitter)
    return out if _inverse else out[0]


def _checked_cholesky(A: torch.Tensor, where: str, head_axis: int | None,
                      jitter: float | None) -> tuple[torch.Tensor, torch.Tensor | None]:
    """:func:`cholesky`, returning ``(L, W)``: ``W = L^{-1}`` where the blocked factorisation
    formed it on the way, else ``None``."""
    dtype = settings.gp_dtype.resolve(A.dtype)
    with gp_precision(A.device.type):
        A = A.to(dtype)
        eps = 0.0 if jitter is None else float(jitter)
        eye = torch.eye(A.shape[-1], dtype=dtype, device=A.device) if eps else None
        L, info, W = _factor(A + eps * eye if eps else A)
        box = _deferred()
        if box is not None:  # checked by the caller, once per step, with its loss
            box.record(info)
            return L, W
        # LAPACK flags a NaN or a non-positive pivot; an inf on A's diagonal leaves an inf on
        # L's, so checking L's diagonal (O(n), not O(n^2)) catches every non-finite lower triangle
        bad = (info > 0) | ~torch.isfinite(L.diagonal(dim1=-2, dim2=-1)).all(-1)
        if not bool(bad.any()):  # the one host synchronisation of a checked call
            return L, W
        return _escalate(A, bad, eps, eye, where, head_axis)


# -- the blocked factorisation --------------------------------------------------------------------
#: largest matrix the blocked factorisation hands to LAPACK whole (its base case)
BLOCK = 128
#: ``blocked_cholesky("auto")`` on CPU: blocked from this size up. Measured
#: (``benchmarks/bench_cholesky.py --threads 1 --rounds 3``,
#: ``benchmarks/results/item4_cholesky_cpu.json``; factor and inverse against LAPACK + one
#: triangular solve, base case 128): n <= 256, batch 8-512: 0.2-0.95x (slower) in fp32 and fp64;
#: n = 512: 0.69-0.86x fp32, 0.88-0.98x fp64; n = 1024, batch 8: 2.0x fp32, 1.44x fp64.
CPU_BLOCKED_MIN_N = 1024


def use_blocked_cholesky(A: torch.Tensor) -> bool:
    """Whether :func:`cholesky` factorises ``A: [..., n, n]`` by blocks: ``"off"`` never, ``"on"``
    when ``n > BLOCK``, ``"auto"`` on CPU when ``n >= CPU_BLOCKED_MIN_N`` (measured there), never
    on other devices (not measured yet: cuSOLVER's batched factorisation stays)."""
    mode, n = settings.blocked_cholesky.value(), A.shape[-1]
    if mode == "off" or n <= BLOCK:
        return False
    return mode == "on" or (A.device.type == "cpu" and n >= CPU_BLOCKED_MIN_N)


def _blocked(A: torch.Tensor, block: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    r"""``(L, W = L^{-1}, info)`` of ``A: [..., n, n]`` by recursive 2 x 2 blocks (no autograd).

    .. math::
        L_{11} = \mathrm{chol}(A_{11}),\quad L_{21} = A_{21} W_{11}^\top,\quad
        L_{22} = \mathrm{chol}(A_{22} - L_{21}L_{21}^\top),\quad
        W_{21} = -W_{22} L_{21} W_{11},

    base cases (``n <= block``) by LAPACK and one triangular solve; everything else is batched
    products. Only the lower triangle of ``A`` is read. ``info`` is LAPACK's per matrix (the
    1-based order of the first non-positive or NaN pivot, 0 when it factorised): a matrix whose
    leading block failed carries garbage into its Schur complement but only into its own.
    """
    n = A.shape[-1]
    if n <= block:
        L, info = torch.linalg.cholesky_ex(A)
        return L, _triangular_inverse(L), info
    h = n // 2
    L11, W11, i1 = _blocked(A[..., :h, :h], block)
    L21 = A[..., h:, :h] @ W11.mT
    L22, W22, i2 = _blocked(A[..., h:, h:] - L21 @ L21.mT, block)
    W21 = -(W22 @ (L21 @ W11))
    zero = A.new_zeros(A.shape[:-2] + (h, n - h))
    L = torch.cat([torch.cat([L11, zero], -1), torch.cat([L21, L22], -1)], -2)
    W = torch.cat([torch.cat([W11, zero], -1), torch.cat([W21, W22], -1)], -2)
    return L, W, torch.where(i1 > 0, i1, torch.where(i2 > 0, i2 + h, i2))


def _factor(A: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
    """``(L, info, W or None)``: one LAPACK call per matrix (``W = None``), or the blocked
    factorisation where :func:`use_blocked_cholesky` says so, its gradient the symmetric one of
    ``_InverseFactor`` (products with the ``W`` it formed)."""
    if not use_blocked_cholesky(A):
        L, info = torch.linalg.cholesky_ex(A)
        return L, info, None
    with torch.no_grad():
        L, W, info = _blocked(A.detach(), BLOCK)
    if A.requires_grad:
        L, W = _InverseFactor.apply(A, L, W)
    return L, info, W


def _escalate(A: torch.Tensor, bad: torch.Tensor, eps: float, eye: torch.Tensor | None,
              where: str, head_axis: int | None) -> tuple[torch.Tensor, torch.Tensor | None]:
    """The failure path of :func:`cholesky`: name non-finite matrices, find each failing
    matrix's jitter (the ``cholesky_jitter`` value, or 10 ``eps``, then 10x per try), then
    factorise the batch once with per-matrix jitter (the first factor is dropped: its failed
    entries would poison the backward pass with NaN). Returns ``(L, W or None)`` as
    :func:`_checked_cholesky`; the tries and the final factorisation take the same path
    (:func:`_factor`), so the matrices that needed no jitter keep their factors bit for bit."""
    n, batch_shape = A.shape[-1], A.shape[:-2]
    flat_A, flat_bad = A.reshape(-1, n, n), bad.reshape(-1)
    total = flat_bad.numel()
    nonfinite = (~torch.isfinite(flat_A).flatten(-2).all(-1)).nonzero().flatten()
    if nonfinite.numel():
        i = int(nonfinite[0])
        pos = _position(i, batch_shape, head_axis)
        raise NonFiniteError(_nonfinite_message(flat_A[i], where, pos, nonfinite.numel(), total))
    failing = flat_bad.nonzero().flatten()
    if eye is None:
        eye = torch.eye(n, dtype=A.dtype, device=A.device)
    tries = settings.cholesky_jitter.max_tries()
    base = settings.cholesky_jitter.value(A.dtype)
    levels = ([base * 10.0 ** t for t in range(tries)] if eps == 0
              else [eps * 10.0 ** t for t in range(1, tries + 1)])
    jit = torch.full((total,), eps, dtype=A.dtype, device=A.device)
    top = level = eps
    with torch.no_grad():
        left, sub = failing, flat_A[failing]
        for level in levels:
            L_sub, info, _ = _factor(sub + level * eye)
            ok = (info == 0) & torch.isfinite(L_sub.diagonal(dim1=-2, dim2=-1)).all(-1)
            if bool(ok.any()):
                jit[left[ok]], top = level, level
            left, sub = left[~ok], sub[~ok]
            if not left.numel():
                break
    if left.numel():
        i = int(left[0])
        raise CholeskyError(_describe_failure(flat_A[i], i, batch_shape, where, head_axis)
                            + f"; last jitter {level:.1e} after {len(levels)} escalations")
    L, info, W = _factor(A + jit.view(batch_shape + (1, 1)) * eye)
    if bool((info > 0).any()):  # pragma: no cover -- the same inputs factorised above
        raise CholeskyError(f"Cholesky failed in {where or '<unnamed module>'} with the "
                            "jitter that factorised it a moment ago")
    first = _position(int(failing[0]), batch_shape, head_axis)
    _record(where, failing.numel(), top, total, f"first {first}" if batch_shape else first)
    return L, W


def _triangular_inverse(L: torch.Tensor) -> torch.Tensor:
    """:math:`L^{-1}` of lower-triangular ``L`` by the solve :math:`XL = I` (the right-sided
    solve is the faster layout for LAPACK's trsm here)."""
    eye = torch.eye(L.shape[-1], dtype=L.dtype, device=L.device)
    return torch.linalg.solve_triangular(L, eye.expand_as(L), upper=False, left=False)


class _InverseFactor(torch.autograd.Function):
    r"""``(L, W = L^{-1})`` from ``A`` and its (detached) factor ``L`` (and ``W`` when already
    formed), with a matmul-only backward.

    With :math:`LL^\top = A` and :math:`W = L^{-1}` (so :math:`dW = -W\,dL\,W` and
    :math:`L^\top W^\top = I`), the gradients :math:`\bar L, \bar W` give

    .. math::
        \Phi = \mathrm{tril}\big(L^\top\bar L - \bar W W^\top\big), \qquad
        \bar A = W^\top\,\tfrac12\big(\Phi + \Phi^\top - \mathrm{Diag}\,\Phi\big)\,W,

    torch's Cholesky backward (Murray 2016) with its two triangular solves replaced by products
    with :math:`W`, which the forward formed anyway (no ``tril`` of :math:`\bar L` is needed:
    :math:`L^\top\mathrm{triu}(\bar L, 1)` is strictly upper triangular). Written by hand because
    batched small triangular solves run several times slower than matrix products on CPU and
    torch's backward of a Cholesky and of a triangular solve is made of them.
    """

    @staticmethod
    def forward(ctx, A: torch.Tensor, L: torch.Tensor,  # noqa: ARG004 -- A: the graph's input
                W: torch.Tensor | None = None):
        W = _triangular_inverse(L) if W is None else W
        ctx.save_for_backward(L, W)
        ctx.set_materialize_grads(False)
        return L, W

    @staticmethod
    @once_differentiable
    def backward(ctx, gL: torch.Tensor | None, gW: torch.Tensor | None):
        L, W = ctx.saved_tensors
        if gL is None and gW is None:  # pragma: no cover -- autograd does not call it then
            return None, None, None
        if gL is None:                  # Phi = -tril(gW W^T): the sign goes into the last scale
            phi, scale = gW @ W.mT, -0.5
        else:
            phi, scale = L.mT @ gL, 0.5
            if gW is not None:
                phi.sub_(gW @ W.mT)
        phi.tril_()                     # fresh tensors: in place, fewer passes and allocations
        S = phi + phi.mT
        S.diagonal(dim1=-2, dim2=-1).mul_(0.5)
        return W.mT @ S.mul_(scale) @ W, None, None


def cholesky_factors(A: torch.Tensor, *, where: str = "", head_axis: int | None = None,
                     jitter: float | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    r"""The Cholesky factor and its inverse, :math:`(L, W = L^{-1})` with :math:`LL^\top = A`.

    :math:`L` comes from :func:`cholesky` (same checks, jitter and errors; only the lower
    triangle of ``A`` is read); :math:`W` from one triangular solve against :math:`I`. Every
    later solve with :math:`L` becomes a matrix product (:math:`L^{-1}B = WB`,
    :math:`A^{-1}B = W^\top WB`, :math:`\mathrm{tr}(A^{-1}X) = \sum (WX)\odot W`), and the
    backward of the pair is products only (``_InverseFactor``).

    :returns: ``(L, W)``, both ``[..., n, n]`` lower triangular in the GP dtype.
    """
    with gp_precision(A.device.type):
        A = A.to(settings.gp_dtype.resolve(A.dtype))
        with torch.no_grad():
            L, W = cholesky(A.detach(), where=where, head_axis=head_axis, jitter=jitter,
                            _inverse=True)
        if not A.requires_grad:
            return L, (_triangular_inverse(L) if W is None else W)
        return _InverseFactor.apply(A, L, W)


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
    the real block equals the computation on the unpadded sequence. One pass over ``A`` (a
    masked fill, then the pad diagonal set in place), not four (a product with the pair mask
    and the sum with a dense diagonal); the same values for finite ``A``.
    """
    if mask is None:
        return A
    real = mask[:, None, :]                                           # [B, 1, N]
    out = A.masked_fill(~(real.unsqueeze(-1) & real.unsqueeze(-2)), 0.0)
    out.diagonal(dim1=-2, dim2=-1).add_((~real).to(out.dtype))
    return out


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


def scaled_cholesky(A: torch.Tensor, d: torch.Tensor, *, where: str, head_axis: int,
                    inverse: bool = False):
    r"""Cholesky factor with a jitter *relative* to ``d`` (the prior variances), by equilibration.

    .. math::
        L = \Delta^{1/2}\,\mathrm{chol}\big(\Delta^{-1/2} A \Delta^{-1/2} + \epsilon I\big), \qquad
        LL^\top = A + \epsilon\Delta, \quad \Delta = \mathrm{diag}(d)

    with :math:`\epsilon` the :class:`~gpattn_ppl.settings.cholesky_jitter` value, part of the
    model here (every matrix gets it, as gpytorch adds jitter to every :math:`K_{uu}`), through
    :func:`cholesky` (per-matrix escalation from :math:`10\epsilon`, named errors). The factorised
    matrix has entries of order one whatever the kernel's amplitude, so a singular kernel matrix
    is rescued by the escalation in float32 too. An inf in ``A`` (an overflowing kernel, which
    the equilibration turns into NaN) is named as the overflow it is. The one host
    synchronisation of :func:`cholesky`.

    :param A: ``[..., n, n]``. :param d: ``[..., n]`` positive scales (pads: 1).
    :param inverse: also return :math:`W = L^{-1} = \mathrm{chol}(\cdot)^{-1}\Delta^{-1/2}`
        (:func:`cholesky_factors` on the equilibrated matrix: a matmul-only backward).
    :returns: ``L``, or ``(L, W)`` with ``inverse``.
    """
    s = d.clamp_min(torch.finfo(d.dtype).tiny).rsqrt()
    eps = settings.cholesky_jitter.value(settings.gp_dtype.resolve(A.dtype))
    factor = cholesky_factors if inverse else cholesky
    try:
        out = factor(A * (s.unsqueeze(-1) * s.unsqueeze(-2)), where=where, head_axis=head_axis,
                     jitter=eps)
    except NonFiniteError:
        flat = A.reshape((-1,) + A.shape[-2:])
        bad = (~torch.isfinite(flat).flatten(-2).all(-1)).nonzero().flatten()
        if not bad.numel():
            raise
        i = int(bad[0])
        raise NonFiniteError(_nonfinite_message(
            flat[i].to(settings.gp_dtype.resolve(A.dtype)), where,
            _position(i, A.shape[:-2], head_axis), bad.numel(), flat.shape[0])) from None
    L, W = out if inverse else (out, None)
    L = L * (1.0 / s).unsqueeze(-1).to(L.dtype)
    return (L, W * s.unsqueeze(-2).to(W.dtype)) if inverse else L
