"""load_data: argument validation, limit_train, split_seed, registration and __all__."""

import importlib
import json

import pytest
import torch

import gpattn_ppl.data as data
from gpattn_ppl.data import DATASETS, DataBundle, RawData, load_data, register_dataset


def test_unknown_name_protocol_encoder_kwarg():
    with pytest.raises(ValueError, match="allowed: cifar10, clinc150, clinc150_demo, clinc150_slice, cola, csv, "
                       "image_folder, imdb, jsonl"):
        load_data("colaa")
    with pytest.raises(ValueError, match="allowed: official, 712, sto"):
        load_data("cola", protocol="80/20")
    with pytest.raises(ValueError, match="allowed: learned, minilm"):
        load_data("cola", encoder="elmo")
    with pytest.raises(ValueError, match="text datasets only"):
        load_data("cifar10", root="x", encoder="minilm")
    with pytest.raises(TypeError, match="min_frq"):
        load_data("cola", min_frq=2)
    with pytest.raises(TypeError, match="cr_root"):
        load_data("cola", cr_root="x")  # an imdb option
    with pytest.raises(ValueError, match="needs root"):
        load_data("imdb")
    with pytest.raises(ValueError, match="limit_train"):
        load_data("cola", limit_train=0)


def test_limit_train_is_seeded_subset():
    full = load_data("cola", max_len=8)
    a = load_data("cola", max_len=8, limit_train=50)
    b = load_data("cola", max_len=8, limit_train=50)
    c = load_data("cola", max_len=8, limit_train=50, seed=1, split_seed=0)
    assert len(a.train) == 50 and len(a.val) == len(full.val) and len(a.test) == 527
    assert torch.equal(a.train.y, b.train.y) and torch.equal(a.train.lengths, b.train.lengths)
    # the vocabulary is fitted on the 50 kept sentences only
    assert a.vocab_size < full.vocab_size
    # split_seed keeps the split fixed while seed changes the subset
    assert torch.equal(c.val.y, a.val.y) and torch.equal(c.val.lengths, a.val.lengths)
    assert not torch.equal(c.train.lengths, a.train.lengths)
    assert len(load_data("cola", max_len=8, limit_train=10**6).train) == len(full.train)


def test_tokenizer_options_reach_the_vocabulary():
    b = load_data("cola", max_len=8, min_freq=3, max_vocab=500)
    assert b.vocab_size == 500 and b.info["encoder_options"] == {"min_freq": 3,
                                                                  "max_vocab": 500}
    json.dumps(b.info)  # info stays JSON-able (run directories save it)


def test_register_new_dataset_and_empty_split():
    @register_dataset("toy_test_only", protocols=("a",), modality="text")
    def _toy(*, protocol, root, split_seed, cache_dir):
        return RawData(["good day", "bad day", "ok"], torch.tensor([1, 0, 1]),
                       {"train": torch.tensor([0, 1]), "val": torch.tensor([2]),
                        "test": torch.tensor([], dtype=torch.long)}, {}, 2)

    try:
        with pytest.raises(ValueError, match="test split is empty"):
            load_data("toy_test_only")
    finally:
        del DATASETS["toy_test_only"]


def test_reader_modules_register_their_datasets_and_selection_metrics():
    from gpattn_ppl.data import cifar, cola, image_folder, imdb, tabular

    assert DATASETS["cola"].builder.__module__ == cola.__name__
    assert DATASETS["imdb"].builder.__module__ == imdb.__name__
    assert DATASETS["cifar10"].builder.__module__ == cifar.__name__
    assert DATASETS["csv"].builder.__module__ == tabular.__name__
    assert DATASETS["jsonl"].builder.__module__ == tabular.__name__
    assert DATASETS["image_folder"].builder.__module__ == image_folder.__name__
    assert {n: (DATASETS[n].protocols, DATASETS[n].modality)
            for n in ("csv", "jsonl", "image_folder")} == {
        "csv": (("given",), "text"), "jsonl": (("given",), "text"),
        "image_folder": (("given",), "image")}
    declared = {n: s.select_metric for n, s in DATASETS.items()}
    assert declared.items() >= {"cola": "mcc", "imdb": "acc", "cifar10": "acc"}.items()
    assert load_data("cola", max_len=8, limit_train=20).select_metric == "mcc"


def test_bundle_fields():
    b = load_data("cola", protocol="712", max_len=8)
    assert isinstance(b, DataBundle)
    assert set(b.ood) == {"cola_ood"} and b.ood["cola_ood"].name == "cola_ood"
    assert b.train.name == "cola_train" and b.info["split_seed"] == 0


def test_all_is_complete():
    for name in data.__all__:
        assert hasattr(data, name), name
    for module in ("batch", "dataset", "tokenizer", "pretrained", "cola", "imdb", "cr", "cifar",
                   "registry", "load", "splits", "tabular", "image_folder", "encoders", "vision_ood",
                   "corruptions"):
        mod = importlib.import_module(f"gpattn_ppl.data.{module}")
        public = {n for n in vars(mod) if not n.startswith("_")
                  and getattr(getattr(mod, n), "__module__", None) == mod.__name__}
        assert public <= set(mod.__all__), (module, public - set(mod.__all__))
        assert set(mod.__all__) <= set(data.__all__), (module, set(mod.__all__) - set(data.__all__))
