"""Input encoders: turn new texts or images into an :class:`ArrayDataset` exactly as a
:class:`~gpattn_ppl.data.DataBundle`'s splits were encoded.

:func:`~gpattn_ppl.data.load_data` encodes its splits with one of these and stores its JSON-able
:meth:`InputEncoder.state_dict` as ``DataBundle.encoder_state``; :func:`encoder_from_state`
rebuilds the encoder later (e.g. to predict on new inputs with a trained run).

>>> from gpattn_ppl.data import WordTokenizer
>>> enc = LearnedTextEncoder(WordTokenizer.fit(["a good day", "a bad day"]), max_len=4)
>>> ds = encoder_from_state(enc.state_dict()).dataset(["a good night"])
>>> ds.x.tolist(), ds.y.tolist()
([[2, 5, 1, 0]], [-1])
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import numpy as np
import torch
from PIL import Image

from .cifar import Normalize
from .dataset import ArrayDataset
from .image_folder import read_images
from .pretrained import _MODEL_ID, MiniLMEncoder
from .tokenizer import WordTokenizer

__all__ = ["ENCODER_KINDS", "HFTokenEncoder", "ImageEncoder", "InputEncoder",
           "LearnedTextEncoder", "MiniLMTextEncoder", "encoder_from_state"]

#: ``encoder_state["kind"]`` -> the keys such a state must hold.
ENCODER_KINDS: dict[str, tuple[str, ...]] = {
    "learned": ("itos", "max_len"),
    "minilm": ("max_len",),
    "hf": ("checkpoint", "max_len"),
    "image": ("image_size", "mean", "std"),
}


def _float32(x: torch.Tensor) -> torch.Tensor:
    """Batch transform of stored float16 features: to float32."""
    return x.float()


class InputEncoder:
    """Base class: ``encode(inputs) -> (x, lengths or None)`` plus the batch ``transform``.

    :ivar kind: ``"learned"``, ``"minilm"`` or ``"image"`` (the state's ``kind``).
    :ivar input_kind: ``"tokens"``, ``"features"`` or ``"image"`` (as ``DataBundle.input_kind``).
    :ivar transform: the :class:`ArrayDataset` batch transform, or ``None``.
    """

    kind: str = ""
    input_kind: str = ""
    transform = None

    def encode(self, inputs) -> tuple[torch.Tensor, torch.Tensor | None]:
        """``(x, lengths)`` of ``inputs`` (``lengths`` is ``None`` for images)."""
        raise NotImplementedError

    def state_dict(self) -> dict:
        """A JSON-able description that :func:`encoder_from_state` restores."""
        raise NotImplementedError

    def dataset(self, inputs, name: str = "inputs") -> ArrayDataset:
        """``inputs`` encoded as an :class:`ArrayDataset` with every label -1 (unknown).

        :param inputs: a list of texts (text encoders); a ``[n, 3, H, W]`` uint8 tensor or a
            list of image file paths (image encoder).
        :param name: the dataset's name.
        """
        x, lengths = self.encode(inputs)
        y = torch.full((x.shape[0],), -1, dtype=torch.long)
        return ArrayDataset(x, y, lengths, name=name, transform=self.transform)

    def __repr__(self) -> str:
        fields = {k: v for k, v in self.state_dict().items() if k != "itos"}
        return f"{type(self).__name__}({', '.join(f'{k}={v!r}' for k, v in fields.items())})"


def _texts(inputs) -> list[str]:
    if isinstance(inputs, str) or not isinstance(inputs, Sequence):
        raise ValueError(f"expected a list of texts, got {type(inputs).__name__}")
    bad = [i for i, t in enumerate(inputs) if not isinstance(t, str)]
    if bad:
        raise ValueError(f"input {bad[0]} is {type(inputs[bad[0]]).__name__}, not a text")
    if not inputs:
        raise ValueError("no texts to encode")
    return list(inputs)


def _max_len(value, key: str = "max_len") -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"encoder_state: {key!r} must be an int >= 1, got {value!r}")
    return value


class LearnedTextEncoder(InputEncoder):
    """Word ids from a fitted :class:`WordTokenizer`, ``x [n, max_len]`` long (0 = padding).

    :param tokenizer: the tokenizer, or its vocabulary (``itos``).
    :param max_len: tokens kept per text.
    """

    kind, input_kind = "learned", "tokens"

    def __init__(self, tokenizer: WordTokenizer | Sequence[str], max_len: int) -> None:
        self.tokenizer = (tokenizer if isinstance(tokenizer, WordTokenizer)
                          else WordTokenizer(tokenizer))
        self.max_len = _max_len(max_len)

    def encode(self, inputs: Sequence[str]) -> tuple[torch.Tensor, torch.Tensor]:
        return self.tokenizer.encode(_texts(inputs), max_len=self.max_len)

    def state_dict(self) -> dict:
        return {"kind": self.kind, "itos": list(self.tokenizer.itos), "max_len": self.max_len}


class MiniLMTextEncoder(InputEncoder):
    """Frozen all-MiniLM-L6-v2 per-token features, ``x [n, N, 384]`` float16 (float32 in
    batches); the model is built on the first ``encode`` (needs the ``text`` extra).

    :param max_len: word pieces kept per text, ``[CLS]``/``[SEP]`` included.
    :param cache_dir: feature cache folder (see :class:`MiniLMEncoder`); ``None``: no cache.
    :param device: where the model runs.
    :param batch_size: texts per forward pass.
    """

    kind, input_kind = "minilm", "features"
    transform = staticmethod(_float32)
    feature_dim = MiniLMEncoder.feature_dim

    def __init__(self, max_len: int, *, cache_dir: str | Path | None = None,
                 device: str | torch.device = "cpu", batch_size: int = 64) -> None:
        if _max_len(max_len) < 2:
            raise ValueError(f"encoder_state: 'max_len' must be >= 2 for MiniLM, got {max_len}")
        self.max_len, self.cache_dir = max_len, cache_dir
        self.device, self.batch_size = device, int(batch_size)
        self._model: MiniLMEncoder | None = None

    def encode(self, inputs: Sequence[str]) -> tuple[torch.Tensor, torch.Tensor]:
        texts = _texts(inputs)
        if self._model is None:
            self._model = MiniLMEncoder(self.cache_dir, device=self.device,
                                        batch_size=self.batch_size)
        return self._model.encode(texts, max_len=self.max_len)

    def state_dict(self) -> dict:
        return {"kind": self.kind, "max_len": self.max_len, "model": _MODEL_ID,
                "feature_dim": self.feature_dim}


class HFTokenEncoder(InputEncoder):
    """Word-piece ids of a pretrained checkpoint's own (fast) tokenizer, ``x [n, N]`` long
    (``[CLS]``/``[SEP]`` included, truncated to ``max_len``, padded with the tokenizer's pad
    id; the mask comes from the lengths), for :class:`~gpattn_ppl.models.HFClassifier`.

    Its state records the checkpoint by content: ``path`` (the absolute folder) and ``digest``
    (:func:`~gpattn_ppl.data.hf_folder.folder_digest`: sha256 of the config, the tokenizer files
    and the weights); :func:`encoder_from_state` finds the folder again from them
    (:func:`~gpattn_ppl.data.hf_folder.locate_checkpoint`), never from the current directory.

    :param checkpoint: ``"all-MiniLM-L6-v2"`` or a local Hugging Face model folder (its
        tokenizer files are read; nothing is downloaded; needs the ``text`` extra).
    :param max_len: word pieces kept per text.
    :param record: ``{"path", "digest"}`` as recorded (default: computed from ``checkpoint``
        when the state is first asked for).
    :param folder: the folder to read the tokenizer from (default: ``checkpoint``'s).
    """

    kind, input_kind = "hf", "tokens"

    def __init__(self, checkpoint: str, max_len: int, *, record: dict | None = None,
                 folder: str | Path | None = None) -> None:
        if _max_len(max_len) < 2:
            raise ValueError(f"encoder_state: 'max_len' must be >= 2 ([CLS] and [SEP]), got "
                             f"{max_len}")
        if not isinstance(checkpoint, str) or not checkpoint:
            raise ValueError(f"encoder_state: 'checkpoint' must be a non-empty string, got "
                             f"{checkpoint!r}")
        self.checkpoint, self.max_len = checkpoint, max_len
        self._record = None if record is None else dict(record)
        #: where the tokenizer is read from
        self.folder = None if folder is None else Path(folder)
        self._tokenizer = None

    @property
    def tokenizer(self):
        if self._tokenizer is None:
            from .pretrained import load_tokenizer
            self._tokenizer = load_tokenizer(self.checkpoint if self.folder is None
                                             else self.folder)
        return self._tokenizer

    @property
    def vocab_size(self) -> int:
        return len(self.tokenizer)

    def encode(self, inputs: Sequence[str]) -> tuple[torch.Tensor, torch.Tensor]:
        texts = _texts(inputs)
        ids = self.tokenizer(texts, truncation=True, max_length=self.max_len)["input_ids"]
        lengths = torch.tensor([len(i) for i in ids], dtype=torch.long)
        pad = self.tokenizer.pad_token_id or 0
        x = torch.full((len(ids), int(lengths.max())), pad, dtype=torch.long)
        for r, row in enumerate(ids):
            x[r, :len(row)] = torch.tensor(row, dtype=torch.long)
        return x, lengths

    def state_dict(self) -> dict:
        if self._record is None:
            from .hf_folder import checkpoint_record

            self._record = checkpoint_record(self.checkpoint if self.folder is None
                                             else self.folder)
        return {"kind": self.kind, "checkpoint": self.checkpoint, "max_len": self.max_len,
                **self._record}


def _stats(value, key: str) -> tuple[float, ...]:
    if (not isinstance(value, (list, tuple)) or len(value) != 3
            or not all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in value)):
        raise ValueError(f"encoder_state: {key!r} must be 3 numbers (one per channel), got "
                         f"{value!r}")
    return tuple(float(v) for v in value)


class ImageEncoder(InputEncoder):
    """RGB images as ``x [n, 3, S, S]`` uint8, standardised per channel in batches.

    :param image_size: side ``S`` images are resized to (bicubic, with Pillow); ``None``: kept.
    :param mean: per-channel means in [0, 1] units.
    :param std: per-channel standard deviations in [0, 1] units.
    """

    kind, input_kind = "image", "image"

    def __init__(self, image_size: int | None, mean: Sequence[float],
                 std: Sequence[float]) -> None:
        self.image_size = None if image_size is None else _max_len(image_size, "image_size")
        self.mean, self.std = _stats(mean, "mean"), _stats(std, "std")
        if min(self.std) <= 0:
            raise ValueError(f"encoder_state: 'std' must be positive, got {list(self.std)}")
        self.transform = Normalize(self.mean, self.std)

    def encode(self, inputs) -> tuple[torch.Tensor, None]:
        """``inputs``: ``[n, 3, H, W]`` uint8 (resized when ``H, W != S``) or image paths."""
        size = self.image_size
        if isinstance(inputs, torch.Tensor):
            if inputs.dtype != torch.uint8 or inputs.ndim != 4 or inputs.shape[1] != 3:
                raise ValueError(f"expected images [n, 3, H, W] uint8, got {inputs.dtype} "
                                 f"{tuple(inputs.shape)}")
            if len(inputs) == 0:
                raise ValueError("no images to encode")
            if size is None or tuple(inputs.shape[2:]) == (size, size):
                return inputs.contiguous(), None
            hwc = inputs.permute(0, 2, 3, 1).numpy()
            resized = [np.asarray(Image.fromarray(np.ascontiguousarray(im)).resize(
                (size, size), Image.Resampling.BICUBIC)) for im in hwc]
            return torch.from_numpy(np.stack(resized).transpose(0, 3, 1, 2).copy()), None
        if isinstance(inputs, (str, Path)) or not isinstance(inputs, Sequence):
            raise ValueError("expected images [n, 3, H, W] uint8 or a list of image paths, got "
                             f"{type(inputs).__name__}")
        return read_images(list(inputs), size), None

    def state_dict(self) -> dict:
        return {"kind": self.kind, "image_size": self.image_size, "mean": list(self.mean),
                "std": list(self.std)}


def encoder_from_state(state: dict, *, cache_dir: str | Path | None = None,
                       device: str | torch.device = "cpu", checkpoint: str | Path | None = None,
                       where: str = "encoder_state") -> InputEncoder:
    """Rebuild the encoder described by ``state`` (``DataBundle.encoder_state``).

    :param state: ``{"kind": "learned", "itos", "max_len"}``, ``{"kind": "minilm", "max_len"}``
        (optional ``model``, ``feature_dim``, ``batch_size``), ``{"kind": "hf", "checkpoint",
        "max_len"}`` or ``{"kind": "image", "image_size", "mean", "std"}``.
    :param cache_dir: MiniLM only: feature cache folder.
    :param device: MiniLM only: where the model runs.
    :param checkpoint: ``hf`` only: the checkpoint folder to use instead of the recorded one
        (its digest is checked all the same).
    :param where: how errors name the state (e.g. the ``encoder.json`` file).
    :raises ValueError: not a dict, an unknown kind, a missing key or a bad value (the message
        names the key).
    :raises ~gpattn_ppl.data.hf_folder.HFFolderError: ``hf``: the checkpoint folder is gone,
        breaks a rule of :func:`~gpattn_ppl.data.hf_folder.check_model_folder` or is not the one
        recorded (:func:`~gpattn_ppl.data.hf_folder.locate_checkpoint`).
    """
    if not isinstance(state, dict):
        raise ValueError(f"encoder_state must be a dict, got {type(state).__name__}")
    if "kind" not in state:
        raise ValueError(f"encoder_state: missing key 'kind' (one of {', '.join(ENCODER_KINDS)})")
    kind = state["kind"]
    if kind not in ENCODER_KINDS:
        raise ValueError(f"encoder_state: unknown kind {kind!r}; allowed: "
                         f"{', '.join(ENCODER_KINDS)}")
    missing = [k for k in ENCODER_KINDS[kind] if k not in state]
    if missing:
        raise ValueError(f"encoder_state: missing key {missing[0]!r} (kind {kind!r} needs "
                         f"{', '.join(ENCODER_KINDS[kind])})")
    if kind == "learned":
        itos = state["itos"]
        if not isinstance(itos, list) or not all(isinstance(t, str) for t in itos):
            raise ValueError("encoder_state: 'itos' must be a list of tokens")
        try:
            tokenizer = WordTokenizer(itos)
        except ValueError as err:
            raise ValueError(f"encoder_state: 'itos': {err}") from None
        return LearnedTextEncoder(tokenizer, state["max_len"])
    if kind == "minilm":
        model = state.get("model", _MODEL_ID)
        if model != _MODEL_ID:
            raise ValueError(f"encoder_state: 'model' {model!r} is not {_MODEL_ID!r}, the only "
                             "MiniLM model this library runs")
        dim = state.get("feature_dim", MiniLMEncoder.feature_dim)
        if dim != MiniLMEncoder.feature_dim:
            raise ValueError(f"encoder_state: 'feature_dim' {dim!r} != "
                             f"{MiniLMEncoder.feature_dim}")
        return MiniLMTextEncoder(state["max_len"], cache_dir=cache_dir, device=device,
                                 batch_size=state.get("batch_size", 64))
    if kind == "hf":
        from .hf_folder import locate_checkpoint

        if not isinstance(state["checkpoint"], str) or not state["checkpoint"]:
            raise ValueError(f"encoder_state: 'checkpoint' must be a non-empty string, got "
                             f"{state['checkpoint']!r}")
        _max_len(state["max_len"])
        folder = locate_checkpoint(state, checkpoint, where=where)
        record = {k: state[k] for k in ("path", "digest") if k in state}
        return HFTokenEncoder(state["checkpoint"], state["max_len"], record=record or None,
                              folder=folder)
    return ImageEncoder(state["image_size"], state["mean"], state["std"])
