"""A trained run's results: evaluate ``best.pt`` and write ``results.json`` and the predictions.

:func:`evaluate_best` is the one writer of a run's results (after training, and for
``gpattn-ppl evaluate``: :func:`evaluate_run`, which needs only the run folder: its config,
data, ``best.pt``; the warm-start file of ``train.init_from`` is not read again). With
temperature scaling, ``results.json`` is written before ``calibration.json`` and holds the
temperature ``predict`` applies; :class:`~gpattn_ppl.run.runfolder.RunFolder` refuses a
``calibration.json`` that disagrees with it (an evaluation killed between the two writes).
"""

from __future__ import annotations

import time
from pathlib import Path

import torch

from .. import linalg
from ..infer import save_atomic
from .assembly import check_same_data, load_bundle, model_and_program, selection_metric
from .config import ConfigError, check_device_available, check_extras
from .evaluate import check_ood_names, evaluate_model
from .output import strict
from .rundir import RunFolderError, record_files, run_lock, write_json_atomic
from .runfolder import RunFolder, open_run
from .runtime import RunMemory, init_distributed, seed_everything, select_device

__all__ = ["draw_run_plots", "evaluate_best", "evaluate_run", "numerics_summary"]


def evaluate_best(folder: RunFolder, cfg: dict, bundle, net, program, device, rank: int, *,
                  history: list, select_metric: str, ood: list[str] | None,
                  data_warning: str | None = None, budget: dict | None = None,
                  memory=None) -> dict:
    """Load ``best.pt`` of ``folder`` into ``net`` (its config checked against
    ``config.yaml``), evaluate, write ``results.json``, ``predictions.pt`` and (with temperature
    scaling) ``calibration.json``. The caller holds the folder's lock.

    :param budget: the run's :class:`~gpattn_ppl.run.budget.BudgetPlan` as a dict
        (``train.max_minutes``), written under ``"budget"``.
    :param memory: the ``RunMemory`` of :mod:`~gpattn_ppl.run.runtime` started at the run's
        start (training, or ``evaluate``): its peak
        is ``cost.peak_mem_mb`` and its reading ``cost.peak_mem``; ``None``: measured from
        here (the evaluation alone)."""
    run_dir = folder.path
    state = folder.load_weights(net, "best.pt", map_location=device)
    # the MC passes of the evaluation are seeded: train and a later evaluate give equal numbers
    devices = [device] if device.type == "cuda" else []
    linalg.reset_numerics_stats()
    own_meter = memory is None
    if own_meter:
        memory = RunMemory(device).start()
    start = time.perf_counter()
    with torch.random.fork_rng(devices=devices):
        torch.manual_seed(cfg["train"]["seed"] + 104_729)
        results = evaluate_model(program, bundle, cfg, device, ood=ood)
    eval_seconds = time.perf_counter() - start
    peak = memory.summary()
    if own_meter:
        memory.stop()
    numerics = numerics_summary(history, linalg.numerics_stats())
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
                       # the run's own peak (not the process's since it began): peak_mem says
                       # what was measured
                       "peak_mem_mb": peak["peak_mb"], "peak_mem": peak,
                       "params": sum(p.numel() for p in net.parameters()),
                       "epochs": len(history), "numerics": numerics,
                       # the whole run: training passes + validations + this evaluation
                       "eval_seconds": eval_seconds,
                       # the predictive passes alone (all MC passes), per example predicted
                       "predict_ms_per_example": results.pop("predict_ms_per_example", None),
                       "run_seconds": (sum(seconds) + sum(val_seconds) + eval_seconds
                                       if timed else None)}
    if budget is not None:
        results["budget"] = budget
    warm_start = folder.manifest.get("warm_start")
    if warm_start is not None:
        results["warm_start"] = warm_start
    preds = results.pop("_predictions")
    if rank == 0:
        save_atomic(preds, run_dir / "predictions.pt")
        calibration = run_dir / "calibration.json"
        # results.json first: it holds the temperature predict applies; calibration.json, a
        # copy, is removed before and written after it, so the two never disagree silently
        calibration.unlink(missing_ok=True)
        write_json_atomic(results, run_dir / "results.json")
        if "temperature_scaling" in results:
            write_json_atomic(results["temperature_scaling"], calibration)
    return strict(results)


