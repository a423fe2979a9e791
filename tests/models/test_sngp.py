"""SNGP: the random-Fourier-feature GP output layer, its Laplace precision and mean-field logits,
the spectral normalisation of the residual layers, and the head on the text, ViT and HF
backbones (models/sngp.py; docs/derivations/sngp.rst)."""

import json
import math
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

from gpattn_ppl.infer import PyroProgram, fit_epoch
from gpattn_ppl.models import (
    ConfigError,
    RandomFeatureGP,
    SpectralNormLinear,
    build_model,
    mean_field_logits,
    spectral_normalize,
)
from gpattn_ppl.models.classifier import SNGPHostMixin
from gpattn_ppl.run.config import load_config

REPO = Path(__file__).resolve().parents[2]

TEXT = {"arch": "text", "dim": 16, "heads": 2, "depth": 2, "mlp_dim": 32, "dropout": 0.0,
        "max_len": 12, "head": "sngp", "sngp": {"num_features": 64}}


def _text(**sngp):
    spec = {**TEXT, "sngp": {**TEXT["sngp"], **sngp}}
    return build_model(spec, num_classes=3, vocab_size=40)


def _batches(n=20, bs=6, seed=1):
    g = torch.Generator().manual_seed(seed)
    x = torch.randint(1, 40, (n, 10), generator=g)
    mask = torch.ones(n, 10, dtype=torch.bool)
    mask[::3, 7:] = False
    y = torch.randint(0, 3, (n,), generator=g)
    return [SimpleNamespace(x=x[i:i + bs], mask=mask[i:i + bs], y=y[i:i + bs],
                            index=torch.arange(i, min(i + bs, n))) for i in range(0, n, bs)]


def _record_head(net):
    """Every training pass's (phi, logits) at the SNGP head, in float64."""
    seen = []

    def hook(module, args, out):
        if module.training:
            phi = module.random_features(module.transform_input(args[0]))
            seen.append((phi.detach().double(), out.detach().double()))

    return seen, net.head.register_forward_hook(hook)


def _brute_precision(seen, ridge, D):
    P = ridge * torch.eye(D, dtype=torch.float64)
    for phi, logits in seen:
        p = torch.softmax(logits, -1).amax(-1)
        P += (phi * (p * (1 - p))[:, None]).T @ phi
    return P


# -- the random-feature layer ---------------------------------------------------------------------

@pytest.mark.parametrize("length_scale", [1.0, 2.0])
def test_random_features_approximate_the_rbf_kernel(length_scale):
    D = 16384
    head = RandomFeatureGP(4, 2, num_features=D, length_scale=length_scale)
    x = torch.randn(6, 4, dtype=torch.float64) * 0.8
    phi = head.random_features(x.float()).double()
    approx = phi @ phi.T
    exact = torch.exp(-torch.cdist(x, x).square() / (2 * length_scale ** 2))
    # each entry is a mean of D bounded terms of variance <= 1/2: MC error ~ 0.7 / sqrt(D)
    assert (approx - exact).abs().max() < 5 * 0.71 / math.sqrt(D)
    assert torch.allclose(phi.square().sum(-1), torch.ones(6, dtype=torch.float64), atol=0.05)


def test_precision_is_the_sum_over_an_epoch_and_resets_at_the_next():
    torch.manual_seed(0)
    net = _text(ridge=2.0)
    program = PyroProgram(net, num_data=20)
    opt = torch.optim.Adam(net.parameters(), lr=1e-2)
    batches = _batches()
    net.on_train_epoch_start()
    seen, handle = _record_head(net)
    fit_epoch(program, opt, batches)
    handle.remove()
    assert len(seen) == len(batches)                       # one update per step
    expected = _brute_precision(seen, 2.0, 64)
    torch.testing.assert_close(net.head.precision.double(), expected, rtol=1e-5, atol=1e-5)
    assert not torch.allclose(net.head.precision, 2.0 * torch.eye(64))
    net.on_train_epoch_start()                             # the trainer's hook: a fresh sum
    torch.testing.assert_close(net.head.precision, 2.0 * torch.eye(64), rtol=0, atol=0)
    # an evaluation pass leaves it alone
    net.eval()
    with torch.no_grad():
        net(batches[0].x, batches[0].mask)
    torch.testing.assert_close(net.head.precision, 2.0 * torch.eye(64), rtol=0, atol=0)


