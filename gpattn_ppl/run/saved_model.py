r"""A ``save_pretrained`` folder in place of a run folder: ``predict``, ``explain`` and
``evaluate`` on a swapped Hugging Face sequence classifier.

A folder written by ``model.save_pretrained(folder)`` from a classifier swapped with
:func:`gpattn_ppl.hf.swap` (``...ForSequenceClassification``), with its tokenizer saved beside it
(``tokenizer.save_pretrained(folder)``), is told from a run folder by its files
(:func:`is_saved_model`: a ``config.json`` and none of a run's files). It is read by the library's
own loaders only: :func:`~gpattn_ppl.data.hf_folder.check_model_folder` (no ``auto_map``, links
confined, safetensors headers checked), then :func:`gpattn_ppl.hf.from_pretrained` (safetensors
only, never a pickle) and the tokenizer by ``AutoTokenizer`` with ``local_files_only=True`` and
``trust_remote_code=False`` (:func:`~gpattn_ppl.data.load_tokenizer`): no code of the folder
runs, nothing is downloaded, and nothing is written into it.

:func:`load_predictor` returns a :class:`~gpattn_ppl.run.predictor.Predictor` either way; for a
folder it is a :class:`SavedModelPredictor`, whose :meth:`~SavedModelPredictor.predict_proba`
runs :math:`T` passes of the model (:func:`~gpattn_ppl.hf.sampling.mc_logits`: a deterministic
model once, ``mean=True`` once at the units' posterior means), so ``predict`` prints the same
records as for a run. The class names are the config's ``id2label``; the temperature
:math:`\tau` is the config's ``gpattn_temperature`` (the fitted one of a run that ``gpattn-ppl
export`` wrote; 1 without one, or with ``temperature=False``), and the probabilities are
:math:`\mathrm{softmax}(\ell / \tau)`, as a run's. A folder has no ``eval`` section: :math:`T`
defaults to the default of ``eval.mc_samples`` (:data:`DEFAULT_SAMPLES`), and the predictive to
the one the swap recorded (``config.gpattn_predictive``: ``"mean"``, one pass at the units'
posterior means, unless ``samples`` are asked for; else Monte-Carlo passes), as a run's
``eval.predictive``.

:func:`evaluate_saved_model` is ``evaluate`` for a folder: a folder carries no data, so the
labelled data is named (``evaluate FOLDER --data ...``): a ``.csv`` / ``.tsv`` / ``.jsonl`` file of
texts and labels (read by :func:`~gpattn_ppl.data.read_labelled_texts`; the test metrics), or the
name of a registered text dataset that needs no files (``cola``, ``clinc150_slice``: its test split
and OOD sets, reported by :func:`~gpattn_ppl.run.evaluate.evaluate_predictions` exactly as a run's
evaluation reports them). Labels name the model's classes (``id2label``); a model saved with the
default names ``LABEL_0 .. LABEL_{K-1}`` takes the class indices ``0 .. K-1`` instead.
"""

from __future__ import annotations

import inspect
import os
import time
from pathlib import Path

import torch

from ..data.hf_folder import TOKENIZER_FILES, HFFolderError
from .predictor import Predictor

__all__ = ["DEFAULT_SAMPLES", "SavedModelPredictor", "evaluate_saved_model", "is_saved_model",
           "load_predictor", "load_saved_model"]

#: passes ``T`` of a stochastic folder model when none are asked for (``eval.mc_samples``'s
#: default)
DEFAULT_SAMPLES = 10

#: the files that hold a tokenizer's vocabulary (one of them must be in the folder)
_VOCAB_FILES = tuple(n for n in TOKENIZER_FILES if n not in (
    "tokenizer_config.json", "special_tokens_map.json", "added_tokens.json",
    "chat_template.jinja"))
#: the tokenizer outputs a classifier may take
_MODEL_INPUTS = ("input_ids", "attention_mask", "token_type_ids")
#: the longest input when neither the tokenizer nor the config bounds it
_FALLBACK_MAX_LENGTH = 512


def is_saved_model(path: str | os.PathLike) -> bool:
    """Whether ``path`` is a ``save_pretrained`` folder rather than a run folder: a folder with a
    ``config.json`` and none of a run's files (:func:`~gpattn_ppl.run.rundir.holds_run`). Its
    weights are not looked at here: a folder without them is refused by the loader, by name."""
    from .rundir import holds_run

    path = Path(path)
    return path.is_dir() and os.path.lexists(path / "config.json") and not holds_run(path)


