"""The csv and jsonl datasets: columns, delimiters, labels, held-out splits, OOD, errors."""

import json

import pytest
import torch

from gpattn_ppl.data import DATASETS, encoder_from_state, load_data, read_labelled_texts

WORDS = ["good", "bad", "fine", "awful", "great", "poor", "nice", "dull", "neat", "grim"]


def _csv(path, rows, header=("text", "label"), delimiter=","):
    lines = [delimiter.join(header)] + [delimiter.join(str(v) for v in r) for r in rows]
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return path


def _jsonl(path, objs):
    path.write_text("".join(json.dumps(o) + "\n" for o in objs), encoding="utf-8")
    return path


def _rows(n, labels, offset=0):
    return [(f"review {i + offset} was {WORDS[i % 10]}", labels[i % len(labels)])
            for i in range(n)]


def test_csv_string_labels_and_held_out_splits(tmp_path):
    rows = _rows(60, ["pos"]) + _rows(40, ["neg"], offset=60)  # sorted by label, 60/40
    train = _csv(tmp_path / "train.csv", rows)
    b = load_data("csv", train_file=str(train), max_len=8)
    assert (b.name, b.protocol, b.input_kind, b.num_classes) == ("csv", "given", "tokens", 2)
    assert b.classes == ["neg", "pos"]  # sorted
    assert (len(b.train), len(b.val), len(b.test)) == (80, 10, 10)
    for ds, n_pos in ((b.val, 6), (b.test, 6), (b.train, 48)):  # stratified 60/40
        assert int(ds.y.sum()) == n_pos, ds.name
    assert "stratified 10% of train_file" in b.info["split"] and "no test_file" in b.info["split"]
    assert "held out of train_file" in b.info["notes"][0]
    again = load_data("csv", train_file=str(train), max_len=8)
    other = load_data("csv", train_file=str(train), max_len=8, split_seed=1)
    assert torch.equal(again.val.x, b.val.x) and again.fingerprint == b.fingerprint
    assert not torch.equal(other.val.x, b.val.x) and other.fingerprint != b.fingerprint
    raw = DATASETS["csv"].builder(protocol="given", root=None, split_seed=0, cache_dir=None,
                                  train_file=str(train))
    union = torch.cat([raw.splits[s] for s in ("train", "val", "test")])
    assert torch.equal(union.sort().values, torch.arange(100))  # disjoint, covering the file
    assert b.info["train_file_rows"] == 100


def test_tsv_int_labels_keep_their_index(tmp_path):
    rows = [(f"sentence {i} {WORDS[i % 10]}", i % 3) for i in range(30)]
    train = _csv(tmp_path / "train.tsv", rows, delimiter="\t")
    test = _csv(tmp_path / "test.tsv", [("good one", 2), ("bad one", 0)], delimiter="\t")
    b = load_data("csv", train_file=str(train), test_file=str(test), max_len=8)
    assert b.classes == ["0", "1", "2"]
    assert b.test.y.tolist() == [2, 0]  # the integer label is the index
    assert "test = " + str(test) in b.info["split"] and "notes" not in b.info


def test_integer_labels_sort_numerically(tmp_path):
    path = _csv(tmp_path / "t.csv", _rows(12, [10, 2, -1]))
    texts, y, classes = read_labelled_texts(path)
    assert classes == ["-1", "2", "10"]
    assert y[:3].tolist() == [2, 1, 0] and texts[0] == "review 0 was good"


def test_quoting_multiline_bom_crlf_and_line_numbers(tmp_path):
    path = tmp_path / "q.csv"
    content = ('\ufefftext,label\r\n"hello, world",a\r\n"two\r\nlines",b\r\n\r\n'
               '"",a\r\n')
    path.write_bytes(content.encode("utf-8"))
    with pytest.raises(ValueError) as err:
        read_labelled_texts(path)
    # the empty text is on editor line 6 (the quoted field spans lines 3-4, line 5 is blank)
    assert str(err.value) == f"{path}, line 6, column 'text': the text is empty"
    path.write_bytes(content.replace('"",a', '"ok",a').encode("utf-8"))
    texts, y, classes = read_labelled_texts(path)
    assert texts == ["hello, world", "two\r\nlines", "ok"] and classes == ["a", "b"]
    assert y.tolist() == [0, 1, 0]


