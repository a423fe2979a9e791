"""Save and load a Hugging Face model with swapped attention units, the Hugging Face way.

:func:`swap` is :func:`~gpattn_ppl.models.swap_attention` (the same function, under the name
the Hugging Face integration has always had). On a ``transformers`` ``PreTrainedModel`` it
records the swap in the model's config (:mod:`~gpattn_ppl.models.swap_record`, under
:data:`SWAP_KEY`) and makes the model and its config instances of their swapped classes
(:mod:`~gpattn_ppl.models.swapped_types`: ``GpattnBertForSequenceClassification``, model type
``gpattn_bert``). Because all of it lives in the config and the class, every
``model.save_pretrained(folder)`` (yours, the ``Trainer``'s checkpoints, ``push_to_hub``)
writes a **protected folder**: ``config.json`` with ``"model_type": "gpattn_bert"``, the
record, and no ``auto_map``, next to the weights in ``model.safetensors``. Such a folder loads
correctly or not at all:

* plain ``transformers`` (gpattn_ppl not imported) refuses it: ``AutoModel*``,
  ``AutoConfig`` and ``pipeline`` raise ``ValueError: The checkpoint you are trying to load has
  model type `gpattn_bert` but Transformers does not recognize this architecture. ...``
  (before, they loaded the host with random weights where the units were, and predicted);
* with :mod:`gpattn_ppl.hf` imported (importing it registers the swapped types), the Auto
  classes and ``transformers.pipeline("text-classification", model=folder)`` load it: the
  swapped class builds the host, replays the record's swaps with ``init="random"``, and
  ``transformers`` loads the weights, a missing, unexpected or misshapen weight of the
  encoder or of a unit being refused, not initialised;
* :func:`from_pretrained` reads it too, from a folder or from a repo id in the local Hugging
  Face cache (never downloading), with the checks below.

:func:`from_pretrained` builds the swapped model from its config with random weights and loads
every weight from the safetensors files, strictly (no pickle is read; ``torch.load`` is never
called). The folder is checked before ``transformers`` reads it
(:func:`~gpattn_ppl.data.hf_folder.check_model_folder`): no code of it runs
(``trust_remote_code=False``, an ``auto_map`` is refused), ``architectures`` must name a
``PreTrainedModel`` class of the host's model type (or its swapped class), shard names are
plain file names in the folder, and a tensor of another dtype kind than the model's (an
integer for a float weight) is refused; a float of another precision is cast. A folder of the
old format (the host's model type with a record: what gpattn_ppl wrote before the swapped
types) loads too, with a warning to re-save it.

>>> import transformers
>>> from gpattn_ppl.hf import from_pretrained, swap
>>> cfg = transformers.BertConfig(vocab_size=50, hidden_size=16, num_hidden_layers=2,
...                               num_attention_heads=4, intermediate_size=32)
>>> model = transformers.BertForSequenceClassification(cfg)
>>> [r["path"] for r in swap(model, "kep_svgp", layers=[-1], init="random", rank=3)]
['bert.encoder.layer.1.attention.unit']
>>> model.config.model_type, model.config.gpattn_swap[0]["kind"]
('gpattn_bert', 'kep_svgp')
"""

from __future__ import annotations

import os
import warnings
from pathlib import Path

import torch
from torch import nn

from ..data.hf_folder import (
    HFFolderError,
    check_model_folder,
    dtype_kind,
    read_config_json,
    swapped_host_type,
    transformers_failed,
    weight_files,
)
from ..models.swap import swap_attention
from ..models.swap_record import (  # noqa: F401 -- re-exported (gpattn_ppl.hf, its trainer)
    PREDICTIVE_KEY,
    SWAP_KEY,
    SwapRecordError,
    check_swap_record,
    read_record,
)
from ..models.swapped_types import (
    is_swapped_class,
    register_swapped_types,
    swapped_config_class,
    swapped_model_class,
)

# documented here: from_pretrained, and swap under its Hugging Face name; SWAP_KEY,
# PREDICTIVE_KEY, SwapRecordError and check_swap_record are gpattn_ppl.models.swap_record's
__all__ = ["from_pretrained", "swap"]

_HINT = 'the Hugging Face integration needs the text extra: pip install "gpattn-ppl[text]"'

# the one swap function (gpattn_ppl.models.swap_attention), under its Hugging Face name
swap = swap_attention


def _transformers():
    try:
        import transformers
    except ImportError as err:
        raise ImportError(f"{_HINT} (package 'transformers' is missing)") from err
    return transformers


def _state_dict_files(folder: Path) -> list[Path]:
    """The safetensors files of ``folder``, confined to it
    (:func:`~gpattn_ppl.data.hf_folder.weight_files`: shard names are plain file names)."""
    return weight_files(folder)


