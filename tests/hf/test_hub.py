"""save_pretrained / from_pretrained of swapped Hugging Face models: exact round trips, the
record in config.json, no pickle, clear errors for bad folders."""

import json

import pytest
import torch

from gpattn_ppl import settings
from gpattn_ppl.attention import ATTENTION
from gpattn_ppl.hf import SWAP_KEY, SwapRecordError, from_pretrained, mc_logits, swap
from gpattn_ppl.models import swap_attention

from .hosts import HOSTS, SMALL, batch, swap_warning, tiny_classifier


@pytest.fixture(autouse=True)
def _quiet(quiet_transformers):
    """No progress bars of ``save_pretrained`` / ``from_pretrained`` in the test output."""


def _no_torch_load(monkeypatch):
    def refuse(*args, **kwargs):
        raise AssertionError("torch.load called: the folder must load without pickle")

    monkeypatch.setattr(torch, "load", refuse)


def _round_trip(model, tmp_path, monkeypatch):
    model.save_pretrained(tmp_path)
    _no_torch_load(monkeypatch)
    loaded = from_pretrained(tmp_path)
    monkeypatch.undo()
    return loaded


def _mean_logits(model, enc):
    with torch.no_grad(), settings.posterior_mean():
        return model(**enc).logits


@pytest.mark.parametrize("kind", sorted(ATTENTION))
def test_round_trip_is_exact_for_every_kind(kind, tmp_path, monkeypatch):
    """Pretrained init fitted on a batch, saved, reloaded: the same logits bit for bit at the
    posterior mean, and the same Monte-Carlo draws under the same seed."""
    model, enc = tiny_classifier(), batch()
    swap(model, kind, layers=[-1], calibration=enc, **SMALL.get(kind, {}))
    loaded = _round_trip(model, tmp_path, monkeypatch)
    assert type(loaded) is type(model) and not loaded.training
    assert torch.equal(_mean_logits(loaded, enc), _mean_logits(model, enc))
    torch.manual_seed(7)
    draws = mc_logits(model, enc, 3)
    torch.manual_seed(7)
    again = mc_logits(loaded, enc, 3)
    assert torch.equal(again, draws)
    if ATTENTION[kind].stochastic:         # the draws are draws: the passes differ
        assert draws.shape[1] == 3 and not torch.equal(draws[:, 0], draws[:, 1])
    # what was saved: config.json holds the record, the weights are safetensors only
    files = sorted(p.name for p in tmp_path.iterdir())
    assert files == ["config.json", "model.safetensors"]
    record = json.loads((tmp_path / "config.json").read_text())[SWAP_KEY]
    assert record == [{"kind": kind, "layers": [1],
                       "paths": ["bert.encoder.layer.1.attention.unit"],
                       "options": loaded.config.gpattn_swap[0]["options"]}]
    assert set(SMALL.get(kind, {}).items()) <= set(record[0]["options"].items())


def test_trained_state_round_trips(tmp_path, monkeypatch):
    """After optimiser steps (every parameter moved, Gumbel temperature annealed) the reload is
    still exact: nothing the model computes with lives outside the saved weights."""
    model, enc = tiny_classifier(), batch()
    swap(model, "h_gumbel", layers=[0], init="random", **SMALL["h_gumbel"])
    swap(model, "sgpa", layers=[-1], calibration=enc, **SMALL["sgpa"])
    opt = torch.optim.Adam(model.parameters(), lr=1e-2)
    model.train()
    for _ in range(3):
        opt.zero_grad()
        model(**enc, labels=torch.tensor([0, 1, 2])).loss.backward()
        opt.step()
    model.bert.encoder.layer[0].attention.unit.temperature = 0.37     # a scheduled attribute
    model.eval()
    loaded = _round_trip(model, tmp_path, monkeypatch)
    assert loaded.bert.encoder.layer[0].attention.unit.temperature == pytest.approx(0.37)
    assert torch.equal(_mean_logits(loaded, enc), _mean_logits(model, enc))
    assert [e["kind"] for e in loaded.config.gpattn_swap] == ["h_gumbel", "sgpa"]


