"""The swapped model types: ``gpattn_<host>`` configs and models, generated from the host's
classes and registered with the ``transformers`` Auto classes.

:func:`~gpattn_ppl.models.swap_attention` on a ``transformers`` ``PreTrainedModel`` turns the
model into an instance of a subclass of its class (``BertForSequenceClassification`` ->
``GpattnBertForSequenceClassification``) and its config into an instance of a subclass of its
config class whose ``model_type`` is ``"gpattn_" + <the host's>`` (``GpattnBertConfig``,
``"gpattn_bert"``). Nothing else changes (the subclasses add no attribute and override no
computation), but ``save_pretrained`` now writes ``"model_type": "gpattn_bert"`` and
``"architectures": ["GpattnBertForSequenceClassification"]`` to ``config.json``, so that:

* plain ``transformers`` (gpattn_ppl not imported) refuses the folder: ``AutoConfig``,
  ``AutoModel*``, ``pipeline(...)`` raise ``ValueError: The checkpoint you are trying to load
  has model type `gpattn_bert` but Transformers does not recognize this architecture ...``
  instead of loading the host with random weights where the units were (a ``model_type`` key
  is there, so no fallback on the folder's name applies; there is no ``auto_map`` and no code
  in the folder);
* with gpattn_ppl imported, the Auto classes load it: :func:`register_swapped_types` (called
  when :mod:`gpattn_ppl.hf` is imported, for :data:`DEFAULT_HOSTS`; and by every swap, for the
  swapped model's host) registers the generated config with ``AutoConfig``, a generated model
  class for every Auto class of :data:`AUTO_MODELS` that has one for the host, and the host's
  tokenizer, image processor, feature extractor and processor for the new config. Loading
  runs the generated class's ``__init__``: the host's, then the record's swaps replayed with
  ``init="random"``; ``transformers`` then loads the weights, and the load is refused
  (:class:`~gpattn_ppl.models.swap_record.SwapRecordError`) when a weight of the base model
  (the encoder, the units included) is missing, unexpected or of another shape, where
  ``transformers`` would initialise it at random and report it. Only a task head the folder
  does not hold (``AutoModelForTokenClassification`` on a sequence classifier's folder) is
  initialised, as ``transformers`` does for a new task.

A config holding :data:`~gpattn_ppl.models.swap_record.HEAD_KEY` (``"gpattn_head":
{"pooling": "mean" | "cls", "dropout": p}``, what ``gpattn-ppl export`` writes for an ``arch: hf``
run) gives the generated ``...ForSequenceClassification`` classes the run's head in place of the
host's (BERT's pooler on ``[CLS]``, RoBERTa's two-layer head, ...): the base model's last hidden
state pooled (``"mean"``: over the tokens of ``attention_mask``; ``"cls"``: the first token's),
then ``dropout`` (``nn.Dropout(p)``) and ``classifier`` (``nn.Linear(hidden, num_labels)``), the
host's other head modules removed; the loss is the cross-entropy. The state dict is the base
model's under its prefix (``bert.``) and ``classifier.weight`` / ``classifier.bias``, and loading
such a folder refuses any missing or unexpected weight (the head is the run's, never
initialised). The ``forward`` keeps the host's signature. Without the key, nothing changes.

The generated classes live in this module (``GpattnBertConfig`` is an attribute of it, created
on first use), so a swapped model pickles and unpickles by name.
"""

from __future__ import annotations

import contextlib
import importlib
import inspect
import sys
import warnings

import torch
from torch import nn

from ..data.hf_folder import HOST_TYPE_ATTR, SWAPPED_TYPE_PREFIX, swapped_host_type
from .swap_record import (
    HEAD_KEY,
    PREDICTIVE_KEY,
    SWAP_KEY,
    SwapRecordError,
    _base_relative,
    _same_paths,
    read_head,
    read_record,
)

__all__ = ["AUTO_MODELS", "DEFAULT_HOSTS", "is_swapped_class",
           "register_swapped_types", "swapped_config_class", "swapped_model_class"]

#: the host model types registered when :mod:`gpattn_ppl.hf` is imported: the encoder families
#: :func:`~gpattn_ppl.models.swap_attention` swaps into (MiniLM is ``bert``); a swap of another
#: host registers its type in the process that swaps
DEFAULT_HOSTS = ("albert", "bert", "camembert", "deberta", "deberta-v2", "distilbert",
                 "electra", "modernbert", "mpnet", "roberta", "vit", "xlm-roberta")
