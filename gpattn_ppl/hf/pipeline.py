r"""Per-input predictions with uncertainty from a swapped Hugging Face classifier, as a
``transformers`` pipeline.

Importing :mod:`gpattn_ppl.hf` registers the task :data:`TASK` (``"uncertainty-classification"``)
with ``transformers.pipelines.PIPELINE_REGISTRY``; no code is read from a model folder and no
``trust_remote_code`` is needed::

    import gpattn_ppl.hf            # registers the task
    import transformers

    pipe = transformers.pipeline("uncertainty-classification", model=model_or_folder,
                                 tokenizer=tokenizer, samples=8)
    pipe(["book a flight", "what is my balance"], batch_size=16, top_k=2)

``model`` is a swapped ``...ForSequenceClassification`` (any sequence classifier works; a
deterministic one is run once) or a folder saved from one by ``save_pretrained``, which is
loaded by :func:`gpattn_ppl.hf.from_pretrained` (safetensors only, checked, no code of the
folder run; a folder it refuses raises :class:`PipelineLoadError` naming the cause). The
pipeline class is :class:`UncertaintyPipeline`, which can also be built directly:
``UncertaintyPipeline(model, tokenizer, samples=8)``.

Per input it returns one record of the library's prediction schema
(:mod:`gpattn_ppl.metrics.records`): ``label``, ``score``, ``probs``, ``entropy``,
``mutual_info``, computed from ``S`` passes with probabilities :math:`p_{s,k}` and their mean
:math:`\bar p_k`:

.. math::

    \hat y = \arg\max_k \bar p_k,\quad \mathrm{score} = \max_k \bar p_k,\quad
    \mathcal H = -\sum_k \bar p_k\log\bar p_k,\quad
    \mathrm{MI} = \mathcal H - \frac1S\sum_s \mathcal H[p_s]

(natural logarithms; ``mutual_info`` is ``None`` for one pass: a deterministic model, the
posterior mean, or ``samples=1``). A string gives a list of one record, as the
``text-classification`` pipeline does; a list gives a list; a ``datasets.Dataset``
(``KeyDataset``) or a generator gives an iterator of records.

Parameters, at construction or per call (the call's win):

* ``samples`` -- ``S``, the stochastic passes averaged per input (default 8);
* ``predictive`` -- ``"mc"`` (``S`` passes) or ``"mean"`` (one pass at the units' posterior
  means, :class:`gpattn_ppl.settings.posterior_mean`; no mutual information). Default:
  ``model.config.gpattn_predictive`` (the predictive :func:`gpattn_ppl.hf.swap` recommends for
  the unit) or ``"mc"``;
* ``seed`` -- seeds the passes of every call (the global random state is left as it was;
  ``None``: draw from the global state). Default 0. The draws depend on how the inputs are
  batched: the same inputs, ``batch_size`` and seed give the same records;
* ``temperature`` -- at construction only: the probabilities are
  :math:`\mathrm{softmax}(\ell / \tau)`. Default: ``model.config.gpattn_temperature`` (the fitted
  temperature of a run that ``gpattn-ppl export`` wrote) or 1;
* ``top_k`` -- as ``text-classification``'s: ``probs`` then holds the ``top_k`` most probable
  classes, most probable first (``top_k=None``: all, most probable first). Without it, every
  class in index order;
* the standard pipeline arguments ``batch_size`` (default 32 here), ``num_workers``,
  ``device``; and tokenizer arguments (``truncation``, default ``True``; ``max_length``,
  ``padding``, ...), passed to the tokenizer as ``text-classification`` does. A dict
  ``{"text": ..., "text_pair": ...}`` is a sentence pair.

Multi-label (``problem_type="multi_label_classification"``) and regression heads are refused:
the schema's probabilities, entropy and mutual information are those of one softmax over the
classes.
"""

from __future__ import annotations

import contextlib
import os

import torch

from ..errors import GpattnError
from ..metrics.records import prediction_records
from ..metrics.temperature import check_temperature
from ..models.swap_record import read_temperature
from .hub import _transformers, check_swap_record
from .sampling import check_single_label, is_stochastic, mc_logits

__all__ = ["TASK", "PipelineLoadError", "SwappedModelLoader", "UncertaintyPipeline"]

transformers = _transformers()
from transformers.pipelines import PIPELINE_REGISTRY  # noqa: E402 -- after the extra's check

