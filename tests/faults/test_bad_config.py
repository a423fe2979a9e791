"""Bad configs: every numeric key out of range or of a wrong type, every unknown name, every bad
``--set`` is a :class:`ConfigError` naming the key path, raised before any data is loaded; through
the command line, one ``error:`` line, exit status 2, no traceback (``--debug`` shows one)."""

from __future__ import annotations

import math
import subprocess
import sys

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gpattn_ppl.errors import GpattnError
from gpattn_ppl.run.cli import main
from gpattn_ppl.run.config import SCHEMA, ConfigError, load_config

from .conftest import cli_error, tried

# hypothesis's failure report imports libcst, which warns on import; keep the failure readable
pytestmark = pytest.mark.filterwarnings("ignore:mypy_extensions.TypedDict:DeprecationWarning")

FAST = settings(max_examples=15, deadline=None, database=None,
                suppress_health_check=[HealthCheck.function_scoped_fixture])


def _leaves(schema: dict, prefix: str = ""):
    for key, spec in schema.items():
        path = f"{prefix}.{key}" if prefix else key
        if isinstance(spec, dict):
            yield from _leaves(spec, path)
        else:
            yield path, spec


#: numeric keys (a key that takes a name or a number, eval.laplace_prior, is a name-valued key
#: for strings: its wrong-type draws would be names, refused by name, not by type)
NUMERIC = {path: spec for path, spec in _leaves(SCHEMA) if spec.numeric and str not in spec.types}


def _nested(path: str, value) -> dict:
    out: dict = {}
    node = out
    keys = path.split(".")
    for k in keys[:-1]:
        node = node.setdefault(k, {})
    node[keys[-1]] = value
    return out


def _reject(path: str, value) -> str:
    with pytest.raises(ConfigError) as err:
        load_config(_nested(path, value))
    message = str(err.value)
    assert message.startswith((f"{path}:", f"{path}[")), message
    return message


def _is_float(text: str) -> bool:
    try:
        float(text)
    except ValueError:
        return False
    return True


def _outside(spec, value) -> bool:
    try:
        spec.check_range(value, "x")
    except ConfigError:
        return True
    return False


def _out_of_range(spec) -> st.SearchStrategy:
    """Numbers outside the option's range, of a type it takes (-0.0 is inside ``>= 0``)."""
    takes_float = float in spec.types
    parts = []
    if spec.low is not None:
        top = spec.low if spec.low_open else spec.low - 1
        parts.append(st.integers(max_value=math.floor(top)))
        if takes_float:
            parts.append(st.floats(max_value=spec.low, exclude_max=not spec.low_open,
                                   allow_nan=False, allow_infinity=False))
    if spec.high is not None:
        bottom = spec.high if spec.high_open else spec.high + 1
        parts.append(st.integers(min_value=math.ceil(bottom)))
        if takes_float:
            parts.append(st.floats(min_value=spec.high, exclude_min=not spec.high_open,
                                   allow_nan=False, allow_infinity=False))
    if takes_float:
        parts.append(st.sampled_from([math.nan, math.inf, -math.inf]))
    return st.one_of(parts).filter(lambda v: _outside(spec, v))


def _wrong_type(spec) -> st.SearchStrategy:
    """Values of a type the option does not take (strings that read as numbers left out for
    float options: YAML 1.1 reads ``1e-3`` as a string, so those are converted)."""
    texts = st.text(max_size=8)
    if float in spec.types:
        texts = texts.filter(lambda t: not _is_float(t))
    parts = [texts, st.booleans(), st.lists(st.integers(), max_size=2),
             st.dictionaries(st.text(max_size=3), st.integers(), max_size=2)]
    if float not in spec.types:
        parts.append(st.floats(allow_nan=False))
    if type(None) not in spec.types:
        parts.append(st.none())
    return st.one_of(parts)


def test_every_numeric_key_has_a_range():
    """No numeric key is unbounded (the check that keeps this suite complete)."""
    unbounded = [p for p, s in NUMERIC.items() if s.low is None and s.high is None]
    assert not unbounded
    assert len(NUMERIC) >= 25
    for path, spec in NUMERIC.items():  # and every default is inside it
        spec.check_range(spec.default, path)


