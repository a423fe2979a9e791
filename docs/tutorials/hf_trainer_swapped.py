# ruff: noqa: E402 -- a tutorial imports what each section uses, where it is first used
"""
Fine-tune a swapped MiniLM with the Hugging Face Trainer, save it and reload it
===============================================================================

The library's own runs (``gpattn-ppl train``) are one way to fine-tune a pretrained encoder
with a stochastic attention unit. This tutorial does it the Hugging Face way instead, with
:mod:`gpattn_ppl.hf`, on intent classification with out-of-scope queries:

1. load all-MiniLM-L6-v2 as a ``BertForSequenceClassification`` with ten intents and swap
   h-sto-trans (:class:`~gpattn_ppl.attention.h_gumbel.HierarchicalGumbelAttention`,
   ``h_gumbel``) into its last layer with :func:`gpattn_ppl.hf.swap <gpattn_ppl.hf.hub.swap>`,
   which records the swap in the model's config;
2. fine-tune it with :class:`~gpattn_ppl.hf.trainer.SwappedTrainer`, a ``transformers.Trainer``
   whose loss adds the unit's KL term, weighted by the step-0 rule, and whose evaluation
   averages Monte-Carlo passes;
3. save it with ``save_pretrained``, load it back with
   :func:`gpattn_ppl.hf.from_pretrained <gpattn_ppl.hf.hub.from_pretrained>` (config and
   safetensors only, no pickle) and check that it evaluates exactly as before;
4. query it with the ``transformers`` pipeline ``"uncertainty-classification"`` that
   ``import gpattn_ppl.hf`` registers (:class:`~gpattn_ppl.hf.pipeline.UncertaintyPipeline`:
   label, probabilities, entropy and mutual information per query) and score out-of-scope
   detection.

The data is the CLINC150 slice shipped with the package
(:func:`~gpattn_ppl.data.bundled_clinc150_slice_root`, the dataset ``clinc150_slice``): ten
intents of five domains, 100 / 20 / 30 training / validation / test queries each, and 200
out-of-scope test queries (Larson et al., EMNLP-IJCNLP 2019; CC BY 3.0, see the folder's
``SOURCE.md``).

.. note::

    Sized so that the page builds in about a minute on one CPU core: the 1,000 training
    queries, three epochs, and only the last three layers, the pooler and the head are
    trained (the embeddings and the first three layers are frozen, which halves a training
    step). One seed on a ten-intent slice: the numbers show that the model learns and what the
    outputs look like, not how the unit compares with others. The configs for the full
    benchmark (150 intents, 1,000 out-of-scope queries, the whole encoder fine-tuned) are in
    ``experiments/configs/clinc150_finetune/``.
"""

# %%
# The slice and a pretrained classifier
# -------------------------------------
#
# :func:`~gpattn_ppl.data.read_clinc150` reads the slice as it reads the full release: per
# split the queries and their intent names, in file order. The classes are the intent names in
# sorted order, as in the dataset ``clinc150_slice``.
#
# A model this size runs fastest on one CPU thread here, so this page sets that for its
# duration.

import torch
import transformers

from gpattn_ppl.data import bundled_clinc150_slice_root, read_clinc150

threads = torch.get_num_threads()
torch.set_num_threads(1)
transformers.utils.logging.set_verbosity_error()        # no "newly initialised head" notice
transformers.utils.logging.disable_progress_bar()
torch.manual_seed(0)

clinc = read_clinc150(bundled_clinc150_slice_root())
classes = sorted(set(clinc["train"][1]))
print({split: len(clinc[split][0]) for split in ("train", "val", "test", "oos_test")})
for domain, intents in clinc["domains"].items():
    print(f"  {domain:<19} {', '.join(intents)}")

# %%
# ``all-MiniLM-L6-v2`` resolves to the checkpoint that the ``text`` extra ships offline
# (:func:`~gpattn_ppl.data.hf_folder.resolve_checkpoint`); ``transformers`` loads it as a
# sequence classifier with a new ten-class head. :func:`~gpattn_ppl.hf.hub.swap` (the library's
# one swap, also named :func:`~gpattn_ppl.models.swap_attention`) replaces the softmax
# self-attention of the last layer by ``h_gumbel``, starts it from the replaced layer and fits
# what the copies cannot give on a calibration batch (see :ref:`pretrained-init`). On a
# ``transformers`` model it also writes what it did into ``model.config.gpattn_swap`` and gives
# the model its swapped type (``GpattnBertForSequenceClassification``, model type
# ``gpattn_bert``), so that every ``save_pretrained`` saves a folder that loads with the unit or
# not at all. (``swap(model)`` without a kind is the recommended configuration: CGPT in the
# last layer, predicting at its posterior mean.)

