r"""The frozen bottom of a pretrained encoder, run once per example.

Fine-tuning only the top ``t`` layers of an ``L``-layer encoder (``model.train_layers: t``) leaves
the embeddings and blocks ``0 .. L-t-1`` frozen. Run in evaluation mode they are a deterministic
function of each example's real tokens, so their output

.. math:: h^{(L-t)}_i = \mathrm{block}_{L-t-1}\circ\dots\circ\mathrm{block}_0\circ
          \mathrm{emb}(x_i)\in\mathbb R^{n_i\times C}

(``n_i`` real tokens of example ``i``) is computed once and kept; every later pass (each epoch,
each evaluation, each Monte-Carlo pass) runs only the top blocks on it. A training step then costs
the top ``t`` blocks' forward and backward instead of all ``L`` blocks' forward and the trained
blocks' backward: for MiniLM-L6 with ``t = 1`` the step is several times cheaper.

How the top blocks run on the kept states without knowing the host's forward: within
:meth:`FrozenPrefix.substitute`, the embeddings return the kept states (padded to the batch's
length) and the frozen blocks return their input unchanged, so the host's own forward builds its
attention mask and runs the top blocks exactly as it would. :meth:`FrozenPrefix.check` compares
the two paths on a probe batch when the model is built and refuses a host for which they differ.

Exact up to floating-point rounding: a row's states at its real tokens do not depend on how
much padding its batch has (padded keys get zero attention weight), and what sits at padded
positions is never read by the top blocks (masked keys, per-token layers, masked pooling).
"""

from __future__ import annotations

import contextlib
import hashlib

import torch
from torch import nn

__all__ = ["FrozenPrefix", "prefix_fingerprint"]

#: fingerprint of the frozen weights -> kept rows, shared by every model of the process with the
#: same frozen layers (the demo's methods, an evaluation after training); see FrozenPrefix.
_SHARED: dict[str, dict[bytes, torch.Tensor]] = {}
_SHARED_BYTES: dict[str, int] = {}
#: fingerprint -> whether the frozen blocks return a tuple (older hosts) rather than a tensor
_TUPLE_OUT: dict[str, bool] = {}


def prefix_fingerprint(modules: list[nn.Module]) -> str:
    """sha256 over the names, dtypes, shapes and bytes of the modules' parameters and buffers:
    two models share kept rows only when their frozen layers are equal bit for bit."""
    h = hashlib.sha256()
    for i, m in enumerate(modules):
        for name, t in [*m.named_parameters(), *m.named_buffers()]:
            t = t.detach().cpu().contiguous()
            h.update(f"{i}.{name}:{t.dtype}:{tuple(t.shape)};".encode())
            h.update(t.view(torch.uint8).numpy().tobytes() if t.numel() else b"")
    return h.hexdigest()


class _Stop(Exception):
    """Raised by the hook on the last frozen block: the rest of the forward is not needed."""


