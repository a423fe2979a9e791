"""The deterministic prefix runs once per batch of T passes, and the predictions are unchanged."""

import contextlib

import pytest
import torch

from gpattn_ppl.data import ArrayDataset
from gpattn_ppl.infer import PyroProgram, predict
from gpattn_ppl.models import TextClassifier
from gpattn_ppl.models.host import PrefixCache


def dataset(vocab=50, n=10, N=7):
    g = torch.Generator().manual_seed(0)
    x = torch.randint(1, vocab, (n, N), generator=g)
    lengths = torch.randint(2, N + 1, (n,), generator=g)
    return ArrayDataset(x, torch.randint(0, 2, (n,), generator=g), lengths)


def run(net, ds, cache: bool, monkeypatch):
    if not cache:
        monkeypatch.setattr(type(net), "prefix_cache", lambda self: contextlib.nullcontext())
    torch.manual_seed(5)
    out = predict(PyroProgram(net, num_data=len(ds)), ds, num_samples=4, batch_size=4)
    monkeypatch.undo()
    return out["logits"]


def counting(module):
    """Count the calls of ``module``'s own computation (its MLP's first linear layer)."""
    calls = {"n": 0}
    module.register_forward_hook(lambda *a: calls.__setitem__("n", calls["n"] + 1))
    return calls


def test_library_classifier(monkeypatch):
    torch.manual_seed(0)
    net = TextClassifier(num_classes=2, vocab_size=50, dim=16, depth=3, heads=2, mlp_dim=32,
                         attention=[{"kind": "softmax"}, {"kind": "softmax"},
                                    {"kind": "sgpa", "num_inducing": 3}])
    assert [a for _, a in net.prefix_targets()] == ["embed", "forward", "forward"]
    ds = dataset()
    calls = counting(net.blocks[0].mlp[0])
    plain = run(net, ds, False, monkeypatch)
    n_plain, calls["n"] = calls["n"], 0
    cached = run(net, ds, True, monkeypatch)
    torch.testing.assert_close(cached, plain, rtol=0, atol=0)
    assert n_plain > 3 and calls["n"] == 3       # 3 batches: every pass -> once per batch


def test_nothing_cached_in_training_or_under_mc_dropout():
    net = TextClassifier(num_classes=2, vocab_size=50, dim=16, depth=2, heads=2, mlp_dim=32,
                         attention={"kind": "sgpa", "num_inducing": 3})
    assert [a for _, a in net.prefix_targets()] == ["embed"]
    net.train()
    assert isinstance(net.prefix_cache(), contextlib.nullcontext)
    net.eval()
    assert isinstance(net.prefix_cache(), PrefixCache)
    net.set_mc_dropout(True)
    assert isinstance(net.prefix_cache(), contextlib.nullcontext)


def test_hf_classifier(monkeypatch):
    transformers = pytest.importorskip("transformers")
    from gpattn_ppl.models import HFClassifier

    torch.manual_seed(0)
    cfg = transformers.BertConfig(vocab_size=50, hidden_size=16, num_hidden_layers=3,
                                  num_attention_heads=4, intermediate_size=32)
    net = HFClassifier(num_classes=2, encoder=transformers.BertModel(cfg),
                       swap=[{"layers": [-1], "attention": {"kind": "kep_svgp", "rank": 3}}])
    assert len(net.prefix_targets()) == 3             # embeddings + the two softmax layers
    ds = dataset()
    calls = counting(net.encoder.encoder.layer[0].intermediate.dense)
    plain = run(net, ds, False, monkeypatch)
    n_plain, calls["n"] = calls["n"], 0
    cached = run(net, ds, True, monkeypatch)
    torch.testing.assert_close(cached, plain, rtol=0, atol=0)
    assert n_plain > 3 and calls["n"] == 3
