import pytest
import yaml

from gpattn_ppl.config import ConfigError, apply_overrides, load_config
from gpattn_ppl.models import TextClassifier, ViTClassifier, build_model


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


def test_build_model_from_yaml_with_per_block_overrides(tmp_path):
    spec = {"model": {"arch": "text", "dim": 16, "heads": 2, "depth": 3, "mlp_dim": 32,
                      "attention": {"kind": "softmax"},
                      "overrides": [{"blocks": [-1], "attention": {"kind": "kernel", "symmetric": True}},
                                    {"blocks": [0], "attention": {"kind": "kernel"}}]}}
    path = tmp_path / "m.yaml"
    path.write_text(yaml.safe_dump(spec))
    model = build_model(path, num_classes=2, vocab_size=50)
    assert isinstance(model, TextClassifier)
    kinds = [(type(b.attn).__name__, getattr(b.attn, "symmetric", None)) for b in model.blocks]
    assert kinds == [("KernelAttention", False), ("SoftmaxAttention", None), ("KernelAttention", True)]
    assert list(model.attention_units()) == ["blocks.0.attn", "blocks.1.attn", "blocks.2.attn"]
    assert model.blocks[2].attn.site_prefix == "blocks.2.attn"


def test_build_vit_and_missing_sizes():
    m = build_model({"arch": "vit", "dim": 16, "heads": 2, "depth": 1, "mlp_dim": 16}, num_classes=10)
    assert isinstance(m, ViTClassifier)
    with pytest.raises(ConfigError, match="num_classes"):
        build_model({"arch": "vit"})
    with pytest.raises(ConfigError, match="exactly one of vocab_size or feature_dim"):
        build_model({"arch": "text"}, num_classes=2)