def test_delimiters_explicit_and_sniffed(tmp_path):
    rows = _rows(10, ["x", "y"])
    semi = _csv(tmp_path / "data.txt", rows, delimiter=";")
    texts, _, _ = read_labelled_texts(semi, delimiter=";")
    assert texts[1] == "review 1 was bad"
    pipe = _csv(tmp_path / "data.dat", rows, delimiter="|")
    assert read_labelled_texts(pipe)[0][1] == "review 1 was bad"  # sniffed
    with pytest.raises(ValueError, match="one character"):
        read_labelled_texts(semi, delimiter=";;")
    # a .csv file is read with commas whatever it holds: the header is one column
    tsv_named_csv = _csv(tmp_path / "wrong.csv", rows, delimiter="\t")
    with pytest.raises(ValueError, match="no column 'text'"):
        read_labelled_texts(tsv_named_csv)


def test_custom_columns_and_root_relative_paths(tmp_path):
    rows = [(i, f"note {WORDS[i % 10]}", "yes" if i % 2 else "no") for i in range(20)]
    _csv(tmp_path / "train.csv", rows, header=("id", "body", "target"))
    _csv(tmp_path / "val.csv", rows[:4], header=("id", "body", "target"))
    b = load_data("csv", root=str(tmp_path), train_file="train.csv", val_file="val.csv",
                  text_column="body", label_column="target", max_len=4)
    assert b.classes == ["no", "yes"] and b.val.y.tolist() == [0, 1, 0, 1]
    assert b.info["columns"] == {"text": "body", "label": "target"}
    assert len(b.train) + len(b.test) == 20
    with pytest.raises(TypeError, match="delimiter"):
        load_data("jsonl", train_file="x.jsonl", delimiter=",")  # csv only


def test_jsonl_mixed_label_types_and_ood_without_labels(tmp_path):
    train = _jsonl(tmp_path / "train.jsonl",
                   [{"text": f"item {WORDS[i % 10]} {i}", "label": i % 2, "extra": None}
                    for i in range(20)])
    val = _jsonl(tmp_path / "val.jsonl", [{"text": "good", "label": "1"},
                                          {"text": "bad", "label": 0}])
    ood = _jsonl(tmp_path / "ood.jsonl", [{"text": "weather report"}, {"text": "stock tips"}])
    labelled_ood = _jsonl(tmp_path / "ood2.jsonl", [{"text": "a", "label": 1},
                                                    {"text": "b", "label": 7}])
    b = load_data("jsonl", train_file=str(train), val_file=str(val),
                  ood_files={"news": str(ood), "mixed": str(labelled_ood)}, max_len=4)
    assert b.classes == ["0", "1"] and b.val.y.tolist() == [1, 0]
    assert b.ood["news"].y.tolist() == [-1, -1]
    assert b.ood["mixed"].y.tolist() == [1, -1]  # an OOD label outside the classes is unknown
    assert b.info["ood_unlabelled"] == {"news": 2, "mixed": 1}
    assert (len(b.train), len(b.val), len(b.test)) == (18, 2, 2)


def test_ood_csv_without_label_column(tmp_path):
    train = _csv(tmp_path / "train.csv", _rows(20, ["a", "b"]))
    ood = tmp_path / "ood.csv"
    ood.write_text("id,text\n1,something else\n2,more of it\n", encoding="utf-8")
    b = load_data("csv", train_file=str(train), ood_files={"other": str(ood)}, max_len=4)
    assert b.ood["other"].y.tolist() == [-1, -1] and len(b.ood["other"]) == 2


# -- errors --------------------------------------------------------------------------------------
def _raises(match_all, fn, *args, exc=ValueError, **kw):
    with pytest.raises(exc) as err:
        fn(*args, **kw)
    for part in match_all:
        assert part in str(err.value), (part, str(err.value))
    return str(err.value)


def test_error_wrong_field_count(tmp_path):
    path = tmp_path / "bad.csv"
    path.write_text("text,label\nfine,a\ntoo,many,fields\n", encoding="utf-8")
    _raises([str(path), "line 3", "expected 2 fields", "text, label", "got 3"],
            read_labelled_texts, path)


def test_error_missing_column_lists_columns(tmp_path):
    path = _csv(tmp_path / "cols.csv", _rows(4, ["a", "b"]), header=("sentence", "label"))
    _raises([str(path), "line 1", "no column 'text'", "'sentence', 'label'"],
            read_labelled_texts, path)
    _raises([str(path), "line 1", "no column 'y'"], read_labelled_texts, path,
            text_column="sentence", label_column="y")
    jl = _jsonl(tmp_path / "k.jsonl", [{"text": "a", "label": 1}, {"txt": "b", "label": 0}])
    _raises([str(jl), "line 2", "no key 'text'", "'txt', 'label'"], read_labelled_texts, jl,
            fmt="jsonl")


