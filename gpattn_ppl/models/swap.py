"""Swapping any registered attention unit into a host Transformer.

:func:`swap_attention` replaces the self-attention of chosen layers of

* a Hugging Face encoder: BERT, RoBERTa, ELECTRA, MiniLM and every model whose layers hold a
  ``BertAttention``-like module (``self.query/key/value`` + ``output.dense/LayerNorm``);
  ALBERT (its one shared layer: swapping it swaps every depth that uses it); DeBERTa (v1,
  its head-interleaved fused ``in_proj``) and DeBERTa-v2/v3 (content attention only: the
  disentangled c2p/p2c relative-position terms are dropped, with a warning; talking heads are
  refused); MPNet (``attn.q/k/v/o``; content attention only: its relative-position bias of the
  logits is dropped, with a warning); ModernBERT from transformers 5 (fused ``Wqkv``; the
  unit rotates its own queries and keys by the rotary embeddings the layer passes, see
  :class:`RotaryAttentionAdapter`; its local, sliding-window layers are refused: a unit has
  no window); DistilBERT (``q_lin/k_lin/v_lin/out_lin``); ViT (``attention.query/key/value``
  before transformers 5, ``q_proj/k_proj/v_proj/o_proj`` from 5) and other bidirectional
  ``q_proj/k_proj/v_proj/o_proj`` attentions,
* ``torch.nn.TransformerEncoder`` layers (their ``nn.MultiheadAttention``),
* the library's own :class:`~gpattn_ppl.models.TextClassifier` /
  :class:`~gpattn_ppl.models.ViTClassifier` blocks,

with a unit built by :func:`~gpattn_ppl.attention.build_attention`, behind an adapter that keeps
the host's interface: its calling convention (that of the installed transformers version), its
attention masks (translated to the units' ``[B, N]`` key mask), its head count and width, its
logit scale, and its dropout (attention-probability dropout for units with attention weights,
the output dropout of BERT's ``BertSelfOutput``). With ``init="pretrained"`` the unit starts
from the replaced layer's projections (:func:`~gpattn_ppl.attention.init_from_softmax`), and,
given a calibration batch, its GP-specific parameters are fitted to reproduce the layer's
output; the report says how close it got (relative error of the attention output at the
posterior mean and for one draw).

Refused, naming the host class and the reason: causal (decoder) self-attention (GPT-2, Llama,
Qwen2, ... used as encoders: the units take a ``[B, N]`` key padding mask and attend
bidirectionally, so a swapped layer would let every token see the tokens after it), rotary
position embeddings applied inside a generic ``q_proj/k_proj/v_proj/o_proj`` attention
(only ModernBERT's are carried into the unit), sliding-window (local) attention, a unit kind
that cannot rotate its queries and keys in a rotary host (``rotary_capable = False``: every
built-in kind can), grouped-query attention (k/v narrower than q), cross-attention, caches,
packed sequences and head masks.

**One path: module replacement.** transformers >= 4.48 routes most attention modules through
an implementation registry (``AttentionInterface``): a registered function receives the host's
projected per-head ``q, k, v`` ``[B, H, N, D]`` and returns the head outputs. No registered
unit can consume those: each owns its projections of ``x`` and uses them in its own way
(SGPA's tied ``W_qk`` in a symmetric kernel, KEP-SVGP's feature maps and ``W_e, W_r``, CGPT's
and SCGPT's latent projection of ``x``, h-Gumbel's centroids, its own ``W_O`` and output
dropout), and :meth:`~gpattn_ppl.attention.AttentionUnit.forward` is ``x [B, N, C] -> [B, N,
C]``. So every unit replaces the host's attention module (the host's q/k/v/o weights are
copied into it with ``init="pretrained"``), on every transformers version: the same
adapters serve versions with and without the registry, and DeBERTa-v2's disentangled
attention does not go through it at all.
"""

from __future__ import annotations

import dataclasses
import inspect
import math
import warnings
from collections.abc import Sequence
from dataclasses import dataclass

import torch
from torch import nn

from .. import settings
from ..attention import (
    ATTENTION,
    AttentionUnit,
    RotaryPositions,
    SoftmaxAttention,
    SoftmaxWeights,
    attention_options,
    build_attention,
    init_from_softmax,
    relative_error,
)

__all__ = ["AttentionLayer", "BertAttentionAdapter", "HostAttentionAdapter",
           "RotaryAttentionAdapter", "SelfAttentionAdapter", "HOSTS",
           "MultiheadAttentionAdapter", "attention_units", "calibrate_swapped",
           "find_attention_layers", "gap_to_softmax", "key_mask", "swap_attention",
           "swapped_prefix"]


# -- masks --------------------------------------------------------------------------------------

def key_mask(mask: torch.Tensor | None, B: int, N: int, where: str) -> torch.Tensor | None:
    """The units' ``[B, N]`` bool key mask (True on real tokens) from a host's padding mask.

    Accepted: ``None``; ``[B, N]`` bool/int (1 or True = real); a 4-D ``[B or 1, 1, N_q, N]``
    mask: bool (True = attend, HF's sdpa masks), integer (1 = attend, DeBERTa's) or additive
    float (0 = attend, a large negative = masked, HF's eager masks). A key is real when some
    query may attend to it.

    :raises ValueError: another shape, naming ``where``.
    """
    if mask is None:
        return None
    if mask.dim() == 4 and mask.shape[0] in (1, B) and mask.shape[1] == 1 \
            and mask.shape[-1] == N:
        real = _allowed(mask).any(-2).expand(B, N)
    elif mask.dim() == 2 and tuple(mask.shape) == (B, N):
        real = mask.bool() if mask.dtype == torch.bool or not mask.is_floating_point() \
            else mask > 0.5
    else:
        raise ValueError(f"{where}: cannot read a padding mask of shape {tuple(mask.shape)} for "
                         f"inputs [B, N] = [{B}, {N}] (expected [B, N] or [B, 1, N_q, N])")
    return real


def _allowed(mask: torch.Tensor) -> torch.Tensor:
    """``[B or 1, N_q, N]`` bool (True: query may attend to key) of a 4-D ``[B or 1, 1, N_q, N]``
    bool, integer or additive float mask (as :func:`key_mask` reads them)."""
    if mask.dtype == torch.bool:
        return mask[:, 0]
    if not mask.is_floating_point():
        return mask[:, 0] != 0
    return mask[:, 0] > torch.finfo(mask.dtype).min / 2


def _check_padding_only(mask: torch.Tensor | None, real: torch.Tensor | None, where: str) -> None:
    """Refuse a 4-D mask that restricts a real query to part of the real keys (a sliding
    window, packed sequences, a custom mask): a unit takes a ``[B, N]`` key mask only."""
    if mask is None or mask.dim() != 4 or mask.shape[-2] == 1 or real is None:
        return
    allowed = _allowed(mask)                                    # [B or 1, N_q, N]
    if allowed.shape[-2] != real.shape[-1]:
        return
    cut = (allowed != real[:, None, :]) & real[:, :, None]
    if bool(cut.any()):
        raise ValueError(f"{where}: the host's attention mask lets a real token attend to only "
                         "part of the real tokens of its sequence (a sliding window, packed "
                         "sequences or a custom 4-D mask); a unit attends to every real key (a "
                         "[B, N] padding mask), so it would change what the layer computes")


# -- adapters -----------------------------------------------------------------------------------

