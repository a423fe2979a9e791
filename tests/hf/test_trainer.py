"""SwappedTrainer: the loss holds the units' terms at step-0 weights, training runs, evaluation
averages seeded Monte-Carlo passes."""

import math

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from gpattn_ppl.hf import (
    SwappedTrainer,
    SwapRecordError,
    mc_logits,
    objective_terms,
    step0_weight,
    swap,
    uncertainty_metrics,
)
from gpattn_ppl.hf import sampling as hf_sampling
from gpattn_ppl.models import swap_attention

from .hosts import SMALL, batch, dataset, tiny_classifier, transformers

UNIT = "bert.encoder.layer.1.attention.unit"


def _args(tmp_path, **kw):
    base = dict(output_dir=str(tmp_path), per_device_train_batch_size=8,
                per_device_eval_batch_size=8, save_strategy="no", report_to="none",
                disable_tqdm=True, use_cpu=True, learning_rate=1e-3, seed=0)
    base.update(kw)
    return transformers.TrainingArguments(**base)


def _trainer(model, tmp_path, **kw):
    data = dataset()
    trainer = SwappedTrainer(model=model, args=_args(tmp_path, max_steps=3, logging_steps=1),
                             train_dataset=data, eval_dataset=data[:10], **kw)
    trainer.remove_callback(transformers.PrinterCallback)
    return trainer


def _inputs(seed=1):
    enc = batch(seed=seed)
    enc["labels"] = torch.tensor([0, 1, 2])
    return enc


# -- the step-0 rule ---------------------------------------------------------------------------

def test_step0_weight_reproduces_the_documented_weights():
    """docs/derivations/pretrained_init.rst: SGPA 1e-8, CGPT 3e-4, SCGPT 2e-4; KEP-SVGP's global
    KL (0.04 nats per sentence) stays at the ELBO weight 1."""
    assert step0_weight(0.76, 5.3e6) == 1e-8
    assert step0_weight(0.63, 165.0) == 3e-4
    assert step0_weight(0.69, 259.0) == 2e-4
    assert step0_weight(0.66, 0.04) == 1.0


def test_step0_weight_rounds_down_to_one_digit():
    assert step0_weight(3.0, 1.0) == 0.3                # exactly one digit: kept
    assert step0_weight(1.0, 1.0 / 0.99) == 0.09         # 0.099 -> 0.09 (down, not to 0.1)
    assert step0_weight(1.0, 2.0) == 0.05
    assert step0_weight(1.0, 0.0) == 1.0 and step0_weight(1.0, -3.0) == 1.0
    assert step0_weight(0.0, 5.0) == 0.0
    for ce, t in [(0.7, 123.4), (2.3, 1e9), (0.01, 7.0)]:
        w = step0_weight(ce, t)
        assert 0.01 * ce / t < w * 1.0000001 and w <= 0.1 * ce / t
    with pytest.raises(ValueError, match="finite"):
        step0_weight(float("nan"), 1.0)
    with pytest.raises(ValueError, match="finite"):
        step0_weight(1.0, float("inf"))


def test_objective_terms_divide_global_terms_by_num_data():
    model = tiny_classifier()
    swap(model, "kep_svgp", layers=[-1], init="random", **SMALL["kep_svgp"])
    model(**batch())
    unit = model.bert.encoder.layer[1].attention.unit
    raw = unit.objective_terms()
    assert raw["kl"].dim() == 0                               # KEP-SVGP's KL is global
    terms = objective_terms(model, num_data=50)
    torch.testing.assert_close(terms[f"{UNIT}.kl"], raw["kl"] / 50)
    torch.testing.assert_close(terms[f"{UNIT}.ksvd_loss"], raw["ksvd_loss"].float().mean())


# -- the loss -----------------------------------------------------------------------------------

def _ce(model, inputs, seed):
    torch.manual_seed(seed)
    x = {k: v for k, v in inputs.items() if k != "labels"}
    return F.cross_entropy(model(**x).logits, inputs["labels"])


