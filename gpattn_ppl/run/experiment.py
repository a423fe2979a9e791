"""One run: config -> data -> model -> fit -> evaluate, into a run folder.

One run folder holds everything (:mod:`~gpattn_ppl.run.rundir` lists the files and states the
rule: a folder that holds a run is refused unless ``resume`` (same config only) or ``force``;
nothing is written before that check).

Exact resume: the data order of epoch ``e`` is a permutation drawn from a generator seeded with
``(seed, e)`` and every RNG state is saved at the end of each epoch, so a run resumed from
``last.pt`` produces the same loss sequence as an uninterrupted one.

The config is validated once (:func:`~gpattn_ppl.run.config.load_config`); a
:class:`~gpattn_ppl.run.config.Config` is taken as it is and the model is assembled from its
validated ``model`` section.
"""

from __future__ import annotations

import copy
import csv
import json
import math
import time
import warnings
from pathlib import Path

import torch
import yaml

from .. import linalg
from ..errors import NumericsWarning
from ..infer import (
    CheckpointError,
    PyroProgram,
    atomic_write,
    epoch_clock,
    fit_epoch,
    init_from,
    load_checkpoint,
    lr_lambda,
    predict,
    rng_state,
    save_atomic,
    set_rng_state,
)
from ..metrics import HIGHER_IS_BETTER, classification_report
from ..ppl import SiteContext, site_context
from .config import (
    DATA_OPTIONS,
    VALIDATION_METRICS,
    Config,
    ConfigError,
    check_device_available,
    dataset_extra_options,
    load_config,
    validate_config,
)
from .evaluate import check_ood_names, evaluate_model
from .output import strict
from .plugins import imported_plugins
from .rundir import (
    RunFolderError,
    check_run_folder,
    clear_run_files,
    config_differences,
    read_manifest,
    write_json_atomic,
)
from .runtime import barrier, init_distributed, peak_memory_mb, seed_everything, select_device

__all__ = ["VALIDATION_METRICS", "Trainer", "build_net", "data_sizes", "evaluate_run",
           "load_bundle", "selection_metric", "step0_terms"]

#: the manifest format written to ``run.json``
MANIFEST_FORMAT = 1


def _validated(config, overrides: list[str] | None) -> dict:
    """The validated config as a plain dict: a :class:`Config` as it is, anything else (a YAML
    path, a partial dict) through :func:`load_config` once."""
    if isinstance(config, Config) and not overrides:
        return copy.deepcopy(dict(config))
    return dict(load_config(config, overrides))


@torch.no_grad()
def step0_terms(net, x: torch.Tensor, mask: torch.Tensor | None, y: torch.Tensor,
                draws: int = 1) -> tuple[float, dict[str, float]]:
    """The cross-entropy of ``net`` on ``(x, mask, y)`` and its unweighted objective terms
    (unit path + name -> batch mean), each averaged over ``draws`` training-mode draws in thin
    mode; ``net``'s training flag is restored."""
    was_training = net.training
    net.train()
    ce, terms = 0.0, {}
    try:
        for _ in range(draws):
            with site_context(SiteContext(mode="thin")):
                ce += float(torch.nn.functional.cross_entropy(net(x, mask), y)) / draws
            for k, v in net.objective_terms().items():
                terms[k] = terms.get(k, 0.0) + float(v.float().mean()) / draws
    finally:
        net.train(was_training)
    return ce, terms


