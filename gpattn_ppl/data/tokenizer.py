"""Word-level tokenizer with a vocabulary built from a training split."""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Iterable, Sequence

import numpy as np
import torch

__all__ = ["WordTokenizer"]

#: Lower-cased text -> tokens: a word before "n't" stops there ("won't" -> "wo", "n't"), clitics
#: ('s 'm 'd 'll 're 've) and "n't" are tokens of their own, then words, then single symbols.
_TOKEN_RE = re.compile(r"\w+(?=n't\b)|n't\b|'(?:s|m|d|ll|re|ve)\b|\w+|[^\w\s]")
_WINDOW = 12  # characters per token scanned first when truncating (then the whole text)
_COUNT_CHUNK = 2000  # texts joined per regex call when counting


def _normalise(text: str) -> str:
    return text.lower().replace("\u2019", "'").replace("\u2018", "'")


def _head(text: str, max_len: int) -> list[str]:
    """The first ``max_len`` tokens of ``text``, scanning only a prefix when that suffices."""
    text = _normalise(text)
    end = _WINDOW * max_len
    if len(text) > end:
        # the last two tokens of a prefix may be cut by its end; keep them out of the result
        tokens = _TOKEN_RE.findall(text, 0, end)
        if len(tokens) >= max_len + 2:
            return tokens[:max_len]
    return _TOKEN_RE.findall(text)[:max_len]


class WordTokenizer:
    """Lower-casing word tokenizer: regex split into words, contractions and punctuation.

    Index 0 is ``<pad>``, 1 is ``<unk>``; the other tokens follow by decreasing training
    frequency (ties alphabetical), so a vocabulary is a pure function of the training texts.

    :param itos: the vocabulary, index -> token; must start with ``["<pad>", "<unk>"]``.

    >>> tok = WordTokenizer.fit(["It isn't red.", "It is."])
    >>> tok.tokenize("It isn't red.")
    ['it', 'is', "n't", 'red', '.']
    >>> tok.itos
    ['<pad>', '<unk>', '.', 'is', 'it', "n't", 'red']
    >>> ids, lengths = tok.encode(["it is blue"], max_len=4)
    >>> ids.tolist(), lengths.tolist()
    ([[4, 3, 1, 0]], [3])
    """

    PAD, UNK = "<pad>", "<unk>"
    pad_id, unk_id = 0, 1

    def __init__(self, itos: Sequence[str]) -> None:
        itos = list(itos)
        if itos[:2] != [self.PAD, self.UNK]:
            raise ValueError(f"a vocabulary must start with {[self.PAD, self.UNK]}, got {itos[:2]}")
        if len(set(itos)) != len(itos):
            raise ValueError("the vocabulary has duplicate tokens")
        self.itos = itos
        self.stoi = {t: i for i, t in enumerate(itos)}

    # -- building -------------------------------------------------------------------------
    @staticmethod
    def tokenize(text: str) -> list[str]:
        """Split one text into lower-cased tokens (curly apostrophes read as ``'``)."""
        return _TOKEN_RE.findall(_normalise(text))

    @classmethod
    def fit(cls, texts: Iterable[str], *, min_freq: int = 1,
            max_vocab: int | None = None) -> WordTokenizer:
        """Build the vocabulary from (training) texts.

        :param texts: the training texts only.
        :param min_freq: keep tokens seen at least this often.
        :param max_vocab: at most this many entries *including* the two specials.
        """
        if min_freq < 1:
            raise ValueError(f"min_freq must be >= 1, got {min_freq}")
        if max_vocab is not None and max_vocab < 2:
            raise ValueError(f"max_vocab must be >= 2 (the specials), got {max_vocab}")
        texts = list(texts)
        counts: Counter[str] = Counter()
        for start in range(0, len(texts), _COUNT_CHUNK):
            counts.update(cls.tokenize("\n".join(texts[start:start + _COUNT_CHUNK])))
        for special in (cls.PAD, cls.UNK):
            counts.pop(special, None)
        kept = sorted((t for t, c in counts.items() if c >= min_freq),
                      key=lambda t: (-counts[t], t))
        if max_vocab is not None:
            kept = kept[:max_vocab - 2]
        return cls([cls.PAD, cls.UNK, *kept])

    # -- encoding -------------------------------------------------------------------------
    def __len__(self) -> int:
        return len(self.itos)

    @property
    def vocab_size(self) -> int:
        """Number of embedding rows needed (specials included)."""
        return len(self.itos)

    def encode(self, texts: Sequence[str], max_len: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Token ids of ``texts``, truncated to ``max_len`` and right-padded with 0.

        An empty text becomes a single ``<unk>`` so every length is at least 1.

        :param texts: ``n`` strings.
        :param max_len: padded width ``N``.
        :returns: ``ids [n, N]`` long and ``lengths [n]`` long (number of real tokens).
        """
        if max_len < 1:
            raise ValueError(f"max_len must be >= 1, got {max_len}")
        get, unk = self.stoi.get, self.unk_id
        flat: list[int] = []
        lengths = np.empty(len(texts), dtype=np.int64)
        for i, text in enumerate(texts):
            ids = [get(t, unk) for t in _head(text, max_len)] or [unk]
            flat.extend(ids)
            lengths[i] = len(ids)
        out = np.zeros((len(texts), max_len), dtype=np.int64)
        rows = np.repeat(np.arange(len(texts)), lengths)
        cols = np.arange(len(flat)) - np.repeat(np.cumsum(lengths) - lengths, lengths)
        out[rows, cols] = flat
        return torch.from_numpy(out), torch.from_numpy(lengths)

    def decode(self, ids: torch.Tensor | Sequence[int]) -> list[str]:
        """Tokens of one id sequence, padding dropped."""
        return [self.itos[i] for i in torch.as_tensor(ids).tolist() if i != self.pad_id]

    # -- persistence ----------------------------------------------------------------------
    def state_dict(self) -> dict:
        """A JSON-able description that :meth:`from_state_dict` restores."""
        return {"kind": "word", "version": 1, "itos": list(self.itos)}

    @classmethod
    def from_state_dict(cls, state: dict) -> WordTokenizer:
        """Rebuild a tokenizer saved with :meth:`state_dict`."""
        if state.get("kind") != "word":
            raise ValueError(f"not a WordTokenizer state (kind={state.get('kind')!r})")
        return cls(state["itos"])

    def __repr__(self) -> str:
        return f"WordTokenizer(vocab_size={self.vocab_size})"
