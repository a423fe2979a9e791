"""CoLA: bundled files, split sizes, disjointness and determinism of every protocol."""

import hashlib
from pathlib import Path

import pytest
import torch

from gpattn_ppl.data import DATASETS, bundled_cola_root, load_data, read_cola

SHARED = Path(__file__).resolve().parents[3] / "shared" / "data" / "cola"
SHA256 = {
    "in_domain_train.tsv": "f320a10f92d3bce6b29152fde322a362eac39238e50d8de0c8815457fdf4fc12",
    "in_domain_dev.tsv": "77176f6a03faa5a1c4f23c69971fc1bff565931112fb65af47b2d6e24b7f42f7",
    "out_of_domain_dev.tsv": "201b9c57b2a20f1282242eec0ed8995729e3be19c29a46c047b3727338836c05",
    "README.cola_public": "b056fc502a7820e87daf24520083c48951571fa12b2ef4f9707ff9ff08c0256e",
}
SIZES = {"official": (7696, 855, 527), "712": (6354, 908, 1816), "sto": (6354, 908, 1816)}


def _splits(protocol, seed=0):
    return DATASETS["cola"].builder(protocol=protocol, root=None, split_seed=seed, cache_dir=None)


def test_bundled_files_are_v11_byte_for_byte():
    for name, digest in SHA256.items():
        assert hashlib.sha256((bundled_cola_root() / name).read_bytes()).hexdigest() == digest
    assert (bundled_cola_root() / "SOURCE.md").is_file()


def test_read_cola_counts_and_first_rows():
    files = read_cola()
    assert {k: len(v[0]) for k, v in files.items()} == {
        "in_domain_train": 8551, "in_domain_dev": 527, "out_of_domain_dev": 516}
    assert {k: int(v[1].sum()) for k, v in files.items()} == {
        "in_domain_train": 6023, "in_domain_dev": 365, "out_of_domain_dev": 354}
    assert files["in_domain_train"][0][0] == ("Our friends won't buy this analysis, let alone "
                                              "the next one we propose.")
    assert files["out_of_domain_dev"][0][0] == "Somebody just left - guess who."


@pytest.mark.parametrize("protocol", ["official", "712", "sto"])
def test_split_sizes_disjoint_and_covering(protocol):
    raw = _splits(protocol)
    tr, va, te = (raw.splits[s] for s in ("train", "val", "test"))
    assert (len(tr), len(va), len(te)) == SIZES[protocol]
    union = torch.cat([tr, va, te])
    assert len(union.unique()) == len(union)  # disjoint
    assert len(raw.x) == 9078 and len(raw.ood["cola_ood"][0]) == 516
    if protocol == "official":
        assert torch.equal(te, torch.arange(8551, 9078))  # in_domain_dev, in file order
        assert torch.equal(torch.cat([tr, va]).sort().values, torch.arange(8551))
    else:
        assert torch.equal(union.sort().values, torch.arange(9078))


@pytest.mark.parametrize("protocol", ["official", "712"])
def test_splits_deterministic_under_seed(protocol):
    a, b, c = _splits(protocol, 0), _splits(protocol, 0), _splits(protocol, 1)
    for s in ("train", "val"):
        assert torch.equal(a.splits[s], b.splits[s])
        assert not torch.equal(a.splits[s], c.splits[s])


def test_load_official_matches_files():
    b = load_data("cola")
    files = read_cola()
    assert (b.name, b.protocol, b.input_kind, b.num_classes) == ("cola", "official", "tokens", 2)
    assert (len(b.train), len(b.val), len(b.test)) == SIZES["official"]
    assert b.info["sizes"] == {"train": 7696, "val": 855, "test": 527, "cola_ood": 516}
    assert b.vocab_size == len(b.tokenizer) and b.feature_dim is None
    # test / ood are the dev files in order, encoded by the train-split vocabulary
    for ds, key in ((b.test, "in_domain_dev"), (b.ood["cola_ood"], "out_of_domain_dev")):
        ids, lengths = b.tokenizer.encode(files[key][0], max_len=64)
        assert torch.equal(ds.x, ids) and torch.equal(ds.lengths, lengths)
        assert torch.equal(ds.y, files[key][1])
    # the vocabulary comes from the train split only: a word only in val/test is <unk>
    train_words = {w for row in b.train.x for w in b.tokenizer.decode(row)}
    assert train_words == set(b.tokenizer.itos[2:])
    assert int(b.train.y.sum() + b.val.y.sum()) == 6023


@pytest.mark.parametrize("protocol", ["official", "712", "sto"])
def test_encoded_splits_are_well_formed(protocol):
    b = load_data("cola", protocol=protocol, max_len=16)
    for ds in (b.train, b.val, b.test, *b.ood.values()):
        assert ds.x.dtype == torch.long and ds.x.shape[1] == 16
        assert int(ds.lengths.min()) >= 1 and int(ds.lengths.max()) <= 16
        pad = torch.arange(16) >= ds.lengths[:, None]
        assert (ds.x[pad] == 0).all() and (ds.x[~pad] > 0).all()
        assert int(ds.x.max()) < b.vocab_size
    batch = b.train.batch(torch.arange(5))
    assert torch.equal(batch.mask.sum(1), b.train.lengths[:5])


def test_root_override_and_missing_files(tmp_path):
    for name in ("in_domain_train.tsv", "in_domain_dev.tsv", "out_of_domain_dev.tsv"):
        rows = [f"src\t{i % 2}\t\tSentence number {i} here ." for i in range(20)]
        (tmp_path / name).write_text("\n".join(rows) + "\n", encoding="utf-8")
    b = load_data("cola", root=str(tmp_path))
    assert (len(b.train), len(b.val), len(b.test), len(b.ood["cola_ood"])) == (18, 2, 20, 20)
    assert b.info["source"] == str(tmp_path)
    (tmp_path / "in_domain_dev.tsv").unlink()
    with pytest.raises(FileNotFoundError, match="in_domain_dev.tsv"):
        load_data("cola", root=str(tmp_path))


def test_empty_or_malformed_file(tmp_path):
    for name in ("in_domain_train.tsv", "in_domain_dev.tsv", "out_of_domain_dev.tsv"):
        (tmp_path / name).write_text("src\t1\t\tA sentence .\n", encoding="utf-8")
    (tmp_path / "in_domain_dev.tsv").write_text("", encoding="utf-8")
    with pytest.raises(ValueError, match="no sentences"):
        read_cola(tmp_path)
    (tmp_path / "in_domain_dev.tsv").write_text("only two\tcolumns\n", encoding="utf-8")
    with pytest.raises(ValueError, match="expected"):
        read_cola(tmp_path)


@pytest.mark.skipif(not SHARED.is_dir(), reason="shared data folder not present")
def test_bundled_equals_shared_copy():
    for name in SHA256:
        assert (bundled_cola_root() / name).read_bytes() == (SHARED / name).read_bytes()
