"""CLINC150: the reader, the ``standard`` and ``near_ood`` protocols, errors, and a tiny run.

The data is not shipped with the package: the tests read the shared copy
(``../shared/data/clinc150`` from the repository root) and skip when it is absent; the tests of
malformed files write their own small files.
"""

import json
import math
from pathlib import Path

import pytest
import torch

from gpattn_ppl.data import (
    CLINC150_NEAR_OOD_DOMAINS,
    DATASETS,
    clinc150_held_out_domains,
    load_data,
    read_clinc150,
)
from gpattn_ppl.errors import DataError

SHARED = Path(__file__).resolve().parents[3] / "shared" / "data" / "clinc150"
needs_data = pytest.mark.skipif(
    not (SHARED / "data_full.json").is_file() or not (SHARED / "domains.json").is_file(),
    reason=f"CLINC150 not found: {SHARED} lacks data_full.json / domains.json (the shared data "
           "folder; see its SOURCE.md)")

#: SOURCE.md's counts
SIZES = {"train": 15000, "val": 3000, "test": 4500, "oos": 1000}
#: queries of the published test split that are also training queries (kept as published)
TEST_IN_TRAIN = {"where did you grow up", "what's your designation"}


def _build(protocol: str, split_seed: int = 0):
    return DATASETS["clinc150"].builder(protocol=protocol, root=str(SHARED),
                                        split_seed=split_seed, cache_dir=None)


@pytest.fixture(scope="module")
def files():
    return read_clinc150(SHARED)


@pytest.fixture(scope="module")
def standard():
    return _build("standard")


@pytest.fixture(scope="module")
def near():
    return _build("near_ood")


def test_registered_with_its_protocols_and_metric():
    spec = DATASETS["clinc150"]
    assert spec.protocols == ("standard", "near_ood") and spec.modality == "text"
    assert spec.select_metric == "acc" and spec.options == ()