def test_the_loss_holds_the_terms_at_step0_weights(tmp_path):
    """SGPA fitted to a random host's layer: its KL starts millions of times above the
    cross-entropy. The first batch fixes w = step0_weight(CE_0, T_0), and the loss is CE + w T
    (the same draws): between 1 % and 10 % of CE above it, so a loss without the term fails."""
    model = tiny_classifier()
    swap(model, "sgpa", layers=[-1], calibration=batch(), **SMALL["sgpa"])
    trainer = _trainer(model, tmp_path)
    model.train()
    inputs = _inputs()
    torch.manual_seed(0)
    loss = trainer.compute_loss(model, inputs)
    terms = {k: float(v.detach()) for k, v in objective_terms(model, trainer.num_data).items()}
    ce = float(_ce(model, inputs, seed=0).detach())
    step0 = trainer.step0
    assert step0["cross_entropy"] == pytest.approx(ce, rel=1e-6)
    assert set(step0["weights"]) == {f"{UNIT}.kl"}
    T0 = step0["terms"][f"{UNIT}.kl"]
    assert T0 == pytest.approx(terms[f"{UNIT}.kl"], rel=1e-6) and T0 > 1e4 * ce
    w = step0["weights"][f"{UNIT}.kl"]
    assert w == step0_weight(ce, T0) and w < 1
    loss = float(loss.detach())
    assert loss == pytest.approx(ce + w * T0, rel=1e-5)
    assert 0.01 * ce <= loss - ce <= 0.1 * ce
    # later batches keep the weight
    torch.manual_seed(1)
    loss2 = trainer.compute_loss(model, _inputs(seed=2))
    T1 = float(objective_terms(model, trainer.num_data)[f"{UNIT}.kl"].detach())
    ce2 = float(_ce(model, _inputs(seed=2), seed=1).detach())
    assert float(loss2.detach()) == pytest.approx(ce2 + w * T1, rel=1e-5)
    assert trainer.term_weights == {f"{UNIT}.kl": w}


def test_the_terms_reach_the_gradients(tmp_path):
    """With the term weighted, the unit's parameters get another gradient than from the
    cross-entropy alone (weight 0)."""
    grads = {}
    for name, weights in (("with", None), ("without", {"kl": 0.0})):
        model = tiny_classifier()
        swap(model, "sgpa", layers=[-1], init="random", **SMALL["sgpa"])
        trainer = _trainer(model, tmp_path, term_weights=weights)
        model.train()
        torch.manual_seed(0)
        trainer.compute_loss(model, _inputs()).backward()
        unit = model.bert.encoder.layer[1].attention.unit
        grads[name] = torch.cat([p.grad.flatten() for p in unit.parameters()
                                 if p.grad is not None])
        assert (trainer.term_weights[f"{UNIT}.kl"] > 0) == (name == "with")
    assert torch.isfinite(grads["with"]).all()
    assert not torch.allclose(grads["with"], grads["without"])


def test_term_weights_override_by_name_and_by_group(tmp_path):
    model = tiny_classifier()
    swap(model, "kep_svgp", layers=[-1], init="random", **SMALL["kep_svgp"])
    trainer = _trainer(model, tmp_path, term_weights={"kl": 0.5, f"{UNIT}.ksvd_loss": 0.0})
    model.train()
    trainer.compute_loss(model, _inputs())
    assert trainer.term_weights == {f"{UNIT}.kl": 0.5, f"{UNIT}.ksvd_loss": 0.0}


def test_a_few_trainer_steps(tmp_path):
    model = tiny_classifier()
    swap(model, "sgpa", layers=[-1], init="random", **SMALL["sgpa"])
    trainer = _trainer(model, tmp_path)
    before = [p.detach().clone() for p in model.parameters()]
    trainer.train()
    logs = [h for h in trainer.state.log_history if "loss" in h]
    assert len(logs) == 3 and all(math.isfinite(h["loss"]) for h in logs)
    assert all(f"term/{UNIT}.kl" in h for h in logs)
    assert trainer.step0 is not None and 0 < trainer.term_weights[f"{UNIT}.kl"] < 1
    assert any(not torch.equal(a, b) for a, b in zip(before, model.parameters()))


