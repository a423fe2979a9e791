"""The application: config -> data -> model -> fit -> evaluate, on top of the library.

* :mod:`~gpattn_ppl.run.config` -- the experiment config, validated once;
* :mod:`~gpattn_ppl.run.assembly` -- config -> data bundle -> network -> program, the manifest;
* :mod:`~gpattn_ppl.run.training` -- :class:`~gpattn_ppl.run.training.Trainer` (one run into a
  run folder, exact resume);
* :mod:`~gpattn_ppl.run.results` -- :func:`~gpattn_ppl.run.results.evaluate_run`, the one writer
  of a run's results (:mod:`~gpattn_ppl.run.experiment` gathers these three's public names);
* :mod:`~gpattn_ppl.run.rundir` -- what a run folder holds, when it may be written, its lock;
* :mod:`~gpattn_ppl.run.runfolder` -- :func:`~gpattn_ppl.run.runfolder.open_run`, the one
  reader of a run folder (weights only, schemas, cross-file checks);
* :mod:`~gpattn_ppl.run.evaluate` -- test and OOD metrics of a trained program (and
  temperature scaling);
* :mod:`~gpattn_ppl.run.laplace` -- last-layer Laplace of the classifier head (laplace-torch,
  imported on use);
* :mod:`~gpattn_ppl.run.predictor` -- :func:`~gpattn_ppl.run.predictor.load_run`: predict with a
  trained run;
* :mod:`~gpattn_ppl.run.saved_model` -- a ``save_pretrained`` folder of a swapped Hugging Face
  classifier in place of a run folder (``predict``, ``explain``, ``evaluate --data``);
* :mod:`~gpattn_ppl.run.export` -- ``gpattn-ppl export``: an ``arch: hf`` run as such a folder,
  loadable by ``transformers``' Auto classes and pipelines;
* :mod:`~gpattn_ppl.run.output` -- strict JSON and the one run summary;
* :mod:`~gpattn_ppl.run.plugins` -- ``--import MODULE`` and entry points: user datasets and units;
* :mod:`~gpattn_ppl.run.runtime` -- device, DDP, seeding, peak memory;
* :mod:`~gpattn_ppl.run.allocator` -- the process's allocator policy (keep freed memory);
* :mod:`~gpattn_ppl.run.compare` -- configs x seeds -> the mean ± std table;
* :mod:`~gpattn_ppl.run.shift_report` -- the CIFAR-10-C and OOD-detector tables over runs, and
  the metric-vs-severity plots;
* :mod:`~gpattn_ppl.run.demo` -- the main job: the recommended unit in a fine-tuned MiniLM against
  softmax (+ TS, + LLA) and SNGP on the bundled CLINC150 demo slice;
* :mod:`~gpattn_ppl.run.sweep` -- every registered unit from scratch on frozen features
  (``demo --all-units``);
* :mod:`~gpattn_ppl.run.benchmarking`, :mod:`~gpattn_ppl.run.plotting` -- timings and figures;
* :mod:`~gpattn_ppl.run.cli` -- the ``gpattn-ppl`` command.

Nothing below this package imports it. The names below are imported on first use, so
``gpattn-ppl --help`` does not load the library.
"""

from __future__ import annotations

import importlib

#: submodule -> the names it exports; they are imported from it on first use
_EXPORTS: dict[str, tuple[str, ...]] = {
    "allocator": ("keep_freed_memory",),
    "assembly": ("MANIFEST_FORMAT", "VALIDATION_METRICS", "build_net", "check_same_data",
                 "data_sizes", "load_bundle", "model_and_program", "new_manifest",
                 "parameter_groups", "selection_metric"),
    "budget": ("MARGIN", "BudgetPlan", "plan_budget"),
    "benchmarking": ("bench_arg_parser", "bench_device", "bench_layers", "bench_specs",
                     "build_unit", "peak_memory", "provenance",
                     "layer_inputs", "layer_step_time", "loglog_slope", "machine_info",
                     "round_summary", "spec_step_time", "split_spec", "time_against_softmax",
                     "time_fn", "train_step", "write_json"),
    "cli": ("CommandLineError", "build_parser", "main"),
    "compare": ("BEST_DETECTOR", "COMPARE_MANIFEST", "ComparePlan", "PlannedRun",
                "TABLE_COLUMNS", "block_ensembles", "ensemble_results", "execute_plan",
                "format_markdown", "plan_compare", "run_compare", "significantly_better",
                "summarise", "with_posthoc_rows", "write_table"),
    "config": ("Config", "ConfigError", "SCHEMA", "apply_overrides", "check_extras",
               "load_config", "requires_extras", "validate_config"),
    "demo": ("DEMO_FILES", "RECIPE", "RECIPE_METHODS", "recipe_configs", "recipe_table",
             "run_demo"),
    "explain": ("explain_sentence",),
    "export": ("PROBE_TEXTS", "ExportError", "export_run"),
    "evaluate": ("check_ood_names", "evaluate_laplace", "evaluate_model",
                 "evaluate_predictions", "temper"),
    "laplace": ("HESSIANS", "LINKS", "PRIOR_BOUNDS", "PRIOR_GRID", "LastLayerLaplace", "centred_covariance",
                "fit_last_layer_laplace",
                "head_features", "laplace_predictions"),
    "output": ("dumps", "strict", "summary"),
    "plugins": ("ENTRY_POINT_GROUP", "import_plugins", "imported_plugins", "load_entry_points"),
    "predictor": ("Predictor", "load_run", "read_inputs"),
    "sweep": ("BASELINE_PRESETS", "DEMO_PRESETS", "DEMO_TASKS", "demo_encoder", "demo_methods",
              "laplace_available", "run_sweep", "verdict"),
    "results": ("draw_run_plots", "evaluate_best", "evaluate_run", "numerics_summary"),
    "rundir": ("IGNORED_KEYS", "LOCK_FILE", "RUN_FILES", "RunFolderError", "RunLock",
               "acquire_lock", "check_run_folder",
               "clear_run_files", "config_differences", "holds_run", "listed_files",
               "read_manifest", "record_files", "run_lock", "write_json_atomic"),
    "runfolder": ("RunFolder", "open_run", "written_run"),
    "saved_model": ("DEFAULT_SAMPLES", "SavedModelPredictor", "evaluate_saved_model",
                    "is_saved_model", "load_predictor", "load_saved_model"),
    "plotting": ("metric_vs_severity_plot", "ood_roc_plot", "ood_score_histogram",
                 "planned_plot_names", "plot_compare", "plot_runs", "rejection_curve_plot",
                 "reliability_diagram", "risk_coverage_plot"),
    "shift_report": ("LOWER_IS_BETTER", "OOD_METRICS", "format_ood_markdown",
                     "format_paired_markdown", "format_shift_markdown", "ood_rows", "paired_rows",
                     "severity_plots", "shift_rows"),
    "runtime": ("BACKEND_ENV", "barrier", "distributed_backend", "init_distributed",
                "peak_memory_mb", "seed_everything", "select_device", "usable_cpus"),
    "training": ("Trainer", "resident_data", "step0_terms"),
}
_HOME = {name: module for module, names in _EXPORTS.items() for name in names}

__all__ = sorted(_HOME)


def __getattr__(name: str):
    if name in _HOME:
        return getattr(importlib.import_module(f"{__name__}.{_HOME[name]}"), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted(list(globals()) + __all__)