@pytest.mark.parametrize("path", sorted(NUMERIC))
@FAST
@given(data=st.data())
def test_numeric_out_of_range_names_the_key_and_range(path, data):
    spec = NUMERIC[path]
    value = data.draw(_out_of_range(spec))
    message = _reject(path, value)
    assert spec.allowed() in message
    tried("out of range")


@pytest.mark.parametrize("path", sorted(NUMERIC))
@FAST
@given(data=st.data())
def test_numeric_of_wrong_type_names_the_key(path, data):
    value = data.draw(_wrong_type(NUMERIC[path]))
    message = _reject(path, value)
    assert "expected" in message
    tried("wrong type")


#: name-valued keys -> the names they accept (anything else must be refused)
NAMES = {
    "data.name": {"cola", "imdb", "cifar10", "csv", "jsonl", "image_folder"},
    "data.encoder": {"learned", "minilm"},
    "model.arch": {"text", "vit"},
    "train.optimizer": {"adam", "adamw"},
    "train.schedule": {"cosine", "linear", "constant"},
    "train.mode": {"thin", "sites"},
    "train.select_metric": {"auto", "acc", "mcc", "nll", "ece", "brier"},
    "train.device": {"auto", "cpu", "cuda", "mps"},
    "eval.average": {"probs", "logits"},
}
#: list-of-names keys
LIST_NAMES = ("eval.metrics", "eval.ood_detectors")
_WORD = st.text(alphabet=st.characters(codec="ascii", categories=("L", "N", "P")), min_size=1,
                max_size=10)


@pytest.mark.parametrize("path", sorted(NAMES))
@FAST
@given(name=_WORD)
def test_unknown_names_are_refused_with_the_allowed_ones(path, name):
    from gpattn_ppl.data import DATASETS

    if name in NAMES[path] or (path == "data.name" and name in DATASETS) or (path == "train.device" and name.startswith("cuda:")
                               and name[5:].isdigit()):
        return
    message = _reject(path, name)
    assert "allowed" in message
    tried("unknown name")


@pytest.mark.parametrize("path", LIST_NAMES)
@FAST
@given(name=_WORD)
def test_unknown_metric_and_detector_names_are_refused(path, name):
    from gpattn_ppl.metrics.report import CONFIG_METRICS
    from gpattn_ppl.ood import SCORE_NAMES

    if name in CONFIG_METRICS + SCORE_NAMES:
        return
    message = _reject(path, ["acc" if path == "eval.metrics" else "entropy", name])
    assert message.startswith(f"{path}[1]:") and "allowed" in message
    tried("unknown name")


@pytest.mark.parametrize("raw, match", [
    ({"data": {"name": "cola", "protocol": "kep"}}, r"data\.protocol: 'kep' is not a protocol"),
    ({"data": {"name": "cola", "train_file": "x.csv"}}, r"data\.train_file: not an option"),
    ({"data": {"name": "cifar10", "encoder": "minilm"}}, r"data\.encoder: 'minilm' applies"),
    ({"train": {"lr": 1e-6}}, r"train\.min_lr \(1e-05\) must be <= train\.lr"),
    ({"model": {"arch": "vit", "image_size": 30, "patch_size": 4}},
     r"model\.image_size \(30\) must be a multiple of model\.patch_size"),
    ({"data": {"delimiter": ";;"}}, r"data\.delimiter: ';;' is not allowed"),
    ({"eval": {"ood": [3]}}, r"eval\.ood\[0\]: expected an OOD set name"),
    ({"eval": {"metrics": [1]}}, r"eval\.metrics\[0\]: expected a metric name"),
    # option values the units' constructors refuse, named before any data is loaded
    ({"model": {"attention": {"kind": "gumbel", "temperature": -1}}},
     r"model\.attention \(kind 'gumbel'\): temperature must be > 0"),
    ({"model": {"attention": {"kind": "kep_svgp", "rank": 0}}},
     r"model\.attention \(kind 'kep_svgp'\): rank \(s\) must be >= 1"),
    ({"model": {"attention": {"kind": "cgpt", "noise": -1}}},
     r"model\.attention \(kind 'cgpt'\): noise must be > 0"),
    ({"model": {"attention": {"kind": "kernel", "attn_dropout": 2}}},
     r"model\.attention \(kind 'kernel'\): dropout probability"),
    ({"model": {"overrides": [{"blocks": [0], "attention": {"kind": "h_gumbel",
                                                            "num_centroids": 0}}]}},
     r"model\.overrides\[0\]\.attention \(kind 'h_gumbel'\): num_centroids must be >= 1"),
])
def test_rules_across_keys(raw, match):
    with pytest.raises(ConfigError, match=match):
        load_config(raw)
    tried("rule across keys")