def _model_class(config, where: str):
    """The swapped model class of the ``transformers`` model class ``config.architectures[0]``
    names (``BertForSequenceClassification`` or ``GpattnBertForSequenceClassification``): a
    ``PreTrainedModel`` subclass whose config class is that of the config's host (never another
    callable)."""
    transformers = _transformers()
    names = getattr(config, "architectures", None) or []
    name = names[0] if isinstance(names, list) and names else None
    if not isinstance(name, str) or not name.isidentifier():
        raise SwapRecordError(f"{where}: the config names no transformers model class "
                              f"(architectures={str(names)[:120]}); pass model_class")
    host_name = name.removeprefix("Gpattn") or name
    try:
        cls = getattr(transformers, host_name, None)
    except (ImportError, AttributeError, RuntimeError):
        cls = None
    host_type = type(config)._gpattn_host.model_type
    config_class = getattr(cls, "config_class", None)
    if not (isinstance(cls, type) and issubclass(cls, transformers.PreTrainedModel)
            and isinstance(config_class, type) and isinstance(config, config_class)
            and getattr(config_class, "model_type", None) == host_type):
        raise SwapRecordError(f"{where}: architectures[0] {name!r} is not a transformers model "
                              f"class for model_type {host_type!r} (a PreTrainedModel subclass "
                              "of that config); not built. Pass model_class")
    return swapped_model_class(cls)


_CACHE_HINT = ("nothing is downloaded: fetch it first (huggingface-cli download REPO_ID "
               "--revision REV), or give the model's folder")


def _resolve(source: str | Path, revision: str | None, cache_dir) -> Path:
    """The folder of ``source``: the local folder it names, or the snapshot of the Hugging Face
    repo id it names in the local cache (``revision``: a branch, tag or commit; never
    downloaded)."""
    path = Path(source)
    if os.path.lexists(path):
        if revision is not None:
            raise ValueError(f"from_pretrained: revision={revision!r} selects a snapshot of a "
                             f"repo id in the Hugging Face cache; {str(source)!r} is a local "
                             "path")
        return path
    from huggingface_hub import constants, snapshot_download
    from huggingface_hub.errors import HFValidationError
    from huggingface_hub.utils import validate_repo_id

    name = str(source)
    try:
        validate_repo_id(name)
    except HFValidationError:
        raise FileNotFoundError(f"{name!r}: no such folder (nor a Hugging Face repo id)"
                                ) from None
    cache = cache_dir if cache_dir is not None else constants.HF_HUB_CACHE
    try:
        return Path(snapshot_download(name, revision=revision, cache_dir=cache_dir,
                                      local_files_only=True))
    except (OSError, ValueError) as err:   # LocalEntryNotFoundError, an incomplete snapshot
        first = (str(err).strip() or type(err).__name__).splitlines()[0][:200]
        raise FileNotFoundError(
            f"{name!r}: no such folder, and the repo (revision {revision or 'main'!r}) is not "
            f"in the local Hugging Face cache {str(cache)!r} ({first}); {_CACHE_HINT}"
        ) from None