def numerics_summary(history: list, evaluation: dict) -> dict:
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
                 overrides: list[str] | None = None, *, allow_changed_data: bool = False,
                 plots: bool = False, checkpoint: str | Path | None = None) -> dict:
    """Re-evaluate a finished run folder (``gpattn-ppl evaluate``): its config, data, model,
    ``best.pt`` and program; no optimiser is built, ``last.pt`` and the warm-start file are not
    needed. Rewrites ``results.json`` and ``predictions.pt`` under the folder's lock.

    :param overrides: ``--set`` overrides of the ``eval`` section (e.g.
        ``eval.temperature_scaling=true``, ``eval.mc_samples=20``) and of ``train.device`` (a
        run trained on a GPU evaluated on a machine without one: ``train.device=cpu``).
    :param allow_changed_data: evaluate even if the data's fingerprint differs from the one
        stored at training (the results then carry a warning saying so).
    :param plots: also draw the run's figures into ``RUN_DIR/plots`` (listed in its manifest).
    :param checkpoint: ``arch: hf`` runs: the pretrained checkpoint folder, where it is not at
        the absolute path the run recorded (never looked up in the current directory); its
        digest must be the recorded one.
    :raises RunFolderError: not a run folder, an invalid file in it, another process writing
        it, or its data changed since training.
    :raises ~gpattn_ppl.data.hf_folder.HFFolderError: ``arch: hf``: the checkpoint folder is
        gone, asks to run code, or is not the one trained with (both digests named).
    """
    bad = [o for o in overrides or []
           if not o.strip().startswith(("eval.", "train.device="))]
    if bad:
        raise ConfigError(f"evaluate --set changes the eval section and train.device only; "
                          f"got {bad}")
    folder = open_run(run_dir, overrides)
    cfg = dict(folder.config)
    check_extras(cfg)  # the data is loaded again: the packages it needs must be here
    # arch: hf: the checkpoint recorded at training (digest checked), not the current directory's
    if cfg["model"]["arch"] == "hf":
        cfg = folder.pin_checkpoint(cfg, folder.encoder(checkpoint=checkpoint))
    check_device_available(cfg["train"]["device"])
    rank, world = init_distributed()
    device = select_device(cfg["train"]["device"], rank)
    with RunMemory(device) as memory:  # this evaluation's own peak, data loading included
        seed_everything(cfg["train"]["seed"])
        bundle = load_bundle(cfg)
        changed = None
        try:
            check_same_data(folder.manifest, folder.encoder_state(), bundle, folder.path)
        except RunFolderError as err:
            if not allow_changed_data:
                raise RunFolderError(f"{str(err).splitlines()[0]}\nhint: evaluate "
                                     "--allow-changed-data evaluates anyway") from None
            changed = str(err).splitlines()[0]
        if ood is not None:
            check_ood_names(ood, bundle, "evaluate --ood")
        else:
            check_ood_names(cfg["eval"]["ood"], bundle)
        select_metric = selection_metric(cfg, bundle)
        net, _, program = model_and_program(cfg, bundle, len(bundle.train), device, world,
                                            warm_start=False)
        history = folder.history()
        with run_lock(folder.path):
            results = evaluate_best(folder, cfg, bundle, net, program, device, rank,
                                    history=history, select_metric=select_metric, ood=ood,
                                    data_warning=changed, memory=memory)
            if plots and rank == 0:
                draw_run_plots(folder.path, cfg["eval"]["ood_detectors"])
    return results


def draw_run_plots(run_dir: Path, detectors: list[str] | None = None) -> list[Path]:
    """The run's figures (:func:`~gpattn_ppl.run.plotting.plot_runs`) in ``run_dir/plots``,
    each listed in the manifest before it is written (the caller holds the lock).

    :param detectors: the OOD scores to draw (``eval.ood_detectors``, a plugin's included);
        ``None``: :func:`~gpattn_ppl.run.plotting.plot_runs`'s default.
    """
    from .plotting import planned_plot_names, plot_runs

    run_dir = Path(run_dir)
    kw = {} if detectors is None else {"detectors": list(detectors)}
    record_files(run_dir, [f"plots/{n}" for n in planned_plot_names([run_dir], **kw)])
    # the raw predictive and, when the evaluation fitted a temperature, the tempered one beside it
    # root: a symlinked plots/ is refused (nothing written through it)
    return plot_runs([run_dir], run_dir / "plots", predictive="both", root=run_dir, **kw)
