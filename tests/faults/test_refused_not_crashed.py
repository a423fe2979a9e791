"""Inputs that validation let through and that crashed as "this is a bug" (issue 45): each one
is now a one-line refusal with exit status 2 naming the key, the argument or the file -- or,
where the input is legitimate, works with a warning (KEP-SVGP's rank capped to the head
dimension, ``data.max_len`` to the checkpoint's positions, ``--threads`` to the machine's CPUs).
Also: ``explain`` on a KEP-SVGP run, and one rule for integer labels whatever the file holds."""

from __future__ import annotations

import json
import random

import pytest
import torch
import yaml

from gpattn_ppl.data import read_labelled_texts
from gpattn_ppl.errors import DataError
from gpattn_ppl.run.cli import main
from gpattn_ppl.run.runtime import usable_cpus
from tests.conftest import TINY_BERT_WORDS

from .conftest import cli_error, tried
from .conftest import refused_run as _refused
from .conftest import train_argv as _train


# -- config values validation let through ------------------------------------------------------
@pytest.mark.parametrize("pair, needle", [
    ("model.attention={kind: softmax, proj_dropout: .nan}",
     "model.attention.proj_dropout: nan is not a finite number"),
    ("model.attention={kind: kernel, attn_dropout: -.inf}",
     "model.attention.attn_dropout: -inf is not a finite number"),
    ("model.attention={kind: gumbel, temperature: .inf}",
     "model.attention.temperature: inf is not a finite number"),
    ("model.attention={kind: h_gumbel, temperature_schedule: .nan}",
     "model.attention.temperature_schedule: nan is not a finite number"),
    ("model.overrides=[{blocks: [0], attention: {kind: sgpa, proj_dropout: .nan}}]",
     "model.overrides[0].attention.proj_dropout: nan is not a finite number"),
])
def test_a_nan_or_inf_attention_option_is_refused_naming_the_key(pair, needle, tiny_yaml,
                                                                   tmp_path, capsys):
    """A NaN rate passes every ``p < 0 or p > 1`` check; it crashed in the first forward."""
    _refused(capsys, _train(tiny_yaml, tmp_path, pair), tmp_path, needle)
    tried("non-finite option")


def test_a_nan_option_of_a_swapped_unit_is_refused_naming_the_key(tiny_yaml, tmp_path, capsys):
    """The same on the Hugging Face path (``model.swap``), before any checkpoint is read."""
    swap = "model.swap=[{layers: [-1], attention: {kind: softmax, proj_dropout: .nan}}]"
    _refused(capsys, _train(tiny_yaml, tmp_path, "model.arch=hf", "model.checkpoint=nowhere",
                            "data.encoder=hf", swap), tmp_path,
             "model.swap[0].attention.proj_dropout: nan is not a finite number")
    tried("non-finite option")


@pytest.mark.parametrize("spec, needle", [
    ("{kind: cgpt, noise: 1e300}", "(kind 'cgpt'): noise must be > 0 and at most 1.84e+19"),
    ("{kind: scgpt, noise: 1e300}", "(kind 'scgpt'): noise must be > 0 and at most 1.84e+19"),
    ("{kind: h_gumbel, centroid_temperature: 1e300}",
     "(kind 'h_gumbel'): centroid_temperature must be > 0 and a finite float32"),
    ("{kind: sgpa, outputscale_init: 1e300}",
     "(kind 'sgpa'): outputscale_init must be > 0 and a finite float32"),
])
def test_a_float_beyond_float32_is_refused_naming_the_unit(spec, needle, tiny_yaml, tmp_path,
                                                           capsys):
    """Finite in YAML, infinite in the units' float32 tensors: an OverflowError or "cannot be
    converted without overflow" reported as a bug."""
    _refused(capsys, _train(tiny_yaml, tmp_path, f"model.attention={spec}"), tmp_path,
             "model.attention", needle)
    tried("option overflow")


@pytest.mark.parametrize("pairs, needle", [
    (["model.arch=vit", "model.image_size=16384"],
     "model.image_size: 16384 x 16384 = 268435456 pixels per image, more than 89478485"),
    (["data.name=image_folder", "data.train_dir=train", "data.image_size=16384"],
     "data.image_size: 16384 x 16384 = 268435456 pixels per image, more than 89478485"),
    (["model.arch=vit", "model.image_size=9000", "model.patch_size=4"],
     "model.image_size: 9000 with model.patch_size 4 makes 5062500 patches per image"),
])
def test_an_image_size_beyond_what_is_decoded_or_attended_is_refused(pairs, needle, tiny_yaml,
                                                                     tmp_path, capsys):
    """``image_size: 16384`` was a MemoryError: an RGB image of 768 MiB per example, or 16.7M
    patches of position embeddings; the bounds are Pillow's decompression-bomb limit (the most
    pixels one image may have) and the longest sequence (``model.max_len``'s bound)."""
    line = _refused(capsys, _train(tiny_yaml, tmp_path, *pairs), tmp_path, needle)
    assert "allowed: at most" in line
    tried("image size")