class _FolderEncoder:
    """What :mod:`~gpattn_ppl.run.explain` reads of a predictor's encoder: the tokenizer and the
    truncation length (``kind "hf"``)."""

    kind = "hf"

    def __init__(self, tokenizer, max_len: int) -> None:
        self.tokenizer, self.max_len = tokenizer, int(max_len)


class SavedModelPredictor(Predictor):
    """A swapped Hugging Face sequence classifier loaded from its ``save_pretrained`` folder, with
    the folder's tokenizer; build it with :func:`load_saved_model` (or :func:`load_predictor`).

    :ivar model: the classifier (evaluation mode).
    :ivar tokenizer: the folder's tokenizer.
    :ivar classes: the ``id2label`` names in index order.
    :ivar temperature: the config's ``gpattn_temperature`` (an exported run's fitted one; 1.0
        without one or with ``temperature=False``).
    :ivar max_length: inputs are truncated to this many tokens (the tokenizer's
        ``model_max_length`` or the config's ``max_position_embeddings``, the smaller).
    """

    def __init__(self, model, tokenizer, folder: Path, *, device: torch.device,
                 max_length: int, temperature: bool = True) -> None:
        from ..hf.sampling import is_stochastic
        from ..models.swap_record import read_temperature

        self.model, self.tokenizer, self.max_length = model, tokenizer, int(max_length)
        self.classes = _class_names(model.config)
        self.temperature = read_temperature(model.config, str(folder)) if temperature else 1.0
        self.device, self.run_dir = device, folder
        self.program = None
        self.encoder = _FolderEncoder(tokenizer, max_length)
        predictive = getattr(model.config, "gpattn_predictive", None)
        self.config = {"eval": {"mc_samples": DEFAULT_SAMPLES,
                                "predictive": "mean" if predictive == "mean" else "mc"}}
        self.stochastic = bool(is_stochastic(model))
        params = inspect.signature(model.forward).parameters
        self._inputs = [n for n in _MODEL_INPUTS if n in params]

    def __repr__(self) -> str:
        return (f"SavedModelPredictor({self.run_dir}, {type(self.model).__name__}, "
                f"classes={self.classes}, stochastic={self.stochastic})")

    @property
    def net(self):
        """The model (the module :mod:`~gpattn_ppl.run.explain` hooks)."""
        return self.model

    def encode(self, texts: list[str]) -> dict:
        """The model's keyword inputs for ``texts`` (padded, truncated to ``max_length``),
        on ``device``."""
        enc = self.tokenizer(list(texts), padding=True, truncation=True,
                             max_length=self.max_length, return_tensors="pt")
        return {k: enc[k].to(self.device) for k in self._inputs if k in enc}

    def logits(self, inputs, *, samples: int | None = None, batch_size: int = 256,
               seed: int = 0, mean: bool | None = None) -> torch.Tensor:
        """Per-pass logits ``[T, n, K]`` (float32, CPU); the arguments as
        :meth:`predict_proba`."""
        from ..hf.sampling import mc_logits

        if isinstance(inputs, str):
            raise TypeError("inputs must be a list of texts (got one str; wrap it in a list)")
        inputs = list(inputs)
        if len(inputs) == 0:
            raise ValueError("inputs is empty")
        if not all(isinstance(t, str) for t in inputs):
            raise TypeError("a save_pretrained folder's model takes texts (a list of str)")
        if mean and samples is not None:
            raise ValueError("mean=True is one pass; it takes no samples")
        if mean is None:  # asked-for samples are MC passes, whatever the recorded predictive
            mean = samples is None and self.config["eval"]["predictive"] == "mean"
        T = DEFAULT_SAMPLES if samples is None else int(samples)
        if T < 1:
            raise ValueError(f"samples must be >= 1, got {T}")
        if batch_size < 1:
            raise ValueError(f"batch_size must be >= 1, got {batch_size}")
        devices = [self.device] if self.device.type == "cuda" else []
        out = []
        with torch.random.fork_rng(devices=devices):
            torch.manual_seed(seed)
            for start in range(0, len(inputs), batch_size):
                enc = self.encode(inputs[start:start + batch_size])
                out.append(mc_logits(self.model, enc, T, mean=bool(mean)).float().cpu())
        return torch.cat(out, 0).transpose(0, 1)                              # [T, n, K]

    def predict_proba(self, inputs, *, samples: int | None = None, batch_size: int = 256,
                      seed: int = 0, mean: bool | None = None) -> torch.Tensor:
        """Per-pass tempered class probabilities ``[T, n, K]`` (float64, CPU):
        ``softmax(logits / temperature)``.

        :param inputs: texts (a list of str).
        :param samples: passes ``T`` of a stochastic model (default :data:`DEFAULT_SAMPLES`; a
            deterministic model runs once).
        :param seed: seeds the passes (the global random state is untouched).
        :param mean: one pass at the units' posterior means instead of ``samples`` draws
            (default: the folder's recorded ``gpattn_predictive``, unless ``samples`` is given).
        :raises ValueError: ``mean=True`` with ``samples``, no inputs.
        """
        logits = self.logits(inputs, samples=samples, batch_size=batch_size, seed=seed,
                             mean=mean)
        return torch.softmax(logits.double() / self.temperature, -1)