class Trainer:
    """Train one configuration into ``run_dir`` and evaluate its best checkpoint.

    :param config: a validated :class:`~gpattn_ppl.run.config.Config` (used as it is), or a config
        dict or YAML path (validated here, once, by :func:`~gpattn_ppl.run.config.load_config`).
    :param run_dir: output folder.
    :param overrides: ``--set`` style overrides.
    :param bundle: a pre-loaded :class:`~gpattn_ppl.data.DataBundle` (skips loading).
    :param resume: continue the run in ``run_dir`` (its config must equal this one; its data
        must have the same fingerprint).
    :param force: discard a run in ``run_dir`` and start afresh.
    :param label: the progress bar's label (default: the last two parts of ``run_dir``).
    :raises RunFolderError: ``run_dir`` holds a run and the flags do not allow using it (see
        :func:`~gpattn_ppl.run.rundir.check_run_folder`); raised before anything is written.
    :raises ConfigError: the config is invalid, ``train.device`` is not available here (both
        before any data is loaded), or ``eval.ood`` names a set the dataset does not have
        (before training).
    """

    def __init__(self, config, run_dir: str | Path, *, overrides: list[str] | None = None,
                 bundle=None, resume: bool = False, force: bool = False,
                 label: str | None = None) -> None:
        self.cfg = _validated(config, overrides)
        check_device_available(self.cfg["train"]["device"])
        self.run_dir = Path(run_dir)
        self.action = check_run_folder(self.run_dir, self.cfg, resume=resume, force=force)
        self.label = label or "/".join(self.run_dir.parts[-2:])
        self.rank, self.world = init_distributed()
        self.device = select_device(self.cfg["train"]["device"], self.rank)
        seed_everything(self.cfg["train"]["seed"])
        self.bundle = bundle if bundle is not None else load_bundle(self.cfg)
        # a run killed while writing its first files (config.yaml, not yet run.json) trained
        # nothing: resuming it is starting it; with a checkpoint, run.json must say same data
        if self.action == "resume" and ((self.run_dir / "run.json").is_file()
                                        or (self.run_dir / "last.pt").exists()):
            _check_same_data(self.run_dir, self.bundle)
        check_ood_names(self.cfg["eval"]["ood"], self.bundle)
        self.select_metric = selection_metric(self.cfg, self.bundle)
        self.net, self.warm_start, self.program = _model_and_program(
            self.cfg, self.bundle, len(self.bundle.train), self.device, self.world)
        self.num_data = len(self.bundle.train)
        t = self.cfg["train"]
        opt_cls = torch.optim.AdamW if t["optimizer"] == "adamw" else torch.optim.Adam
        # the fused kernel: one pass over all parameters and no host read per parameter (the
        # for-loop implementation reads every step counter with .item(); 9x slower measured)
        self.optimizer = opt_cls(parameter_groups(self.net, t), lr=t["lr"],
                                 weight_decay=t["weight_decay"],
                                 fused=self.device.type in ("cpu", "cuda"))
        self.steps_per_epoch = math.ceil(math.ceil(self.num_data / self.world)
                                         / self.cfg["data"]["batch_size"])
        total = self.steps_per_epoch * t["epochs"]
        warm = int(round(t["warmup_epochs"] * self.steps_per_epoch))
        self.scheduler = torch.optim.lr_scheduler.LambdaLR(
            self.optimizer, lr_lambda(t["schedule"], total, warm, t["min_lr"] / t["lr"]))
        self.epoch, self.history, self.step_losses = 0, [], []
        self.best = {"epoch": -1, "score": None}
        #: keys of the objective checks already warned about (once per run, across resumes)
        self.warned: list[str] = []
        #: the last epoch's objective checks (:func:`~gpattn_ppl.infer.objective_checks`)
        self.last_checks: dict[str, str] = {}

    # -- persistence ----------------------------------------------------------------------------
    def _state(self) -> dict:
        return {"model": self.net.state_dict(), "optimizer": self.optimizer.state_dict(),
                "scheduler": self.scheduler.state_dict(), "epoch": self.epoch,
                "history": self.history, "step_losses": self.step_losses, "best": self.best,
                "rng": rng_state(), "config": self.cfg, "warned": self.warned}

    def _write_static(self) -> None:
        """``config.yaml``, ``run.json`` and ``encoder.json`` (after the folder check)."""
        if self.action == "fresh":
            clear_run_files(self.run_dir)
        self.run_dir.mkdir(parents=True, exist_ok=True)
        for orphan in self.run_dir.glob(".*.tmp"):  # left by a process killed mid-write
            orphan.unlink(missing_ok=True)
        # a resumed run keeps the files it has (the check found them equal); a run killed while
        # writing them gets the missing ones
        text = yaml.safe_dump(dict(self.cfg), sort_keys=False)
        writers = {
            "config.yaml": lambda p: atomic_write(p, lambda fh: fh.write(text), binary=False),
            "run.json": lambda p: write_json_atomic(_manifest(self.bundle), p),
            "encoder.json": lambda p: write_json_atomic(self.bundle.encoder_state, p)}
        for name, write in writers.items():
            if not (self.action == "resume" and (self.run_dir / name).is_file()):
                write(self.run_dir / name)

    def _check_folder_alive(self) -> None:
        if not (self.run_dir / "config.yaml").is_file():
            raise RunFolderError(f"{self.run_dir}/config.yaml disappeared during training (the "
                                 "run folder was deleted or moved); stopping rather than "
                                 "writing a run without its config")

    def resume(self) -> bool:
        """Restore ``last.pt`` if the run directory has one; returns whether it did."""
        path = self.run_dir / "last.pt"
        if not path.exists():
            return False
        state = load_checkpoint(path, map_location=self.device)
        saved = state.get("config", {})
        try:        # keys added to the schema since the run was written get their defaults
            saved = dict(validate_config(saved))
        except ConfigError:
            pass    # compared as written: the differences name what no longer validates
        diff = config_differences(saved, self.cfg)
        if diff:
            raise CheckpointError(f"{path} was written for a different config ("
                                  + "; ".join(diff) + "); use another --out folder or --force")
        self.net.load_state_dict(state["model"])
        self.optimizer.load_state_dict(state["optimizer"])
        self.scheduler.load_state_dict(state["scheduler"])
        self.epoch, self.history = state["epoch"], state["history"]
        self.step_losses, self.best = state["step_losses"], state["best"]
        self.warned = list(state.get("warned", []))
        set_rng_state(state["rng"])
        return True

    # -- training -------------------------------------------------------------------------------
    def _calibrate(self) -> None:
        """Fit the units swapped into a pretrained encoder to the layers they replaced, on one
        seeded training batch (fresh runs only; a resumed run restores them), and write the
        swap report with the step-0 gaps to ``swap.json``."""
        gen = torch.Generator().manual_seed(self.cfg["train"]["seed"] * 1_000_003 + 999_983)
        idx = torch.randperm(self.num_data, generator=gen)[: self.cfg["data"]["batch_size"]]
        b = self.bundle.train.batch(idx).to(self.device)
        records = self.net.calibrate(b.x, b.mask)
        if records:
            self._step0_terms(b, records)
        if self.rank == 0 and records:
            write_json_atomic(records, self.run_dir / "swap.json")

    def _step0_terms(self, b, records: list[dict]) -> None:
        """Add to each swap record the cross-entropy and the unit's unweighted objective terms
        of one training-mode draw on the calibration batch (:func:`step0_terms`), and their
        ratio: how far a weight of 1 lets a term dominate the first steps
        (``docs/derivations/pretrained_init.rst``, "Objective terms at step 0"). The random state
        is restored, so the run draws what it would draw without this measurement."""
        state = rng_state()
        try:
            ce, terms = step0_terms(self.net, b.x, b.mask, b.y)
        finally:
            set_rng_state(state)
        for r in records:
            mine = {k[len(r["path"]) + 1:]: v for k, v in terms.items()
                    if k.startswith(r["path"] + ".")}
            r["step0"] = {"cross_entropy": round(ce, 4),
                          "terms": {k: float(f"{v:.4g}") for k, v in mine.items()},
                          "ratio_to_cross_entropy": {k: float(f"{v / ce:.4g}")
                                                     for k, v in mine.items() if ce > 0}}

    def _batches(self, generator: torch.Generator):
        """This rank's training batches of the current epoch, drawn lazily from ``generator``."""
        bs = self.cfg["data"]["batch_size"]
        # every rank draws the same permutation and takes its own shard of it
        order = torch.randperm(self.num_data, generator=generator)[self.rank::self.world]
        for start in range(0, len(order), bs):
            yield self.bundle.train.batch(order[start:start + bs], train=True,
                                          generator=generator).to(self.device)

    def train_epoch(self, progress=None) -> dict:
        """One pass over the training split; returns mean loss, cross-entropy and objective
        terms, and keeps the pass's objective checks in ``last_checks``.

        :raises DivergenceError: the training went non-finite (names the epoch as numbered in
            the history, the step and the term).
        """
        t = self.cfg["train"]
        gen = torch.Generator().manual_seed(t["seed"] * 1_000_003 + self.epoch)
        self.last_checks = {}
        return fit_epoch(self.program, self.optimizer, self._batches(gen),
                         scheduler=self.scheduler, grad_clip=t["grad_clip"],
                         clock=epoch_clock(self.epoch, self.steps_per_epoch), progress=progress,
                         step_losses=self.step_losses, epoch=self.epoch + 1,
                         checks=self.last_checks)

    def _numerics_row(self) -> dict:
        """This epoch's jitter escalations and the objective checks not warned about before in
        this run (warned now, once each), as history entries."""
        stats = linalg.numerics_stats()
        row = {"numerics/escalations": stats["escalations"],
               "numerics/max_jitter": stats["max_jitter"]}
        if stats["by_where"]:
            row["numerics/by_where"] = stats["by_where"]
        new = [(k, m) for k, m in self.last_checks.items() if k not in self.warned]
        for key, message in new:
            self.warned.append(key)
            if self.rank == 0:
                warnings.warn(f"epoch {self.epoch + 1}: {message}", NumericsWarning, stacklevel=3)
        if new:
            row["warnings"] = [f"epoch {self.epoch + 1}: {m}" for _, m in new]
        return row

    def validate(self) -> dict:
        """Metrics of the current model on the validation split: ``train.val_mc_samples`` MC
        passes (None: ``eval.mc_samples``, as in evaluation)."""
        T = self.cfg["train"]["val_mc_samples"] or self.cfg["eval"]["mc_samples"]
        devices = [self.device] if self.device.type == "cuda" else []
        # validation draws (MC passes, the sampled "y" site) must not move the training RNG
        with torch.random.fork_rng(devices=devices):
            torch.manual_seed(self.cfg["train"]["seed"] + 7919 * self.epoch)
            pred = predict(self.program, self.bundle.val, num_samples=T,
                           batch_size=self.cfg["data"]["eval_batch_size"], device=self.device)
        return classification_report(pred["probs"], pred["labels"], logits=pred["logits"],
                                     metrics=list(VALIDATION_METRICS))

    def fit(self) -> dict:
        """Train (resuming if possible), keep the best validation checkpoint, then evaluate it."""
        from tqdm.auto import tqdm

        if self.rank == 0:
            self._write_static()
        barrier(self.world)
        # a process killed between last.pt and the logs left them an epoch behind the checkpoint
        # (after the last epoch no later epoch rewrites them): rewrite them from the checkpoint
        if self.action == "resume" and self.resume() and self.rank == 0:
            self._write_logs()
        if self.epoch == 0 and hasattr(self.net, "calibrate") and not self.cfg["train"]["init_from"]:
            self._calibrate()
        linalg.reset_numerics_stats(warned=True)  # each place warns once in this run
        t = self.cfg["train"]
        higher = HIGHER_IS_BETTER.get(self.select_metric, True)
        bar = tqdm(total=self.steps_per_epoch * t["epochs"], initial=self.steps_per_epoch * self.epoch,
                   disable=not t["progress"] or self.rank != 0, desc=self.label, leave=False)
        try:
            while self.epoch < t["epochs"] and not self.patience_exhausted():
                linalg.reset_numerics_stats()
                start = time.perf_counter()
                train_stats = self.train_epoch(bar)
                seconds = time.perf_counter() - start
                reruns = train_stats.pop("checked_reruns", 0)
                start = time.perf_counter()
                val = self.validate()
                val_seconds = time.perf_counter() - start
                score = val[self.select_metric]
                better = (self.best["score"] is None
                          or (score > self.best["score"] if higher else score < self.best["score"]))
                row = {"epoch": self.epoch + 1, "seconds": seconds, "val_seconds": val_seconds,
                       "lr": self.scheduler.get_last_lr()[0],
                       **train_stats, **{f"val/{k}": v for k, v in val.items()},
                       **self._numerics_row(), "numerics/checked_reruns": reruns}
                self.history.append(row)
                self.epoch += 1
                if self.rank == 0:
                    self._check_folder_alive()
                if better:
                    self.best = {"epoch": self.epoch, "score": score}
                    if self.rank == 0:
                        save_atomic({"model": self.net.state_dict(), "epoch": self.epoch,
                                     "score": score, "config": self.cfg}, self.run_dir / "best.pt")
                if self.rank == 0:
                    save_atomic(self._state(), self.run_dir / "last.pt")
                    self._write_logs()
                barrier(self.world)
                bar.set_postfix(loss=f"{train_stats['loss']:.3f}",
                                **{self.select_metric: f"{score:.3f}"})
        finally:
            bar.close()
        return self.evaluate()

    def patience_exhausted(self) -> bool:
        """True when ``train.patience`` epochs have passed since the best validation score
        (early stopping; also on resume, so a stopped run does not train again)."""
        p = self.cfg["train"]["patience"]
        return p is not None and self.best["epoch"] > 0 and self.epoch - self.best["epoch"] >= p

    def _write_logs(self) -> None:
        """``history.json`` (every entry) and ``log.csv`` (the scalar ones: no warnings or
        per-place escalation counts)."""
        write_json_atomic(self.history, self.run_dir / "history.json")
        keys = sorted({k for row in self.history for k, v in row.items()
                       if not isinstance(v, (list, dict))}, key=lambda k: (k != "epoch", k))

        def write(fh):
            w = csv.DictWriter(fh, fieldnames=keys, extrasaction="ignore")
            w.writeheader()
            w.writerows(self.history)

        atomic_write(self.run_dir / "log.csv", write, binary=False)

    # -- evaluation -----------------------------------------------------------------------------
    def evaluate(self, ood: list[str] | None = None) -> dict:
        """Evaluate ``best.pt`` on test and OOD sets; writes ``results.json`` and predictions."""
        return _evaluate_best(self.run_dir, self.cfg, self.bundle, self.net, self.program,
                              self.device, self.rank, history=self.history,
                              select_metric=self.select_metric, warm_start=self.warm_start,
                              ood=ood)


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


