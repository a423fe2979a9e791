"""Attention option values are checked against the type annotations of the units' constructors
(issue 11 item 6): a wrong type is a :class:`ConfigError` naming the key path, not a TypeError deep
inside a constructor."""

from __future__ import annotations

import re
import types
import typing
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Annotated, Any, Literal, Optional, Union

import pytest
import torch

from gpattn_ppl.attention import ATTENTION, attention_options
from gpattn_ppl.attention.registry import attention_option_types
from gpattn_ppl.models.spec import ConfigError, check_value, validate_model_spec
from gpattn_ppl.run.config import load_config

SGPA_YAML = (Path(__file__).resolve().parents[2] / "experiments" / "configs" / "cola"
             / "sgpa_decoupled_paper.yaml")

KINDS = sorted(ATTENTION)
OPTIONS = [(kind, name) for kind in KINDS for name in attention_options(kind)]
_IDS = [f"{k}.{n}" for k, n in OPTIONS]


def _members(ann) -> tuple:
    return typing.get_args(ann) if typing.get_origin(ann) in (Union, types.UnionType) else (ann,)


def _wrong_values(ann) -> list:
    """Values of a clearly wrong type for annotation ``ann`` (empty: it accepts anything)."""
    members = _members(ann)
    origins = {typing.get_origin(m) for m in members}
    if Any in members or object in members:
        return []
    out = []
    if Literal in origins:
        out.append("definitely_not_a_choice")
    elif str not in members:
        out.append("abc")
    if not ({list, tuple, Sequence} & (set(members) | origins)):
        out.append([1, 2])
    if not ({dict, Mapping} & (set(members) | origins)):
        out.append({"a": 1})
    return out


def _key_path(where: str, name: str) -> str:
    return re.escape(f"{where}.{name}") + ":"


# -- every option of every registered kind -----------------------------------------------------

def test_every_option_has_a_type():
    """Every option is annotated with something the checker can refuse values of."""
    untyped = [f"{k}.{n}" for k, n in OPTIONS if not _wrong_values(attention_option_types(k)[n])]
    assert not untyped, untyped
    assert len(KINDS) >= 8
    for kind in KINDS:
        assert set(attention_option_types(kind)) == set(attention_options(kind))


@pytest.mark.parametrize("kind, name", OPTIONS, ids=_IDS)
def test_default_passes(kind, name):
    default = attention_options(kind)[name]
    ann = attention_option_types(kind)[name]
    assert check_value(default, ann, f"model.attention.{name}") == default
    model = validate_model_spec({"attention": {"kind": kind, name: default}})
    assert model["attention"] == {"kind": kind, name: default}


@pytest.mark.parametrize("kind, name", OPTIONS, ids=_IDS)
def test_wrong_type_names_the_key_path(kind, name):
    ann = attention_option_types(kind)[name]
    for bad in _wrong_values(ann):
        with pytest.raises(ConfigError, match=_key_path("model.attention", name)):
            validate_model_spec({"attention": {"kind": kind, name: bad}})
        # per-block overrides name their own key path
        with pytest.raises(ConfigError, match=_key_path("model.overrides[0].attention", name)):
            validate_model_spec({"attention": {"kind": "softmax"},
                                 "overrides": [{"blocks": [-1],
                                                "attention": {"kind": kind, name: bad}}]})
        # the whole config loader
        with pytest.raises(ConfigError, match=_key_path("model.attention", name)):
            load_config({"model": {"attention": {"kind": kind, name: bad}}})


@pytest.mark.parametrize("kind, name", OPTIONS, ids=_IDS)
def test_int_float_bool_none(kind, name):
    """An int is taken for a float; a bool is not an int (nor a float); None only if Optional."""
    ann = attention_option_types(kind)[name]
    members = _members(ann)
    where = f"model.attention.{name}"
    if float in members:
        assert check_value(2, ann, where) == 2
        validate_model_spec({"attention": {"kind": kind, name: 2}})
    if int in members or float in members:
        with pytest.raises(ConfigError, match=re.escape(where) + r": expected .*got bool True"):
            validate_model_spec({"attention": {"kind": kind, name: True}})
    if int in members:
        with pytest.raises(ConfigError, match=re.escape(where) + r": expected int.*got float"):
            validate_model_spec({"attention": {"kind": kind, name: 2.5}})
    if type(None) in members:
        assert validate_model_spec({"attention": {"kind": kind, name: None}})["attention"][name] is None
    else:
        with pytest.raises(ConfigError, match=re.escape(where) + r": .*None"):
            validate_model_spec({"attention": {"kind": kind, name: None}})


LITERALS = [(k, n) for k, n in OPTIONS
            if any(typing.get_origin(m) is Literal for m in _members(attention_option_types(k)[n]))]