def test_error_empty_text_and_label(tmp_path):
    path = tmp_path / "e.csv"
    path.write_text("text,label\nok,a\n   ,b\n", encoding="utf-8")
    _raises([str(path), "line 3", "column 'text'", "empty"], read_labelled_texts, path)
    path.write_text("text,label\nok,a\nfine,\n", encoding="utf-8")
    _raises([str(path), "line 3", "column 'label'", "label is empty"], read_labelled_texts, path)


def test_error_unknown_label_lists_classes(tmp_path):
    train = _csv(tmp_path / "train.csv", _rows(20, ["neg", "pos"]))
    val = tmp_path / "val.csv"
    val.write_text("text,label\nfine,pos\nodd one,neutral\n", encoding="utf-8")
    _raises([str(val), "line 3", "column 'label'", "'neutral'", "neg, pos"],
            load_data, "csv", train_file=str(train), val_file=str(val))
    # integer classes: a label that is not an integer is unknown too
    train_int = _csv(tmp_path / "ti.csv", _rows(20, [0, 1]))
    test = _csv(tmp_path / "te.csv", [("x", "1.0")])
    _raises([str(test), "line 2", "'1.0'", "0, 1"], load_data, "csv",
            train_file=str(train_int), test_file=str(test))


def test_error_bad_utf8_names_the_line(tmp_path):
    path = tmp_path / "latin1.csv"
    path.write_bytes("text,label\nok,a\nfine,b\ncaf\u00e9,a\n".encode("latin-1"))
    _raises([str(path), "line 4", "not valid UTF-8", "0xe9", "column 4"],
            read_labelled_texts, path)


def test_error_invalid_json_and_non_object(tmp_path):
    path = tmp_path / "bad.jsonl"
    path.write_text('{"text": "a", "label": 1}\n\n{"text": "b", "label": 0,}\n', encoding="utf-8")
    _raises([str(path), "line 3", "invalid JSON", "column"], read_labelled_texts, path,
            fmt="jsonl")
    path.write_text('{"text": "a", "label": 1}\n["b", 0]\n', encoding="utf-8")
    _raises([str(path), "line 2", "expected a JSON object"], read_labelled_texts, path,
            fmt="jsonl")
    path.write_text('{"text": "a", "label": 1}\n{"text": "b", "label": [0]}\n', encoding="utf-8")
    _raises([str(path), "line 2", "column 'label'", "string or an integer"],
            read_labelled_texts, path, fmt="jsonl")


def test_error_one_class_and_empty_files(tmp_path):
    one = _csv(tmp_path / "one.csv", _rows(5, ["same"]))
    _raises([str(one), "at least 2 classes", "found 1"], load_data, "csv", train_file=str(one))
    empty = tmp_path / "empty.csv"
    empty.write_text("", encoding="utf-8")
    _raises([str(empty), "empty file"], read_labelled_texts, empty)
    header_only = tmp_path / "header.csv"
    header_only.write_text("text,label\n", encoding="utf-8")
    _raises([str(header_only), "no examples"], read_labelled_texts, header_only)
    blank = tmp_path / "blank.jsonl"
    blank.write_text("\n\n", encoding="utf-8")
    _raises([str(blank), "no examples"], read_labelled_texts, blank, fmt="jsonl")


def test_error_missing_files_name_the_key(tmp_path):
    _raises(["data.train_file: no such file:", "nope.csv"], load_data, "csv",
            train_file=str(tmp_path / "nope.csv"), exc=FileNotFoundError)
    train = _csv(tmp_path / "train.csv", _rows(20, ["a", "b"]))
    _raises(["data.val_file: no such file:", "v.csv"], load_data, "csv",
            train_file=str(train), val_file="v.csv", exc=FileNotFoundError)
    _raises(["data.ood_files.web: no such file:"], load_data, "jsonl", train_file=str(train),
            ood_files={"web": "w.jsonl"}, exc=FileNotFoundError)
    _raises(["needs train_file"], load_data, "csv")


def test_encoder_round_trip_on_training_rows(tmp_path):
    rows = _rows(30, ["a", "b", "c"])
    train = _csv(tmp_path / "train.csv", rows)
    b = load_data("csv", train_file=str(train), max_len=6)
    state = json.loads(json.dumps(b.encoder_state))
    assert state["kind"] == "learned" and state["max_len"] == 6
    enc = encoder_from_state(state)
    raw = DATASETS["csv"].builder(protocol="given", root=None, split_seed=0, cache_dir=None,
                                  train_file=str(train))
    for split in ("train", "test"):
        ds = enc.dataset([raw.x[i] for i in raw.splits[split].tolist()])
        stored = getattr(b, split)
        assert torch.equal(ds.x, stored.x) and torch.equal(ds.lengths, stored.lengths)
        assert ds.y.tolist() == [-1] * len(stored)
    assert enc.input_kind == "tokens"
