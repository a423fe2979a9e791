r"""``gpattn-ppl export RUN OUT``: an ``arch: hf`` run folder as a Hugging Face model folder.

The run's classifier (:class:`~gpattn_ppl.models.HFClassifier`: the pretrained encoder with its
swapped units, pooled, dropout, a linear head) becomes the generated
``Gpattn<Host>ForSequenceClassification`` of its encoder
(:mod:`~gpattn_ppl.models.swapped_types`), whose config holds

* the swap record (``gpattn_swap``; an empty one for a run that swapped nothing: the model type
  is ``gpattn_<host>`` either way, because the host's own head would compute something else);
* the run's head, ``gpattn_head: {"pooling": "mean" | "cls", "dropout": p}``
  (:data:`~gpattn_ppl.models.swap_record.HEAD_KEY`), which makes the generated class pool the
  encoder's last hidden state as the run does and apply ``classifier`` (the run's ``head``);
* ``id2label`` / ``label2id`` from the run's class names;
* the run's predictive, ``gpattn_predictive`` (``eval.predictive``), and its fitted temperature,
  ``gpattn_temperature`` (1.0 without temperature scaling), which
  :class:`~gpattn_ppl.hf.pipeline.UncertaintyPipeline` and ``gpattn-ppl predict OUT`` apply
  (``transformers``' own ``text-classification`` pipeline gives the untempered probabilities).

The weights are the run's ``best.pt``: ``encoder.*`` under the base model's prefix (``bert.``),
``head.*`` as ``classifier.*``. The tokenizer of the run's checkpoint is saved beside them, its
``model_max_length`` the run's ``data.max_len`` (the run truncates there).

Before a byte is written into ``OUT``, the folder is saved to a private temporary folder,
loaded back with :func:`gpattn_ppl.hf.from_pretrained` and its logits compared with the run's on
probe texts (evaluation mode, the units at their posterior means); then every file is copied
into ``OUT`` through :func:`~gpattn_ppl.safe_files.write_atomic` (``config.json`` last). After
``import gpattn_ppl.hf`` it loads with ``AutoModelForSequenceClassification.from_pretrained(OUT)``
and ``transformers.pipeline("text-classification", model=OUT)``; ``predict``, ``explain`` and
``evaluate`` take it as a ``save_pretrained`` folder (:mod:`~gpattn_ppl.run.saved_model`).

Refused (one line, nothing written): a run of another ``model.arch``, an SNGP head
(``model.head: sngp``: random features with a Laplace covariance, no ``nn.Linear``), MC dropout
(``model.mc_dropout``: its predictive draws dropout masks in evaluation mode), a run without
``best.pt``; an ``OUT`` that is a link or not a folder, that holds files (unless ``force``;
then the export's files are replaced, and a weight or tokenizer file the export does not write
is refused, as a loader would read it), or that is (inside) the run folder or holds a run.
``train_layers`` and ``freeze`` only affect training: such runs export as any other.
"""

from __future__ import annotations

import copy
import os
import tempfile
from pathlib import Path

import torch

from ..errors import GpattnError

__all__ = ["PROBE_TEXTS", "ExportError", "export_run"]

#: the texts whose logits the export compares (the run's and the exported folder's)
PROBE_TEXTS = ("The cat sat on the mat.",
               "What did you say that she bought yesterday, and why?")
#: the largest absolute difference of the probe logits accepted
_ATOL = 1e-5


class ExportError(GpattnError, ValueError):
    """A run or an output folder ``export`` refuses (one line; nothing written)."""


def _refuse_run(run_dir: Path, model: dict) -> None:
    """Refuse a run whose predictive a Hugging Face sequence classifier cannot compute."""
    arch = model.get("arch")
    if arch != "hf":
        raise ExportError(
            f"{run_dir} is an arch: {arch} run; only arch: hf runs (a pretrained Hugging Face "
            "encoder, model.checkpoint) export to a Hugging Face folder: use the run folder "
            "itself with predict / evaluate / explain, or train an arch: hf config (e.g. "
            "--set model.arch=hf model.checkpoint=all-MiniLM-L6-v2 data.encoder=hf)")
    if model.get("head") == "sngp":
        raise ExportError(
            f"{run_dir} has an SNGP head (model.head: sngp: random Fourier features with a "
            "Laplace covariance), which a Hugging Face sequence classifier has no layer for; "
            "only model.head: linear runs export")
    if model.get("mc_dropout"):
        raise ExportError(
            f"{run_dir} predicts with MC dropout (model.mc_dropout: true: dropout masks drawn "
            "in evaluation mode), which a Hugging Face model in evaluation mode does not draw; "
            "only runs without MC dropout export")
    if not (run_dir / "best.pt").is_file():
        raise ExportError(f"{run_dir} has no best.pt (no epoch finished); train it first "
                          f"(gpattn-ppl train CONFIG --out {run_dir} --resume)")


