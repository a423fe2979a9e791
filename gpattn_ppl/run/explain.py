r"""One sentence through a trained run (:func:`explain_sentence`): the attention of a unit,
per-token uncertainty, and the class probabilities (``gpattn-ppl explain RUN "text"``).

For a text :math:`x` with :math:`N` tokens and a unit with :math:`H` heads,
:func:`explain_sentence` reports

* the unit's attention matrices :math:`A_h \in \mathbb R^{N \times N}` (rows: queries,
  columns: keys; :meth:`~gpattn_ppl.attention.AttentionUnit.attention_matrix`, the posterior
  mean for stochastic units, whose weights may be negative, e.g. SGPA's; for KEP-SVGP, which
  weighs no values, the attention kernel its kernel-eigen pair reconstructs,
  :math:`E\Lambda^{-1}R^\top`) at the unit's input on this text;
* per-token uncertainty: the predictive variance of the unit's head outputs
  :math:`\frac1D\sum_d \mathrm{Var}[o_{h,n,d}]` per head :math:`h` and token :math:`n`
  (:meth:`~gpattn_ppl.attention.AttentionUnit.predictive`; 0 for deterministic units), and the
  Monte-Carlo variance of the unit's output over the :math:`T` passes,
  :math:`\frac1C\sum_c \mathrm{Var}_t[y^{(t)}_{n,c}]` (ddof 0), which every stochastic
  network has (MC dropout and the draws of earlier units included);
* the predictive :math:`\bar p = \frac1T\sum_t \mathrm{softmax}(\ell_t/\tau)` (the run's fitted
  temperature :math:`\tau` unless disabled), its entropy :math:`\mathcal H[\bar p]` and the
  mutual information :math:`\mathcal H[\bar p] - \frac1T\sum_t \mathcal H[p_t]` (``None`` for
  one pass), exactly as :meth:`~gpattn_ppl.run.predictor.Predictor.predict`.

The run is opened with :func:`~gpattn_ppl.run.predictor.load_run` and the text encoded by the
run's own input encoder, so the tokens are those the network saw in training. A
``save_pretrained`` folder of a swapped Hugging Face sequence classifier, its tokenizer beside it,
may stand in for the run folder (:func:`~gpattn_ppl.run.saved_model.load_predictor`): its units
are the swapped layers' (``--layer bert.encoder.layer.1.attention.unit``), the tokens are its
tokenizer's word pieces (``[CLS]`` and ``[SEP]`` included), ``T`` defaults to
:data:`~gpattn_ppl.run.saved_model.DEFAULT_SAMPLES` and the temperature is the config's
``gpattn_temperature`` (a folder written by ``gpattn-ppl export``; else none).
"""

from __future__ import annotations

import math
import os
from pathlib import Path

import numpy as np
import torch

__all__ = ["explain_sentence"]

#: classes shown in the probability panel (the most probable ones)
_TOP_CLASSES = 10


def _choose_unit(net, layer: str | None, what: str = "run"):
    """``(path, unit)``: ``layer`` by module path, else the last stochastic unit, else the last.
    ``net``: a run's network (its ``attention_units()``) or a swapped Hugging Face model."""
    if hasattr(net, "attention_units"):
        units = net.attention_units()
    else:
        from ..models.swap import attention_units

        units = attention_units(net)
    if not units:
        raise ValueError(f"this {what}'s network has no attention unit to explain (a pretrained "
                         "encoder without swapped units keeps its own attention); train with a "
                         "unit, e.g. model.swap or model.overrides (a save_pretrained folder: "
                         "swap one with gpattn_ppl.hf.swap before saving)")
    if layer is not None:
        if layer not in units:
            raise ValueError(f"--layer {layer!r}: no such attention unit; the {what} has "
                             f"{', '.join(units)}")
        return layer, units[layer]
    stochastic = [p for p, u in units.items() if u.stochastic]
    path = stochastic[-1] if stochastic else list(units)[-1]
    return path, units[path]