# -- legitimate inputs that now work, with a warning -------------------------------------------
def _long_csv(path, n: int = 24, words: int = 90) -> None:
    rng = random.Random(0)
    rows = [" ".join(rng.choice(TINY_BERT_WORDS) for _ in range(words)) + f",{i % 2}"
            for i in range(n)]
    path.write_text("text,label\n" + "\n".join(rows) + "\n")


def _hf_config(tmp_path, checkpoint, **data) -> str:
    _long_csv(tmp_path / "long.csv")
    cfg = {"model": {"arch": "hf", "checkpoint": str(checkpoint)},
           "data": {"name": "csv", "train_file": str(tmp_path / "long.csv"), "encoder": "hf",
                    "max_len": 32, "batch_size": 8, **data},
           "train": {"epochs": 1, "warmup_epochs": 0, "progress": False},
           "eval": {"mc_samples": 2}}
    path = tmp_path / "hf.yaml"
    path.write_text(yaml.safe_dump(cfg))
    return str(path)


def test_kep_svgp_default_rank_on_a_host_with_head_dimension_4_is_capped_with_a_warning(
        tiny_checkpoint, tmp_path, capsys):
    """The tiny BERT has width 16 and 4 heads (D = 4); KEP-SVGP's default rank 5 failed in the
    pretrained initialisation (a shape mismatch reported as a bug)."""
    cfg = _hf_config(tmp_path, tiny_checkpoint)
    with pytest.warns(UserWarning, match=r"KEP-SVGP attention rank 5 is more than the head "
                                         r"dimension D = 4 .*using rank 4"):
        code = main(["train", cfg, "--out", str(tmp_path / "run"), "--set",
                     "model.swap=[{layers: [-1], attention: {kind: kep_svgp}}]"])
    assert code == 0, capsys.readouterr().err
    swap = json.loads((tmp_path / "run" / "swap.json").read_text())
    assert "kep_svgp" in json.dumps(swap)
    tried("kep rank")


def test_max_len_beyond_the_checkpoint_positions_is_capped_with_a_warning(
        tiny_checkpoint, tmp_path, capsys):
    """The tiny BERT has 64 positions; ``data.max_len: 200`` on texts of 90 words crashed in the
    embeddings ("expanded size 92 must match 64"). Training and predicting now cut at 64."""
    cfg = _hf_config(tmp_path, tiny_checkpoint, max_len=200)
    with pytest.warns(UserWarning, match=r"data.max_len 200 is more than the 64 positions of "
                                         r"checkpoint .*texts are cut at 64 word pieces"):
        code = main(["train", cfg, "--out", str(tmp_path / "run")])
    assert code == 0, capsys.readouterr().err
    assert json.loads((tmp_path / "run" / "encoder.json").read_text())["max_len"] == 64
    _long_csv(tmp_path / "new.csv", n=3, words=150)
    capsys.readouterr()
    assert main(["predict", str(tmp_path / "run"), "--input", str(tmp_path / "new.csv")]) == 0
    assert len(capsys.readouterr().out.splitlines()) == 3
    tried("max_len")


def test_checkpoint_positions_leave_out_roberta_position_offset(tmp_path):
    """RoBERTa-style position ids start after the padding index: 514 embeddings take 512
    tokens; a checkpoint with relative positions only (DeBERTa) states no limit."""
    from gpattn_ppl.data.load import checkpoint_positions

    for config, expected in (({"model_type": "roberta", "max_position_embeddings": 514,
                               "pad_token_id": 1}, 512),
                             ({"model_type": "bert", "max_position_embeddings": 512}, 512),
                             ({"model_type": "deberta-v2", "max_position_embeddings": 512,
                               "position_biased_input": False}, None),
                             ({"model_type": "bert"}, None)):
        (tmp_path / "config.json").write_text(json.dumps(config))
        assert checkpoint_positions(tmp_path) == expected, config
    tried("max_len")


def test_threads_beyond_the_machine_are_capped_with_a_message(tmp_path, capsys):
    """``--threads 100000`` made OpenMP crash the process (a segfault); it is bounded by the
    CPUs the process may run on."""
    before = torch.get_num_threads()
    try:
        code = main(["--threads", "100000", "bench", "softmax", "--B", "1", "--N", "4", "--C",
                     "8", "--H", "2", "--repeats", "1", "--out", str(tmp_path / "b.json")])
        assert torch.get_num_threads() == usable_cpus()
    finally:
        torch.set_num_threads(before)
    err = capsys.readouterr().err
    assert code == 0, err
    assert (f"gpattn-ppl bench: warning: --threads 100000 is more than the {usable_cpus()} CPUs "
            f"this process may run on; using {usable_cpus()}") in err
    tried("threads")


# -- explain -----------------------------------------------------------------------------------
@pytest.mark.parametrize("text, needle", [
    ("ab\udcff", "text: not valid UTF-8 (byte 0xff at character 3)"),   # argv bytes
    ("\ud800 x", "text: not valid UTF-8 (a lone surrogate U+D800 at character 1)"),
])
def test_explain_refuses_text_that_is_not_utf8(text, needle, tmp_path, capsys):
    """Bytes that are not UTF-8 reach ``sys.argv`` as surrogates; matplotlib and the JSON output
    failed on them (a TypeError reported as a bug)."""
    line = cli_error(capsys, main(["explain", str(tmp_path / "run"), text,
                                   "--out", str(tmp_path / "why.png")]))
    assert needle in line, line
    assert not (tmp_path / "why.png").exists()
    tried("explain text")


