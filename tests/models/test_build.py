"""build_model: from a YAML file or a model section, validated; sizes filled in from the data."""

import pytest
import yaml

from gpattn_ppl.models import ConfigError, TextClassifier, ViTClassifier, build_model


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
