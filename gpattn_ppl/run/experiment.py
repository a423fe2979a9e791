"""One run: config -> data -> model -> fit -> evaluate, into a run folder.

One run directory holds everything: ``config.yaml`` (resolved), ``tokenizer.json``,
``last.pt`` (atomic, every epoch: model, optimiser, scheduler, RNG states, history),
``best.pt`` (the model with the best *validation* score), ``log.csv`` / ``history.json`` (per
epoch), ``results.json`` (test and OOD metrics of the best model) and ``predictions.pt``.

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
from pathlib import Path

import torch
import yaml

from ..infer import (
    CheckpointError,
    PyroProgram,
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
from .config import Config, load_config
from .evaluate import evaluate_model
from .runtime import barrier, init_distributed, peak_memory_mb, seed_everything, select_device

__all__ = ["VALIDATION_METRICS", "Trainer", "build_net", "evaluate_run", "load_bundle",
           "selection_metric"]

#: the metrics of the per-epoch validation report; ``train.select_metric`` picks one of them.
VALIDATION_METRICS = ("acc", "mcc", "nll", "ece", "brier")


def _validated(config, overrides: list[str] | None) -> dict:
    """The validated config as a plain dict: a :class:`Config` as it is, anything else (a YAML
    path, a partial dict) through :func:`load_config` once."""
    if isinstance(config, Config) and not overrides:
        return copy.deepcopy(dict(config))
    return dict(load_config(config, overrides))


class Trainer:
    """Train one configuration into ``run_dir`` and evaluate its best checkpoint.

    :param config: a validated :class:`~gpattn_ppl.run.config.Config` (used as it is), or a config
        dict or YAML path (validated here, once, by :func:`~gpattn_ppl.run.config.load_config`).
    :param run_dir: output folder; an existing ``last.pt`` there is resumed.
    :param overrides: ``--set`` style overrides.
    :param bundle: a pre-loaded :class:`~gpattn_ppl.data.DataBundle` (skips loading).
    """

    def __init__(self, config, run_dir: str | Path, *, overrides: list[str] | None = None,
                 bundle=None) -> None:
        self.cfg = _validated(config, overrides)
        self.run_dir = Path(run_dir)
        self.rank, self.world = init_distributed()
        self.device = select_device(self.cfg["train"]["device"], self.rank)
        seed_everything(self.cfg["train"]["seed"])
        self.bundle = bundle if bundle is not None else load_bundle(self.cfg)
        self.select_metric = selection_metric(self.cfg, self.bundle)
        self.net, self.warm_start, self.program = _model_and_program(
            self.cfg, self.bundle, self.device, self.world)
        self.num_data = len(self.bundle.train)
        t = self.cfg["train"]
        params = [p for p in self.net.parameters() if p.requires_grad]
        opt_cls = torch.optim.AdamW if t["optimizer"] == "adamw" else torch.optim.Adam
        self.optimizer = opt_cls(params, lr=t["lr"], weight_decay=t["weight_decay"])
        self.steps_per_epoch = math.ceil(math.ceil(self.num_data / self.world)
                                         / self.cfg["data"]["batch_size"])
        total = self.steps_per_epoch * t["epochs"]
        warm = int(round(t["warmup_epochs"] * self.steps_per_epoch))
        self.scheduler = torch.optim.lr_scheduler.LambdaLR(
            self.optimizer, lr_lambda(t["schedule"], total, warm, t["min_lr"] / t["lr"]))
        self.epoch, self.history, self.step_losses = 0, [], []
        self.best = {"epoch": -1, "score": None}

    # -- persistence ----------------------------------------------------------------------------
    def _state(self) -> dict:
        return {"model": self.net.state_dict(), "optimizer": self.optimizer.state_dict(),
                "scheduler": self.scheduler.state_dict(), "epoch": self.epoch,
                "history": self.history, "step_losses": self.step_losses, "best": self.best,
                "rng": rng_state(), "config": self.cfg}

    def _write_static(self) -> None:
        self.run_dir.mkdir(parents=True, exist_ok=True)
        (self.run_dir / "config.yaml").write_text(yaml.safe_dump(self.cfg, sort_keys=False))
        tok = getattr(self.bundle, "tokenizer", None)
        if tok is not None and hasattr(tok, "state_dict"):
            (self.run_dir / "tokenizer.json").write_text(json.dumps(tok.state_dict()))

    def resume(self) -> bool:
        """Restore ``last.pt`` if the run directory has one; returns whether it did."""
        path = self.run_dir / "last.pt"
        if not path.exists():
            return False
        state = load_checkpoint(path, map_location=self.device)
        if state.get("config", {}).get("model") != self.cfg["model"]:
            raise CheckpointError(f"{path} was written for a different model config; use a new "
                                  "--out folder")
        self.net.load_state_dict(state["model"])
        self.optimizer.load_state_dict(state["optimizer"])
        self.scheduler.load_state_dict(state["scheduler"])
        self.epoch, self.history = state["epoch"], state["history"]
        self.step_losses, self.best = state["step_losses"], state["best"]
        set_rng_state(state["rng"])
        return True

    # -- training -------------------------------------------------------------------------------
    def _batches(self, generator: torch.Generator):
        """This rank's training batches of the current epoch, drawn lazily from ``generator``."""
        bs = self.cfg["data"]["batch_size"]
        # every rank draws the same permutation and takes its own shard of it
        order = torch.randperm(self.num_data, generator=generator)[self.rank::self.world]
        for start in range(0, len(order), bs):
            yield self.bundle.train.batch(order[start:start + bs], train=True,
                                          generator=generator).to(self.device)

    def train_epoch(self, progress=None) -> dict:
        """One pass over the training split; returns mean loss and mean objective terms."""
        t = self.cfg["train"]
        gen = torch.Generator().manual_seed(t["seed"] * 1_000_003 + self.epoch)
        return fit_epoch(self.program, self.optimizer, self._batches(gen),
                         scheduler=self.scheduler, grad_clip=t["grad_clip"],
                         clock=epoch_clock(self.epoch, self.steps_per_epoch), progress=progress,
                         step_losses=self.step_losses, epoch=self.epoch)

    def validate(self) -> dict:
        """Metrics of the current model on the validation split (MC passes as in evaluation)."""
        e = self.cfg["eval"]
        devices = [self.device] if self.device.type == "cuda" else []
        # validation draws (MC passes, the sampled "y" site) must not move the training RNG
        with torch.random.fork_rng(devices=devices):
            torch.manual_seed(self.cfg["train"]["seed"] + 7919 * self.epoch)
            pred = predict(self.program, self.bundle.val, num_samples=e["mc_samples"],
                           batch_size=self.cfg["data"]["eval_batch_size"], device=self.device)
        return classification_report(pred["probs"], pred["labels"], logits=pred["logits"],
                                     metrics=list(VALIDATION_METRICS))

    def fit(self) -> dict:
        """Train (resuming if possible), keep the best validation checkpoint, then evaluate it."""
        from tqdm.auto import tqdm

        if self.rank == 0:
            self._write_static()
        barrier(self.world)
        self.resume()
        t = self.cfg["train"]
        higher = HIGHER_IS_BETTER.get(self.select_metric, True)
        bar = tqdm(total=self.steps_per_epoch * t["epochs"], initial=self.steps_per_epoch * self.epoch,
                   disable=not t["progress"] or self.rank != 0, desc=str(self.run_dir.name), leave=False)
        try:
            while self.epoch < t["epochs"]:
                start = time.perf_counter()
                train_stats = self.train_epoch(bar)
                seconds = time.perf_counter() - start
                val = self.validate()
                score = val[self.select_metric]
                better = (self.best["score"] is None
                          or (score > self.best["score"] if higher else score < self.best["score"]))
                row = {"epoch": self.epoch + 1, "seconds": seconds, "lr": self.scheduler.get_last_lr()[0],
                       **train_stats, **{f"val/{k}": v for k, v in val.items()}}
                self.history.append(row)
                self.epoch += 1
                if better:
                    self.best = {"epoch": self.epoch, "score": score}
                    if self.rank == 0:
                        save_atomic({"model": self.net.state_dict(), "epoch": self.epoch,
                                     "config": self.cfg}, self.run_dir / "best.pt")
                if self.rank == 0:
                    save_atomic(self._state(), self.run_dir / "last.pt")
                    self._write_logs()
                barrier(self.world)
                bar.set_postfix(loss=f"{train_stats['loss']:.3f}",
                                **{self.select_metric: f"{score:.3f}"})
        finally:
            bar.close()
        return self.evaluate()

    def _write_logs(self) -> None:
        (self.run_dir / "history.json").write_text(json.dumps(self.history, indent=1))
        keys = sorted({k for row in self.history for k in row}, key=lambda k: (k != "epoch", k))
        with open(self.run_dir / "log.csv", "w", newline="") as fh:
            w = csv.DictWriter(fh, fieldnames=keys)
            w.writeheader()
            w.writerows(self.history)

    # -- evaluation -----------------------------------------------------------------------------
    def evaluate(self, ood: list[str] | None = None) -> dict:
        """Evaluate ``best.pt`` on test and OOD sets; writes ``results.json`` and predictions."""
        return _evaluate_best(self.run_dir, self.cfg, self.bundle, self.net, self.program,
                              self.device, self.rank, history=self.history, best=self.best,
                              select_metric=self.select_metric, warm_start=self.warm_start,
                              ood=ood)