def from_pretrained(folder: str | Path, model_class=None, *, revision: str | None = None,
                    cache_dir: str | Path | None = None,
                    device: str | torch.device = "cpu"):
    """The swapped model saved in ``folder`` by ``save_pretrained``, in evaluation mode.

    Builds the swapped class of ``model_class`` (default: the class named by the config's
    ``architectures``, from ``transformers``) from ``config.json`` with random weights (its
    constructor replays the record's swaps with ``init="random"``) and loads the safetensors
    weights with ``strict=True``: the loaded model computes exactly what the saved one did. The
    caller's random state is left as it was.

    A folder of the old format (``model_type`` the host's, with a :data:`SWAP_KEY` record: what
    gpattn_ppl saved before the swapped model types) loads as well, with a warning: plain
    ``transformers`` loads such a folder without the units, so re-save it
    (``model.save_pretrained(folder)``) to get the protected format.

    :param folder: a folder holding ``config.json`` (with :data:`SWAP_KEY`) and
        ``model.safetensors`` (or a sharded ``model.safetensors.index.json``); or a Hugging
        Face repo id (``"org/name"``) whose snapshot is in the local Hugging Face cache
        (``HF_HUB_CACHE``, or ``cache_dir``): nothing is downloaded.
    :param model_class: a ``PreTrainedModel`` class (or its swapped class), when the config
        names none or another.
    :param revision: with a repo id, the branch, tag or commit hash of the snapshot (default
        ``"main"``).
    :param cache_dir: with a repo id, the Hugging Face cache to look in.
    :param device: where the weights are loaded.
    :raises FileNotFoundError: no folder, ``config.json`` or safetensors weights; a repo id
        whose revision is not in the local cache.
    :raises ~gpattn_ppl.data.hf_folder.HFFolderError: a folder that asks to run its own code
        (``auto_map``) or names a model type ``transformers`` does not ship (nor a swapped one
        of such a type), a shard name that is not a plain file name in the folder, a file
        linking out of it, a malformed index or safetensors header, pickled weights only
        (:func:`~gpattn_ppl.data.hf_folder.check_model_folder`).
    :raises SwapRecordError: no or a malformed swap record, an unknown attention kind, a swap
        that does not give the recorded paths, ``architectures`` naming anything but a
        ``PreTrainedModel`` class of the host's model type, or weights that do not match the
        rebuilt model (missing, unexpected, differently shaped tensors, or tensors of another
        dtype kind: an integer or bool tensor for a float one, or the other way round; a float
        of another precision is cast to the model's), named.
    :warns UserWarning: a folder of the old format.
    """
    transformers = _transformers()
    from safetensors import SafetensorError
    from safetensors.torch import load_file

    source = folder
    folder = _resolve(source, revision, cache_dir)
    if not os.path.lexists(folder / "config.json"):
        raise FileNotFoundError(f"{folder}: no config.json (not a saved Hugging Face model)")
    where = f"from_pretrained({str(source)!r})"
    host = swapped_host_type(read_config_json(folder).get("model_type"))
    if host is not None:               # a swapped type of any host transformers knows
        register_swapped_types(host, strict=False)
    check_model_folder(folder, weights=True)  # no code of the folder runs; shards confined
    try:
        config = transformers.AutoConfig.from_pretrained(str(folder), local_files_only=True,
                                                         trust_remote_code=False)
    except Exception as err:  # noqa: BLE001 -- a config value of the wrong type or range
        raise transformers_failed(folder, "read its config.json", err) from None
    read_record(config, where)
    if not is_swapped_class(type(config)):
        warnings.warn(f"{where}: a folder of the old format (model_type {config.model_type!r} "
                      f"with a {SWAP_KEY!r} record), which plain transformers loads without "
                      "the units (random weights in their place); loaded, but re-save it "
                      "(model.save_pretrained(folder)) to write the protected format "
                      f"(model_type 'gpattn_{config.model_type}')", UserWarning, stacklevel=2)
        config.__class__ = swapped_config_class(type(config))
    if model_class is None:
        model_class = _model_class(config, where)
    elif isinstance(model_class, type) and issubclass(model_class, transformers.PreTrainedModel):
        model_class = swapped_model_class(model_class)
    else:
        raise TypeError(f"{where}: model_class must be a transformers PreTrainedModel class, "
                        f"got {model_class!r}")
    files = _state_dict_files(folder)
    with torch.random.fork_rng(devices=[]):
        try:
            model = model_class(config)     # the host, then the record's swaps replayed
        except SwapRecordError:
            raise
        except Exception as err:  # noqa: BLE001 -- a config the class cannot be built from
            raise transformers_failed(folder, "build the model from its config.json", err
                                      ) from None
    state = {}
    for f in files:
        try:
            state.update(load_file(str(f), device=str(device)))
        except (SafetensorError, OSError) as err:  # the header was checked: a corrupt body
            first = (str(err).strip() or type(err).__name__).splitlines()[0]
            raise HFFolderError(f"{where}: {f.name} is not a readable safetensors file "
                                f"({first})") from None
    model.to(device)
    _load_strict(model, state, where)
    return model.eval()


def _load_strict(model: nn.Module, state: dict, where: str) -> None:
    own = model.state_dict()
    # a tied weight (one tensor under two names) is saved once: the loaded name fills the other
    saved_ptrs = {own[k].data_ptr() for k in set(own) & set(state)}
    missing = sorted(k for k in set(own) - set(state) if own[k].data_ptr() not in saved_ptrs)
    unexpected = sorted(set(state) - set(own))
    shapes = sorted(f"{k}: saved {tuple(state[k].shape)}, model {tuple(own[k].shape)}"
                    for k in set(own) & set(state) if state[k].shape != own[k].shape)
    # a float of another precision is cast (fp16 saved for fp32); another kind is not
    kinds = sorted(f"{k}: saved {state[k].dtype}, model {own[k].dtype}"
                   for k in set(own) & set(state)
                   if dtype_kind(state[k].dtype) != dtype_kind(own[k].dtype))
    if missing or unexpected or shapes or kinds:
        parts = [f"{name} {vals[:5]}{' ...' if len(vals) > 5 else ''}"
                 for name, vals in (("missing", missing), ("unexpected", unexpected),
                                    ("shape mismatch", shapes), ("dtype kind mismatch", kinds))
                 if vals]
        raise SwapRecordError(f"{where}: the saved weights do not match the rebuilt model: "
                              + "; ".join(parts))
    model.load_state_dict(state, strict=False)
