"""KEPSVGPAttention: the inherited contract checks plus brute-force and Monte-Carlo checks."""

import pyro
import pyro.poutine as poutine
import pytest
import torch

from gpattn_ppl import settings
from gpattn_ppl.attention import ATTENTION, KEPSVGPAttention, attention_options, build_attention
from gpattn_ppl.distributions import SharedScaleMVN
from gpattn_ppl.ppl import SiteContext, site_context
from gpattn_ppl.settings import posterior_mean
from gpattn_ppl.testing import AttentionUnitTestCase
from tests.reference.kep_svgp import branch_posterior, exact_ksvd, kep_add_forward_reference


class TestKEPSVGPAttention(AttentionUnitTestCase):
    def make_unit(self, dim, heads):
        return KEPSVGPAttention(dim, heads, rank=3)


class TestKEPSVGPBatchDraws(AttentionUnitTestCase):
    def make_unit(self, dim, heads):
        return KEPSVGPAttention(dim, heads, rank=3, u_draws="batch")


class TestKEPSVGPConcatFeaturesLinear(AttentionUnitTestCase):
    def make_unit(self, dim, heads):
        return KEPSVGPAttention(dim, heads, rank=4, merge="concat_features", feature_map="linear")


class TestKEPSVGPConcatLowRank(AttentionUnitTestCase):
    token_permutation_equivariant = False
    fixed_length = True  # merge='concat' fixes N: a shorter unpadded sequence must raise

    def make_unit(self, dim, heads):
        return KEPSVGPAttention(dim, heads, rank=3, merge="concat", seq_len=self.seq_len,
                                token_mixing="low_rank")


class TestKEPSVGPConcatDense(TestKEPSVGPConcatLowRank):
    def make_unit(self, dim, heads):
        return KEPSVGPAttention(dim, heads, rank=3, merge="concat", seq_len=self.seq_len)


# -- helpers ---------------------------------------------------------------------------------------
def _unit(**kw):
    torch.manual_seed(0)
    kw.setdefault("rank", 3)
    unit = KEPSVGPAttention(8, 2, **kw).double().eval()
    g = torch.Generator().manual_seed(9)
    q = unit.strategy.q_u
    with torch.no_grad():                      # a full (non-diagonal) S_d and a non-zero mean
        q.chol_variational_covar.add_(0.3 * torch.randn(q.chol_variational_covar.shape,
                                                        generator=g, dtype=torch.float64).tril())
    return unit


def _inputs(B=3, N=6, seed=1):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(B, N, 8, generator=g, dtype=torch.float64)
    mask = torch.ones(B, N, dtype=torch.bool)
    mask[0, 4:] = False
    return x, mask


def _reference(unit, x, mask, u):
    f = unit.features
    return kep_add_forward_reference(x, mask, f.qk.weight, f.W_e, f.W_r, f.lambda_, u,
                                     unit.W_add, unit.out.weight, unit.out.bias,
                                     cosine=f.feature_map == "cosine")


# -- brute force --------------------------------------------------------------------------------------
@pytest.mark.parametrize("u_draws", ["sequence", "batch"])
def test_sample_matches_naive_reference_with_the_drawn_u(u_draws):
    unit = _unit(u_draws=u_draws)
    x, mask = _inputs()
    torch.manual_seed(3)
    out = unit(x, mask)
    torch.manual_seed(3)
    drawn = []
    real_sample = unit.sample
    unit.sample = lambda *a, **k: drawn.append(real_sample(*a, **k)) or drawn[-1]
    unit(x, mask)                                             # the same draw (same RNG stream)
    u = drawn[0]
    assert u.shape == ((3, 2, 3, 3) if u_draws == "sequence" else (2, 3, 3))
    torch.testing.assert_close(out[mask], _reference(unit, x, mask, u)[mask])


def test_posterior_mean_matches_reference_with_u_equal_m():
    unit = _unit(feature_map="linear")
    x, mask = _inputs()
    with posterior_mean():
        out = unit(x, mask)
    m = unit.strategy.variational_distribution.mean
    torch.testing.assert_close(out[mask], _reference(unit, x, mask, m)[mask])


