"""Tiny Hugging Face sequence classifiers and batches for the tests of :mod:`gpattn_ppl.hf`."""

import pytest
import torch

from tests.models.test_swap import SMALL, V, batch

transformers = pytest.importorskip("transformers")

__all__ = ["HOSTS", "SMALL", "V", "batch", "dataset", "swap_warning", "tiny_classifier",
           "transformers"]

C, H, K = 16, 4, 3

#: the host families :func:`tiny_classifier` builds (ModernBERT from transformers 5 on, where
#: a unit stands in for its attention)
HOSTS = ["bert", "deberta", "distilbert", "mpnet",
         *(["modernbert"] if hasattr(transformers, "ModernBertModel")
           and int(transformers.__version__.split(".")[0]) >= 5 else [])]
#: host -> the message of the warning every swap of it gives (the terms the unit drops)
_DROPS = {"mpnet": "position_bias: MPNet's relative-position bias"}


def swap_warning(host: str):
    """A context expecting the warning a swap (or a reload) of ``host`` gives, if any."""
    import contextlib

    if host in _DROPS:
        return pytest.warns(UserWarning, match=_DROPS[host])
    return contextlib.nullcontext()


def tiny_classifier(host: str = "bert", seed: int = 0, dropout: float = 0.1):
    """A randomly initialised 2-layer ``...ForSequenceClassification`` (K = 3 classes) of
    ``host`` (one of :data:`HOSTS`); ModernBERT's first layer is local (sliding-window), its
    second global."""
    torch.manual_seed(seed)
    bertish = dict(vocab_size=V, hidden_size=C, num_hidden_layers=2, num_attention_heads=H,
                   intermediate_size=32, max_position_embeddings=32, num_labels=K)
    if host == "bert":
        cfg = transformers.BertConfig(**bertish, hidden_dropout_prob=dropout,
                                      attention_probs_dropout_prob=dropout)
        return transformers.BertForSequenceClassification(cfg).eval()
    if host == "deberta":
        cfg = transformers.DebertaConfig(**bertish, hidden_dropout_prob=dropout,
                                         attention_probs_dropout_prob=dropout)
        return transformers.DebertaForSequenceClassification(cfg).eval()
    if host == "mpnet":
        cfg = transformers.MPNetConfig(**bertish, hidden_dropout_prob=dropout,
                                       attention_probs_dropout_prob=dropout, pad_token_id=0,
                                       bos_token_id=1, eos_token_id=1)
        return transformers.MPNetForSequenceClassification(cfg).eval()
    if host == "modernbert":
        cfg = transformers.ModernBertConfig(
            **bertish, attention_dropout=dropout, mlp_dropout=dropout, local_attention=4,
            layer_types=["sliding_attention", "full_attention"], pad_token_id=0,
            bos_token_id=1, eos_token_id=1, cls_token_id=1, sep_token_id=1)
        return transformers.ModernBertForSequenceClassification(cfg).eval()
    if host != "distilbert":
        raise ValueError(f"tiny_classifier: unknown host {host!r} (one of {HOSTS})")
    cfg = transformers.DistilBertConfig(vocab_size=V, dim=C, n_layers=2, n_heads=H,
                                        hidden_dim=32, max_position_embeddings=32,
                                        num_labels=K, dropout=dropout,
                                        attention_dropout=dropout)
    return transformers.DistilBertForSequenceClassification(cfg).eval()


def dataset(n: int = 24, N: int = 7, seed: int = 0) -> list[dict]:
    """``n`` random examples (ids, mask, a label) of length ``N``, as a ``Trainer`` takes them."""
    g = torch.Generator().manual_seed(seed)
    return [{"input_ids": torch.randint(1, V, (N,), generator=g),
             "attention_mask": torch.ones(N, dtype=torch.long), "labels": i % K}
            for i in range(n)]