def test_momentum_is_a_moving_average_kept_across_epochs():
    torch.manual_seed(0)
    head = RandomFeatureGP(5, 3, num_features=16, momentum=0.9)
    h = torch.randn(4, 5)
    phi, logits = head.random_features(h), head.beta(head.random_features(h))
    head.train()
    head(h)
    p = torch.softmax(logits.double(), -1).amax(-1)
    a = phi.double() * (p * (1 - p)).sqrt()[:, None]
    expected = 0.9 * torch.eye(16, dtype=torch.float64) + 0.1 * a.T @ a / 4
    torch.testing.assert_close(head.precision.double(), expected, rtol=1e-5, atol=1e-6)
    net = _text(momentum=0.5)
    net.train()
    net(_batches()[0].x)
    before = net.head.precision.clone()
    net.on_train_epoch_start()                             # no reset with a momentum
    torch.testing.assert_close(net.head.precision, before)


def test_covariance_and_variance_against_a_float64_inverse():
    torch.manual_seed(0)
    head = RandomFeatureGP(8, 4, num_features=48, ridge=0.5)
    head.train()
    for _ in range(5):
        head(torch.randn(16, 8) * 2)
    P = head.precision.double()
    Sigma = torch.linalg.inv(P)                            # the reference only
    torch.testing.assert_close(head.covariance().double(), Sigma, rtol=1e-4, atol=1e-5)
    phi = head.random_features(torch.randn(7, 8))
    var = head.predictive_variance(phi).double()
    expected = torch.einsum("bi,ij,bj->b", phi.double(), Sigma, phi.double())
    torch.testing.assert_close(var, expected, rtol=1e-4, atol=1e-6)
    assert (var > 0).all()


def test_evaluation_returns_the_mean_field_logits():
    torch.manual_seed(0)
    head = RandomFeatureGP(8, 4, num_features=32, mean_field_factor=math.pi / 8)
    head.train()
    head(torch.randn(10, 8))
    head.eval()
    h = torch.randn(5, 8)
    phi = head.random_features(h).double()
    logits = phi @ head.beta.weight.double().T
    var = torch.einsum("bi,ij,bj->b", phi, torch.linalg.inv(head.precision.double()), phi)
    expected = logits / torch.sqrt(1 + math.pi / 8 * var)[:, None]
    with torch.no_grad():
        torch.testing.assert_close(head(h).double(), expected, rtol=1e-4, atol=1e-6)
    head.mean_field_factor = 0.0                           # 0: the plain logits
    with torch.no_grad():
        torch.testing.assert_close(head(h).double(), logits, rtol=1e-4, atol=1e-6)
    lg, v = torch.randn(3, 2), torch.tensor([0.0, 1.0, 8.0])
    torch.testing.assert_close(mean_field_logits(lg, v, 0.5),
                               lg / torch.tensor([1.0, 1.5, 5.0]).sqrt()[:, None])


def test_unscaled_features_approximate_the_scaled_kernel():
    """scale_features false: phi = cos(W h / l + b), so phi(x).phi(y) ~ (D/2) k(x, y)."""
    torch.manual_seed(0)
    D = 4096
    head = RandomFeatureGP(4, 2, num_features=D, length_scale=2.0, scale_features=False)
    x = torch.randn(6, 4)
    phi = head.random_features(x).double()
    assert phi.abs().max() <= 1.0 and phi.abs().max() > 0.9
    exact = torch.exp(-torch.cdist(x, x).double().square() / 8.0)
    torch.testing.assert_close(phi @ phi.T / (D / 2), exact, atol=0.06, rtol=0)


