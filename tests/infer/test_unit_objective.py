"""Per-unit objective weights: a ``model.swap`` / ``model.overrides`` entry's ``objective``
replaces ``train.objective``'s weights for that entry's units only."""

import pytest
import torch

from gpattn_ppl.infer.program import PyroProgram, unit_schedules
from gpattn_ppl.models import ConfigError, build_model
from gpattn_ppl.models.spec import validate_model_spec
from gpattn_ppl.ppl.objective import validate_objective

transformers = pytest.importorskip("transformers")


def text_model(overrides, depth=2):
    torch.manual_seed(0)
    return build_model({"arch": "text", "dim": 8, "heads": 2, "depth": depth, "mlp_dim": 16,
                        "overrides": overrides}, num_classes=2, vocab_size=20)


def batch():
    g = torch.Generator().manual_seed(1)
    x = torch.randint(1, 20, (4, 6), generator=g)
    mask = torch.ones(4, 6, dtype=torch.bool)
    mask[0, 4:] = False
    return x, mask, torch.tensor([0, 1, 1, 0]), torch.arange(4)


def seeded_loss(program, seed=3):
    torch.manual_seed(seed)
    x, mask, y, idx = batch()
    return program.loss(x, mask, y, idx).detach()


CGPT_BOTH = [{"blocks": [0, 1], "attention": {"kind": "cgpt"}}]


def test_a_unit_weight_replaces_the_global_one_for_that_unit_only():
    net = text_model(CGPT_BOTH + [{"blocks": [0], "attention": {"kind": "cgpt"},
                                    "objective": {"cgp_alpha": 0.25}}])
    assert net.blocks[0].attn.objective_weights == {"cgp_alpha": 0.25}
    assert net.blocks[1].attn.objective_weights == {}
    program = PyroProgram(net, num_data=8, objective={"cgp_alpha": 0.5})
    assert program.weight("blocks.0.attn.cgp_loss") == 0.25
    assert program.weight("blocks.1.attn.cgp_loss") == 0.5
    net.train()
    seeded_loss(program)
    assert program.last_scales == {"blocks.0.attn.cgp_loss": 0.25, "blocks.1.attn.cgp_loss": 0.5}


def test_the_loss_moves_by_the_unit_weight_times_its_term_alone():
    """Brute force: same draws, block 0's weight a against 0 -> the per-datum loss differs by
    a times block 0's mean term, whatever block 1's term is."""
    losses, terms = {}, {}
    for a in (0.0, 0.7):
        net = text_model([{"blocks": [0, 1], "attention": {"kind": "cgpt"}},
                          {"blocks": [0], "attention": {"kind": "cgpt"},
                           "objective": {"cgp_alpha": a}}])
        net.train()
        program = PyroProgram(net, num_data=8, objective={"cgp_alpha": 0.3})
        losses[a] = float(seeded_loss(program))
        terms[a] = {k: float(v) for k, v in program.last_terms.items()}
    assert terms[0.0] == terms[0.7]
    t0 = terms[0.7]["blocks.0.attn.cgp_loss"]
    assert abs(t0) > 1e-6
    assert losses[0.7] - losses[0.0] == pytest.approx(0.7 * t0, rel=1e-4, abs=1e-6)


def test_a_unit_schedule_follows_the_program_clock():
    net = text_model([{"blocks": [-1], "attention": {"kind": "cgpt"},
                       "objective": {"cgp_alpha": {"kind": "linear", "start": 0.0, "end": 1.0,
                                                   "epochs": 2}}}])
    program = PyroProgram(net, num_data=8, objective={"cgp_alpha": 0.5}, total_epochs=4)
    program.set_epoch(1.0)
    assert program.weight("blocks.1.attn.cgp_loss") == pytest.approx(0.5)
    program.set_epoch(3.0)
    assert program.weight("blocks.1.attn.cgp_loss") == pytest.approx(1.0)


def test_sites_mode_scales_a_units_kl_sites_by_its_own_weight():
    """The sites-mode ELBO with block 1's KL weight 0 (its own) equals the one with the global
    KL weight 0 where block 1 is the only stochastic unit; with weight 1 it differs."""
    spec = [{"blocks": [1], "attention": {"kind": "sgpa", "num_inducing": 3}}]

    def loss(own, glob):
        entry = dict(spec[0], objective={"kl_weight": own}) if own is not None else spec[0]
        net = text_model([entry])
        net.train()
        program = PyroProgram(net, num_data=8, objective={"kl_weight": glob}, mode="sites")
        return float(seeded_loss(program))

    assert loss(0.0, 1.0) == pytest.approx(loss(None, 0.0), rel=1e-6)
    assert loss(1.0, 0.0) == pytest.approx(loss(None, 1.0), rel=1e-6)
    assert loss(0.0, 1.0) != pytest.approx(loss(None, 1.0), rel=1e-6)


def test_a_weight_for_a_term_the_unit_does_not_have_is_refused_on_the_first_training_pass():
    net = text_model([{"blocks": [1], "attention": {"kind": "sgpa", "num_inducing": 3},
                       "objective": {"cgp_alpha": 0.1}}])
    program = PyroProgram(net, num_data=8)
    net.eval()
    seeded_loss(program)                 # evaluation: terms may be absent, nothing checked
    net.train()
    with pytest.raises(ValueError, match=r"blocks\.1\.attn: objective weight\(s\) cgp_alpha "
                                         r"given for this unit, whose objective terms are: kl"):
        seeded_loss(program)


