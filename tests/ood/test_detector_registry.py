"""The OOD-detector registry: built-ins give the scores of the former if-chain, registration
rules, and a user's detector through ``--import`` in train, evaluate, compare and the figures."""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
import textwrap

import pytest
import torch
import yaml

from gpattn_ppl.infer import load_predictions
from gpattn_ppl.metrics.ood_detection import ood_detection_metrics
from gpattn_ppl.ood import (
    DETECTOR_NAMES,
    DETECTOR_NEEDS,
    OOD_DETECTORS,
    SCORE_NAMES,
    OODDetector,
    kl_matching_templates,
    ood_report,
    ood_score,
    register_ood_detector,
)
from gpattn_ppl.run.config import load_config
from tests.run.conftest import TINY

BUILT_IN = ("max_softmax", "entropy", "energy", "kl_matching", "mutual_info", "pred_variance")


@pytest.fixture
def scratch_registry():
    """Names registered inside a test are removed afterwards (the registry is process-wide)."""
    before = dict(OOD_DETECTORS)
    yield
    for name in [n for n in OOD_DETECTORS if n not in before]:
        OOD_DETECTORS.pop(name)
    assert OOD_DETECTORS == before


# -- the built-in detectors ----------------------------------------------------------------------
def _entropy(p):  # the former formula: -sum p log p, with 0 log 0 = 0
    return -(p * p.clamp_min(1e-300).log()).sum(-1)


def _previous(name, p, z, d):
    """The formulas of the if-chain the registry replaced, written out again."""
    pbar = p.mean(0)
    if name == "max_softmax":
        return pbar.max(-1).values
    if name == "entropy":
        return -_entropy(pbar)
    if name == "energy":
        return torch.logsumexp(z.mean(0), dim=-1)
    if name == "kl_matching":
        pred = pbar.argmax(-1)
        return -(pbar * (pbar.clamp_min(1e-12).log() - d[pred].clamp_min(1e-12).log())).sum(-1)
    if name == "mutual_info":
        return -(_entropy(pbar) - _entropy(p).mean(0)).clamp_min(0.0)
    return -p.var(0, correction=0).mean(-1)


def test_the_built_ins_are_registered_in_report_order():
    assert tuple(DETECTOR_NAMES) == BUILT_IN
    assert tuple(SCORE_NAMES) == (*BUILT_IN, "gp_variance")
    assert OOD_DETECTORS["gp_variance"] is OOD_DETECTORS["pred_variance"]
    needs = {n: set(OOD_DETECTORS[n].needs) for n in BUILT_IN}
    assert needs == {"max_softmax": set(), "entropy": set(), "energy": {"logits"},
                     "kl_matching": {"templates"}, "mutual_info": {"passes"},
                     "pred_variance": {"passes"}}
    assert not any(OOD_DETECTORS[n].higher_is_ood for n in SCORE_NAMES)
    # the former plot labels
    assert OOD_DETECTORS["entropy"].label == "Negative predictive entropy (nats)"
    assert OOD_DETECTORS["gp_variance"].label == "Negative predictive variance"


@pytest.mark.parametrize("name", SCORE_NAMES)
def test_built_in_scores_are_unchanged(name):
    gen = torch.Generator().manual_seed(3)
    z = 3 * torch.randn(4, 50, 5, generator=gen, dtype=torch.float64)
    p = torch.softmax(z, -1)
    d = kl_matching_templates(torch.softmax(torch.randn(2, 60, 5, generator=gen), -1))
    got = ood_score(name, p, z, d)
    want = _previous(name, p, z, d)
    assert got.dtype == torch.float64 and got.shape == (50,)
    assert torch.allclose(got, want, rtol=1e-12, atol=1e-14), name
    if name not in ("entropy", "mutual_info"):  # the same operations: the same bits
        assert torch.equal(got, want), name


def test_live_views_follow_the_registry_and_behave_like_tuples(scratch_registry):
    assert ("x", *SCORE_NAMES) == ("x",) + SCORE_NAMES
    assert SCORE_NAMES + ("x",) == (*SCORE_NAMES, "x")
    assert SCORE_NAMES == tuple(OOD_DETECTORS) and DETECTOR_NAMES[0] == "max_softmax"
    assert "neg_max_logit" not in SCORE_NAMES

    @register_ood_detector("neg_max_logit", needs=("logits",), higher_is_ood=True)
    def _neg(probs, logits, templates):
        return -logits.mean(0).max(-1).values

    assert SCORE_NAMES[-1] == DETECTOR_NAMES[-1] == "neg_max_logit"
    assert "neg_max_logit" in SCORE_NAMES and len(DETECTOR_NAMES) == len(BUILT_IN) + 1
    # config validation reads the registry when it runs
    assert load_config(None, ["eval.ood_detectors=[max_softmax,neg_max_logit]"])[
        "eval"]["ood_detectors"] == ["max_softmax", "neg_max_logit"]


