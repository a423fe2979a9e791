"""The registered "uncertainty-classification" pipeline: transformers.pipeline builds it from a
model or a saved folder, its records follow the library's one schema, its parameters are the
standard pipeline ones."""

import math

import pytest
import torch

from gpattn_ppl.hf import PipelineLoadError, UncertaintyPipeline, swap
from gpattn_ppl.hf.pipeline import TASK
from gpattn_ppl.metrics import PREDICTION_KEYS
from tests.conftest import word_piece_tokenizer

from .hosts import SMALL, tiny_classifier, transformers

TEXTS = ["the cat sat on the mat", "what did you say", "john bought a dog yesterday", "mary"]


@pytest.fixture(scope="module")
def tokenizer(tmp_path_factory):
    folder = tmp_path_factory.mktemp("tok")
    word_piece_tokenizer(folder)
    return transformers.AutoTokenizer.from_pretrained(str(folder), local_files_only=True)


def _model(kind):
    model = tiny_classifier()
    model.config.id2label = {0: "a", 1: "b", 2: "c"}
    model.config.label2id = {"a": 0, "b": 1, "c": 2}
    swap(model, kind, layers=[-1], init="random", **SMALL.get(kind, {}))
    return model


def _pipe(kind, tokenizer, **kw):
    return transformers.pipeline(TASK, model=_model(kind), tokenizer=tokenizer, device="cpu", **kw)


def test_the_task_is_registered_with_transformers():
    entry = transformers.pipelines.PIPELINE_REGISTRY.supported_tasks[TASK]
    assert entry["impl"] is UncertaintyPipeline
    assert issubclass(UncertaintyPipeline, transformers.Pipeline)
    assert TASK in transformers.pipelines.PIPELINE_REGISTRY.get_supported_tasks()


def test_records_match_the_definitions(tokenizer):
    pipe = _pipe("sgpa", tokenizer, samples=6, batch_size=3)
    assert type(pipe) is UncertaintyPipeline
    recs = pipe(TEXTS)
    p = pipe.probabilities(TEXTS)                   # the same seed: the same passes
    assert p.shape == (6, 4, 3) and len(recs) == 4
    mean = p.mean(0)
    for i, r in enumerate(recs):
        assert tuple(r) == PREDICTION_KEYS == ("label", "score", "probs", "entropy", "mutual_info")
        assert list(r["probs"]) == ["a", "b", "c"]
        assert sum(r["probs"].values()) == pytest.approx(1.0, abs=1e-12)
        assert r["label"] == "abc"[int(mean[i].argmax())] and r["score"] == max(r["probs"].values())
        H = float(-(mean[i] * mean[i].log()).sum())
        expected = float(-(p[:, i] * p[:, i].log()).sum(-1).mean())
        assert r["entropy"] == pytest.approx(H, rel=1e-9)
        assert r["mutual_info"] == pytest.approx(H - expected, rel=1e-6, abs=1e-12)
        assert r["mutual_info"] > 0                     # the passes differ
        assert 0 <= r["entropy"] <= math.log(3) + 1e-12


def test_a_string_the_seed_and_lazy_inputs(tokenizer):
    pipe = _pipe("kep_svgp", tokenizer, samples=4, batch_size=2)
    one = pipe(TEXTS[0])
    assert isinstance(one, list) and len(one) == 1 and tuple(one[0]) == PREDICTION_KEYS
    assert pipe(TEXTS) == pipe(TEXTS)                          # seeded
    state = torch.get_rng_state()
    pipe(TEXTS)
    assert torch.equal(torch.get_rng_state(), state)          # the global state is untouched
    assert pipe(TEXTS, seed=1) != pipe(TEXTS)
    unseeded = UncertaintyPipeline(pipe.model, tokenizer, samples=4, seed=None)
    assert unseeded(TEXTS) != unseeded(TEXTS)
    # a generator gives an iterator of the records a list gives (same batches, same draws)
    lazy = pipe(t for t in TEXTS)
    assert not isinstance(lazy, list) and list(lazy) == pipe(TEXTS)