@pytest.mark.parametrize("kind, name", LITERALS, ids=[f"{k}.{n}" for k, n in LITERALS])
def test_literal_lists_the_allowed_values(kind, name):
    ann = attention_option_types(kind)[name]
    allowed = typing.get_args(ann)
    for choice in allowed:
        validate_model_spec({"attention": {"kind": kind, name: choice}})
    msg = (re.escape(f"model.attention.{name}: 'foo' is not allowed; allowed: ")
           + re.escape(", ".join(allowed)) + "$")
    with pytest.raises(ConfigError, match=msg):
        validate_model_spec({"attention": {"kind": kind, name: "foo"}})


def _runtime_choices() -> dict:
    """(kind, option) -> the tuple the constructor checks against at run time."""
    from gpattn_ppl.attention import cgpt, gumbel, h_gumbel, kep_svgp, scgpt
    from gpattn_ppl.features.kernel_eigen import FEATURE_MAPS
    from gpattn_ppl.gp.correlated_gp import CorrelatedGP
    from gpattn_ppl.kernels import KERNELS

    return {
        ("kernel", "kernel"): KERNELS, ("sgpa", "kernel"): KERNELS,
        ("sgpa", "variant"): ("standard", "decoupled"), ("sgpa", "cov"): ("full", "diag"),
        ("cgpt", "latent"): cgpt._LATENT, ("scgpt", "latent"): cgpt._LATENT,
        ("cgpt", "cgp_reduction"): cgpt._REDUCTIONS, ("scgpt", "cgp_reduction"): cgpt._REDUCTIONS,
        ("cgpt", "cgp_loss"): CorrelatedGP.LOSSES, ("scgpt", "cgp_loss"): scgpt.SCGPTAttention.LOSSES,
        ("scgpt", "k_o"): ("exact", "nystrom"), ("scgpt", "inducing_init"): ("data", "random"),
        ("kep_svgp", "merge"): kep_svgp.MERGES, ("kep_svgp", "feature_map"): FEATURE_MAPS,
        ("kep_svgp", "u_draws"): kep_svgp.U_DRAWS, ("kep_svgp", "token_mixing"): kep_svgp.TOKEN_MIXINGS,
        ("gumbel", "prior"): gumbel.PRIORS, ("h_gumbel", "prior"): gumbel.PRIORS,
        ("h_gumbel", "centroid_init"): h_gumbel.CENTROID_INITS,
    }


def test_literals_match_the_constructors_runtime_checks():
    """The Literal annotations list exactly what the constructors accept (no drift)."""
    runtime = _runtime_choices()
    assert set(runtime) == set(LITERALS)
    for (kind, name), choices in runtime.items():
        assert set(typing.get_args(attention_option_types(kind)[name])) == set(choices), (kind, name)


@pytest.mark.parametrize("kind, name, bad", [
    ("kernel", "kernel", "foo"), ("sgpa", "variant", "fancy"), ("kep_svgp", "merge", "mul"),
    ("scgpt", "k_o", "approx"), ("gumbel", "prior", "flat"),
])
def test_constructor_refuses_what_the_literal_refuses(kind, name, bad):
    from gpattn_ppl.attention import build_attention

    with pytest.raises(ValueError):
        build_attention(kind, 8, 2, **{name: bad})


def test_options_build_after_validation():
    """Values that pass (an int for a float, a numeric string for a float, a schedule mapping)
    build the unit."""
    from gpattn_ppl.models import build_model

    model = validate_model_spec({
        "dim": 8, "heads": 2, "depth": 2, "num_classes": 2, "vocab_size": 11,
        "attention": {"kind": "gumbel", "temperature": 2, "prior_temperature": "1e0",
                      "temperature_schedule": {"kind": "linear", "start": 2, "end": 1, "epochs": 3}},
        "overrides": [{"blocks": [0], "attention": {"kind": "cgpt", "noise": "1e-3"}}]})
    assert model["attention"]["prior_temperature"] == 1.0
    assert model["overrides"][0]["attention"]["noise"] == 1e-3
    net = build_model(model)
    torch.manual_seed(0)
    assert net(torch.randint(1, 11, (2, 5))).shape == (2, 2)


# -- the config loader, as the CLI calls it ----------------------------------------------------

def test_set_override_on_a_shipped_config():
    with pytest.raises(ConfigError, match=r"^model\.attention\.num_inducing: expected int, got str 'abc'$"):
        load_config(SGPA_YAML, ["model.attention.num_inducing=abc"])
    with pytest.raises(ConfigError, match=r"^model\.attention\.kernel: 'foo' is not allowed; "
                                          r"allowed: exponential, rbf, canonical$"):
        load_config(SGPA_YAML, ["model.attention.kernel=foo"])
    cfg = load_config(SGPA_YAML, ["model.attention.num_inducing=8",
                                  "model.attention.outputscale_init=1"])
    assert cfg["model"]["attention"]["num_inducing"] == 8
    assert cfg["model"]["attention"]["outputscale_init"] == 1