def test_a_kl_weight_is_not_refused_in_sites_mode_where_the_kl_is_the_elbos():
    """KEP-SVGP's KL is a global latent site in sites mode, not a reported term."""
    net = text_model([{"blocks": [1], "attention": {"kind": "kep_svgp", "rank": 3},
                       "objective": {"kl_weight": 0.5}}])
    net.train()
    program = PyroProgram(net, num_data=8, mode="sites")
    seeded_loss(program)
    assert "blocks.1.attn.kl" not in program.last_terms
    with pytest.raises(ValueError, match=r"blocks\.1\.attn: objective weight\(s\) kl_weight"):
        PyroProgram(text_model([{"blocks": [1], "attention": {"kind": "gumbel"},
                                 "objective": {"kl_weight": 0.5}}]).train(), num_data=8
                    ).loss(*batch())


def test_the_entry_objective_is_validated_with_its_key_path():
    base = {"arch": "text", "dim": 8, "heads": 2, "depth": 2}
    ok = validate_model_spec(dict(base, overrides=[
        {"blocks": [0], "attention": {"kind": "cgpt"}, "objective": {"cgp_alpha": 1e-3}}]))
    assert ok["overrides"][0]["objective"] == {"cgp_alpha": 1e-3}
    bad = [({"cgp_weight": 1.0}, r"model\.overrides\[0\]\.objective: unknown key 'cgp_weight'"),
           ({"cgp_alpha": -0.1}, r"model\.overrides\[0\]\.objective: cgp_alpha: a weight must "
                                 r"be finite and >= 0"),
           ({"cgp_alpha": {"kind": "linear", "start": 0.0, "end": float("nan")}},
            r"finite and >= 0"),
           ([1.0], r"model\.overrides\[0\]\.objective: expected a mapping")]
    for objective, match in bad:
        with pytest.raises(ConfigError, match=match):
            validate_model_spec(dict(base, overrides=[
                {"blocks": [0], "attention": {"kind": "cgpt"}, "objective": objective}]))
    with pytest.raises(ConfigError, match=r"model\.overrides\[0\]: expected a mapping with the "
                                          r"keys blocks, attention \(and optionally objective\)"):
        validate_model_spec(dict(base, overrides=[
            {"blocks": [0], "attention": {"kind": "cgpt"}, "weights": {}}]))


def test_train_objective_refuses_a_negative_weight():
    with pytest.raises(ValueError, match="kl_weight: a weight must be finite and >= 0"):
        validate_objective({"kl_weight": {"kind": "linear", "start": 1.0, "end": -1.0}})
    validate_objective({"kl_weight": 0.0, "cgp_alpha": {"kind": "linear", "start": 0, "end": 1}})


def test_unit_schedules_names_the_unit_of_a_bad_weight():
    net = text_model([{"blocks": [0], "attention": {"kind": "cgpt"}}])
    net.blocks[0].attn.objective_weights = {"cgp_alpha": "much"}
    with pytest.raises(ValueError, match=r"blocks\.0\.attn: objective_weights: cgp_alpha"):
        unit_schedules(net)


# -- the pretrained encoder: model.swap entries --------------------------------------------------
# tiny_checkpoint: the 2-layer BERT of tests/conftest.py


def test_swap_entries_carry_their_own_weights_into_the_program(tiny_checkpoint):
    spec = validate_model_spec({"arch": "hf", "checkpoint": str(tiny_checkpoint), "swap": [
        {"layers": [0], "attention": {"kind": "cgpt"}, "objective": {"cgp_alpha": 1e-4}},
        {"layers": [1], "attention": {"kind": "cgpt"}}]})
    net = build_model(spec, num_classes=2)
    layer = "encoder.encoder.layer.{}.attention.unit"
    program = PyroProgram(net, num_data=8, objective={"cgp_alpha": 3e-2})
    assert set(program.unit_schedules) == {layer.format(0)}
    x = torch.tensor([[2, 5, 6, 7, 3, 0], [2, 8, 9, 10, 11, 3]])
    net.train()
    torch.manual_seed(0)
    program.loss(x, x != 0, torch.tensor([0, 1]), torch.tensor([0, 1]))
    assert program.last_scales == {f"{layer.format(0)}.cgp_loss": 1e-4,
                                   f"{layer.format(1)}.cgp_loss": 3e-2}
    with pytest.raises(ConfigError, match=r"model\.swap\[0\]\.objective: unknown key 'alpha'"):
        validate_model_spec({"arch": "hf", "checkpoint": str(tiny_checkpoint), "swap": [
            {"layers": [0], "attention": {"kind": "cgpt"}, "objective": {"alpha": 1.0}}]})


def test_fit_epoch_reports_each_terms_weighted_share_with_the_units_own_weight():
    from types import SimpleNamespace

    from gpattn_ppl.infer import fit_epoch

    net = text_model(CGPT_BOTH + [{"blocks": [0], "attention": {"kind": "cgpt"},
                                    "objective": {"cgp_alpha": 0.25}}])
    program = PyroProgram(net, num_data=8, objective={"cgp_alpha": 0.5})
    x, mask, y, idx = batch()
    torch.manual_seed(0)
    out = fit_epoch(program, torch.optim.SGD(net.parameters(), lr=0.0),
                    [SimpleNamespace(x=x, mask=mask, y=y, index=idx)], checks=False)
    for block, w in ((0, 0.25), (1, 0.5)):
        name = f"blocks.{block}.attn.cgp_loss"
        assert out[f"share/{name}"] == pytest.approx(w * out[f"term/{name}"], rel=1e-6)
