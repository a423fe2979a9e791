"""Test-session settings, read from the environment (the Pyro habit).

* ``GPATTN_PPL_TEST_DTYPE``: ``float32`` or ``float64`` -- the default dtype of tensors created in
  tests that do not choose one (default: torch's, float32);
* ``GPATTN_PPL_TEST_DEVICE``: ``cpu`` (default) or ``cuda`` -- the default device;
* ``GPATTN_PPL_TEST_SEED``: an integer (default 0) -- torch, Pyro, NumPy and ``random`` are seeded
  with it before every test, so a failure reproduces alone.

Pyro's argument validation and the library's (:class:`gpattn_ppl.settings.validate_args`) are
on; warnings are errors (``pyproject.toml``). A malformed value stops the session with a message
naming the variable.
"""

from __future__ import annotations

import os
import random

import numpy as np
import pyro
import pytest
import torch

_DTYPES = {"float32": torch.float32, "float64": torch.float64}


def _env(name: str, default: str, allowed: tuple[str, ...] | None = None) -> str:
    value = os.environ.get(name, default).strip()
    if allowed is not None and value not in allowed:
        raise pytest.UsageError(f"{name}={value!r}: allowed values are {', '.join(allowed)}")
    return value


DTYPE = _env("GPATTN_PPL_TEST_DTYPE", "", ("", "float32", "float64"))
DEVICE = _env("GPATTN_PPL_TEST_DEVICE", "cpu", ("cpu", "cuda"))
_seed = _env("GPATTN_PPL_TEST_SEED", "0")
if not _seed.lstrip("-").isdigit():
    raise pytest.UsageError(f"GPATTN_PPL_TEST_SEED={_seed!r}: expected an integer")
SEED = int(_seed)


def pytest_configure(config):
    if DEVICE == "cuda" and not torch.cuda.is_available():
        raise pytest.UsageError("GPATTN_PPL_TEST_DEVICE=cuda but CUDA is not available")
    if DTYPE:
        torch.set_default_dtype(_DTYPES[DTYPE])
    if DEVICE != "cpu":
        torch.set_default_device(DEVICE)
    pyro.enable_validation(True)


def pytest_report_header(config):
    return (f"gpattn_ppl tests: dtype={DTYPE or 'torch default'}, device={DEVICE}, "
            f"seed={SEED}")


@pytest.fixture(autouse=True)
def _seed_and_validate():
    """Seed every RNG, clear Pyro's parameter store and the numerics counter (and its
    warned-once places, so a test that escalates a jitter warns whatever ran before it)."""
    from gpattn_ppl import linalg, settings

    random.seed(SEED)
    np.random.seed(SEED)
    torch.manual_seed(SEED)
    pyro.set_rng_seed(SEED)
    pyro.clear_param_store()
    linalg.reset_numerics_stats(warned=True)
    with settings.validate_args(True):
        yield


@pytest.fixture
def dtype() -> torch.dtype:
    """The session's test dtype (float64 unless ``GPATTN_PPL_TEST_DTYPE`` says otherwise)."""
    return _DTYPES[DTYPE or "float64"]


@pytest.fixture
def device() -> torch.device:
    """The session's test device."""
    return torch.device(DEVICE)


@pytest.fixture
def quiet_transformers():
    """No ``transformers`` progress bars (``save_pretrained`` / ``from_pretrained``) during the
    test; the setting is restored after it."""
    transformers = pytest.importorskip("transformers")
    bar = transformers.utils.logging.is_progress_bar_enabled()
    transformers.utils.logging.disable_progress_bar()
    yield
    if bar:
        transformers.utils.logging.enable_progress_bar()


# -- a tiny pretrained checkpoint for the arch: hf tests --------------------------------------
TINY_BERT_WORDS = ("the a cat dog sat on mat john mary seems to be happy what did you say that "
                   "bought she kissed herself him went store yesterday quickly more eat fatter get "
                   "is was").split()


def word_piece_tokenizer(folder, reverse: bool = False) -> None:
    """Save into ``folder`` a word-piece tokenizer over :data:`TINY_BERT_WORDS` (in their order,
    or reversed: other ids for the same words), built with the ``tokenizers`` library: the same
    ids on every ``transformers`` version (``BertTokenizerFast(vocab_file=...)`` ignores the
    file on 5.x and maps every word to ``[UNK]``). Any tokenizer files there are replaced."""
    transformers = pytest.importorskip("transformers")
    from tokenizers import Tokenizer, models, normalizers, pre_tokenizers, processors

    words = list(dict.fromkeys(TINY_BERT_WORDS))
    vocab = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", ".", ",", "?",
             *(words[::-1] if reverse else words)]
    tk = Tokenizer(models.WordPiece(vocab={w: i for i, w in enumerate(vocab)},
                                    unk_token="[UNK]"))
    tk.normalizer = normalizers.BertNormalizer(lowercase=True)
    tk.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    tk.post_processor = processors.TemplateProcessing(
        single="[CLS] $A [SEP]", pair="[CLS] $A [SEP] $B:1 [SEP]:1",
        special_tokens=[("[CLS]", 2), ("[SEP]", 3)])
    for name in ("vocab.txt", "tokenizer.json", "tokenizer_config.json",
                 "special_tokens_map.json"):
        (folder / name).unlink(missing_ok=True)
    transformers.PreTrainedTokenizerFast(
        tokenizer_object=tk, unk_token="[UNK]", pad_token="[PAD]", cls_token="[CLS]",
        sep_token="[SEP]", mask_token="[MASK]").save_pretrained(str(folder))
    return len(vocab)


@pytest.fixture(scope="module")
def tiny_checkpoint(tmp_path_factory):
    """A 2-layer BERT (width 16, 4 heads) with a word-piece tokenizer of the test words
    (:func:`word_piece_tokenizer`), saved to disk (the ``arch: hf`` tests of ``tests/models``,
    ``tests/infer`` and ``tests/faults``)."""
    transformers = pytest.importorskip("transformers")
    path = tmp_path_factory.mktemp("tiny_bert")
    size = word_piece_tokenizer(path)
    torch.manual_seed(0)
    cfg = transformers.BertConfig(vocab_size=size, hidden_size=16, num_hidden_layers=2,
                                  num_attention_heads=4, intermediate_size=32,
                                  max_position_embeddings=64)
    transformers.BertModel(cfg).save_pretrained(str(path))
    return path