#: the ``transformers`` Auto classes a swapped type is registered with, where the host has a
#: model for them (encoder tasks: causal and sequence-to-sequence heads are left out, the units
#: attend bidirectionally)
AUTO_MODELS = ("AutoModel", "AutoModelForSequenceClassification",
               "AutoModelForTokenClassification", "AutoModelForMaskedLM",
               "AutoModelForQuestionAnswering", "AutoModelForMultipleChoice",
               "AutoModelForPreTraining", "AutoModelForNextSentencePrediction",
               "AutoModelForImageClassification", "AutoModelForMaskedImageModeling")
#: the mappings of the host's tokenizer and processors, registered for the swapped config too
_PROCESSOR_MAPPINGS = (("tokenization_auto", "TOKENIZER_MAPPING"),
                       ("image_processing_auto", "IMAGE_PROCESSOR_MAPPING"),
                       ("feature_extraction_auto", "FEATURE_EXTRACTOR_MAPPING"),
                       ("processing_auto", "PROCESSOR_MAPPING"))
_NAME_PREFIX = "Gpattn"
_GENERATED: dict[type, type] = {}           # host class -> its generated subclass


def is_swapped_class(cls) -> bool:
    """Whether ``cls`` is a generated swapped config or model class."""
    return isinstance(cls, type) and "_gpattn_host" in cls.__dict__


def _generate(host: type, bases: tuple, namespace: dict) -> type:
    """The subclass of ``host`` named ``Gpattn<host name>``, kept as an attribute of this module
    (pickle finds it there); a second host class of the same name (a subclass of yours named
    like a transformers class) gets a numbered name."""
    module = sys.modules[__name__]
    name = base = _NAME_PREFIX + host.__name__
    n = 1
    while name in module.__dict__:
        n += 1
        name = f"{base}_{n}"
    cls = type(name, bases, {"__module__": __name__, "__qualname__": name, "_gpattn_host": host,
                             **namespace})
    setattr(module, name, cls)
    _GENERATED[host] = cls
    return cls


def swapped_config_class(host: type) -> type:
    """The swapped config class of the config class ``host`` (``BertConfig`` ->
    ``GpattnBertConfig``, ``model_type`` ``"gpattn_bert"``); ``host`` itself when it is one.

    :raises ValueError: a config class without a ``model_type``.
    """
    if is_swapped_class(host):
        return host
    if host in _GENERATED:
        return _GENERATED[host]
    model_type = getattr(host, "model_type", None)
    if not isinstance(model_type, str) or not model_type:
        raise ValueError(f"swap: the config class {host.__name__} has no model_type; a swapped "
                         "model's type is gpattn_<host model type>")
    return _generate(host, (host,), {
        "__doc__": f"The config of a {model_type} model with gpattn_ppl attention units "
                   f"swapped in (model_type {SWAPPED_TYPE_PREFIX + model_type!r}).",
        "model_type": SWAPPED_TYPE_PREFIX + model_type, HOST_TYPE_ATTR: model_type})


def _where(config, cls: type) -> str:
    name = getattr(config, "name_or_path", None) or getattr(config, "_name_or_path", None)
    return f"{cls.__name__}({str(name)!r})" if name else cls.__name__


def _refuse_partial_load(model: nn.Module, info: dict, where: str,
                         head_mismatch_ok: bool = False) -> None:
    """Raise unless every weight of ``model``'s base model (the encoder, its units included)
    was loaded with its shape, and the folder held no weight under a swapped layer that the
    model does not have (the ``output_loading_info`` of ``from_pretrained``). A task head, or
    a host weight the task model does not use (BERT's pooler under a masked-LM head), follows
    ``transformers``: a missing one is initialised, one of another shape only with
    ``ignore_mismatched_sizes=True`` (``head_mismatch_ok``). A model with the run's head
    (:data:`~gpattn_ppl.models.swap_record.HEAD_KEY`) refuses every missing or unexpected
    weight: the folder holds the whole run."""
    from .swap import attention_units

    def keys(name):
        return sorted(k[0] if isinstance(k, (tuple, list)) else k for k in info.get(name) or ())

    base = getattr(model, "base_model", model)
    children = set(dict(base.named_children()))

    def in_base(key):
        return _base_relative(model, key).split(".", 1)[0] in children

    layers = {_base_relative(model, p).rpartition(".")[0] for p in attention_units(model)}

    def in_swapped_layer(key):
        key = _base_relative(model, key)
        return any(key.startswith(layer + ".") for layer in layers)

    whole = getattr(model, "_gpattn_pooling", None) is not None
    bad = {"missing": [k for k in keys("missing_keys") if whole or in_base(k)],
           "unexpected": [k for k in keys("unexpected_keys") if whole or in_swapped_layer(k)],
           "shape mismatch": [k for k in keys("mismatched_keys")
                              if in_base(k) or not head_mismatch_ok]}
    parts = [f"{name} {vals[:5]}{' ...' if len(vals) > 5 else ''}"
             for name, vals in bad.items() if vals]
    parts += [str(m)[:300] for m in (info.get("error_msgs") or [])[:3] if m]
    if parts:
        hint = (" (ignore_mismatched_sizes=True lets a task head differ)"
                if bad["shape mismatch"] and not head_mismatch_ok else "")
        raise SwapRecordError(f"{where}: the saved weights do not match the swapped model; not "
                              "loaded (transformers would initialise these at random): "
                              + "; ".join(parts) + hint)