# -- registering ---------------------------------------------------------------------------------
def test_a_registered_detector_is_scored_with_its_direction_and_needs(scratch_registry):
    @register_ood_detector("neg_max_logit", needs=("logits",), higher_is_ood=True,
                           label="Max logit")
    def neg_max_logit(probs, logits, templates):
        assert probs.dtype == logits.dtype == torch.float64 and templates is None
        return -logits.mean(0).max(-1).values

    spec = OOD_DETECTORS["neg_max_logit"]
    assert spec == OODDetector("neg_max_logit", neg_max_logit, "Max logit",
                               frozenset({"logits"}), True)
    z = torch.tensor([[[2.0, 0.0]], [[0.0, 4.0]]])  # mean [1, 2] -> max logit 2
    assert ood_score("neg_max_logit", torch.softmax(z, -1), z).tolist() == [2.0]
    with pytest.raises(ValueError, match="OOD score 'neg_max_logit' needs logits"):
        ood_score("neg_max_logit", torch.softmax(z, -1))
    # the report's default set takes it when its needs are met, after the built-ins
    p_in, p_out = torch.softmax(z, -1), torch.softmax(z.flip(-1), -1)
    assert list(ood_report(p_in, z, p_out, z.flip(-1))) == [
        "max_softmax", "entropy", "energy", "mutual_info", "pred_variance", "neg_max_logit"]
    assert "neg_max_logit" not in ood_report(p_in, None, p_out, None)


def test_default_label_and_needs_checks(scratch_registry):
    @register_ood_detector("spread", needs="passes")
    def spread(probs, logits, templates):
        return -probs.std(0).sum(-1)

    @register_ood_detector("raw_entropy", higher_is_ood=True)
    def raw_entropy(probs, logits, templates):
        return _entropy(probs.mean(0))

    assert OOD_DETECTORS["spread"].label == "spread" and OOD_DETECTORS["spread"].multi_pass
    assert OOD_DETECTORS["raw_entropy"].label == "Negative raw_entropy"
    p = torch.softmax(torch.randn(3, 6, 4, dtype=torch.float64), -1)
    assert torch.equal(ood_score("raw_entropy", p), ood_score("entropy", p))
    with pytest.raises(ValueError, match="OOD score 'spread' needs T > 1"):
        ood_score("spread", p[:1])


def test_registering_a_name_twice_is_refused(scratch_registry):
    def first(probs, logits, templates):
        return probs.mean(0)[:, 0]

    register_ood_detector("first_class")(first)
    register_ood_detector("first_class")(first)  # the same function again: a no-op
    with pytest.raises(ValueError, match="OOD detector 'first_class' is already registered"):
        register_ood_detector("first_class")(lambda probs, logits, templates: probs[0, :, 0])
    with pytest.raises(ValueError, match="OOD detector 'entropy' is already registered"):
        register_ood_detector("entropy")(first)
    with pytest.raises(ValueError, match="OOD detector 'gp_variance' is already registered"):
        register_ood_detector("my_variance", aliases=("gp_variance",))(first)
    assert "my_variance" not in OOD_DETECTORS  # nothing is registered when one name clashes
    assert OOD_DETECTORS["first_class"].score is first


def test_bad_registrations(scratch_registry):
    with pytest.raises(ValueError, match=r"unknown needs \['labels'\]; allowed: "
                       + ", ".join(DETECTOR_NEEDS)):
        register_ood_detector("x", needs=("labels",))
    with pytest.raises(ValueError, match="non-empty string"):
        register_ood_detector("")
    with pytest.raises(TypeError, match="not callable"):
        register_ood_detector("x")(42)

    @register_ood_detector("wrong_shape")
    def wrong_shape(probs, logits, templates):
        return probs.mean(0)

    with pytest.raises(ValueError, match=r"'wrong_shape' must return a tensor of shape \[n\]"):
        ood_score("wrong_shape", torch.full((3, 2), 0.5))


def test_unknown_name_lists_the_registered_names(scratch_registry):
    with pytest.raises(ValueError, match="unknown OOD score 'odin'; allowed: max_softmax, "
                       "entropy, energy, kl_matching, mutual_info, pred_variance, gp_variance$"):
        ood_score("odin", torch.full((1, 2), 0.5))
    register_ood_detector("odin")(lambda probs, logits, templates: probs.mean(0).max(-1).values)
    assert ood_score("odin", torch.full((1, 2), 0.5)).tolist() == [0.5]
    with pytest.raises(ValueError, match=r"allowed: .*, gp_variance, odin$"):
        ood_score("msp", torch.full((1, 2), 0.5))


# -- a user's detector through --import ----------------------------------------------------------
PLUGIN = textwrap.dedent('''
    from gpattn_ppl.ood import register_ood_detector

    @register_ood_detector("neg_max_logit", needs=("logits",), higher_is_ood=True,
                           label="Max logit")
    def neg_max_logit(probs, logits, templates):
        return -logits.mean(0).max(-1).values   # higher = more OOD; reported negated
''')
DETECTORS = "eval.ood_detectors=[max_softmax,neg_max_logit]"