def test_load_config_dict_and_overrides():
    with pytest.raises(ConfigError, match=r"^model\.attention\.num_inducing: expected int, got str 'abc'$"):
        load_config({"model": {"attention": {"kind": "sgpa", "num_inducing": "abc"}}})
    with pytest.raises(ConfigError, match=r"^model\.overrides\[0\]\.attention\.kernel: 'foo' is not "
                                          r"allowed; allowed: exponential, rbf, canonical$"):
        load_config({"model": {"overrides": [{"blocks": [0],
                                              "attention": {"kind": "kernel", "kernel": "foo"}}]}})
    with pytest.raises(ConfigError, match=r"model\.overrides\[0\]\.blocks: expected a list of block"):
        load_config({"model": {"overrides": [{"blocks": [True], "attention": {"kind": "softmax"}}]}})


def test_checked_spec_is_a_copy():
    spec = {"attention": {"kind": "cgpt", "noise": "1e-2"},
            "overrides": [{"blocks": [0], "attention": {"kind": "cgpt", "noise": "1e-3"}}]}
    out = validate_model_spec(spec)
    assert out["attention"]["noise"] == 1e-2 and out["overrides"][0]["attention"]["noise"] == 1e-3
    assert spec["attention"]["noise"] == "1e-2"
    assert spec["overrides"][0]["attention"]["noise"] == "1e-3"


# -- check_value on its own --------------------------------------------------------------------

@pytest.mark.parametrize("value, ann", [
    (1, int), (1, float), (1.5, float), (True, bool), ("a", str), (None, None),
    (None, Optional[int]), (3, int | None), (None, float | None), ("x", Literal["x", "y"]),
    (None, Literal["x"] | None), ([1, 2], list[int]), ([1, 2.5], list[float]), ((1, 2), tuple[int, ...]),
    ([1, "a"], tuple[int, str]), (["a"], Sequence[str]), ([], list), ({"a": 1}, dict),
    ({"a": 1}, dict[str, int]), ({"a": [1]}, Mapping[str, list[int]]), (2, Annotated[int, "meta"]),
    ("anything", Any), ([1], Any), ("x", torch.Tensor), (3, Callable[[int], int]),
    ({"kind": "linear"}, float | dict | None), (2, float | dict | None),
])
def test_check_value_accepts(value, ann):
    assert check_value(value, ann, "k") == value


@pytest.mark.parametrize("value, ann, msg", [
    ("abc", int, "k: expected int, got str 'abc'"),
    (True, int, "k: expected int, got bool True"),
    (False, float, "k: expected float, got bool False"),
    (1.0, int, "k: expected int, got float 1.0"),
    (1, bool, "k: expected bool, got int 1"),
    (None, int, "k: expected int, got None"),
    (None, str, "k: expected str, got None"),
    (3, str, "k: expected str, got int 3"),
    ([1], float, "k: expected float, got list [1]"),
    ("abc", float | None, "k: expected float or None, got str 'abc'"),
    ("z", Literal["x", "y"], "k: 'z' is not allowed; allowed: x, y"),
    ("z", Literal["x"] | None, "k: 'z' is not allowed; allowed: x, None"),
    (True, Literal[1, 2], "k: True is not allowed; allowed: 1, 2"),
    ("ab", list[str], "k: expected a list of str, got str 'ab'"),
    ([1, "a"], list[int], "k[1]: expected int, got str 'a'"),
    ([1, "a"], list[int] | None, "k[1]: expected int, got str 'a'"),
    ([1], tuple[int, int], "k: expected 2 items, got 1"),
    ({"a": "b"}, dict[str, int], "k.a: expected int, got str 'b'"),
    ([1], dict, "k: expected a mapping, got list [1]"),
    ([1], float | dict | None, "k: expected float or a mapping or None, got list [1]"),
])
def test_check_value_refuses(value, ann, msg):
    with pytest.raises(ConfigError, match="^" + re.escape(msg) + "$"):
        check_value(value, ann, "k")


def test_numeric_strings_for_floats():
    """YAML 1.1 reads ``1e-3`` as a string: converted where a float is expected (not for a str)."""
    assert check_value("1e-3", float, "k") == 1e-3
    assert check_value("1e-3", float | None, "k") == 1e-3
    assert check_value("1e-3", float | str, "k") == "1e-3"
    assert check_value(["1e-3"], list[float], "k") == [1e-3]
    with pytest.raises(ConfigError, match="expected int"):
        check_value("1", int, "k")