def test_pooler_and_input_norm_come_before_the_random_features():
    """BERT-SNGP's pooler (tanh of a spectrally normalised dense layer) and the input LayerNorm,
    against the same computation by hand; each off by default, and the pooler bounded."""
    torch.manual_seed(0)
    plain = RandomFeatureGP(8, 3, num_features=16)
    assert plain.pooler is None and plain.input_norm is None
    h = torch.randn(5, 8)
    assert torch.equal(plain.transform_input(h), h)
    head = RandomFeatureGP(8, 3, num_features=16, pooler=True, input_norm=True, norm_bound=0.5)
    with torch.no_grad():
        head.pooler.weight.mul_(10.0)                       # far above the bound
        head.input_norm.weight.uniform_(0.5, 2.0)
        head.input_norm.bias.uniform_(-1.0, 1.0)
    head.pooler.power_iteration(50)
    head.eval()
    W = head.pooler.weight.double()
    W_bounded = W * min(1.0, 0.5 / torch.linalg.matrix_norm(W, 2).item())
    z = torch.tanh(h.double() @ W_bounded.T + head.pooler.bias.double())
    z = torch.nn.functional.layer_norm(z, (8,), head.input_norm.weight.double(),
                                       head.input_norm.bias.double())
    with torch.no_grad():
        torch.testing.assert_close(head.transform_input(h).double(), z, rtol=1e-4, atol=1e-5)
        torch.testing.assert_close(head(h).double(), head.beta(head.random_features(z.float()))
                                   .double() / torch.sqrt(1 + head.mean_field_factor
                                   * head.predictive_variance(head.random_features(z.float())))
                                   .double()[:, None], rtol=1e-4, atol=1e-5)
    assert torch.linalg.matrix_norm(head.pooler.bounded_weight().detach(), 2) <= 0.5 + 1e-4
    net = _text(pooler=True, input_norm=True)               # from a config, on a backbone
    assert net.head.pooler is not None and net.head.input_norm is not None
    assert {"head.pooler.weight", "head.input_norm.weight"} <= dict(net.named_parameters()).keys()


def test_no_update_in_a_guide_pass():
    """Sites mode runs the network as guide and as model each step: one update only."""
    torch.manual_seed(0)
    net = build_model({**TEXT, "attention": {"kind": "sgpa", "num_inducing": 3}},
                      num_classes=3, vocab_size=40)
    program = PyroProgram(net, num_data=20, mode="sites")
    net.train()
    b = _batches()[0]
    seen, handle = _record_head(net)
    program.loss(b.x, b.mask, b.y, b.index)
    handle.remove()
    assert len(seen) == 2                                  # guide, then model
    torch.testing.assert_close(net.head.precision.double(),
                               _brute_precision(seen[-1:], 1.0, 64), rtol=1e-5, atol=1e-5)


# -- spectral normalisation -----------------------------------------------------------------------

def test_spectral_norm_of_the_normalised_layers_is_bounded():
    torch.manual_seed(0)
    net = _text(norm_bound=0.9)
    assert net.spectral_layers == [f"blocks.{i}.{n}" for i in range(2)
                                   for n in ("attn.out", "mlp.0", "mlp.3")]
    with torch.no_grad():
        net.blocks[0].mlp[0].weight.mul_(10.0)             # far above the bound
        net.blocks[1].mlp[3].weight.mul_(0.01)             # well below it
    for name in net.spectral_layers:
        layer = net.get_submodule(name)
        assert isinstance(layer, SpectralNormLinear)
        layer.power_iteration(500)                         # converged
        s = torch.linalg.matrix_norm(layer.bounded_weight().detach(), 2)
        assert s <= 0.9 * (1 + 1e-4), name
    small = net.blocks[1].mlp[3]
    torch.testing.assert_close(small.bounded_weight(), small.weight)  # left as it is
    big = net.blocks[0].mlp[0]
    assert torch.linalg.matrix_norm(big.bounded_weight().detach(), 2) == pytest.approx(0.9,
                                                                                      rel=1e-4)
    # the parameters keep their names, and the weight is still the one trained
    names = {n for n, _ in net.named_parameters()}
    assert "blocks.0.mlp.0.weight" in names and "head.beta.weight" in names
    assert "blocks.0.mlp.0.sn_u" in net.state_dict()
    # one power-iteration step per training pass, none at evaluation
    u = big.sn_u.clone()
    big.eval()
    big(torch.randn(2, 16))
    torch.testing.assert_close(big.sn_u, u, rtol=0, atol=0)


