"""The CLINC150 slice shipped with the package (``clinc150_slice``): counts, protocols, its
SOURCE.md, agreement with the full release (when the shared copy is present) and a config run.
"""

import hashlib
import json
import math
import re
from pathlib import Path

import pytest
import torch

from gpattn_ppl.data import (
    DATASETS,
    bundled_clinc150_slice_root,
    clinc150_held_out_domains,
    load_data,
    read_clinc150,
)

SLICE = bundled_clinc150_slice_root()
SHARED = Path(__file__).resolve().parents[3] / "shared" / "data" / "clinc150"
needs_full = pytest.mark.skipif(
    not (SHARED / "data_full.json").is_file() or not (SHARED / "domains.json").is_file(),
    reason=f"CLINC150 not found: {SHARED} lacks data_full.json / domains.json (the shared data "
           "folder; see its SOURCE.md)")

#: the slice's SOURCE.md: 5 domains x 2 intents, 100 / 20 / 30 per intent, oos 50 / 50 / 200
DOMAINS = {"auto_and_commute": ["current_location", "directions"],
           "banking": ["account_blocked", "balance"],
           "credit_cards": ["application_status", "apr"],
           "home": ["calendar", "calendar_update"],
           "kitchen_and_dining": ["accept_reservations", "calories"]}
INTENTS = sorted(i for v in DOMAINS.values() for i in v)
OOS_ROWS = {"oos_train": 50, "oos_val": 50, "oos_test": 200}


@pytest.fixture(scope="module")
def raw():
    return json.loads((SLICE / "data_full.json").read_text(encoding="utf-8"))


def test_the_folder_ships_data_provenance_and_licence():
    assert {p.name for p in SLICE.iterdir()} >= {"data_full.json", "domains.json", "SOURCE.md",
                                                  "LICENSE"}
    assert sum(p.stat().st_size for p in SLICE.iterdir()) < 160_000
    assert "Attribution 3.0 Unported" in (SLICE / "LICENSE").read_text(encoding="utf-8")
    source = (SLICE / "SOURCE.md").read_text(encoding="utf-8")
    assert "github.com/clinc/oos-eval" in source and "Larson" in source
    # the sha256 sums SOURCE.md states for the files it describes are theirs
    for name in ("data_full.json", "domains.json", "LICENSE"):
        found = re.search(rf"^\| {re.escape(name)} \| (\d+) \| ([0-9a-f]{{64}}) \|$", source,
                          re.M)
        assert found, f"SOURCE.md has no row for {name}"
        data = (SLICE / name).read_bytes()
        assert (int(found[1]), found[2]) == (len(data), hashlib.sha256(data).hexdigest())


def test_reader_counts_and_layout(raw):
    assert list(raw) == ["train", "val", "test", "oos_train", "oos_val", "oos_test"]
    files = read_clinc150(SLICE)
    assert files["domains"] == DOMAINS
    for split, per_intent in (("train", 100), ("val", 20), ("test", 30)):
        texts, intents = files[split]
        assert sorted(set(intents)) == INTENTS
        assert [intents.count(i) for i in INTENTS] == [per_intent] * 10
        assert [[t, i] for t, i in zip(texts, intents)] == raw[split]
    for split, n in OOS_ROWS.items():
        assert len(raw[split]) == n and {i for _, i in raw[split]} == {"oos"}


def test_standard_protocol_builds_ten_classes():
    spec = DATASETS["clinc150_slice"]
    assert spec.protocols == ("standard", "near_ood") and spec.modality == "text"
    assert spec.select_metric == "acc"
    bundle = load_data("clinc150_slice", max_len=32)
    assert bundle.protocol == "standard" and bundle.classes == INTENTS
    assert bundle.info["sizes"] == {"train": 1000, "val": 200, "test": 300, "oos": 200}
    for split, n in (("train", 100), ("val", 20), ("test", 30)):
        assert torch.bincount(getattr(bundle, split).y, minlength=10).tolist() == [n] * 10
    assert set(bundle.ood) == {"oos"} and (bundle.ood["oos"].y == -1).all()
    assert "SOURCE.md" in bundle.info["licence"]


def test_near_ood_holds_out_two_of_its_five_domains():
    bundle = load_data("clinc150_slice", protocol="near_ood", max_len=32, split_seed=0)
    held = clinc150_held_out_domains(DOMAINS, 0)
    assert bundle.info["held_out_domains"] == held == ["auto_and_commute", "kitchen_and_dining"]
    dropped = {i for d in held for i in DOMAINS[d]}
    assert bundle.classes == [c for c in INTENTS if c not in dropped]
    assert bundle.info["sizes"] == {"train": 600, "val": 120, "test": 180,
                                    "held_out_domains": 120, "oos": 200}
    other = load_data("clinc150_slice", protocol="near_ood", max_len=32, split_seed=2)
    assert other.info["held_out_domains"] == ["home", "kitchen_and_dining"]


def test_a_root_is_refused_and_clinc150_still_needs_one():
    with pytest.raises(ValueError, match="clinc150_slice reads the slice shipped with the "
                                         "package and takes no root"):
        load_data("clinc150_slice", root=str(SLICE))
    with pytest.raises(ValueError, match=r"clinc150 needs root=PATH .*clinc150_slice"):
        load_data("clinc150")


@needs_full
def test_the_slice_is_the_documented_selection_of_the_full_release(raw):
    full = json.loads((SHARED / "data_full.json").read_text(encoding="utf-8"))
    domains = json.loads((SHARED / "domains.json").read_text(encoding="utf-8"))
    # the rule of SOURCE.md: first 5 domains, first 2 intents each, all in sorted order
    chosen = {d: sorted(domains[d])[:2] for d in sorted(domains)[:5]}
    assert chosen == DOMAINS
    full_intents = {i for _, i in full["train"]}
    assert set(INTENTS) < full_intents and len(full_intents) == 150
    keep = set(INTENTS)
    for split in ("train", "val", "test"):
        assert raw[split] == [r for r in full[split] if r[1] in keep]     # every row, in order
    for split, n in OOS_ROWS.items():
        assert raw[split] == full[split][:n]
    # the upstream sums SOURCE.md records are those of the full copy
    source = (SLICE / "SOURCE.md").read_text(encoding="utf-8")
    for name in ("data_full.json", "domains.json"):
        digest = hashlib.sha256((SHARED / name).read_bytes()).hexdigest()
        assert re.search(rf"^\| {re.escape(name)} \| {digest} \|$", source, re.M), name


def test_a_config_with_the_slice_validates_and_runs(tmp_path):
    from gpattn_ppl.run.config import load_config
    from gpattn_ppl.run.experiment import Trainer

    cfg = {
        "model": {"dim": 16, "depth": 1, "heads": 2, "mlp_dim": 16, "dropout": 0.1,
                  "max_len": 32},
        "data": {"name": "clinc150_slice", "max_len": 32, "batch_size": 50,
                 "limit_train": 200, "limit_eval": 100},
        "train": {"epochs": 1, "lr": 1e-3, "warmup_epochs": 0, "progress": False,
                  "device": "cpu"},
        "eval": {"mc_samples": 2},
    }
    assert load_config(cfg)["data"]["name"] == "clinc150_slice"
    res = Trainer(cfg, tmp_path / "run").fit()
    assert res["selection"]["metric"] == "acc"
    assert set(res["ood"]) == {"oos"} and res["ood"]["oos"]["classification"] is None
    auroc = res["ood"]["oos"]["detection"]["max_softmax"]["auroc"]
    assert math.isfinite(auroc) and 0.0 <= auroc <= 1.0
