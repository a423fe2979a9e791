# ruff: noqa: E402 -- a tutorial imports what each section uses, where it is first used
"""
Swap an attention unit and read its uncertainty on CoLA
=======================================================

What changes when the softmax attention of a Transformer is replaced by a stochastic,
Gaussian-process attention unit? This tutorial trains two CoLA classifiers whose configs differ
in one place, the attention of the last block:

* ``softmax``: the deterministic baseline, softmax attention in every block;
* ``kep_svgp``: the same network with KEP-SVGP attention
  (:class:`~gpattn_ppl.attention.kep_svgp.KEPSVGPAttention`) in its last block, the setting of
  the KEP-SVGP paper.

It then reads what the library reports about their uncertainty:

1. test accuracy, MCC, NLL and ECE, before and after temperature scaling, and how well each
   uncertainty score tells the out-of-domain CoLA sentences from the in-domain test set (OOD
   AUROC);
2. the figures of :func:`~gpattn_ppl.run.plotting.plot_runs`: reliability diagrams, the
   risk-coverage curve and OOD score histograms;
3. per-sentence probabilities, entropy and mutual information from a trained run folder with
   :func:`gpattn_ppl.load_run <gpattn_ppl.run.predictor.load_run>`.

.. note::

    The runs here are toy-sized so that the page builds in seconds on a CPU: a width-16
    network, 512 training sentences, 2 epochs. Such a model barely learns CoLA, so **the numbers
    and figures below mean nothing about the methods**; they show what to look at. The real
    comparison, three seeds of the full-size configs with temperature scaling, is::

        gpattn-ppl compare experiments/configs/cola/{softmax,mc_dropout,kep_svgp}.yaml \\
            --seeds 0 1 2 --set eval.temperature_scaling=true

    which writes the mean ± std table (``results.md``, ``results.csv``) and the same figures.
"""

# %%
# Two configs that differ in the attention only
# ---------------------------------------------
#
# A config has four sections, ``model``, ``data``, ``train`` and ``eval`` (see
# :ref:`config-format`); every key left out takes its default. The two runs share one config
# and the stochastic one adds a per-block ``overrides`` entry: block ``-1`` (the last) gets a
# ``kep_svgp`` unit with its default options (rank 5, ``add`` merge, cosine feature maps).
# Writing ``{"kind": "sgpa"}`` there instead would try SGPA attention; any registered kind works.
#
# ``eval.temperature_scaling`` fits one temperature per run on the validation split and reports
# every metric a second time for the tempered predictive. ``eval.mc_samples`` is the number of
# stochastic forward passes averaged at evaluation (a deterministic network is run once).
#
# A network this small runs fastest on one CPU thread (more so on a machine busy with other
# work), so this page sets that for its duration.

import copy
import tempfile
from pathlib import Path

import torch
import yaml

from gpattn_ppl.run import Trainer, load_config

threads = torch.get_num_threads()
torch.set_num_threads(1)

base = {
    "model": {"arch": "text", "dim": 16, "depth": 2, "heads": 2, "mlp_dim": 32,
              "dropout": 0.1, "max_len": 32, "attention": {"kind": "softmax"}},
    "data": {"name": "cola", "max_len": 32, "batch_size": 32,
             "limit_train": 512, "limit_eval": 128},
    "train": {"epochs": 2, "lr": 3e-3, "warmup_epochs": 0.5, "seed": 0, "progress": False,
              "device": "cpu"},
    "eval": {"mc_samples": 8, "temperature_scaling": True},
}
stochastic = copy.deepcopy(base)
stochastic["model"]["overrides"] = [{"blocks": [-1], "attention": {"kind": "kep_svgp"}}]
configs = {"softmax": base, "kep_svgp": stochastic}

print(yaml.safe_dump({"model": stochastic["model"]}, sort_keys=False, default_flow_style=None))

# %%
# :func:`~gpattn_ppl.run.config.load_config` validates a config and fills in its defaults; the
# two validated configs differ in one key:

validated = {name: load_config(cfg) for name, cfg in configs.items()}
for section, keys in validated["softmax"].items():
    for key, value in keys.items():
        other = validated["kep_svgp"][section][key]
        if value != other:
            print(f"{section}.{key}: softmax {value!r}  |  kep_svgp {other!r}")