#: keyword arguments a host may pass its attention that a swapped unit cannot honour, when not
#: ``None``: argument -> what it is
_REFUSED = {"head_mask": "a head mask", "encoder_hidden_states": "cross-attention",
            "past_key_value": "a key/value cache", "past_key_values": "a key/value cache",
            "cache": "a key/value cache", "layer_past": "a key/value cache",
            "query_states": "separate query states (DeBERTa's enhanced mask decoder)",
            "position_embeddings": "rotary position embeddings",
            "cu_seq_lens_q": "packed sequences", "cu_seq_lens_k": "packed sequences"}


class HostAttentionAdapter(nn.Module):
    """Base of the adapters that stand in for a Hugging Face attention module
    (:class:`BertAttentionAdapter`, :class:`SelfAttentionAdapter`).

    Reads the hidden states (first positional argument, or ``hidden_states=`` / ``query=``) and
    the padding mask (second positional argument, or ``attention_mask=`` / ``mask=``) whatever
    the transformers version's calling convention, refuses what a unit cannot honour (a head
    mask, cross-attention, a cache, rotary embeddings) and returns ``(output, None)`` as the
    hosts' attention modules do (``output`` alone where the host expects a tensor: DeBERTa-v2
    on transformers < 4.47 without ``output_attentions``).
    """

    def __init__(self, unit: AttentionUnit, host: str, *, host_class: str = "",
                 mask_arg: bool = True, tensor_return: bool = False) -> None:
        super().__init__()
        self.unit, self.host, self.host_class = unit, host, host_class or host
        #: whether the second positional argument is the padding mask (ViT on transformers < 5
        #: passes its head mask there)
        self.mask_arg, self.tensor_return = mask_arg, tensor_return
        self._options = {"host_class": self.host_class, "mask_arg": mask_arg,
                         "tensor_return": tensor_return}

    def _inputs(self, args, kwargs) -> tuple[torch.Tensor, torch.Tensor | None]:
        where = f"{self.unit.site_prefix} (in place of {self.host_class})"
        if args:
            x, rest = args[0], list(args[1:])
        else:
            name = next((n for n in ("hidden_states", "query", "x") if n in kwargs), None)
            if name is None:
                raise ValueError(f"{where}: no hidden states among the arguments "
                                 f"{sorted(kwargs)}")
            x, rest = kwargs[name], []
        for n in ("key", "value"):
            if kwargs.get(n) is not None and kwargs[n] is not x:
                raise ValueError(f"{where}: a swapped unit does self-attention only (query, key "
                                 "and value must be the same tensor)")
        mask = None
        if self.mask_arg:
            mask = rest.pop(0) if rest else kwargs.get("attention_mask", kwargs.get("mask"))
        for a in rest:
            if isinstance(a, torch.Tensor):
                raise ValueError(f"{where}: a swapped unit takes no extra tensor argument "
                                 f"(a head mask or cross-attention states) besides the padding "
                                 f"mask; got one of shape {tuple(a.shape)}")
        for n, what in _REFUSED.items():
            if kwargs.get(n) is not None:
                raise ValueError(f"{where}: a swapped unit does plain self-attention; the host "
                                 f"passed {what} ({n}=), which it cannot use")
        B, N, _ = x.shape
        return x, key_mask(mask, B, N, where)

    def _result(self, out: torch.Tensor, kwargs):
        if self.tensor_return and not kwargs.get("output_attentions"):
            return out
        return out, None

    def rewrap(self, unit: AttentionUnit) -> HostAttentionAdapter:
        """The same adapter around another unit (a second swap of the layer)."""
        raise NotImplementedError


class BertAttentionAdapter(HostAttentionAdapter):
    r"""Stands in for an attention module that adds the residual and normalises (``BertAttention``
    and its copies in RoBERTa, ELECTRA, ...; ALBERT's ``AlbertAttention``; DeBERTa-v2's
    ``DebertaV2Attention``): ``(LN(x + \mathrm{unit}(x, \text{mask})), None)``.

    The unit owns ``W_O`` and the output dropout (BERT's ``dense`` and ``dropout``); the
    host's ``LayerNorm`` is kept.
    """

    def __init__(self, unit: AttentionUnit, layer_norm: nn.LayerNorm, host: str = "bert",
                 **kwargs) -> None:
        super().__init__(unit, host, **kwargs)
        self.LayerNorm = layer_norm

    def forward(self, *args, **kwargs):
        x, mask = self._inputs(args, kwargs)
        return self._result(self.LayerNorm(x + self.unit(x, mask)), kwargs)

    def rewrap(self, unit: AttentionUnit) -> BertAttentionAdapter:
        return BertAttentionAdapter(unit, self.LayerNorm, self.host, **self._options)


class SelfAttentionAdapter(HostAttentionAdapter):
    """Stands in for an attention module that leaves the residual to its layer (DistilBERT's,
    ViT's, the ``q_proj/k_proj/v_proj/o_proj`` modules of others): ``(unit(x, mask), None)``."""

    def forward(self, *args, **kwargs):
        x, mask = self._inputs(args, kwargs)
        return self._result(self.unit(x, mask), kwargs)

    def rewrap(self, unit: AttentionUnit) -> SelfAttentionAdapter:
        return SelfAttentionAdapter(unit, self.host, **self._options)


class RotaryAttentionAdapter(HostAttentionAdapter):
    """Stands in for an attention module that leaves the residual to its layer and rotates its
    queries and keys by the rotary position embeddings its layer passes
    (``position_embeddings=(cos, sin)``; ModernBERT from transformers 5):
    ``(unit(x, mask), None)`` with the unit inside
    :meth:`~gpattn_ppl.attention.AttentionUnit.positions`, so that it rotates its own queries
    and keys (and CGPT's latent inputs) as the layer did.

    The layer's mask must be a padding mask (a real token may attend to every real token): a
    sliding-window layer is refused at swap time, and a 4-D mask that cuts a sequence at call
    time (while :class:`~gpattn_ppl.settings.validate_args` is on). ``arg_names``: the replaced module's positional parameters after the hidden states.
    """

    def __init__(self, unit: AttentionUnit, host: str, *,
                 arg_names: Sequence[str] = ("position_embeddings", "attention_mask"),
                 **kwargs) -> None:
        super().__init__(unit, host, **kwargs)
        self.arg_names = tuple(arg_names)
        self._options["arg_names"] = self.arg_names

    def forward(self, *args, **kwargs):
        where = f"{self.unit.site_prefix} (in place of {self.host_class})"
        if len(args) > 1 + len(self.arg_names):
            raise ValueError(f"{where}: {len(args)} positional arguments; the host's attention "
                             f"takes the hidden states and {', '.join(self.arg_names)}")
        for name, a in zip(self.arg_names, args[1:]):
            kwargs[name] = a
        rotary = kwargs.pop("position_embeddings", None)
        if rotary is None:
            raise ValueError(f"{where}: the layer passed no position_embeddings (cos, sin); the "
                             "attention it stands in for rotates its queries and keys by them")
        x, mask = self._inputs(args[:1], kwargs)
        if settings.validate_args.value():        # a host sync: skipped when checks are off
            _check_padding_only(kwargs.get("attention_mask"), mask, where)
        cos, sin = rotary
        with self.unit.positions(RotaryPositions(cos, sin)):
            out = self.unit(x, mask)
        return self._result(out, kwargs)

    def rewrap(self, unit: AttentionUnit) -> RotaryAttentionAdapter:
        return RotaryAttentionAdapter(unit, self.host, **self._options)