def test_spectral_normalize_shares_parameters_and_names_errors():
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(3, 4), torch.nn.ReLU())
    w = model[0].weight
    assert spectral_normalize(model, ["0"], bound=1.0) == ["0"]
    assert model[0].weight is w and isinstance(model[0], SpectralNormLinear)
    assert spectral_normalize(model, ["0"], bound=1.0) == ["0"]   # idempotent
    with pytest.raises(ValueError, match="not an nn.Linear"):
        spectral_normalize(model, ["1"], bound=1.0)
    net = _text(spectral_norm=False)
    assert net.spectral_layers == [] and type(net.blocks[0].mlp[0]) is torch.nn.Linear


# -- the classifiers --------------------------------------------------------------------------------

@pytest.mark.parametrize("kind", ["softmax", "sgpa", "kep_svgp", "cgpt", "scgpt", "h_gumbel",
                                  "gumbel", "kernel"])
def test_every_unit_takes_the_head(kind):
    small = {"sgpa": {"num_inducing": 3}, "kep_svgp": {"rank": 3}, "scgpt": {"num_inducing": 3},
             "h_gumbel": {"num_centroids": 3}}.get(kind, {})
    torch.manual_seed(0)
    net = build_model({**TEXT, "attention": {"kind": kind, **small}}, num_classes=3,
                      vocab_size=40)
    b = _batches()[0]
    loss = PyroProgram(net, num_data=20).loss(b.x, b.mask, b.y, b.index)
    loss.backward()
    assert torch.isfinite(loss) and net.head.beta.weight.grad is not None
    net.eval()
    with torch.no_grad():
        out = net(b.x, b.mask)
    assert out.shape == (6, 3) and torch.isfinite(out).all()
    if kind in ("softmax", "kernel"):                      # the head adds no randomness
        assert not net.stochastic
        with torch.no_grad():
            torch.testing.assert_close(net(b.x, b.mask), out, rtol=0, atol=0)


def test_vit_takes_the_head():
    torch.manual_seed(0)
    net = build_model({"arch": "vit", "dim": 16, "heads": 2, "depth": 1, "mlp_dim": 16,
                       "image_size": 8, "patch_size": 4, "head": "sngp",
                       "sngp": {"num_features": 32}}, num_classes=4)
    net.train()
    net(torch.randn(3, 3, 8, 8))
    net.eval()
    out = net(torch.randn(3, 3, 8, 8))
    assert out.shape == (3, 4) and torch.isfinite(out).all()
    assert "blocks.0.attn.out" in net.spectral_layers


def test_state_dict_round_trip_gives_identical_logits():
    torch.manual_seed(0)
    net = _text()
    opt = torch.optim.Adam(net.parameters(), lr=1e-2)
    fit_epoch(PyroProgram(net, num_data=20), opt, _batches())
    net.eval()
    b = _batches(seed=5)[0]
    with torch.no_grad():
        expected = net(b.x, b.mask)
    torch.manual_seed(123)
    other = _text().eval()
    with torch.no_grad():
        before = other(b.x, b.mask)                        # its covariance factor is cached
    other.load_state_dict(net.state_dict())
    with torch.no_grad():
        after = other(b.x, b.mask)
    assert not torch.equal(before, after)
    torch.testing.assert_close(after, expected, rtol=0, atol=0)
    assert {"head.precision", "head.rff_weight", "head.rff_bias"} <= set(net.state_dict())