def _check_out(out: Path, run_dir: Path, force: bool) -> None:
    """The rules of ``OUT`` (module docstring), before anything is read or written."""
    from ..safe_files import path_kind
    from .rundir import holds_run

    try:
        st = os.lstat(out)
    except FileNotFoundError:
        st = None
    except NotADirectoryError:
        raise ExportError(f"OUT {out}: a part of that path is not a folder") from None
    if st is not None:
        kind = path_kind(st.st_mode)
        if kind != "a folder":
            raise ExportError(f"OUT {out}: it is {kind or 'a file'}; export writes into a real "
                              "folder (never through a link, --force included)")
    target, run = out.resolve(), run_dir.resolve()
    if target == run or run in target.parents or target in run.parents:
        raise ExportError(f"OUT {out}: the run folder {run_dir}, inside it or above it "
                          "(--force included); export to a folder of its own")
    if st is None:
        return
    if holds_run(out):
        raise ExportError(f"OUT {out} holds a run (--force included); export to another folder")
    if not force and any(out.iterdir()):
        raise ExportError(f"OUT {out}: the folder is not empty; pass --force to replace the "
                          "export's files in it, or give a new folder")


def _stale_files(out: Path, written: list[str]) -> list[str]:
    """Files of ``out`` a loader would read beside the export's that the export does not
    write (a sharded index, pickled weights, another tokenizer's vocabulary)."""
    from ..data.hf_folder import PICKLE_WEIGHTS, TOKENIZER_FILES

    read = set(TOKENIZER_FILES) | set(PICKLE_WEIGHTS) | {"model.safetensors.index.json",
                                                         "config.json"}
    if not out.is_dir():
        return []
    return sorted(p.name for p in out.iterdir()
                  if p.name not in written and (p.name in read or p.name.endswith(".safetensors")))


def _classifier(net, classes: list[str], predictive: str, temperature: float, where: str):
    """The generated ``...ForSequenceClassification`` holding ``net``'s weights."""
    import transformers

    from ..models.swap_record import HEAD_KEY, PREDICTIVE_KEY, SWAP_KEY, TEMPERATURE_KEY
    from ..models.swapped_types import swapped_config_class, swapped_model_class

    config = copy.deepcopy(net.encoder.config)
    config.__class__ = swapped_config_class(type(config))
    host_config = type(config)._gpattn_host
    try:
        host = transformers.AutoModelForSequenceClassification._model_mapping[host_config]
    except (KeyError, ImportError, AttributeError):
        raise ExportError(f"{where}: transformers has no sequence classifier for model type "
                          f"{host_config.model_type!r}; not exported") from None
    setattr(config, SWAP_KEY, list(getattr(config, SWAP_KEY, None) or []))
    setattr(config, PREDICTIVE_KEY, predictive)
    setattr(config, HEAD_KEY, {"pooling": net.pooling, "dropout": float(net.dropout.p)})
    setattr(config, TEMPERATURE_KEY, float(temperature))
    config.num_labels = len(classes)
    config.id2label = dict(enumerate(classes))
    config.label2id = {c: i for i, c in enumerate(classes)}
    config.problem_type = "single_label_classification"
    with torch.random.fork_rng(devices=[]):
        model = swapped_model_class(host)(config)
    prefix = model.base_model_prefix
    state = {f"{prefix}.{k}": v for k, v in net.encoder.state_dict().items()}
    state.update({f"classifier.{k}": v for k, v in net.head.state_dict().items()})
    own = model.state_dict()
    # the encoder's pooler, where the host's classifier has none (RoBERTa): unused by the run's
    # pooling of the last hidden state
    for key in [k for k in state if k not in own and k.startswith(f"{prefix}.pooler.")]:
        del state[key]
    missing, unexpected = sorted(set(own) - set(state)), sorted(set(state) - set(own))
    if missing or unexpected:
        raise ExportError(f"{where}: the run's weights do not map onto {type(model).__name__} "
                          f"(missing {missing[:3]}, unexpected {unexpected[:3]}); not exported")
    model.load_state_dict(state, strict=True)
    return model.eval()