def test_output_mean_and_covariance_of_20000_draws():
    """Per-sequence draws: over 20,000 copies of one sequence, the output's empirical mean and
    covariance match the analytic ones (posterior mean mode; the posterior of F pushed through
    W_add and W_O) within 5 sigma."""
    unit = _unit()
    x, _ = _inputs(B=1, N=4)
    T = 20_000
    with posterior_mean():
        mean_out = unit(x)[0].detach()
    torch.manual_seed(5)
    with torch.no_grad():
        out = unit(x.expand(T, -1, -1)).reshape(T, -1)                     # [T, N*C]
    with torch.no_grad():
        E, R = unit.features(x)
        dist = branch_posterior(unit.strategy, E + R)                     # batch [1, H, s], event N
    Sigma_F = dist[0].lazy_covariance_matrix.to_dense()                     # [H, s, N, N]
    H, D, C = 2, 4, 8
    W_O = unit.out.weight.detach().view(C, H, D)                            # [C, H, D]
    G = torch.einsum("hdk,chk->hdc", unit.W_add.detach(), W_O)              # [H, s, C]
    cov = torch.einsum("hdnm,hdc,hde->ncme", Sigma_F, G, G).reshape(4 * C, 4 * C)
    emp_mean = out.mean(0)
    assert ((emp_mean - mean_out.reshape(-1)).abs() <= 5 * out.std(0) / T ** 0.5 + 1e-12).all()
    oc = out - emp_mean
    prods = oc.unsqueeze(-1) * oc.unsqueeze(-2)
    emp = prods.sum(0) / (T - 1)
    se = prods.std(0) / T ** 0.5
    assert ((emp - cov).abs() <= 5 * se + 1e-12).all()
    assert cov.abs().max() > 1e-2


@pytest.mark.parametrize("feature_map", ["cosine", "linear"])
def test_attention_matrix_is_the_eigen_pair_kernel_and_the_dual_form_of_the_mean(feature_map):
    """The matrix ``explain`` draws for KEP-SVGP, brute force: entry by entry
    A_ij = sum_k e_k(x_i) r_k(x_j) / lambda_k of the unit's own projections; at an exact KSVD of
    the sequence with s = D (the rank-s truncation is then all of K_att) it is
    <phi_q(x_i), phi_k(x_j)>, and the unit's posterior-mean forward is
    W_O concat_h(A V_r + A^T V_e) with V_r = R Lambda^-2 M^T W_add, V_e = E Lambda^-2 M^T W_add
    (its dual, attention form)."""
    torch.manual_seed(0)
    unit = KEPSVGPAttention(8, 2, rank=4, feature_map=feature_map).double().eval()  # s = D = 4
    g = torch.Generator().manual_seed(3)
    x = torch.randn(1, 6, 8, generator=g, dtype=torch.float64)
    feats = unit.features
    with torch.no_grad():
        phi_q, phi_k = feats.feature_maps(x)                                  # [1, H, N, D]
        ksvd = exact_ksvd(phi_q[0], phi_k[0], 4)
        feats.W_e.copy_(ksvd["W_e"])
        feats.W_r.copy_(ksvd["W_r"])
        feats.lambda_ = ksvd["lam"]
        A = unit.attention_matrix(x)[0]                                       # [H, N, N]
        E, R = (P[0] for P in feats(x))                                       # [H, N, s]
        lam = feats.lambda_
        H, N, s, D = 2, 6, 4, 4
        assert A.shape == (H, N, N)
        for h in range(H):
            for i in range(N):
                for j in range(N):
                    pair = sum(E[h, i, k] * R[h, j, k] / lam[h, k] for k in range(s))
                    kernel = sum(phi_q[0, h, i, d] * phi_k[0, h, j, d] for d in range(D))
                    assert float(A[h, i, j]) == pytest.approx(float(pair), abs=1e-12)
                    assert float(A[h, i, j]) == pytest.approx(float(kernel), abs=1e-9)
        m = unit.strategy.variational_mean                                    # [H, d, i]
        V_r = (R / lam[:, None, :] ** 2) @ m.mT @ unit.W_add                  # [H, N, D]
        V_e = (E / lam[:, None, :] ** 2) @ m.mT @ unit.W_add
        heads = A @ V_r + A.mT @ V_e
        with posterior_mean(True):
            out = unit(x)
        torch.testing.assert_close(out, unit.out(unit.merge_heads(heads[None])),
                                   rtol=1e-8, atol=1e-9)
        # padding: the rows and columns of pad tokens are exactly 0, the real block unchanged
        xp = torch.cat([x, torch.randn(1, 2, 8, generator=g, dtype=torch.float64)], 1)
        mask = torch.ones(1, 8, dtype=torch.bool)
        mask[0, 6:] = False
        Ap = unit.attention_matrix(xp, mask)[0]
        assert Ap[:, 6:].abs().max() == 0 and Ap[:, :, 6:].abs().max() == 0
        torch.testing.assert_close(Ap[:, :6, :6], A, rtol=0, atol=1e-12)


