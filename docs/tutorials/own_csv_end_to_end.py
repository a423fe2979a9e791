# ruff: noqa: E402 -- a tutorial imports what each section uses, where it is first used
"""
Train on your own CSV, end to end, from the CLI and from Python
===============================================================

Your data is a CSV file of texts and labels. This tutorial takes such a file through the whole
application twice: first with the ``gpattn-ppl`` command (train, evaluate, predict, plot, and
what happens when a run folder is used a second time), then with the same steps from Python.
Along the way it shows

* the ``csv`` dataset (:mod:`gpattn_ppl.data.tabular`): a training file, a test file and an
  out-of-distribution file without labels; the validation split is held out of the training
  file;
* run folders (:mod:`gpattn_ppl.run.rundir`), which are never trained into with another config
  by accident;
* errors in a data file, which name the file, the line and the column.

The data set is made up below and the network is tiny, so that everything runs in seconds on a
CPU.
"""

# %%
# A small labelled data set
# -------------------------
#
# A toy topic task with string labels: short sentences about ``food``, ``sport`` or ``tech``,
# built from word lists with a seeded :class:`random.Random`. One sentence in six mixes in a word
# of another topic, so that not every sentence is easy. The test file has the same columns; the
# OOD file holds sentences about the weather, which belong to none of the classes, and has no
# label column at all.

import csv
import random
import tempfile
from pathlib import Path

TOPICS = {
    "food": ["soup", "pasta", "recipe", "chef", "oven", "garlic", "dessert", "bread", "salad",
             "kitchen"],
    "sport": ["goal", "match", "team", "coach", "referee", "striker", "league", "stadium",
              "penalty", "tennis"],
    "tech": ["laptop", "software", "server", "browser", "update", "battery", "chip", "app",
             "network", "keyboard"],
}
WEATHER = ["rain", "storm", "cloud", "thunder", "fog", "snow", "wind", "sunshine", "drizzle",
           "forecast"]
OPENERS = ["I liked the", "They talked about the", "We saw a new", "Nobody expected the",
           "My friend hated the", "Everyone praised the", "The news was about the"]
LINKS = ["and the", "near the", "after the", "with the", "before the"]


def sentence(rng: random.Random, words: list[str], other: list[str] | None = None) -> str:
    first, second = rng.sample(words, 2)
    if other is not None:
        second = rng.choice(other)
    return f"{rng.choice(OPENERS)} {first} {rng.choice(LINKS)} {second}."


def labelled(rng: random.Random, per_class: int) -> list[tuple[str, str]]:
    rows = []
    for topic, words in TOPICS.items():
        for _ in range(per_class):
            mixed = rng.random() < 1 / 6
            other = TOPICS[rng.choice([t for t in TOPICS if t != topic])] if mixed else None
            rows.append((sentence(rng, words, other), topic))
    rng.shuffle(rows)
    return rows


def write_csv(path: Path, header: list[str], rows: list[tuple]) -> None:
    with open(path, "w", newline="", encoding="utf-8") as fh:
        writer = csv.writer(fh)
        writer.writerow(header)
        writer.writerows(rows)


rng = random.Random(0)
work = Path(tempfile.mkdtemp())
write_csv(work / "train.csv", ["text", "label"], labelled(rng, 70))
write_csv(work / "test.csv", ["text", "label"], labelled(rng, 20))
write_csv(work / "ood.csv", ["text"], [(sentence(rng, WEATHER),) for _ in range(40)])

for name in ("train.csv", "test.csv", "ood.csv"):
    lines = (work / name).read_text().splitlines()
    print(f"{name}: {len(lines) - 1} rows")
    print("   " + "\n   ".join(lines[:4]))

# %%
# The config
# ----------
#
# A config names the dataset ``csv`` and its files in the ``data`` section (the full format is
# in :ref:`config-format`). Relative file names are taken from ``data.root`` when it is set (here:
# the folder the files were just written to), else from the working directory. There is no
# ``val_file``: a seeded, label-stratified 10% of the
# training file is then held out for validation (``data.split_seed`` seeds it; without a
# ``test_file`` a test split would be held out the same way). ``text_column`` and
# ``label_column`` name the columns (``text`` and ``label`` are the defaults); the classes are
# the sorted distinct labels of the training file.
#
# The model is a one-block Transformer with softmax attention and ``mc_dropout: true``: dropout
# stays on at test time, so each prediction averages ``eval.mc_samples`` stochastic passes and
# has a mutual information. Any registered attention kind fits in ``model.attention`` instead.
# ``eval.metrics`` and ``eval.ood_detectors`` keep the printed summaries short.

