"""Hugging Face integration: train, save, load and query a swapped ``transformers`` model.

* :mod:`~gpattn_ppl.hf.hub` -- :func:`~gpattn_ppl.hf.hub.swap` (``swap_attention`` recorded in
  the model's config, so ``save_pretrained`` saves it) and
  :func:`~gpattn_ppl.hf.hub.from_pretrained` (rebuild, re-swap, load the safetensors weights);
* :mod:`~gpattn_ppl.hf.trainer` -- :class:`~gpattn_ppl.hf.trainer.SwappedTrainer`, a
  ``transformers.Trainer`` whose loss adds the units' objective terms (step-0 rule weights) and
  whose evaluation averages Monte-Carlo passes;
* :mod:`~gpattn_ppl.hf.sampling` -- :func:`~gpattn_ppl.hf.sampling.mc_logits` and the
  ``compute_metrics`` :func:`~gpattn_ppl.hf.sampling.uncertainty_metrics`;
* :mod:`~gpattn_ppl.hf.pipeline` -- :class:`~gpattn_ppl.hf.pipeline.UncertaintyPipeline`:
  probabilities, entropy and mutual information per input text.

Needs the ``text`` extra (``transformers``). The names below are imported on first use, so
``import gpattn_ppl.hf`` works without it and using one raises an ``ImportError`` naming the
extra.
"""

from __future__ import annotations

import importlib

#: submodule -> the names it exports; they are imported from it on first use
_EXPORTS: dict[str, tuple[str, ...]] = {
    "hub": ("SWAP_KEY", "SwapRecordError", "check_swap_record", "from_pretrained", "swap"),
    "pipeline": ("UncertaintyPipeline",),
    "sampling": ("EVAL_METRICS", "is_stochastic", "mc_logits", "prefix_targets",
                 "uncertainty_metrics"),
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