class MultiheadAttentionAdapter(nn.Module):
    """Stands in for ``nn.MultiheadAttention`` in self-attention: ``(unit(x, mask), None)``.

    Key padding masks are bool (True = padding) or additive float (0 = real, ``-inf`` =
    padding), as ``nn.TransformerEncoderLayer`` passes them; ``attn_mask`` and ``is_causal``
    are refused (the units attend bidirectionally). ``_qkv_same_embed_dim = False`` keeps the
    layer off its fused inference path, which would bypass the unit, and
    :func:`swap_attention` turns the encoder's nested-tensor path off.
    """

    _qkv_same_embed_dim = False
    in_proj_weight = None
    in_proj_bias = None

    def __init__(self, unit: AttentionUnit, batch_first: bool) -> None:
        super().__init__()
        self.unit, self.batch_first = unit, bool(batch_first)
        self.embed_dim, self.num_heads = unit.dim, unit.heads
        self.host, self.host_class = "torch", "MultiheadAttention"

    def forward(self, query, key, value, key_padding_mask=None, need_weights=True,
                attn_mask=None, average_attn_weights=True, is_causal=False):
        where = self.unit.site_prefix
        if key is not query or value is not query:
            raise ValueError(f"{where}: a swapped unit does self-attention only "
                             "(query, key and value must be the same tensor)")
        if attn_mask is not None or is_causal:
            raise ValueError(f"{where}: attn_mask / is_causal are not supported by a swapped "
                             "unit (bidirectional attention with a key padding mask only)")
        x = query if self.batch_first else query.transpose(0, 1)
        mask = None
        if key_padding_mask is not None:
            if key_padding_mask.dtype == torch.bool:
                mask = ~key_padding_mask
            else:
                mask = key_padding_mask == 0
        mask = key_mask(mask, x.shape[0], x.shape[1], where)
        out = self.unit(x, mask)
        return (out if self.batch_first else out.transpose(0, 1)), None


# -- hosts --------------------------------------------------------------------------------------

@dataclass
class AttentionLayer:
    """One self-attention layer of a host model (:func:`find_attention_layers`): its module
    path, parent and attribute, the module, and the host kind (a key of :data:`HOSTS`)."""

    path: str                  # module path of the host's attention module
    parent: nn.Module
    attr: str
    module: nn.Module
    host: str                  # key of HOSTS

    @property
    def swapped(self) -> AttentionUnit | None:
        """The unit of a layer swapped before (behind its adapter), else ``None``."""
        return self.module.unit if isinstance(self.module, _ADAPTERS) else None

    @property
    def host_class(self) -> str:
        """The class name of the host's attention module (the replaced one, once swapped)."""
        return getattr(self.module, "host_class", None) or type(self.module).__name__

    def refusal(self) -> str | None:
        """Why this layer cannot be swapped (a causal decoder, rotary embeddings, ...), or
        ``None``."""
        refuse = HOSTS[self.host].get("refuse")
        return None if refuse is None or self.swapped is not None else refuse(self.module)

    def dropped(self) -> list[str]:
        """The parts of the host's attention a unit does not reproduce (DeBERTa's relative-
        position terms, ...): ``["c2p: ...", ...]``; empty for most hosts."""
        dropped = HOSTS[self.host].get("dropped")
        return [] if dropped is None or self.swapped is not None else dropped(self.module)

    def weights(self) -> SoftmaxWeights:
        if self.swapped is not None:
            raise ValueError(f"{self.path}: already swapped to {type(self.swapped).__name__}; "
                             "init='pretrained' reads a softmax layer (use init='random', or "
                             "swap in the original model)")
        reason = self.refusal()
        if reason:
            raise ValueError(f"{self.path} ({self.host_class}): {reason}")
        return HOSTS[self.host]["weights"](self.module, self.path)

    def shape(self) -> tuple[int, int]:
        """``(C, H)`` of the layer."""
        unit = self.swapped if self.swapped is not None else self.module
        if isinstance(unit, AttentionUnit):
            return unit.dim, unit.heads
        if isinstance(unit, nn.MultiheadAttention):
            return unit.embed_dim, unit.num_heads
        w = self.weights()
        return w.dim, w.heads

    def dropouts(self) -> tuple[float, float]:
        if self.swapped is not None:
            return HOSTS["gpattn"]["dropouts"](self.swapped)
        return HOSTS[self.host]["dropouts"](self.module)


def _linears(m: nn.Module | None, names) -> bool:
    return m is not None and all(isinstance(getattr(m, n, None), nn.Linear) for n in names)


def _has_ln(m: nn.Module | None) -> bool:
    return isinstance(getattr(m, "LayerNorm", None), nn.LayerNorm)


def _is_bert(m: nn.Module) -> bool:
    s, o = getattr(m, "self", None), getattr(m, "output", None)
    return (isinstance(s, nn.Module) and _linears(s, ("query", "key", "value"))
            and _linears(o, ("dense",)) and _has_ln(o))


def _is_vit(m: nn.Module) -> bool:
    s, o = getattr(m, "attention", None), getattr(m, "output", None)
    return (isinstance(s, nn.Module) and _linears(s, ("query", "key", "value"))
            and _linears(o, ("dense",)) and not _has_ln(o))


def _is_albert(m: nn.Module) -> bool:
    return _linears(m, ("query", "key", "value", "dense")) and _has_ln(m)


def _is_deberta(m: nn.Module) -> bool:
    s, o = getattr(m, "self", None), getattr(m, "output", None)
    return (isinstance(s, nn.Module) and _linears(s, ("query_proj", "key_proj", "value_proj"))
            and _linears(o, ("dense",)) and _has_ln(o))


def _is_deberta_v1(m: nn.Module) -> bool:
    s, o = getattr(m, "self", None), getattr(m, "output", None)
    return (isinstance(s, nn.Module) and _linears(s, ("in_proj",))
            and isinstance(getattr(s, "q_bias", None), nn.Parameter)
            and isinstance(getattr(s, "v_bias", None), nn.Parameter)
            and _linears(o, ("dense",)) and isinstance(getattr(o, "LayerNorm", None), nn.Module))


def _is_mpnet(m: nn.Module) -> bool:
    s = getattr(m, "attn", None)
    return isinstance(s, nn.Module) and _linears(s, ("q", "k", "v", "o")) and _has_ln(m)


def _is_modernbert(m: nn.Module) -> bool:
    return _linears(m, ("Wqkv", "Wo"))


def _is_distilbert(m: nn.Module) -> bool:
    return _linears(m, ("q_lin", "k_lin", "v_lin", "out_lin"))


def _is_qkvo(m: nn.Module) -> bool:
    return _linears(m, ("q_proj", "k_proj", "v_proj", "o_proj"))


def _is_gpt2(m: nn.Module) -> bool:
    return all(isinstance(getattr(m, n, None), nn.Module) for n in ("c_attn", "c_proj"))


def _is_gpattn(m: nn.Module) -> bool:
    return isinstance(m, AttentionUnit)


def _bias(lin: nn.Linear):
    return None if lin.bias is None else lin.bias.detach()


def _heads(m: nn.Module, C: int, path: str) -> int:
    heads = (getattr(m, "num_attention_heads", None) or getattr(m, "num_heads", None)
             or getattr(m, "n_heads", None) or getattr(getattr(m, "config", None),
                                                        "num_attention_heads", None))
    if not heads:
        raise ValueError(f"{path}: cannot read the head count of {type(m).__name__}")
    return int(heads)