CONFIG = f"""\
model:
  arch: text
  dim: 32
  depth: 1
  heads: 2
  mlp_dim: 64
  dropout: 0.1
  mc_dropout: true
  attention: {{kind: softmax}}
data:
  name: csv
  root: {work}
  train_file: train.csv
  test_file: test.csv
  ood_files: {{weather: ood.csv}}
  text_column: text
  label_column: label
  max_len: 16
  batch_size: 16
train: {{epochs: 3, lr: 1.0e-2, warmup_epochs: 0.5, seed: 0, progress: false, device: cpu}}
eval:
  mc_samples: 4
  metrics: [acc, nll, ece]
  ood_detectors: [max_softmax, entropy, mutual_info]
"""
(work / "config.yaml").write_text(CONFIG)
print(CONFIG)

# %%
# From the command line
# ---------------------
#
# Installing the package puts the ``gpattn-ppl`` command on the path; ``python -m
# gpattn_ppl.run.cli`` is the same program. This page runs it through :mod:`subprocess` with the
# interpreter that builds it, in the folder holding the files, and prints what it prints and its
# exit code (and checks that code, so that a command that fails stops the build of this page).
# In a terminal, type what follows the ``$``. (``OMP_NUM_THREADS=1``: a network this small runs
# fastest on one CPU thread, more so on a machine that is busy with other work; the Python part
# below sets the same with :func:`torch.set_num_threads`.)

import os
import subprocess
import sys


def cli(*args: str, expect: int = 0) -> None:
    """``gpattn-ppl ARGS`` in the data folder: print the command, its output and exit code."""
    print("$ gpattn-ppl", " ".join(args))
    proc = subprocess.run([sys.executable, "-m", "gpattn_ppl.run.cli", *args], cwd=work,
                          env={**os.environ, "OMP_NUM_THREADS": "1"},
                          capture_output=True, text=True)
    print(proc.stdout + proc.stderr, end="")
    print(f"[exit code {proc.returncode}]")
    assert proc.returncode == expect, f"expected exit code {expect}"


cli("--help")

# %%
# ``train CONFIG --out RUN`` checks the config, trains into the run folder ``RUN``, keeps the
# checkpoint with the best validation score (accuracy here), evaluates it on the test and OOD
# sets and prints a summary as JSON: the test metrics, per OOD set how well each detector's
# score separates it from the test set (AUROC, AUPR, FPR at 95% TPR), and the cost.

cli("train", "config.yaml", "--out", "run")
print(sorted(p.name for p in (work / "run").iterdir()))

# %%
# The run folder holds everything later commands need: the validated config, the manifest
# ``run.json`` (classes, sizes, the fingerprint of the data), the vocabulary in
# ``encoder.json``, the checkpoints, the per-epoch log, the results and the predictions of
# every evaluated split (see :mod:`gpattn_ppl.run.rundir`).
#
# ``evaluate RUN`` evaluates the best checkpoint again, with the eval section changed by
# ``--set eval.KEY=VALUE`` if you like. Here it adds temperature scaling: one temperature is
# fitted on the validation split, the summary gains a ``temperature_scaling`` entry, and the
# temperature is stored in ``calibration.json``, which ``predict`` then applies. The raw test
# metrics can differ a little from those ``train`` printed: with MC dropout the network is
# stochastic and ``evaluate`` draws its passes anew. (``evaluate`` also draws the run's figures
# into ``RUN/plots``; ``--no-plots`` skips that, as the next command draws them.)

cli("evaluate", "run", "--set", "eval.temperature_scaling=true", "--no-plots")