def test_config_keys_and_errors():
    cfg = load_config({"model": {"head": "sngp", "sngp": {"num_features": 8}}})
    assert cfg["model"]["sngp"]["num_features"] == 8
    assert cfg["model"]["sngp"]["mean_field_factor"] == pytest.approx(math.pi / 8)
    assert load_config({})["model"]["head"] == "linear"
    with pytest.raises(ConfigError, match=r"model\.sngp\.ridge: applies to model\.head 'sngp'"):
        load_config({"model": {"sngp": {"ridge": 2.0}}})
    with pytest.raises(ConfigError, match=r"model\.head: 'gp' is not allowed"):
        load_config({"model": {"head": "gp"}})
    with pytest.raises(ConfigError, match=r"model\.sngp\.momentum: 1 is out of range"):
        load_config({"model": {"head": "sngp", "sngp": {"momentum": 1}}})
    with pytest.raises(ConfigError, match=r"model\.sngp\.nope: unknown key"):
        load_config({"model": {"head": "sngp", "sngp": {"nope": 1}}})
    with pytest.raises(ConfigError, match=r"model\.sngp\.ridge: 0 is out of range"):
        load_config({"model": {"head": "sngp", "sngp": {"ridge": 0}}})
    cfg = load_config({"model": {"head": "sngp", "sngp": {"pooler": True}}})
    assert cfg["model"]["sngp"]["pooler"] is True and cfg["model"]["sngp"]["input_norm"] is False
    with pytest.raises(ConfigError, match=r"model\.sngp\.input_norm"):
        load_config({"model": {"head": "sngp", "sngp": {"input_norm": "yes"}}})


def test_training_writes_results_and_calls_the_epoch_hooks(tmp_path, monkeypatch):
    """``gpattn-ppl train`` of the shipped config, shrunk; the trainer resets the precision at
    each epoch start."""
    from gpattn_ppl.infer import load_checkpoint
    from gpattn_ppl.run.cli import main

    calls = []
    original = SNGPHostMixin.on_train_epoch_start
    monkeypatch.setattr(SNGPHostMixin, "on_train_epoch_start",
                        lambda self: (calls.append(1), original(self)))
    out = tmp_path / "run"
    code = main(["train", str(REPO / "experiments/configs/cola/sngp.yaml"), "--out", str(out), "--set",
                 "train.epochs=2", "train.warmup_epochs=0", "train.progress=false",
                 "data.limit_train=48", "data.limit_eval=24", "data.batch_size=16",
                 "model.dim=16", "model.mlp_dim=16", "model.sngp.num_features=32",
                 "eval.mc_samples=2"])
    assert code == 0 and len(calls) == 2
    first = json.loads((out / "results.json").read_text())["test"]
    # a later evaluation of the run loads the same precision: the same predictions
    assert main(["evaluate", str(out), "--no-plots"]) == 0
    again = json.loads((out / "results.json").read_text())["test"]
    assert again["nll"] == first["nll"] and again["acc"] == first["acc"]
    state = load_checkpoint(out / "best.pt")["model"]
    P = state["head.precision"]
    assert P.shape == (32, 32) and not torch.allclose(P, torch.eye(32))
    assert any(k.endswith("mlp.0.sn_u") for k in state)


# -- the pretrained (HF) backbone -------------------------------------------------------------------

# tiny_checkpoint: the 2-layer BERT of tests/conftest.py


def test_hf_classifier_takes_the_head(tiny_checkpoint):
    from gpattn_ppl.models import HFClassifier

    torch.manual_seed(0)
    net = build_model({"arch": "hf", "checkpoint": str(tiny_checkpoint), "head": "sngp",
                       "sngp": {"num_features": 32},
                       "swap": [{"layers": [-1], "attention": {"kind": "kep_svgp", "rank": 3}}]},
                      num_classes=2)
    assert isinstance(net, HFClassifier)
    assert net.spectral_layers == [
        "encoder.encoder.layer.0.attention.output.dense",
        "encoder.encoder.layer.0.intermediate.dense",
        "encoder.encoder.layer.0.output.dense",
        "encoder.encoder.layer.1.attention.unit.out",
        "encoder.encoder.layer.1.intermediate.dense",
        "encoder.encoder.layer.1.output.dense"]
    x = torch.tensor([[2, 6, 7, 8, 3, 0], [2, 9, 10, 5, 6, 3]])
    mask = x != 0
    net.calibrate(x, mask)                                 # writes the unit's raw weight
    new, _ = net.parameter_groups()
    assert any(p is net.head.beta.weight for p in new)
    net.on_train_epoch_start()
    loss = PyroProgram(net, num_data=10).loss(x, mask, torch.tensor([0, 1]), torch.tensor([0, 1]))
    loss.backward()
    assert torch.isfinite(loss) and not torch.allclose(net.head.precision, torch.eye(32))
    net.eval()
    with torch.no_grad():
        out = net(x, mask)
    assert out.shape == (2, 2) and torch.isfinite(out).all()
    with pytest.raises(ValueError, match="head must be one of"):
        HFClassifier(num_classes=2, checkpoint=str(tiny_checkpoint), head="gp")


