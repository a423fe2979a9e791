"""Training one run into a run folder: :class:`Trainer` (fit, validate, checkpoint, resume).

One run folder holds everything (:mod:`~gpattn_ppl.run.rundir` lists the files and states the
rules: a folder that holds a run is refused unless ``resume`` (same config only) or ``force``
(which removes only the files the run's manifest lists); a process holds the folder's lock
from the check to the end of :meth:`Trainer.fit`). The run is assembled by
:mod:`~gpattn_ppl.run.assembly` and its results written by :mod:`~gpattn_ppl.run.results`.

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
import math
import sys
import time
import warnings
from pathlib import Path

import torch
import yaml

from .. import linalg
from ..errors import NumericsWarning
from ..infer import (
    atomic_write,
    fit_epoch,
    grad_scaler,
    lr_lambda,
    predict,
    rng_state,
    save_atomic,
    set_rng_state,
    variance_budget,
)
from ..metrics import HIGHER_IS_BETTER, classification_report
from ..ppl import SiteContext, site_context
from .assembly import (
    check_same_data,
    load_bundle,
    model_and_program,
    new_manifest,
    parameter_groups,
    selection_metric,
)
from .budget import BudgetPlan, plan_budget
from .config import VALIDATION_METRICS, Config, check_device_available, load_config
from .evaluate import check_ood_names
from .results import evaluate_best
from .rundir import (
    RUN_FILES,
    RunFolderError,
    acquire_lock,
    check_run_folder,
    clear_run_files,
    write_json_atomic,
)
from .runfolder import written_run
from .runtime import (
    RunMemory,
    barrier,
    init_distributed,
    is_terminal,
    seed_everything,
    select_device,
)

__all__ = ["Trainer", "resident_data", "step0_terms"]


def _truncate_events(folder: Path, step: int, *, root: Path) -> list[Path]:
    """Rewrite each TensorBoard event file in ``folder`` without its events at ``step`` or
    later (the file-version record kept), atomically and never through a link
    (:func:`gpattn_ppl.safe_files.write_atomic`); returns the files rewritten. A file cut short
    by a kill keeps its complete records."""
    import io

    from tensorboard.backend.event_processing.event_file_loader import RawEventFileLoader
    from tensorboard.compat.proto import event_pb2
    from tensorboard.summary.writer.record_writer import RecordWriter

    from ..safe_files import write_atomic

    def kept(record: bytes) -> bool:
        event = event_pb2.Event.FromString(record)
        return event.step < step or event.HasField("file_version")

    rewritten = []
    for path in sorted(folder.glob("events.out.tfevents.*")):
        records = list(RawEventFileLoader(str(path)).Load())
        keep = [r for r in records if kept(r)]
        if len(keep) == len(records):
            continue
        buf = io.BytesIO()
        writer = RecordWriter(buf)
        for record in keep:
            writer.write(record)
        rewritten.append(write_atomic(path, buf.getvalue(), root=root))
    return rewritten


def resident_data(setting: bool | str, device: torch.device) -> bool:
    """Whether the splits are moved to ``device`` once (``data.resident``; ``auto``: on CUDA,
    where a per-batch host gather and copy would leave the GPU waiting)."""
    return device.type == "cuda" if setting == "auto" else bool(setting)


def validation_subset(dataset, limit: int | None, seed: int):
    """The per-epoch validation set: ``dataset`` itself, or (``data.limit_val``) a seeded,
    label-stratified subset of ``limit`` of its examples, in their original order."""
    if limit is None or limit >= len(dataset):
        return dataset
    from ..data.splits import stratified_subset

    keep = stratified_subset(dataset.y.cpu(), limit, seed).sort().values
    return dataset.subset(keep.to(dataset.y.device))


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
        self._t0 = time.perf_counter()  # train.max_minutes counts from here
        self.cfg = _validated(config, overrides)
        check_device_available(self.cfg["train"]["device"])
        self.run_dir = Path(run_dir)
        self.label = label or "/".join(self.run_dir.parts[-2:])
        self.rank, self.world = init_distributed()
        self._lock = None
        self._flags = {"resume": resume, "force": force}
        self.action = self._checked_folder()  # under the lock, released again: fit takes it
        self.close(refused=self.action == "new")
        self._setup(bundle)

    def _checked_folder(self) -> str:
        """Take the folder's lock (rank 0: the writer) and check the folder
        (:func:`~gpattn_ppl.run.rundir.check_run_folder`); on a refusal the lock is released and
        a folder the lock created is removed."""
        if all(self._flags.values()):  # --resume with --force: refused before the lock is taken
            check_run_folder(self.run_dir, self.cfg, **self._flags)
        if self.rank == 0:
            self._lock = acquire_lock(self.run_dir)
        try:
            return check_run_folder(self.run_dir, self.cfg, **self._flags)
        except BaseException:
            self.close(refused=True)
            raise

    def _setup(self, bundle) -> None:
        self.device = select_device(self.cfg["train"]["device"], self.rank)
        seed_everything(self.cfg["train"]["seed"])
        self.bundle = bundle if bundle is not None else load_bundle(self.cfg)
        if resident_data(self.cfg["data"]["resident"], self.device):
            self.bundle = self.bundle.to(self.device)
        # a run killed after run.json, before config.yaml, trained nothing: resuming it is
        # starting it; otherwise run.json (and encoder.json) must say the same data
        if self.action == "resume" and (self.run_dir / "config.yaml").is_file():
            folder = written_run(self.run_dir, self.cfg)  # config.yaml = cfg: the folder check
            enc = folder.encoder_state() if (self.run_dir / "encoder.json").is_file() else None
            check_same_data(folder.manifest, enc, self.bundle, self.run_dir)
        check_ood_names(self.cfg["eval"]["ood"], self.bundle)
        self.select_metric = selection_metric(self.cfg, self.bundle)
        self.net, self.warm_start, self.program = model_and_program(
            self.cfg, self.bundle, len(self.bundle.train), self.device, self.world)
        self.num_data = len(self.bundle.train)
        #: the per-epoch validation set (data.limit_val: a stratified subset of bundle.val)
        self.val_set = validation_subset(self.bundle.val, self.cfg["data"]["limit_val"],
                                         self.cfg["data"]["split_seed"])
        t = self.cfg["train"]
        opt_cls = torch.optim.AdamW if t["optimizer"] == "adamw" else torch.optim.Adam
        # the fused kernel: one pass over all parameters and no host read per parameter (the
        # for-loop implementation reads every step counter with .item(); 9x slower measured)
        self.optimizer = opt_cls(parameter_groups(self.net, t), lr=t["lr"],
                                 weight_decay=t["weight_decay"],
                                 fused=self.device.type in ("cpu", "cuda"))
        #: micro-batches of data.batch_size per epoch, and optimiser steps (train.accumulate
        #: micro-batches each): the schedules count optimiser steps
        self.batches_per_epoch = math.ceil(math.ceil(self.num_data / self.world)
                                           / self.cfg["data"]["batch_size"])
        self.steps_per_epoch = math.ceil(self.batches_per_epoch / t["accumulate"])
        self.scaler = grad_scaler(t["precision"], self.device)
        #: train.max_minutes: the plan made after the first epoch (None: no budget, or not yet)
        self.budget: BudgetPlan | None = None
        self.scheduler = torch.optim.lr_scheduler.LambdaLR(self.optimizer, self._lr_lambda())
        self.epoch, self.history, self.step_losses = 0, [], []
        self.best = {"epoch": -1, "score": None}
        #: keys of the objective checks already warned about (once per run, across resumes)
        self.warned: list[str] = []
        #: the last epoch's objective checks (:func:`~gpattn_ppl.infer.objective_checks`)
        self.last_checks: dict[str, str] = {}
        #: the run's peak memory (a ``RunMemory`` of :mod:`~gpattn_ppl.run.runtime`), from fit's start
        self.memory = None
        #: the TensorBoard writer while fit runs (train.tensorboard, rank 0)
        self._tb = None

    @property
    def epochs(self) -> int:
        """The epochs this run trains: ``train.epochs``, or the budget's ``E'``."""
        return self.cfg["train"]["epochs"] if self.budget is None else self.budget.epochs

    @property
    def compression(self) -> float:
        """``r``: every epoch-denominated schedule runs ``r`` times faster (budget; else 1)."""
        return 1.0 if self.budget is None else self.budget.compression

    def _lr_lambda(self):
        """The learning-rate multiplier per step: warm-up and decay over :attr:`epochs`, the
        warm-up compressed with them (:mod:`~gpattn_ppl.run.budget`)."""
        t = self.cfg["train"]
        warm = int(round(t["warmup_epochs"] / self.compression * self.steps_per_epoch))
        return lr_lambda(t["schedule"], self.steps_per_epoch * self.epochs, warm,
                         t["min_lr"] / t["lr"])

    def _plan_budget(self, epoch_s: float, val_s: float) -> None:
        """After the first epoch: the epochs that fit in ``train.max_minutes``
        (:func:`~gpattn_ppl.run.budget.plan_budget`) and the compressed schedules."""
        t, e = self.cfg["train"], self.cfg["eval"]
        b = self.bundle
        n_val = len(self.val_set)  # validated per epoch; the evaluation predicts all of b.val
        names = e["ood"] if e["ood"] is not None else list(b.ood)
        n_eval = len(b.val) + len(b.test) + sum(len(b.ood[n]) for n in names)
        T_val = t["val_mc_samples"] or e["mc_samples"]
        eval_s = val_s * n_eval / n_val * (e["mc_samples"] / T_val if self.net.stochastic else 1)
        now = time.perf_counter() - self._t0
        plan = [plan_budget(t["max_minutes"], t["epochs"], elapsed_s=now, epoch_s=epoch_s,
                            setup_s=now - epoch_s, eval_estimate_s=eval_s)]
        if self.world > 1:  # every rank trains rank 0's number of epochs
            import torch.distributed as dist

            dist.broadcast_object_list(plan, src=0)
        self.budget = plan[0]
        self.scheduler.lr_lambdas[0] = self._lr_lambda()

    def close(self, *, refused: bool = False) -> None:
        """Release the run folder's lock (:meth:`fit` does at its end); ``refused``: nothing was
        written, so the lock file and a folder the lock created (if empty) are removed again."""
        if self._lock is not None:
            self._lock.release(remove=refused)
            self._lock = None

    def __del__(self) -> None:
        lock = getattr(self, "_lock", None)
        if lock is not None:
            lock.release()

    # -- persistence ----------------------------------------------------------------------------
    def _state(self) -> dict:
        return {"model": self.net.state_dict(), "optimizer": self.optimizer.state_dict(),
                "scheduler": self.scheduler.state_dict(), "epoch": self.epoch,
                "history": self.history, "step_losses": self.step_losses, "best": self.best,
                "rng": rng_state(), "config": self.cfg, "warned": self.warned,
                "scaler": None if self.scaler is None else self.scaler.state_dict(),
                "budget": None if self.budget is None else self.budget.as_dict()}

    def _write_static(self) -> None:
        """``run.json`` (first: it lists every file the run may write), ``config.yaml`` and
        ``encoder.json`` (after the folder check, under the lock)."""
        if self.action == "fresh":
            clear_run_files(self.run_dir)
        self.run_dir.mkdir(parents=True, exist_ok=True)
        for name in RUN_FILES:  # temporaries left by a process killed mid-write
            for orphan in self.run_dir.glob(f".{name}.*.tmp"):
                orphan.unlink(missing_ok=True)
        # a resumed run keeps the files it has (the check found them equal); a run killed while
        # writing them gets the missing ones
        text = yaml.safe_dump(dict(self.cfg), sort_keys=False)
        writers = {
            "run.json": lambda p: write_json_atomic(new_manifest(self.bundle, self.warm_start),
                                                    p),
            "config.yaml": lambda p: atomic_write(p, lambda fh: fh.write(text), binary=False),
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
        # weights only, its config checked against config.yaml (= this config: the folder check)
        state = written_run(self.run_dir, self.cfg).load_weights(self.net, "last.pt",
                                                                 map_location=self.device)
        self.optimizer.load_state_dict(state["optimizer"])
        self.scheduler.load_state_dict(state["scheduler"])
        self.epoch, self.history = state["epoch"], state["history"]
        self.step_losses, self.best = state["step_losses"], state["best"]
        self.warned = list(state.get("warned", []))
        if state.get("budget") is not None:  # the plan of the first epoch stays
            self.budget = BudgetPlan(**state["budget"])
            self.scheduler.lr_lambdas[0] = self._lr_lambda()
        if self.scaler is not None and state.get("scaler") is not None:
            self.scaler.load_state_dict(state["scaler"])
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
            self._warn_dominating(r["path"], mine, ce)

    def _warn_dominating(self, path: str, terms: dict[str, float], ce: float) -> None:
        """Warn when a unit's objective term, at the largest weight its schedule reaches, starts
        above the cross-entropy (e.g. KEP-SVGP's KL at 349x with weight 1): the first steps
        would fit the regulariser, not the labels. The message gives the step-0 rule's weight
        (:func:`~gpattn_ppl.hf.trainer.step0_weight`, what ``SwappedTrainer`` applies itself)."""
        from ..hf.trainer import step0_weight
        from ..ppl.objective import OBJECTIVE_WEIGHTS

        if self.rank != 0 or not ce > 0:
            return
        for name, value in terms.items():
            term = name.removesuffix("_global")
            sched = (self.program.unit_schedules.get(path, {}).get(term)
                     or self.program.schedules.get(term))
            if sched is None or not math.isfinite(value):
                continue
            w = max(sched.start, sched.end)
            if w * value > ce:
                key = OBJECTIVE_WEIGHTS.get(term, (term,))[0]
                warnings.warn(
                    f"{path}: its {name} term starts at {value / ce:.3g}x the cross-entropy "
                    f"({value:.4g} against {ce:.4g}) and its weight reaches {w:g}, so the first "
                    f"steps fit the regulariser, not the labels; the step-0 rule gives "
                    f"{key}: {step0_weight(ce, value):g} (set it in the swap entry's objective "
                    "or train.objective; docs/derivations/pretrained_init.rst)",
                    NumericsWarning, stacklevel=2)

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
        # epoch hooks of the network (an SNGP head resets / combines its precision)
        getattr(self.net, "on_train_epoch_start", lambda: None)()
        # the program's clock (objective-weight schedules), compressed under a budget
        r, e, spe = self.compression, self.epoch, self.steps_per_epoch
        on_step = None
        if self._tb is not None:
            writer = self._tb

            def on_step(i: int, loss: float) -> None:
                writer.add_scalar("train/step_loss", loss, e * spe + i + 1)

        stats = fit_epoch(self.program, self.optimizer, self._batches(gen),
                          scheduler=self.scheduler, grad_clip=t["grad_clip"],
                          clock=lambda i: r * (e + i / spe), progress=progress,
                          step_losses=self.step_losses, epoch=self.epoch + 1,
                          checks=self.last_checks, precision=t["precision"], scaler=self.scaler,
                          accumulate=t["accumulate"], on_step=on_step)
        getattr(self.net, "on_train_epoch_end", lambda: None)()
        return stats

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
        """Metrics of the current model on the validation split (``data.limit_val``: its
        stratified subset, ``val_set``): ``train.val_mc_samples`` MC passes (None:
        ``eval.mc_samples``, as in evaluation), or the posterior-mean pass of
        ``eval.predictive: mean``."""
        T = self.cfg["train"]["val_mc_samples"] or self.cfg["eval"]["mc_samples"]
        devices = [self.device] if self.device.type == "cuda" else []
        # validation draws (MC passes, the sampled "y" site) must not move the training RNG
        with torch.random.fork_rng(devices=devices):
            torch.manual_seed(self.cfg["train"]["seed"] + 7919 * self.epoch)
            pred = predict(self.program, self.val_set, num_samples=T,
                           batch_size=self.cfg["data"]["eval_batch_size"], device=self.device,
                           precision=self.cfg["train"]["precision"],
                           mean=self.cfg["eval"]["predictive"] == "mean")
        report = classification_report(pred["probs"], pred["labels"], logits=pred["logits"],
                                       metrics=list(VALIDATION_METRICS))
        if self.cfg["train"]["track_uncertainty"]:
            report.update(self._budget_entries())
        return report

    def _budget_entries(self) -> dict:
        """The variance budget on the first 256 validation examples, flattened to
        ``budget/<path>/<key>`` and ``budget/<key>`` history entries (the RNG restored)."""
        b = variance_budget(self.program, self.val_set, num_samples=16, limit=256,
                            device=self.device, seed=self.cfg["train"]["seed"])
        out = {f"budget/{k}": b[k] for k in ("features_rel_var", "logit_std", "mutual_info")}
        for path, row in b["units"].items():
            out.update({f"budget/{path}/{k}": v for k, v in row.items() if k != "kind"})
        return out

    def fit(self) -> dict:
        """Train (resuming if possible), keep the best validation checkpoint, then evaluate it;
        the run folder's lock is held throughout."""
        # the lock is held from here to the end; the folder must be as the constructor found it
        action = self._checked_folder()
        if action != self.action:
            self.close()
            raise RunFolderError(f"{self.run_dir} changed since this Trainer was built (another "
                                 f"process wrote it: {action!r}, was {self.action!r}); build "
                                 "the Trainer again")
        try:
            return self._fit()
        finally:
            self.close()

    def _fit(self) -> dict:
        from tqdm.auto import tqdm

        self.memory = RunMemory(self.device).start()  # the run's own peak, from here
        try:
            if self.rank == 0:
                self._write_static()
            return self._train_and_evaluate(tqdm)
        finally:
            self.memory.stop()
            if self._tb is not None:
                self._tb.close()
                self._tb = None

    def _open_tensorboard(self) -> None:
        """``RUN_DIR/tensorboard`` (listed in the manifest first; a real folder, not a link) and
        its writer. A resumed run is truncated to its checkpoint: the event files lose every
        event from the first step after ``last.pt`` on (``_truncate_events``, so any reader
        agrees), and the new writer purges from that step (``purge_step``): the steps a killed
        process logged past ``last.pt`` never appear twice."""
        from torch.utils.tensorboard import SummaryWriter

        from ..safe_files import ensure_dir
        from .rundir import record_files

        record_files(self.run_dir, ["tensorboard/"])
        folder = ensure_dir(self.run_dir / "tensorboard", root=self.run_dir)
        purge = None
        if self.action == "resume":
            # step-level scalars count optimizer steps, epoch-level ones epochs (<= the steps)
            purge = self.epoch * self.steps_per_epoch + 1
            _truncate_events(folder, purge, root=self.run_dir)
        self._tb = SummaryWriter(log_dir=str(folder), purge_step=purge)

    def _log_tensorboard(self, row: dict) -> None:
        """One epoch's scalars: the loss, each objective term and its weighted share
        (``train/``), the learning
        rate, the numerics counters, the validation metrics (``val/``) and the seconds."""
        names = {"loss": "train/loss", "nll": "train/nll", "lr": "train/lr",
                 "seconds": "time/train_seconds", "val_seconds": "time/val_seconds"}
        for key, value in row.items():
            if key == "epoch" or isinstance(value, (bool, list, dict, str)) or value is None:
                continue
            tag = names.get(key, f"train/{key}" if key.startswith(("term/", "share/")) else key)
            self._tb.add_scalar(tag, value, row["epoch"])
        self._tb.flush()

    def validates(self, epoch: int) -> bool:
        """Whether 1-based ``epoch`` is validated: every ``train.val_every``-th, the last, and
        under ``train.max_minutes`` the first (its time plans the budget)."""
        t = self.cfg["train"]
        return (epoch % t["val_every"] == 0 or epoch >= self.epochs
                or (t["max_minutes"] is not None and self.budget is None))

    def _epoch_line(self, row: dict, validated: bool) -> None:
        """One line per epoch on stderr (when no progress bar is drawn)."""
        val = (f"val {self.select_metric} {row[f'val/{self.select_metric}']:.4f}"
               if validated else "not validated")
        best = " (best)" if validated and self.best["epoch"] == row["epoch"] else ""
        print(f"{self.label} epoch {row['epoch']}/{self.epochs}: loss {row['loss']:.4f}, "
              f"{val}{best}, {row['seconds']:.1f} s train + {row['val_seconds']:.1f} s val",
              file=sys.stderr, flush=True)

    def _train_and_evaluate(self, tqdm) -> dict:
        barrier(self.world)
        # a process killed between last.pt and the logs left them an epoch behind the checkpoint
        # (after the last epoch no later epoch rewrites them): rewrite them from the checkpoint
        if self.action == "resume" and self.resume() and self.rank == 0:
            self._write_logs()
        if self.rank == 0 and self.cfg["train"]["tensorboard"]:
            self._open_tensorboard()  # after the resume: it purges the steps past last.pt
        if self.epoch == 0 and hasattr(self.net, "calibrate") and not self.cfg["train"]["init_from"]:
            self._calibrate()
        linalg.reset_numerics_stats(warned=True)  # each place warns once in this run
        t = self.cfg["train"]
        higher = HIGHER_IS_BETTER.get(self.select_metric, True)
        # a bar only where it can be drawn (a terminal, or a notebook's widget); a redirected
        # log gets one line per epoch instead
        show_bar = (t["progress"] and self.rank == 0
                    and (is_terminal() or "ipykernel" in sys.modules))
        lines = self.rank == 0 and not show_bar
        bar = tqdm(total=self.steps_per_epoch * self.epochs, initial=self.steps_per_epoch * self.epoch,
                   disable=not show_bar, desc=self.label, leave=False)
        try:
            while self.epoch < self.epochs and not self.patience_exhausted():
                linalg.reset_numerics_stats()
                epoch_start = start = time.perf_counter()
                train_stats = self.train_epoch(bar)
                seconds = time.perf_counter() - start
                reruns = train_stats.pop("checked_reruns", 0)
                validated = self.validates(self.epoch + 1)
                start = time.perf_counter()
                val = self.validate() if validated else {}
                val_seconds = time.perf_counter() - start if validated else 0.0
                score = val.get(self.select_metric)
                better = validated and (
                    self.best["score"] is None
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
                    if self._tb is not None:
                        self._log_tensorboard(row)
                barrier(self.world)
                if t["max_minutes"] is not None and self.budget is None:
                    self._plan_budget(time.perf_counter() - epoch_start, val_seconds)
                    bar.total = self.steps_per_epoch * self.epochs
                if lines:
                    self._epoch_line(row, validated)
                post = {"loss": f"{train_stats['loss']:.3f}"}
                if validated:
                    post[self.select_metric] = f"{score:.3f}"
                bar.set_postfix(**post)
            return self.evaluate()
        finally:
            bar.close()

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
        return evaluate_best(written_run(self.run_dir, self.cfg), self.cfg, self.bundle, self.net,
                             self.program, self.device, self.rank, history=self.history,
                             select_metric=self.select_metric, ood=ood,
                             budget=None if self.budget is None else self.budget.as_dict(),
                             memory=self.memory)
