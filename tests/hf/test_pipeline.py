"""UncertaintyPipeline: per-input probabilities, entropy and mutual information."""

import math

import pytest
import torch

from gpattn_ppl.hf import UncertaintyPipeline, swap

from .hosts import SMALL, V, tiny_classifier, transformers


class CharTokenizer:
    """A stand-in tokenizer: one id per character (the pipeline only calls it)."""

    def __call__(self, texts, padding=True, truncation=True, max_length=32,
                 return_tensors="pt"):
        ids = [[1 + ord(c) % (V - 1) for c in t][:max_length] for t in texts]
        N = max(len(i) for i in ids)
        return transformers.BatchEncoding({
            "input_ids": torch.tensor([i + [0] * (N - len(i)) for i in ids]),
            "attention_mask": torch.tensor([[1] * len(i) + [0] * (N - len(i)) for i in ids])})


def _model(kind):
    model = tiny_classifier()
    model.config.id2label = {0: "a", 1: "b", 2: "c"}
    swap(model, kind, layers=[-1], init="random", **SMALL.get(kind, {}))
    return model


TEXTS = ["book a flight", "what is my balance", "tell me a joke", "x"]


def test_records_match_the_definitions():
    pipe = UncertaintyPipeline(_model("sgpa"), CharTokenizer(), samples=6, batch_size=3)
    recs = pipe(TEXTS)
    p = pipe.probabilities(TEXTS)                   # the same seed: the same passes
    assert p.shape == (6, 4, 3) and len(recs) == 4
    mean = p.mean(0)
    for i, r in enumerate(recs):
        assert set(r) == {"label", "score", "probs", "entropy", "mutual_information"}
        assert list(r["probs"]) == ["a", "b", "c"]
        assert sum(r["probs"].values()) == pytest.approx(1.0, abs=1e-12)
        assert r["label"] == "abc"[int(mean[i].argmax())] and r["score"] == max(r["probs"].values())
        H = float(-(mean[i] * mean[i].log()).sum())
        expected = float(-(p[:, i] * p[:, i].log()).sum(-1).mean())
        assert r["entropy"] == pytest.approx(H, rel=1e-9)
        assert r["mutual_information"] == pytest.approx(H - expected, rel=1e-6, abs=1e-12)
        assert r["mutual_information"] > 0                     # the passes differ
        assert 0 <= r["entropy"] <= math.log(3) + 1e-12


def test_a_string_batching_and_the_seed():
    pipe = UncertaintyPipeline(_model("kep_svgp"), CharTokenizer(), samples=4, batch_size=2)
    one = pipe("book a flight")
    assert isinstance(one, list) and len(one) == 1
    assert pipe(TEXTS) == pipe(TEXTS)                          # seeded
    state = torch.get_rng_state()
    pipe(TEXTS)
    assert torch.equal(torch.get_rng_state(), state)          # the global state is untouched
    unseeded = UncertaintyPipeline(pipe.model, CharTokenizer(), samples=4, seed=None)
    assert unseeded(TEXTS) != unseeded(TEXTS)


def test_a_deterministic_model_runs_once_with_zero_mi():
    pipe = UncertaintyPipeline(_model("softmax"), CharTokenizer(), samples=8)
    assert pipe.probabilities(TEXTS).shape == (1, 4, 3)
    assert all(r["mutual_information"] == 0 for r in pipe(TEXTS))
    assert "stochastic=False" in repr(pipe)


def test_bad_inputs_are_refused():
    pipe = UncertaintyPipeline(_model("softmax"), CharTokenizer())
    with pytest.raises(ValueError, match="non-empty list of strings"):
        pipe([])
    with pytest.raises(ValueError, match="non-empty list of strings"):
        pipe(["ok", 3])
    with pytest.raises(ValueError, match="samples"):
        UncertaintyPipeline(pipe.model, CharTokenizer(), samples=0)
