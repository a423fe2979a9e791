"""``gpattn-ppl explain``: one sentence through a tiny trained run (attention, per-token
uncertainty, probabilities), and ``plot --temperature-scaled`` reading the run's temperature."""

import json

import numpy as np
import pytest
import torch

from gpattn_ppl import load_run
from gpattn_ppl.data.tokenizer import WordTokenizer
from gpattn_ppl.run.cli import main
from gpattn_ppl.run.experiment import Trainer
from gpattn_ppl.run.explain import explain_sentence as explain

TEXT = "The more you read, the more zyzzyva you want."


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    """A tiny CoLA run with SGPA in the last block, evaluated with temperature scaling."""
    from tests.run.conftest import TINY

    cfg = json.loads(json.dumps(TINY))
    cfg["model"]["depth"] = 2
    cfg["model"]["overrides"] = [{"blocks": [-1], "attention": {"kind": "sgpa"}}]
    cfg["train"]["epochs"] = 1
    cfg["eval"].update({"temperature_scaling": True, "mc_samples": 4})
    run = tmp_path_factory.mktemp("explain") / "run"
    Trainer(cfg, run).fit()
    return run


def test_explain_numbers_and_figure(trained, tmp_path, drawn):
    r = explain(trained, TEXT, out=tmp_path / "why.png", seed=3)
    predictor = load_run(trained)
    # the tokens the run's encoder made, the unknown word starred
    words = WordTokenizer.tokenize(TEXT)
    assert [t.rstrip("*") for t in r["tokens"]] == words
    unk = [t for t in r["tokens"] if t.endswith("*")]
    assert "zyzzyva*" in unk
    n, heads = len(words), predictor.config["model"]["heads"]
    assert r["layer"] == "blocks.1.attn" and r["unit"] == "SGPAttention"
    attn = np.asarray(r["attention"])
    assert attn.shape == (heads, n, n) and np.isfinite(attn).all() and np.abs(attn).max() > 0
    assert np.asarray(r["predictive_variance"]).shape == (heads, n)
    assert min(min(row) for row in r["predictive_variance"]) > 0  # a GP unit is uncertain
    assert len(r["mc_output_variance"]) == n and max(r["mc_output_variance"]) > 0
    # the probabilities, entropy and MI of `predict` with the same seed and temperature
    rec = predictor.predict([TEXT], seed=3)[0]
    assert r["samples"] == 4 and r["temperature"] == predictor.temperature != 1.0
    assert r["label"] == rec["label"] and r["score"] == pytest.approx(rec["score"], abs=1e-12)
    for c, p in rec["probs"].items():
        assert r["probs"][c] == pytest.approx(p, abs=1e-12)
    assert r["entropy"] == pytest.approx(rec["entropy"], abs=1e-12)
    assert r["mutual_info"] == pytest.approx(rec["mutual_info"], abs=1e-12)
    # the figure: one heat-map per head with token labels, colour bars, the probabilities
    fig = drawn["why.png"]
    assert (tmp_path / "why.png").stat().st_size > 0
    maps = [ax for ax in fig.axes if ax.get_title().startswith("head ")]
    assert [ax.get_title() for ax in maps] == [f"head {h}" for h in range(heads)]
    for ax in maps:
        assert len(ax.images) == 1 and ax.images[0].get_array().shape == (n, n)
        lo, hi = ax.images[0].get_clim()  # one scale; centred at 0 for signed weights
        assert hi == pytest.approx(np.abs(attn).max())
        assert lo == (-hi if attn.min() < 0 else 0.0)
        assert [t.get_text() for t in ax.get_xticklabels()] == r["tokens"]
    bars = [ax for ax in fig.axes if ax.get_label() == "<colorbar>"]
    assert sorted(ax.get_ylabel() for ax in bars) == ["attention weight", "variance"]
    probs_ax = next(ax for ax in fig.axes if ax.get_title().startswith("pred: "))
    assert f"MI {r['mutual_info']:.3g}" in probs_ax.get_title()
    assert len(probs_ax.patches) == len(predictor.classes)


def test_explain_cli_and_errors(trained, tmp_path, capsys):
    out = tmp_path / "cli.png"
    assert main(["explain", str(trained), TEXT, "--out", str(out), "--samples", "2",
                 "--no-temperature"]) == 0
    printed = json.loads(capsys.readouterr().out)
    assert printed["figure"] == str(out) and out.stat().st_size > 0
    assert printed["samples"] == 2 and printed["temperature"] == 1.0
    with pytest.raises(ValueError, match=r"no such attention unit; the run has blocks.0.attn, "
                       r"blocks.1.attn"):
        explain(trained, TEXT, out=tmp_path / "x.png", layer="blocks.7.attn")
    with pytest.raises(ValueError, match="inside the run folder"):
        explain(trained, TEXT, out=trained / "x.png")
    with pytest.raises(ValueError, match="text is empty"):
        explain(trained, "  ", out=tmp_path / "x.png")
    r = explain(trained, TEXT, out=tmp_path / "soft.png", layer="blocks.0.attn", samples=2)
    assert r["predictive_variance"] is None  # softmax: a point mass
    attn = torch.tensor(r["attention"])
    torch.testing.assert_close(attn.sum(-1), torch.ones(attn.shape[:2], dtype=attn.dtype))


def test_plot_temperature_scaled_uses_the_fitted_temperature(trained, tmp_path, drawn):
    tau = json.loads((trained / "calibration.json").read_text())["temperature"]
    assert main(["plot", str(trained), "--out", str(tmp_path / "p"),
                 "--temperature-scaled"]) == 0
    fig = drawn["reliability.png"]
    assert fig.axes[0].get_title().startswith(f"run + TS (τ = {tau:.2f}) — ECE")
    assert "temperature-scaled predictive" in fig.get_suptitle()
    assert len(fig.axes) == 2  # the tempered panel only