from gpattn_ppl.data import load_tokenizer, resolve_checkpoint
from gpattn_ppl.hf import swap

tokenizer = load_tokenizer("all-MiniLM-L6-v2")
model = transformers.AutoModelForSequenceClassification.from_pretrained(
    resolve_checkpoint("all-MiniLM-L6-v2"), num_labels=len(classes),
    id2label=dict(enumerate(classes)), label2id={name: k for k, name in enumerate(classes)},
    trust_remote_code=False, local_files_only=True)   # no code of the folder, nothing fetched

train_texts, train_intents = clinc["train"]
calibration = dict(tokenizer(train_texts[:16], padding=True, return_tensors="pt"))
record = swap(model, "h_gumbel", layers=[-1], calibration=calibration)[0]
print(record["path"], f"gap_mean={record['gap_mean']:.3f}")
print(type(model).__name__, model.config.model_type, model.config.gpattn_swap)

# freeze the embeddings and the first three layers (for the page's time budget)
frozen = [model.bert.embeddings, *model.bert.encoder.layer[:3]]
for module in frozen:
    module.requires_grad_(False)
trained = sum(p.numel() for p in model.parameters() if p.requires_grad)
print(f"trained parameters: {trained:,} of {sum(p.numel() for p in model.parameters()):,}")

# %%
# The record names the unit's module path, its kind and every option it was built with (the
# dropouts it took from the host included), so a reload does not depend on defaults.
#
# Fine-tune with the Trainer
# --------------------------
#
# The data are plain lists of tokenised examples; ``DataCollatorWithPadding`` pads each batch.
# :class:`~gpattn_ppl.hf.trainer.SwappedTrainer` takes every ``Trainer`` argument. Its loss is
# the cross-entropy plus each objective term of the unit, a global term divided by the number
# of training queries. On the first training batch it sets each term's weight so that the term
# starts at a tenth of the cross-entropy, rounded down to one digit and never above 1 (the
# step-0 rule of :ref:`pretrained-init`; ``term_weights={"kl": ...}`` sets a weight yourself).
# ``h_gumbel`` with its default prior ``"same"`` (the paper's: the prior is the guide) has a KL
# of exactly 0 and adds no term, so here the loss is the cross-entropy under stochastic
# attention and the rule has nothing to weight; KEP-SVGP or SGPA would add their KL (and KSVD)
# terms, printed below with their weights. The default ``compute_metrics`` reports accuracy,
# MCC, NLL, ECE, the predictive entropy and the mutual information of ``mc_samples`` passes.

import tempfile
from pathlib import Path

from gpattn_ppl.hf import SwappedTrainer

label = {name: k for k, name in enumerate(classes)}


def examples(texts, intents):
    enc = tokenizer(texts, truncation=True, max_length=32)
    return [{"input_ids": enc["input_ids"][i], "attention_mask": enc["attention_mask"][i],
             "labels": label[intents[i]]} for i in range(len(texts))]


train_set = examples(train_texts, train_intents)
test_set = examples(*clinc["test"])

root = Path(tempfile.mkdtemp())
args = transformers.TrainingArguments(
    output_dir=str(root / "checkpoints"), num_train_epochs=3, learning_rate=5e-4,
    per_device_train_batch_size=32, per_device_eval_batch_size=100, logging_steps=16,
    save_strategy="no", report_to="none", disable_tqdm=True, use_cpu=True, seed=0)
collator = transformers.DataCollatorWithPadding(tokenizer)
trainer = SwappedTrainer(model=model, args=args, train_dataset=train_set,
                         eval_dataset=test_set, processing_class=tokenizer,
                         data_collator=collator, mc_samples=8)
trainer.remove_callback(transformers.PrinterCallback)  # this page prints what it shows
trainer.train()

step0 = trainer.step0
print(f"step 0: cross-entropy {step0['cross_entropy']:.3f} (ln 10 = 2.303), terms: "
      + (", ".join(f"{g.rsplit('.', 1)[-1]} {v:.4f} (weight {step0['weights'][g]:g})"
                   for g, v in step0["terms"].items()) or "none"))