def test_rank_above_the_head_dimension_is_capped_with_a_warning():
    """A head's kernel Phi_q Phi_k^T has rank at most D: rank 5 (the default) at D = 4 is 4."""
    with pytest.warns(UserWarning, match=r"rank 5 is more than the head dimension D = 4 "
                                         r"\(dim 8 / heads 2\).*using rank 4"):
        unit = KEPSVGPAttention(8, 2)
    assert unit.rank == unit.features.rank == 4 and unit.W_add.shape == (2, 4, 4)
    assert unit(torch.randn(2, 5, 8)).shape == (2, 5, 8)


def test_posterior_of_F_is_symmetric_rank_s_and_shaped():
    """The posterior of the GP outputs F (add merge: of E + R), batch [B, H, s], event N."""
    unit = _unit()
    x, mask = _inputs()
    E, R = unit.features(x, mask)
    d = branch_posterior(unit.strategy, E + R)
    assert d.batch_shape == (3, 2, 3) and d.event_shape == (6,)
    assert d.lazy_covariance_matrix.root.shape[-1] == 3
    cov = d.lazy_covariance_matrix.to_dense()
    torch.testing.assert_close(cov, cov.mT, rtol=0, atol=1e-12)
    var = d.lazy_covariance_matrix.diagonal(dim1=-2, dim2=-1)               # (.variance clamps)
    assert (var[0, :, :, 4:] == 0).all() and (var[0, :, :, :4] > 0).all()   # pads: none


@pytest.mark.parametrize("merge", ["add", "concat_features", "concat"])
def test_predictive_is_the_exact_push_forward_of_q_u(merge, monkeypatch):
    """The head outputs are linear in U: their mean is the output at U = M (the posterior-mean
    forward with W_O = I) and, per head and channel, their covariance over tokens is
    J S J^T with J the Jacobian of the head outputs w.r.t. U and S = blockdiag(S_d) (autograd,
    not the unit's algebra). Pads have zero variance; the covariance stays lazy."""
    from linear_operator.operators import DenseLinearOperator, LinearOperator

    kw = {"seq_len": 6} if merge == "concat" else {}
    unit = _unit(merge=merge, u_draws="batch", **kw)
    with torch.no_grad():
        unit.out.weight.copy_(torch.eye(8, dtype=torch.float64))
        unit.out.bias.zero_()
    x, mask = _inputs()
    B, N, H, D = 3, 6, 2, 4
    pred = unit.predictive(x, mask)
    assert pred.mean.shape == pred.variance.shape == (B, H, N, D)
    cov_op = pred.mvn.lazy_covariance_matrix
    assert isinstance(cov_op, LinearOperator) and not isinstance(cov_op, DenseLinearOperator)
    assert pred.mvn.batch_shape == (B, H, D) and pred.mvn.event_shape == (N,)
    real = mask[:, None, :, None].double()                                 # pads: exactly 0
    with posterior_mean():
        mean_out = unit(x, mask).view(B, N, H, D).transpose(1, 2)
    torch.testing.assert_close(pred.mean, mean_out * real, rtol=1e-10, atol=1e-12)

    def heads(u):
        monkeypatch.setattr(unit, "sample", lambda *a, **k: u)
        return unit(x, mask).view(B, N, H, D).transpose(1, 2)              # [B, H, N, D]

    m = unit.strategy.variational_mean.detach()
    L = unit.strategy.q_u.chol_variational_covar.detach().tril()
    torch.testing.assert_close(pred.mean, heads(m) * real, rtol=1e-10, atol=1e-12)
    J = torch.autograd.functional.jacobian(heads, m)                        # [B, H, N, D, H, s, s]
    J = J * real[..., None, None, None]                                     # pad rows: 0
    S = L @ L.mT                                                            # [H, s(d), s, s]
    cov = torch.einsum("bhnjgdi,gdik,bhmjgdk->bhjnm", J, S, J)
    torch.testing.assert_close(pred.mvn.covariance_matrix, cov, rtol=1e-9, atol=1e-12)
    torch.testing.assert_close(pred.variance, cov.diagonal(dim1=-2, dim2=-1).mT,
                               rtol=1e-9, atol=1e-12)
    assert (pred.variance[0, :, 4:] == 0).all() and (pred.variance[0, :, :4] > 0).all()
    assert cov.abs().max() > 1e-2