# -- standard --------------------------------------------------------------------------------
@needs_data
def test_standard_sizes_classes_and_labels(files, standard):
    bundle = load_data("clinc150", root=str(SHARED), max_len=32)
    assert bundle.protocol == "standard" and bundle.select_metric == "acc"
    assert bundle.info["sizes"] == SIZES
    assert {s: len(standard.splits[s]) for s in ("train", "val", "test")} == {
        s: SIZES[s] for s in ("train", "val", "test")}
    intents = sorted(set(files["train"][1]))
    assert len(intents) == 150 and bundle.num_classes == 150 and bundle.classes == intents
    assert set(files["val"][1]) == set(files["test"][1]) == set(intents)
    for split in ("train", "val", "test"):
        y = getattr(bundle, split).y
        assert y.min() >= 0 and y.max() < 150
        assert torch.bincount(y, minlength=150).tolist() == [len(y) // 150] * 150  # 100/20/30
    assert set(bundle.ood) == {"oos"} and (bundle.ood["oos"].y == -1).all()
    # each example keeps its intent and split, in file order
    for split in ("train", "val", "test"):
        idx = standard.splits[split].tolist()
        assert [standard.x[i] for i in idx] == files[split][0]
        assert [standard.classes[int(standard.y[i])] for i in idx] == files[split][1]
    assert standard.ood["oos"][0] == files["oos_test"][0]


@needs_data
def test_no_test_or_oos_query_is_a_training_query_but_the_published_repeats(standard):
    train = {standard.x[i] for i in standard.splits["train"].tolist()}
    test = {standard.x[i] for i in standard.splits["test"].tolist()}
    assert test & train == TEST_IN_TRAIN  # two repeats in the source itself, kept as published
    assert not set(standard.ood["oos"][0]) & (train | test)
    parts = [set(standard.splits[s].tolist()) for s in ("train", "val", "test")]
    assert not (parts[0] & parts[1] or parts[0] & parts[2] or parts[1] & parts[2])


@needs_data
def test_the_report_names_the_oos_set_for_detection_only():
    bundle = load_data("clinc150", root=str(SHARED), max_len=32, limit_train=300, limit_eval=200)
    assert bundle.info["sizes"] == {"train": 300, "val": 200, "test": 200, "oos": 200}
    assert torch.bincount(bundle.train.y, minlength=150).tolist() == [2] * 150


# -- near_ood --------------------------------------------------------------------------------
@needs_data
def test_near_ood_holds_out_whole_domains(files, standard, near):
    domains = files["domains"]
    assert len(domains) == 10 and all(len(v) == 15 for v in domains.values())
    held = clinc150_held_out_domains(domains, 0)
    assert held == ["banking", "kitchen_and_dining"] == near.info["held_out_domains"]
    assert len(held) == CLINC150_NEAR_OOD_DOMAINS
    dropped = {i for d in held for i in domains[d]}
    kept = [c for c in standard.classes if c not in dropped]
    assert near.classes == kept and near.num_classes == 120 == len(kept)
    # no held-out intent in train / val / test; every example keeps its intent name
    for split in ("train", "val", "test"):
        idx = near.splits[split].tolist()
        names = [near.classes[int(near.y[i])] for i in idx]
        assert not set(names) & dropped
        pairs = [(t, i) for t, i in zip(*files[split]) if i not in dropped]
        assert list(zip([near.x[i] for i in idx], names)) == pairs
        assert len(idx) == {"train": 12000, "val": 2400, "test": 3600}[split]
    # the held-out domains' test queries are the OOD set held_out_domains
    held_test = [t for t, i in zip(*files["test"]) if i in dropped]
    assert near.ood["held_out_domains"][0] == held_test and len(held_test) == 900
    assert set(near.ood) == {"held_out_domains", "oos"}
    assert near.ood["oos"][0] == files["oos_test"][0]
    for _, y in near.ood.values():
        assert (y == -1).all()


@needs_data
def test_near_ood_follows_split_seed(files):
    b = load_data("clinc150", protocol="near_ood", root=str(SHARED), max_len=32, split_seed=1)
    assert b.info["held_out_domains"] == ["meta", "small_talk"]
    assert b.info["sizes"] == {"train": 12000, "val": 2400, "test": 3600,
                               "held_out_domains": 900, "oos": 1000}
    kept = {i for d, v in files["domains"].items() if d not in ("meta", "small_talk") for i in v}
    assert set(b.classes) == kept and b.train.y.max() == 119
    assert clinc150_held_out_domains(files["domains"], 2) == ["travel", "utility"]


@needs_data
def test_two_loads_give_the_same_fingerprint():
    kw = {"root": str(SHARED), "max_len": 32, "limit_eval": 100}
    a, b = load_data("clinc150", **kw), load_data("clinc150", **kw)
    assert a.fingerprint == b.fingerprint and torch.equal(a.train.x, b.train.x)
    c = load_data("clinc150", protocol="near_ood", **kw)
    d = load_data("clinc150", protocol="near_ood", **kw)
    assert c.fingerprint == d.fingerprint != a.fingerprint
    e = load_data("clinc150", protocol="near_ood", split_seed=1, **kw)
    assert e.fingerprint != c.fingerprint


# -- errors ----------------------------------------------------------------------------------
def test_a_missing_root_is_named_in_one_line(tmp_path):
    missing = tmp_path / "nowhere"
    with pytest.raises(FileNotFoundError) as err:
        load_data("clinc150", root=str(missing))
    assert str(missing) in str(err.value) and "\n" not in str(err.value)
    with pytest.raises(ValueError, match=r"clinc150 needs root=PATH \(data.root\)"):
        load_data("clinc150")
    missing.mkdir()
    with pytest.raises(FileNotFoundError) as err:
        load_data("clinc150", root=str(missing))
    assert str(missing / "data_full.json") in str(err.value) and "\n" not in str(err.value)


def _write(folder: Path, data: str, domains: str | None = None) -> Path:
    folder.mkdir(exist_ok=True)
    (folder / "data_full.json").write_text(data, encoding="utf-8")
    if domains is not None:
        (folder / "domains.json").write_text(domains, encoding="utf-8")
    return folder


def _small(**change) -> dict:
    rows = {"train": [["hi there", "greeting"], ["bye now", "goodbye"]],
            "val": [["hello", "greeting"]], "test": [["see you", "goodbye"]],
            "oos_test": [["what is a prime", "oos"]]}
    return {**rows, **change}


def test_a_small_well_formed_folder_loads(tmp_path):
    root = _write(tmp_path / "ok", json.dumps(_small(), indent=2),
                  json.dumps({"chat": ["greeting"], "farewell": ["goodbye"], "x": []}))
    b = load_data("clinc150", root=str(root), max_len=8)
    assert b.classes == ["goodbye", "greeting"] and b.info["sizes"] == {
        "train": 2, "val": 1, "test": 1, "oos": 1}


@pytest.mark.parametrize("text, line, message", [  # a "train" key, then the other splits
    ('{\n "train": [\n  ["a", "b"],\n  ["c" "d"]\n ]\n}', 4, "invalid JSON"),
    ('{\n "train": [],\n "train": []\n}', 3, "duplicate key 'train'"),
    ('{\n "train": [\n  ["a", "b"],\n  ["c", "d", "e"]\n ]\n}', 4, "[text, intent] pair"),
    ('{\n "train": [\n  ["a", "oos"]\n ]\n}', 3, "intent 'oos' in the in-scope split"),
    ('{\n "train": [\n  ["", "b"]\n ]\n}', 3, "empty text"),
    ('{\n "train": {"a": 1}\n}', 2, "must hold a list"),
    ('{\n "train": [\n  ["a", "b"],\n  {"t": 1,\n   "t": 2}\n ]\n}', 4, "duplicate key 't'"),
])
def test_malformed_data_names_file_and_line(tmp_path, text, line, message):
    rest = ', "val": [["x", "b"]], "test": [["y", "b"]], "oos_test": [["z", "oos"]]}'
    root = _write(tmp_path / "bad", text[:-1] + rest)  # the other splits, after the bad one
    with pytest.raises(DataError) as err:
        read_clinc150(root, domains=False)
    shown = str(err.value)
    where = f"{root / 'data_full.json'}, line {line}"
    assert shown.startswith(where) and message in shown, shown


def test_malformed_data_missing_split_and_oos(tmp_path):
    small = _small()
    del small["oos_test"]
    with pytest.raises(DataError, match="no key 'oos_test'"):
        read_clinc150(_write(tmp_path / "a", json.dumps(small)), domains=False)
    bad = _small(oos_test=[["what is a prime", "greeting"]])
    with pytest.raises(DataError, match="intent 'greeting' in the out-of-scope split"):
        read_clinc150(_write(tmp_path / "b", json.dumps(bad)), domains=False)
    bad = _small(test=[["see you", "farewell"]])
    with pytest.raises(DataError, match="'farewell' .* has no training queries"):
        read_clinc150(_write(tmp_path / "c", json.dumps(bad)), domains=False)


@pytest.mark.parametrize("domains, message", [
    ('{\n "a": ["greeting"],\n "b": ["greeting", "goodbye"]\n}', "line 3, domain 'b': intent "
     "'greeting' is already in domain 'a'"),
    ('{\n "a": ["greeting",\n  "hello"],\n "b": ["goodbye"]\n}', "line 3, domain 'a': intent "
     "'hello' is not an in-scope intent"),
    ('{\n "a": ["greeting"]\n}', "1 intents of data_full.json are in no domain"),
])
def test_malformed_domains_are_named(tmp_path, domains, message):
    root = _write(tmp_path / "d", json.dumps(_small()), domains)
    with pytest.raises(DataError) as err:
        read_clinc150(root)
    assert str(err.value).startswith(str(root / "domains.json")) and message in str(err.value)


# -- a tiny end-to-end run -------------------------------------------------------------------
@needs_data
def test_a_tiny_run_reports_oos_detection(tmp_path):
    from gpattn_ppl.run.experiment import Trainer

    cfg = {
        "model": {"dim": 16, "depth": 1, "heads": 2, "mlp_dim": 16, "dropout": 0.1,
                  "max_len": 32},
        "data": {"name": "clinc150", "root": str(SHARED), "max_len": 32, "batch_size": 32,
                 "limit_train": 300, "limit_eval": 150},
        "train": {"epochs": 1, "lr": 1e-3, "warmup_epochs": 0, "progress": False,
                  "device": "cpu"},
        "eval": {"mc_samples": 2},
    }
    res = Trainer(cfg, tmp_path / "run").fit()
    assert res["selection"]["metric"] == "acc"
    assert set(res["test"]) >= {"acc", "nll", "ece"}
    assert set(res["ood"]) == {"oos"}
    oos = res["ood"]["oos"]
    assert oos["classification"] is None  # unlabelled: detection only
    assert set(oos["detection"]) >= {"max_softmax", "entropy", "energy"}
    for scores in oos["detection"].values():
        assert set(scores) >= {"auroc", "aupr_in", "aupr_out", "fpr95"}
        assert all(math.isfinite(v) for v in scores.values())
