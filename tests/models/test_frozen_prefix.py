"""``model.train_layers``: the frozen layers run once per example (models/frozen_prefix.py), on a
tiny randomly initialised BERT saved to disk (the ``tiny_checkpoint`` fixture, 2 layers)."""

import pytest
import torch

from gpattn_ppl.models import ConfigError, HFClassifier, validate_model_spec
from gpattn_ppl.models.frozen_prefix import _SHARED, FrozenPrefix

pytest.importorskip("transformers")


def batch(pad: int = 0):
    """Two rows, the first padded; ``pad`` more padding columns on both."""
    x = torch.tensor([[2, 8, 9, 10, 3, 0], [2, 11, 12, 13, 14, 3]])
    x = torch.cat([x, torch.zeros(2, pad, dtype=torch.long)], 1)
    return x, x != 0


def pair(tiny_checkpoint, **kw):
    """``(full, top)``: the same weights, every layer trained / the top one only."""
    torch.manual_seed(0)
    full = HFClassifier(num_classes=3, checkpoint=str(tiny_checkpoint), **kw)
    top = HFClassifier(num_classes=3, checkpoint=str(tiny_checkpoint), train_layers=1, **kw)
    top.load_state_dict(full.state_dict())
    top.prefix.clear()        # the states kept before the weights were loaded
    return full.eval(), top.eval()


def test_top_layers_on_kept_states_give_the_full_forward(tiny_checkpoint):
    full, top = pair(tiny_checkpoint)
    x, mask = batch()
    with torch.no_grad():
        want = full(x, mask)
        first = top(x, mask)
        again = top(*batch(pad=3))    # the same rows with more padding: read, not recomputed
    torch.testing.assert_close(first, want, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(again, want, rtol=1e-5, atol=1e-6)
    assert (top.prefix.misses, top.prefix.hits) == (2, 2)
    assert len(top.prefix) == 2 and top.prefix.bytes > 0


def test_a_stochastic_unit_on_top_draws_as_in_the_full_forward(tiny_checkpoint):
    full, top = pair(tiny_checkpoint, swap=[{"layers": [-1], "attention": {"kind": "cgpt"}}])
    x, mask = batch()
    with torch.no_grad():
        torch.manual_seed(1)
        want = full(x, mask)
        top.prefix.states(x, mask)          # keep the rows first: no draw in the frozen part
        torch.manual_seed(1)
        got = top(x, mask)
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)


def test_only_the_top_layer_and_the_head_train(tiny_checkpoint):
    _, top = pair(tiny_checkpoint)
    top.train()
    assert not top.encoder.embeddings.training and not top.encoder.encoder.layer[0].training
    assert top.encoder.encoder.layer[1].training and top.head.training
    x, mask = batch()
    top(x, mask).sum().backward()
    grads = {n for n, p in top.named_parameters() if p.grad is not None}
    assert grads and all(n.startswith(("encoder.encoder.layer.1.", "head.")) for n in grads)
    assert not any(p.requires_grad for p in top.encoder.embeddings.parameters())
    new, backbone = top.parameter_groups()
    pooler = {id(p) for p in top.encoder.pooler.parameters()}     # unused by the pooling
    assert {id(p) for p in backbone} - pooler == {
        id(p) for p in top.encoder.encoder.layer[1].parameters()}
    top.set_mc_dropout(True)              # the frozen layers' dropouts stay off
    with torch.no_grad():
        a, b = top.eval().prefix.states(x, mask), top.prefix.states(x, mask)
    assert torch.equal(a, b)


def test_rows_are_shared_by_equal_frozen_layers_only(tiny_checkpoint):
    _, a = pair(tiny_checkpoint)
    b = HFClassifier(num_classes=5, checkpoint=str(tiny_checkpoint), train_layers=1)
    b.load_state_dict({**b.state_dict(), **{k: v for k, v in a.state_dict().items()
                                            if not k.startswith("head.")}})
    b.prefix = FrozenPrefix(b.encoder, b.prefix.blocks)   # fingerprint of the loaded weights
    assert b.prefix.fingerprint == a.prefix.fingerprint
    x, mask = batch()
    with torch.no_grad():
        a(x, mask)
        b(x, mask)
    assert b.prefix.hits == 2 and b.prefix.misses == 0
    with torch.no_grad():
        b.encoder.encoder.layer[0].output.dense.weight.add_(1.0)
    c = FrozenPrefix(b.encoder, b.prefix.blocks)
    assert c.fingerprint != a.prefix.fingerprint and len(c) == 0
    assert c.fingerprint in _SHARED


def test_the_bound_keeps_no_row_past_it(tiny_checkpoint):
    _, top = pair(tiny_checkpoint)
    top.prefix.clear()
    top.prefix.max_bytes = 0
    x, mask = batch()
    with torch.no_grad():
        top(x, mask)
        top(x, mask)
    assert len(top.prefix) == 0 and top.prefix.misses == 4


def test_refusals(tiny_checkpoint):
    ckpt = str(tiny_checkpoint)
    with pytest.raises(ValueError, match="train_layers must be an int in 1..2"):
        HFClassifier(num_classes=3, checkpoint=ckpt, train_layers=3)
    with pytest.raises(ValueError, match="give one of them"):
        HFClassifier(num_classes=3, checkpoint=ckpt, train_layers=1, freeze="embeddings")
    with pytest.raises(ValueError, match="sit in the frozen layers"):
        HFClassifier(num_classes=3, checkpoint=ckpt, train_layers=1,
                     swap=[{"layers": [0], "attention": {"kind": "cgpt"}}])
    assert HFClassifier(num_classes=3, checkpoint=ckpt, train_layers=2).prefix is None
    with pytest.raises(ConfigError, match="model.train_layers: applies to arch 'hf' only"):
        validate_model_spec({"arch": "text", "vocab_size": 10, "num_classes": 2,
                             "train_layers": 1})
    with pytest.raises(ConfigError, match="give one of them"):
        validate_model_spec({"arch": "hf", "checkpoint": ckpt, "num_classes": 2,
                             "train_layers": 1, "freeze": "embeddings"})


def test_a_host_whose_layers_do_not_chain_is_refused(tiny_checkpoint, monkeypatch):
    import contextlib

    @contextlib.contextmanager
    def wrong(self, h):     # the frozen blocks run again on their own output: the check sees it
        self._emb.forward = lambda *a, **k: h
        try:
            yield
        finally:
            del self._emb.forward

    monkeypatch.setattr(FrozenPrefix, "substitute", wrong)
    with pytest.raises(ValueError, match="do not give the full forward's output"):
        HFClassifier(num_classes=3, checkpoint=str(tiny_checkpoint), train_layers=1)