def selection_metric(cfg: dict, bundle) -> str:
    """``train.select_metric``; ``auto`` is the metric the dataset declares
    (``select_metric`` of :class:`~gpattn_ppl.data.DataBundle`: MCC on CoLA, accuracy elsewhere).

    :raises ValueError: a metric the validation report does not compute.
    """
    m = cfg["train"]["select_metric"]
    if m == "auto":
        m = getattr(bundle, "select_metric", "acc")
    if m not in VALIDATION_METRICS:
        raise ValueError(f"train.select_metric: {m!r} is not a validation metric; allowed: "
                         f"auto, {', '.join(VALIDATION_METRICS)}")
    return m


def load_bundle(cfg: dict):
    """The :class:`~gpattn_ppl.data.DataBundle` a config asks for."""
    from ..data import load_data

    d = cfg["data"]
    kw = {k: d[k] for k in ("protocol", "root", "cache_dir", "limit_train", "cr_root") if d[k] is not None}
    # every random choice of the data (splits, limit_train subsets) follows data.split_seed, so
    # runs that differ only in train.seed see identical data and vocabularies
    return load_data(d["name"], encoder=d["encoder"], max_len=d["max_len"],
                     seed=d["split_seed"], split_seed=d["split_seed"], **kw)


def build_net(cfg: dict, bundle):
    """The classifier of the validated ``cfg['model']`` with the sizes the data decides filled
    in (assembled without validating the section again)."""
    from ..models import assemble_model

    fill = {"num_classes": bundle.num_classes}
    if bundle.input_kind == "tokens":
        fill["vocab_size"] = bundle.vocab_size
    elif bundle.input_kind == "features":
        fill["feature_dim"] = bundle.feature_dim
    model = dict(cfg["model"])
    if bundle.input_kind != "image":
        model["max_len"] = max(model["max_len"], cfg["data"]["max_len"])
    return assemble_model(model, **fill)