def test_one_pass_gives_no_mutual_information(tokenizer):
    pipe = _pipe("softmax", tokenizer, samples=8)
    assert pipe.probabilities(TEXTS).shape == (1, 4, 3)
    assert all(r["mutual_info"] is None for r in pipe(TEXTS))
    assert "stochastic=False" in repr(pipe)
    stochastic = _pipe("sgpa", tokenizer, samples=5)
    assert stochastic.predictive == "mc"
    mean = stochastic(TEXTS, predictive="mean")
    assert all(r["mutual_info"] is None for r in mean)
    assert stochastic.probabilities(TEXTS, predictive="mean").shape == (1, 4, 3)
    assert all(r["mutual_info"] is None for r in stochastic(TEXTS, samples=1))
    # the default predictive is the one recorded in the config
    model = _model("sgpa")
    model.config.gpattn_predictive = "mean"
    recorded = transformers.pipeline(TASK, model=model, tokenizer=tokenizer, device="cpu")
    assert recorded.predictive == "mean" and recorded(TEXTS) == mean
    assert recorded(TEXTS, predictive="mc")[0]["mutual_info"] > 0


def test_top_k_batch_size_and_tokenizer_arguments(tokenizer):
    pipe = _pipe("softmax", tokenizer)
    full = pipe(TEXTS)
    top = pipe(TEXTS, top_k=2)
    for f, t in zip(full, top):
        ranked = sorted(f["probs"].items(), key=lambda kv: -kv[1])
        assert list(t["probs"].items()) == ranked[:2]
        assert {k: t[k] for k in ("label", "score", "entropy")} == \
            {k: f[k] for k in ("label", "score", "entropy")}
    assert [list(r["probs"]) for r in pipe(TEXTS, top_k=None)] == \
        [[k for k, _ in sorted(f["probs"].items(), key=lambda kv: -kv[1])] for f in full]
    # padded batches compute what one input at a time computes
    for a, b in zip(pipe(TEXTS, batch_size=1), pipe(TEXTS, batch_size=4)):
        assert a["label"] == b["label"]
        assert a["probs"] == pytest.approx(b["probs"], abs=1e-6)
    # truncation: a text longer than the 32 positions runs with max_length
    long = " ".join(["the cat sat on the mat"] * 20)
    assert len(pipe(long, max_length=16)) == 1
    assert pipe(long, max_length=4) == pipe("the cat", max_length=4)      # [CLS] the cat [SEP]
    pair = pipe({"text": "the cat sat", "text_pair": "on the mat"})
    assert len(pair) == 1 and tuple(pair[0]) == PREDICTION_KEYS


def test_a_saved_folder_loads_through_the_checked_loader(tokenizer, tmp_path, quiet_transformers,
                                                         monkeypatch):
    pipe = _pipe("kep_svgp", tokenizer, samples=4)
    folder = tmp_path / "saved"
    pipe.save_pretrained(str(folder))
    assert "custom_pipelines" not in (folder / "config.json").read_text()
    assert not list(folder.glob("*.py"))                       # no pipeline code copied
    calls = []
    import gpattn_ppl.hf as hf
    real = hf.from_pretrained
    monkeypatch.setattr(hf, "from_pretrained", lambda f, **kw: calls.append(f) or real(f, **kw),
                        raising=False)
    again = transformers.pipeline(TASK, model=str(folder), samples=4, device="cpu")
    assert calls == [str(folder)] and type(again) is UncertaintyPipeline
    assert again(TEXTS) == pipe(TEXTS)                         # same weights, same draws
    # a folder that is not a swapped model is refused, naming the cause (no fallback to the
    # plain host class, which would drop the units)
    plain = tmp_path / "plain"
    tiny_classifier().save_pretrained(str(plain))
    tokenizer.save_pretrained(str(plain))
    with pytest.raises(PipelineLoadError, match="plain") as refused:
        transformers.pipeline(TASK, model=str(plain), device="cpu")
    assert refused.value.__cause__ is not None                 # the loader's own error


def test_bad_models_inputs_and_parameters_are_refused(tokenizer):
    pipe = _pipe("softmax", tokenizer)
    with pytest.raises(ValueError, match="non-empty list of strings"):
        pipe([])
    with pytest.raises(ValueError, match="non-empty list of strings"):
        pipe(["ok", 3])
    for bad in ({"samples": 0}, {"predictive": "median"}, {"top_k": 0}, {"seed": 1.5}):
        with pytest.raises(ValueError, match=next(iter(bad))):
            pipe(TEXTS, **bad)
    with pytest.raises(ValueError, match="samples"):
        UncertaintyPipeline(pipe.model, tokenizer, samples=0)
    model = _model("sgpa")
    model.config.problem_type = "multi_label_classification"
    with pytest.raises(ValueError, match="multi-label.*mc_logits"):
        transformers.pipeline(TASK, model=model, tokenizer=tokenizer, device="cpu")
