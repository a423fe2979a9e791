"""Numerics that report themselves (issue 16, item 4).

* a NaN / inf matrix is named before any jitter is tried (inf as the overflow it is), also
  through SGPA at a large input scale;
* the jitter escalation touches only the failing matrices, is counted
  (:func:`gpattn_ppl.linalg.numerics_stats`) and warned about once per place, also for SCGPT with
  duplicated tokens; every factorisation names its module path and matrix;
* divergence stops a run at the first non-finite step naming the epoch, the step and the term;
* an objective term far above the cross-entropy, or a loss out of range, is warned about once per
  run naming the config option that fixes it (the paper's summed CGP bound);
* the run's history and results carry the escalation counts.
"""

from __future__ import annotations

import ast
import copy
import csv
import json
import re
import warnings
from pathlib import Path

import pytest
import torch

import gpattn_ppl
from gpattn_ppl import linalg
from gpattn_ppl.attention import ATTENTION, SGPAttention, build_attention
from gpattn_ppl.distributions import TokenNormal
from gpattn_ppl.errors import DivergenceError, NumericsWarning
from gpattn_ppl.infer import PyroProgram, fit_epoch
from gpattn_ppl.infer.fit import objective_checks
from gpattn_ppl.linalg import CholeskyError, NonFiniteError
from gpattn_ppl.models import build_model
from gpattn_ppl.run.cli import main
from gpattn_ppl.run.experiment import Trainer
from tests.infer.test_fit import _batches, _net
from tests.run.conftest import TINY

from .conftest import cli_error, tried


def _spd_batch(shape=(2, 3), n=5, seed=0, dtype=torch.float64):
    g = torch.Generator().manual_seed(seed)
    X = torch.randn(*shape, n, n, generator=g, dtype=dtype)
    return X @ X.mT + n * torch.eye(n, dtype=dtype)


def _count_factorisations(monkeypatch) -> list:
    calls = []
    real = torch.linalg.cholesky_ex

    def counting(A, *a, **k):
        calls.append(A.shape)
        return real(A, *a, **k)

    monkeypatch.setattr(torch.linalg, "cholesky_ex", counting)
    return calls


# -- non-finite matrices ------------------------------------------------------------------------
def test_nan_matrix_is_named_before_any_jitter(monkeypatch):
    """gpytorch says ``NanError: 1 of 18 elements are NaN``; this said "smallest eigenvalue
    -0.000e+00 after 4 escalations". Now: a named error at the first factorisation."""
    A = _spd_batch((1, 3))
    A[0, 1, 2, 0] = float("nan")
    calls = _count_factorisations(monkeypatch)
    with pytest.raises(NonFiniteError, match=r"blocks\.0\.attn K, head 1 .*1 of 25 entries are NaN"
                       ) as err:
        linalg.cholesky(A, where="blocks.0.attn K", head_axis=1)
    tried("numerics")
    assert isinstance(err.value, CholeskyError)
    assert "eigenvalue" not in str(err.value) and "escalation" not in str(err.value)
    assert len(calls) == 1                                    # no jitter tried
    assert linalg.numerics_stats()["escalations"] == 0


def test_inf_matrix_is_named_as_an_overflow_of_its_dtype():
    A = _spd_batch((2,), dtype=torch.float32)
    A[1, 0, 0] = float("inf")
    with pytest.raises(NonFiniteError, match=r"batch index \(1,\).*inf.*overflow float32.*"
                                             r"gp_dtype\(torch\.float64\)"):
        linalg.cholesky(A, where="blocks.1.attn K_o")
    tried("numerics")


def test_sgpa_at_a_large_input_scale_fails_as_an_overflow():
    """Was: "matrix contains non-finite values" (the equilibration turns the kernel's inf into
    NaN). At scale 3 the unit still works."""
    torch.manual_seed(0)
    unit = SGPAttention(16, 2, variant="standard", max_len=16)
    unit.site_prefix = "blocks.0.attn"
    assert torch.isfinite(unit(3 * torch.randn(2, 10, 16))).all()
    with pytest.raises(NonFiniteError, match=r"blocks\.0\.attn K_kk, head 0 .*inf: the values "
                                             r"overflow float32.*lower the input scale"):
        unit(10 * torch.randn(2, 10, 16))
    tried("numerics")


