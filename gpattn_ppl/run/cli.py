"""Command line: ``gpattn-ppl train | evaluate | predict | plot | compare | bench | demo``.

Every command prints strict JSON or Markdown; errors the user can fix (a bad config, a missing
or malformed file, a refused run folder) print one ``gpattn-ppl <command>: error: ...`` line and
exit with 2; any other exception is a bug (one line saying so, exit 1). ``--debug`` shows the
traceback instead.
``--set KEY.PATH=VALUE`` pairs may come before or after the positional arguments.
"""

from __future__ import annotations

import argparse
import re
import sys
from pathlib import Path

__all__ = ["main", "build_parser"]

_SET_HELP = ("override a config value, e.g. --set train.lr=1e-3 model.attention.kind=kernel "
             "(YAML scalars; may come before or after the positional arguments)")
_PAIR = re.compile(r"^[A-Za-z_][\w\-]*(\.[\w\-]+)*=")


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
    from .experiment import Trainer
    from .output import dumps, summary

    out = Path(args.out) if args.out else _default_out(args.config)
    trainer = Trainer(load_config(args.config, args.set), out, resume=args.resume,
                      force=args.force)
    results = trainer.fit()
    print(dumps(summary(results, out)))
    return 0


def _evaluate(args) -> int:
    from .experiment import evaluate_run
    from .output import dumps, summary

    results = evaluate_run(args.run_dir, ood=args.ood, overrides=args.set,
                           allow_changed_data=args.allow_changed_data)
    if not args.no_plots:
        from .plotting import plot_runs

        plot_runs([Path(args.run_dir)], Path(args.run_dir) / "plots")
    print(dumps(summary(results, args.run_dir)))
    return 0


def _predict(args) -> int:
    from .config import check_device
    from .output import dumps
    from .predictor import load_run, read_inputs

    check_device(args.device, "predict --device")
    texts = read_inputs(args.input, args.text_column)
    predictor = load_run(args.run_dir, device=args.device, temperature=not args.no_temperature)
    records = predictor.predict(texts, samples=args.samples, batch_size=args.batch_size,
                                seed=args.seed)
    lines = [dumps({"text": t, **r}, indent=None) for t, r in zip(texts, records)]
    if args.out:
        out = Path(args.out)
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text("\n".join(lines) + "\n")
        print(f"wrote {len(lines)} predictions to {out}", file=sys.stderr)
    else:
        print("\n".join(lines))
    return 0


def _plot(args) -> int:
    from .plotting import plot_runs

    for path in plot_runs([Path(d) for d in args.run_dirs], Path(args.out)):
        print(path)
    return 0


def _compare(args) -> int:
    from .compare import format_markdown, run_compare

    rows = run_compare(args.configs, args.seeds, args.out, overrides=args.set,
                       ensemble=args.ensemble, progress=not args.no_progress, force=args.force,
                       plots=not args.no_plots)
    print(format_markdown(rows))
    print(f"\nwrote {args.out}/results.md and results.csv")
    return 0


def _bench(args) -> int:
    import json

    from .benchmarking import bench_layers, write_json
    from .config import check_device

    check_device(args.device, "bench --device")
    if args.device == "auto":
        from .runtime import select_device

        args.device = str(select_device("auto"))

    kinds = [json.loads(k) if k.startswith("{") else {"kind": k} for k in args.kinds]
    res = bench_layers(kinds, B=args.B, N=args.N, dim=args.C, heads=args.H, repeats=args.repeats,
                       device=args.device)
    path = write_json(res, args.out)
    for r in res["layers"]:
        print(f"{r['kind']:>12} {r['options']}  {1e3 * r['median_s']:.2f} ms  "
              f"x{r['ratio_to_softmax']:.2f} softmax")
    print(f"wrote {path}")
    return 0


def _demo(args) -> int:
    from .demo import run_demo

    print(run_demo(args.out, smoke=args.smoke, seed=args.seed, methods=args.methods,
                   progress=not args.no_progress, resume=args.resume))
    return 0


def _sub(sub, name: str, help: str, example: str, fn):
    p = sub.add_parser(name, help=help, description=help, epilog=f"example:\n  {example}",
                       formatter_class=argparse.RawDescriptionHelpFormatter)
    p.set_defaults(fn=fn)
    return p