def _manifest(bundle) -> dict:
    from .._version import __version__

    return {"format": MANIFEST_FORMAT, "gpattn_ppl": __version__,
            "created": time.strftime("%Y-%m-%dT%H:%M:%S%z"), "sizes": data_sizes(bundle),
            "classes": list(bundle.classes) if bundle.classes is not None
            else [str(k) for k in range(bundle.num_classes)],
            "data": {"name": bundle.name, "protocol": bundle.protocol,
                     "fingerprint": bundle.fingerprint,
                     "split_sizes": bundle.info.get("sizes", {})},
            "plugins": imported_plugins()}


def _check_same_data(run_dir: Path, bundle) -> None:
    """The data (and its encoding) a run was trained on is the data loaded now."""
    manifest = read_manifest(run_dir)
    saved = manifest.get("data", {}).get("fingerprint")
    if saved != bundle.fingerprint:
        raise RunFolderError(
            f"{run_dir}: the data changed since this run was trained (fingerprint {saved} in "
            f"run.json, {bundle.fingerprint} now: files edited, another split or limit); "
            "train into another folder, or --force to retrain here")
    enc = run_dir / "encoder.json"
    if enc.is_file() and json.loads(enc.read_text()) != strict(bundle.encoder_state):
        raise RunFolderError(f"{run_dir}: the input encoding (vocabulary / encoder settings) "
                             "differs from encoder.json; retrain or use another folder")