def _model_and_program(cfg: dict, bundle, device, world: int):
    """The network on ``device`` (warm-started if ``train.init_from``), the warm-start report,
    and its Pyro program (forward through DDP when ``world > 1``)."""
    t = cfg["train"]
    net = build_net(cfg, bundle).to(device)
    warm_start = init_from(net, t["init_from"]) if t["init_from"] else None
    program = PyroProgram(net, len(bundle.train), t["objective"], mode=t["mode"],
                          total_epochs=t["epochs"])
    if world > 1:
        from torch.nn.parallel import DistributedDataParallel

        ids = [device.index] if device.type == "cuda" else None
        program.forward_module = DistributedDataParallel(net, device_ids=ids)
    return net, warm_start, program


def _evaluate_best(run_dir: Path, cfg: dict, bundle, net, program, device, rank: int, *,
                   history: list, best: dict, select_metric: str, warm_start: dict | None,
                   ood: list[str] | None) -> dict:
    """Load ``best.pt`` into ``net``, evaluate, write ``results.json`` / ``predictions.pt``."""
    state = load_checkpoint(run_dir / "best.pt", map_location=device)
    net.load_state_dict(state["model"])
    results = evaluate_model(program, bundle, cfg, device, ood=ood)
    seconds = [r["seconds"] for r in history]
    results["best_epoch"] = state["epoch"]
    results["selection"] = {"metric": select_metric, "split": "val", "score": best["score"]}
    results["cost"] = {"sec_per_epoch": sum(seconds) / max(len(seconds), 1),
                       "peak_mem_mb": peak_memory_mb(device),
                       "params": sum(p.numel() for p in net.parameters()),
                       "epochs": len(history)}
    if warm_start is not None:
        results["warm_start"] = {"source": warm_start["source"],
                                 "loaded": len(warm_start["loaded"])}
    preds = results.pop("_predictions")
    if rank == 0:
        torch.save(preds, run_dir / "predictions.pt")
        (run_dir / "results.json").write_text(json.dumps(results, indent=1))
    return results


def evaluate_run(run_dir: str | Path, ood: list[str] | None = None) -> dict:
    """Re-evaluate a finished run directory (``gpattn-ppl evaluate``): its config, data, model,
    ``best.pt`` and program; no optimiser is built. Rewrites ``results.json`` and
    ``predictions.pt``."""
    run_dir = Path(run_dir)
    cfg_path = run_dir / "config.yaml"
    if not cfg_path.is_file():
        raise FileNotFoundError(f"{run_dir} is not a run directory (no config.yaml)")
    cfg = dict(load_config(cfg_path))
    rank, world = init_distributed()
    device = select_device(cfg["train"]["device"], rank)
    seed_everything(cfg["train"]["seed"])
    bundle = load_bundle(cfg)
    select_metric = selection_metric(cfg, bundle)
    net, warm_start, program = _model_and_program(cfg, bundle, device, world)
    state = load_checkpoint(run_dir / "last.pt") if (run_dir / "last.pt").exists() else {}
    return _evaluate_best(run_dir, cfg, bundle, net, program, device, rank,
                          history=state.get("history", []),
                          best=state.get("best", {"epoch": -1, "score": None}),
                          select_metric=select_metric, warm_start=warm_start, ood=ood)