def build_parser() -> argparse.ArgumentParser:
    """The argument parser of ``gpattn-ppl`` (every argument has help text and an example)."""
    p = argparse.ArgumentParser(
        prog="gpattn-ppl", description="Uncertainty-aware Transformer attention (GP and "
        "stochastic units): train, evaluate, predict, plot, compare, bench, demo.",
        epilog="example:\n  gpattn-ppl train experiments/configs/cola/softmax.yaml "
        "--set train.epochs=5\n  gpattn-ppl <command> --help   (help and an example per command)",
        formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--version", action="version", version=f"gpattn-ppl {_version()}")
    p.add_argument("--debug", action="store_true", help="on an error, show the full traceback "
                   "instead of one line (may also come after the command), e.g. gpattn-ppl "
                   "--debug train cfg.yaml")
    p.add_argument("--import", dest="imports", action="append", default=[], metavar="MODULE",
                   help="import MODULE (dotted name or path/to/file.py) first, so the datasets "
                   "and attention units it registers can be used; repeatable, e.g. --import "
                   "mypkg.units")
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
             "draws its plots into RUN_DIR/plots", "gpattn-ppl evaluate runs/cola/softmax "
             "--ood cola_ood --set eval.temperature_scaling=true", _evaluate)
    e.add_argument("run_dir", help="a run folder written by train, e.g. runs/cola/softmax")
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

    r = _sub(sub, "predict", "predict new inputs with a trained run (JSON Lines: text, probs, "
             "pred, entropy, mutual_info, msp)", "gpattn-ppl predict runs/cola/softmax --input "
             "sentences.txt --out predictions.jsonl --samples 20", _predict)
    r.add_argument("run_dir", help="a run folder written by train, e.g. runs/cola/softmax")
    r.add_argument("--input", required=True, metavar="FILE",
                   help="texts: .txt (one per line), .csv / .tsv (a 'text' column) or .jsonl "
                   "(a 'text' key), e.g. --input new.csv")
    r.add_argument("--text-column", default=None, metavar="NAME",
                   help="the column / key holding the text (default: text), e.g. --text-column "
                   "sentence")
    r.add_argument("--out", default=None, metavar="FILE",
                   help="write JSON Lines here (default: print them), e.g. --out preds.jsonl")
    r.add_argument("--samples", type=int, default=None, metavar="T",
                   help="stochastic passes averaged per input (default: eval.mc_samples of the "
                   "run; deterministic networks run once), e.g. --samples 20")
    r.add_argument("--batch-size", type=int, default=256, help="inputs per forward pass, e.g. "
                   "--batch-size 64")
    r.add_argument("--seed", type=int, default=0, help="seed of the stochastic passes, e.g. "
                   "--seed 1")
    r.add_argument("--device", default="cpu", help="cpu, cuda, cuda:1 or auto, e.g. --device "
                   "auto")
    r.add_argument("--no-temperature", action="store_true",
                   help="ignore the run's fitted temperature (raw probabilities)")

    g = _sub(sub, "plot", "draw reliability diagrams, risk-coverage curves and OOD score "
             "histograms of evaluated runs", "gpattn-ppl plot runs/cola/softmax "
             "runs/cola/sgpa --out plots/", _plot)
    g.add_argument("run_dirs", nargs="+", metavar="RUN_DIR",
                   help="evaluated run folders (with predictions.pt), e.g. runs/cola/softmax")
    g.add_argument("--out", required=True, metavar="DIR", help="folder for the PNGs, e.g. "
                   "--out plots/")

    c = _sub(sub, "compare", "train configs x seeds and write a mean ± std table (results.md, "
             "results.csv, plots)", "gpattn-ppl compare experiments/configs/cola/"
             "{softmax,sgpa}.yaml --seeds 0 1 2 --set eval.temperature_scaling=true --out "
             "runs/cola_cmp", _compare)
    c.add_argument("configs", nargs="+", metavar="CONFIG", help="YAML configs, one method "
                   "each (named by file name), e.g. experiments/configs/cola/softmax.yaml")
    c.add_argument("--seeds", nargs="+", type=int, default=[0, 1, 2], metavar="SEED",
                   help="train.seed values (default: 0 1 2), e.g. --seeds 0 1")
    c.add_argument("--set", action="append", default=None, metavar="KEY.PATH=VALUE",
                   help=_SET_HELP + "; applied to every config")
    c.add_argument("--out", default="compare_out", metavar="DIR",
                   help="output folder: <method>/seed<k> run folders and the tables (default: "
                   "compare_out)")
    c.add_argument("--ensemble", type=int, default=0, metavar="K",
                   help="also report deep ensembles of K members, one per block of K seeds "
                        "(mean ± std over blocks), e.g. --ensemble 3 --seeds 0 1 2 3 4 5 6 7 8")
    c.add_argument("--force", action="store_true", help="retrain run folders in --out that "
                   "hold a different config (default: refuse)")
    c.add_argument("--no-progress", action="store_true", help="no progress bars")
    c.add_argument("--no-plots", action="store_true", help="do not draw --out/plots/*.png")

    b = _sub(sub, "bench", "forward+backward time of attention units vs softmax (JSON)",
             "gpattn-ppl bench softmax sgpa '{\"kind\": \"kernel\", \"symmetric\": true}' --N "
             "128", _bench)
    b.add_argument("kinds", nargs="*", default=["softmax", "kernel"],
                   help="attention kinds, or JSON specs like '{\"kind\": \"kernel\", "
                   "\"symmetric\": true}' (default: softmax kernel)")
    b.add_argument("--B", type=int, default=32, help="batch size (default 32)")
    b.add_argument("--N", type=int, default=64, help="sequence length (default 64)")
    b.add_argument("--C", type=int, default=128, help="width (default 128)")
    b.add_argument("--H", type=int, default=4, help="heads (default 4)")
    b.add_argument("--repeats", type=int, default=20, help="timed repeats (default 20)")
    b.add_argument("--device", default="cpu", help="cpu or cuda (default cpu)")
    b.add_argument("--out", default="benchmarks/results/layers.json", metavar="FILE",
                   help="JSON output (default benchmarks/results/layers.json)")

    d = _sub(sub, "demo", "the main job: train and evaluate every registered unit on the "
             "bundled CoLA data; table and plots", "gpattn-ppl demo --methods softmax sgpa "
             "--out demo_out", _demo)
    d.add_argument("--out", default="demo_out", metavar="DIR", help="output folder (default "
                   "demo_out)")
    d.add_argument("--smoke", action="store_true", help="tiny run in seconds (what CI runs)")
    d.add_argument("--seed", type=int, default=0, help="train.seed (default 0)")
    d.add_argument("--methods", nargs="+", default=None, metavar="METHOD",
                   help="a subset of the demo methods, e.g. --methods softmax kep_svgp "
                   "(default: all)")
    d.add_argument("--no-progress", action="store_true", help="no progress bars")
    d.add_argument("--resume", action="store_true",
                   help="re-use finished / resume interrupted runs in --out (default: start "
                   "afresh)")
    return p


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