def _replay(model: nn.Module, record: list[dict], predictive, where: str) -> None:
    """Swap the record's units into ``model`` again, with ``init="random"``, in record order."""
    from .swap import swap_attention

    setattr(model.config, SWAP_KEY, [])     # each replayed swap appends its entry again
    param = next(model.parameters(), None)
    # transformers builds the model on the meta device; the units' constructors compute
    # (``.item()``): build them on the CPU, the swap moves them to the model's device
    here = (torch.device("cpu") if param is not None and param.is_meta
            else contextlib.nullcontext())
    with here:
        for entry in record:
            try:
                got = swap_attention(model, entry["kind"], layers=list(entry["layers"]),
                                     init="random", predictive=predictive or "mc",
                                     **entry["options"])
            except SwapRecordError:
                raise
            except (ValueError, TypeError) as err:
                raise SwapRecordError(f"{where}: cannot replay the swap {entry}: {err}"
                                      ) from err
            if not _same_paths(model, [r["path"] for r in got], entry["paths"]):
                raise SwapRecordError(f"{where}: replaying {entry} put units at "
                                      f"{[r['path'] for r in got]}, not at the recorded paths")


class _SwappedModel:
    """What the generated model classes add to their host class: building the recorded units
    and refusing a partial load."""

    _gpattn_host: type

    def __init__(self, config, *args, **kwargs) -> None:
        where = _where(config, type(self))
        if not is_swapped_class(type(config)):
            config.__class__ = swapped_config_class(type(config))
        record = read_record(config, where)
        predictive = getattr(config, PREDICTIVE_KEY, None)
        super().__init__(config, *args, **kwargs)
        _convert_parts(self)
        _replay(self, record, predictive, where)

    @classmethod
    def from_pretrained(cls, *args, **kwargs):
        """The host's ``from_pretrained``, refusing a folder that does not hold every weight of
        the encoder and its units with its shape (see the module docstring)."""
        want_info = kwargs.pop("output_loading_info", False)
        head_mismatch_ok = bool(kwargs.pop("ignore_mismatched_sizes", False))
        # transformers reports the weights of another shape (instead of stopping at the first):
        # the check below refuses them, but in a head the caller allowed to differ
        model, info = super().from_pretrained(*args, output_loading_info=True,
                                              ignore_mismatched_sizes=True, **kwargs)
        name = args[0] if args else kwargs.get("pretrained_model_name_or_path")
        _refuse_partial_load(model, info, f"{cls.__name__}.from_pretrained({str(name)!r})",
                             head_mismatch_ok)
        return (model, info) if want_info else model