# %%
# Train both
# ----------
#
# :class:`~gpattn_ppl.run.experiment.Trainer` trains one config into a run folder, keeps the
# checkpoint with the best validation score (MCC on CoLA) and evaluates it on the test set and
# the OOD set; :meth:`~gpattn_ppl.run.experiment.Trainer.fit` returns the results (also written
# to ``results.json`` in the folder). ``gpattn-ppl train CONFIG --out RUN`` does the same from
# the command line.

root = Path(tempfile.mkdtemp())
results, run_dirs = {}, {}
for name, cfg in configs.items():
    run_dirs[name] = root / name
    results[name] = Trainer(cfg, run_dirs[name]).fit()
    print(f"{name}: best epoch {results[name]['best_epoch']}, "
          f"{results[name]['cost']['params']} parameters, "
          f"{results[name]['cost']['sec_per_epoch']:.2f} s per epoch")

print(sorted(p.name for p in run_dirs["kep_svgp"].iterdir()))

# %%
# The comparison table
# --------------------
#
# ``results["test"]`` holds the test metrics of the raw predictive, ``results["ts"]["test"]``
# those after temperature scaling and ``results["temperature_scaling"]["temperature"]`` the
# fitted temperature :math:`\tau` (above 1: the raw model was overconfident on the validation
# split). ``results["ood"]["cola_ood"]["detection"]`` holds, per detector, how well its score
# ranks the in-domain test sentences above the out-of-domain ones (AUROC; 0.5 is chance):
# ``max_softmax`` (the largest class probability) and ``entropy`` (of the predictive) exist for
# every model; ``mutual_info``, the disagreement between the stochastic passes (epistemic
# uncertainty), only for a stochastic one.

metrics = ("acc", "mcc", "nll", "ece")
detectors = {"max_softmax": "msp", "entropy": "entropy", "mutual_info": "MI"}
header = (f"{'':<9} {'':>5} | {'test, raw':^27} | {'after TS':^13} | {'OOD AUROC (cola_ood)':^24}\n"
          f"{'method':<9} {'tau':>5} | " + " ".join(f"{m:>6}" for m in metrics) + " | "
          + " ".join(f"{m:>6}" for m in ("nll", "ece")) + " | "
          + " ".join(f"{d:>7}" for d in detectors.values()))
print(header)
print("-" * len(header.splitlines()[-1]))
for name, r in results.items():
    tau = r["temperature_scaling"]["temperature"]
    raw = " ".join(f"{r['test'][m]:6.3f}" for m in metrics)
    ts = " ".join(f"{r['ts']['test'][m]:6.3f}" for m in ("nll", "ece"))
    detection = r["ood"]["cola_ood"]["detection"]
    auroc = " ".join(f"{detection[d]['auroc']:7.3f}" if d in detection else f"{'-':>7}"
                     for d in detectors)
    print(f"{name:<9} {tau:5.2f} | {raw} | {ts} | {auroc}")

# %%
# Temperature scaling divides every logit by :math:`\tau`. That cannot change which class wins,
# so accuracy and MCC stay as they are; it moves the confidence, which is what NLL and ECE
# measure. With two classes it does not reorder the max-softmax scores of a deterministic
# network either, so its OOD AUROC stays too. The tempered OOD numbers are in
# ``results["ts"]["ood"]``.
#
# The figures
# -----------
#
# :func:`~gpattn_ppl.run.plotting.plot_runs` draws the evaluation figures of finished run folders
# from the per-pass predictions each one stores (``predictions.pt``) and returns the paths of
# the PNGs; ``gpattn-ppl plot RUN_A RUN_B --out DIR`` is the same on the command line. The
# pictures are files, so this page loads each one and shows it:

import matplotlib.image as mpimg
import matplotlib.pyplot as plt

from gpattn_ppl.run import plot_runs

names = list(run_dirs)
pngs = plot_runs([run_dirs[n] for n in names], root / "plots", names=names)
print([p.name for p in pngs])


def show(png: Path) -> None:
    """Show a PNG at its own size (one image pixel per screen pixel)."""
    image = mpimg.imread(png)
    height, width = image.shape[:2]
    fig = plt.figure(figsize=(width / 100, height / 100), dpi=100)
    ax = fig.add_axes((0, 0, 1, 1))
    ax.imshow(image)
    ax.set_axis_off()
    plt.show()


figures = {p.stem: p for p in pngs}