def _read(path: str, cls: str, q: nn.Linear, k: nn.Linear, v: nn.Linear, o: nn.Linear,
          heads: int, scale: float | None = None) -> SoftmaxWeights:
    C = q.in_features
    widths = (q.out_features, k.out_features, v.out_features, o.in_features)
    if any(w != C for w in widths):
        raise ValueError(f"{path} ({cls}): q/k/v/o projections of widths {widths} for width "
                         f"{C}; a unit needs all four C x C (grouped-query or resized "
                         "attention cannot be read)")
    return SoftmaxWeights(q.weight.detach(), k.weight.detach(), v.weight.detach(),
                          o.weight.detach(), _bias(q), _bias(k), _bias(v), _bias(o),
                          heads=heads, scale=scale)


def _bert_weights(m, path) -> SoftmaxWeights:
    s = m.self
    return _read(path, type(m).__name__, s.query, s.key, s.value, m.output.dense,
                 _heads(s, s.query.in_features, path), getattr(s, "scaling", None))


def _vit_weights(m, path) -> SoftmaxWeights:
    s = m.attention
    return _read(path, type(m).__name__, s.query, s.key, s.value, m.output.dense,
                 _heads(s, s.query.in_features, path), getattr(s, "scaling", None))


def _albert_weights(m, path) -> SoftmaxWeights:
    return _read(path, type(m).__name__, m.query, m.key, m.value, m.dense,
                 _heads(m, m.query.in_features, path), getattr(m, "scaling", None))


def _deberta_factor(s) -> int:
    """DeBERTa-v2 divides the logits by sqrt(D * (1 + #relative-position terms))."""
    return 1 + sum(t in (getattr(s, "pos_att_type", None) or []) for t in ("c2p", "p2c"))


