"""One run: config -> data -> model -> fit -> evaluate, into a run folder (the public names).

The run is three concepts, each in its own module; this module gathers their public names, so
``from gpattn_ppl.run.experiment import Trainer, evaluate_run`` keeps working:

* :mod:`~gpattn_ppl.run.assembly` -- config -> data bundle -> network -> Pyro program, and the
  manifest of a new run;
* :mod:`~gpattn_ppl.run.training` -- :class:`~gpattn_ppl.run.training.Trainer`: the training
  loop, checkpoints and exact resume;
* :mod:`~gpattn_ppl.run.results` -- :func:`~gpattn_ppl.run.results.evaluate_run` and the one
  writer of ``results.json`` / ``predictions.pt``.

A run folder is read through :func:`~gpattn_ppl.run.runfolder.open_run` only.
"""

from __future__ import annotations

from .assembly import (  # noqa: F401 - the names this module has always offered
    VALIDATION_METRICS,
    build_net,
    data_sizes,
    load_bundle,
    parameter_groups,
    selection_metric,
)
from .results import evaluate_run  # noqa: F401
from .training import Trainer, step0_terms  # noqa: F401

#: empty: the names are documented (and exported by :mod:`gpattn_ppl.run`) in their own modules
__all__: list[str] = []
