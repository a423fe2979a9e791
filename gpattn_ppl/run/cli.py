"""Command line: ``gpattn-ppl train | evaluate | predict | export | plot | explain | compare |
bench | demo``.

Every command prints strict JSON or Markdown; errors the user can fix (a bad config, a missing
or malformed file, a refused run folder, a bad argument) print one ``gpattn-ppl <command>: error:
...`` line, at most one ``hint: ...`` line after it, and exit with 2; any other exception is a
bug (one line saying so, exit 1). ``--debug`` shows the traceback instead.
``--set KEY.PATH=VALUE`` pairs may come before or after the positional arguments.
"""

from __future__ import annotations

import argparse
import os
import re
import sys
from pathlib import Path

from ..errors import GpattnError

__all__ = ["main", "build_parser", "CommandLineError"]

_SET_HELP = ("override a config value, e.g. --set train.lr=1e-3 model.attention.kind=kernel "
             "(YAML scalars; may come before or after the positional arguments)")
_CHECKPOINT_HELP = ("model.arch hf runs: the pretrained checkpoint folder, when it is no longer "
                    "at the absolute path the run recorded (never looked up in the current "
                    "directory; its config, tokenizer and weights digests must be the run's), "
                    "e.g. --checkpoint ~/models/minilm")
_PAIR = re.compile(r"^[A-Za-z_][\w\-]*(\.[\w\-]+)*=")


class _Parser(argparse.ArgumentParser):
    """An argument parser whose errors follow the command line's rule: one ``gpattn-ppl
    <command>: error: ...`` line and one hint line (not the whole usage), exit status 2."""

    def error(self, message: str):
        self.exit(2, f"{self.prog}: error: {message}\nhint: `{self.prog} --help` lists the "
                  "arguments, with an example\n")


def _positive_int(text: str) -> int:
    """An argparse type: an integer >= 1 (``--batch-size 0`` is refused by name)."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"must be a positive integer, got {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be a positive integer, got {value}")
    return value


class CommandLineError(GpattnError, ValueError):
    """A command-line value the command cannot use (``predict --out`` onto its input); exit
    status 2."""


def _seed(text: str) -> int:
    """An argparse type: a seed, an integer in 0 .. 2**32 - 1."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"must be an integer seed, got {text!r}") from None
    if not 0 <= value < 2**32:
        raise argparse.ArgumentTypeError(f"must be in 0 .. {2**32 - 1}, got {value}")
    return value


def _version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("gpattn-ppl")
    except PackageNotFoundError:  # running from a source tree that is not installed
        from .._version import __version__

        return __version__


def _default_out(config: str) -> Path:
    """``runs/<config folder>/<config stem>``: ``cola/softmax.yaml`` and ``imdb/softmax.yaml``
    get different folders."""
    path = Path(config)
    return Path("runs") / path.parent.name / path.stem if path.parent.name else Path("runs") / path.stem


def _train(args) -> int:
    from .config import load_config
    from .output import dumps, summary
    from .training import Trainer

    out = Path(args.out) if args.out else _default_out(args.config)
    trainer = Trainer(load_config(args.config, args.set), out, resume=args.resume,
                      force=args.force)
    results = trainer.fit()
    print(dumps(summary(results, out)))
    return 0


#: evaluate's arguments for a save_pretrained folder (-> the hint for a run folder), and a run
#: folder's (-> why a folder takes none)
_FOLDER_EVAL_ARGS = {"data": "--data", "text_column": "--text-column",
                     "label_column": "--label-column", "samples": "--samples",
                     "seed": "--seed", "batch_size": "--batch-size", "device": "--device",
                     "mean": "--mean"}
_RUN_EVAL_ARGS = {"ood": "--ood", "set": "--set", "checkpoint": "--checkpoint",
                  "allow_changed_data": "--allow-changed-data"}
_RUN_EVAL_HINTS = {"--samples": "--set eval.mc_samples=N", "--device": "--set train.device=NAME",
                   "--mean": "--set eval.predictive=mean", "--seed": "the run's train.seed"}


def _given(args, dest: str) -> bool:
    """Whether the argument ``dest`` was given (not its default: None, False or no --set)."""
    value = getattr(args, dest)
    return value is not None and value is not False and value != []


