r"""Use a trained run: :func:`load_run` -> :class:`Predictor` -> per-input predictions.

``load_run(run_dir)`` restores what ``train`` stored in the run folder
(:mod:`~gpattn_ppl.run.rundir`): the config, the sizes the data decided, the input encoder
(vocabulary or encoder settings, ``encoder.json``), the ``best.pt`` weights (weights only) and,
when the run was evaluated with temperature scaling, its temperature; every file is read through
:func:`~gpattn_ppl.run.runfolder.open_run`. No dataset is read and no code is imported: a run
trained with ``--import MODULE`` needs that module imported first.

For inputs :math:`x_i` and :math:`T` passes with logits :math:`\ell_{t,i}` and temperature
:math:`\tau` (1 without temperature scaling), the per-pass probabilities are
:math:`p_{t,i} = \mathrm{softmax}(\ell_{t,i} / \tau)`; :meth:`Predictor.predict` turns them into
one record per input with the keys ``label``, ``score``, ``probs``, ``entropy`` and
``mutual_info`` (``None`` for one pass: a deterministic network or the posterior mean), the
library's one prediction schema (:mod:`gpattn_ppl.metrics.records`, also the schema of
``gpattn-ppl predict`` and of the Hugging Face pipeline).
"""

from __future__ import annotations

from pathlib import Path

import torch

__all__ = ["Predictor", "load_run", "read_inputs"]


class Predictor:
    """A trained network with its input encoder, class names and temperature.

    Build it with :func:`load_run`.

    :ivar classes: class names in index order (``probs`` keys, ``label`` values).
    :ivar temperature: the fitted temperature (1.0 when the run has none or it is disabled).
    :ivar stochastic: whether the network draws (then ``samples`` passes are averaged).
    :ivar config: the run's validated config.
    """

    def __init__(self, program, encoder, classes: list[str], *, temperature: float,
                 config: dict, device: torch.device, run_dir: Path) -> None:
        self.program, self.encoder, self.classes = program, encoder, list(classes)
        self.temperature, self.config, self.device = float(temperature), config, device
        self.run_dir = run_dir
        self.stochastic = bool(program.net.stochastic)

    def __repr__(self) -> str:
        return (f"Predictor({self.run_dir}, classes={self.classes}, "
                f"temperature={self.temperature:.4g}, stochastic={self.stochastic})")

    def predict_proba(self, inputs, *, samples: int | None = None, batch_size: int = 256,
                      seed: int = 0, mean: bool | None = None) -> torch.Tensor:
        """Per-pass tempered class probabilities ``[T, n, K]`` (float64, CPU).

        :param inputs: texts (a list of str), or for image runs a uint8 tensor
            ``[n, 3, H, W]`` or a list of image paths.
        :param samples: passes ``T`` (default ``eval.mc_samples`` of the run; 1 for
            deterministic networks).
        :param seed: seeds the passes, so a call is reproducible (the global RNG is untouched).
        :param mean: one pass at the units' posterior means (MC dropout off; ``T = 1``, no
            mutual information) instead of ``samples`` draws (default: the run's
            ``eval.predictive``, unless ``samples`` is given). The temperature is the one the
            run's evaluation fitted.
        :raises ValueError: ``mean=True`` with ``samples``.
        """
        from ..infer import predict

        if isinstance(inputs, str):
            raise TypeError("inputs must be a list of texts (got one str; wrap it in a list)")
        if len(inputs) == 0:
            raise ValueError("inputs is empty")
        if mean and samples is not None:
            raise ValueError("mean=True is one pass; it takes no samples")
        if mean is None:   # asked-for samples are MC passes, whatever the run's default
            mean = samples is None and self.config["eval"]["predictive"] == "mean"
        T = self.config["eval"]["mc_samples"] if samples is None else int(samples)
        if T < 1:
            raise ValueError(f"samples must be >= 1, got {T}")
        dataset = self.encoder.dataset(inputs)
        devices = [self.device] if self.device.type == "cuda" else []
        with torch.random.fork_rng(devices=devices):
            torch.manual_seed(seed)
            out = predict(self.program, dataset, num_samples=T, batch_size=batch_size,
                          device=self.device, precision=self.config["train"]["precision"],
                          mean=mean)
        return torch.softmax(out["logits"].double() / self.temperature, -1)

    def predict(self, inputs, *, samples: int | None = None, batch_size: int = 256,
                seed: int = 0, mean: bool | None = None) -> list[dict]:
        """One record per input: ``label`` (the most probable class name), ``score`` (its
        probability), ``probs`` (class name -> probability, the mean over the passes),
        ``entropy`` and ``mutual_info`` (``None`` for one pass: a deterministic network or
        ``mean``), as :func:`~gpattn_ppl.metrics.prediction_records` defines them.

        See :meth:`predict_proba` for the arguments.
        """
        from ..metrics.records import prediction_records

        p = self.predict_proba(inputs, samples=samples, batch_size=batch_size, seed=seed,
                               mean=mean)
        return prediction_records(p, self.classes)


