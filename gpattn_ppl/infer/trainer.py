"""Training and evaluation of one run: the Pyro program + a torch optimiser.

One run directory holds everything: ``config.yaml`` (resolved), ``tokenizer.json``,
``last.pt`` (atomic, every epoch: model, optimiser, scheduler, RNG states, history),
``best.pt`` (the model with the best *validation* score), ``log.csv`` / ``history.json`` (per
epoch), ``results.json`` (test and OOD metrics of the best model) and ``predictions.pt``.

Exact resume: the data order of epoch ``e`` is a permutation drawn from a generator seeded with
``(seed, e)`` and every RNG state is saved at the end of each epoch, so a run resumed from
``last.pt`` produces the same loss sequence as an uninterrupted one.
"""

from __future__ import annotations

import csv
import json
import math
import os
import random
import resource
import time
import warnings
from pathlib import Path

import torch
import yaml

from .. import settings
from ..config import load_config
from .checkpoint import (
    CheckpointError,
    init_from,
    load_checkpoint,
    rng_state,
    save_atomic,
    set_rng_state,
)
from .predictive import predict
from .program import PyroProgram

__all__ = ["Trainer", "build_net", "evaluate_model", "evaluate_run", "load_bundle", "lr_lambda",
           "seed_everything", "select_device"]


def select_device(name: str = "auto", rank: int = 0) -> torch.device:
    """``"auto"`` -> CUDA when available (``cuda:LOCAL_RANK`` under torchrun), else CPU;
    otherwise ``torch.device(name)``."""
    if name == "auto":
        if torch.cuda.is_available():
            return torch.device("cuda", int(os.environ.get("LOCAL_RANK", rank)))
        return torch.device("cpu")
    return torch.device(name)


def _init_distributed() -> tuple[int, int]:
    """``(rank, world_size)``; joins the process group when launched by ``torchrun``.

    Data parallelism (DDP): each rank trains on its shard of every epoch's permutation, gradients
    are averaged by :class:`~torch.nn.parallel.DistributedDataParallel`, KL terms keep the global
    ``N_data``, every rank evaluates the full validation set (identical results, so identical
    checkpoint selection) and only rank 0 writes files.
    """
    import torch.distributed as dist

    world = int(os.environ.get("WORLD_SIZE", "1"))
    if world <= 1 or not dist.is_available():
        return 0, 1
    if not dist.is_initialized():
        dist.init_process_group("nccl" if torch.cuda.is_available() else "gloo")
    return dist.get_rank(), dist.get_world_size()


def _barrier(world: int) -> None:
    if world > 1:
        import torch.distributed as dist

        dist.barrier()


def lr_lambda(schedule: str, total_steps: int, warmup_steps: int, min_ratio: float):
    """Multiplier of the base learning rate at optimiser step ``s`` (linear warm-up from
    ``1/warmup_steps``, never 0, then cosine / linear decay to ``min_ratio``, or constant)."""

    def f(step: int) -> float:
        if step < warmup_steps:
            return (step + 1) / warmup_steps
        if schedule == "constant":
            return 1.0
        p = min((step - warmup_steps) / max(total_steps - warmup_steps, 1), 1.0)
        if schedule == "cosine":
            return min_ratio + (1 - min_ratio) * 0.5 * (1 + math.cos(math.pi * p))
        return 1.0 - (1.0 - min_ratio) * p

    return f


def seed_everything(seed: int) -> None:
    """Seed python, numpy and torch (model initialisation, dropout, MC sampling)."""
    import numpy as np

    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)


def _peak_memory_mb(device: torch.device) -> float:
    if device.type == "cuda":
        return torch.cuda.max_memory_allocated(device) / 2**20
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0