def _evaluate(args) -> int:
    from .output import dumps, summary
    from .results import evaluate_run
    from .saved_model import is_saved_model


    if is_saved_model(args.run_dir):
        return _evaluate_folder(args)
    given = [flag for dest, flag in _FOLDER_EVAL_ARGS.items() if _given(args, dest)]
    if given:
        flag = given[0]
        hint = (f" (for a run folder: {_RUN_EVAL_HINTS[flag]})" if flag in _RUN_EVAL_HINTS
                else "")
        raise CommandLineError(f"evaluate {flag}: applies to a save_pretrained model folder; "
                               f"{args.run_dir} is evaluated as a run folder, on the data of "
                               f"its config{hint}")
    results = evaluate_run(args.run_dir, ood=args.ood, overrides=args.set,
                           allow_changed_data=args.allow_changed_data, plots=not args.no_plots,
                           checkpoint=args.checkpoint)
    print(dumps(summary(results, args.run_dir)))
    return 0


def _evaluate_folder(args) -> int:
    """``evaluate FOLDER --data DATA``: a save_pretrained folder's metrics on labelled data."""
    from .config import check_device
    from .output import dumps
    from .saved_model import evaluate_saved_model

    given = [flag for dest, flag in _RUN_EVAL_ARGS.items() if _given(args, dest)]
    if given:
        raise CommandLineError(f"evaluate {given[0]}: applies to a run folder; {args.run_dir} "
                               "is a save_pretrained model folder (evaluated on --data, with "
                               "--samples / --mean)")
    if args.data is None:
        raise CommandLineError(f"evaluate: {args.run_dir} is a save_pretrained model folder, "
                               "which holds no data; name labelled data with --data (a .csv / "
                               ".tsv / .jsonl file of texts and labels, or a dataset such as "
                               "cola)")
    device = args.device or "cpu"
    check_device(device, "evaluate --device")
    if args.mean and args.samples is not None:
        raise CommandLineError("--mean and --samples exclude each other (--mean is one pass)")
    results = evaluate_saved_model(
        args.run_dir, args.data, text_column=args.text_column or "text",
        label_column=args.label_column or "label", samples=args.samples,
        batch_size=args.batch_size or 256, seed=args.seed or 0, device=device, mean=args.mean)
    print(dumps(results))
    return 0


def _predict(args) -> int:
    from .config import check_device
    from .output import dumps
    from .predictor import read_inputs
    from .saved_model import is_saved_model, load_predictor

    check_device(args.device, "predict --device")
    if args.checkpoint is not None and is_saved_model(args.run_dir):
        raise CommandLineError(f"predict --checkpoint: {args.run_dir} is a save_pretrained "
                               "model folder, which holds its own weights; --checkpoint applies "
                               "to arch: hf run folders")
    if args.out:
        _check_out_file(Path(args.out), Path(args.run_dir), args.force, source=Path(args.input))
    texts = read_inputs(args.input, args.text_column)
    predictor = load_predictor(args.run_dir, device=args.device,
                               temperature=not args.no_temperature, checkpoint=args.checkpoint)
    if args.mean and args.samples is not None:
        raise CommandLineError("--mean and --samples exclude each other (--mean is one pass)")
    records = predictor.predict(texts, samples=args.samples, batch_size=args.batch_size,
                                seed=args.seed, mean=True if args.mean else None)
    lines = [dumps({"text": t, **r}, indent=None) for t, r in zip(texts, records)]
    if args.out:
        from ..safe_files import write_atomic

        out = Path(args.out)
        # the old file or the new one, never a part; never through a link; the umask's mode
        write_atomic(out, "\n".join(lines) + "\n", overwrite=args.force)
        print(f"wrote {len(lines)} predictions to {out}", file=sys.stderr)
    else:
        print("\n".join(lines))
    return 0


def _check_out_file(out: Path, run_dir: Path, force: bool, *, source: Path | None = None,
                    what: str = "the predictions", example: str = "preds.jsonl") -> None:
    """The rule of an output file the user names (``predict --out``, ``explain --out``): never
    the input file nor anything inside the run folder (directly or through a link, ``--force``
    included); then :func:`gpattn_ppl.safe_files.check_output_file` (never a folder, a link, a
    FIFO, a socket or a device; an existing file only with ``force``). Writes nothing."""
    from ..safe_files import check_output_file
    from .saved_model import is_saved_model

    kind = "model" if is_saved_model(run_dir) else "run"
    target, run = out.resolve(), run_dir.resolve()
    if target == run or run in target.parents:
        raise CommandLineError(f"--out {out}: inside the {kind} folder {run_dir} (or a link "
                               f"into it), where nothing but the {kind}'s own files is written "
                               f"(--force included); write {what} elsewhere")
    exists = out.exists()
    if source is not None and (target == source.resolve() or (
            exists and source.exists() and os.path.samefile(out, source))):
        raise CommandLineError(f"--out {out}: that is the --input file (--force included); "
                               f"write {what} elsewhere")
    if exists and run.is_dir() and any(
            f.is_file() and os.path.samefile(out, f) for f in run.rglob("*")):
        raise CommandLineError(f"--out {out}: a link to a file of the {kind} folder "
                               f"{run_dir} (--force included); write {what} elsewhere")
    check_output_file(out, force=force, example=example)


