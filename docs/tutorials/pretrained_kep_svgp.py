# ruff: noqa: E402 -- a tutorial imports what each section uses, where it is first used
"""
Put KEP-SVGP into a pretrained MiniLM and read its uncertainty
==============================================================

Practitioners fine-tune pretrained transformers rather than train them from scratch. This
tutorial takes all-MiniLM-L6-v2 (a 6-layer BERT, width 384, 12 heads; shipped offline by the
``text`` extra), replaces the softmax self-attention of its **last layer** by KEP-SVGP
(:class:`~gpattn_ppl.attention.kep_svgp.KEPSVGPAttention`), and

1. looks at what :func:`~gpattn_ppl.hf.hub.swap` carried over from the pretrained
   layer, what it fitted, and how far the new layer's output is from the old one's at step 0;
2. fine-tunes the whole model through the library's Pyro program (``model.arch: hf`` in a
   config: the checkpoint's own tokenizer, two learning rates);
3. reads per-sentence probabilities, entropy and mutual information from the trained run.

.. note::

    Toy size so that the page builds in a minute on a CPU: 256 training sentences, one epoch.
    The numbers below mean nothing about the method. The 3-seed fine-tuning comparison is in
    ``experiments/README.md`` ("Pretrained encoder"); its command is
    ``python experiments/evidence.py cola_finetune --out runs/finetune_cola``.
"""

# %%
# Swap the unit in
# ----------------
#
# :func:`~gpattn_ppl.models.hf.load_hf_encoder` loads the checkpoint from local files only.
# :func:`~gpattn_ppl.hf.hub.swap` (also named :func:`~gpattn_ppl.models.swap_attention`) finds
# the encoder's self-attention layers (12 heads, width 384, its dropouts), builds a KEP-SVGP
# unit of the same shape and puts it behind an adapter that keeps BERT's calling convention,
# its attention mask and its residual LayerNorm. With
# ``init="pretrained"`` (the default) the unit starts from the replaced layer; the calibration
# batch, any inputs of the model, fits what the copies cannot give (here the kernel-SVD
# projections and the output map), see :ref:`pretrained-init`.

import torch

from gpattn_ppl.data import load_tokenizer
from gpattn_ppl.hf import swap
from gpattn_ppl.models.hf import load_hf_encoder

torch.manual_seed(0)
tokenizer = load_tokenizer("all-MiniLM-L6-v2")
sentences = ["The cat sat on the mat.", "John seems to be happy.",
             "What did you say that Mary bought?", "She kissed herself.",
             "Him went to the store yesterday.", "The more you eat, the fatter you get.",
             "Who did you wonder whether left?", "The book was written by John."]
calibration = dict(tokenizer(sentences, padding=True, return_tensors="pt"))

encoder = load_hf_encoder("all-MiniLM-L6-v2").eval()
record = swap(encoder, "kep_svgp", layers=[-1], calibration=calibration)[0]
for key in ("path", "copied", "fitted", "not_carried", "gap_mean", "gap_sample"):
    print(f"{key:12s} {record[key]}")

# %%
# ``gap_mean`` is the relative error of the layer's attention output at the posterior mean
# against the softmax layer's, ``gap_sample`` the same for one draw. KEP-SVGP has no values and
# five kernel-SVD features per head, so it cannot reproduce softmax attention exactly;
# fine-tuning closes the gap. The encoder still runs as before, now stochastic in its last
# layer:

with torch.no_grad():
    a = encoder(**calibration).last_hidden_state
    b = encoder(**calibration).last_hidden_state
print("two passes differ by", float((a - b).norm() / a.norm()))

# %%
# Fine-tune it as one Pyro program
# --------------------------------
#
# In a config the same swap is ``model.swap``; ``data.encoder: hf`` tokenises with the
# checkpoint's tokenizer. ``train.lr`` is the learning rate of the swapped unit and the head,
# ``train.backbone_lr`` that of the pretrained encoder. The trainer calibrates the unit on one
# training batch (``swap.json`` in the run folder holds the record) and trains the ELBO: the
# cross-entropy plus KEP-SVGP's KL and KSVD terms, with the library's KL warm-up.

import json
import tempfile
from pathlib import Path

from gpattn_ppl.run import Trainer

config = {
    "model": {"arch": "hf", "checkpoint": "all-MiniLM-L6-v2", "pooling": "mean",
              "swap": [{"layers": [-1], "attention": {"kind": "kep_svgp"}}]},
    "data": {"name": "cola", "encoder": "hf", "max_len": 32, "batch_size": 32,
             "limit_train": 256, "limit_eval": 64},
    "train": {"epochs": 1, "optimizer": "adamw", "lr": 5e-4, "backbone_lr": 3e-5,
              "warmup_epochs": 0, "min_lr": 0, "progress": False, "device": "cpu"},
    "eval": {"mc_samples": 5, "temperature_scaling": True},
}
run = Path(tempfile.mkdtemp()) / "minilm_kep_svgp"
results = Trainer(config, run).fit()
print({k: round(v, 3) for k, v in results["test"].items() if k in ("acc", "mcc", "nll", "ece")})
print("step-0 gap:", json.loads((run / "swap.json").read_text())[0]["gap_mean"])

# %%
# Read its uncertainty
# --------------------
#
# :func:`gpattn_ppl.load_run <gpattn_ppl.run.predictor.load_run>` restores the run (the
# checkpoint's tokenizer, the swapped model, its temperature) and averages ``T`` stochastic
# passes. The mutual information between the prediction and the unit's latent variables is the
# part of the uncertainty the GP layer contributes; the entropy is the total.

from gpattn_ppl.run.predictor import load_run

predictor = load_run(run)
for text, rec in zip(sentences[:5], predictor.predict(sentences[:5], samples=10)):
    print(f"{rec['label']:>12s}  p={rec['score']:.3f}  "
          f"entropy={rec['entropy']:.3f}  MI={rec['mutual_info']:.2e}  {text}")