#: the task name under which :class:`UncertaintyPipeline` is registered with ``transformers``
TASK = "uncertainty-classification"

#: the predictives: ``S`` Monte-Carlo passes, or one pass at the units' posterior means (the
#: values of ``config.gpattn_predictive``)
_PREDICTIVES = ("mc", "mean")

_UNSET = object()


class PipelineLoadError(GpattnError):
    """``transformers.pipeline(TASK, model=FOLDER)`` could not load ``FOLDER`` with
    :func:`gpattn_ppl.hf.from_pretrained` (the message names the cause, which is chained).

    Deliberately not a ``ValueError`` / ``OSError``: ``transformers`` would catch those and fall
    back to the folder's plain ``architectures`` class, which drops the swapped units."""


class _Draws:
    """The random state of one call's passes: seeded at the call's first forward pass and
    carried from batch to batch (also across the steps of a lazy iterator); the global random
    state is restored around each pass."""

    def __init__(self, seed: int, device: torch.device) -> None:
        self.seed = int(seed)
        self.devices = [device] if device.type == "cuda" else []
        self.state = None

    @contextlib.contextmanager
    def active(self):
        with torch.random.fork_rng(devices=self.devices):
            if self.state is None:
                torch.manual_seed(self.seed)
            else:
                torch.set_rng_state(self.state[0])
                for d, s in zip(self.devices, self.state[1:]):
                    torch.cuda.set_rng_state(s, d)
            try:
                yield
            finally:
                self.state = [torch.get_rng_state(),
                              *(torch.cuda.get_rng_state(d) for d in self.devices)]


class _Untouched:
    """An iterator of records that leaves the global random state as it was at each step (the
    ``DataLoader`` draws a seed from it when it starts; a seeded call draws from its own
    :class:`_Draws`)."""

    def __init__(self, iterator, devices: list) -> None:
        self.iterator, self.devices, self._started = iterator, devices, None

    def __iter__(self):
        return self

    def __next__(self):
        with torch.random.fork_rng(devices=self.devices):
            if self._started is None:               # starts the DataLoader: it draws a seed
                self._started = iter(self.iterator)
            return next(self._started)

    def __len__(self) -> int:
        return len(self.iterator)


def _check_samples(samples) -> int:
    if isinstance(samples, bool) or not isinstance(samples, int) or samples < 1:
        raise ValueError(f"samples must be an int >= 1, got {samples!r}")
    return samples


def _check_predictive(predictive) -> str:
    if predictive not in _PREDICTIVES:
        raise ValueError(f"predictive must be one of {_PREDICTIVES}, got {predictive!r}")
    return predictive


def _check_seed(seed):
    if seed is not None and (isinstance(seed, bool) or not isinstance(seed, int)):
        raise ValueError(f"seed must be an int or None, got {seed!r}")
    return seed