def _probe_logits(model, x: torch.Tensor, mask: torch.Tensor, exported: bool) -> torch.Tensor:
    from .. import settings

    with torch.no_grad(), settings.posterior_mean(True):
        if exported:
            return model(input_ids=x, attention_mask=mask.long()).logits
        return model(x, mask)


def export_run(run_dir: str | os.PathLike, out: str | os.PathLike, *, force: bool = False,
               checkpoint: str | os.PathLike | None = None) -> dict:
    """Write the ``arch: hf`` run of ``run_dir`` into ``out`` as a Hugging Face folder (module
    docstring).

    :param force: write into a folder that holds files (the export's files are replaced).
    :param checkpoint: the run's pretrained checkpoint folder, where it is no longer at the
        recorded path (as ``predict --checkpoint``).
    :returns: ``{"out", "model_type", "architecture", "classes", "pooling", "swapped",
        "predictive", "temperature", "max_len", "files", "probe_max_abs_diff"}``.
    :raises ExportError: a run or an ``out`` refused (module docstring), or an exported model
        whose probe logits differ from the run's.
    :raises ~gpattn_ppl.run.rundir.RunFolderError: not a valid run folder.
    """
    from ..hf.hub import from_pretrained
    from ..models.swap import attention_units
    from ..safe_files import write_atomic
    from .predictor import load_run
    from .runfolder import open_run

    run_dir, out = Path(run_dir), Path(out)
    model_cfg = open_run(run_dir).config["model"]
    _refuse_run(run_dir, model_cfg)
    _check_out(out, run_dir, force)
    where = f"export {run_dir}"
    predictor = load_run(run_dir, checkpoint=checkpoint)
    net, encoder = predictor.program.net, predictor.encoder
    temperature = predictor.temperature
    predictive = predictor.config["eval"]["predictive"]
    model = _classifier(net, predictor.classes, predictive, temperature, where)
    x, lengths = encoder.encode(list(PROBE_TEXTS))
    mask = torch.arange(x.shape[1]) < lengths.unsqueeze(1)
    expected = _probe_logits(net, x, mask, exported=False)
    tokenizer = copy.deepcopy(encoder.tokenizer)
    tokenizer.model_max_length = int(encoder.max_len)       # where the run truncates
    from transformers.utils import logging

    bar = logging.is_progress_bar_enabled()
    logging.disable_progress_bar()
    try:
        with tempfile.TemporaryDirectory(prefix="gpattn-export-") as tmp:
            model.save_pretrained(tmp)
            tokenizer.save_pretrained(tmp)
            got = _probe_logits(from_pretrained(tmp), x, mask, exported=True)
            diff = float((got - expected).abs().max())
            if not torch.allclose(got, expected, rtol=1e-5, atol=_ATOL):
                raise ExportError(f"{where}: the exported model's logits differ from the run's "
                                  f"by up to {diff:.3g} on the probe texts; not exported")
            names = sorted(p.name for p in Path(tmp).iterdir())
            if any(not (Path(tmp) / n).is_file() for n in names):
                raise ExportError(f"{where}: transformers saved a folder inside the model "
                                  f"folder ({names}); not exported")
            stale = _stale_files(out, names)
            if stale:
                raise ExportError(f"OUT {out} holds {', '.join(stale)}, which a loader would "
                                  "read beside the exported files (--force replaces the "
                                  "export's own files only); remove them or give a new folder")
            # config.json last: a folder interrupted before it is not a model folder
            for name in sorted(names, key=lambda n: n == "config.json"):
                write_atomic(out / name, (Path(tmp) / name).read_bytes(), root=out,
                             overwrite=force)
    finally:
        if bar:
            logging.enable_progress_bar()
    return {"out": str(out), "model_type": type(model.config).model_type,
            "architecture": type(model).__name__, "classes": list(predictor.classes),
            "pooling": net.pooling,
            "swapped": sorted(attention_units(model)),
            "predictive": predictive, "temperature": temperature,
            "max_len": int(encoder.max_len), "files": names, "probe_max_abs_diff": diff}