class _RunHead:
    """What the generated ``...ForSequenceClassification`` classes add: the head of an
    ``arch: hf`` run when the config holds :data:`~gpattn_ppl.models.swap_record.HEAD_KEY`
    (module docstring); their ``forward`` is :func:`_head_forward`'s."""

    def __init__(self, config, *args, **kwargs) -> None:
        super().__init__(config, *args, **kwargs)
        self._gpattn_pooling = None
        head = read_head(config, _where(config, type(self)))
        if head is None:
            return
        problem = getattr(config, "problem_type", None)
        if problem not in (None, "single_label_classification"):
            raise SwapRecordError(f"{_where(config, type(self))}: the run's head "
                                  f"({HEAD_KEY!r}) is a single-label "
                                  f"classifier; the config says problem_type {problem!r}")
        base = self.base_model
        for name, child in list(self.named_children()):
            if child is not base:           # the host's head: dropout, classifier, pooler, ...
                delattr(self, name)
        width = int(getattr(config, "hidden_size", None) or config.dim)
        self.dropout = nn.Dropout(head["dropout"])
        self.classifier = nn.Linear(width, int(config.num_labels))
        self._gpattn_pooling = head["pooling"]

    def _run_head_forward(self, arguments: dict):
        """The forward pass with the run's head; ``arguments``: the host ``forward``'s, bound
        by name."""
        from transformers.modeling_outputs import SequenceClassifierOutput

        labels = arguments.pop("labels", None)
        return_dict = arguments.pop("return_dict", None)
        inputs = {k: v for k, v in arguments.items() if v is not None}
        out = self.base_model(**inputs)
        h = out[0]                                                     # [B, N, C]
        if self._gpattn_pooling == "cls":
            pooled = h[:, 0]
        else:                   # as HFClassifier.features: the mean over the real tokens
            mask = inputs.get("attention_mask")
            mask = (torch.ones(h.shape[:2], dtype=torch.bool, device=h.device) if mask is None
                    else mask.bool())
            w = mask.unsqueeze(-1).to(h.dtype)
            pooled = (h * w).sum(1) / w.sum(1).clamp_min(1.0)
        logits = self.classifier(self.dropout(pooled))
        loss = None
        if labels is not None:
            loss = nn.functional.cross_entropy(logits.view(-1, logits.shape[-1]),
                                               labels.view(-1).to(logits.device))
        if return_dict is False:
            return (logits,) if loss is None else (loss, logits)
        return SequenceClassifierOutput(loss=loss, logits=logits,
                                        hidden_states=getattr(out, "hidden_states", None),
                                        attentions=getattr(out, "attentions", None))


def _head_forward(host: type):
    """The ``forward`` of the generated class of the sequence classifier ``host``: the host's,
    or with the run's head (:class:`_RunHead`) its own; the host's signature either way (what
    ``transformers``' ``Trainer`` and pipelines inspect)."""
    signature = inspect.signature(host.forward)
    var_kw = [n for n, q in signature.parameters.items() if q.kind is q.VAR_KEYWORD]

    def forward(self, *args, **kwargs):
        if getattr(self, "_gpattn_pooling", None) is None:
            return host.forward(self, *args, **kwargs)
        arguments = dict(signature.bind(self, *args, **kwargs).arguments)
        arguments.pop(next(iter(signature.parameters)))                    # self
        for name in var_kw:
            arguments.update(arguments.pop(name, {}))
        return self._run_head_forward(arguments)

    forward.__signature__ = signature
    forward.__doc__ = host.forward.__doc__
    return forward


def _sequence_classifier(host: type) -> bool:
    return host.__name__.endswith("ForSequenceClassification")


def swapped_model_class(host: type) -> type:
    """The swapped model class of the ``PreTrainedModel`` class ``host``
    (``BertForSequenceClassification`` -> ``GpattnBertForSequenceClassification``, whose
    ``config_class`` is the swapped config class); ``host`` itself when it is one."""
    if is_swapped_class(host):
        return host
    if host in _GENERATED:
        return _GENERATED[host]
    config_class = swapped_config_class(host.config_class)
    namespace = {"__doc__": f"{host.__name__} with gpattn_ppl attention units swapped in, as "
                            f"its config's {SWAP_KEY!r} record says (model_type "
                            f"{config_class.model_type!r}).",
                 "config_class": config_class}
    bases = (_SwappedModel, host)
    if _sequence_classifier(host):
        bases = (_SwappedModel, _RunHead, host)
        namespace["forward"] = _head_forward(host)
    return _generate(host, bases, namespace)


def __getattr__(name: str):
    """A generated class by name, generated on first use (unpickling in a new process)."""
    if name.startswith(_NAME_PREFIX) and name[len(_NAME_PREFIX):].isidentifier():
        import transformers

        try:
            host = getattr(transformers, name[len(_NAME_PREFIX):])
        except (AttributeError, ImportError, RuntimeError):
            host = None
        config_base = (getattr(transformers, "PreTrainedConfig", None)
                       or transformers.PretrainedConfig)        # its name before transformers 5
        if isinstance(host, type) and issubclass(host, config_base):
            return swapped_config_class(host)
        if isinstance(host, type) and issubclass(host, transformers.PreTrainedModel):
            return swapped_model_class(host)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def _convert_parts(model: nn.Module) -> None:
    """Make the ``PreTrainedModel`` parts of ``model`` that share its config (the base model of
    a ``...ForSequenceClassification``) instances of their swapped classes too: ``transformers``
    renames the weights of some host classes on saving and loading (ViT's to its old checkpoint
    names), by class name; the swapped classes keep the names of the state dict, so that a
    folder holds what ``model.state_dict()`` does."""
    from transformers import PreTrainedModel

    for part in model.modules():
        if (part is not model and isinstance(part, PreTrainedModel)
                and getattr(part, "config", None) is model.config
                and not is_swapped_class(type(part))):
            part.__class__ = swapped_model_class(type(part))


