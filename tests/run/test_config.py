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
    ({"model": {"overrides": [{"block": [0], "attention": {"kind": "softmax"}}]}}, r"model\.overrides\[0\]: expected a mapping with the keys blocks, attention \(and optionally objective\)"),
    ({"model": {"dim": 10, "heads": 4}}, r"model\.dim \(10\) must be a multiple of model\.heads \(4\)"),
    ({"train": {"objective": {"kl_wieght": 1}}}, r"train\.objective: unknown key 'kl_wieght'"),
    ({"train": {"objective": {"kl_weight": {"kind": "ramp"}}}}, r"unknown schedule 'ramp'"),
    ({"train": {"grad_clip": -1}}, r"train\.grad_clip: -1 is out of range; allowed: None or > 0"),
    ({"model": {"heads": 0}}, r"model\.heads: 0 is out of range; allowed: >= 1"),
    ({"model": {"attn_dropout": 1.5}}, r"model\.attn_dropout: 1\.5 is out of range; allowed: "
                                       r"None or in \[0, 1\)"),
    ({"train": {"select_metric": "aurc"}}, r"train\.select_metric: 'aurc' is not a validation"),
    ({"eval": {"metrics": ["acc", "f1"]}}, r"eval\.metrics\[1\]: unknown metric 'f1'"),
    ({"data": {"name": "colla"}}, r"data\.name: unknown dataset 'colla'; allowed: .*cola"),
])
def test_errors_name_the_key_path_and_allowed_values(raw, match):
    with pytest.raises(ConfigError, match=match):
        load_config(raw)


def test_bad_override_syntax():
    with pytest.raises(ConfigError, match="key.path=value"):
        apply_overrides({}, ["train.lr"])
    with pytest.raises(ConfigError, match="the key is empty"):
        apply_overrides({}, ["=1"])
    with pytest.raises(ConfigError, match="'train..lr' has an empty part"):
        apply_overrides({}, ["train..lr=1"])
    with pytest.raises(ConfigError, match="not a YAML scalar"):
        apply_overrides({}, ["train.lr=[1"])


def test_validation_metrics_live_in_the_config():
    from gpattn_ppl.run import config, experiment

    assert experiment.VALIDATION_METRICS is config.VALIDATION_METRICS


def test_config_file_errors_name_the_file(tmp_path):
    path = tmp_path / "c.yaml"
    path.write_text("model:\n  depth: 2\n train: 1\n")
    with pytest.raises(ConfigError, match=r"c\.yaml: line 3, column 2: invalid YAML"):
        load_config(path)
    path.write_text("")
    with pytest.raises(ConfigError, match=r"c\.yaml: the file is empty"):
        load_config(path)
    path.write_text("[1, 2]\n")
    with pytest.raises(ConfigError, match=r"c\.yaml: the top level must be a mapping"):
        load_config(path)
    path.write_text("{}\n")
    assert load_config(path)["train"]["epochs"] == 50


def test_missing_config_file(tmp_path):
    with pytest.raises(FileNotFoundError, match="config file not found"):
        load_config(tmp_path / "nope.yaml")