def _model_and_program(cfg: dict, sizes, num_data: int, device, world: int):
    """The network on ``device`` (warm-started if ``train.init_from``), the warm-start report,
    and its Pyro program (forward through DDP when ``world > 1``)."""
    t = cfg["train"]
    net = build_net(cfg, sizes).to(device)
    warm_start = init_from(net, t["init_from"]) if t["init_from"] else None
    program = PyroProgram(net, num_data, t["objective"], mode=t["mode"],
                          total_epochs=t["epochs"])
    if world > 1:
        from torch.nn.parallel import DistributedDataParallel

        ids = [device.index] if device.type == "cuda" else None
        program.forward_module = DistributedDataParallel(net, device_ids=ids)
    return net, warm_start, program


def _evaluate_best(run_dir: Path, cfg: dict, bundle, net, program, device, rank: int, *,
                   history: list, select_metric: str, warm_start: dict | None,
                   ood: list[str] | None, data_warning: str | None = None) -> dict:
    """Load ``best.pt`` into ``net``, evaluate, write ``results.json``, ``predictions.pt`` and
    (with temperature scaling) ``calibration.json``."""
    state = load_checkpoint(run_dir / "best.pt", map_location=device)
    net.load_state_dict(state["model"])
    # the MC passes of the evaluation are seeded: train and a later evaluate give equal numbers
    devices = [device] if device.type == "cuda" else []
    linalg.reset_numerics_stats()
    start = time.perf_counter()
    with torch.random.fork_rng(devices=devices):
        torch.manual_seed(cfg["train"]["seed"] + 104_729)
        results = evaluate_model(program, bundle, cfg, device, ood=ood)
    eval_seconds = time.perf_counter() - start
    numerics = _numerics_summary(history, linalg.numerics_stats())
    results["warnings"] += [w for r in history for w in r.get("warnings", [])]
    if numerics["escalations"]:
        places = ", ".join(f"{w} ({n})" for w, n in numerics["by_where"].items())
        results["warnings"].append(
            f"numerics: {numerics['escalations']} Cholesky jitter escalation(s), largest jitter "
            f"{numerics['max_jitter']:.0e}, in {places} (near-singular kernel matrices)")
    seconds = [r["seconds"] for r in history]
    score = state.get("score")
    if score is None:  # best.pt of an older version: the score is in the history
        score = next((r.get(f"val/{select_metric}") for r in history
                      if r["epoch"] == state["epoch"]), None)
    if data_warning is not None:
        results["warnings"].append(f"evaluated on changed data: {data_warning}")
    results["best_epoch"] = state["epoch"]
    results["eval"] = dict(cfg["eval"])  # the settings these numbers were computed with
    results["selection"] = {"metric": select_metric, "split": "val", "score": score}
    val_seconds = [r.get("val_seconds") for r in history]
    timed = bool(history) and None not in val_seconds      # runs of older versions: untimed
    results["cost"] = {"sec_per_epoch": sum(seconds) / max(len(seconds), 1),
                       "peak_mem_mb": peak_memory_mb(device),
                       "params": sum(p.numel() for p in net.parameters()),
                       "epochs": len(history), "numerics": numerics,
                       # the whole run: training passes + validations + this evaluation
                       "eval_seconds": eval_seconds,
                       "run_seconds": (sum(seconds) + sum(val_seconds) + eval_seconds
                                       if timed else None)}
    if warm_start is not None:
        results["warm_start"] = {"source": warm_start["source"],
                                 "loaded": len(warm_start["loaded"])}
    preds = results.pop("_predictions")
    if rank == 0:
        save_atomic(preds, run_dir / "predictions.pt")
        calibration = run_dir / "calibration.json"
        if "temperature_scaling" in results:
            write_json_atomic(results["temperature_scaling"], calibration)
        else:
            calibration.unlink(missing_ok=True)
        write_json_atomic(results, run_dir / "results.json")
    return strict(results)


