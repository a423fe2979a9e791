"""WordTokenizer: splitting rules, vocabulary, encoding, truncation and persistence."""

import json
import random

import pytest
import torch

from gpattn_ppl.data import tokenizer as tokenizer_module
from gpattn_ppl.data.tokenizer import WordTokenizer

TRAIN = ["Our friends won't buy this analysis, let alone the next one we propose.",
         "I'm sure it's John's book.", "They'll go; we've gone.", "the the the cat"]


def test_tokenize_words_contractions_punctuation():
    tok = WordTokenizer.tokenize
    assert tok("Our friends won't buy it.") == ["our", "friends", "wo", "n't", "buy", "it", "."]
    assert tok("I'm sure it's John's") == ["i", "'m", "sure", "it", "'s", "john", "'s"]
    assert tok("They'll, we've; he'd isn't") == ["they", "'ll", ",", "we", "'ve", ";", "he",
                                                 "'d", "is", "n't"]
    assert tok("Can\u2019t stop!") == ["ca", "n't", "stop", "!"]  # curly apostrophe
    assert tok("'sorry' he said") == ["'", "sorry", "'", "he", "said"]
    assert tok("   ") == []


def test_vocab_specials_order_and_frequency():
    t = WordTokenizer.fit(TRAIN)
    assert t.itos[:3] == ["<pad>", "<unk>", "the"]  # "the" is the most frequent token
    assert t.pad_id == 0 and t.unk_id == 1 and t.vocab_size == len(t) == len(t.itos)
    counts = {}
    for s in TRAIN:
        for w in WordTokenizer.tokenize(s):
            counts[w] = counts.get(w, 0) + 1
    assert set(t.itos[2:]) == set(counts)
    # decreasing frequency, ties alphabetical
    keys = [(-counts[w], w) for w in t.itos[2:]]
    assert keys == sorted(keys)
    # the order of the training texts does not matter
    assert WordTokenizer.fit(TRAIN[::-1]).itos == t.itos


def test_min_freq_and_max_vocab():
    t = WordTokenizer.fit(TRAIN, min_freq=2)
    assert t.itos == ["<pad>", "<unk>", "the", ".", "'s", "we"]  # 4, 3, 2, 2 (tie: a-z)
    t = WordTokenizer.fit(TRAIN, max_vocab=4)
    assert len(t) == 4 and t.itos[2] == "the"
    with pytest.raises(ValueError, match="min_freq"):
        WordTokenizer.fit(TRAIN, min_freq=0)
    with pytest.raises(ValueError, match="max_vocab"):
        WordTokenizer.fit(TRAIN, max_vocab=1)


def test_encode_round_trip_unk_and_padding():
    t = WordTokenizer.fit(TRAIN)
    text = "The cat won't buy John's book."
    ids, lengths = t.encode([text, "zebra quokka"], max_len=12)
    assert ids.dtype == torch.long and lengths.dtype == torch.long
    assert ids.shape == (2, 12) and lengths.tolist() == [9, 2]
    assert t.decode(ids[0]) == WordTokenizer.tokenize(text)  # all in vocabulary
    assert ids[1, :2].tolist() == [t.unk_id, t.unk_id]  # out of vocabulary
    assert (ids[0, 9:] == 0).all() and (ids[1, 2:] == 0).all()
    assert (ids[0, :9] > 1).all()


def test_truncation_and_lengths_at_least_one():
    t = WordTokenizer.fit(TRAIN)
    ids, lengths = t.encode(["the " * 50, "", "cat"], max_len=5)
    assert ids.shape == (3, 5)
    assert lengths.tolist() == [5, 1, 1]
    assert ids[0].tolist() == [t.stoi["the"]] * 5
    assert ids[1].tolist() == [t.unk_id, 0, 0, 0, 0]  # an empty text is one <unk>
    with pytest.raises(ValueError, match="max_len"):
        t.encode(["x"], max_len=0)


@pytest.mark.parametrize("window", [1, 2, 12])
def test_prefix_scan_equals_full_tokenisation(monkeypatch, window):
    """Truncation scans a prefix first; it must give exactly the first max_len full tokens."""
    monkeypatch.setattr(tokenizer_module, "_WINDOW", window)
    rng = random.Random(0)
    pieces = ["isn't", "won't", "we'll", "he's", "can't", "a", "bb", ",", ".", "x'y", "n't",
              "'ll", "'", "hello", "don'", "it'", "  ", "\u2019s", "ok!!"]
    texts = ["".join(rng.choice(pieces) + rng.choice(["", " "]) for _ in range(rng.randint(0, 60)))
             for _ in range(400)]
    t = WordTokenizer.fit(texts)
    for max_len in (1, 2, 3, 7, 20):
        ids, lengths = t.encode(texts, max_len=max_len)
        for text, row, n in zip(texts, ids, lengths):
            full = WordTokenizer.tokenize(text)[:max_len] or ["<unk>"]
            assert t.decode(row[:n]) == full


def test_state_dict_is_json_and_restores():
    t = WordTokenizer.fit(TRAIN)
    state = json.loads(json.dumps(t.state_dict()))
    t2 = WordTokenizer.from_state_dict(state)
    assert t2.itos == t.itos
    a, b = t.encode(TRAIN, 8), t2.encode(TRAIN, 8)
    assert torch.equal(a[0], b[0]) and torch.equal(a[1], b[1])
    with pytest.raises(ValueError, match="WordTokenizer"):
        WordTokenizer.from_state_dict({"kind": "minilm"})
    with pytest.raises(ValueError, match="must start"):
        WordTokenizer(["a", "b"])