# -- escalation: only the failing matrices, counted, warned once per place ------------------------
def _one_indefinite(shape=(2, 3), n=5, at=(1, 2), lam=-5e-8):
    """SPD matrices except ``at``, whose smallest eigenvalue is ``lam``: the default float64
    jitter 1e-8 fails there, 1e-7 succeeds."""
    A = _spd_batch(shape, n)
    g = torch.Generator().manual_seed(3)
    Q = torch.linalg.qr(torch.randn(n, n, generator=g, dtype=A.dtype)).Q
    A[at] = Q @ torch.diag(torch.tensor([lam, 1.0, 2.0, 3.0, 4.0], dtype=A.dtype)) @ Q.T
    return linalg.symmetrise(A)


def test_only_the_failing_matrix_is_escalated_counted_and_warned_once_per_place():
    A = _one_indefinite().requires_grad_()
    eye = torch.eye(5, dtype=A.dtype)
    with pytest.warns(NumericsWarning, match=r"blocks\.0\.attn K: Cholesky jitter escalated to "
                                             r"1e-07 for 1 of 6 matrices \(first head 2"):
        L = linalg.cholesky(A, where="blocks.0.attn K", head_axis=1)
    for b in range(2):
        for h in range(3):
            if (b, h) == (1, 2):
                torch.testing.assert_close(L[b, h] @ L[b, h].T, A[b, h] + 1e-7 * eye)
            else:  # untouched by the escalation: the plain factor, bit for bit
                assert torch.equal(L[b, h], torch.linalg.cholesky(A[b, h])), (b, h)
    assert linalg.numerics_stats() == {"escalations": 1, "max_jitter": 1e-7,
                                       "by_where": {"blocks.0.attn K": 1}}
    L.sum().backward()                        # the failed first factor is not in the graph
    assert torch.isfinite(A.grad).all()
    with warnings.catch_warnings():
        warnings.simplefilter("error")        # the same place again: counted, not warned
        linalg.cholesky(A.detach(), where="blocks.0.attn K", head_axis=1)
    with pytest.warns(NumericsWarning, match=r"blocks\.1\.attn K"):
        linalg.cholesky(A.detach(), where="blocks.1.attn K", head_axis=1)
    stats = linalg.numerics_stats()
    assert stats["escalations"] == 3 and stats["by_where"] == {"blocks.0.attn K": 2,
                                                               "blocks.1.attn K": 1}
    linalg.reset_numerics_stats()
    assert linalg.numerics_stats() == {"escalations": 0, "max_jitter": 0.0, "by_where": {}}


def test_escalation_that_fails_names_the_matrix_and_its_eigenvalue():
    A = _one_indefinite(lam=-1.0)
    with pytest.raises(CholeskyError, match=r"blocks\.0\.attn K, head 2 \(batch index \(1, 2\)\)"
                                            r"; smallest eigenvalue -1.*after 4 escalations"):
        linalg.cholesky(A, where="blocks.0.attn K", head_axis=1)
    assert linalg.numerics_stats()["escalations"] == 0
    tried("numerics")


def test_scgpt_with_duplicated_tokens_escalations_are_counted_and_warned():
    """Was: 4 escalations of the whole batch without a word."""
    torch.manual_seed(0)
    net = build_model({"dim": 16, "heads": 2, "depth": 1, "mlp_dim": 16, "dropout": 0.0,
                       "attention": {"kind": "scgpt"}}, num_classes=2, vocab_size=20)
    net.train()
    x = torch.full((3, 10), 7)                # one token, repeated: coinciding inducing inputs
    with pytest.warns(NumericsWarning, match=r"blocks\.0\.attn (B_m \(0\) / B_l \(1\)|B_m|B_l|B'_l|Q): Cholesky jitter"):
        out = net(x, torch.ones(3, 10, dtype=torch.bool))
    assert torch.isfinite(out).all()
    stats = linalg.numerics_stats()
    assert stats["escalations"] > 0 and 1e-6 < stats["max_jitter"] <= 1e-2
    assert all(w.startswith("blocks.0.attn ") for w in stats["by_where"])
    tried("numerics")


# -- a where on every factorisation -------------------------------------------------------------
def test_every_factorisation_in_the_source_passes_a_where():
    """Every call of ``cholesky`` / ``scaled_cholesky`` in the package names its place."""
    calls = 0
    for path in Path(gpattn_ppl.__file__).parent.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if not isinstance(node, ast.Call):
                continue
            f = node.func
            name = f.attr if isinstance(f, ast.Attribute) else getattr(f, "id", None)
            if name not in ("cholesky", "scaled_cholesky", "cholesky_factors"):
                continue
            calls += 1
            where = [k.value for k in node.keywords if k.arg == "where"]
            assert where, f"{path.name}:{node.lineno} factorises without a where"
            assert not (isinstance(where[0], ast.Constant) and not where[0].value), (
                f"{path.name}:{node.lineno} passes an empty where")
    assert calls >= 10


