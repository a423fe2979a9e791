r"""Per-input predictions with uncertainty from a swapped Hugging Face classifier.

:class:`UncertaintyPipeline` is called like a ``transformers`` text-classification pipeline (a
string or a list of strings) and returns, per input, from ``S`` stochastic passes with
probabilities :math:`p_{s,k}` and their mean :math:`\bar p_k`:

.. math::

    \hat y = \arg\max_k \bar p_k,\quad \mathrm{score} = \max_k \bar p_k,\quad
    \mathcal H = -\sum_k \bar p_k\log\bar p_k,\quad
    \mathrm{MI} = \mathcal H - \frac1S\sum_s \mathcal H[p_s]

(natural logarithms; :func:`~gpattn_ppl.metrics.predictive_entropy`,
:func:`~gpattn_ppl.metrics.mutual_information`; ``MI = 0`` for a deterministic model, run once).
"""

from __future__ import annotations

import torch

from ..metrics import mutual_information, predictive_entropy
from .sampling import is_stochastic, mc_logits

__all__ = ["UncertaintyPipeline"]


class UncertaintyPipeline:
    """``pipe(texts) -> [{"label", "score", "probs", "entropy", "mutual_information"}, ...]``.

    :param model: a sequence classifier (``...ForSequenceClassification``), e.g. from
        :func:`~gpattn_ppl.hf.from_pretrained`; it is put in evaluation mode.
    :param tokenizer: its tokenizer.
    :param samples: ``S``, the passes averaged for a stochastic model.
    :param batch_size: inputs per forward pass.
    :param max_length: longer inputs are truncated to this many tokens.
    :param seed: seeds the passes of every call (the global random state is left as it was);
        ``None`` draws from the global state.

    ``probs`` maps the config's ``id2label`` names to the mean probabilities; ``label`` is the
    name of the most probable class and ``score`` its probability.

    >>> pipe = UncertaintyPipeline(model, tokenizer, samples=8)      # doctest: +SKIP
    >>> pipe("The cat sat on the mat.")[0]["mutual_information"]      # doctest: +SKIP
    0.0012
    """

    def __init__(self, model, tokenizer, *, samples: int = 8, batch_size: int = 32,
                 max_length: int = 128, seed: int | None = 0) -> None:
        if samples < 1:
            raise ValueError(f"samples must be >= 1, got {samples}")
        self.model, self.tokenizer = model.eval(), tokenizer
        self.samples, self.batch_size, self.max_length = int(samples), int(batch_size), max_length
        self.seed = seed
        id2label = getattr(model.config, "id2label", None) or {}
        K = model.config.num_labels
        self.labels = [str(id2label.get(k, id2label.get(str(k), f"LABEL_{k}"))) for k in range(K)]

    def __repr__(self) -> str:
        return (f"UncertaintyPipeline({type(self.model).__name__}, labels={self.labels}, "
                f"samples={self.samples}, stochastic={is_stochastic(self.model)})")

    @torch.no_grad()
    def probabilities(self, texts: str | list[str]) -> torch.Tensor:
        """Per-pass class probabilities ``[S, n, K]`` (float64, CPU)."""
        texts = [texts] if isinstance(texts, str) else list(texts)
        if not texts or not all(isinstance(t, str) for t in texts):
            raise ValueError("UncertaintyPipeline: expected a string or a non-empty list of "
                             "strings")
        device = next(self.model.parameters()).device
        devices = [device] if device.type == "cuda" else []
        out = []
        with torch.random.fork_rng(devices=devices, enabled=self.seed is not None):
            if self.seed is not None:
                torch.manual_seed(self.seed)
            for start in range(0, len(texts), self.batch_size):
                enc = self.tokenizer(texts[start:start + self.batch_size], padding=True,
                                     truncation=True, max_length=self.max_length,
                                     return_tensors="pt").to(device)
                logits = mc_logits(self.model, dict(enc), self.samples)     # [B, S, K]
                out.append(torch.softmax(logits.double(), -1).transpose(0, 1).cpu())
        return torch.cat(out, 1)

    def __call__(self, texts: str | list[str]) -> list[dict]:
        """One record per input (see the class docstring)."""
        p = self.probabilities(texts)
        mean = p.mean(0)
        H, MI = predictive_entropy(p), mutual_information(p)
        score, pred = mean.max(-1)
        return [{"label": self.labels[int(pred[i])], "score": float(score[i]),
                 "probs": {name: float(mean[i, k]) for k, name in enumerate(self.labels)},
                 "entropy": float(H[i]), "mutual_information": float(MI[i])}
                for i in range(p.shape[1])]