def _convert(model: nn.Module) -> None:
    """Make a swapped ``PreTrainedModel`` (and its config) instances of the swapped classes, and
    register its host's type (:func:`register_swapped_types`). A config class without a
    ``model_type`` cannot be converted: the model is left as it is, with a warning (its folder
    would load in plain ``transformers`` without the units)."""
    config = model.config
    try:
        config_class = swapped_config_class(type(config))
    except ValueError as err:
        warnings.warn(f"{err}: {type(model).__name__} keeps its class, and a folder saved from "
                      "it loads in plain transformers without the units", UserWarning,
                      stacklevel=3)
        return
    config.__class__ = config_class
    model.__class__ = swapped_model_class(type(model))
    _convert_parts(model)
    register_swapped_types(config_class._gpattn_host.model_type, strict=False)


def _register_models(auto_class, host_config: type, config_class: type) -> None:
    mapping = getattr(auto_class, "_model_mapping", None)
    if mapping is None or host_config not in mapping or config_class in mapping:
        return
    try:
        value = mapping[host_config]
    except (KeyError, ImportError, AttributeError, RuntimeError):
        return
    if isinstance(value, (tuple, list)):
        auto_class.register(config_class, tuple(swapped_model_class(v) for v in value))
    else:
        auto_class.register(config_class, swapped_model_class(value))


def _register_processors(host_config: type, config_class: type) -> None:
    from transformers.utils import logging

    verbosity = logging.get_verbosity()
    logging.set_verbosity_error()   # resolving a processor may log which backend it falls back to
    try:
        _register_processor_mappings(host_config, config_class)
    finally:
        logging.set_verbosity(verbosity)


def _register_processor_mappings(host_config: type, config_class: type) -> None:
    for module, name in _PROCESSOR_MAPPINGS:
        try:
            mapping = getattr(importlib.import_module(f"transformers.models.auto.{module}"),
                              name)
            if host_config not in mapping or config_class in mapping:
                continue
            value = mapping[host_config]
        except Exception:  # noqa: BLE001 -- a mapping this transformers lacks, a backend missing
            continue
        mapping.register(config_class, value, exist_ok=True)


def register_swapped_types(*hosts: str, strict: bool = True) -> list[str]:
    """Register the swapped model type of each host model type (``"bert"``, or its swapped
    type ``"gpattn_bert"``; default :data:`DEFAULT_HOSTS`) with ``AutoConfig``, the Auto model
    classes of :data:`AUTO_MODELS` the host has, and the host's tokenizer and processors.
    Idempotent; returns the swapped model types registered (``["gpattn_bert", ...]``).

    :param strict: raise for a host type ``transformers`` does not know (else skip it; a default
        host the installed ``transformers`` lacks is always skipped).
    :raises ValueError: with ``strict``, a host type ``transformers`` does not know.
    """
    import transformers
    from transformers.models.auto.configuration_auto import CONFIG_MAPPING

    done = []
    for host in hosts or DEFAULT_HOSTS:
        host = swapped_host_type(host) or host
        if host not in CONFIG_MAPPING:
            if hosts and strict:
                raise ValueError(f"register_swapped_types: transformers knows no model type "
                                 f"{host!r}")
            continue
        host_config = CONFIG_MAPPING[host]
        config_class = swapped_config_class(host_config)
        if config_class.model_type not in CONFIG_MAPPING:
            transformers.AutoConfig.register(config_class.model_type, config_class)
        elif CONFIG_MAPPING[config_class.model_type] is not config_class:
            continue      # registered from another config class of the host: keep the first
        for name in AUTO_MODELS:
            auto_class = getattr(transformers, name, None)
            if auto_class is not None:
                _register_models(auto_class, host_config, config_class)
        _register_processors(host_config, config_class)
        done.append(config_class.model_type)
    return done