# -- several processes ------------------------------------------------------------------------------

DDP_WORKER = """
import sys
import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel
from gpattn_ppl.infer import PyroProgram
from gpattn_ppl.models import build_model

rank, port, out = int(sys.argv[1]), sys.argv[2], sys.argv[3]
dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=2)
torch.manual_seed(0)
net = build_model({"arch": "text", "dim": 16, "heads": 2, "depth": 1, "mlp_dim": 16,
                   "dropout": 0.0, "head": "sngp", "sngp": {"num_features": 16}},
                  num_classes=3, vocab_size=40)
program = PyroProgram(net, num_data=16)
program.forward_module = DistributedDataParallel(net)
g = torch.Generator().manual_seed(1)
x, y = torch.randint(1, 40, (16, 6), generator=g), torch.randint(0, 3, (16,), generator=g)
mine = []
net.head.register_forward_hook(lambda m, a, o: mine.append(
    (m.random_features(a[0]).detach().double(), o.detach().double())))
net.on_train_epoch_start()
net.train()
for step in range(2):
    idx = torch.arange(rank * 8 + step * 4, rank * 8 + step * 4 + 4)
    program.loss(x[idx], None, y[idx], idx).backward()
local = net.head.precision.clone()
net.on_train_epoch_end()
torch.save({"precision": net.head.precision, "local": local, "seen": mine}, f"{out}.{rank}")
dist.destroy_process_group()
"""


@pytest.mark.skipif(not torch.distributed.is_available()
                    or not torch.distributed.is_gloo_available(), reason="no gloo")
def test_ranks_combine_their_precisions_at_epoch_end(tmp_path):
    """Under DistributedDataParallel (2 gloo ranks, different shards) the precision is not
    overwritten by the buffer broadcast, and at epoch end both ranks hold the sum over all."""
    import os
    import socket
    import subprocess
    import sys

    script = tmp_path / "worker.py"
    script.write_text(DDP_WORKER)
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = str(s.getsockname()[1])
    env = {**os.environ, "PYTHONPATH": str(REPO) + os.pathsep + os.environ.get("PYTHONPATH", ""),
           "OMP_NUM_THREADS": "1"}
    procs = [subprocess.Popen([sys.executable, str(script), str(r), port, str(tmp_path / "out")],
                              env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
             for r in range(2)]
    logs = [p.communicate(timeout=1800)[0].decode() for p in procs]
    assert all(p.returncode == 0 for p in procs), logs
    res = [torch.load(tmp_path / f"out.{r}") for r in range(2)]
    for r in range(2):                                     # each rank's own sum, unbroadcast
        torch.testing.assert_close(res[r]["local"].double(),
                                   _brute_precision(res[r]["seen"], 1.0, 16), rtol=1e-5, atol=1e-5)
    total = _brute_precision(res[0]["seen"] + res[1]["seen"], 1.0, 16)
    for r in range(2):
        torch.testing.assert_close(res[r]["precision"].double(), total, rtol=1e-5, atol=1e-5)


def test_residual_linears_skip_the_attention_input_projections_of_deberta_v2():
    """DeBERTa-v2 names its inputs query_proj / key_proj / value_proj: they are not residual
    branches (spectral normalisation of SNGP applies to the outputs and the MLP only)."""
    transformers = pytest.importorskip("transformers")
    from gpattn_ppl.models.sngp import residual_linears

    cfg = transformers.DebertaV2Config(vocab_size=30, hidden_size=8, num_hidden_layers=1,
                                       num_attention_heads=2, intermediate_size=16)
    names = residual_linears(transformers.DebertaV2Model(cfg))
    assert names and not [n for n in names if n.rsplit(".", 1)[-1].endswith(
        ("query_proj", "key_proj", "value_proj"))], names
    assert any(n.endswith("attention.output.dense") for n in names), names