def test_explain_on_a_kep_svgp_run_draws_the_eigen_pair_kernel(tmp_path, capsys):
    """Every KEP-SVGP run failed with "KernelEigenPairStrategy has no attention matrix"; the
    matrix is the attention kernel the unit's eigen-pair reconstructs, E Lambda^-1 R^T
    (brute-forced in tests/attention/test_kep_svgp.py)."""
    import copy

    from gpattn_ppl.run.experiment import Trainer
    from tests.run.conftest import TINY

    cfg = copy.deepcopy(TINY)
    cfg["model"]["attention"] = {"kind": "kep_svgp"}        # dim 16, 2 heads: D = 8 >= rank 5
    cfg["train"].update(epochs=1, device="cpu")
    run = tmp_path / "run"
    Trainer(cfg, run).fit()
    text = "The more you read, the more you want."
    code = main(["explain", str(run), text, "--out", str(tmp_path / "why.png"), "--samples",
                 "2"])
    out = capsys.readouterr().out
    assert code == 0
    r = json.loads(out)
    attn = torch.tensor(r["attention"])
    n = len(r["tokens"])
    assert r["unit"] == "KEPSVGPAttention" and attn.shape == (2, n, n)
    assert torch.isfinite(attn).all() and attn.abs().max() > 0
    assert r["predictive_variance"] is not None and (tmp_path / "why.png").stat().st_size > 0
    tried("explain kep")


# -- data files --------------------------------------------------------------------------------
def test_integer_labels_are_one_class_whatever_else_the_file_holds(tmp_path):
    """``1``, ``01`` and ``+1`` were one class, but three once any non-integer label was in the
    file: an integer literal is now always its integer (integers first, in numeric order)."""
    labels = ["1", "01", "+1", "pos", "-0", "0", "1.0", "neg", "1" * 5000]
    train = tmp_path / "train.csv"
    train.write_text("text,label\n" + "".join(f"row {i},{labels[i % len(labels)]}\n"
                                              for i in range(27)))
    _, y, classes = read_labelled_texts(train)
    assert classes == ["0", "1", "1" * 5000, "1.0", "neg", "pos"]
    assert y[:9].tolist() == [1, 1, 1, 5, 0, 0, 3, 4, 2]
    val = tmp_path / "val.csv"
    val.write_text("text,label\na,+01\nb,-00\nc,pos\n")
    assert read_labelled_texts(val, classes=classes)[1].tolist() == [1, 0, 5]
    # an all-integer file keeps its classes and ids as before
    ints = tmp_path / "ints.csv"
    ints.write_text("text,label\na,10\nb,2\nc,-1\nd,02\n")
    _, y, classes = read_labelled_texts(ints)
    assert classes == ["-1", "2", "10"] and y.tolist() == [2, 1, 0, 1]
    tried("labels")


def test_classes_that_name_one_integer_twice_are_refused(tmp_path):
    """Classes recorded by the old rule (``01`` beside ``1`` in a mixed file) are one label now;
    reading a file against them is refused rather than one of the two silently unreachable."""
    path = tmp_path / "test.csv"
    path.write_text("text,label\na,1\n")
    with pytest.raises(DataError, match=r"the classes '01' and '1' are one label, the integer 1"):
        read_labelled_texts(path, classes=["01", "1", "pos"])
    tried("labels")


def test_a_lone_surrogate_in_a_jsonl_text_is_named(trained, tmp_path, capsys):
    """A JSON escape of half a character (``\\ud800``) is no text: the Hugging Face tokenizer
    raised a TypeError reported as a bug."""
    path = tmp_path / "in.jsonl"
    path.write_text('{"text": "fine"}\n{"text": "a \\ud800 b"}\n')
    line = cli_error(capsys, main(["predict", str(trained), "--input", str(path)]))
    assert f"{path}, line 2, column 'text': a lone surrogate U+D800" in line, line
    tried("data file")


@pytest.mark.parametrize("body, needle", [
    ('{"text": "a", "label": ' + "9" * 5000 + "}\n", "line 1: invalid JSON value (Exceeds the"),
    ("[" * 100000 + "\n", "line 1: JSON nested too deeply"),
])
def test_a_json_line_past_the_parser_limits_is_named(body, needle, tiny_yaml, tmp_path, capsys):
    """An integer of 5000 digits (Python's int conversion limit) and a line nested 100000 deep
    escaped as a bare ValueError / RecursionError without the file and line."""
    path = tmp_path / "train.jsonl"
    path.write_text(body)
    _refused(capsys, _train(tiny_yaml, tmp_path, "data.name=jsonl", f"data.train_file={path}"),
             tmp_path, f"{path}, {needle}")
    tried("data file")
