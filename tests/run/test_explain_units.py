"""``gpattn-ppl explain`` for every registered attention unit (issue 46, item 5): a tiny run of
each unit, and a ``save_pretrained`` folder of a tiny BERT classifier with each unit swapped in;
the attention matrix of each (KEP-SVGP: the kernel its eigen-pair reconstructs, of rank s), the
per-token variances, and the probabilities of ``predict``."""

import copy
import json

import numpy as np
import pytest
import torch

from gpattn_ppl.attention import ATTENTION
from gpattn_ppl.run.cli import main
from gpattn_ppl.run.explain import explain_sentence as explain

#: the units the library registers (a plugin's unit is swept by its own tests)
KINDS = ("cgpt", "gumbel", "h_gumbel", "kep_svgp", "kernel", "scgpt", "sgpa", "softmax")
#: units whose attention rows are probability vectors (a softmax / a normalised kernel)
ROW_STOCHASTIC = ("gumbel", "h_gumbel", "kernel", "softmax")
#: GP units: a predictive variance per head and token
GP_UNITS = ("cgpt", "kep_svgp", "scgpt", "sgpa")
TEXT = "The more you read, the more you want."
WORDS = "the cat sat on the mat ."

# a 1e-5 jitter on a random GP unit's kernel matrix (tiny, barely trained) is not this test's
pytestmark = pytest.mark.filterwarnings("ignore::gpattn_ppl.errors.NumericsWarning")


def test_the_sweep_covers_every_unit_the_library_registers():
    own = {k for k, cls in ATTENTION.items() if cls.__module__.startswith("gpattn_ppl.")}
    assert own == set(KINDS)


def _check_attention(r: dict, kind: str, heads: int, n: int, rank: int | None = None) -> None:
    assert r["unit"] == ATTENTION[kind].__name__
    attn = np.asarray(r["attention"])
    assert attn.shape == (heads, n, n) and np.isfinite(attn).all() and np.abs(attn).max() > 0
    if kind in ROW_STOCHASTIC:
        np.testing.assert_allclose(attn.sum(-1), 1.0, atol=1e-6)
        assert attn.min() >= 0
    if kind == "kep_svgp":  # E Λ^{-1} R^T: signed, unnormalised, of rank s per head
        s = np.linalg.svd(attn, compute_uv=False)
        assert ((s > 1e-5 * s[:, :1]).sum(-1) <= rank).all()  # float32 floor
        assert not np.allclose(attn.sum(-1), 1.0)
    pv = r["predictive_variance"]
    if kind in GP_UNITS:
        assert np.asarray(pv).shape == (heads, n) and np.min(pv) > 0
    else:
        assert pv is None
    assert len(r["tokens"]) == n


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """``{kind: run folder}``: one tiny CoLA run per unit (1 epoch on 16 sentences)."""
    from gpattn_ppl.run.experiment import Trainer
    from tests.run.conftest import TINY

    root = tmp_path_factory.mktemp("explain_units")
    out = {}
    for kind in KINDS:
        cfg = copy.deepcopy(TINY)
        cfg["model"]["attention"] = {"kind": kind}
        cfg["train"]["epochs"] = 1
        cfg["data"].update(limit_train=16, limit_eval=16)
        cfg["eval"]["mc_samples"] = 3
        Trainer(cfg, root / kind).fit()
        out[kind] = root / kind
    return out


@pytest.mark.parametrize("kind", KINDS)
def test_explain_every_unit_of_a_run(kind, runs, tmp_path):
    """The issue's report (``NotImplementedError: KernelEigenPairStrategy has no attention
    matrix``) for each unit: the figure is drawn, the numbers are the unit's and predict's."""
    from gpattn_ppl import load_run

    png = tmp_path / f"{kind}.png"
    r = explain(runs[kind], TEXT, out=png, seed=2)
    assert png.stat().st_size > 0 and r["figure"] == str(png)
    assert r["layer"] == "blocks.0.attn"
    predictor = load_run(runs[kind])
    _check_attention(r, kind, heads=2, n=len(r["tokens"]), rank=predictor.program.net.
                     attention_units()["blocks.0.attn"].rank if kind == "kep_svgp" else None)
    p = predictor.predict_proba([TEXT], seed=2)[:, 0].mean(0)
    assert list(r["probs"].values()) == pytest.approx(p.tolist(), abs=1e-12)
    assert r["samples"] == (3 if predictor.stochastic else 1)


@pytest.fixture(scope="module")
def folders(tmp_path_factory):
    """``{kind: folder}``: a tiny BERT classifier (2 classes, named) with ``kind`` swapped into
    its last layer, saved with ``save_pretrained`` beside its word-piece tokenizer."""
    transformers = pytest.importorskip("transformers")
    from gpattn_ppl.hf import swap
    from tests.conftest import word_piece_tokenizer
    from tests.models.test_swap import SMALL

    root = tmp_path_factory.mktemp("explain_folders")
    out = {}
    for kind in KINDS:
        path = root / kind
        path.mkdir()
        size = word_piece_tokenizer(path)
        torch.manual_seed(0)
        cfg = transformers.BertConfig(vocab_size=size, hidden_size=16, num_hidden_layers=2,
                                      num_attention_heads=4, intermediate_size=32,
                                      max_position_embeddings=64, num_labels=2,
                                      id2label={0: "no", 1: "yes"}, label2id={"no": 0, "yes": 1})
        model = transformers.BertForSequenceClassification(cfg).eval()
        swap(model, kind, layers=[-1], init="random", **SMALL.get(kind, {}))
        model.save_pretrained(path)
        out[kind] = path
    return out


@pytest.mark.parametrize("kind", KINDS)
def test_explain_every_unit_of_a_saved_folder(kind, folders, tmp_path, capsys, quiet_transformers):
    """``explain FOLDER``: the swapped layer's attention over the tokenizer's word pieces
    (``[CLS]`` and ``[SEP]`` included), and the probabilities of ``predict FOLDER``."""
    from gpattn_ppl.run.saved_model import load_saved_model

    png = tmp_path / "why.png"
    assert main(["explain", str(folders[kind]), WORDS, "--out", str(png), "--samples", "3",
                 "--seed", "4"]) == 0
    r = json.loads(capsys.readouterr().out)
    assert png.stat().st_size > 0
    assert r["layer"] == "bert.encoder.layer.1.attention.unit"
    assert r["tokens"] == ["[CLS]", *WORDS.split(), "[SEP]"]
    predictor = load_saved_model(folders[kind])
    unit = predictor.model.get_submodule(r["layer"])
    _check_attention(r, kind, heads=4, n=len(r["tokens"]),
                     rank=unit.rank if kind == "kep_svgp" else None)
    p = predictor.predict_proba([WORDS], samples=3, seed=4)[:, 0]
    assert r["samples"] == p.shape[0] == (3 if predictor.stochastic else 1)
    assert list(r["probs"]) == ["no", "yes"]
    assert list(r["probs"].values()) == pytest.approx(p.mean(0).tolist(), abs=1e-12)
    assert r["temperature"] == 1.0
