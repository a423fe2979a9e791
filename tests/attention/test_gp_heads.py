"""The public GP-head mixin over every GP head: the four units' heads in their variants, and every
registered GP unit with its defaults (a GP unit cannot be registered without these checks)."""


from gpattn_ppl.attention import (
    ATTENTION,
    CGPTAttention,
    KEPSVGPAttention,
    SCGPTAttention,
    SGPAttention,
    build_attention,
)
from gpattn_ppl.attention.gp_unit import GPAttentionUnit
from gpattn_ppl.infer import set_q_to_prior
from gpattn_ppl.testing import GPHeadTestCase


class TestSGPAStandardHead(GPHeadTestCase):
    factorisations = {"sample": 1, "mean": 1, "predictive": 1}

    def make_unit(self, dim, heads):
        return SGPAttention(dim, heads, variant="standard", max_len=8)

    def set_q_to_prior(self, unit):
        set_q_to_prior(unit)


class TestSGPADecoupledHead(GPHeadTestCase):
    factorisations = {"sample": 2, "mean": 1, "predictive": 1}   # K_bb; K_qq - Q_qq to sample

    def make_unit(self, dim, heads):
        return SGPAttention(dim, heads, variant="decoupled", num_inducing=3)

    def set_q_to_prior(self, unit):
        set_q_to_prior(unit)


class TestSGPADecoupledDiagHead(TestSGPADecoupledHead):
    factorisations = {"sample": 1, "mean": 1, "predictive": 1}   # diag: no n x n Cholesky

    def make_unit(self, dim, heads):
        return SGPAttention(dim, heads, variant="decoupled", num_inducing=3, cov="diag")


class TestKEPSVGPAddHead(GPHeadTestCase):
    factorisations = {"sample": 0, "mean": 0, "predictive": 0}   # no kernel matrix at all

    def make_unit(self, dim, heads):
        return KEPSVGPAttention(dim, heads, rank=3)

    def set_q_to_prior(self, unit):
        set_q_to_prior(unit)


class TestKEPSVGPConcatFeaturesHead(TestKEPSVGPAddHead):
    def make_unit(self, dim, heads):
        return KEPSVGPAttention(dim, heads, rank=3, merge="concat_features")


class TestKEPSVGPConcatHead(TestKEPSVGPAddHead):
    fixed_length = True

    def make_unit(self, dim, heads):
        return KEPSVGPAttention(dim, heads, rank=3, merge="concat", seq_len=self.seq_len,
                                token_mixing="low_rank")


class TestCGPTHead(GPHeadTestCase):
    # sample: K_o + s2 I, K_k + s2 I, Sigma_post, Sigma_q, Sigma_k (the Jensen bound);
    # mean: K_o + s2 I; predictive: K_o + s2 I, K_k + s2 I, Sigma_post
    factorisations = {"sample": 5, "mean": 1, "predictive": 3}

    def make_unit(self, dim, heads):
        return CGPTAttention(dim, heads)


class TestCGPTMonteCarloHead(TestCGPTHead):
    factorisations = {"sample": 6, "mean": 1, "predictive": 3}   # + K_o for z_o ~ N(0, K_o)

    def make_unit(self, dim, heads):
        return CGPTAttention(dim, heads, cgp_loss="mc", latent="key_offset")


class TestSCGPTHead(GPHeadTestCase):
    # m = l: B~_m and B~_l in one stacked factorisation; sample: + Q, B'_l; predictive: + Q
    factorisations = {"sample": 3, "mean": 1, "predictive": 2}

    def make_unit(self, dim, heads):
        return SCGPTAttention(dim, heads, num_inducing=3)


class TestSCGPTNystromHead(GPHeadTestCase):
    # m != l: B~_m, B~_l apart; sample: + Q, B'_l, K_ll (Nystrom K_o)
    factorisations = {"sample": 5, "mean": 2, "predictive": 3}

    def make_unit(self, dim, heads):
        return SCGPTAttention(dim, heads, num_inducing=3, num_inducing_keys=4, k_o="nystrom")


#: the registered GP units with their defaults: factorisations per call and documented exceptions
#: (SCGPT's defaults -- m = 16 inducing inputs for N = 6 tokens, sigma = 0.5 -- keep about two
#: digits in float32, as in tests/attention/test_registry.py)
REGISTERED = {
    "sgpa": {"factorisations": {"sample": 2, "mean": 1, "predictive": 1},
             "set_q_to_prior": lambda self, unit: set_q_to_prior(unit)},
    # width 16: head dimension 8 >= the default rank 5 (a larger rank is capped to D)
    "kep_svgp": {"factorisations": {"sample": 0, "mean": 0, "predictive": 0}, "dim": 16,
                 "set_q_to_prior": lambda self, unit: set_q_to_prior(unit)},
    "cgpt": {"factorisations": {"sample": 5, "mean": 1, "predictive": 3}},
    "scgpt": {"factorisations": {"sample": 3, "mean": 1, "predictive": 2},
              "float32_atol": 5e-2},
}
GP_KINDS = sorted(k for k, cls in ATTENTION.items() if issubclass(cls, GPAttentionUnit))


def _sweep_class(kind: str) -> type:
    def make_unit(self, dim, heads):
        return build_attention(kind, dim, heads)

    attrs = {"make_unit": make_unit, "__doc__": f"GP-head checks of {kind!r} with its defaults."}
    attrs.update(REGISTERED.get(kind, {}))
    return type(f"TestRegisteredHead_{kind}", (GPHeadTestCase,), attrs)


for _kind in GP_KINDS:
    globals()[f"TestRegisteredHead_{_kind}"] = _sweep_class(_kind)


def test_every_registered_gp_unit_is_swept_with_declared_counts():
    assert set(GP_KINDS) >= {"sgpa", "kep_svgp", "cgpt", "scgpt"}
    assert set(GP_KINDS) <= set(REGISTERED), set(GP_KINDS) - set(REGISTERED)
