"""gpattn_ppl: uncertainty-aware Transformer attention from GP and stochastic units.

``gpattn_ppl.load_run(run_dir)`` restores a trained run for prediction
(:func:`gpattn_ppl.run.predictor.load_run`) and ``gpattn_ppl.swap(model)`` swaps attention
units into a model (:func:`gpattn_ppl.models.swap_attention`, the library's one swap, also
``gpattn_ppl.hf.swap``); they are imported on first use, so ``import gpattn_ppl`` stays cheap. Every error the library raises on purpose derives from
:class:`~gpattn_ppl.errors.GpattnError`.
"""

from ._version import __version__
from .errors import DataError, GpattnError

__all__ = ["DataError", "GpattnError", "__version__", "load_run", "swap"]


def __getattr__(name: str):
    if name == "load_run":
        from .run.predictor import load_run

        return load_run
    if name == "swap":
        from .models.swap import swap_attention

        return swap_attention
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