def _token_labels(encoder, text: str, n: int) -> list[str]:
    """The ``n`` tokens the encoder made of ``text`` (``*``: out of vocabulary), or positions
    when the encoder does not say."""
    labels: list[str] | None = None
    if encoder.kind == "learned":
        from ..data.tokenizer import WordTokenizer

        ids, length = encoder.encode([text])
        words = WordTokenizer.tokenize(text)
        tok = encoder.tokenizer
        labels = [tok.itos[int(i)] if int(i) != tok.unk_id else
                  (f"{words[j]}*" if j < len(words) else tok.itos[int(i)])
                  for j, i in enumerate(ids[0, :int(length[0])])]
    elif encoder.kind in ("hf", "minilm"):
        if encoder.kind == "hf":
            tokenizer = encoder.tokenizer
        else:
            from ..data.pretrained import load_tokenizer

            tokenizer = load_tokenizer("all-MiniLM-L6-v2")
        ids = tokenizer([text], truncation=True, max_length=encoder.max_len)["input_ids"][0]
        labels = tokenizer.convert_ids_to_tokens(ids)
    if labels is None or len(labels) != n:
        return [str(i) for i in range(n)]
    return labels


def _check_utf8(text: str) -> None:
    """Raise :class:`~gpattn_ppl.errors.DataError` for a text that is not Unicode text: bytes
    that were not UTF-8 (the command line passes them on as the surrogates ``U+DC80..U+DCFF``)
    or another lone surrogate, naming the first one."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as err:
        from ..errors import DataError

        code = ord(text[err.start])
        what = (f"byte 0x{code - 0xDC00:02x}" if 0xDC80 <= code <= 0xDCFF
                else f"a lone surrogate U+{code:04X}")
        raise DataError(f"text: not valid UTF-8 ({what} at character {err.start + 1}); give "
                        "the sentence as UTF-8") from None


def _capture(unit):
    """A forward hook on ``unit`` recording its inputs ``(x, mask)`` and every output."""
    record: dict = {"outputs": []}

    def hook(module, args, kwargs, output):
        if "x" not in record:
            record["x"] = (args[0] if args else kwargs["x"]).detach()
            mask = args[1] if len(args) > 1 else kwargs.get("mask")
            record["mask"] = None if mask is None else mask.detach()
            # a rotary host's (ModernBERT) positions, set by its adapter for the call
            record["rotary"] = getattr(module, "_rotary", None)
        record["outputs"].append(output.detach().float())

    return record, unit.register_forward_hook(hook, with_kwargs=True)


def explain_sentence(run_dir: str | os.PathLike, text: str, *,
                     out: str | os.PathLike | None = None, samples: int | None = None,
                     seed: int = 0, layer: str | None = None, device: str = "cpu",
                     temperature: bool = True, overwrite: bool = True) -> dict:
    """Explain one prediction of a trained run; draw the figure and return the numbers.

    :param run_dir: a run folder written by ``gpattn-ppl train``, or a ``save_pretrained``
        folder of a swapped Hugging Face sequence classifier with its tokenizer
        (:func:`~gpattn_ppl.run.saved_model.is_saved_model`).
    :param text: the input sentence.
    :param out: PNG path (default ``<run_dir>_explain.png`` beside the folder; never inside
        it).
    :param samples: passes ``T`` (default ``eval.mc_samples``, a folder's
        :data:`~gpattn_ppl.run.saved_model.DEFAULT_SAMPLES`; deterministic networks run once).
    :param seed: seeds the passes.
    :param layer: module path of the unit (default: the last stochastic unit, else the last
        unit), e.g. ``"blocks.1.attn"``, ``"bert.encoder.layer.1.attention.unit"``.
    :param temperature: apply the run's fitted temperature (a folder's ``gpattn_temperature``).
    :param overwrite: replace an existing figure (a regular file only; ``explain --out`` passes
        ``--force``): a link, a folder or a special file at ``out`` is refused either way.
    :returns: ``{"text", "tokens" [N], "layer", "unit", "temperature", "samples", "label",
        "score", "probs" {class: p}, "probs_std" {class: sd over passes}, "entropy",
        "mutual_info", "attention" [H][N][N], "predictive_variance" [H][N] or None,
        "mc_output_variance" [N] or None, "figure"}``; ``label``, ``score``, ``probs``,
        ``entropy`` and ``mutual_info`` are the keys of a prediction record
        (:meth:`~gpattn_ppl.run.predictor.Predictor.predict`).
    :raises ValueError: an empty text or one that is not UTF-8 (a
        :class:`~gpattn_ppl.errors.DataError`), a run without attention units, an unknown
        ``layer``, a folder the loader refuses (no tokenizer, no swap record, not a sequence
        classifier: :func:`~gpattn_ppl.run.saved_model.load_saved_model`), or
        ``out`` inside the run folder, a link, a folder or a special file, or an existing file
        without ``overwrite`` (:class:`gpattn_ppl.safe_files.UnsafePathError`).
    """
    from ..settings import posterior_mean
    from .saved_model import is_saved_model, load_predictor

    if not isinstance(text, str) or not text.strip():
        raise ValueError("text is empty; give a sentence to explain")
    _check_utf8(text)
    run_dir = Path(run_dir)
    folder = is_saved_model(run_dir)
    what = "model" if folder else "run"
    png = Path(out) if out is not None else run_dir.parent / f"{run_dir.name}_explain.png"
    if run_dir.resolve() in png.resolve().parents:
        raise ValueError(f"--out {png}: inside the {what} folder {run_dir}, where nothing but "
                         f"the {what}'s own files is written; write the figure elsewhere")
    from ..safe_files import check_output_file

    check_output_file(png, force=overwrite, example="why.png")  # before any work
    predictor = load_predictor(run_dir, device=device, temperature=temperature)
    net = predictor.net if folder else predictor.program.net
    path, unit = _choose_unit(net, layer, what)
    record, handle = _capture(unit)
    try:
        probs = predictor.predict_proba([text], samples=samples, seed=seed)[:, 0]  # [T, K]
    finally:
        handle.remove()
    x, mask = record["x"][:1], None if record["mask"] is None else record["mask"][:1]
    with torch.no_grad(), posterior_mean(True), unit.positions(record.get("rotary")):
        attn = unit.attention_matrix(x, mask)[0].double().cpu()            # [H, N, N]
        try:
            pv = unit.predictive(x, mask).variance[0].double().mean(-1).cpu()  # [H, N]
        except NotImplementedError:
            pv = None
    n = attn.shape[-1] if mask is None else int(mask[0].sum())
    attn = attn[:, :n, :n]
    pv = None if pv is None or float(pv.abs().max()) == 0.0 else pv[:, :n]
    outs = torch.stack(record["outputs"])[:, 0, :n]                          # [calls, N, C]
    mc = (outs.double().var(0, unbiased=False).mean(-1).cpu()
          if probs.shape[0] > 1 and len(outs) > 1 else None)
    mean = probs.mean(0)
    entropy = float(-torch.special.xlogy(mean, mean).sum())
    mi = (max(entropy + float(torch.special.xlogy(probs, probs).sum(-1).mean()), 0.0)
          if probs.shape[0] > 1 else None)
    classes = predictor.classes
    sd = probs.std(0, unbiased=False)
    result = {
        "text": text, "tokens": _token_labels(predictor.encoder, text, n), "layer": path,
        "unit": type(unit).__name__, "temperature": predictor.temperature,
        "samples": int(probs.shape[0]), "label": classes[int(mean.argmax())],
        "score": float(mean.max()), "probs": {c: float(p) for c, p in zip(classes, mean)},
        "probs_std": {c: float(s) for c, s in zip(classes, sd)},
        "entropy": entropy, "mutual_info": mi,
        "attention": attn.tolist(),
        "predictive_variance": None if pv is None else pv.tolist(),
        "mc_output_variance": None if mc is None else mc.tolist(),
    }
    result["figure"] = str(_draw(result, png, overwrite))
    return result


def _draw(r: dict, png: Path, overwrite: bool = True) -> Path:
    """The figure of :func:`explain_sentence`: attention per head (one shared colour bar), per-token
    predictive variance (heads x tokens, colour bar) and MC output variance, class
    probabilities (the top ones, ±1 s.d. over passes)."""
    from matplotlib.figure import Figure

    from .plotting import _save

    attn = np.asarray(r["attention"])
    H, N = attn.shape[0], attn.shape[-1]
    tokens = r["tokens"]
    ncols = min(H, 4)
    nrows = math.ceil(H / ncols)
    cell = min(max(2.6, 0.2 * N + 1.0), 5.0)
    width = max(ncols * cell + 1.2, 11.0)
    fig = Figure(figsize=(width, nrows * cell + 4.4), layout="constrained")
    top, bottom = fig.subfigures(2, 1, height_ratios=[nrows * cell, 4.0])
    unit = f"{r['unit']} at {r['layer']}"
    top.suptitle(f"Attention of {unit} (posterior mean), rows: queries, columns: keys",
                 fontsize="medium")
    axes = top.subplots(nrows, ncols, squeeze=False)
    font = "xx-small" if N > 24 else "x-small"
    # one colour scale for every head; a diverging one centred at 0 when weights are negative
    # (the posterior-mean weights of a kernel / GP unit need not be a softmax)
    signed = bool(attn.min() < 0)
    vmax = float(np.abs(attn).max()) or 1.0
    cmap, vmin = ("RdBu_r", -vmax) if signed else ("viridis", 0.0)
    for h, ax in enumerate(axes.ravel()):
        if h >= H:
            ax.set_visible(False)
            continue
        im = ax.imshow(attn[h], cmap=cmap, vmin=vmin, vmax=vmax, aspect="equal")
        ax.set_title(f"head {h}", fontsize="small")
        ax.set_xticks(range(N), tokens, rotation=90, fontsize=font)
        ax.set_yticks(range(N), tokens, fontsize=font)
    top.colorbar(im, ax=axes.ravel().tolist(), shrink=0.8, label="attention weight")

    left, right = bottom.subfigures(1, 2, width_ratios=[1.6, 1.0])
    pv_ax, mc_ax = left.subplots(2, 1, sharex=True)
    if r["predictive_variance"] is not None:
        pv = np.asarray(r["predictive_variance"])
        im = pv_ax.imshow(pv, cmap="magma", aspect="auto")
        left.colorbar(im, ax=pv_ax, label="variance")
        pv_ax.set_yticks(range(H), [f"head {h}" for h in range(H)], fontsize="x-small")
        pv_ax.set_title("Predictive variance of the head outputs (mean over channels)",
                        fontsize="small")
    else:
        pv_ax.text(0.5, 0.5, "no predictive variance: deterministic unit", ha="center",
                   va="center", transform=pv_ax.transAxes)
        pv_ax.set_yticks([])
    if r["mc_output_variance"] is not None:
        mc_ax.bar(range(N), r["mc_output_variance"], color="tab:purple")
        mc_ax.set_ylabel(f"output variance\nover T = {r['samples']} passes", fontsize="small")
        mc_ax.ticklabel_format(axis="y", style="sci", scilimits=(-2, 3), useMathText=True)
    else:
        mc_ax.text(0.5, 0.5, "one pass: deterministic network", ha="center", va="center",
                   transform=mc_ax.transAxes)
    mc_ax.set_xlim(-0.5, N - 0.5)
    mc_ax.set_xticks(range(N), tokens, rotation=90, fontsize=font)

    ax = right.subplots()
    top_k = sorted(r["probs"], key=r["probs"].get, reverse=True)[:_TOP_CLASSES]
    ys = np.arange(len(top_k))[::-1]
    ax.barh(ys, [r["probs"][c] for c in top_k], xerr=[r["probs_std"][c] for c in top_k],
            color="tab:blue", ecolor="0.3", capsize=2)
    ax.set_yticks(ys, top_k, fontsize="x-small")
    ax.set_xlim(0, 1)
    ax.set_xlabel("probability (±1 s.d. over passes)")
    mi = "n/a (one pass)" if r["mutual_info"] is None else f"{r['mutual_info']:.3g}"
    tau = "" if r["temperature"] == 1.0 else f", τ = {r['temperature']:.2f}"
    ax.set_title(f"pred: {r['label']} (p = {r['score']:.3f}{tau})\nentropy {r['entropy']:.3f} "
                 f"nats, MI {mi}", fontsize="small")
    shown = r["text"] if len(r["text"]) <= 90 else r["text"][:87] + "..."
    fig.suptitle(f"“{shown}”")
    return _save(fig, png, overwrite=overwrite)