#: host -> (the layers swapped, the unit paths they give): ModernBERT's layer 0 is local
#: (sliding-window), refused
_PATHS = {"bert": ([0, -1], "bert.encoder.layer.{}.attention.unit"),
          "deberta": ([0, -1], "deberta.encoder.layer.{}.attention.unit"),
          "distilbert": ([0, -1], "distilbert.transformer.layer.{}.attention.unit"),
          "mpnet": ([0, -1], "mpnet.encoder.layer.{}.attention.unit"),
          "modernbert": ([-1], "model.layers.{}.attn.unit")}


@pytest.mark.parametrize("kind", ["kep_svgp", "sgpa"])
@pytest.mark.parametrize("host", HOSTS)
def test_every_host_round_trips(host, kind, tmp_path, monkeypatch):
    """swap, save_pretrained, from_pretrained on every host family: the same units at the same
    paths, the same logits at the posterior mean and the same draws under the same seed."""
    model, enc = tiny_classifier(host), batch()
    layers, path = _PATHS[host]
    with swap_warning(host):
        rec = swap(model, kind, layers=layers, calibration=enc, **SMALL[kind])
    assert [r["path"] for r in rec] == [path.format(i % 2) for i in layers]
    with swap_warning(host):                   # the reload replays the swap
        loaded = _round_trip(model, tmp_path, monkeypatch)
    assert type(loaded) is type(model)
    assert torch.equal(_mean_logits(loaded, enc), _mean_logits(model, enc))
    torch.manual_seed(7)
    draws = mc_logits(model, enc, 3)
    torch.manual_seed(7)
    assert torch.equal(mc_logits(loaded, enc, 3), draws)


def test_a_second_swap_of_a_layer_replays_in_order(tmp_path, monkeypatch):
    model, enc = tiny_classifier(), batch()
    swap(model, "sgpa", layers=[-1], init="random", **SMALL["sgpa"])
    swap(model, "kep_svgp", layers=[1], init="random", **SMALL["kep_svgp"])
    assert not any(m.training for m in model.modules())      # the model's mode is kept
    loaded = _round_trip(model, tmp_path, monkeypatch)
    assert type(loaded.bert.encoder.layer[1].attention.unit).kind == "kep_svgp"
    assert torch.equal(_mean_logits(loaded, enc), _mean_logits(model, enc))


def test_dropouts_are_recorded_as_built():
    model = tiny_classifier(dropout=0.2)
    swap(model, "gumbel", layers=[-1], init="random")
    opts = model.config.gpattn_swap[0]["options"]
    assert opts["attn_dropout"] == pytest.approx(0.2) and opts["proj_dropout"] == pytest.approx(0.2)


def test_loading_leaves_the_callers_random_state_alone(tmp_path):
    model = tiny_classifier()
    swap(model, "sgpa", layers=[-1], init="random", **SMALL["sgpa"])
    model.save_pretrained(tmp_path)
    torch.manual_seed(3)
    expected = torch.rand(3)
    torch.manual_seed(3)
    from_pretrained(tmp_path)
    assert torch.equal(torch.rand(3), expected)


# -- errors -------------------------------------------------------------------------------------

def test_a_folder_without_a_record_is_refused(tmp_path):
    tiny_classifier().save_pretrained(tmp_path)
    with pytest.raises(SwapRecordError, match="no 'gpattn_swap' record"):
        from_pretrained(tmp_path)


def test_missing_files_are_named(tmp_path):
    with pytest.raises(FileNotFoundError, match="no config.json"):
        from_pretrained(tmp_path)
    model = tiny_classifier()
    swap(model, "sgpa", layers=[-1], init="random", **SMALL["sgpa"])
    model.save_pretrained(tmp_path)
    (tmp_path / "model.safetensors").unlink()
    with pytest.raises(FileNotFoundError, match="no model.safetensors"):
        from_pretrained(tmp_path)


def _edit_record(folder, edit):
    cfg = json.loads((folder / "config.json").read_text())
    edit(cfg)
    (folder / "config.json").write_text(json.dumps(cfg))