def test_schedules_follow_the_trainers_epoch(tmp_path):
    model = tiny_classifier()
    swap(model, "gumbel", layers=[-1], init="random",
         temperature_schedule={"kind": "linear", "start": 2.0, "end": 0.5})
    trainer = _trainer(model, tmp_path)
    trainer.train()
    unit = model.bert.encoder.layer[1].attention.unit
    assert 0.5 <= unit.temperature < 2.0


def test_unrecorded_swaps_and_bad_labels_are_refused(tmp_path):
    model = tiny_classifier()      # units swapped into a part: not recorded in the config
    swap_attention(model.bert.encoder, "sgpa", layers=[-1], init="random", **SMALL["sgpa"])
    with pytest.raises(SwapRecordError, match="gpattn_ppl.hf.swap"):
        _trainer(model, tmp_path)
    model = tiny_classifier()
    swap(model, "sgpa", layers=[-1], init="random", **SMALL["sgpa"])
    trainer = _trainer(model, tmp_path)
    inputs = _inputs()
    inputs["labels"] = inputs["labels"].float()
    with pytest.raises(ValueError, match="single-label class ids"):
        trainer.compute_loss(model, inputs)


# -- evaluation ---------------------------------------------------------------------------------

def test_evaluation_averages_seeded_passes(tmp_path):
    model = tiny_classifier()
    swap(model, "kep_svgp", layers=[-1], init="random", **SMALL["kep_svgp"])
    trainer = _trainer(model, tmp_path, mc_samples=4)
    passes = trainer.predict(dataset()[:10], per_pass=True)
    p = torch.as_tensor(passes.predictions, dtype=torch.float64)
    assert p.shape == (10, 4, 3)
    torch.testing.assert_close(p.sum(-1), torch.ones(10, 4, dtype=torch.float64))
    assert not torch.equal(p[:, 0], p[:, 1])                  # four different draws
    # the default: the averaged probabilities [n, K] of the same (seeded) passes
    out = trainer.predict(dataset()[:10])
    assert out.predictions.shape == (10, 3)
    np.testing.assert_allclose(out.predictions, passes.predictions.mean(1), rtol=1e-6)
    assert out.metrics == pytest.approx({**passes.metrics, **{k: out.metrics[k] for k in
                                         out.metrics if k.endswith(("_runtime", "per_second"))}})
    # the loss is the NLL of the averaged probabilities, the metrics are computed on them
    mean = p.mean(1)
    nll = float(-mean[torch.arange(10), torch.as_tensor(out.label_ids)].log().mean())
    assert out.metrics["test_loss"] == pytest.approx(nll, rel=1e-4)
    assert out.metrics["test_nll"] == pytest.approx(nll, rel=1e-6)
    assert out.metrics["test_mutual_info"] > 0
    again = trainer.predict(dataset()[:10])                    # eval_seed: reproducible
    assert np.array_equal(again.predictions, out.predictions)
    mean = _trainer(model, tmp_path, eval_mean=True, per_pass=True).predict(dataset()[:10])
    assert mean.predictions.shape == (10, 1, 3) and mean.metrics["test_mutual_info"] == 0