class UncertaintyPipeline(transformers.Pipeline):
    """The ``transformers`` pipeline of task :data:`TASK` (module docstring):
    ``pipe(texts) -> [{"label", "score", "probs", "entropy", "mutual_info"}, ...]``.

    :param model: a sequence classifier (``...ForSequenceClassification``), e.g. from
        :func:`~gpattn_ppl.hf.from_pretrained`; it is put in evaluation mode (dropout off; the
        units still draw unless ``predictive="mean"``) and on ``device``.
    :param tokenizer: its tokenizer.
    :param samples: ``S``, the passes averaged for a stochastic model.
    :param predictive: ``"mc"`` or ``"mean"`` (default: ``model.config.gpattn_predictive``,
        else ``"mc"``).
    :param seed: seeds the passes of every call; ``None`` draws from the global state.
    :param temperature: the logits are divided by it (default:
        ``model.config.gpattn_temperature``, else 1).
    :param kwargs: the standard pipeline arguments (``batch_size`` -- default 32 --,
        ``device``, ``num_workers``, ``top_k``, tokenizer arguments such as ``max_length``).
    :raises ValueError: a multi-label or regression head, or a bad parameter.
    :raises ~gpattn_ppl.hf.SwapRecordError: the model's units do not match its swap record
        (e.g. a swapped folder loaded by a plain ``from_pretrained``, which drops the units).

    ``probs`` maps the config's ``id2label`` names to the mean probabilities; ``label`` is the
    name of the most probable class and ``score`` its probability.

    >>> pipe = UncertaintyPipeline(model, tokenizer, samples=8)      # doctest: +SKIP
    >>> pipe("The cat sat on the mat.")[0]["mutual_info"]             # doctest: +SKIP
    0.0012
    """

    _load_processor = False
    _load_image_processor = False
    _load_video_processor = False
    _load_feature_extractor = False
    _load_tokenizer = True

    def __init__(self, model, tokenizer=None, *, samples: int = 8, predictive: str | None = None,
                 seed: int | None = 0, temperature: float | None = None, **kwargs) -> None:
        check_single_label(model.config, "UncertaintyPipeline")
        if isinstance(model, transformers.PreTrainedModel):
            check_swap_record(model, where="UncertaintyPipeline")
        self.samples = _check_samples(samples)
        if predictive is None:
            predictive = getattr(model.config, "gpattn_predictive", None) or "mc"
        self.predictive = _check_predictive(predictive)
        self.seed = _check_seed(seed)
        self.temperature = (read_temperature(model.config, "UncertaintyPipeline")
                            if temperature is None
                            else check_temperature(temperature, "UncertaintyPipeline temperature"))
        kwargs.setdefault("batch_size", 32)
        super().__init__(model.eval(), tokenizer, **kwargs)
        id2label = getattr(model.config, "id2label", None) or {}
        K = model.config.num_labels
        self.labels = [str(id2label.get(k, id2label.get(str(k), f"LABEL_{k}"))) for k in range(K)]

    def __repr__(self) -> str:
        return (f"UncertaintyPipeline({type(self.model).__name__}, labels={self.labels}, "
                f"samples={self.samples}, predictive={self.predictive!r}, "
                f"temperature={self.temperature:g}, "
                f"stochastic={is_stochastic(self.model)}, device={self.device})")

    # -- the Pipeline protocol ------------------------------------------------------------------
    def _sanitize_parameters(self, samples=None, predictive=None, top_k=_UNSET, _draws=None,
                             _raw=None, **tokenizer_kwargs):
        forward, post = {}, {}
        if samples is not None:
            forward["samples"] = _check_samples(samples)
        if predictive is not None:
            forward["predictive"] = _check_predictive(predictive)
        if _draws is not None:
            forward["_draws"] = _draws
        if top_k is not _UNSET:
            if top_k is not None and (isinstance(top_k, bool) or not isinstance(top_k, int)
                                      or top_k < 1):
                raise ValueError(f"top_k must be a positive int or None, got {top_k!r}")
            post["top_k"], post["ranked"] = top_k, True
        if _raw is not None:
            post["_raw"] = _raw
        return tokenizer_kwargs, forward, post

    def __call__(self, inputs, *args, seed=_UNSET, **kwargs):
        """Records for ``inputs`` (a string, a list of strings or text-pair dicts, a dataset
        or a generator); ``kwargs`` as at construction (module docstring)."""
        if isinstance(inputs, (list, tuple)):
            if not inputs or not all(isinstance(t, (str, dict)) for t in inputs):
                raise ValueError("UncertaintyPipeline: expected a string or a non-empty list of "
                                 "strings (or {'text', 'text_pair'} dicts)")
            inputs = list(inputs)
        elif not isinstance(inputs, (str, dict)) and not hasattr(inputs, "__iter__"):
            raise ValueError("UncertaintyPipeline: expected a string or a non-empty list of "
                             f"strings, got {type(inputs).__name__}")
        seed = self.seed if seed is _UNSET else _check_seed(seed)
        if seed is not None:
            kwargs["_draws"] = _Draws(seed, self.device)
        out = super().__call__(inputs, *args, **kwargs)
        return [out] if isinstance(inputs, (str, dict)) else out

    def get_iterator(self, inputs, num_workers, batch_size, preprocess_params, forward_params,
                     postprocess_params):
        it = super().get_iterator(inputs, num_workers, batch_size, preprocess_params,
                                  forward_params, postprocess_params)
        draws = forward_params.get("_draws")
        return it if draws is None else _Untouched(it, draws.devices)

    def preprocess(self, inputs, truncation=True, **tokenizer_kwargs):
        if isinstance(inputs, dict):
            return self.tokenizer(**inputs, truncation=truncation, return_tensors="pt",
                                  **tokenizer_kwargs)
        if not isinstance(inputs, str):
            raise ValueError("UncertaintyPipeline: each input must be a string or a "
                             f"{{'text', 'text_pair'}} dict, got {type(inputs).__name__}")
        return self.tokenizer(inputs, truncation=truncation, return_tensors="pt",
                              **tokenizer_kwargs)

    def _forward(self, model_inputs, samples=None, predictive=None, _draws=None):
        S = self.samples if samples is None else samples
        mean = (predictive or self.predictive) == "mean"
        with _draws.active() if _draws is not None else contextlib.nullcontext():
            logits = mc_logits(self.model, dict(model_inputs), S, mean=mean)   # [B, S, K]
        return {"probs": torch.softmax(logits.double() / self.temperature, -1)}

    def postprocess(self, model_outputs, top_k=None, ranked=False, _raw=False):
        p = model_outputs["probs"][0]                                          # [S, K]
        if _raw:
            return p
        return prediction_records(p.unsqueeze(1), self.labels, top_k=top_k, ranked=ranked)[0]

    # -- extras ---------------------------------------------------------------------------------
    def probabilities(self, inputs, **kwargs) -> torch.Tensor:
        """Per-pass class probabilities ``[S, n, K]`` (float64, CPU) of ``inputs`` (a string or
        a list), with the passes a call with the same arguments averages."""
        rows = self(inputs, _raw=True, **kwargs)
        return torch.stack(list(rows), 1)

    def save_pretrained(self, save_directory, **kwargs) -> None:
        """Save the model (its swap record in ``config.json``) and the tokenizer to
        ``save_directory``; ``transformers.pipeline(TASK, model=save_directory)`` reloads them.

        Unlike ``Pipeline.save_pretrained`` for a registered pipeline, no pipeline code is
        copied into the folder and no ``custom_pipelines`` entry is written: the task is
        registered by ``import gpattn_ppl.hf``, and such an entry would make ``transformers``
        ask for ``trust_remote_code``."""
        os.makedirs(save_directory, exist_ok=True)
        if hasattr(self.model.config, "custom_pipelines"):
            del self.model.config.custom_pipelines
        self.model.save_pretrained(save_directory, **kwargs)
        if self.tokenizer is not None:
            self.tokenizer.save_pretrained(save_directory, **kwargs)