def test_validation_leaves_the_random_state_alone():
    torch.manual_seed(0)
    expected = torch.rand(3)
    torch.manual_seed(0)
    load_config({"model": {"attention": {"kind": "sgpa"}}})
    assert torch.equal(torch.rand(3), expected)


def test_constant_schedule_ignores_min_lr():
    assert load_config({"train": {"lr": 1e-6, "schedule": "constant"}})["train"]["lr"] == 1e-6


def test_config_errors_are_library_errors_and_value_errors():
    with pytest.raises(GpattnError):
        load_config({"train": {"lr": 0}})
    with pytest.raises(ValueError):
        load_config({"train": {"lr": 0}})


# -- through the command line, in-process -----------------------------------------------------

#: ``--set`` value -> the start of the expected message (the defects of issue 16 among them)
CLI_CASES = {
    "train.grad_clip=-1": "train.grad_clip: -1 is out of range; allowed: None or > 0",
    "train.epochs=0": "train.epochs: 0 is out of range; allowed: >= 1",
    "model.heads=0": "model.heads: 0 is out of range; allowed: >= 1",
    "train.lr=0": "train.lr: 0 is out of range; allowed: > 0",
    "data.batch_size=0": "data.batch_size: 0 is out of range; allowed: >= 1",
    "eval.mc_samples=0": "eval.mc_samples: 0 is out of range; allowed: >= 1",
    "train.select_metric=aurc": "train.select_metric: 'aurc' is not a validation metric",
    "eval.metrics=[acc,nope]": "eval.metrics[1]: unknown metric 'nope'",
    "eval.ood_detectors=[msp]": "eval.ood_detectors[0]: unknown OOD detector 'msp'",
    "train.device=gpu": "train.device: unknown device 'gpu'",
    "data.name=colla": "data.name: unknown dataset 'colla'",
    "model.dropout=1": "model.dropout: 1 is out of range; allowed: in [0, 1)",
    "train.lr=.nan": "train.lr: nan is not a finite number",
    "train.seed=-1": "train.seed: -1 is out of range",
    "train.epochs=two": "train.epochs: expected int, got str 'two'",
    "data.limit_train=0": "data.limit_train: 0 is out of range; allowed: None or >= 1",
    "=1": "--set '=1': the key is empty",
    "train..lr=1": "--set 'train..lr=1': the key 'train..lr' has an empty part",
    "train.lr": "--set 'train.lr': expected key.path=value",
    "train.lr=[1": "--set 'train.lr=[1': the value is not a YAML scalar",
    "model=3": "model: expected a mapping, got int",
}


@pytest.mark.parametrize("pair", sorted(CLI_CASES))
def test_cli_bad_value_is_one_line_and_exit_2(pair, tiny_yaml, tmp_path, capsys):
    out = tmp_path / "run"
    line = cli_error(capsys, main(["train", str(tiny_yaml), "--out", str(out), "--set", pair]))
    assert line.startswith("gpattn-ppl train: error: " + CLI_CASES[pair]), line
    assert not out.exists()  # refused before anything was written
    tried("CLI --set")


def _yaml_scalar(value) -> str:
    if isinstance(value, float) and not math.isfinite(value):
        return ".nan" if math.isnan(value) else (".inf" if value > 0 else "-.inf")
    return repr(value)