def _export(args) -> int:
    from .export import export_run
    from .output import dumps

    result = export_run(args.run_dir, args.out, force=args.force, checkpoint=args.checkpoint)
    print(dumps(result))
    print(f"wrote {result['out']}", file=sys.stderr)
    return 0


def _plot(args) -> int:
    from .plotting import plot_runs

    kw = {} if args.detectors is None else {"detectors": args.detectors}
    kw["predictive"] = ("both" if args.both else "ts" if args.temperature_scaled else "raw")
    for path in plot_runs([Path(d) for d in args.run_dirs], Path(args.out), **kw):
        print(path)
    return 0


def _explain(args) -> int:
    from .config import check_device
    from .explain import explain_sentence
    from .output import dumps

    check_device(args.device, "explain --device")
    if args.out:  # the rule of predict --out: an existing file only with --force
        _check_out_file(Path(args.out), Path(args.run_dir), args.force, what="the figure",
                        example="why.png")
    result = explain_sentence(args.run_dir, args.text, out=args.out, samples=args.samples,
                              seed=args.seed, layer=args.layer, device=args.device,
                              temperature=not args.no_temperature,
                              overwrite=args.force or not args.out)
    print(dumps(result))
    print(f"wrote {result['figure']}", file=sys.stderr)
    return 0


def _compare(args) -> int:
    from .compare import format_markdown, run_compare

    rows = run_compare(args.configs, args.seeds, args.out, overrides=args.set,
                       ensemble=args.ensemble, progress=not args.no_progress, force=args.force,
                       plots=not args.no_plots)
    print(format_markdown(rows))
    print(f"\nwrote {args.out}/results.md and results.csv (listed in {args.out}/compare.json)")
    return 0


def _bench(args) -> int:
    from ..safe_files import check_output_file
    from .benchmarking import bench_layers, bench_specs, write_json
    from .config import check_device

    check_device(args.device, "bench --device")
    if args.C % args.H:
        raise CommandLineError(f"--C {args.C} must be a multiple of --H {args.H} (each head "
                               "gets C / H channels)")
    kinds = bench_specs(args.kinds, args.C, args.H)  # every word checked before any timing
    check_output_file(Path(args.out), force=True, example="layers.json")  # a file, not a link
    if args.device == "auto":
        from .runtime import select_device

        args.device = str(select_device("auto"))

    res = bench_layers(kinds, B=args.B, N=args.N, dim=args.C, heads=args.H, repeats=args.repeats,
                       device=args.device)
    path = write_json(res, args.out)  # never through a link (refused before the timing too)
    for r in res["layers"]:
        print(f"{r['kind']:>12} {r['options']}  {1e3 * r['median_s']:.2f} ms  "
              f"x{r['ratio_to_softmax']:.2f} softmax")
    print(f"wrote {path}")
    return 0


def _demo(args) -> int:
    from .demo import run_demo

    if args.tasks and not args.all_units:
        raise CommandLineError("demo --tasks chooses among the sweep's tasks: give --all-units")
    print(run_demo(args.out, smoke=args.smoke, seed=args.seed, methods=args.methods,
                   progress=not args.no_progress, resume=args.resume, force=args.force,
                   all_units=args.all_units, tasks=args.tasks))
    return 0


def _sub(sub, name: str, help: str, example: str, fn):
    p = sub.add_parser(name, help=help, description=help, epilog=f"example:\n  {example}",
                       formatter_class=argparse.RawDescriptionHelpFormatter)
    p.set_defaults(fn=fn)
    return p