def _user_error(err: BaseException) -> bool:
    """Whether ``err`` carries a message for the user (a library error, a bad value, a file that
    cannot be read, invalid YAML, CUDA out of memory) rather than being a bug."""
    import yaml

    from ..errors import GpattnError

    return (isinstance(err, (GpattnError, ValueError, OSError, yaml.YAMLError))
            or type(err).__name__ == "OutOfMemoryError")


def main(argv: list[str] | None = None) -> int:
    """Entry point of the ``gpattn-ppl`` console script.

    Errors become one ``gpattn-ppl <command>: error: <message>`` line on stderr: exit status 2
    for a user error (a :class:`~gpattn_ppl.errors.GpattnError` such as a bad config value, a
    malformed data file or a refused run folder; also ``ValueError``, ``OSError`` and invalid
    YAML), 1 for anything else (a bug: the line says so), 130 when interrupted. ``--debug``
    (anywhere on the command line) lets the error propagate with its traceback instead. The
    process's allocator keeps freed memory for reuse
    (:func:`~gpattn_ppl.run.allocator.keep_freed_memory`; ``GPATTN_PPL_MALLOC=system`` to opt out).

    :param argv: arguments (default: ``sys.argv[1:]``).
    :returns: the exit status.
    """
    argv = list(sys.argv[1:] if argv is None else argv)
    debug = "--debug" in argv
    argv = _gather_set([a for a in argv if a != "--debug"])
    args = build_parser().parse_args(argv)
    if hasattr(args, "set") and args.set is None:
        args.set = []
    prog = f"gpattn-ppl {args.command}"
    from .allocator import apply_default_policy

    apply_default_policy()  # keep freed memory for reuse (no page faults per step; allocator.py)
    try:
        from .plugins import import_plugins, load_entry_points

        load_entry_points()
        import_plugins(args.imports)
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
            print(f"{prog}: error: {message}", file=sys.stderr)
            return 2
        first = message.splitlines()[0]
        print(f"{prog}: error: unexpected {type(err).__name__}: {first} (this is a bug in "
              "gpattn-ppl; run again with --debug for the traceback and report it)",
              file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