@FAST
@given(data=st.data())
def test_cli_any_out_of_range_value_is_one_line(data, tiny_yaml, capsys):
    path = data.draw(st.sampled_from(sorted(NUMERIC)))
    value = data.draw(_out_of_range(NUMERIC[path]))
    code = main(["train", str(tiny_yaml), "--set", f"{path}={_yaml_scalar(value)}"])
    line = cli_error(capsys, code)
    assert line.startswith(f"gpattn-ppl train: error: {path}: "), line
    tried("CLI --set (hypothesis)")


def test_cli_cuda_without_cuda_is_named_before_data(tiny_yaml, tmp_path, capsys, monkeypatch):
    import gpattn_ppl.run.experiment as experiment

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    monkeypatch.setattr(experiment, "load_bundle", lambda cfg: pytest.fail("data loaded"))
    for device in ("cuda", "cuda:1"):
        line = cli_error(capsys, main(["train", str(tiny_yaml), "--out", str(tmp_path / "r"),
                                       "--set", f"train.device={device}"]))
        assert f"train.device: '{device}' was asked for but CUDA is not available" in line
        tried("CLI device")
    line = cli_error(capsys, main(["predict", str(tmp_path / "r"), "--input", "x.txt",
                                   "--device", "cuda"]))
    assert "predict --device: 'cuda' was asked for but CUDA is not available" in line
    tried("CLI device")


def test_cli_unknown_ood_set_is_named_before_training(tiny_yaml, tmp_path, capsys, monkeypatch):
    import gpattn_ppl.run.experiment as experiment

    monkeypatch.setattr(experiment.Trainer, "fit", lambda self: pytest.fail("trained"))
    out = tmp_path / "run"
    line = cli_error(capsys, main(["train", str(tiny_yaml), "--out", str(out),
                                   "--set", "eval.ood=[cola_ood,svhn]"]))
    assert "eval.ood: unknown OOD set(s) 'svhn' of dataset 'cola'; it has: cola_ood" in line
    assert not (out / "config.yaml").exists()
    tried("CLI OOD set")


def test_cli_unexpected_error_is_one_line_naming_a_bug(tiny_yaml, capsys, monkeypatch):
    import gpattn_ppl.run.cli as cli

    def boom(args):
        raise ZeroDivisionError("division by zero")

    monkeypatch.setattr(cli, "_train", boom)
    line = cli_error(capsys, main(["train", str(tiny_yaml)]), expected=1)
    assert "unexpected ZeroDivisionError: division by zero" in line
    assert "bug" in line and "--debug" in line


def test_cli_interrupt_is_exit_130(tiny_yaml, capsys, monkeypatch):
    import gpattn_ppl.run.cli as cli

    def interrupted(args):
        raise KeyboardInterrupt

    monkeypatch.setattr(cli, "_train", interrupted)
    assert main(["train", str(tiny_yaml)]) == 130
    assert "interrupted" in capsys.readouterr().err


def test_debug_lets_the_error_through(tiny_yaml):
    for argv in (["--debug", "train", str(tiny_yaml), "--set", "train.lr=0"],
                 ["train", str(tiny_yaml), "--set", "train.lr=0", "--debug"]):
        with pytest.raises(ConfigError, match="train.lr: 0 is out of range"):
            main(argv)


def test_debug_shows_the_traceback_in_a_real_process(tiny_yaml):
    cmd = [sys.executable, "-m", "gpattn_ppl.run.cli", "train", str(tiny_yaml), "--set",
           "model.heads=0"]
    plain = subprocess.run(cmd, capture_output=True, text=True, timeout=900)  # a hang guard, not a time bound
    assert plain.returncode == 2 and "Traceback" not in plain.stderr
    assert plain.stderr.strip() == ("gpattn-ppl train: error: model.heads: 0 is out of range; "
                                    "allowed: >= 1")
    debug = subprocess.run(cmd + ["--debug"], capture_output=True, text=True, timeout=900)  # a hang guard, not a time bound
    assert debug.returncode == 1
    assert "Traceback" in debug.stderr and "ConfigError: model.heads" in debug.stderr
