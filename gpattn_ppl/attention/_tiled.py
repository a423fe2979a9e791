r"""Attention computed in tiles over keys, with a backward that recomputes each tile.

:func:`tiled_attention` forms :math:`\mathrm{softmax}(S)\,V` (``normalize=True``, an online
softmax over key tiles) or :math:`\exp(S)\,V` (``normalize=False``) for logits
:math:`S = f(q, k) + g` that a callable builds one key tile at a time, so no
``[B, H, N, N']`` tensor is formed whole or kept for the backward: the forward keeps the output
and the per-row log-normaliser (``[B, H, N]``), the backward recomputes each tile's logits under
autograd and takes their gradient with respect to ``q``, ``k`` and the parameters the callable
uses (the kernel's hyperparameters). The optional additive noise ``g`` (Gumbel) is drawn one tile
at a time from the global generator, whose state is saved before the forward and restored for
the backward's redraw (as :func:`torch.utils.checkpoint` does), so both see the same draw.

Memory O(N t) per (b, h) for tile width t, time that of the untiled computation plus one more
evaluation of the logits (and of the noise). The gradient is the untiled one up to
floating-point reassociation (tested against it).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import torch

from .. import settings

__all__ = ["TILE", "tiled_attention", "use_tiles"]

_NEG_INF = float("-inf")
#: keys per tile
TILE = 256


def use_tiles(n_keys: int, device: torch.device, min_n: dict[str, int]) -> bool:
    """Whether attention over ``n_keys`` keys on ``device`` runs in tiles
    (:class:`~gpattn_ppl.settings.attention_tiles`): ``"on"``, ``"off"``, or ``"auto"``:
    ``n_keys >= min_n[device type]`` (the unit's measured rule; untiled where not listed)."""
    mode = settings.attention_tiles.value()
    if mode != "auto":
        return mode == "on"
    return n_keys >= min_n.get(torch.device(device).type, 1 << 62)


def _tiles(n: int, tile: int) -> list[tuple[int, int]]:
    return [(j, min(j + tile, n)) for j in range(0, n, tile)]


def _rng_state(device: torch.device):
    return torch.cuda.get_rng_state(device) if device.type == "cuda" else torch.get_rng_state()


class _TiledAttention(torch.autograd.Function):
    r"""``out = softmax(S) V`` or ``exp(S) V`` over key tiles; see :func:`tiled_attention`.

    Backward per tile :math:`t` (:math:`P_t = \exp(S_t - \mathrm{lse})` normalised, or
    :math:`\exp(S_t)`; :math:`\Delta = \mathrm{rowsum}(\bar O \odot O)` in the normalised case,
    0 otherwise):

    .. math::
        \bar V_t = P_t^\top \bar O, \qquad
        \bar S_t = P_t \odot (\bar O V_t^\top - \Delta),

    then :math:`\bar S_t` is pulled back through the recomputed :math:`S_t(q, k_t, \theta)`.
    """

    @staticmethod
    def forward(ctx, logits_fn, noise_fn, key_mask, normalize, tile, q, k, v, *params):
        B, H, N, _ = q.shape
        M = k.shape[-2]
        state = _rng_state(q.device) if noise_fn is not None else None
        m = q.new_full((B, H, N, 1), _NEG_INF)
        lsum = q.new_zeros((B, H, N, 1))
        acc = q.new_zeros((B, H, N, v.shape[-1]))
        for j0, j1 in _tiles(M, tile):
            s = _tile_logits(logits_fn, noise_fn, key_mask, q, k, j0, j1)
            if normalize:
                m_new = torch.maximum(m, s.amax(-1, keepdim=True))
                shift = m_new.masked_fill(m_new == _NEG_INF, 0.0)   # rows with no key so far
                p = (s - shift).exp_()
                scale = (m - shift).exp_()
                lsum = lsum * scale + p.sum(-1, keepdim=True)
                acc = acc * scale + p @ v[..., j0:j1, :]
                m = m_new
            else:
                acc = acc + s.exp_() @ v[..., j0:j1, :]
        if normalize:
            out = acc / lsum
            lse = m + lsum.log()
        else:
            out, lse = acc, None
        ctx.fns = (logits_fn, noise_fn, key_mask, normalize, tile, state)
        ctx.save_for_backward(q, k, v, out, *(() if lse is None else (lse,)))
        ctx.params = params          # the leaves themselves: their recomputed uses are pulled back
        return out

    @staticmethod
    def backward(ctx, g_out):
        logits_fn, noise_fn, key_mask, normalize, tile, state = ctx.fns
        saved = ctx.saved_tensors
        q, k, v, out = saved[:4]
        lse = saved[4] if normalize else None
        params = ctx.params
        M = k.shape[-2]
        delta = (g_out * out).sum(-1, keepdim=True) if normalize else None
        g_q, g_k, g_v = torch.zeros_like(q), torch.zeros_like(k), torch.zeros_like(v)
        g_params = [torch.zeros_like(p) for p in params]
        devices = [q.device] if q.device.type == "cuda" else []
        with torch.random.fork_rng(devices=devices, enabled=noise_fn is not None), \
                torch.enable_grad():
            if state is not None:
                if q.device.type == "cuda":
                    torch.cuda.set_rng_state(state, q.device)
                else:
                    torch.set_rng_state(state)
            q_ = q.detach().requires_grad_(ctx.needs_input_grad[5])
            for j0, j1 in _tiles(M, tile):
                k_t = k[..., j0:j1, :].detach().requires_grad_(ctx.needs_input_grad[6])
                s = _tile_logits(logits_fn, noise_fn, key_mask, q_, k_t, j0, j1)
                with torch.no_grad():
                    p = (s - lse).exp() if normalize else s.exp()
                    v_t = v[..., j0:j1, :]
                    g_v[..., j0:j1, :] = p.mT @ g_out
                    d = g_out @ v_t.mT
                    if normalize:
                        d.sub_(delta)
                    d.mul_(p)
                inputs = [q_, k_t, *params]
                wanted = [i for i, t in enumerate(inputs) if t.requires_grad]
                if not wanted:
                    continue
                grads = torch.autograd.grad(s, [inputs[i] for i in wanted], d,
                                            allow_unused=True)
                for i, gr in zip(wanted, grads):
                    if gr is None:
                        continue
                    if i == 0:
                        g_q += gr
                    elif i == 1:
                        g_k[..., j0:j1, :] += gr
                    else:
                        g_params[i - 2] += gr
        need = ctx.needs_input_grad
        return (None, None, None, None, None, g_q if need[5] else None,
                g_k if need[6] else None, g_v if need[7] else None,
                *[g if need[8 + i] else None for i, g in enumerate(g_params)])


def _tile_logits(logits_fn, noise_fn, key_mask, q, k, j0, j1):
    """The logits of keys ``j0:j1`` (``k`` holds those keys, or all of them), the tile's noise
    added and ``-inf`` on padded keys."""
    k_t = k if k.shape[-2] == j1 - j0 else k[..., j0:j1, :]
    s = logits_fn(q, k_t)
    if noise_fn is not None:
        s = s + noise_fn(s.shape, s.dtype, s.device)
    if key_mask is not None:
        s = s.masked_fill(~key_mask[:, None, None, j0:j1], _NEG_INF)
    return s


def tiled_attention(logits_fn: Callable[[torch.Tensor, torch.Tensor], torch.Tensor],
                    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                    key_mask: torch.Tensor | None, *, params: Sequence[torch.Tensor] = (),
                    normalize: bool = True, tile: int = 256,
                    noise_fn: Callable | None = None) -> torch.Tensor:
    r"""Head outputs :math:`\mathrm{softmax}(S)V` (or :math:`\exp(S)V`) ``[B, H, N, D_v]`` in
    tiles of ``tile`` keys, with :math:`S_{:, t} = \text{logits\_fn}(q, k_t) + g_t` and ``-inf``
    on padded keys.

    :param logits_fn: ``(q [B, H, N, D], k_t [B, H, t, D]) -> [B, H, N, t]``, elementwise over
        key pairs; every tensor it reads that needs a gradient must be in ``params``.
    :param key_mask: ``[B, M]`` bool (True = real key) or ``None``; each query row must have a
        real key (the units' input check guarantees it).
    :param params: the parameters ``logits_fn`` uses (they receive their gradients).
    :param noise_fn: ``(shape, dtype, device) -> noise`` added to each tile's logits, drawn from
        the global generator (the backward redraws it from the saved state), or ``None``.
    """
    if tile < 1:
        raise ValueError(f"tile must be a positive number of keys, got {tile}")
    return _TiledAttention.apply(logits_fn, noise_fn, key_mask, bool(normalize), int(tile),
                                 q, k, v, *params)
