"""Assembling one run: config -> data bundle -> network -> Pyro program, and the run's manifest.

The pieces :class:`~gpattn_ppl.run.training.Trainer` (training),
:func:`~gpattn_ppl.run.results.evaluate_run` (evaluation) and
:func:`~gpattn_ppl.run.predictor.load_run` (prediction) share; none of them reads or writes a
run folder except :func:`check_same_data` (reads, through
:class:`~gpattn_ppl.run.runfolder.RunFolder`).
"""

from __future__ import annotations

import time

from ..infer import PyroProgram, init_from
from .config import (
    DATA_OPTIONS,
    VALIDATION_METRICS,
    ConfigError,
    dataset_extra_options,
)
from .output import strict
from .plugins import imported_plugins
from .rundir import LOCK_FILE, RUN_FILES, RunFolderError

__all__ = ["MANIFEST_FORMAT", "VALIDATION_METRICS", "build_net", "check_same_data",
           "data_sizes", "load_bundle", "model_and_program", "new_manifest", "parameter_groups",
           "selection_metric"]

#: the manifest format written to ``run.json`` (2: with the ``files`` list and ``warm_start``)
MANIFEST_FORMAT = 2


def selection_metric(cfg: dict, bundle) -> str:
    """``train.select_metric``; ``auto`` is the metric the dataset declares
    (``select_metric`` of :class:`~gpattn_ppl.data.DataBundle`: MCC on CoLA, accuracy elsewhere).

    :raises ConfigError: a metric the validation report does not compute (``auto`` resolving
        to a dataset's undeclared metric; explicit names are checked by the config).
    """
    m = cfg["train"]["select_metric"]
    if m == "auto":
        m = getattr(bundle, "select_metric", "acc")
    if m not in VALIDATION_METRICS:
        raise ConfigError(f"train.select_metric: {m!r} is not a validation metric; allowed: "
                          f"auto, {', '.join(VALIDATION_METRICS)}")
    return m


def load_bundle(cfg: dict):
    """The :class:`~gpattn_ppl.data.DataBundle` a config asks for.

    :raises ValueError: a ``data`` key the dataset does not take (named with its key path).
    """
    from ..data import DATASETS, load_data

    d = cfg["data"]
    kw = {k: d[k] for k in DATA_OPTIONS if d.get(k) is not None}
    spec = DATASETS.get(d["name"])
    extra = [] if spec is None else dataset_extra_options(d, spec)
    if extra:
        raise ConfigError(f"data.{extra[0]}: not an option of dataset {d['name']!r}")
    # every random choice of the data (splits, limit subsets) follows data.split_seed, so
    # runs that differ only in train.seed see identical data and vocabularies
    if d["encoder"] == "hf":
        kw["checkpoint"] = cfg["model"]["checkpoint"]
    return load_data(d["name"], encoder=d["encoder"], max_len=d["max_len"],
                     seed=d["split_seed"], split_seed=d["split_seed"], **kw)


def parameter_groups(net, train: dict) -> list[dict]:
    """The optimiser's parameter groups: one at ``train.lr``, or for a pretrained encoder
    (:meth:`~gpattn_ppl.models.HFClassifier.parameter_groups`) the swapped units and the head
    at ``lr`` and the rest of the encoder at ``train.backbone_lr`` (default ``lr``). The
    schedule multiplies both."""
    if not hasattr(net, "parameter_groups"):
        return [{"params": [p for p in net.parameters() if p.requires_grad]}]
    new, backbone = net.parameter_groups()
    lr = train["lr"] if train["backbone_lr"] is None else train["backbone_lr"]
    groups = [{"params": new}]
    if backbone:
        groups.append({"params": backbone, "lr": lr})
    return groups


def data_sizes(bundle) -> dict:
    """What the model needs to know of the data: ``num_classes``, ``input_kind``,
    ``vocab_size``, ``feature_dim`` (the keys of ``sizes`` in ``run.json``)."""
    return {"num_classes": bundle.num_classes, "input_kind": bundle.input_kind,
            "vocab_size": bundle.vocab_size, "feature_dim": bundle.feature_dim}