class SwappedModelLoader:
    """The model class :data:`TASK` is registered with: ``transformers.pipeline(TASK,
    model=FOLDER)`` loads ``FOLDER`` through :meth:`from_pretrained`."""

    @classmethod
    def from_pretrained(cls, folder, *args, **kwargs):
        """:func:`gpattn_ppl.hf.from_pretrained` of ``folder``, cast to ``dtype`` when a torch
        dtype is given. ``device_map`` and ``trust_remote_code=True`` are refused (use
        ``device=``; no code of a folder is run); other ``transformers`` loading arguments are
        ignored.

        :raises PipelineLoadError: the folder could not be loaded (the cause is named and
            chained).
        """
        import gpattn_ppl.hf as hf

        where = f"transformers.pipeline({TASK!r}, model={str(folder)!r})"
        if args:
            raise PipelineLoadError(f"{where}: unexpected positional arguments {args}")
        if kwargs.get("trust_remote_code"):
            raise PipelineLoadError(f"{where}: trust_remote_code=True is not used: gpattn_ppl "
                                    "never runs a folder's code (drop the argument)")
        if kwargs.get("device_map") is not None:
            raise PipelineLoadError(f"{where}: device_map is not supported; pass device=")
        try:
            model = hf.from_pretrained(folder)
        except Exception as err:  # noqa: BLE001 -- re-raised, chained, as PipelineLoadError
            raise PipelineLoadError(f"{where}: {type(err).__name__}: {err}") from err
        dtype = kwargs.get("dtype")
        if isinstance(dtype, torch.dtype):
            model.to(dtype)
        return model


def _register() -> None:
    """Register :data:`TASK` once (re-importing this module replaces the entry silently)."""
    entry = PIPELINE_REGISTRY.supported_tasks.get(TASK)
    if entry is not None and getattr(entry.get("impl"), "__qualname__", None) == \
            UncertaintyPipeline.__qualname__:
        PIPELINE_REGISTRY.supported_tasks.pop(TASK)
    PIPELINE_REGISTRY.register_pipeline(TASK, pipeline_class=UncertaintyPipeline,
                                        pt_model=SwappedModelLoader, type="text")


_register()