for log in trainer.state.log_history:
    if "loss" in log:
        terms = "".join(f"  {k.rsplit('.', 1)[-1]} {v:.4f}" for k, v in log.items()
                        if k.startswith("term/"))
        print(f"step {log['step']:>2} (epoch {log['epoch']:.1f}): loss {log['loss']:.4f}{terms}")
print(f"training took {trainer.state.log_history[-1]['train_runtime']:.0f} s")

# %%
# Evaluate on the test queries
# ----------------------------
#
# Each evaluation batch runs eight passes in evaluation mode (dropout off; the unit draws), the
# first five layers once for all eight (they are deterministic). ``eval_seed`` (0 by default)
# seeds the passes, so an evaluation is reproducible. Chance accuracy is 0.1 (ten balanced
# intents).

KEYS = ("eval_acc", "eval_nll", "eval_ece", "eval_entropy", "eval_mutual_info")


def show(metrics: dict) -> str:
    return "  ".join(f"{k.removeprefix('eval_')} {metrics[k]:.4g}" for k in KEYS)


before = trainer.evaluate()
print("trained :", show(before))

# %%
# ``trainer.predict`` returns the probabilities averaged over the passes, ``[n, K]``, so
# ``argmax(-1)`` and a ``compute_metrics`` written for a plain classifier work as they are;
# ``per_pass=True`` gives the ``[n, S, K]`` per-pass probabilities.

out = trainer.predict(test_set)
probs = out.predictions
print("predict:", probs.shape, "rows sum to", round(float(probs.sum(-1).mean()), 4),
      "accuracy", round(float((probs.argmax(-1) == out.label_ids).mean()), 4))

# %%
# Save and reload
# ---------------
#
# ``save_pretrained`` writes ``config.json`` (with the swap record) and ``model.safetensors``;
# the tokenizer's ``save_pretrained`` adds its files. Nothing in the folder is a pickle, and it
# needs nothing of the library's run folders. (``trainer.save_model`` would save the same, plus
# the training arguments, which ``transformers`` pickles.)
# :func:`~gpattn_ppl.hf.hub.from_pretrained` builds the classifier from the config, swaps the
# same unit in again and loads every weight strictly: missing, unexpected or misshaped tensors
# are errors that name them. The folder's model type is ``gpattn_bert``: plain ``transformers``
# refuses it (an unknown model type) instead of loading MiniLM with random weights where the
# unit was, and with ``gpattn_ppl.hf`` imported its Auto classes and
# ``transformers.pipeline("text-classification", model=folder)`` load it with the unit.

import json

from gpattn_ppl.hf import from_pretrained

folder = root / "minilm_h_gumbel_clinc"
model.save_pretrained(folder)
tokenizer.save_pretrained(folder)
print(sorted(p.name for p in folder.iterdir()))
saved = json.loads((folder / "config.json").read_text())
print(saved["model_type"], saved["architectures"], saved["gpattn_swap"][0]["paths"])

reloaded = from_pretrained(folder)
again = SwappedTrainer(model=reloaded, args=args, eval_dataset=test_set,
                       processing_class=tokenizer, data_collator=collator, mc_samples=8)
again.remove_callback(transformers.PrinterCallback)
after = again.evaluate()
print("reloaded:", show(after))
assert all(after[k] == before[k] for k in KEYS), "the reloaded model evaluates differently"
print("equal after reload:", all(after[k] == before[k] for k in KEYS))

# %%
# The metrics are equal, not close: the reloaded model computes the same logits and draws the
# same samples under the same seed. (The frozen layers are frozen in ``model`` only:
# ``requires_grad`` is not saved, so ``reloaded`` trains every parameter unless you freeze
# them again.)
#
# Per-query uncertainty
# ---------------------
#
# ``import gpattn_ppl.hf`` registered the pipeline task ``"uncertainty-classification"`` with
# ``transformers`` (:class:`~gpattn_ppl.hf.pipeline.UncertaintyPipeline`; ``model=folder``
# would load the saved folder through :func:`~gpattn_ppl.hf.from_pretrained`). It is called
# like a text-classification pipeline and returns, per input, the library's prediction record
# (:mod:`gpattn_ppl.metrics.records`): the predicted intent (``label``) and its probability
# (``score``), the class probabilities (``probs``), the predictive entropy (total uncertainty)
# and the mutual information between the prediction and the unit's latent variables
# (``mutual_info``, the part the stochastic attention contributes), from ``samples`` passes.
# The first three queries are test queries of the ten intents, the last three out-of-scope test
# queries: none of the ten intents is right for them.