# -- draws, sites and terms -------------------------------------------------------------------------------
def test_per_sequence_draws_are_independent_batch_draws_shared():
    x, _ = _inputs(B=1)
    x = x.expand(2, -1, -1)
    seq, bat = _unit(u_draws="sequence"), _unit(u_draws="batch")
    torch.manual_seed(1)
    a = seq(x)
    assert not torch.allclose(a[0], a[1])
    torch.manual_seed(1)
    b = bat(x)
    torch.testing.assert_close(b[0], b[1])


@pytest.mark.parametrize("u_draws", ["sequence", "batch"])
@pytest.mark.parametrize("B", [1, 4])
def test_thin_kl_term_is_the_global_kl_counted_once(u_draws, B):
    unit = _unit(u_draws=u_draws)
    x, _ = _inputs(B=B)
    unit(x)
    kl = unit.objective_terms()["kl"]
    assert kl.dim() == 0
    torch.testing.assert_close(kl, unit.strategy.kl_divergence().sum())
    with posterior_mean():
        unit(x)
    torch.testing.assert_close(unit.objective_terms()["kl"], unit.strategy.kl_divergence().sum())


@pytest.mark.parametrize("u_draws", ["sequence", "batch"])
def test_sites_mode_declares_global_u_and_the_elbo_counts_its_kl_once(u_draws):
    unit = _unit(u_draws=u_draws)
    unit.site_prefix = "blocks.1.attn"
    x, mask = _inputs(B=4)
    plate = pyro.plate("data", 100, subsample=torch.arange(4))
    with site_context(SiteContext("sites", "guide", plate)):
        guide = poutine.trace(lambda: unit(x, mask)).get_trace()
    assert "kl" not in unit.objective_terms()                               # the ELBO owns it
    with site_context(SiteContext("sites", "model", plate)):
        model = poutine.trace(poutine.replay(lambda: unit(x, mask), trace=guide)).get_trace()
    g, m = guide.nodes["blocks.1.attn.u"], model.nodes["blocks.1.attn.u"]
    assert [n for n, s in guide.nodes.items() if s["type"] == "sample"] == ["blocks.1.attn.u"]
    assert g["fn"].batch_shape == () and m["fn"].batch_shape == ()          # global: all in event
    # the site is q(u) / p(u) itself, a SharedScaleMVN (expanded per sequence, scale 1/B)
    base_g, base_m = g["fn"].base_dist, m["fn"].base_dist
    assert isinstance(base_g, SharedScaleMVN) and isinstance(base_m, SharedScaleMVN)
    assert base_g.batch_shape == base_m.batch_shape == ((4, 2, 3) if u_draws == "sequence"
                                                        else (2, 3))
    assert g["scale"] == pytest.approx(0.25 if u_draws == "sequence" else 1.0)
    assert torch.equal(g["value"], m["value"])
    kl = torch.distributions.kl_divergence(g["fn"], m["fn"]) * g["scale"]  # as TraceMeanField_ELBO
    torch.testing.assert_close(kl, unit.strategy.kl_divergence().sum())
    assert g["value"].shape == ((4, 2, 3, 3) if u_draws == "sequence" else (2, 3, 3))


def test_ksvd_term_is_per_sequence_and_pad_invariant():
    unit = _unit()
    x, mask = _inputs()
    unit(x, mask)
    k = unit.objective_terms()["ksvd_loss"]
    assert k.shape == (3,) and (k > 0).all()
    x2 = x.clone()
    x2[~mask] = 100.0
    unit(x2, mask)
    torch.testing.assert_close(unit.objective_terms()["ksvd_loss"], k)
    unit(x[:1, :4])
    torch.testing.assert_close(unit.objective_terms()["ksvd_loss"][0], k[0])


def test_gradients_reach_W_e_W_r_lambda_m_S_and_output_weights():
    unit = _unit()
    unit.train()
    x, mask = _inputs()
    torch.manual_seed(0)
    out = unit(x, mask)
    loss = out[mask].square().sum() + sum(v.sum() for v in unit.objective_terms().values())
    loss.backward()
    named = dict(unit.named_parameters())
    for name in ("strategy.features.W_e", "strategy.features.W_r", "strategy.features.raw_lambda",
                 "strategy.q_u.variational_mean", "strategy.q_u.chol_variational_covar",
                 "W_add"):
        g = named[name].grad
        assert g is not None and torch.isfinite(g).all() and g.abs().sum() > 0, name