def _class_names(config) -> list[str]:
    """The ``K`` class names of a classifier's config (``id2label``, ``LABEL_k`` where it names
    none), as :class:`~gpattn_ppl.hf.pipeline.UncertaintyPipeline` labels them."""
    id2label = getattr(config, "id2label", None) or {}
    return [str(id2label.get(k, id2label.get(str(k), f"LABEL_{k}")))
            for k in range(int(config.num_labels))]


def _default_names(classes: list[str]) -> bool:
    return classes == [f"LABEL_{k}" for k in range(len(classes))]


def _max_length(model, tokenizer) -> int:
    limits = [n for n in (getattr(tokenizer, "model_max_length", None),
                          getattr(model.config, "max_position_embeddings", None))
              if isinstance(n, int) and not isinstance(n, bool) and 0 < n < 1_000_000]
    return min(limits) if limits else _FALLBACK_MAX_LENGTH


def _check_classifier(model, folder: Path) -> None:
    name = type(model).__name__
    where = f"{folder}"
    if not any(c.__name__.endswith("ForSequenceClassification") for c in type(model).__mro__):
        raise HFFolderError(f"{where}: the model is a {name}, not a sequence classifier "
                            "(...ForSequenceClassification); predict, explain and evaluate need "
                            "class probabilities")
    problem = getattr(model.config, "problem_type", None)
    if int(model.config.num_labels) < 2 or problem in ("regression",
                                                       "multi_label_classification"):
        raise HFFolderError(f"{where}: the classifier has num_labels {model.config.num_labels} "
                            f"and problem_type {problem!r}; predict, explain and evaluate need a "
                            "single-label classifier of at least 2 classes")


def load_saved_model(folder: str | os.PathLike, *, device: str | torch.device = "cpu",
                     temperature: bool = True) -> SavedModelPredictor:
    """The swapped classifier and tokenizer of a ``save_pretrained`` folder, for prediction.

    The folder is checked (:func:`~gpattn_ppl.data.hf_folder.check_model_folder`) before anything
    reads it; the tokenizer must be saved beside the model; the model is loaded by
    :func:`gpattn_ppl.hf.from_pretrained` (safetensors only, the swap replayed, strict).

    :param device: where to run the model (``"auto"``: CUDA when available).
    :param temperature: apply the config's ``gpattn_temperature`` (an exported run's).
    :raises FileNotFoundError: no such folder, no ``config.json`` or no safetensors weights.
    :raises ~gpattn_ppl.data.hf_folder.HFFolderError: no tokenizer in the folder, a folder that
        asks to run code or breaks another rule, a model that is not a single-label sequence
        classifier, an unreadable tokenizer.
    :raises ~gpattn_ppl.hf.SwapRecordError: no swap record (not saved from a model swapped with
        :func:`gpattn_ppl.hf.swap`), or weights that do not rebuild it.
    """
    from ..data.hf_folder import check_model_folder
    from ..data.pretrained import load_tokenizer
    from ..hf import from_pretrained
    from .runtime import select_device

    folder = Path(folder)
    if not folder.is_dir():
        raise FileNotFoundError(f"{folder}: no such folder")
    check_model_folder(folder, weights=True)  # no code of the folder runs; files confined
    if not any(os.path.lexists(folder / n) for n in _VOCAB_FILES):
        raise HFFolderError(f"{folder}: no tokenizer saved beside the model (no tokenizer.json, "
                            "vocab.txt or other vocabulary file); save it into the folder with "
                            "tokenizer.save_pretrained(folder)")
    device = select_device(device) if isinstance(device, str) else torch.device(device)
    # an absolute path: never the offline MiniLM package's name, never looked up elsewhere
    tokenizer = load_tokenizer(folder.absolute())
    model = from_pretrained(folder, device=device)
    _check_classifier(model, folder)
    return SavedModelPredictor(model, tokenizer, folder, device=device,
                               max_length=_max_length(model, tokenizer),
                               temperature=temperature)