class FrozenPrefix:
    """Per-example cache of a frozen encoder prefix's output (``[n_i, C]`` per example).

    :param encoder: the Hugging Face encoder (``AutoModel``) whose ``embeddings`` and first
        blocks are frozen.
    :param blocks: the frozen blocks in order (the modules the encoder's layer loop calls),
        at least one.
    :param max_bytes: the most the kept states of the process may hold, all fingerprints
        together; past it, new rows are computed and not kept (the cache never evicts: an epoch
        sees the same rows again; :meth:`clear` frees a fingerprint's rows).

    The frozen weights must not change while rows are kept: the fingerprint
    (:func:`prefix_fingerprint`) is taken when the cache is made, and models built later with
    equal frozen layers read the same rows (the demo's methods compute the prefix once).
    """

    def __init__(self, encoder: nn.Module, blocks: list[nn.Module],
                 max_bytes: int = 4 << 30) -> None:
        if not blocks:
            raise ValueError("FrozenPrefix: no frozen block")
        emb = getattr(encoder, "embeddings", None)
        if not isinstance(emb, nn.Module):
            raise ValueError(f"FrozenPrefix: {type(encoder).__name__} has no 'embeddings' module")
        # kept in a list: the encoder is the host's submodule, not this cache's
        self._encoder, self._emb, self.blocks = [encoder], emb, list(blocks)
        self.max_bytes = int(max_bytes)
        self.fingerprint = prefix_fingerprint([emb, *self.blocks])
        #: real-token ids of a row -> its states ``[n_i, C]``, shared with every model of the
        #: process whose frozen layers are equal (same fingerprint)
        self.rows = _SHARED.setdefault(self.fingerprint, {})
        self.hits = self.misses = 0

    def __len__(self) -> int:
        return len(self.rows)

    @property
    def bytes(self) -> int:
        """What the kept rows hold (shared with the models of the same fingerprint)."""
        return _SHARED_BYTES.get(self.fingerprint, 0)

    def clear(self) -> None:
        """Forget every kept row of this fingerprint."""
        self.rows.clear()
        _SHARED_BYTES[self.fingerprint] = 0

    # -- compute ------------------------------------------------------------------------------
    @torch.no_grad()
    def _run(self, x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        """The last frozen block's output ``[B, N, C]`` for ids ``x`` and mask ``mask``."""
        got = {}

        def hook(_module, _args, out):
            _TUPLE_OUT[self.fingerprint] = isinstance(out, tuple)
            got["h"] = out[0] if isinstance(out, tuple) else out
            raise _Stop

        handle = self.blocks[-1].register_forward_hook(hook)
        try:
            self._encoder[0](input_ids=x, attention_mask=mask.long())
        except _Stop:
            pass
        finally:
            handle.remove()
        if "h" not in got:
            raise RuntimeError("FrozenPrefix: the last frozen block was not called by the "
                               "encoder's forward")
        return got["h"]

    def states(self, x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        """The frozen prefix's output ``[B, N, C]`` for token ids ``x [B, N]`` and the bool
        ``mask [B, N]``; zeros at padded positions. Kept rows are read, the others computed in
        one batch and kept while the bound allows. A row is keyed by its real tokens' ids."""
        xs, ms = x.detach().cpu().numpy(), mask.detach().cpu().numpy()
        keys = [xs[i][ms[i]].tobytes() for i in range(len(xs))]
        missing = [i for i, k in enumerate(keys) if k not in self.rows]
        self.hits += len(keys) - len(missing)
        self.misses += len(missing)
        rows: list[torch.Tensor | None] = [self.rows.get(k) for k in keys]
        if missing:
            idx = torch.tensor(missing, device=x.device)
            h = self._run(x[idx], mask[idx])
            for j, i in enumerate(missing):
                row = h[j][mask[i]].clone()
                rows[i] = row
                size = row.numel() * row.element_size()
                if sum(_SHARED_BYTES.values()) + size <= self.max_bytes:   # all fingerprints
                    self.rows[keys[i]] = row
                    _SHARED_BYTES[self.fingerprint] = self.bytes + size
        out = torch.zeros(*x.shape, rows[0].shape[-1], dtype=rows[0].dtype, device=x.device)
        out[mask] = torch.cat(rows).to(x.device)
        return out

    # -- run the top on kept states ---------------------------------------------------------------
    @contextlib.contextmanager
    def substitute(self, h: torch.Tensor):
        """Within the context, the embeddings return ``h`` and the frozen blocks their input:
        the encoder's forward runs only its top blocks, on ``h``."""
        if self.fingerprint not in _TUPLE_OUT:
            raise RuntimeError("FrozenPrefix.substitute before any states() call")
        as_tuple = _TUPLE_OUT[self.fingerprint]

        def embeddings(*_args, **_kwargs):
            return h

        def identity(hidden_states, *_args, **_kwargs):
            return (hidden_states,) if as_tuple else hidden_states

        patched = [(self._emb, embeddings)] + [(b, identity) for b in self.blocks]
        for module, fn in patched:
            module.forward = fn
        try:
            yield
        finally:
            for module, _ in patched:
                del module.forward

    def check(self, forward_full, forward_cached, x: torch.Tensor, mask: torch.Tensor,
              where: str) -> None:
        """Raise ``ValueError`` unless the model's output on ``(x, mask)`` is the same (to
        float32 rounding) by the full forward and by the kept-states path; the probe rows are
        not kept."""
        xs, ms = x.cpu().numpy(), mask.cpu().numpy()
        probe = [xs[i][ms[i]].tobytes() for i in range(len(xs))]
        kept = {k for k in probe if k in self.rows}
        with torch.no_grad():
            full = forward_full(x, mask)
            cached = forward_cached(x, mask)
        for k in probe:
            if k not in kept and k in self.rows:
                row = self.rows.pop(k)
                _SHARED_BYTES[self.fingerprint] -= row.numel() * row.element_size()
        self.hits = self.misses = 0
        err = (full - cached).abs().max().item()
        scale = full.abs().max().item() + 1e-6
        if not err <= 1e-4 * max(scale, 1.0):
            raise ValueError(f"{where}: the top layers run on the kept states of the frozen "
                             f"layers do not give the full forward's output (max difference "
                             f"{err:.3g}): this host's encoder does not run its layers in "
                             "sequence from the embeddings' output; use train_layers: null")