def load_run(run_dir: str | Path, *, device: str | torch.device = "cpu",
             temperature: bool = True, checkpoint: str | Path | None = None) -> Predictor:
    """Restore a trained run folder for prediction.

    :param run_dir: a folder written by ``gpattn-ppl train`` (or
        :class:`~gpattn_ppl.run.experiment.Trainer`).
    :param device: where to run the network (``"auto"``: CUDA when available).
    :param temperature: apply the run's fitted temperature (recorded in ``results.json``) if it
        has one.
    :param checkpoint: ``arch: hf`` runs: the pretrained checkpoint folder, where it is not at
        the absolute path the run recorded (never looked up in the current directory); its
        digest must be the recorded one.
    :raises RunFolderError: not a run folder, one written by an older version, an invalid file
        in it, or a config that needs a plugin not imported (the run records its ``--import``
        modules; they are never imported from a run folder: import them first).
    :raises CheckpointError: ``best.pt`` missing, corrupt, unsafe or of another model.
    :raises ~gpattn_ppl.data.hf_folder.HFFolderError: ``arch: hf``: the checkpoint folder is
        gone, asks to run code, or is not the one trained with (config, tokenizer or weights
        digest differs; both named).
    """
    from ..infer import PyroProgram
    from .assembly import build_net
    from .runfolder import open_run
    from .runtime import select_device

    folder = open_run(run_dir)
    cfg, manifest = dict(folder.config), folder.manifest
    encoder = folder.encoder(checkpoint=checkpoint)
    cfg = folder.pin_checkpoint(cfg, encoder)  # the model from the tokenizer's checked folder
    tau = folder.temperature() if temperature else None
    device = select_device(device) if isinstance(device, str) else torch.device(device)
    net = build_net(cfg, manifest["sizes"]).to(device)
    folder.load_weights(net, "best.pt", map_location=device)
    net.eval()
    num_data = max(int(manifest["data"].get("split_sizes", {}).get("train", 1)), 1)
    program = PyroProgram(net, num_data, cfg["train"]["objective"], mode=cfg["train"]["mode"],
                          total_epochs=cfg["train"]["epochs"])
    return Predictor(program, encoder, manifest["classes"], temperature=tau or 1.0, config=cfg,
                     device=device, run_dir=folder.path)


def read_inputs(path: str | Path, text_column: str | None = None) -> list[str]:
    r"""Texts to predict from a file: ``.txt`` (one text per line, blank lines skipped, read by
    :func:`gpattn_ppl.data.read_text_lines`: a byte-order mark is dropped and only ``\n`` /
    ``\r\n`` end a line), ``.csv`` / ``.tsv`` (column ``text`` or ``text_column``; other columns
    ignored) or ``.jsonl`` (key ``text`` or ``text_column``), read by
    :func:`gpattn_ppl.data.read_texts`.

    :raises FileNotFoundError: no such file.
    :raises ValueError: an unknown extension, a missing column / key, an empty text, invalid
        JSON or UTF-8 (the message names the file and line).
    """
    from ..data import read_text_lines, read_texts

    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"--input: no such file: {path}")
    suffix = path.suffix.lower()
    if suffix not in (".txt", ".csv", ".tsv", ".jsonl"):
        raise ValueError(f"--input {path}: unknown file type {suffix!r}; use .txt (one text per "
                         "line), .csv / .tsv (a text column) or .jsonl")
    if suffix != ".txt":
        return read_texts(path, fmt="jsonl" if suffix == ".jsonl" else "csv",
                          text_column=text_column or "text")
    if text_column is not None:
        raise ValueError("--text-column applies to .csv / .tsv / .jsonl inputs, not .txt")
    texts = read_text_lines(path)  # BOM dropped; lines end at \n or \r\n only
    if not texts:
        raise ValueError(f"--input {path}: no text (every line is blank)")
    return texts