class Trainer:
    """Train one configuration into ``run_dir`` and evaluate its best checkpoint.

    :param config: a config dict or YAML path (validated by :func:`gpattn_ppl.config.load_config`).
    :param run_dir: output folder; an existing ``last.pt`` there is resumed.
    :param overrides: ``--set`` style overrides.
    :param bundle: a pre-loaded :class:`~gpattn_ppl.data.DataBundle` (skips loading).
    """

    def __init__(self, config, run_dir: str | Path, *, overrides: list[str] | None = None,
                 bundle=None) -> None:
        self.cfg = load_config(config, overrides)
        self.run_dir = Path(run_dir)
        self.rank, self.world = _init_distributed()
        self.device = select_device(self.cfg["train"]["device"], self.rank)
        seed_everything(self.cfg["train"]["seed"])
        self.bundle = bundle if bundle is not None else load_bundle(self.cfg)
        self.net = build_net(self.cfg, self.bundle).to(self.device)
        t = self.cfg["train"]
        self.warm_start = None
        if t["init_from"]:
            self.warm_start = init_from(self.net, t["init_from"])
        self.num_data = len(self.bundle.train)
        self.program = PyroProgram(self.net, self.num_data, t["objective"], mode=t["mode"],
                                   total_epochs=t["epochs"])
        if self.world > 1:
            from torch.nn.parallel import DistributedDataParallel

            ids = [self.device.index] if self.device.type == "cuda" else None
            self.program.forward_module = DistributedDataParallel(self.net, device_ids=ids)
        params = [p for p in self.net.parameters() if p.requires_grad]
        opt_cls = torch.optim.AdamW if t["optimizer"] == "adamw" else torch.optim.Adam
        self.optimizer = opt_cls(params, lr=t["lr"], weight_decay=t["weight_decay"])
        self.steps_per_epoch = math.ceil(math.ceil(self.num_data / self.world)
                                         / self.cfg["data"]["batch_size"])
        total = self.steps_per_epoch * t["epochs"]
        warm = int(round(t["warmup_epochs"] * self.steps_per_epoch))
        self.scheduler = torch.optim.lr_scheduler.LambdaLR(
            self.optimizer, lr_lambda(t["schedule"], total, warm, t["min_lr"] / t["lr"]))
        self.select_metric = _selection_metric(self.cfg, self.bundle)
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
    def _set_epoch_hooks(self, t: float) -> None:
        for unit in self.net.attention_units().values():
            hook = getattr(unit, "set_epoch", None)
            if hook is not None:
                hook(t, self.cfg["train"]["epochs"])

    def train_epoch(self, progress=None) -> dict:
        """One pass over the training split; returns mean loss and mean objective terms."""
        t = self.cfg["train"]
        bs = self.cfg["data"]["batch_size"]
        gen = torch.Generator().manual_seed(t["seed"] * 1_000_003 + self.epoch)
        self.net.train()
        loss_sum = torch.zeros((), device=self.device)
        term_sums: dict[str, torch.Tensor] = {}
        n_steps = 0
        # every rank draws the same permutation and takes its own shard of it
        order = torch.randperm(self.num_data, generator=gen)[self.rank::self.world]
        for i, start in enumerate(range(0, len(order), bs)):
            b = self.bundle.train.batch(order[start:start + bs], train=True,
                                        generator=gen).to(self.device)
            ep = self.epoch + i / self.steps_per_epoch
            self.program.epoch = ep
            self._set_epoch_hooks(ep)
            loss = self.program.loss(b.x, b.mask, b.y, b.index)
            self.optimizer.zero_grad(set_to_none=True)
            loss.backward()
            if t["grad_clip"]:
                torch.nn.utils.clip_grad_norm_(self.net.parameters(), t["grad_clip"])
            self.optimizer.step()
            self.scheduler.step()
            loss_sum += loss.detach()
            for name, value in self.program.last_terms.items():
                term_sums[name] = term_sums.get(name, 0.0) + value
            n_steps += 1
            self.step_losses.append(loss.detach())
            if progress is not None:
                progress.update(1)
        if settings.validate_args.value() and not math.isfinite(float(loss_sum)):
            raise FloatingPointError(f"training loss became non-finite in epoch {self.epoch}")
        self.step_losses = [float(v) for v in self.step_losses]
        out = {"loss": float(loss_sum) / n_steps}
        out.update({f"term/{k}": float(v) / n_steps for k, v in term_sums.items()})
        return out

    def validate(self) -> dict:
        """Metrics of the current model on the validation split (MC passes as in evaluation)."""
        from ..metrics import classification_report

        e = self.cfg["eval"]
        devices = [self.device] if self.device.type == "cuda" else []
        # validation draws (MC passes, the sampled "y" site) must not move the training RNG
        with torch.random.fork_rng(devices=devices):
            torch.manual_seed(self.cfg["train"]["seed"] + 7919 * self.epoch)
            pred = predict(self.program, self.bundle.val, num_samples=e["mc_samples"],
                           batch_size=self.cfg["data"]["eval_batch_size"], device=self.device)
        return classification_report(pred["probs"], pred["labels"], logits=pred["logits"],
                                     metrics=["acc", "mcc", "nll", "ece", "brier"])

    def fit(self) -> dict:
        """Train (resuming if possible), keep the best validation checkpoint, then evaluate it."""
        from tqdm.auto import tqdm

        from ..metrics import HIGHER_IS_BETTER

        if self.rank == 0:
            self._write_static()
        _barrier(self.world)
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
                _barrier(self.world)
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
        state = load_checkpoint(self.run_dir / "best.pt", map_location=self.device)
        self.net.load_state_dict(state["model"])
        results = evaluate_model(self.program, self.bundle, self.cfg, self.device, ood=ood)
        seconds = [r["seconds"] for r in self.history]
        results["best_epoch"] = state["epoch"]
        results["selection"] = {"metric": self.select_metric, "split": "val",
                                "score": self.best["score"]}
        results["cost"] = {"sec_per_epoch": sum(seconds) / max(len(seconds), 1),
                           "peak_mem_mb": _peak_memory_mb(self.device),
                           "params": sum(p.numel() for p in self.net.parameters()),
                           "epochs": len(self.history)}
        if self.warm_start is not None:
            results["warm_start"] = {"source": self.warm_start["source"],
                                     "loaded": len(self.warm_start["loaded"])}
        preds = results.pop("_predictions")
        if self.rank == 0:
            torch.save(preds, self.run_dir / "predictions.pt")
            (self.run_dir / "results.json").write_text(json.dumps(results, indent=1))
        return results