pipe = transformers.pipeline("uncertainty-classification", model=reloaded,
                             tokenizer=load_tokenizer(folder), samples=8, batch_size=100,
                             device=reloaded.device)
test_texts, test_intents = clinc["test"]
oos_texts = clinc["oos_test"][0]
queries = [test_texts[0], test_texts[100], test_texts[200], *oos_texts[:3]]
truth = [test_intents[0], test_intents[100], test_intents[200], "oos", "oos", "oos"]
for text, true, rec in zip(queries, truth, pipe(queries)):
    print(f"{true:>19} -> {rec['label']:<19} p={rec['score']:.3f}  H={rec['entropy']:.3f}  "
          f"MI={rec['mutual_info']:.1e}  {text}")

# %%
# Out-of-scope detection
# ----------------------
#
# A model trained on in-scope queries only should be less sure about out-of-scope ones. Score
# the 300 test queries and the 200 out-of-scope test queries with the pipeline and measure how
# well each uncertainty separates them: the AUROC of "out-of-scope" against "in-scope" (0.5 is
# chance, 1 perfect) for one minus the maximum probability, the predictive entropy and the
# mutual information (``sklearn.metrics.roc_auc_score``).

import numpy as np
from sklearn.metrics import roc_auc_score

records = pipe(test_texts + oos_texts)
is_oos = np.r_[np.zeros(len(test_texts)), np.ones(len(oos_texts))]
scores = {"1 - max prob": [1 - r["score"] for r in records],
          "entropy": [r["entropy"] for r in records],
          "mutual info": [r["mutual_info"] for r in records]}
for name, score in scores.items():
    print(f"OOS AUROC by {name:<13} {roc_auc_score(is_oos, score):.3f}")
mi = np.asarray(scores["mutual info"])
print(f"mean MI: in-scope {mi[is_oos == 0].mean():.1e}, out-of-scope {mi[is_oos == 1].mean():.1e}")

# %%
# The classifier has to pick one of its ten intents for an out-of-scope query, so its label is
# wrong by construction; only its uncertainty can flag the query. The mutual information is
# small in absolute terms (one stochastic layer of six), but detection needs only its ranking:
# out-of-scope queries get a far larger MI on average (the last line), and its AUROC stands
# beside those of the maximum probability and the entropy. On the full CLINC150 benchmark (150
# intents, 1,000 out-of-scope queries) published fine-tuned BERT-base baselines reach an OOS
# AUROC of 0.94 to 0.97 (:mod:`gpattn_ppl.data.clinc150`); a ten-intent slice is a smaller and
# easier problem, and these numbers are not comparable with those.
#
# The folder and checkpoints of this page were written to a temporary folder; remove it, and
# give torch its threads back:

import shutil

shutil.rmtree(root)
torch.set_num_threads(threads)

# %%
# Where to go from here
# ---------------------
#
# * The full benchmark through the library's own runs: ``data: {name: clinc150, root: ...}``
#   (``experiments/configs/clinc150_finetune/h_gumbel.yaml`` fine-tunes this model); the slice
#   of this page is ``data: {name: clinc150_slice}`` (protocols ``standard`` and
#   ``near_ood``).
# * Any registered kind swaps in the same way (``swap(model, "kep_svgp", ...)``); with SGPA the
#   step-0 rule sets the KL weight near 1e-8, without which its KL dominates the first steps
#   (:ref:`pretrained-init`). ``swap(model)`` alone swaps the recommended CGPT into the last
#   layer and records the posterior-mean predictive (``model.config.gpattn_predictive``).
# * The saved folder loads with ``transformers.AutoModelForSequenceClassification`` once
#   ``gpattn_ppl.hf`` is imported, and from the local Hugging Face cache by repo id with
#   ``from_pretrained("org/name", revision=...)``.
# * The same kind of model fine-tuned through the library's Pyro program, with its own run
#   folder, is :doc:`pretrained_kep_svgp`.