@pytest.mark.filterwarnings("ignore:KEP-SVGP attention rank 5 is more than:UserWarning")  # D = 4
def test_every_registered_unit_names_its_module_path_and_matrix(monkeypatch):
    """A forward (training mode: the regularisers too) of every registered unit, and the
    SCGPT predictive's log-density: every factorisation names ``blocks.0.attn <matrix>``."""
    seen: list[str] = []
    real = linalg.cholesky

    def recording(A, **kw):
        seen.append(kw.get("where", ""))
        return real(A, **kw)

    monkeypatch.setattr(linalg, "cholesky", recording)
    x = torch.randn(2, 5, 8, dtype=torch.float64)
    mask = torch.ones(2, 5, dtype=torch.bool)
    mask[0, 3:] = False
    factorising = set()
    for kind in ATTENTION:
        torch.manual_seed(0)
        unit = build_attention(kind, 8, 2).double().train()
        unit.site_prefix = "blocks.0.attn"
        seen.clear()
        unit(x, mask)
        if kind == "scgpt":
            q, k, v, x_o = unit.project(x)
            pred = unit.gp.posterior(unit.gp.prepare(q, k, v, x_o, mask=mask, where=unit._where()), v)
            pred.log_prob(pred.mean)
            assert seen[-1] == "blocks.0.attn capacitance"
        if seen:
            factorising.add(kind)
        for where in seen:
            assert where.startswith("blocks.0.attn ") and len(where) > len("blocks.0.attn "), (
                kind, where)
    assert {"sgpa", "cgpt", "scgpt"} <= factorising
    seen.clear()
    R = torch.randn(2, 5, 2, dtype=torch.float64)
    TokenNormal(torch.zeros(2, 5, 3, dtype=torch.float64), cov_root=R, noise_var=1.0
                ).log_prob(torch.zeros(2, 5, 3, dtype=torch.float64))
    assert seen == ["TokenNormal capacitance"]    # never "<unnamed module>"


# -- divergence -----------------------------------------------------------------------------------
class _NaNAtStep(PyroProgram):
    """The objective term ``blocks.0.attn.kl`` becomes NaN at step ``k`` (1-based) and stays
    NaN (so the fit loop's checked re-run of that step sees it too)."""

    def __init__(self, *args, k: int, **kw):
        super().__init__(*args, **kw)
        self.k, self.steps = k, 0

    def loss(self, *args):
        out = super().loss(*args)
        self.steps += 1
        self.last_terms = {"blocks.0.attn.kl": torch.tensor(0.5)}
        if self.steps >= self.k:
            self.last_terms["blocks.0.attn.kl"] = torch.tensor(float("nan"))
            out = out + self.last_terms["blocks.0.attn.kl"]
        return out


def test_divergence_stops_at_the_first_non_finite_step_naming_epoch_step_and_term():
    net = _net()
    program = _NaNAtStep(net, num_data=12, k=3)
    opt = torch.optim.Adam(net.parameters(), lr=1e-3)
    snapshot = {}

    def keep(*_):
        snapshot.update({n: p.detach().clone() for n, p in net.named_parameters()})

    opt.register_step_post_hook(keep)
    losses = []
    with pytest.raises(DivergenceError, match=r"epoch 7, step 3: the loss is non-finite \(nan\)"
                                              r"; non-finite term\(s\): blocks\.0\.attn\.kl"):
        fit_epoch(program, opt, _batches(n=4), epoch=7, step_losses=losses)
    tried("numerics")
    assert len(losses) == 2                               # steps 1 and 2 ran
    for n, p in net.named_parameters():                   # the NaN step never reached them
        assert torch.equal(p, snapshot[n]), n


def test_divergence_through_the_parameters_is_named_at_the_next_step():
    """A gradient step that makes the parameters non-finite: the next forward's NaN logits are
    named as the parameters' divergence (not Pyro's tensor dump)."""
    net = _net()
    program = PyroProgram(net, num_data=12)
    opt = torch.optim.Adam(net.parameters(), lr=1e-3)
    opt.register_step_post_hook(lambda *_: net.head.bias.data.fill_(float("inf")))
    with pytest.raises(DivergenceError, match=r"epoch 2, step 2: parameters became non-finite "
                                              r"in the previous step \(head\.bias"):
        fit_epoch(program, opt, _batches(n=3), epoch=2)
    tried("numerics")


