"""User code through --import (recorded in the run, re-imported by evaluate / predict) and an
image-folder run used by predict."""

import json
import subprocess
import sys
import textwrap

import pytest
import torch
import yaml

PLUGIN = textwrap.dedent('''
    import torch
    from gpattn_ppl.data import RawData, register_dataset

    WORDS = ["good", "bad", "fine", "poor", "great", "awful", "nice", "dull"]

    @register_dataset("plugin_toy", protocols=("a",), modality="text")
    def _toy(*, protocol, root, split_seed, cache_dir):
        texts = [f"{WORDS[i % 8]} {WORDS[(i * 3) % 8]} day" for i in range(48)]
        labels = torch.tensor([i % 2 for i in range(48)])
        return RawData(texts, labels, {"train": torch.arange(32), "val": torch.arange(32, 40),
                                       "test": torch.arange(40, 48)}, {}, 2,
                       classes=["even", "odd"])
''')


def _cli(*args, cwd):
    return subprocess.run([sys.executable, "-m", "gpattn_ppl.run.cli", *map(str, args)],
                          capture_output=True, text=True, cwd=cwd, timeout=1800)


def test_import_registers_a_dataset_for_every_command_and_the_run_remembers_it(tmp_path):
    (tmp_path / "my_data.py").write_text(PLUGIN)
    cfg = {"model": {"dim": 16, "depth": 1, "heads": 2, "mlp_dim": 16, "max_len": 8},
           "data": {"name": "plugin_toy", "max_len": 8, "batch_size": 16},
           "train": {"epochs": 1, "progress": False}, "eval": {"mc_samples": 2}}
    (tmp_path / "cfg.yaml").write_text(yaml.safe_dump(cfg))
    plain = _cli("train", "cfg.yaml", "--out", "run", cwd=tmp_path)
    assert plain.returncode == 2 and "unknown dataset 'plugin_toy'" in plain.stderr
    trained = _cli("--import", "my_data.py", "train", "cfg.yaml", "--out", "run", cwd=tmp_path)
    assert trained.returncode == 0, trained.stderr[-2000:]
    manifest = json.loads((tmp_path / "run" / "run.json").read_text())
    assert manifest["plugins"] == [str(tmp_path / "my_data.py")]
    assert manifest["classes"] == ["even", "odd"]
    # a new process without --import: the recorded module is not imported (a run folder never
    # runs code), and the error names the flag; with it, evaluate and predict work
    refused = _cli("evaluate", "run", "--no-plots", cwd=tmp_path)
    assert refused.returncode == 2, refused.stderr[-2000:]
    assert f"--import {tmp_path / 'my_data.py'}" in refused.stderr
    evaluated = _cli("--import", "my_data.py", "evaluate", "run", "--no-plots", cwd=tmp_path)
    assert evaluated.returncode == 0, evaluated.stderr[-2000:]
    assert json.loads(evaluated.stdout)["test"] == json.loads(trained.stdout)["test"]
    (tmp_path / "in.txt").write_text("good day\nawful dull day\n")
    predicted = _cli("--import", "my_data.py", "predict", "run", "--input", "in.txt",
                     cwd=tmp_path)
    assert predicted.returncode == 0, predicted.stderr[-2000:]
    rows = [json.loads(line) for line in predicted.stdout.splitlines()]
    assert [r["text"] for r in rows] == ["good day", "awful dull day"]
    assert all(set(r["probs"]) == {"even", "odd"} for r in rows)


def test_an_image_folder_run_predicts_from_image_files(tmp_path):
    from PIL import Image

    from gpattn_ppl import load_run
    from gpattn_ppl.run.experiment import Trainer

    gen = torch.Generator().manual_seed(0)
    paths = []
    for cls, colour in (("red", (200, 30, 30)), ("blue", (30, 30, 200))):
        (tmp_path / "imgs" / cls).mkdir(parents=True)
        for i in range(20):
            noise = torch.randint(-20, 20, (12, 12, 3), generator=gen)
            arr = (torch.tensor(colour) + noise).clamp(0, 255).to(torch.uint8).numpy()
            path = tmp_path / "imgs" / cls / f"{i}.png"
            Image.fromarray(arr).save(path)
            paths.append(path)
    cfg = {"model": {"arch": "vit", "dim": 16, "depth": 1, "heads": 2, "mlp_dim": 16,
                     "image_size": 8, "patch_size": 4},
           "data": {"name": "image_folder", "train_dir": str(tmp_path / "imgs"), "image_size": 8,
                    "batch_size": 8},
           "train": {"epochs": 2, "lr": 3e-3, "warmup_epochs": 0, "progress": False},
           "eval": {"mc_samples": 2}}
    Trainer(cfg, tmp_path / "run").fit()
    predictor = load_run(tmp_path / "run")
    assert predictor.classes == ["blue", "red"]
    records = predictor.predict([str(p) for p in paths[:2] + paths[-2:]])
    assert all(set(r["probs"]) == {"blue", "red"} for r in records)
    # the same images as a uint8 tensor give the same predictions
    from gpattn_ppl.data import read_images

    x = read_images([str(p) for p in paths[:2] + paths[-2:]], image_size=8)
    assert predictor.predict(x) == records
    with pytest.raises((ValueError, FileNotFoundError), match="nope.png"):
        predictor.predict([str(tmp_path / "nope.png")])
