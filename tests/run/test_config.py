import pytest

from gpattn_ppl.run.config import ConfigError, apply_overrides, load_config


def test_defaults_and_overrides():
    cfg = load_config({"model": {"depth": 3}}, ["train.lr=1e-3", "model.attention.kind=kernel"])
    assert cfg["model"]["depth"] == 3 and cfg["train"]["lr"] == 1e-3
    assert cfg["model"]["attention"] == {"kind": "kernel"}
    assert cfg["data"]["name"] == "cola"


@pytest.mark.parametrize("raw, match", [
    ({"modle": {}}, r"modle: unknown key; allowed: model, data, train, eval"),
    ({"model": {"dpeth": 2}}, r"model\.dpeth: unknown key; allowed: arch, dim"),
    ({"model": {"depth": "two"}}, r"model\.depth: expected int, got str"),
    ({"model": {"mc_dropout": 1}}, r"model\.mc_dropout: expected bool"),
    ({"model": {"depth": True}}, r"model\.depth: expected int, got bool"),
    ({"train": {"optimizer": "sgd"}}, r"train\.optimizer: 'sgd' is not allowed; allowed: adam, adamw"),
    ({"model": {"attention": {"kind": "nope"}}}, r"model\.attention\.kind: unknown attention kind 'nope'; allowed: .*softmax"),
    ({"model": {"attention": {"kind": "kernel", "kernal": "rbf"}}}, r"model\.attention\.kernal: unknown option for attention kind 'kernel'; allowed: .*kernel"),
    ({"model": {"overrides": [{"blocks": [5], "attention": {"kind": "softmax"}}]}}, r"model\.overrides\[0\]\.blocks: index 5 out of range for depth 2"),
    ({"model": {"overrides": [{"block": [0], "attention": {"kind": "softmax"}}]}}, r"model\.overrides\[0\]: expected a mapping with exactly the keys blocks, attention"),
    ({"model": {"dim": 10, "heads": 4}}, r"model\.dim \(10\) must be a multiple of model\.heads \(4\)"),
    ({"train": {"objective": {"kl_wieght": 1}}}, r"train\.objective: unknown key 'kl_wieght'"),
    ({"train": {"objective": {"kl_weight": {"kind": "ramp"}}}}, r"unknown schedule 'ramp'"),
])
def test_errors_name_the_key_path_and_allowed_values(raw, match):
    with pytest.raises(ConfigError, match=match):
        load_config(raw)


def test_bad_override_syntax():
    with pytest.raises(ConfigError, match="key.path=value"):
        apply_overrides({}, ["train.lr"])


def test_missing_config_file(tmp_path):
    with pytest.raises(FileNotFoundError, match="config file not found"):
        load_config(tmp_path / "nope.yaml")