# %%
# ``predict RUN --input FILE`` reads texts from a ``.txt`` file (one per line), a ``.csv`` /
# ``.tsv`` file (a ``text`` column) or a ``.jsonl`` file, and prints one JSON line per text: the
# text, the predicted class (``label``) and its probability (``score``), the class probabilities
# (``probs``), the predictive entropy and the mutual information between the passes
# (``mutual_info``; ``null`` for a deterministic network). ``--out FILE`` writes the lines to a
# file instead; ``--samples T`` sets the number of passes.

(work / "new.txt").write_text("The chef baked fresh bread in the oven.\n"
                              "The striker scored a late goal.\n"
                              "The chef fixed the laptop.\n"
                              "Heavy rain and thunder all night.\n")
cli("predict", "run", "--input", "new.txt")

# %%
# ``plot RUN [RUN ...] --out DIR`` draws the reliability diagram, the risk-coverage curve and,
# per OOD set and detector, the score histograms of one or more evaluated runs (the tutorial
# :doc:`swap_unit_uncertainty` shows and explains them):

cli("plot", "run", "--out", "figures")

# %%
# A run folder is never overwritten by accident
# ---------------------------------------------
#
# Training into a folder that holds a run with another config is refused before anything is
# written: exit code 2, and the message names every key that differs.

cli("train", "config.yaml", "--out", "run", "--set", "train.lr=0.02", expect=2)

# %%
# Two flags of ``train`` say what to do with a folder that holds a run:
#
# * ``--resume`` continues it, with the same config only: an interrupted run goes on from its
#   last finished epoch (``last.pt``; exactly: the per-step losses equal those of an
#   uninterrupted run), a finished one is only evaluated again;
# * ``--force`` discards it (the run's files are deleted, nothing else in the folder) and trains
#   afresh with the new config.
#
# So ``gpattn-ppl train config.yaml --out run --set train.lr=0.02 --force`` would retrain with
# the new learning rate; the Python section below does exactly that, and resumes the result.

# %%
# From Python
# -----------
#
# The commands are thin wrappers over the library; everything above is a few calls.
#
# :func:`~gpattn_ppl.data.load_data` reads the same files into a
# :class:`~gpattn_ppl.data.load.DataBundle` (encoded splits, OOD sets, the fitted vocabulary) to
# look at before training. The fingerprint is a digest of the splits' texts and labels; every
# run records it in ``run.json``, and ``evaluate`` or ``--resume`` refuse a run whose data has
# changed since it was trained.

import json

import torch

from gpattn_ppl.data import load_data

threads = torch.get_num_threads()
torch.set_num_threads(1)          # as OMP_NUM_THREADS=1 above: fastest for a network this small

bundle = load_data("csv", root=str(work), train_file="train.csv", test_file="test.csv",
                   ood_files={"weather": "ood.csv"}, text_column="text", label_column="label",
                   max_len=16)
print("classes:", bundle.classes)
print("sizes:", bundle.info["sizes"], "| vocabulary:", bundle.vocab_size, "words")
print("split:", bundle.info["split"])
print("fingerprint:", bundle.fingerprint)
manifest = json.loads((work / "run" / "run.json").read_text())
print("same data as the CLI run:", manifest["data"]["fingerprint"] == bundle.fingerprint)

# %%
# :func:`~gpattn_ppl.run.config.load_config` reads and validates the YAML file, with the same
# ``KEY.PATH=VALUE`` overrides as ``--set``, and :class:`~gpattn_ppl.run.experiment.Trainer` is
# ``train``: it checks the run folder, trains, evaluates and returns what ``results.json``
# holds. Its ``resume`` and ``force`` arguments are the two flags. Without either, the folder of
# the command-line run is refused, as above, with a
# :class:`~gpattn_ppl.run.rundir.RunFolderError`:

from gpattn_ppl.run import RunFolderError, Trainer, load_config

cfg = load_config(work / "config.yaml", ["train.lr=0.02"])
try:
    Trainer(cfg, work / "run")
except RunFolderError as err:
    print("RunFolderError:", err)

# %%
# ``force=True`` discards that run and trains the new config in its place:

results = Trainer(cfg, work / "run", force=True).fit()
print("test:", {k: round(v, 3) for k, v in results["test"].items()})
for detector, scores in results["ood"]["weather"]["detection"].items():
    print(f"OOD AUROC weather, {detector}: {scores['auroc']:.3f}")