def test_an_unknown_kind_is_refused(tmp_path):
    model = tiny_classifier()
    swap(model, "sgpa", layers=[-1], init="random", **SMALL["sgpa"])
    model.save_pretrained(tmp_path)
    _edit_record(tmp_path, lambda c: c[SWAP_KEY][0].update(kind="nope"))
    with pytest.raises(SwapRecordError, match="unknown attention kind 'nope'"):
        from_pretrained(tmp_path)


def test_a_malformed_record_is_refused(tmp_path):
    model = tiny_classifier()
    swap(model, "sgpa", layers=[-1], init="random", **SMALL["sgpa"])
    model.save_pretrained(tmp_path)
    _edit_record(tmp_path, lambda c: c.update({SWAP_KEY: [{"kind": "sgpa"}]}))
    with pytest.raises(SwapRecordError, match="malformed"):
        from_pretrained(tmp_path)


def test_mismatched_weights_are_named(tmp_path):
    """A record whose options build other shapes than the saved weights: named, not loaded."""
    model = tiny_classifier()
    swap(model, "kep_svgp", layers=[-1], init="random", rank=3)
    model.save_pretrained(tmp_path)
    _edit_record(tmp_path, lambda c: c[SWAP_KEY][0]["options"].update(rank=4))
    with pytest.raises(SwapRecordError, match="shape mismatch.*attention.unit"):
        from_pretrained(tmp_path)
    _edit_record(tmp_path, lambda c: c[SWAP_KEY][0].update(kind="softmax", options={}))
    with pytest.raises(SwapRecordError, match="missing .*qkv.*unexpected"):
        from_pretrained(tmp_path)


def test_paths_that_do_not_replay_are_refused(tmp_path):
    model = tiny_classifier()
    swap(model, "sgpa", layers=[-1], init="random", **SMALL["sgpa"])
    model.save_pretrained(tmp_path)
    _edit_record(tmp_path, lambda c: c[SWAP_KEY][0].update(layers=[0]))
    with pytest.raises(SwapRecordError, match="not at the recorded paths"):
        from_pretrained(tmp_path)


def test_unrecorded_swaps_and_bad_options_are_refused():
    """Units swapped into a part of the model that is not a PreTrainedModel (its encoder) are
    not recorded: a later swap of the model refuses to record over them. Options JSON cannot
    hold are refused on a PreTrainedModel; any other module swaps without a record."""
    model = tiny_classifier()
    swap_attention(model.bert.encoder, "sgpa", layers=[0], init="random", **SMALL["sgpa"])
    assert getattr(model.config, SWAP_KEY, None) is None
    with pytest.raises(SwapRecordError, match="not a transformers PreTrainedModel.*hf.swap"):
        swap(model, "kep_svgp", layers=[-1], rank=3)
    with pytest.raises(SwapRecordError, match="JSON"):
        swap(tiny_classifier(), "h_gumbel", init="random", num_centroids=torch.tensor(3))
    encoder = torch.nn.TransformerEncoder(torch.nn.TransformerEncoderLayer(16, 4, 32), 1,
                                          enable_nested_tensor=False)
    assert [r["path"] for r in swap(encoder, "softmax")] == ["layers.0.self_attn.unit"]
    assert type(encoder) is torch.nn.TransformerEncoder


def test_swapping_the_base_model_records_in_the_shared_config(tmp_path, monkeypatch):
    """``swap(model.bert, ...)``: the base model and the classifier share one config, whose
    record names the unit from the base model; the classifier saves and reloads exactly."""
    model, enc = tiny_classifier(), batch()
    swap(model.bert, "kep_svgp", layers=[-1], init="random", **SMALL["kep_svgp"])
    assert model.config.gpattn_swap[0]["paths"] == ["encoder.layer.1.attention.unit"]
    assert model.config.model_type == "gpattn_bert"
    loaded = _round_trip(model, tmp_path, monkeypatch)
    assert torch.equal(_mean_logits(loaded, enc), _mean_logits(model, enc))