@pytest.mark.parametrize(("kind", "term"), [
    ("kernel", "the logits of the likelihood term 'y'"),
    ("sgpa", r"objective term\(s\) blocks\.0\.attn\.kl_global"),
])
def test_cli_divergence_at_a_huge_lr_is_one_line_with_epoch_step_and_term(
        kind, term, tiny_yaml, tmp_path, capsys):
    """Was: Pyro's NaN tensor dump, no epoch or step."""
    code = main(["train", str(tiny_yaml), "--out", str(tmp_path / "run"), "--set",
                 f"model.attention.kind={kind}", "train.lr=100",
                 "train.objective={kl_weight: 1.0}"])   # the papers' weight from step 1
    line = cli_error(capsys, code)
    tried("numerics")
    assert "training diverged in epoch 1, step 2" in line
    assert re.search(term, line), line
    assert "lower train.lr" in line


# -- objective terms out of range ----------------------------------------------------------------
def test_objective_checks_name_the_term_and_the_option_that_fixes_it():
    """Synthetic epoch means (per datum): the summed CGP bound's collapse (loss -99), a KL
    drowning the labels, a custom term, and a healthy epoch."""
    out = objective_checks(-99.0, 0.65, {"blocks.0.attn.cgp_loss": -99.6,
                                         "blocks.1.attn.cgp_loss": -0.1})
    assert set(out) == {"cgp_loss:ratio", "loss:range"}
    assert "blocks.0.attn.cgp_loss" in out["cgp_loss:ratio"]
    for message in out.values():
        assert "model.attention.cgp_reduction: mean" in message
        assert "train.objective.cgp_alpha" in message
    assert "outside [-10, 10000]" in out["loss:range"]
    kl = objective_checks(80.7, 0.7, {"blocks.1.attn.kl_global": 80.0})
    assert list(kl) == ["kl:ratio"] and "train.objective.kl_weight" in kl["kl:ratio"]
    assert "114x the cross-entropy" in kl["kl:ratio"]
    ksvd = objective_checks(5e4, 0.7, {"blocks.1.attn.ksvd_loss": 5e4})
    assert "train.objective.ksvd_weight" in ksvd["ksvd_loss:ratio"]
    assert objective_checks(0.9, 0.7, {"blocks.0.attn.kl": 0.2}) == {}


def test_cgpt_summed_bound_warns_once_per_run_naming_cgp_reduction(tmp_path):
    """The paper's summed CGP bound on tiny CoLA: ~3500x the cross-entropy from epoch 1 (the
    collapse to a loss of -99 comes later; :func:`objective_checks` covers that floor)."""
    cfg = copy.deepcopy(TINY)
    cfg["model"]["attention"] = {"kind": "cgpt", "cgp_reduction": "sum",
                                 "cgp_observation_noise": False}
    cfg["train"]["epochs"] = 3
    cfg["train"]["objective"] = {"cgp_alpha": 1.0}     # the reference's CoLA weight
    with pytest.warns(NumericsWarning) as caught:
        res = Trainer(cfg, tmp_path / "run").fit()
    about = [str(w.message) for w in caught if "cgp_reduction" in str(w.message)]
    assert len(about) == 1 and about[0].startswith("epoch 1: objective term blocks.0.attn.cgp_loss")
    hist = json.loads((tmp_path / "run" / "history.json").read_text())
    assert hist[0]["warnings"] == about and all("warnings" not in r for r in hist[1:])
    assert about[0] in res["warnings"]
    with open(tmp_path / "run" / "log.csv") as fh:        # scalars only in the CSV
        assert "warnings" not in next(csv.reader(fh))


