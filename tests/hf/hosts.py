"""Tiny Hugging Face sequence classifiers and batches for the tests of :mod:`gpattn_ppl.hf`."""

import pytest
import torch

from tests.models.test_swap import SMALL, V, batch

transformers = pytest.importorskip("transformers")

__all__ = ["SMALL", "V", "batch", "dataset", "tiny_classifier", "transformers"]

C, H, K = 16, 4, 3


def tiny_classifier(host: str = "bert", seed: int = 0, dropout: float = 0.1):
    """A randomly initialised 2-layer ``...ForSequenceClassification`` (K = 3 classes)."""
    torch.manual_seed(seed)
    if host == "bert":
        cfg = transformers.BertConfig(vocab_size=V, hidden_size=C, num_hidden_layers=2,
                                      num_attention_heads=H, intermediate_size=32,
                                      max_position_embeddings=32, num_labels=K,
                                      hidden_dropout_prob=dropout,
                                      attention_probs_dropout_prob=dropout)
        return transformers.BertForSequenceClassification(cfg).eval()
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