# %%
# **Reliability diagram** (``reliability.png``), one panel per run. The test sentences are
# grouped into bins by their confidence (the largest class probability); each bar is the
# accuracy within a bin, the hatched part the gap between that accuracy and the bin's mean
# confidence. A calibrated model has bars on the dashed diagonal; bars below it mean
# overconfidence. ECE, in the title, is that gap averaged with the bins' sizes as weights; the
# lower axes count the sentences per bin (log scale). A toy model that predicts "acceptable"
# for nearly every sentence puts them all in a few bins around the frequency of that class
# (about 0.7), where a bin of one or two sentences can have any accuracy.

show(figures["reliability"])

# %%
# The same diagram for the tempered predictive: ``temperature={name: tau}`` divides each run's
# logits by its fitted temperature before plotting.

tempered = plot_runs([run_dirs[n] for n in names], root / "plots_ts", names=names,
                     temperature={n: results[n]["temperature_scaling"]["temperature"]
                                  for n in names},
                     detectors=())          # no detectors: only the two calibration figures
show(tempered[0])

# %%
# **Risk-coverage curve** (``risk_coverage.png``). Sort the test sentences by confidence, most
# confident first, and keep the top fraction (the coverage): the selective risk is the error
# rate among the kept ones. A useful confidence makes the curve fall towards low coverage (the
# model is right where it is sure); the dotted line is the best possible ranking, the dashed one
# a random ranking (the overall error rate). AURC, in the legend, is the area under the curve:
# lower is better.

show(figures["risk_coverage"])

# %%
# **OOD score histograms** (``ood_cola_ood_<detector>.png``), one file per detector, one panel
# per run: the distribution of the detector's score on the in-domain test set (blue) and on the
# out-of-domain set, with the AUROC in the legend. Separated histograms mean the score tells
# the two apart. Every score is oriented so that higher means "more in-distribution" (for
# entropy and mutual information, their negatives).

show(figures["ood_cola_ood_max_softmax"])

# %%
# Mutual information needs several stochastic passes, so the deterministic softmax run has no
# panel in this figure:

show(figures["ood_cola_ood_mutual_info"])

# %%
# Uncertainty of single sentences
# -------------------------------
#
# :func:`gpattn_ppl.load_run <gpattn_ppl.run.predictor.load_run>` restores a run folder for
# prediction (config, vocabulary, best weights and, since this run was evaluated with
# temperature scaling, its temperature) without reading the dataset again. Its
# :meth:`~gpattn_ppl.run.predictor.Predictor.predict` returns one record per text: the predicted
# class (``label``) and its probability (``score``, the maximum softmax probability), the class
# probabilities (``probs``), the predictive entropy and, for a stochastic network, the mutual
# information over ``samples`` passes (``mutual_info``; ``None`` for a deterministic one), the
# library's one prediction schema (:mod:`gpattn_ppl.metrics.records`). ``gpattn-ppl predict RUN
# --input FILE`` prints the same records as JSON lines.

import gpattn_ppl

sentences = [
    "The cat sat on the mat.",
    "The cat sat the on mat.",
    "Which book did you say that John read?",
    "Him went to the store yesterday the.",
    "Colorless green ideas sleep furiously.",
]
for name in names:
    predictor = gpattn_ppl.load_run(run_dirs[name])
    print(predictor)
    for text, rec in zip(sentences, predictor.predict(sentences, samples=8)):
        mi = "-" if rec["mutual_info"] is None else f"{rec['mutual_info']:.4f}"
        print(f"  {rec['label']:<13} p={rec['probs']['acceptable']:.3f} score={rec['score']:.3f} "
              f"entropy={rec['entropy']:.3f} mi={mi}  {text}")

# %%
# The records are plain dicts, ready for JSON. The stochastic run is reproducible too: the
# ``seed`` argument of ``predict`` seeds its passes without touching the global random state.

print(gpattn_ppl.load_run(run_dirs["kep_svgp"]).predict(sentences[:1], samples=8, seed=0)[0])

# %%
# The run folders and figures of this page were written to a temporary folder; remove it, and
# give torch its threads back:

import shutil

shutil.rmtree(root)
torch.set_num_threads(threads)

# %%
# Where to go from here
# ---------------------
#
# * Train at full size with ``gpattn-ppl train experiments/configs/cola/kep_svgp.yaml`` and the
#   baseline ``softmax.yaml`` (same backbone and schedule), or run the three-seed comparison
#   given at the top of the page.
# * Every metric in the table, and the detectors, are defined on the :doc:`/metrics` page.
# * A unit of your own plugs into the same configs: :doc:`new_attention_unit`.