# %%
# ``resume=True`` with the same config continues the run; this one is finished, so it is only
# evaluated again (its random state is restored from ``last.pt``, so even the stochastic passes
# repeat):

again = Trainer(cfg, work / "run", resume=True).fit()
print("same test metrics:", again["test"] == results["test"])

# %%
# :func:`gpattn_ppl.load_run <gpattn_ppl.run.predictor.load_run>` is ``predict``: it restores a
# run folder (config, vocabulary, best weights, temperature if any) without reading the data
# files, and :meth:`~gpattn_ppl.run.predictor.Predictor.predict` returns the records that
# ``predict`` prints. This run has no temperature (1): ``force=True`` deleted the earlier run's
# files (those its manifest lists), ``calibration.json`` with them, and its own config does not ask for temperature
# scaling. The first sentence, made of training words of one topic, should be the most certain;
# the others mix topics or consist mostly of words the training file does not have.

import gpattn_ppl

predictor = gpattn_ppl.load_run(work / "run")
print(predictor)
texts = (work / "new.txt").read_text().splitlines()
for text, record in zip(texts, predictor.predict(texts, samples=8)):
    probs = " ".join(f"{c}={p:.2f}" for c, p in record["probs"].items())
    print(f"{record['label']:<6} {probs}  entropy={record['entropy']:.3f} "
          f"mi={record['mutual_info']:.4f}  {text}")

# %%
# Errors name the file, the line and the column
# ---------------------------------------------
#
# A problem in a data file is reported where it is. A test file with a label the training file
# does not have, on its third data row:

rows = [("The coach praised the team.", "sport"), ("The app crashed again.", "tech"),
        ("The fog covered the stadium.", "weather")]
write_csv(work / "bad_test.csv", ["text", "label"], rows)
try:
    load_data("csv", root=str(work), train_file="train.csv", test_file="bad_test.csv")
except ValueError as err:
    print("ValueError:", err)

# %%
# A missing column, a row with the wrong number of fields, an empty text or label, a file that
# is not UTF-8 and invalid JSON (for the ``jsonl`` dataset) are reported the same way; from the
# command line, the message is printed as ``gpattn-ppl train: error: ...`` with exit code 2.
#
# Your own datasets and attention units
# -------------------------------------
#
# A CSV or JSON-lines file (dataset ``jsonl``, one object per line) covers most text data; a
# folder of images per class is the ``image_folder`` dataset. Anything else is a small module
# that registers a dataset builder with :func:`~gpattn_ppl.data.registry.register_dataset`
# (or an attention unit with :func:`~gpattn_ppl.attention.registry.register_attention`, see
# :doc:`new_attention_unit`):
#
# .. code-block:: python
#
#     # mymodule.py
#     import torch
#
#     from gpattn_ppl.data import RawData, register_dataset
#
#
#     @register_dataset("reviews", protocols=("given",), modality="text")
#     def build_reviews(*, protocol, root, split_seed, cache_dir):
#         texts, labels = ...  # read your files
#         n = len(texts)
#         return RawData(x=texts, y=torch.tensor(labels),
#                        splits={"train": torch.arange(0, n - 200),
#                                "val": torch.arange(n - 200, n - 100),
#                                "test": torch.arange(n - 100, n)},
#                        ood={}, num_classes=2, classes=["negative", "positive"])
#
# ``--import`` loads the module before the command runs (a dotted module name, or a path to a
# ``.py`` file), so a config can say ``data: {name: reviews}``:
#
# .. code-block:: console
#
#     $ gpattn-ppl --import mymodule train reviews.yaml --out runs/reviews
#
# The run records the imported modules in ``run.json``; ``evaluate`` and ``predict`` need the
# same ``--import`` (a run folder never imports code by itself, so one shared with you cannot
# run code), and :func:`gpattn_ppl.load_run <gpattn_ppl.run.predictor.load_run>` needs the
# module imported first. An
# installed package can declare its module as an entry point in the group
# ``gpattn_ppl.plugins`` instead, which every command imports (see
# :mod:`gpattn_ppl.run.plugins`).

# %%
# Cleaning up
# -----------
#
# Every file of this page went into one temporary folder; torch gets its threads back:

import shutil

shutil.rmtree(work)
torch.set_num_threads(threads)