def _cli(*args, cwd):
    return subprocess.run([sys.executable, "-m", "gpattn_ppl.run.cli", *map(str, args)],
                          capture_output=True, text=True, cwd=cwd, timeout=1800)


def _max_logit_metrics(run_dir, ood_set: str) -> dict:
    """The detection metrics of the max logit, computed here from the run's predictions."""
    preds = load_predictions(run_dir / "predictions.pt")
    s_in, s_out = (torch.as_tensor(preds[k]["logits"]).double().mean(0).max(-1).values
                   for k in ("test", ood_set))
    return ood_detection_metrics(s_in, s_out)


def test_a_detector_from_import_reaches_train_evaluate_compare_and_plots(
        tmp_path, scratch_registry, monkeypatch):
    (tmp_path / "plugin.py").write_text(PLUGIN)
    cfg = {**TINY, "train": {**TINY["train"], "epochs": 1, "device": "cpu"}}
    (tmp_path / "cfg.yaml").write_text(yaml.safe_dump(cfg))
    plain = _cli("train", "cfg.yaml", "--out", "run", "--set", DETECTORS, cwd=tmp_path)
    assert plain.returncode == 2
    assert "eval.ood_detectors[1]: unknown OOD detector 'neg_max_logit'" in plain.stderr

    trained = _cli("--import", "plugin.py", "train", "cfg.yaml", "--out", "run", "--set",
                   DETECTORS, cwd=tmp_path)
    assert trained.returncode == 0, trained.stderr[-2000:]
    run = tmp_path / "run"
    results = json.loads((run / "results.json").read_text())
    [ood_set] = results["ood"]
    detection = results["ood"][ood_set]["detection"]
    assert list(detection) == ["max_softmax", "neg_max_logit"]
    assert detection["neg_max_logit"] == pytest.approx(_max_logit_metrics(run, ood_set),
                                                       rel=1e-12)

    # evaluate draws the run's own detectors (eval.ood_detectors), the plugin's among them
    evaluated = _cli("--import", "plugin.py", "evaluate", "run", cwd=tmp_path)
    assert evaluated.returncode == 0, evaluated.stderr[-2000:]
    assert (run / "plots" / f"ood_{ood_set}_neg_max_logit.png").is_file()
    assert f"plots/ood_{ood_set}_neg_max_logit.png" in json.loads(
        (run / "run.json").read_text())["files"]
    plotted = _cli("--import", "plugin.py", "plot", "run", "--out", "figs", "--detectors",
                   "max_softmax", "neg_max_logit", cwd=tmp_path)
    assert plotted.returncode == 0, plotted.stderr[-2000:]
    assert (tmp_path / "figs" / f"ood_{ood_set}_neg_max_logit.png").is_file()
    again = json.loads(evaluated.stdout)["ood"][ood_set]["detection"]
    assert again["neg_max_logit"] == detection["neg_max_logit"]
    refused = _cli("evaluate", "run", "--no-plots", cwd=tmp_path)
    assert refused.returncode == 2 and "--import" in refused.stderr

    compared = _cli("--import", "plugin.py", "compare", "cfg.yaml", "--seeds", "0", "--out",
                    "cmp", "--set", DETECTORS, "--no-plots", "--no-progress", cwd=tmp_path)
    assert compared.returncode == 0, compared.stderr[-2000:]
    cmp_results = json.loads((tmp_path / "cmp" / "cfg" / "seed0" / "results.json").read_text())
    assert set(cmp_results["ood"][ood_set]["detection"]) == {"max_softmax", "neg_max_logit"}

    # the figures, in this process: register the plugin's detector here too
    spec = importlib.util.spec_from_file_location("_detector_plugin", tmp_path / "plugin.py")
    spec.loader.exec_module(importlib.util.module_from_spec(spec))
    from gpattn_ppl.run import plotting

    xlabels = {}
    save = plotting._save

    def spy(fig, path, *args, **kwargs):
        xlabels[path.name] = fig.axes[0].get_xlabel()
        return save(fig, path, *args, **kwargs)

    monkeypatch.setattr(plotting, "_save", spy)
    with pytest.raises(ValueError, match=r"unknown detector\(s\) \['max_logit'\]; allowed: .*"
                       "neg_max_logit"):
        plotting.plot_runs([run], tmp_path / "plots", detectors=["max_logit"])
    paths = plotting.plot_runs([run], tmp_path / "plots",
                               detectors=["max_softmax", "neg_max_logit"])
    figure = f"ood_{ood_set}_neg_max_logit.png"
    hists = [p.name for p in paths if p.name.startswith("ood_") and "_roc" not in p.name]
    assert hists == [f"ood_{ood_set}_max_softmax.png", figure]
    assert (tmp_path / "plots" / figure).stat().st_size > 0
    assert xlabels[figure] == "Max logit (higher = more ID)"
    assert xlabels[f"ood_{ood_set}_max_softmax.png"] == "Max softmax probability (higher = more ID)"
