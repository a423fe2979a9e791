"""Swapping any registered attention unit into a host Transformer.

:func:`swap_attention` replaces the self-attention of chosen layers of

* a Hugging Face BERT-family encoder (``BertModel`` and every model whose layers hold a
  ``BertAttention``-like module: ``self.query/key/value`` + ``output.dense/LayerNorm``, e.g.
  all-MiniLM-L6-v2), a DistilBERT one (``q_lin/k_lin/v_lin/out_lin``), or one whose
  self-attention has ``q_proj/k_proj/v_proj/o_proj`` (ViT and others; bidirectional, no
  grouped-query attention),
* ``torch.nn.TransformerEncoder`` layers (their ``nn.MultiheadAttention``),
* the library's own :class:`~gpattn_ppl.models.TextClassifier` /
  :class:`~gpattn_ppl.models.ViTClassifier` blocks,

with a unit built by :func:`~gpattn_ppl.attention.build_attention`, behind an adapter that keeps
the host's interface: its calling convention, its attention masks (translated to the units'
``[B, N]`` key mask), its head count and width, and its dropout (attention-probability dropout
for units with attention weights, the output dropout of BERT's ``BertSelfOutput``). With
``init="pretrained"`` the unit starts from the replaced layer's projections
(:func:`~gpattn_ppl.attention.init_from_softmax`), and, given a calibration batch, its
GP-specific parameters are fitted to reproduce the layer's output; the report says how close
it got (relative error of the attention output at the posterior mean and for one draw).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch
from torch import nn

from .. import settings
from ..attention import (
    ATTENTION,
    AttentionUnit,
    SoftmaxAttention,
    SoftmaxWeights,
    attention_options,
    build_attention,
    init_from_softmax,
    relative_error,
)

__all__ = ["AttentionLayer", "BertAttentionAdapter", "SelfAttentionAdapter", "HOSTS",
           "MultiheadAttentionAdapter", "attention_units", "calibrate_swapped",
           "find_attention_layers", "gap_to_softmax", "key_mask", "swap_attention"]


# -- masks --------------------------------------------------------------------------------------

def key_mask(mask: torch.Tensor | None, B: int, N: int, where: str) -> torch.Tensor | None:
    """The units' ``[B, N]`` bool key mask (True on real tokens) from a host's padding mask.

    Accepted: ``None``; ``[B, N]`` bool/int (1 or True = real); HF's 4-D ``[B, 1, N_q, N]``
    bool (True = attend) or additive float (0 = attend, a large negative = masked). A key is
    real when some query may attend to it.

    :raises ValueError: another shape, naming ``where``.
    """
    if mask is None:
        return None
    if mask.dim() == 4 and mask.shape[0] == B and mask.shape[1] == 1 and mask.shape[-1] == N:
        if mask.dtype == torch.bool:
            real = mask[:, 0].any(-2)
        else:
            real = (mask[:, 0] > torch.finfo(mask.dtype).min / 2).any(-2)
    elif mask.dim() == 2 and tuple(mask.shape) == (B, N):
        real = mask.bool() if mask.dtype == torch.bool or not mask.is_floating_point() \
            else mask > 0.5
    else:
        raise ValueError(f"{where}: cannot read a padding mask of shape {tuple(mask.shape)} for "
                         f"inputs [B, N] = [{B}, {N}] (expected [B, N] or [B, 1, N_q, N])")
    return real


# -- adapters -----------------------------------------------------------------------------------

class BertAttentionAdapter(nn.Module):
    r"""Stands in for a ``BertAttention``: ``LN(x + \mathrm{unit}(x, \text{mask}))``.

    The unit owns ``W_O`` and the output dropout (BERT's ``dense`` and ``dropout``); the
    host's ``LayerNorm`` is kept. Returns ``(output, None)`` as ``BertAttention`` does.
    """

    def __init__(self, unit: AttentionUnit, layer_norm: nn.LayerNorm) -> None:
        super().__init__()
        self.unit, self.LayerNorm = unit, layer_norm

    def forward(self, hidden_states: torch.Tensor, attention_mask: torch.Tensor | None = None,
                encoder_hidden_states: torch.Tensor | None = None, *args, **kwargs):
        if encoder_hidden_states is not None or kwargs.get("cache") is not None:
            raise ValueError(f"{self.unit.site_prefix}: a swapped unit does self-attention "
                             "only (no cross-attention, no key/value cache)")
        B, N, _ = hidden_states.shape
        mask = key_mask(attention_mask, B, N, self.unit.site_prefix)
        return self.LayerNorm(hidden_states + self.unit(hidden_states, mask)), None


class SelfAttentionAdapter(nn.Module):
    """Stands in for a self-attention module that returns ``(output, weights)`` and leaves the
    residual to its layer (DistilBERT's, and the ``q_proj/k_proj/v_proj/o_proj`` modules of
    ViT and others): ``(unit(x, mask), None)``."""

    def __init__(self, unit: AttentionUnit, host: str) -> None:
        super().__init__()
        self.unit, self.host = unit, host

    def forward(self, hidden_states: torch.Tensor, attention_mask: torch.Tensor | None = None,
                *args, **kwargs):
        B, N, _ = hidden_states.shape
        mask = key_mask(attention_mask, B, N, self.unit.site_prefix)
        return self.unit(hidden_states, mask), None


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

    def weights(self) -> SoftmaxWeights:
        if self.swapped is not None:
            raise ValueError(f"{self.path}: already swapped to {type(self.swapped).__name__}; "
                             "init='pretrained' reads a softmax layer (use init='random', or "
                             "swap in the original model)")
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


def _is_bert(m: nn.Module) -> bool:
    s, o = getattr(m, "self", None), getattr(m, "output", None)
    return (isinstance(s, nn.Module) and all(isinstance(getattr(s, n, None), nn.Linear)
                                             for n in ("query", "key", "value"))
            and isinstance(getattr(o, "dense", None), nn.Linear)
            and isinstance(getattr(o, "LayerNorm", None), nn.LayerNorm))


def _is_distilbert(m: nn.Module) -> bool:
    return all(isinstance(getattr(m, n, None), nn.Linear)
               for n in ("q_lin", "k_lin", "v_lin", "out_lin"))


def _is_qkvo(m: nn.Module) -> bool:
    return all(isinstance(getattr(m, n, None), nn.Linear)
               for n in ("q_proj", "k_proj", "v_proj", "o_proj"))


def _is_gpattn(m: nn.Module) -> bool:
    return isinstance(m, AttentionUnit)


def _bias(lin: nn.Linear):
    return None if lin.bias is None else lin.bias.detach()


def _bert_weights(m, path) -> SoftmaxWeights:
    s = m.self
    heads = getattr(s, "num_attention_heads", None) or s.config.num_attention_heads
    return SoftmaxWeights(s.query.weight.detach(), s.key.weight.detach(), s.value.weight.detach(),
                          m.output.dense.weight.detach(), _bias(s.query), _bias(s.key),
                          _bias(s.value), _bias(m.output.dense), heads=heads,
                          scale=getattr(s, "scaling", None))


def _distilbert_weights(m, path) -> SoftmaxWeights:
    heads = getattr(m, "n_heads", None)
    return SoftmaxWeights(m.q_lin.weight.detach(), m.k_lin.weight.detach(),
                          m.v_lin.weight.detach(), m.out_lin.weight.detach(), _bias(m.q_lin),
                          _bias(m.k_lin), _bias(m.v_lin), _bias(m.out_lin), heads=heads,
                          scale=getattr(m, "scaling", None))


def _qkvo_weights(m, path) -> SoftmaxWeights:
    if getattr(m, "is_causal", False):
        raise ValueError(f"{path}: causal (decoder) attention; a swapped unit attends "
                         "bidirectionally")
    C = m.q_proj.in_features
    if not (m.q_proj.out_features == m.k_proj.out_features == m.v_proj.out_features == C):
        raise ValueError(f"{path}: q/k/v projections of widths {m.q_proj.out_features}, "
                         f"{m.k_proj.out_features}, {m.v_proj.out_features} for width {C} "
                         "(grouped-query or reshaped attention cannot be read)")
    heads = getattr(m, "num_attention_heads", None) or getattr(m, "num_heads", None) \
        or C // m.head_dim
    return SoftmaxWeights(m.q_proj.weight.detach(), m.k_proj.weight.detach(),
                          m.v_proj.weight.detach(), m.o_proj.weight.detach(), _bias(m.q_proj),
                          _bias(m.k_proj), _bias(m.v_proj), _bias(m.o_proj), heads=heads,
                          scale=getattr(m, "scaling", None))


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


def _p(drop) -> float:
    return float(getattr(drop, "p", 0.0) or 0.0)


def _bert_adapter(unit, m, layer):
    return BertAttentionAdapter(unit, m.LayerNorm if isinstance(m, BertAttentionAdapter)
                                else m.output.LayerNorm)


_ADAPTERS = (BertAttentionAdapter, SelfAttentionAdapter, MultiheadAttentionAdapter)

def _swapped(m: nn.Module, host: str) -> bool:
    return isinstance(m, SelfAttentionAdapter) and m.host == host


#: host kind -> how to recognise, read and replace its attention layers
HOSTS: dict[str, dict[str, Callable]] = {
    "bert": {"match": lambda m: _is_bert(m) or isinstance(m, BertAttentionAdapter), "weights": _bert_weights,
             "dropouts": lambda m: (_p(m.self.dropout), _p(m.output.dropout)),
             "adapter": _bert_adapter, "unit_path": "unit"},
    "distilbert": {"match": lambda m: _is_distilbert(m) or _swapped(m, "distilbert"),
                   "weights": _distilbert_weights,
                   "dropouts": lambda m: (_p(getattr(m, "dropout", None)), 0.0),
                   "adapter": lambda unit, m, layer: SelfAttentionAdapter(unit, "distilbert"),
                   "unit_path": "unit"},
    "qkvo": {"match": lambda m: _is_qkvo(m) or _swapped(m, "qkvo"), "weights": _qkvo_weights,
             "dropouts": lambda m: (float(getattr(m, "attention_dropout", 0.0) or 0.0), 0.0),
             "adapter": lambda unit, m, layer: SelfAttentionAdapter(unit, "qkvo"),
             "unit_path": "unit"},
    "torch": {"match": lambda m: isinstance(m, (nn.MultiheadAttention,
                                                 MultiheadAttentionAdapter)), "weights": _mha_weights,
              "dropouts": lambda m: (float(m.dropout), 0.0),
              "adapter": lambda unit, m, layer: MultiheadAttentionAdapter(unit, m.batch_first),
              "unit_path": "unit"},
    "gpattn": {"match": _is_gpattn, "weights": _gpattn_weights,
               "dropouts": lambda m: (_p(getattr(m, "attn_dropout", None)), _p(m.proj_dropout)),
               "adapter": lambda unit, m, layer: unit, "unit_path": ""},
}


def find_attention_layers(model: nn.Module) -> list[AttentionLayer]:
    """The self-attention layers of ``model`` in module order, of one host kind.

    :raises ValueError: none found, or layers of two host kinds.
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
        raise ValueError(f"swap_attention: no self-attention layer found in "
                         f"{type(model).__name__}; supported hosts: BERT-family and DistilBERT "
                         "encoders (Hugging Face), nn.TransformerEncoder / nn.MultiheadAttention, "
                         "and the library's TextClassifier / ViTClassifier")
    hosts = {layer.host for layer in found}
    if len(hosts) > 1:
        raise ValueError(f"swap_attention: attention layers of several kinds in one model "
                         f"({', '.join(sorted(hosts))}); swap in the sub-model of one kind")
    return found


def attention_units(model: nn.Module) -> dict[str, AttentionUnit]:
    """Module path -> every :class:`~gpattn_ppl.attention.AttentionUnit` in ``model``."""
    return {n: m for n, m in model.named_modules() if isinstance(m, AttentionUnit)}


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
    """``(x [B, N, C], mask [B, N] or None)`` that ``unit`` receives when ``calibration`` runs
    through ``model`` in eval mode (the unit itself is not run: the hook stops the pass)."""
    seen = {}

    class _Stop(Exception):
        pass

    def hook(module, args, kwargs):
        seen["x"] = args[0] if args else kwargs["x"]
        seen["mask"] = args[1] if len(args) > 1 else kwargs.get("mask")
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
    return seen["x"], seen["mask"]


@torch.no_grad()
def gap_to_softmax(unit: AttentionUnit, weights: SoftmaxWeights, x: torch.Tensor,
                   mask: torch.Tensor | None) -> dict:
    """Relative error of the unit's output against the pretrained layer's on its inputs ``x``
    (eval mode, no dropout): ``gap_mean`` at the posterior mean, ``gap_sample`` for one draw."""
    was = unit.training
    unit.eval()
    try:
        ref = weights.output(x.to(weights.q_weight), mask).to(x.dtype)
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
        x, mask = _unit_input(model, unit, calibration)
        rec = {}
        if fit:
            rec["fitted"] = init_from_softmax(unit, weights, x, mask)["fitted"]
        rec.update(gap_to_softmax(unit, weights, x, mask))
        out[path] = rec
    return out


# -- the swap ---------------------------------------------------------------------------------

def swap_attention(model: nn.Module, kind: str, layers: Sequence[int] = (-1,),
                   init: str = "pretrained", calibration=None, **options) -> list[dict]:
    """Replace the self-attention of ``layers`` of ``model`` by units of ``kind`` (in place).

    :param model: a Hugging Face BERT-family / DistilBERT encoder (or a model containing one),
        an ``nn.TransformerEncoder`` (or anything holding ``nn.MultiheadAttention`` self-attention
        layers), or a library classifier.
    :param kind: a registered attention kind (``"kep_svgp"``, ``"sgpa"``, ...).
    :param layers: indices into the model's attention layers, in module order; negative
        indices count from the end (``[-1]``: the last layer).
    :param init: ``"pretrained"`` (start from the replaced layer, see
        :func:`~gpattn_ppl.attention.init_from_softmax`) or ``"random"`` (the unit's own init).
    :param calibration: inputs of ``model`` for one forward pass (a dict of keyword arguments,
        a tuple of positional ones, one tensor, or a callable taking the model). With
        ``init="pretrained"`` they fit the data-dependent parameters
        (:func:`calibrate_swapped`); with either init the report then holds the gap to the
        replaced layer.
    :param options: the unit's options; its dropouts default to the host's (attention
        probabilities; BERT's output dropout).
    :returns: one record per swapped layer: ``path`` (of the unit), ``host``, ``kind``,
        ``init``, ``copied`` / ``fitted`` / ``not_carried`` (with ``init="pretrained"``), and with
        a calibration batch ``gap_mean`` and ``gap_sample``, the relative error of the attention
        output at the posterior mean and for one draw; and ``weights``, the replaced layer's
        :class:`~gpattn_ppl.attention.SoftmaxWeights` (``None`` when it was not read).
    :raises ValueError: an unknown kind or init, a layer index out of range, a host that is not
        supported or not softmax attention where ``init="pretrained"`` reads it.
    """
    if init not in ("pretrained", "random"):
        raise ValueError(f"swap_attention: init must be 'pretrained' or 'random', got {init!r}")
    found = find_attention_layers(model)
    L = len(found)
    chosen = []
    for i in layers:
        if isinstance(i, bool) or not isinstance(i, int) or not -L <= i < L:
            raise ValueError(f"swap_attention: layer index {i!r} out of range for {L} attention "
                             f"layers (allowed {-L}..{L - 1})")
        if found[i % L] not in chosen:
            chosen.append(found[i % L])
    param = next(model.parameters())
    records, pretrained = [], {}
    for layer in chosen:
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
        record = {"path": unit_path, "host": layer.host, "kind": kind, "init": init}
        if init == "pretrained":
            rep = init_from_softmax(unit, weights)
            record.update({k: rep[k] for k in ("copied", "fitted", "not_carried")})
        unit.train(layer.module.training)
        setattr(layer.parent, layer.attr, HOSTS[layer.host]["adapter"](unit, layer.module, layer))
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