def test_predictions_work_with_an_ordinary_compute_metrics(tmp_path):
    """A compute_metrics that knows nothing of passes gets the averaged probabilities [n, K]
    (argmax is the prediction); one marked per_pass gets the passes [n, S, K]."""
    model = tiny_classifier()
    swap(model, "sgpa", layers=[-1], init="random", **SMALL["sgpa"])
    seen = {}

    def accuracy(eval_pred):
        preds, labels = eval_pred
        seen["plain"] = preds.shape
        return {"accuracy": float((preds.argmax(-1) == labels).mean())}

    trainer = _trainer(model, tmp_path, mc_samples=3, compute_metrics=accuracy)
    metrics = trainer.evaluate()
    assert seen["plain"] == (10, 3)
    out = trainer.predict(dataset()[:10])
    acc = float((out.predictions.argmax(-1) == out.label_ids).mean())
    assert metrics["eval_accuracy"] == pytest.approx(acc)

    def passes(eval_pred):
        seen["passes"] = eval_pred.predictions.shape
        return {}

    passes.per_pass = True
    _trainer(model, tmp_path, mc_samples=3, compute_metrics=passes).evaluate()
    assert seen["passes"] == (10, 3, 3)
    # the default compute_metrics is marked: it sees the passes, hence the mutual information
    assert uncertainty_metrics.per_pass is True
    assert _trainer(model, tmp_path, mc_samples=3).evaluate()["eval_mutual_info"] > 0


def test_eval_mean_defaults_to_the_recorded_predictive(tmp_path):
    model = tiny_classifier()
    swap(model, "sgpa", layers=[-1], init="random", **SMALL["sgpa"])
    assert _trainer(model, tmp_path).eval_mean is False
    model.config.gpattn_predictive = "mean"
    trainer = _trainer(model, tmp_path)
    assert trainer.eval_mean is True
    assert trainer.predict(dataset()[:10], per_pass=True).predictions.shape == (10, 1, 3)
    assert _trainer(model, tmp_path, eval_mean=False).eval_mean is False


def test_multi_label_and_regression_heads_are_refused(tmp_path):
    model = tiny_classifier()
    swap(model, "sgpa", layers=[-1], init="random", **SMALL["sgpa"])
    model.config.problem_type = "multi_label_classification"
    with pytest.raises(ValueError, match="multi-label.*single-label classifier per label"):
        _trainer(model, tmp_path)
    model.config.problem_type = "regression"
    with pytest.raises(ValueError, match="num_labels >= 2"):
        _trainer(model, tmp_path)


def test_uncertainty_metrics_on_known_passes():
    """Two passes that disagree completely on one example: MI = log 2 - 0 there. Per-pass
    probabilities and per-pass logits give the same metrics."""
    big = 30.0
    logits = np.array([[[big, 0.0], [0.0, big]], [[big, 0.0], [big, 0.0]]])     # [n, S, K]
    m = uncertainty_metrics((logits, np.array([0, 0])))
    assert m["mutual_info"] == pytest.approx(math.log(2) / 2, rel=1e-6)
    assert m["acc"] == 1.0
    assert set(m) == {"acc", "mcc", "nll", "ece", "entropy", "mutual_info"}
    probs = torch.softmax(torch.as_tensor(logits), -1).numpy()
    assert uncertainty_metrics((probs, np.array([0, 0]))) == pytest.approx(m)
    one = uncertainty_metrics((probs.mean(1), np.array([0, 0])))       # one predictive [n, K]
    assert one["mutual_info"] == 0 and one["nll"] == pytest.approx(m["nll"])


def test_the_prefix_cache_is_exact_and_used(monkeypatch):
    """Only the last layer draws: the embeddings and layer 0 run once for S passes, and the
    draws equal those of S full passes."""
    model = tiny_classifier()
    swap(model, "sgpa", layers=[-1], init="random", **SMALL["sgpa"])
    assert [type(o).__name__ for o, _ in hf_sampling.prefix_targets(model)] == \
        ["BertEmbeddings", "BertLayer"]
    calls = {"n": 0}
    model.bert.encoder.layer[0].intermediate.dense.register_forward_hook(
        lambda *a: calls.__setitem__("n", calls["n"] + 1))
    enc = batch()
    torch.manual_seed(3)
    cached = mc_logits(model, enc, 5)
    assert calls["n"] == 1
    monkeypatch.setattr(hf_sampling, "prefix_targets", lambda m: [])
    torch.manual_seed(3)
    full = mc_logits(model, enc, 5)
    assert calls["n"] == 6
    assert torch.equal(cached, full)