def load_predictor(path: str | os.PathLike, *, device: str | torch.device = "cpu",
                   temperature: bool = True, checkpoint: str | os.PathLike | None = None
                   ) -> Predictor:
    """:func:`~gpattn_ppl.run.predictor.load_run` for a run folder, :func:`load_saved_model` for
    a ``save_pretrained`` folder (:func:`is_saved_model`).

    :param temperature: a run's fitted temperature (a folder's ``gpattn_temperature``).
    :param checkpoint: ``arch: hf`` runs only (see ``load_run``); refused for a folder.
    """
    if is_saved_model(path):
        if checkpoint is not None:
            raise ValueError(f"--checkpoint: {path} is a save_pretrained model folder, which "
                             "holds its own weights; --checkpoint applies to arch: hf run folders")
        return load_saved_model(path, device=device, temperature=temperature)
    from .predictor import load_run

    return load_run(path, device=device, temperature=temperature, checkpoint=checkpoint)


# -- evaluate --------------------------------------------------------------------------------------
_FILE_FORMATS = {".csv": "csv", ".tsv": "csv", ".jsonl": "jsonl"}


def _is_dataset_name(data) -> bool:
    """A registered dataset's name (``cola``), not a path (``cola.csv``, ``data/cola``)."""
    from ..data.registry import DATASETS

    text = str(data)
    return (text in DATASETS and not Path(text).suffix
            and not any(sep and sep in text for sep in (os.sep, os.altsep)))


def _file_data(path: Path, classes: list[str], text_column: str, label_column: str
               ) -> dict[str, tuple[list[str], torch.Tensor]]:
    from ..data import read_labelled_texts
    from ..data.registry import DATASETS

    fmt = _FILE_FORMATS.get(path.suffix.lower())
    if fmt is None:
        texts = sorted(n for n, s in DATASETS.items() if s.modality == "text")
        raise ValueError(f"--data {path}: neither a labelled .csv / .tsv / .jsonl file nor a "
                         f"registered text dataset ({', '.join(texts)})")
    if not path.is_file():
        raise FileNotFoundError(f"--data: no such file: {path}")
    from ..errors import DataError

    indices = _default_names(classes)
    names = [str(k) for k in range(len(classes))] if indices else classes
    try:
        texts, labels, _ = read_labelled_texts(path, fmt=fmt, text_column=text_column,
                                               label_column=label_column, classes=names)
    except DataError as err:  # the classes are the model's, not a training file's
        whose = ("the model's class indices (its id2label names none)" if indices
                 else "the model's id2label")
        raise DataError(str(err).replace("(from the training file)", f"({whose})")) from None
    return {"test": (texts, labels)}


def _class_map(dataset: str, theirs: list[str] | None, K: int, ours: list[str]) -> list[int]:
    """Index in the model's classes of each class of the dataset."""
    if theirs is None or _default_names(ours):
        if K != len(ours):
            raise ValueError(f"--data {dataset}: the dataset has {K} classes, the model "
                             f"{len(ours)} ({', '.join(ours)})")
        return list(range(len(ours)))
    if sorted(theirs) != sorted(ours):
        raise ValueError(f"--data {dataset}: the dataset's classes ({', '.join(theirs)}) are "
                         f"not the model's id2label ({', '.join(ours)})")
    return [ours.index(c) for c in theirs]