def build_net(cfg: dict, sizes):
    """The classifier of the validated ``cfg['model']`` with the sizes the data decides filled
    in (assembled without validating the section again).

    :param sizes: a :class:`~gpattn_ppl.data.DataBundle` or the :func:`data_sizes` dict.
    """
    from ..models import assemble_model

    if not isinstance(sizes, dict):
        sizes = data_sizes(sizes)
    fill = {"num_classes": sizes["num_classes"]}
    if sizes["input_kind"] == "tokens":
        fill["vocab_size"] = sizes["vocab_size"]
    elif sizes["input_kind"] == "features":
        fill["feature_dim"] = sizes["feature_dim"]
    model = dict(cfg["model"])
    if sizes["input_kind"] != "image":
        model["max_len"] = max(model["max_len"], cfg["data"]["max_len"])
    return assemble_model(model, **fill)


def new_manifest(bundle, warm_start: dict | None = None) -> dict:
    """The ``run.json`` of a new run on ``bundle``: sizes, classes, data fingerprint, recorded
    plugins, the warm start's summary and the files the run may write
    (:mod:`~gpattn_ppl.run.rundir`)."""
    from .._version import __version__

    ws = None if warm_start is None else {
        "source": warm_start["source"], "loaded": len(warm_start["loaded"]),
        "missing": len(warm_start["missing"]), "unexpected": len(warm_start["unexpected"]),
        "shape_mismatch": len(warm_start["shape_mismatch"]),
        "share": round(warm_start["share"], 4)}
    return {"format": MANIFEST_FORMAT, "gpattn_ppl": __version__,
            "created": time.strftime("%Y-%m-%dT%H:%M:%S%z"), "sizes": data_sizes(bundle),
            "classes": list(bundle.classes) if bundle.classes is not None
            else [str(k) for k in range(bundle.num_classes)],
            "data": {"name": bundle.name, "protocol": bundle.protocol,
                     "fingerprint": bundle.fingerprint,
                     "split_sizes": bundle.info.get("sizes", {})},
            "plugins": imported_plugins(), "warm_start": ws,
            "files": [LOCK_FILE, *RUN_FILES]}


def check_same_data(manifest: dict, encoder_state: dict | None, bundle, run_dir) -> None:
    """The data (and its encoding) a run was trained on is the data loaded now: the manifest's
    fingerprint (which covers the OOD sets too, but for manifests of format 1, written before
    they counted) and ``encoder.json`` (``None``: not written
    yet)."""
    saved = manifest["data"]["fingerprint"]
    # manifests of format 1 hold the version-1 digest, which does not cover the OOD sets
    now = bundle.fingerprint if manifest["format"] >= 2 else bundle.fingerprint_v1
    if saved != now:
        raise RunFolderError(
            f"{run_dir}: the data changed since this run was trained (fingerprint {saved[:12]} "
            f"in run.json, {now[:12]} now: files edited, an OOD file included, "
            "another split or limit)\nhint: train into another folder, or --force to retrain "
            "here")
    current = None if encoder_state is None else strict(bundle.encoder_state)
    if encoder_state is not None and encoder_state.get("kind") == "hf" == current.get("kind"):
        # a pretrained checkpoint is the same by content (digest), wherever its folder is now
        from ..data import digest_differences

        recorded = encoder_state.get("digest")
        parts = (digest_differences(recorded, current.get("digest") or {})
                 if isinstance(recorded, dict) else "")
        if parts:
            raise RunFolderError(f"{run_dir}: the checkpoint folder {current.get('path')} is not "
                                 f"the one the run was trained with: {parts}\nhint: give the "
                                 "checkpoint it was trained with, or use another folder")
        encoder_state, current = ({k: s.get(k) for k in ("kind", "max_len")}
                                  for s in (encoder_state, current))
    if encoder_state is not None and encoder_state != current:
        raise RunFolderError(f"{run_dir}: the input encoding (vocabulary / encoder settings) "
                             "differs from encoder.json\nhint: retrain, or use another folder")


def model_and_program(cfg: dict, sizes, num_data: int, device, world: int = 1, *,
                      warm_start: bool = True):
    """The network on ``device`` (warm-started if ``train.init_from`` and ``warm_start``; an
    evaluation loads ``best.pt`` over it and never reads the warm-start file), the warm-start
    report, and its Pyro program (forward through DDP when ``world > 1``)."""
    t = cfg["train"]
    net = build_net(cfg, sizes).to(device)
    warm = init_from(net, t["init_from"]) if t["init_from"] and warm_start else None
    program = PyroProgram(net, num_data, t["objective"], mode=t["mode"],
                          total_epochs=t["epochs"])
    if world > 1:
        from torch.nn.parallel import DistributedDataParallel

        ids = [device.index] if device.type == "cuda" else None
        program.forward_module = DistributedDataParallel(net, device_ids=ids)
    return net, warm, program