def test_run_logs_and_summarises_the_escalations(tmp_path):
    """SCGPT (σ = 0.1, 16 inducing inputs for sentences of ~10 tokens) escalates its jitter: the
    history counts them per epoch, results.json sums them (with the evaluation's) and warns."""
    cfg = copy.deepcopy(TINY)
    cfg["model"]["attention"] = {"kind": "scgpt", "noise": 0.1}
    with pytest.warns(NumericsWarning) as caught:
        res = Trainer(cfg, tmp_path / "run").fit()
    assert any("Cholesky jitter escalated" in str(w.message) for w in caught)
    run = tmp_path / "run"
    hist = json.loads((run / "history.json").read_text())
    assert all(r["numerics/escalations"] > 0 and r["numerics/max_jitter"] > 0 for r in hist)
    assert all(sum(r["numerics/by_where"].values()) == r["numerics/escalations"] for r in hist)
    num = res["cost"]["numerics"]
    assert num["training_escalations"] == sum(r["numerics/escalations"] for r in hist)
    assert num["escalations"] >= num["training_escalations"]
    assert num["max_jitter"] >= max(r["numerics/max_jitter"] for r in hist)
    assert any(w.startswith(f"numerics: {num['escalations']} Cholesky jitter escalation")
               for w in res["warnings"])
    assert json.loads((run / "results.json").read_text())["cost"]["numerics"] == num
    with open(run / "log.csv") as fh:
        header = next(csv.reader(fh))
    assert {"numerics/escalations", "numerics/max_jitter"} <= set(header)
    assert "numerics/by_where" not in header


def test_a_run_without_escalations_logs_zero(tmp_path):
    cfg = copy.deepcopy(TINY)
    cfg["train"]["epochs"] = 1
    res = Trainer(cfg, tmp_path / "run").fit()
    hist = json.loads((tmp_path / "run" / "history.json").read_text())
    assert hist[0]["numerics/escalations"] == 0 and hist[0]["numerics/max_jitter"] == 0.0
    assert res["cost"]["numerics"]["escalations"] == 0
    assert not any(w.startswith("numerics:") for w in res["warnings"])


def test_a_step_whose_factorisation_failed_on_the_fast_path_is_rerun_checked(monkeypatch):
    """The fit loop reads "did a factorisation fail" with the loss; a step where one did is
    computed again with every check on (so it would get its jitter or a named error) before
    anything reaches the parameters: one checked re-run per such step, counted in the output,
    and the pass trains on with the checked step's loss."""
    torch.manual_seed(0)
    net = build_model({"dim": 8, "heads": 2, "depth": 1, "mlp_dim": 8, "dropout": 0.0,
                       "attention": {"kind": "cgpt"}}, num_classes=3, vocab_size=20)
    program = PyroProgram(net, num_data=12)
    opt = torch.optim.Adam(net.parameters(), lr=1e-3)
    real_failed, calls = linalg.deferred_checks.failed, []
    checked = []
    real_cholesky = linalg.cholesky

    def failed(self):  # the fast path of step 2 reports a failed factorisation
        calls.append(self.calls)
        return torch.tensor(True) if len(calls) == 2 else real_failed(self)

    def cholesky(A, **kw):  # which factorisations ran checked (outside deferred_checks)
        checked.append(linalg._deferred() is None)
        return real_cholesky(A, **kw)

    monkeypatch.setattr(linalg.deferred_checks, "failed", failed)
    monkeypatch.setattr(linalg, "cholesky", cholesky)
    losses = []
    out = fit_epoch(program, opt, _batches(n=3), step_losses=losses)
    tried("numerics")
    assert out["checked_reruns"] == 1 and len(losses) == 3
    assert all(c > 0 for c in calls)          # every fast path deferred its factorisations
    assert any(checked) and not all(checked)  # and only the re-run checked them


def _dominated():
    """A network whose SGPA KL, at weight 1e3, outweighs the cross-entropy ~100 times (the
    loss itself stays in range)."""
    torch.manual_seed(0)
    net = build_model({"dim": 8, "heads": 2, "depth": 1, "mlp_dim": 8,
                       "attention": {"kind": "sgpa", "num_inducing": 3}},
                      num_classes=3, vocab_size=20)
    program = PyroProgram(net, num_data=12, objective={"kl_weight": 1e3})
    return program, torch.optim.Adam(net.parameters(), lr=1e-4)


def test_fit_epoch_warns_by_default_when_a_term_dominates_naming_the_option():
    program, opt = _dominated()
    with pytest.warns(NumericsWarning, match=r"fit_epoch \(epoch 0\.0\): objective term "
                                             r"blocks\.0\.attn\.kl.*kl_weight"):
        fit_epoch(program, opt, _batches())


def test_fit_epoch_checks_into_a_dict_or_off_do_not_warn():
    program, opt = _dominated()
    found = {}
    with warnings.catch_warnings():
        warnings.simplefilter("error", NumericsWarning)
        fit_epoch(program, opt, _batches(), checks=found)
        assert "kl:ratio" in found and "kl_weight" in found["kl:ratio"]
        fit_epoch(program, opt, _batches(), checks=False)
