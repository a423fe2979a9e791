"""Hugging Face integration: train, save, load and query a swapped ``transformers`` model.

* :mod:`~gpattn_ppl.hf.hub` -- :func:`~gpattn_ppl.hf.hub.swap` (the one swap,
  :func:`gpattn_ppl.models.swap_attention`: on a ``PreTrainedModel`` it records the swap in the
  config and gives the model its swapped type, ``gpattn_<host>``, so that ``save_pretrained``
  writes a folder that loads with the units or not at all) and
  :func:`~gpattn_ppl.hf.hub.from_pretrained` (rebuild, re-swap, load the safetensors weights;
  from a folder or a repo id in the local Hugging Face cache);
* :mod:`~gpattn_ppl.hf.auto` -- the swapped types registered with ``transformers``' Auto
  classes on import: ``AutoModelForSequenceClassification.from_pretrained(folder)`` and
  ``transformers.pipeline("text-classification", model=folder)`` load a swapped folder;
* :mod:`~gpattn_ppl.hf.trainer` -- :class:`~gpattn_ppl.hf.trainer.SwappedTrainer`, a
  ``transformers.Trainer`` whose loss adds the units' objective terms (step-0 rule weights) and
  whose evaluation averages Monte-Carlo passes;
* :mod:`~gpattn_ppl.hf.sampling` -- :func:`~gpattn_ppl.hf.sampling.mc_logits` and the
  ``compute_metrics`` :func:`~gpattn_ppl.hf.sampling.uncertainty_metrics`;
* :mod:`~gpattn_ppl.hf.pipeline` -- the ``transformers`` pipeline task
  ``"uncertainty-classification"`` (:class:`~gpattn_ppl.hf.pipeline.UncertaintyPipeline`):
  per input text the library's prediction record (``label``, ``score``, ``probs``,
  ``entropy``, ``mutual_info``; :mod:`gpattn_ppl.metrics.records`).

Needs the ``text`` extra (``transformers``). ``import gpattn_ppl.hf`` registers the swapped
model types (:mod:`~gpattn_ppl.hf.auto`) and the pipeline task with ``transformers`` (so ``transformers.pipeline("uncertainty-classification", ...)``
works; nothing is read from a folder to do so) when ``transformers`` is installed; the names
below are imported on first use, so ``import gpattn_ppl.hf`` works without it and using one
raises an ``ImportError`` naming the extra.
"""

from __future__ import annotations

import importlib
import importlib.util

#: submodule -> the names it exports; they are imported from it on first use
_EXPORTS: dict[str, tuple[str, ...]] = {
    "auto": ("REGISTERED", "register_swapped_types"),
    "hub": ("PREDICTIVE_KEY", "SWAP_KEY", "SwapRecordError", "check_swap_record",
            "from_pretrained", "swap"),
    "pipeline": ("TASK", "PipelineLoadError", "SwappedModelLoader", "UncertaintyPipeline"),
    "sampling": ("EVAL_METRICS", "check_single_label", "is_stochastic", "mc_logits",
                 "prefix_targets", "uncertainty_metrics"),
    "trainer": ("STEP0_RATIO", "SwappedTrainer", "objective_terms", "step0_weight"),
}
_HOME = {name: module for module, names in _EXPORTS.items() for name in names}

__all__ = sorted(_HOME)


def __getattr__(name: str):
    if name in _HOME:
        return getattr(importlib.import_module(f"{__name__}.{_HOME[name]}"), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted(list(globals()) + __all__)


if importlib.util.find_spec("transformers") is not None:
    # registers the swapped model types (gpattn_bert, ...) with transformers' Auto classes
    importlib.import_module(f"{__name__}.auto")
    # registers the "uncertainty-classification" pipeline task with transformers
    importlib.import_module(f"{__name__}.pipeline")