def _dataset_data(name: str, classes: list[str]):
    """``({split or OOD name: (texts, labels)}, OOD names)`` of a registered text dataset
    (its default protocol; labels mapped onto the model's classes, -1 kept)."""
    from ..data.registry import DATASETS

    spec = DATASETS[name]
    if spec.modality != "text":
        raise ValueError(f"--data {name}: an {spec.modality} dataset; a text classifier's "
                         "folder is evaluated on texts")
    if {"train_file", "train_dir"} & set(spec.options):
        raise ValueError(f"--data {name}: this dataset is read from files you name; give the "
                         "labelled file itself, e.g. --data test.csv")
    raw = spec.builder(protocol=spec.protocols[0], root=None, split_seed=0, cache_dir=None)
    index = torch.tensor(_class_map(name, raw.classes, raw.num_classes, classes) + [-1])

    def mapped(y: torch.Tensor) -> torch.Tensor:
        y = torch.as_tensor(y, dtype=torch.long)
        return index[torch.where(y < 0, len(index) - 1, y)]

    out = {split: ([raw.x[int(i)] for i in raw.splits[split]], mapped(raw.y[raw.splits[split]]))
           for split in ("val", "test")}
    for ood, (x, y) in raw.ood.items():
        out[ood] = (list(x), mapped(y))
    return out, list(raw.ood)


def evaluate_saved_model(folder: str | os.PathLike, data: str, *, text_column: str = "text",
                         label_column: str = "label", samples: int | None = None,
                         batch_size: int = 256, seed: int = 0, device: str = "cpu",
                         mean: bool = False) -> dict:
    """Metrics of a ``save_pretrained`` folder's classifier on labelled data (``gpattn-ppl
    evaluate FOLDER --data DATA``); nothing is written.

    :param data: a labelled ``.csv`` / ``.tsv`` / ``.jsonl`` file (``text_column``,
        ``label_column``): the test metrics; or a registered text dataset needing no files
        (``cola``, ``clinc150_slice``): test and OOD metrics of its default protocol, as a run's
        evaluation reports them (the dataset's default ``eval`` settings).
    :param samples: passes ``T`` (default :data:`DEFAULT_SAMPLES`); ``mean``: one pass at the
        posterior means.
    :returns: ``{"model_dir", "data", "examples" {set: n}, "samples", "classes", "test" {metric:
        value}, "ood" {name: {"classification", "detection"}}, ["warnings"], "cost"}``: ``test``
        and ``ood`` as in a run's ``results.json``.
    :raises ValueError: an unknown file type or dataset, labels that are not the model's
        classes, a malformed file (naming file, line and column), and the errors of
        :func:`load_saved_model`.
    """
    from ..metrics import classification_report
    from .config import validate_config
    from .evaluate import evaluate_predictions
    from .output import strict

    predictor = load_saved_model(folder, device=device)
    if _is_dataset_name(data):
        sets, names = _dataset_data(str(data), predictor.classes)
        cfg = validate_config({"data": {"name": str(data)}}, extras=False)
    else:
        sets = _file_data(Path(data), predictor.classes, text_column, label_column)
        names, cfg = [], None
    start = time.perf_counter()
    preds = {}
    for i, (key, (texts, labels)) in enumerate(sets.items()):
        logits = predictor.logits(texts, samples=samples, batch_size=batch_size, seed=seed + i,
                                  mean=mean)
        preds[key] = {"logits": logits, "probs": torch.softmax(logits.double(), -1),
                      "labels": labels}
    seconds = time.perf_counter() - start
    if cfg is None:
        test = preds["test"]
        results = {"test": classification_report(test["probs"], test["labels"],
                                                 logits=test["logits"]),
                   "ood": {}, "warnings": []}
    else:
        results = evaluate_predictions(preds, cfg, names)
    n = {k: len(p["labels"]) for k, p in preds.items()}
    out = {"model_dir": str(folder), "data": str(data), "examples": n,
           "samples": int(preds["test"]["logits"].shape[0]), "classes": predictor.classes,
           "test": results["test"], "ood": results["ood"]}
    for key in ("temperature_scaling", "ts"):
        if key in results:
            out[key] = results[key]
    if results.get("warnings"):
        out["warnings"] = results["warnings"]
    out["cost"] = {"eval_seconds": seconds,
                   "predict_ms_per_example": 1e3 * seconds / max(sum(n.values()), 1),
                   "params": sum(p.numel() for p in predictor.model.parameters())}
    return strict(out)