def build_parser() -> argparse.ArgumentParser:
    """The argument parser of ``gpattn-ppl`` (every argument has help text and an example)."""
    p = _Parser(
        prog="gpattn-ppl", description="Uncertainty-aware Transformer attention (GP and "
        "stochastic units): train, evaluate, predict, export, plot, explain, compare, bench, "
        "demo.",
        epilog="example:\n  gpattn-ppl train experiments/configs/cola/softmax.yaml "
        "--set train.epochs=5\n  gpattn-ppl <command> --help   (help and an example per command)",
        formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--version", action="version", version=f"gpattn-ppl {_version()}")
    p.add_argument("--debug", action="store_true", help="on an error, show the full traceback "
                   "instead of one line (may also come after the command), e.g. gpattn-ppl "
                   "--debug train cfg.yaml")
    p.add_argument("--threads", type=_positive_int, default=None, metavar="N",
                   help="CPU threads of this process's torch operations (torch.set_num_threads; "
                   "default: torch's, one per core; at most the CPUs this process may run on); "
                   "may also come after the command. On a shared or busy machine use 1 per "
                   "process, e.g. gpattn-ppl --threads 1 train cfg.yaml")
    p.add_argument("--import", dest="imports", action="append", default=[], metavar="MODULE",
                   help="import MODULE (dotted name or path/to/file.py) first, so the datasets, "
                   "attention units and OOD detectors it registers can be used; repeatable, "
                   "e.g. --import mypkg.units")
    sub = p.add_subparsers(dest="command", required=True, metavar="COMMAND",
                           help="run `gpattn-ppl COMMAND --help` for its arguments and an example")

    t = _sub(sub, "train", "train one config into a run folder, then evaluate its best "
             "checkpoint", "gpattn-ppl train experiments/configs/cola/sgpa.yaml --set "
             "train.epochs=3 --out runs/sgpa3", _train)
    t.add_argument("config", help="YAML config (sections model, data, train, eval), e.g. "
                   "experiments/configs/cola/softmax.yaml")
    t.add_argument("--set", action="append", default=None, metavar="KEY.PATH=VALUE",
                   help=_SET_HELP)
    t.add_argument("--out", default=None, help="run folder (default: runs/<config folder>/"
                   "<config name>, e.g. runs/cola/softmax)")
    flags = t.add_mutually_exclusive_group()
    flags.add_argument("--resume", action="store_true", help="continue the run in --out "
                       "(same config only; a finished run is re-evaluated)")
    flags.add_argument("--force", action="store_true", help="discard the run in --out and "
                       "start afresh")

    e = _sub(sub, "evaluate", "re-evaluate a run folder's best checkpoint (test and OOD sets); "
             "draws its plots into RUN_DIR/plots. A save_pretrained folder of a swapped Hugging "
             "Face classifier (its tokenizer beside it) is evaluated on --data instead, "
             "writing nothing", "gpattn-ppl evaluate runs/cola/softmax "
             "--ood cola_ood --set eval.temperature_scaling=true\n  gpattn-ppl evaluate "
             "my_swapped_bert --data test.csv --samples 20", _evaluate)
    e.add_argument("run_dir", metavar="RUN_DIR", help="a run folder written by train, e.g. "
                   "runs/cola/softmax, or a save_pretrained folder of a swapped Hugging Face "
                   "sequence classifier with its tokenizer (then --data)")
    e.add_argument("--checkpoint", default=None, metavar="FOLDER", help=_CHECKPOINT_HELP)
    e.add_argument("--ood", nargs="+", default=None, metavar="NAME",
                   help="OOD sets to evaluate (default: eval.ood of the run, else every OOD set "
                   "of its dataset), e.g. --ood cola_ood")
    e.add_argument("--set", action="append", default=None, metavar="eval.KEY=VALUE",
                   help="override the eval section (or train.device), e.g. --set "
                   "eval.mc_samples=20")
    e.add_argument("--no-plots", action="store_true", help="do not draw RUN_DIR/plots/*.png")
    e.add_argument("--allow-changed-data", action="store_true",
                   help="evaluate even if the data changed since training (default: refuse; the "
                   "results then carry a warning)")
    e.add_argument("--data", default=None, metavar="DATA",
                   help="save_pretrained folders only: the labelled data, a .csv / .tsv / .jsonl "
                   "file of texts and labels (the model's id2label names, or 0..K-1 for "
                   "LABEL_k) or a registered text dataset needing no files (its test and OOD "
                   "sets), e.g. --data test.csv, --data cola")
    e.add_argument("--text-column", default=None, metavar="NAME",
                   help="with --data FILE: the column / key of the text (default: text), e.g. "
                   "--text-column sentence")
    e.add_argument("--label-column", default=None, metavar="NAME",
                   help="with --data FILE: the column / key of the label (default: label), e.g. "
                   "--label-column y")
    e.add_argument("--samples", type=_positive_int, default=None, metavar="T",
                   help="save_pretrained folders only: stochastic passes averaged (default 10; "
                   "a run folder: --set eval.mc_samples=T), e.g. --samples 20")
    e.add_argument("--mean", action="store_true",
                   help="save_pretrained folders only: one pass at the units' posterior means")
    e.add_argument("--batch-size", type=_positive_int, default=None,
                   help="save_pretrained folders only: inputs per forward pass (default 256), "
                   "e.g. --batch-size 64")
    e.add_argument("--seed", type=_seed, default=None,
                   help="save_pretrained folders only: seed of the passes (default 0), e.g. "
                   "--seed 1")
    e.add_argument("--device", default=None,
                   help="save_pretrained folders only: cpu, cuda, cuda:1 or auto (default cpu; a "
                   "run folder: --set train.device=NAME), e.g. --device auto")

    r = _sub(sub, "predict", "predict new inputs with a trained run, or with a save_pretrained "
             "folder of a swapped Hugging Face classifier (JSON Lines: text, label, score, "
             "probs, entropy, mutual_info)", "gpattn-ppl predict runs/cola/softmax --input "
             "sentences.txt --out predictions.jsonl --samples 20", _predict)
    r.add_argument("run_dir", metavar="RUN_DIR", help="a run folder written by train, e.g. "
                   "runs/cola/softmax, or a save_pretrained folder of a swapped Hugging Face "
                   "sequence classifier with its tokenizer (no temperature; --samples default "
                   "10)")
    r.add_argument("--checkpoint", default=None, metavar="FOLDER", help=_CHECKPOINT_HELP)
    r.add_argument("--input", required=True, metavar="FILE",
                   help="texts: .txt (one per line), .csv / .tsv (a 'text' column) or .jsonl "
                   "(a 'text' key), e.g. --input new.csv")
    r.add_argument("--text-column", default=None, metavar="NAME",
                   help="the column / key holding the text (default: text), e.g. --text-column "
                   "sentence")
    r.add_argument("--out", default=None, metavar="FILE",
                   help="write JSON Lines here (default: print them; never the --input file or "
                   "into RUN_DIR), e.g. --out preds.jsonl")
    r.add_argument("--force", action="store_true", help="overwrite an existing --out file "
                   "(default: refuse)")
    r.add_argument("--samples", type=_positive_int, default=None, metavar="T",
                   help="stochastic passes averaged per input (default: eval.mc_samples of the "
                   "run; deterministic networks run once), e.g. --samples 20")
    r.add_argument("--mean", action="store_true",
                   help="one pass at the units' posterior means (MC dropout off) instead of "
                   "--samples draws: the cost of a deterministic network, no mutual information "
                   "(default: the run's eval.predictive)")
    r.add_argument("--batch-size", type=_positive_int, default=256,
                   help="inputs per forward pass, e.g. --batch-size 64")
    r.add_argument("--seed", type=_seed, default=0, help="seed of the stochastic passes, e.g. "
                   "--seed 1")
    r.add_argument("--device", default="cpu", help="cpu, cuda, cuda:1 or auto, e.g. --device "
                   "auto")
    r.add_argument("--no-temperature", action="store_true",
                   help="ignore the run's fitted temperature (raw probabilities)")

    xp = _sub(sub, "export", "write an arch: hf run as a Hugging Face folder (its tokenizer "
              "beside it; the run's head, class names, predictive and temperature in "
              "config.json) that AutoModelForSequenceClassification.from_pretrained and "
              "transformers.pipeline load after `import gpattn_ppl.hf`; its logits are the "
              "run's (JSON summary)", "gpattn-ppl export runs/clinc/cgpt exported/clinc_cgpt",
              _export)
    xp.add_argument("run_dir", metavar="RUN", help="an arch: hf run folder written by train, "
                    "e.g. runs/clinc/cgpt (linear head, no MC dropout, with best.pt)")
    xp.add_argument("out", metavar="OUT", help="the folder to write (created; a real folder, "
                    "never a link, the run folder or inside it), e.g. exported/clinc_cgpt")
    xp.add_argument("--force", action="store_true", help="write into an OUT that holds files, "
                    "replacing the export's own files there (default: refuse a non-empty OUT)")
    xp.add_argument("--checkpoint", default=None, metavar="FOLDER", help=_CHECKPOINT_HELP)

    g = _sub(sub, "plot", "draw reliability diagrams, risk-coverage curves and OOD score "
             "histograms of evaluated runs", "gpattn-ppl plot runs/cola/softmax "
             "runs/cola/sgpa --out plots/", _plot)
    g.add_argument("run_dirs", nargs="+", metavar="RUN_DIR",
                   help="evaluated run folders (with predictions.pt), e.g. runs/cola/softmax")
    g.add_argument("--out", required=True, metavar="DIR", help="folder for the PNGs, e.g. "
                   "--out plots/")
    g.add_argument("--detectors", nargs="+", default=None, metavar="NAME",
                   help="OOD scores to draw histograms of (default: max_softmax entropy "
                   "mutual_info; a detector of a plugin needs --import), e.g. --detectors "
                   "max_softmax energy")
    ts = g.add_mutually_exclusive_group()
    ts.add_argument("--temperature-scaled", action="store_true",
                    help="draw each run's temperature-scaled predictive (the temperature its "
                    "evaluation fitted, eval.temperature_scaling) instead of the raw one; a run "
                    "without one is drawn raw and labelled so")
    ts.add_argument("--both", action="store_true",
                    help="draw the raw and the temperature-scaled predictive side by side")

    x = _sub(sub, "explain", "one sentence through a trained run (or a save_pretrained folder "
             "of a swapped Hugging Face classifier): attention heat-maps of a unit, per-token "
             "uncertainty and class probabilities (PNG; numbers as JSON)",
             "gpattn-ppl explain runs/cola/sgpa \"The book was read by me.\" --out why.png",
             _explain)
    x.add_argument("run_dir", metavar="RUN_DIR", help="a run folder written by train, e.g. "
                   "runs/cola/sgpa, or a save_pretrained folder of a swapped Hugging Face "
                   "sequence classifier with its tokenizer")
    x.add_argument("text", help="the sentence to explain, e.g. \"The book was read.\"")
    x.add_argument("--out", default=None, metavar="PNG",
                   help="figure path (default: RUN_DIR_explain.png beside the run folder; never "
                   "inside it), e.g. --out why.png")
    x.add_argument("--force", action="store_true", help="overwrite an existing --out file (a "
                   "regular file only: never a link, a device or a folder)")
    x.add_argument("--layer", default=None, metavar="PATH",
                   help="module path of the unit (default: the last stochastic unit, else the "
                   "last), e.g. --layer blocks.1.attn, --layer "
                   "bert.encoder.layer.1.attention.unit")
    x.add_argument("--samples", type=_positive_int, default=None, metavar="T",
                   help="stochastic passes (default: eval.mc_samples of the run), e.g. "
                   "--samples 20")
    x.add_argument("--seed", type=_seed, default=0, help="seed of the passes, e.g. --seed 1")
    x.add_argument("--device", default="cpu", help="cpu, cuda, cuda:1 or auto, e.g. --device "
                   "auto")
    x.add_argument("--no-temperature", action="store_true",
                   help="ignore the run's fitted temperature (raw probabilities)")

    c = _sub(sub, "compare", "train configs x seeds and write a mean ± std table (results.md, "
             "results.csv, plots)", "gpattn-ppl compare experiments/configs/cola/"
             "{softmax,sgpa}.yaml --seeds 0 1 2 --set eval.temperature_scaling=true --out "
             "runs/cola_cmp", _compare)
    c.add_argument("configs", nargs="+", metavar="CONFIG", help="YAML configs, one method "
                   "each (named by file name: the names must differ), e.g. "
                   "experiments/configs/cola/softmax.yaml")
    c.add_argument("--seeds", nargs="+", type=int, default=[0, 1, 2], metavar="SEED",
                   help="train.seed values, distinct, 0 to 2**32-1 (default: 0 1 2), e.g. "
                   "--seeds 0 1")
    c.add_argument("--set", action="append", default=None, metavar="KEY.PATH=VALUE",
                   help=_SET_HELP + "; applied to every config")
    c.add_argument("--out", default="compare_out", metavar="DIR",
                   help="output folder: <method>/seed<k> run folders and the tables (default: "
                   "compare_out)")
    c.add_argument("--ensemble", type=int, default=0, metavar="K",
                   help="also report deep ensembles of K members (2 to the number of seeds), "
                        "one per block of K seeds (mean ± std over blocks), e.g. --ensemble 3 "
                        "--seeds 0 1 2 3 4 5 6 7 8")
    c.add_argument("--force", action="store_true", help="retrain every run folder in --out "
                   "afresh, also one that holds a different config (default: reuse finished "
                   "runs of the same config, resume interrupted ones, refuse a different "
                   "config), and overwrite a results.md, results.csv or plot in --out that no "
                   "compare.json there lists (default: refuse); only a run's own files are "
                   "removed")
    c.add_argument("--no-progress", action="store_true", help="no progress bars")
    c.add_argument("--no-plots", action="store_true", help="do not draw --out/plots/*.png")

    b = _sub(sub, "bench", "forward+backward time of attention units vs softmax (JSON)",
             "gpattn-ppl bench softmax sgpa '{\"kind\": \"kernel\", \"symmetric\": true}' --N "
             "128", _bench)
    b.add_argument("kinds", nargs="*", default=["softmax", "kernel"],
                   help="attention kinds, or JSON specs like '{\"kind\": \"kernel\", "
                   "\"symmetric\": true}' (default: softmax kernel)")
    b.add_argument("--B", type=_positive_int, default=32, help="batch size (default 32)")
    b.add_argument("--N", type=_positive_int, default=64, help="sequence length (default 64)")
    b.add_argument("--C", type=_positive_int, default=128, help="width (default 128)")
    b.add_argument("--H", type=_positive_int, default=4, help="heads, dividing --C (default 4)")
    b.add_argument("--repeats", type=_positive_int, default=20,
                   help="timed repeats (default 20)")
    b.add_argument("--device", default="cpu", help="cpu or cuda (default cpu)")
    b.add_argument("--out", default="benchmarks/results/layers.json", metavar="FILE",
                   help="JSON output (default benchmarks/results/layers.json)")

    d = _sub(sub, "demo", "the main job: fine-tune the bundled MiniLM with the recommended unit "
             "(CGPT in the last layer, posterior mean + TS) against softmax (+ TS, + last-layer "
             "Laplace) and SNGP on the bundled CLINC150 demo slice; one table, one sentence per "
             "baseline, the OOD figure. --all-units: every unit from scratch on frozen features "
             "(CoLA and the CLINC150 slice)", "gpattn-ppl demo --out demo_out", _demo)
    d.add_argument("--out", default="demo_out", metavar="DIR", help="output folder (default "
                   "demo_out)")
    d.add_argument("--smoke", action="store_true", help="tiny run in seconds (what CI runs)")
    d.add_argument("--seed", type=int, default=0, help="train.seed (default 0)")
    d.add_argument("--methods", nargs="+", default=None, metavar="METHOD",
                   help="a subset of the demo methods: softmax sngp cgpt; with --all-units the "
                   "sweep's, e.g. --methods softmax kep_svgp (default: all)")
    d.add_argument("--all-units", action="store_true",
                   help="the sweep: every registered unit, SNGP and softmax trained from "
                   "scratch on frozen MiniLM features of CoLA and the CLINC150 slice")
    d.add_argument("--tasks", nargs="+", default=None, metavar="TASK",
                   help="with --all-units, a subset of the sweep's tasks: cola, clinc150_slice "
                   "(default: both)")
    d.add_argument("--no-progress", action="store_true", help="no progress bars")
    flags = d.add_mutually_exclusive_group()
    flags.add_argument("--resume", action="store_true",
                       help="re-use finished / resume interrupted runs in --out (default: "
                       "refuse a folder that holds runs of the chosen methods)")
    flags.add_argument("--force", action="store_true",
                       help="retrain the chosen methods' runs in --out afresh (only each run's "
                       "own files are removed) and overwrite a results.md, results.csv or "
                       "plot there that no compare.json lists (default: refuse)")
    return p


def _hoist_threads(argv: list[str]) -> list[str]:
    """``--threads N`` (or ``--threads=N``) anywhere on the command line, moved before the
    command, where the main parser reads it (the last one wins, as argparse would)."""
    out, threads, i = [], [], 0
    while i < len(argv):
        word = argv[i]
        if word == "--":
            out += argv[i:]
            break
        if word == "--threads":
            threads += argv[i:i + 2]
            i += 2
            continue
        if word.startswith("--threads="):
            threads.append(word)
        else:
            out.append(word)
        i += 1
    return threads + out


def _gather_set(argv: list[str]) -> list[str]:
    """``--set a=1 b=2 CONFIG`` -> ``--set a=1 --set b=2 CONFIG``: a ``--set`` takes only the
    ``KEY.PATH=VALUE`` words that follow it, so positional arguments may come after it."""
    out, i = [], 0
    while i < len(argv):
        word = argv[i]
        if word == "--set":
            j = i + 1
            while j < len(argv) and _PAIR.match(argv[j]):
                out += ["--set", argv[j]]
                j += 1
            if j == i + 1:
                out.append(word)  # let argparse report the missing value
            i = j
            continue
        out.append(word)
        i += 1
    return out


_CPU_OOM = "DefaultCPUAllocator: can't allocate memory"


def _user_error(err: BaseException) -> bool:
    """Whether ``err`` carries a message for the user (a library error, a bad value, a file that
    cannot be read, invalid YAML, CUDA or CPU out of memory, a missing optional package whose
    message names the ``pip install``) rather than being a bug."""
    import yaml

    return (isinstance(err, (GpattnError, ValueError, OSError, yaml.YAMLError))
            or type(err).__name__ == "OutOfMemoryError"
            or (isinstance(err, RuntimeError) and _CPU_OOM in str(err))
            or (isinstance(err, ImportError) and "pip install" in str(err)))


def _message_lines(err: BaseException) -> list[str]:
    """The lines printed for a user error: the message's first line, and its first line
    starting with ``hint:`` if it has one; other lines are left to ``--debug``."""
    message = str(err).strip() or type(err).__name__
    if isinstance(err, RuntimeError) and _CPU_OOM in message:
        message = "out of memory: " + message.split(_CPU_OOM, 1)[1].lstrip(": ")
    lines = [line.strip() for line in message.splitlines() if line.strip()]
    hints = [line for line in lines[1:] if line.lower().startswith("hint:")][:1]
    if len(lines) > 1 + len(hints):
        lines[0] += " (--debug shows the whole message)"
    return lines[:1] + hints


def _import_plugins(modules: list[str]) -> None:
    """The entry-point plugins, then each ``--import`` module; a module that calls
    ``sys.exit`` while being imported is an error naming it (not a silent exit)."""
    from .plugins import ENTRY_POINT_GROUP, import_plugins, load_entry_points

    try:
        load_entry_points()
    except SystemExit as err:
        raise CommandLineError(f"a plugin of the entry-point group {ENTRY_POINT_GROUP} called "
                               f"sys.exit({err.code!r}) while being imported; nothing was run"
                               ) from None
    for name in modules:
        try:
            import_plugins([name])
        except SystemExit as err:
            raise CommandLineError(f"--import {name}: the module called sys.exit({err.code!r}) "
                                   "while being imported; nothing was run (a plugin module "
                                   "only registers units and datasets)") from None


def main(argv: list[str] | None = None) -> int:
    """Entry point of the ``gpattn-ppl`` console script.

    Errors become one ``gpattn-ppl <command>: error: <message>`` line on stderr: exit status 2
    for a user error (a :class:`~gpattn_ppl.errors.GpattnError` such as a bad config value, a
    malformed data file or a refused run folder; also ``ValueError``, ``OSError``, invalid YAML,
    running out of memory and a missing optional package whose message names its ``pip
    install``), 1 for anything else (a bug: the line says so), 130 when interrupted. Of a message
    of several lines, the first is printed, and its ``hint:`` line after it (``--debug`` for the
    rest); a bad argument is one line and a hint too. A ``--import`` module (or an entry-point
    plugin) that calls ``sys.exit`` while being imported is an error naming it, not an exit.
    ``--debug`` (anywhere on the command line) lets the error propagate with its traceback
    instead. ``--threads N`` (anywhere) sets ``torch.set_num_threads(N)`` first,
    N at most the CPUs the process may run on (a larger N is capped, with a warning line). The
    process's allocator keeps freed memory for reuse
    (:func:`~gpattn_ppl.run.allocator.keep_freed_memory`; ``GPATTN_PPL_MALLOC=system`` to opt out).

    :param argv: arguments (default: ``sys.argv[1:]``).
    :returns: the exit status.
    """
    argv = list(sys.argv[1:] if argv is None else argv)
    debug = "--debug" in argv
    argv = _gather_set(_hoist_threads([a for a in argv if a != "--debug"]))
    args = build_parser().parse_args(argv)
    if hasattr(args, "set") and args.set is None:
        args.set = []
    prog = f"gpattn-ppl {args.command}"
    from .allocator import apply_default_policy

    apply_default_policy()  # keep freed memory for reuse (no page faults per step; allocator.py)
    if args.threads is not None:
        import torch

        from .runtime import usable_cpus

        cpus = usable_cpus()
        if args.threads > cpus:  # bounded by the machine (a huge count crashes OpenMP)
            print(f"{prog}: warning: --threads {args.threads} is more than the {cpus} CPUs this "
                  f"process may run on; using {cpus}", file=sys.stderr)
        torch.set_num_threads(min(args.threads, cpus))
    try:
        _import_plugins(args.imports)
        return args.fn(args)
    except KeyboardInterrupt:
        if debug:
            raise
        print(f"{prog}: interrupted", file=sys.stderr)
        return 130
    except Exception as err:  # noqa: BLE001 -- the one error boundary of the command line
        if debug:
            raise
        message = str(err).strip() or type(err).__name__
        if _user_error(err):
            first, *hint = _message_lines(err)
            print("\n".join([f"{prog}: error: {first}", *hint]), file=sys.stderr)
            return 2
        first = message.splitlines()[0]
        print(f"{prog}: error: unexpected {type(err).__name__}: {first} (this is a bug in "
              "gpattn-ppl; run again with --debug for the traceback and report it)",
              file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
