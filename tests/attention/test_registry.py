"""The public unit mixin over every key of the attention registry, with each unit's defaults: a
new unit cannot be registered without inheriting the contract checks."""

import pytest

from gpattn_ppl.attention import ATTENTION, build_attention
from gpattn_ppl.testing import AttentionUnitTestCase

#: class attributes of the mixin a kind's *defaults* need (documented exceptions, not skips):
#: normalised kernel attention's amplitude cancels in the row normalisation, so no gradient
#: reaches it; the Gumbel units' mean mode is the modal value, not the expectation; SCGPT's
#: defaults (m = 16 random inducing inputs for N = 6 tokens, sigma = 0.1) make the DTC matrix
#: sigma^2 K_mm + K_mo K_om badly conditioned, and float32 keeps about two digits of the mean
#: (measured max abs error 1.7e-2 against float64 on this input).
SWEEP_ATTRIBUTES = {
    "kernel": {"params_without_grad": frozenset({"kernel.raw_outputscale"})},
    "scgpt": {"float32_atol": 5e-2},
    "gumbel": {"mean_is_expectation": False},
    "h_gumbel": {"mean_is_expectation": False},
    # width 16: head dimension 8 >= KEP-SVGP's default rank 5 (a larger rank is capped to D)
    "kep_svgp": {"dim": 16},
}


def _sweep_class(kind: str) -> type:
    def make_unit(self, dim, heads):
        return build_attention(kind, dim, heads)

    attrs = {"make_unit": make_unit, "__doc__": f"Mixin checks of {kind!r} with its defaults."}
    attrs.update(SWEEP_ATTRIBUTES.get(kind, {}))
    return type(f"TestRegistered_{kind}", (AttentionUnitTestCase,), attrs)


SWEPT = sorted(ATTENTION)
for _kind in SWEPT:
    globals()[f"TestRegistered_{_kind}"] = _sweep_class(_kind)


def test_every_registered_kind_is_swept():
    """Every kind in the registry (the package's units) has a generated test class here."""
    assert set(SWEPT) >= {k for k, cls in ATTENTION.items() if cls.__module__.startswith("gpattn_ppl.")}
    assert len(SWEPT) >= 8


def test_sweep_attributes_name_registered_kinds():
    unknown = set(SWEEP_ATTRIBUTES) - set(ATTENTION)
    assert not unknown, unknown


@pytest.mark.parametrize("kind", SWEPT)
def test_default_options_are_keyword_only_and_documented(kind):
    """Every option of a unit is keyword-only, has a default, and appears in its docstring."""
    import inspect

    cls = ATTENTION[kind]
    sig = inspect.signature(cls.__init__)
    doc = inspect.getdoc(cls) or ""
    for name, p in sig.parameters.items():
        if name in ("self", "dim", "heads"):
            continue
        assert p.kind == p.KEYWORD_ONLY, (kind, name)
        assert p.default is not p.empty, (kind, name)
        assert f":param {name}:" in doc or f"``{name}``" in doc or name in doc, (kind, name)