def _deberta_weights(m, path) -> SoftmaxWeights:
    s = m.self
    C, heads = s.query_proj.in_features, _heads(s, s.query_proj.in_features, path)
    scale = 1.0 / math.sqrt(C // heads * _deberta_factor(s))
    return _read(path, type(m).__name__, s.query_proj, s.key_proj, s.value_proj,
                 m.output.dense, heads, scale)


def _deberta_v1_weights(m, path) -> SoftmaxWeights:
    # DeBERTa (v1)'s fused in_proj is head-interleaved: head h owns rows h*3D .. (h+1)*3D - 1,
    # its q, k, v in turn; q_bias and v_bias are separate, keys have none
    s = m.self
    C, heads = s.in_proj.in_features, _heads(s, s.in_proj.in_features, path)
    if s.in_proj.out_features != 3 * C or C % heads:
        raise ValueError(f"{path} ({type(m).__name__}): in_proj of shape "
                         f"{tuple(s.in_proj.weight.shape)} for width {C} and {heads} heads; a "
                         "unit needs C x C queries, keys and values")
    D = C // heads
    q, k, v = s.in_proj.weight.detach().view(heads, 3, D, C).unbind(1)
    o = m.output.dense
    return SoftmaxWeights(q.reshape(C, C), k.reshape(C, C), v.reshape(C, C), o.weight.detach(),
                          s.q_bias.detach(), None, s.v_bias.detach(), _bias(o), heads=heads,
                          scale=1.0 / math.sqrt(D * _deberta_factor(s)))


def _mpnet_weights(m, path) -> SoftmaxWeights:
    s = m.attn
    return _read(path, type(m).__name__, s.q, s.k, s.v, s.o, _heads(s, s.q.in_features, path))


def _modernbert_weights(m, path) -> SoftmaxWeights:
    reason = _modernbert_refusal(m)
    if reason:
        raise ValueError(f"{path} ({type(m).__name__}): {reason}")
    # Wqkv is role-major: rows 0..C-1 the queries, C..2C-1 the keys, 2C..3C-1 the values
    W, o = m.Wqkv, m.Wo
    C = W.in_features
    if W.out_features != 3 * C or tuple(o.weight.shape) != (C, C):
        raise ValueError(f"{path} ({type(m).__name__}): Wqkv {tuple(W.weight.shape)} and Wo "
                         f"{tuple(o.weight.shape)} for width {C}; a unit needs C x C queries, "
                         "keys, values and output")
    q, k, v = W.weight.detach().chunk(3)
    bq, bk, bv = (None, None, None) if W.bias is None else W.bias.detach().chunk(3)
    return SoftmaxWeights(q, k, v, o.weight.detach(), bq, bk, bv, _bias(o),
                          heads=_heads(m, C, path), scale=getattr(m, "scaling", None))


def _distilbert_weights(m, path) -> SoftmaxWeights:
    return _read(path, type(m).__name__, m.q_lin, m.k_lin, m.v_lin, m.out_lin,
                 _heads(m, m.q_lin.in_features, path), getattr(m, "scaling", None))


def _qkvo_weights(m, path) -> SoftmaxWeights:
    reason = _qkvo_refusal(m)
    if reason:
        raise ValueError(f"{path} ({type(m).__name__}): {reason}")
    C = m.q_proj.in_features
    heads = getattr(m, "num_attention_heads", None) or getattr(m, "num_heads", None) \
        or C // m.head_dim
    return _read(path, type(m).__name__, m.q_proj, m.k_proj, m.v_proj, m.o_proj, heads,
                 getattr(m, "scaling", None))


def _mha_weights(m: nn.MultiheadAttention, path) -> SoftmaxWeights:
    if not m._qkv_same_embed_dim or m.bias_k is not None or m.add_zero_attn:
        raise ValueError(f"{path}: only plain self-attention nn.MultiheadAttention (kdim = vdim = "
                         "embed_dim, no bias_k/bias_v, no add_zero_attn) can be read")
    Wq, Wk, Wv = m.in_proj_weight.detach().chunk(3)
    bq, bk, bv = (None, None, None) if m.in_proj_bias is None else m.in_proj_bias.detach().chunk(3)
    return SoftmaxWeights(Wq, Wk, Wv, m.out_proj.weight.detach(), bq, bk, bv,
                          _bias(m.out_proj), heads=m.num_heads)


def _gpattn_weights(m: AttentionUnit, path) -> SoftmaxWeights:
    if not isinstance(m, SoftmaxAttention):
        raise ValueError(f"{path}: init='pretrained' reads a softmax layer; this one is "
                         f"{type(m).__name__}")
    Wq, Wk, Wv = m.qkv.weight.detach().chunk(3)
    bq, bk, bv = m.qkv.bias.detach().chunk(3)
    return SoftmaxWeights(Wq, Wk, Wv, m.out.weight.detach(), bq, bk, bv, _bias(m.out),
                          heads=m.heads)


#: why a unit cannot stand in for a causal (decoder) self-attention
_CAUSAL = ("causal (decoder) self-attention: the units take a [B, N] key padding mask and "
           "attend bidirectionally, so a swapped layer would let every token see the tokens "
           "after it")


def _qkvo_refusal(m) -> str | None:
    if getattr(m, "is_causal", False):
        return _CAUSAL
    if ("position_embeddings" in inspect.signature(type(m).forward).parameters
            or isinstance(getattr(m, "rotary_emb", None), nn.Module)):      # transformers < 4.45
        return ("rotary position embeddings are applied to q and k inside the attention; a "
                "unit computes its own projections and cannot apply them (the swapped layer "
                "would see no positions)")
    C = m.q_proj.in_features
    widths = (m.q_proj.out_features, m.k_proj.out_features, m.v_proj.out_features)
    if any(w != C for w in widths):
        return (f"q/k/v projections of widths {widths} for width {C} (grouped-query or "
                "resized attention): a unit has H heads of width C / H for queries, keys and "
                "values alike")
    return None


def _deberta_v1_refusal(m) -> str | None:
    if getattr(m.self, "talking_head", False):
        return ("talking heads (DeBERTa's head_logits_proj / head_weights_proj mix the heads' "
                "logits and weights): a unit's heads attend independently")
    return None


def _modernbert_refusal(m) -> str | None:
    if getattr(m, "is_causal", False):
        return _CAUSAL
    if ("position_embeddings" not in inspect.signature(type(m).forward).parameters
            or isinstance(getattr(m, "rotary_emb", None), nn.Module)
            or hasattr(m, "local_attention")):
        return ("the ModernBertAttention of transformers < 5 (it computes its rotary "
                "embeddings itself from position_ids and takes the sliding-window mask and "
                "unpadded flash-attention batches as separate arguments); a unit stands in for "
                "ModernBERT's attention from transformers 5 on, whose layer passes the rotary "
                "embeddings and one mask")
    window = getattr(m, "sliding_window", None)
    if window:
        half = getattr(getattr(m, "config", None), "sliding_window", window - 1)
        return (f"local (sliding-window) attention: each token attends only to the tokens "
                f"within {half} positions of it; a unit attends to every real token (its mask "
                "is a [B, N] padding mask), so it would change what the layer computes on any "
                "sequence longer than the window. Swap a global-attention layer instead "
                "(config.layer_types[i] == 'full_attention')")
    return None


def _gpt2_refusal(m) -> str | None:
    if getattr(m, "is_cross_attention", False):
        return "cross-attention: a unit does self-attention only"
    return _CAUSAL


def _bert_dropped(s) -> list[str]:
    kind = getattr(s, "position_embedding_type", "absolute") or "absolute"
    if kind == "absolute":
        return []
    return [f"{kind}: the relative-position term of the logits (position_embedding_type="
            f"{kind!r}) has no counterpart in a unit, which attends on content only"]


def _deberta_dropped(m) -> list[str]:
    s = m.self
    if not getattr(s, "relative_attention", False):
        return []
    terms = [t for t in ("c2p", "p2c") if t in (getattr(s, "pos_att_type", None) or [])]
    return [f"{t}: DeBERTa's disentangled {'content-to-position' if t == 'c2p' else 'position-to-content'} "
            "term of the logits has no counterpart in a unit, which attends on content only"
            for t in terms]


def _mpnet_dropped(m) -> list[str]:
    return ["position_bias: MPNet's relative-position bias of the logits (one learned bias per "
            "head and distance bucket, shared by all layers) has no counterpart in a unit, which "
            "attends on content only"]


def _p(drop) -> float:
    """The probability of a dropout module (``nn.Dropout.p`` or DeBERTa's ``drop_prob``)."""
    return float(getattr(drop, "p", getattr(drop, "drop_prob", 0.0)) or 0.0)


def _older_than(version: str) -> bool:
    try:
        import transformers
    except ImportError:  # pragma: no cover -- no HF host without transformers
        return False
    from packaging.version import Version
    return Version(transformers.__version__) < Version(version)


def _ln_adapter(get_ln, host: str, **options):
    def make(unit, m, layer):
        if isinstance(m, HostAttentionAdapter):
            return m.rewrap(unit)
        return BertAttentionAdapter(unit, get_ln(m), host, host_class=type(m).__name__,
                                    **options)
    return make


def _plain_adapter(host: str, **options):
    def make(unit, m, layer):
        if isinstance(m, HostAttentionAdapter):
            return m.rewrap(unit)
        return SelfAttentionAdapter(unit, host, host_class=type(m).__name__, **options)
    return make


def _deberta_adapter(unit, m, layer):
    # transformers < 4.47: DebertaV2Attention returns a tensor unless output_attentions
    return _ln_adapter(lambda m: m.output.LayerNorm, "deberta_v2",
                       tensor_return=_older_than("4.47"))(unit, m, layer)


def _rotary_adapter(host: str):
    def make(unit, m, layer):
        if not type(unit).rotary_capable:
            raise ValueError(f"swap_attention: {layer.path} ({layer.host_class}) rotates its "
                             f"queries and keys by rotary position embeddings; "
                             f"{type(unit).__name__} (kind {getattr(unit, 'kind', '?')!r}) does "
                             "not apply them (rotary_capable = False), so the swapped layer "
                             "would see no positions")
        unit.requires_positions = True
        if isinstance(m, HostAttentionAdapter):
            return m.rewrap(unit)
        params = inspect.signature(type(m).forward).parameters.values()
        names = [p.name for p in params if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
        return RotaryAttentionAdapter(unit, host, host_class=type(m).__name__,
                                      arg_names=names[2:])     # after self, hidden_states
    return make


_ADAPTERS = (HostAttentionAdapter, MultiheadAttentionAdapter)


def _swapped(m: nn.Module, host: str) -> bool:
    return isinstance(m, HostAttentionAdapter) and m.host == host


#: host kind -> how to recognise (``match``), read (``weights``, ``dropouts``), refuse
#: (``refuse``: module -> reason or ``None``), and replace (``adapter``) its attention layers;
#: ``dropped`` lists what a unit does not reproduce; ``models`` names the hosts, for errors
HOSTS: dict[str, dict] = {
    "bert": {"match": lambda m: _is_bert(m) or _swapped(m, "bert"), "weights": _bert_weights,
             "dropouts": lambda m: (_p(m.self.dropout), _p(m.output.dropout)),
             "dropped": lambda m: _bert_dropped(m.self),
             "adapter": _ln_adapter(lambda m: m.output.LayerNorm, "bert"), "unit_path": "unit",
             "models": "BERT, RoBERTa, ELECTRA, MiniLM and other BertAttention copies "
                       "(self.query/key/value + output.dense/LayerNorm)"},
    "albert": {"match": lambda m: _is_albert(m) or _swapped(m, "albert"),
               "weights": _albert_weights,
               "dropouts": lambda m: (_p(getattr(m, "attention_dropout", None)),
                                      _p(getattr(m, "output_dropout", None))),
               "dropped": _bert_dropped,
               "adapter": _ln_adapter(lambda m: m.LayerNorm, "albert"), "unit_path": "unit",
               "models": "ALBERT (query/key/value/dense/LayerNorm in one module)"},
    "deberta_v2": {"match": lambda m: _is_deberta(m) or _swapped(m, "deberta_v2"),
                   "weights": _deberta_weights,
                   "dropouts": lambda m: (_p(m.self.dropout), _p(m.output.dropout)),
                   "dropped": _deberta_dropped, "adapter": _deberta_adapter,
                   "unit_path": "unit",
                   "models": "DeBERTa-v2/v3 (self.query_proj/key_proj/value_proj + "
                             "output.dense/LayerNorm)"},
    "deberta": {"match": lambda m: _is_deberta_v1(m) or _swapped(m, "deberta"),
                "weights": _deberta_v1_weights,
                "dropouts": lambda m: (_p(m.self.dropout), _p(m.output.dropout)),
                "refuse": _deberta_v1_refusal, "dropped": _deberta_dropped,
                # transformers < 4.47: DebertaAttention returns a tensor unless output_attentions
                "adapter": lambda unit, m, layer: _ln_adapter(
                    lambda m: m.output.LayerNorm, "deberta",
                    tensor_return=_older_than("4.47"))(unit, m, layer),
                "unit_path": "unit",
                "models": "DeBERTa (v1: self.in_proj + q_bias/v_bias + output.dense/LayerNorm)"},
    "mpnet": {"match": lambda m: _is_mpnet(m) or _swapped(m, "mpnet"),
              "weights": _mpnet_weights,
              "dropouts": lambda m: (_p(m.attn.dropout), _p(m.dropout)),
              "dropped": _mpnet_dropped,
              "adapter": _ln_adapter(lambda m: m.LayerNorm, "mpnet"), "unit_path": "unit",
              "models": "MPNet (attn.q/k/v/o + LayerNorm; its relative-position bias dropped)"},
    "modernbert": {"match": lambda m: _is_modernbert(m) or _swapped(m, "modernbert"),
                   "weights": _modernbert_weights,
                   "dropouts": lambda m: (float(getattr(m, "attention_dropout", 0.0) or 0.0),
                                          _p(getattr(m, "out_drop", None))),
                   "refuse": _modernbert_refusal, "adapter": _rotary_adapter("modernbert"),
                   "unit_path": "unit",
                   "models": "ModernBERT on transformers >= 5 (fused Wqkv + Wo, rotary "
                             "embeddings applied by the unit; global-attention layers)"},
    "vit": {"match": lambda m: _is_vit(m) or _swapped(m, "vit"), "weights": _vit_weights,
            "dropouts": lambda m: (_p(m.attention.dropout), _p(m.output.dropout)),
            "adapter": _plain_adapter("vit", mask_arg=False), "unit_path": "unit",
            "models": "ViT on transformers < 5 (attention.query/key/value + output.dense)"},
    "distilbert": {"match": lambda m: _is_distilbert(m) or _swapped(m, "distilbert"),
                   "weights": _distilbert_weights,
                   "dropouts": lambda m: (_p(getattr(m, "dropout", None)), 0.0),
                   "adapter": _plain_adapter("distilbert"), "unit_path": "unit",
                   "models": "DistilBERT (q_lin/k_lin/v_lin/out_lin)"},
    "qkvo": {"match": lambda m: _is_qkvo(m) or _swapped(m, "qkvo"), "weights": _qkvo_weights,
             "dropouts": lambda m: (float(getattr(m, "attention_dropout", 0.0) or 0.0), 0.0),
             "refuse": _qkvo_refusal, "adapter": _plain_adapter("qkvo"), "unit_path": "unit",
             "models": "bidirectional q_proj/k_proj/v_proj/o_proj attention without rotary "
                       "embeddings or grouped-query heads (ViT on transformers >= 5, ...)"},
    "gpt2": {"match": _is_gpt2, "refuse": _gpt2_refusal,
             "models": "GPT-2 (c_attn/c_proj; recognised, refused: causal)"},
    "torch": {"match": lambda m: isinstance(m, (nn.MultiheadAttention,
                                                 MultiheadAttentionAdapter)), "weights": _mha_weights,
              "dropouts": lambda m: (float(m.dropout), 0.0),
              "adapter": lambda unit, m, layer: MultiheadAttentionAdapter(unit, m.batch_first),
              "unit_path": "unit", "models": "nn.TransformerEncoder / nn.MultiheadAttention"},
    "gpattn": {"match": _is_gpattn, "weights": _gpattn_weights,
               "dropouts": lambda m: (_p(getattr(m, "attn_dropout", None)), _p(m.proj_dropout)),
               "adapter": lambda unit, m, layer: unit, "unit_path": "",
               "models": "the library's TextClassifier / ViTClassifier"},
}


def find_attention_layers(model: nn.Module) -> list[AttentionLayer]:
    """The self-attention layers of ``model`` in module order, of one host kind.

    A module shared by several depths (ALBERT's one layer) is one layer here.

    :raises ValueError: none found (naming the model's class, the attention modules it has and
        the layouts that are recognised), or layers of two host kinds.
    """
    found, owned = [], set()
    for path, module in model.named_modules():
        if any(path.startswith(p + ".") for p in owned):
            continue                           # inside a layer already found (BERT's .self)
        for host, spec in HOSTS.items():
            if spec["match"](module):
                if not path:
                    raise ValueError("swap_attention: the model is itself an attention layer; "
                                     "pass the model that contains it")
                parent_path, _, attr = path.rpartition(".")
                found.append(AttentionLayer(path, model.get_submodule(parent_path), attr, module, host))
                owned.add(path)
                break
    if not found:
        seen = sorted({type(m).__name__ for m in model.modules()
                       if "attention" in type(m).__name__.lower()
                       or type(m).__name__.lower().endswith("attn")})
        which = (f"its attention modules ({', '.join(seen)}) have none of the recognised "
                 "projection layouts" if seen else "it has no module named like an attention")
        raise ValueError(f"swap_attention: no self-attention layer found in "
                         f"{type(model).__name__}: {which}. Recognised: "
                         + "; ".join(spec["models"] for spec in HOSTS.values()))
    hosts = {layer.host for layer in found}
    if len(hosts) > 1:
        raise ValueError(f"swap_attention: attention layers of several kinds in one model "
                         f"({', '.join(sorted(hosts))}); swap in the sub-model of one kind")
    return found


def attention_units(model: nn.Module) -> dict[str, AttentionUnit]:
    """Module path -> every :class:`~gpattn_ppl.attention.AttentionUnit` in ``model``."""
    return {n: m for n, m in model.named_modules() if isinstance(m, AttentionUnit)}


def swapped_prefix(model: nn.Module) -> list[tuple[object, str]]:
    """The deterministic prefix of a (swapped) Hugging Face encoder, as
    :class:`~gpattn_ppl.models.host.PrefixCache` targets: its embeddings and the modules
    holding each attention layer before the first stochastic unit; empty when the model (or
    its ``base_model``) has no ``embeddings``."""
    emb = getattr(getattr(model, "base_model", model), "embeddings", None)
    if not isinstance(emb, nn.Module):
        return []
    targets: list[tuple[object, str]] = [(emb, "forward")]
    for layer in find_attention_layers(model):
        if any(u.stochastic for u in attention_units(layer.module).values()):
            break
        targets.append((layer.parent, "forward"))
    return targets


# -- calibration --------------------------------------------------------------------------------

def _run(model: nn.Module, calibration) -> None:
    if callable(calibration):
        calibration(model)
    elif isinstance(calibration, dict):
        model(**calibration)
    elif isinstance(calibration, (tuple, list)):
        model(*calibration)
    else:
        model(calibration)


@torch.no_grad()
def _unit_input(model: nn.Module, unit: AttentionUnit, calibration):
    """``(x [B, N, C], mask [B, N] or None, rotary or None)`` that ``unit`` receives when
    ``calibration`` runs through ``model`` in eval mode (the unit itself is not run: the hook
    stops the pass); ``rotary``: the :class:`~gpattn_ppl.attention.RotaryPositions` its
    adapter gave it (ModernBERT)."""
    seen = {}

    class _Stop(Exception):
        pass

    def hook(module, args, kwargs):
        seen["x"] = args[0] if args else kwargs["x"]
        seen["mask"] = args[1] if len(args) > 1 else kwargs.get("mask")
        seen["rotary"] = module._rotary
        raise _Stop

    handle = unit.register_forward_pre_hook(hook, with_kwargs=True)
    was_training = model.training
    model.eval()
    try:
        _run(model, calibration)
    except _Stop:
        pass
    finally:
        handle.remove()
        model.train(was_training)
    if "x" not in seen:
        raise ValueError(f"swap_attention: the calibration batch never reached {unit.site_prefix}")
    return seen["x"], seen["mask"], seen["rotary"]


@torch.no_grad()
def gap_to_softmax(unit: AttentionUnit, weights: SoftmaxWeights, x: torch.Tensor,
                   mask: torch.Tensor | None) -> dict:
    """Relative error of the unit's output against the pretrained layer's on its inputs ``x``
    (eval mode, no dropout): ``gap_mean`` at the posterior mean, ``gap_sample`` for one draw.
    With ``weights.rotary`` (a layer that rotates queries and keys) both run with those
    positions."""
    was = unit.training
    unit.eval()
    try:
        ref = weights.output(x.to(weights.q_weight), mask).to(x.dtype)
        with unit.positions(weights.rotary if weights.rotary is not None else unit._rotary):
            with settings.posterior_mean():
                mean = unit(x, mask)
            draw = unit(x, mask)
    finally:
        unit.train(was)
    return {"gap_mean": relative_error(mean, ref, mask),
            "gap_sample": relative_error(draw, ref, mask)}


def calibrate_swapped(model: nn.Module, pretrained: dict[str, SoftmaxWeights], calibration, *,
                      fit: bool = True) -> dict[str, dict]:
    """Fit the swapped units of ``model`` to their pretrained layers on a calibration batch.

    Layer by layer in module order (each sees the inputs the units fitted before it produce):
    capture the unit's input, re-initialise it from its layer with the data
    (:func:`~gpattn_ppl.attention.init_from_softmax`, when ``fit``), and measure the gap
    (:func:`gap_to_softmax`).

    :param pretrained: unit path -> the :class:`~gpattn_ppl.attention.SoftmaxWeights` of the
        layer it replaced.
    :param calibration: as for :func:`swap_attention`.
    :returns: unit path -> ``{"fitted": [...], "gap_mean", "gap_sample"}``.
    """
    units = attention_units(model)
    out = {}
    for path in [p for p in units if p in pretrained]:
        unit, weights = units[path], pretrained[path]
        x, mask, rotary = _unit_input(model, unit, calibration)
        if rotary is not None:      # the batch's positions, for the layer and the unit alike
            weights = dataclasses.replace(weights, rotary=rotary)
        rec = {}
        if fit:
            rec["fitted"] = init_from_softmax(unit, weights, x, mask)["fitted"]
        rec.update(gap_to_softmax(unit, weights, x, mask))
        out[path] = rec
    return out


# -- the swap ---------------------------------------------------------------------------------

def _notes(model: nn.Module, layer: AttentionLayer) -> list[str]:
    """What the record should say about the layer beyond the swap itself (ALBERT's sharing,
    ModernBERT's rotary embeddings)."""
    if layer.host == "modernbert":
        return ["ModernBERT's rotary position embeddings rotate the unit's queries and keys (and "
                "CGPT's latent inputs) as they did the layer's; SGPA's global inducing keys, "
                "SCGPT's inducing inputs and h-Gumbel's centroids carry no position"]
    if layer.host != "albert":
        return []
    cfg = next((m.config for m in model.modules()
                if hasattr(getattr(m, "config", None), "num_hidden_groups")), None)
    if cfg is None:
        return ["ALBERT shares one layer's weights across depths: the unit runs wherever "
                "this module does"]
    runs = cfg.num_hidden_layers // cfg.num_hidden_groups
    return [f"ALBERT shares layer weights: this one module (and so the unit) runs at {runs} "
            f"of the {cfg.num_hidden_layers} depths; calibration fits it on the inputs of the "
            "first"]


def _swap_layers(model: nn.Module, kind: str, layers: Sequence[int] = (-1,),
                 init: str = "pretrained", calibration=None, **options) -> list[dict]:
    """The swap itself, without the record of a ``transformers`` model (:func:`swap_attention`
    adds it): parameters, returns, errors and warnings as :func:`swap_attention`."""
    if init not in ("pretrained", "random"):
        raise ValueError(f"swap_attention: init must be 'pretrained' or 'random', got {init!r}")
    found = find_attention_layers(model)
    L = len(found)
    chosen = []
    for i in layers:
        if isinstance(i, bool) or not isinstance(i, int) or not -L <= i < L:
            shared = " (ALBERT's shared layers count once)" if found[0].host == "albert" else ""
            raise ValueError(f"swap_attention: layer index {i!r} out of range for {L} attention "
                             f"layers{shared} (allowed {-L}..{L - 1})")
        if found[i % L] not in chosen:
            chosen.append(found[i % L])
    for layer in chosen:                 # refuse before anything is replaced
        reason = layer.refusal()
        if reason:
            raise ValueError(f"swap_attention: cannot swap {layer.path} ({layer.host_class} in "
                             f"{type(model).__name__}): {reason}")
    param = next(model.parameters())
    records, pretrained = [], {}
    for layer in chosen:
        dropped, host_class = layer.dropped(), layer.host_class
        if dropped:
            warnings.warn(f"swap_attention: {layer.path} ({host_class}): the unit replaces "
                          f"the attention without {'; '.join(dropped)}", UserWarning,
                          stacklevel=3)
        read = init == "pretrained" or (calibration is not None and layer.swapped is None)
        weights = layer.weights() if read else None
        C, heads = layer.shape()
        p_attn, p_proj = layer.dropouts()
        opts = dict(options)
        allowed = attention_options(kind) if kind in ATTENTION else {}
        if "attn_dropout" in allowed:
            opts.setdefault("attn_dropout", p_attn)
        if "proj_dropout" in allowed:
            opts.setdefault("proj_dropout", p_proj)
        unit_path = ".".join(p for p in (layer.path, HOSTS[layer.host]["unit_path"]) if p)
        unit = build_attention(kind, C, heads, where=unit_path, **opts).to(param)
        unit.site_prefix = unit_path
        record = {"path": unit_path, "host": layer.host, "host_class": host_class,
                  "kind": kind, "init": init, "dropped": [d.split(":")[0] for d in dropped],
                  "notes": _notes(model, layer)}
        if init == "pretrained":
            rep = init_from_softmax(unit, weights)
            record.update({k: rep[k] for k in ("copied", "fitted", "not_carried")})
            record["not_carried"] = list(record["not_carried"]) + record["dropped"]
        unit.train(layer.module.training)
        # the adapter (a new module, in training mode) takes the mode of what it replaces
        adapter = HOSTS[layer.host]["adapter"](unit, layer.module, layer).train(
            layer.module.training)
        setattr(layer.parent, layer.attr, adapter)
        record["adapter"] = type(adapter).__name__
        record["weights"] = weights
        if weights is not None:
            pretrained[unit_path] = weights
        records.append(record)
    for m in model.modules():   # its nested-tensor fast path reads the attention's weights
        if isinstance(m, nn.TransformerEncoder) and any(
                isinstance(a, MultiheadAttentionAdapter) for a in m.modules()):
            m.use_nested_tensor = False
    if calibration is not None and pretrained:
        fitted = calibrate_swapped(model, pretrained, calibration, fit=init == "pretrained")
        for record in records:
            record.update(fitted.get(record["path"], {}))
    return records


#: what ``swap_attention(model)`` swaps in when no kind is given (see its docstring)
_RECOMMENDED_KIND = "cgpt"


def _pretrained_model(model: nn.Module) -> bool:
    """Whether ``model`` is a ``transformers`` ``PreTrainedModel`` (without importing
    ``transformers``: a model of it exists only once it is imported)."""
    import sys

    transformers = sys.modules.get("transformers")
    try:
        cls = getattr(transformers, "PreTrainedModel", None)
    except (ImportError, RuntimeError):
        cls = None
    return isinstance(cls, type) and isinstance(model, cls)


def swap_attention(model: nn.Module, kind: str | None = None, layers: Sequence[int] = (-1,),
                   init: str = "pretrained", calibration=None, *, predictive: str | None = None,
                   **options) -> list[dict]:
    """Replace the self-attention of ``layers`` of ``model`` by units of ``kind`` (in place);
    the one swap of the library (``gpattn_ppl.hf.swap`` is this function).

    **Any model.** A ``transformers`` ``PreTrainedModel`` (``BertForSequenceClassification``,
    ``AutoModel.from_pretrained(...)``, ...) also gets the swap recorded in its config
    (:mod:`gpattn_ppl.models.swap_record`: ``config.gpattn_swap``, and the recommended
    predictive in ``config.gpattn_predictive``) and becomes an instance of its swapped class
    (``GpattnBertForSequenceClassification``, model type ``gpattn_bert``;
    :mod:`gpattn_ppl.models.swapped_types`), so that ``save_pretrained`` writes a folder that
    ``transformers``' Auto classes, ``pipeline`` and :func:`gpattn_ppl.hf.from_pretrained` load
    with the units (once :mod:`gpattn_ppl.hf` is imported), and that plain ``transformers``
    refuses (an unknown model type) instead of loading the host with random weights in the
    units' place. Any other module (an ``nn.TransformerEncoder``, a library classifier, a part
    of a ``PreTrainedModel``) is swapped without a record.

    **The recommended configuration.** ``swap_attention(model)``, without ``kind``, swaps CGPT
    into the last attention layer (``layers=[-1]``), initialised from the pretrained layer, and
    records ``predictive="mean"``: predict with one pass at the units' posterior mean, then
    temperature-scale the logits on held-out data. The evidence (``experiments/README.md``,
    "CLINC150, MiniLM fine-tuned", 3 seeds): all-MiniLM-L6-v2 fine-tuned on CLINC150 (150
    intents, 1,000 out-of-scope test queries), CGPT (mean) + TS against softmax + TS: accuracy
    0.963 against 0.953, NLL 0.139 against 0.169, Brier 0.054 against 0.071 and out-of-scope
    AUROC 0.964 against 0.953, each better on all three seeds (paired p <= 0.006), ECE a tie
    (0.0073 against 0.0072, p = 0.87), at 1.10x softmax's test cost (3.95 against 3.59 ms per
    query); the posterior mean loses nothing measurable against ten Monte-Carlo passes (test
    mutual information 5e-4) at a quarter of their cost. SNGP + TS is level with it (NLL
    0.145, p = 0.16; its out-of-scope AUROC 0.004 higher, p = 0.04).

    :param model: a Hugging Face encoder (see the module docstring for the families) or a
        model containing one, an ``nn.TransformerEncoder`` (or anything holding
        ``nn.MultiheadAttention`` self-attention layers), or a library classifier.
    :param kind: a registered attention kind (``"kep_svgp"``, ``"sgpa"``, ...); ``None``: the
        recommended ``"cgpt"``.
    :param layers: indices into the model's attention layers, in module order; negative
        indices count from the end (``[-1]``: the last layer).
    :param init: ``"pretrained"`` (start from the replaced layer, see
        :func:`~gpattn_ppl.attention.init_from_softmax`) or ``"random"`` (the unit's own init).
    :param calibration: inputs of ``model`` for one forward pass (a dict of keyword arguments,
        a tuple of positional ones, one tensor, or a callable taking the model). With
        ``init="pretrained"`` they fit the data-dependent parameters
        (:func:`calibrate_swapped`); with either init the report then holds the gap to the
        replaced layer.
    :param predictive: the predictive recorded in a ``PreTrainedModel``'s config
        (``config.gpattn_predictive``, read by :mod:`gpattn_ppl.hf`'s pipeline and trainer):
        ``"mean"`` (one pass at the posterior mean) or ``"mc"`` (Monte-Carlo passes). Default:
        ``"mean"`` without ``kind`` (the recommended configuration), ``"mc"`` with one; each
        call sets it. Not recorded for other modules.
    :param options: the unit's options; its dropouts default to the host's (attention
        probabilities; BERT's output dropout). For a ``PreTrainedModel`` they must be JSON
        values (they are saved in ``config.json``).
    :returns: one record per swapped layer: ``path`` (of the unit), ``host`` (a key of
        :data:`HOSTS`), ``host_class`` (the replaced module's class), ``adapter`` (the class
        standing in for it), ``kind``, ``init``, ``dropped`` (terms of the host's attention the
        unit does not reproduce, e.g. DeBERTa's ``["c2p", "p2c"]``), ``notes`` (e.g. ALBERT's
        sharing), ``copied`` / ``fitted`` / ``not_carried`` (with ``init="pretrained"``;
        ``not_carried`` includes ``dropped``), and with a calibration batch ``gap_mean`` and
        ``gap_sample``, the relative error of the attention output at the posterior mean and
        for one draw (against the layer's content attention where terms are dropped); and
        ``weights``, the replaced layer's :class:`~gpattn_ppl.attention.SoftmaxWeights`
        (``None`` when it was not read).
    :raises ValueError: an unknown kind, init or predictive, a layer index out of range, a host
        that is not supported or refused (naming its class and the reason), or not softmax
        attention where ``init="pretrained"`` reads it.
    :raises ~gpattn_ppl.models.swap_record.SwapRecordError: a ``PreTrainedModel`` with options
        that JSON cannot hold, or holding units swapped in without a record (into one of its
        parts).
    :warns UserWarning: terms of the host's attention that the unit drops (DeBERTa's
        relative-position terms, BERT's ``relative_key`` logits before transformers 5).

    >>> import transformers
    >>> from gpattn_ppl.models import swap_attention
    >>> cfg = transformers.BertConfig(vocab_size=50, hidden_size=16, num_hidden_layers=2,
    ...                               num_attention_heads=4, intermediate_size=32)
    >>> model = transformers.BertForSequenceClassification(cfg)
    >>> [r["path"] for r in swap_attention(model, "kep_svgp", init="random", rank=3)]
    ['bert.encoder.layer.1.attention.unit']
    >>> type(model).__name__, model.config.model_type, model.config.gpattn_predictive
    ('GpattnBertForSequenceClassification', 'gpattn_bert', 'mc')
    >>> model.config.gpattn_swap[0]["kind"], model.config.gpattn_swap[0]["layers"]
    ('kep_svgp', [1])
    """
    from .swap_record import (
        PREDICTIVE_KEY,
        PREDICTIVES,
        _append_entry,
        _check_options,
        check_swap_record,
    )

    if predictive is not None and predictive not in PREDICTIVES:
        raise ValueError(f"swap_attention: predictive must be one of {', '.join(PREDICTIVES)}, "
                         f"got {predictive!r}")
    recommended = kind is None
    kind = _RECOMMENDED_KIND if recommended else kind
    if not _pretrained_model(model):
        return _swap_layers(model, kind, layers=layers, init=init, calibration=calibration,
                            **options)
    from .swapped_types import _convert

    check_swap_record(model, where="swap_attention")
    _check_options(options, "swap_attention")
    n_layers = len(find_attention_layers(model))
    records = _swap_layers(model, kind, layers=layers, init=init, calibration=calibration,
                           **options)
    _append_entry(model, kind, layers, n_layers, records, options)
    setattr(model.config, PREDICTIVE_KEY, predictive or ("mean" if recommended else "mc"))
    _convert(model)
    return records