def _selection_metric(cfg: dict, bundle) -> str:
    m = cfg["train"]["select_metric"]
    if m != "auto":
        return m
    return "mcc" if bundle.name == "cola" else "acc"


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
    """The classifier of ``cfg['model']`` with the sizes the data decides filled in."""
    from ..models import build_model

    fill = {"num_classes": bundle.num_classes}
    if bundle.input_kind == "tokens":
        fill["vocab_size"] = bundle.vocab_size
    elif bundle.input_kind == "features":
        fill["feature_dim"] = bundle.feature_dim
    model = dict(cfg["model"])
    if bundle.input_kind != "image":
        model["max_len"] = max(model["max_len"], cfg["data"]["max_len"])
    return build_model(model, **fill)


def evaluate_model(program: PyroProgram, bundle, cfg: dict, device, ood: list[str] | None = None
                   ) -> dict:
    """Test-set and OOD metrics (classification on every labelled set, detection vs test)."""
    from ..metrics import classification_report, ood_report
    from ..ood import kl_matching_templates

    e, d = cfg["eval"], cfg["data"]
    kw = dict(num_samples=e["mc_samples"], batch_size=d["eval_batch_size"], device=device,
              limit=d["limit_eval"])
    names = ood if ood is not None else (e["ood"] if e["ood"] is not None else list(bundle.ood))
    unknown = [n for n in names if n not in bundle.ood]
    if unknown:
        raise ValueError(f"eval.ood: unknown OOD set(s) {unknown}; this dataset has: "
                         f"{', '.join(bundle.ood) or 'none'}")
    val = predict(program, bundle.val, **kw)
    test = predict(program, bundle.test, **kw)
    mean = _average(test, e["average"])
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always", UserWarning)
        templates = kl_matching_templates(_average(val, e["average"])["probs"])
    out = {"warnings": [str(w.message) for w in caught],"test": classification_report(mean["probs"], test["labels"], logits=test["logits"],
                                         metrics=e["metrics"]),
           "ood": {}, "_predictions": {"test": test, "val": val}}
    for name in names:
        p = predict(program, bundle.ood[name], **kw)
        pm = _average(p, e["average"])
        out["_predictions"][name] = p
        out["ood"][name] = {
            "classification": classification_report(pm["probs"], p["labels"], logits=p["logits"],
                                                    metrics=e["metrics"]),
            "detection": ood_report(mean["probs"], test["logits"], pm["probs"], p["logits"],
                                    detectors=e["ood_detectors"], templates=templates),
        }
    return out


def _average(pred: dict, how: str) -> dict:
    """``probs``: keep the T passes (metrics average probabilities); ``logits``: average logits
    first (the KEP-SVGP reference's convention), giving one pass."""
    if how == "probs":
        return pred
    logits = pred["logits"].mean(0, keepdim=True)
    return {"logits": logits, "probs": torch.softmax(logits.double(), -1), "labels": pred["labels"]}


def evaluate_run(run_dir: str | Path, ood: list[str] | None = None) -> dict:
    """Re-evaluate a finished run directory (``gpattn-ppl evaluate``)."""
    run_dir = Path(run_dir)
    cfg_path = run_dir / "config.yaml"
    if not cfg_path.is_file():
        raise FileNotFoundError(f"{run_dir} is not a run directory (no config.yaml)")
    trainer = Trainer(cfg_path, run_dir)
    state = load_checkpoint(run_dir / "last.pt") if (run_dir / "last.pt").exists() else {}
    trainer.history = state.get("history", [])
    trainer.best = state.get("best", trainer.best)
    return trainer.evaluate(ood=ood)