def test_sample_gradient_reaches_S_without_the_kl():
    """S enters the output itself (reparameterisation through u), not only through the KL."""
    unit = _unit()
    x, mask = _inputs()
    torch.manual_seed(0)
    unit(x, mask)[mask].square().sum().backward()
    g = unit.strategy.q_u.chol_variational_covar.grad
    assert g is not None and g.abs().sum() > 0


# -- options, config, numerics ----------------------------------------------------------------------------
def test_registered_with_keyword_options():
    assert ATTENTION["kep_svgp"] is KEPSVGPAttention
    opts = attention_options("kep_svgp")
    assert {"rank", "merge", "feature_map", "u_draws", "seq_len", "token_mixing"} <= set(opts)
    assert opts["rank"] == 5 and opts["merge"] == "add" and opts["feature_map"] == "cosine"
    assert "attn_dropout" not in opts                          # no attention weights to drop
    with pytest.raises(ValueError, match="attn_dropout"):
        build_attention("kep_svgp", 8, 2, attn_dropout=0.1)


@pytest.mark.parametrize("kw, match", [
    (dict(merge="sum"), "merge"), (dict(feature_map="rbf"), "feature_map"),
    (dict(u_draws="token"), "u_draws"), (dict(merge="concat"), "seq_len"),
    (dict(token_mixing="full"), "token_mixing"), (dict(rank=0), "rank"),
])
def test_bad_options_raise(kw, match):
    with pytest.raises(ValueError, match=match):
        KEPSVGPAttention(8, 2, **kw)


def test_concat_rejects_other_lengths():
    unit = KEPSVGPAttention(8, 2, rank=3, merge="concat", seq_len=6)
    with pytest.raises(ValueError, match="seq_len"):
        unit(torch.randn(2, 5, 8))


def test_declarative_spec_replaces_only_the_last_block_and_trains_in_both_modes():
    from gpattn_ppl.infer.program import PyroProgram
    from gpattn_ppl.models import build_model

    spec = {"arch": "text", "dim": 16, "heads": 2, "depth": 2, "mlp_dim": 16, "dropout": 0.0,
            "attention": {"kind": "softmax"},
            "overrides": [{"blocks": [-1], "attention": {"kind": "kep_svgp", "rank": 3,
                                                         "merge": "add", "feature_map": "cosine"}}]}
    torch.manual_seed(0)
    net = build_model(spec, num_classes=2, vocab_size=30)
    units = net.attention_units()
    assert type(units["blocks.0.attn"]).__name__ == "SoftmaxAttention"
    assert isinstance(units["blocks.1.attn"], KEPSVGPAttention)
    tok = torch.randint(1, 30, (4, 7))
    mask = torch.ones(4, 7, dtype=torch.bool)
    mask[0, 5:] = False
    y = torch.tensor([0, 1, 1, 0])
    for mode in ("thin", "sites"):
        prog = PyroProgram(net, num_data=100, objective={"ksvd_weight": 1.0}, mode=mode)
        net.zero_grad()
        loss = prog.loss(tok, mask, y, torch.arange(4))
        loss.backward()
        assert torch.isfinite(loss)
        q = units["blocks.1.attn"].strategy.q_u
        assert q.variational_mean.grad.abs().sum() > 0, mode
    assert set(net.objective_terms()) >= {"blocks.1.attn.ksvd_loss"}


def test_float32_input_with_float64_gp_algebra():
    torch.manual_seed(0)
    unit = KEPSVGPAttention(8, 2, rank=3)
    x = torch.randn(2, 5, 8)
    with settings.gp_dtype(torch.float64):
        out = unit(x)
    assert out.dtype == torch.float32 and torch.isfinite(out).all()
    assert unit.objective_terms()["ksvd_loss"].dtype == torch.float64


@pytest.mark.parametrize("merge", ["add", "concat_features"])
def test_unit_is_vectorised_over_batch_heads_and_dims(merge):
    """The number of torch calls of a forward + backward does not depend on B, H or s."""
    def count(B, heads, s):
        torch.manual_seed(0)
        unit = KEPSVGPAttention(8 * heads, heads, rank=s, merge=merge).double().train()
        x = torch.randn(B, 5, 8 * heads, dtype=torch.float64)
        calls = []

        class Count(torch.overrides.TorchFunctionMode):
            def __torch_function__(self, func, types, args=(), kwargs=None):
                calls.append(func)
                return func(*args, **(kwargs or {}))

        with Count():
            out = unit(x)
            (out.sum() + sum(v.sum() for v in unit.objective_terms().values())).backward()
        return len(calls)

    assert count(1, 1, 2) == count(6, 4, 7)