def _numerics_summary(history: list, evaluation: dict) -> dict:
    """Jitter escalations of the run: the history's per-epoch counts plus the evaluation's
    (:func:`gpattn_ppl.linalg.numerics_stats`), with the largest jitter and the places."""
    by_where: dict[str, int] = {}
    for part in [r.get("numerics/by_where", {}) for r in history] + [evaluation["by_where"]]:
        for where, n in part.items():
            by_where[where] = by_where.get(where, 0) + n
    training = sum(r.get("numerics/escalations", 0) for r in history)
    return {"escalations": training + evaluation["escalations"],
            "max_jitter": max([r.get("numerics/max_jitter", 0.0) for r in history]
                              + [evaluation["max_jitter"]]),
            "training_escalations": training, "by_where": by_where}


def evaluate_run(run_dir: str | Path, ood: list[str] | None = None,
                 overrides: list[str] | None = None, *, allow_changed_data: bool = False
                 ) -> dict:
    """Re-evaluate a finished run folder (``gpattn-ppl evaluate``): its config, data, model,
    ``best.pt`` and program; no optimiser is built and ``last.pt`` is not needed. Rewrites
    ``results.json`` and ``predictions.pt``.

    :param overrides: ``--set`` overrides of the ``eval`` section (e.g.
        ``eval.temperature_scaling=true``, ``eval.mc_samples=20``) and of ``train.device`` (a
        run trained on a GPU evaluated on a machine without one: ``train.device=cpu``).
    :param allow_changed_data: evaluate even if the data's fingerprint differs from the one
        stored at training (the results then carry a warning saying so).
    :raises RunFolderError: not a run folder, or its data changed since training.
    """
    from .plugins import import_plugins

    run_dir = Path(run_dir)
    manifest = read_manifest(run_dir)
    import_plugins(manifest.get("plugins", []))
    bad = [o for o in overrides or []
           if not o.strip().startswith(("eval.", "train.device="))]
    if bad:
        raise ConfigError(f"evaluate --set changes the eval section and train.device only; "
                          f"got {bad}")
    cfg = dict(load_config(run_dir / "config.yaml", overrides))
    check_device_available(cfg["train"]["device"])
    rank, world = init_distributed()
    device = select_device(cfg["train"]["device"], rank)
    seed_everything(cfg["train"]["seed"])
    bundle = load_bundle(cfg)
    changed = None
    try:
        _check_same_data(run_dir, bundle)
    except RunFolderError as err:
        if not allow_changed_data:
            raise RunFolderError(f"{err} (evaluate --allow-changed-data evaluates anyway)"
                                 ) from None
        changed = str(err)
    if ood is not None:
        check_ood_names(ood, bundle, "evaluate --ood")
    else:
        check_ood_names(cfg["eval"]["ood"], bundle)
    select_metric = selection_metric(cfg, bundle)
    net, warm_start, program = _model_and_program(cfg, bundle, len(bundle.train), device, world)
    history_path = run_dir / "history.json"
    history = json.loads(history_path.read_text()) if history_path.is_file() else []
    return _evaluate_best(run_dir, cfg, bundle, net, program, device, rank, history=history,
                          select_metric=select_metric, warm_start=warm_start, ood=ood,
                          data_warning=changed)
