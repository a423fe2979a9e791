"""IMDB (compact JSON lines and aclImdb folders) and CR readers, and the IMDB protocols."""

import json
import lzma

import pytest
import torch

from gpattn_ppl.data import load_data, read_cr, read_imdb

INDICES = [0, 1, 2, 10, 11]  # numeric order differs from name order ("10" < "2")


def _review(split, polarity, i):
    return f"{split} {polarity} review {i}.<br /><br />It was {'good' if polarity == 'pos' else 'bad'}!"


def _make_acl(root):
    for split in ("train", "test"):
        for polarity in ("pos", "neg"):
            folder = root / "aclImdb" / split / polarity
            folder.mkdir(parents=True)
            for i in INDICES:
                (folder / f"{i}_{8 if polarity == 'pos' else 2}.txt").write_text(
                    _review(split, polarity, i), encoding="utf-8")
    (root / "aclImdb" / "train" / "unsup").mkdir()
    (root / "aclImdb" / "train" / "unsup" / "0_0.txt").write_text("unlabelled", encoding="utf-8")
    return root


def _make_jsonl(root):
    root.mkdir(parents=True, exist_ok=True)
    for split in ("train", "test"):
        rows = [{"id": f"{split}/{p}/{i}_{r}", "label": lab, "rating": r, "text": _review(split, p, i)}
                for p, lab, r in (("pos", 1, 8), ("neg", 0, 2)) for i in INDICES]
        with lzma.open(root / f"imdb_{split}.jsonl.xz", "wt", encoding="utf-8") as f:
            f.write("\n".join(json.dumps(r) for r in rows) + "\n")
    return root


def _make_cr(root, n=6):
    root.mkdir(parents=True, exist_ok=True)
    for split in ("train", "dev", "test"):
        lines = [f"the {split} phone {i} is {'great' if i % 2 else 'awful'} . \t{i % 2}"
                 for i in range(n)]
        (root / f"CR.{split}").write_text("\n".join(lines) + "\n", encoding="utf-8")
    return root


def test_both_imdb_layouts_read_identically(tmp_path):
    a = read_imdb(_make_acl(tmp_path / "acl"))
    b = read_imdb(_make_jsonl(tmp_path / "compact"))
    c = read_imdb(tmp_path / "acl" / "aclImdb")  # root may also be the aclImdb folder
    for split in ("train", "test"):
        assert a[split][0] == b[split][0] == c[split][0]
        assert torch.equal(a[split][1], b[split][1])
    texts, labels = a["train"]
    assert len(texts) == 10 and labels.tolist() == [1] * 5 + [0] * 5  # unsup ignored
    assert texts[3] == "train pos review 10.  It was good!"  # numeric order, <br /> removed
    raw = read_imdb(tmp_path / "acl", strip_html=False)
    assert "<br />" in raw["train"][0][0]


def test_imdb_missing_paths(tmp_path):
    with pytest.raises(FileNotFoundError, match="imdb_train.jsonl.xz"):
        read_imdb(tmp_path)
    with pytest.raises(FileNotFoundError, match="nowhere"):
        read_imdb(tmp_path / "nowhere")
    (tmp_path / "aclImdb" / "train" / "pos").mkdir(parents=True)
    with pytest.raises(FileNotFoundError, match="neg"):
        read_imdb(tmp_path)


def test_imdb_empty_file(tmp_path):
    for split in ("train", "test"):
        with lzma.open(tmp_path / f"imdb_{split}.jsonl.xz", "wt") as f:
            f.write("")
    with pytest.raises(ValueError, match="no reviews"):
        read_imdb(tmp_path)


def test_cr_reader(tmp_path):
    cr = read_cr(_make_cr(tmp_path))
    texts, labels = cr["test"]
    assert texts[1] == "the test phone 1 is great ."  # trailing space before the tab stripped
    assert labels.tolist() == [0, 1, 0, 1, 0, 1]
    assert set(read_cr(tmp_path, ("test",))) == {"test"}
    (tmp_path / "CR.test").unlink()
    with pytest.raises(FileNotFoundError, match="CR.test"):
        read_cr(tmp_path)
    with pytest.raises(ValueError, match="allowed"):
        read_cr(tmp_path, ("val",))


def test_imdb_protocols_and_cr_ood(tmp_path):
    root = _make_jsonl(tmp_path / "imdb")
    _make_cr(tmp_path / "cr")  # found next to the IMDB folder
    b = load_data("imdb", root=str(root))
    assert b.info["sizes"] == {"train": 9, "val": 1, "test": 10, "cr": 6}
    assert b.input_kind == "tokens" and b.num_classes == 2
    assert b.classes == ["negative", "positive"]
    # CR goes through the tokenizer fitted on IMDB train: its words are mostly <unk>
    ids, lengths = b.tokenizer.encode(read_cr(tmp_path / "cr", ("test",))["test"][0], 64)
    assert torch.equal(b.ood["cr"].x, ids) and torch.equal(b.ood["cr"].lengths, lengths)
    assert (b.ood["cr"].x == b.tokenizer.unk_id).any()
    k = load_data("imdb", root=str(root), protocol="kep")
    assert k.info["sizes"] == {"train": 14, "val": 2, "test": 4, "cr": 6}
    # explicit cr_root / none
    assert "cr" in load_data("imdb", root=str(root), cr_root=str(tmp_path / "cr")).ood
    assert load_data("imdb", root=str(root), cr_root=False).ood == {}
    with pytest.raises(FileNotFoundError, match="CR.test"):
        load_data("imdb", root=str(root), cr_root=str(tmp_path))


def test_imdb_without_cr_nearby_has_note(tmp_path):
    b = load_data("imdb", root=str(_make_acl(tmp_path / "x")))
    assert b.ood == {} and "cr_root" in b.info["notes"][0]
