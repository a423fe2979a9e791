"""SwappedTrainer under ``torchrun --nproc_per_node 2`` (gloo, CPU) trains what one process
with the same global batch trains: the global terms are divided by the global N_data, the
step-0 weights are the same on every process, the per-step losses and the final weights agree,
and ``predict`` gathers the averaged probabilities [n, K] of all processes.

The units are run at their posterior means and dropout is 0, so that no pass draws: the two
runs are then comparable number for number (with draws, two processes draw other noise than
one). Each step uses the whole training set (16 examples, a global batch of 16), so that the
order in which the sampler hands them out does not matter either.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest
import torch.distributed as dist

pytest.importorskip("transformers")

WORKER = textwrap.dedent(
    """
    import json
    import os
    import sys

    import torch

    from gpattn_ppl import settings
    from gpattn_ppl.hf import SwappedTrainer, objective_terms, swap
    from tests.hf.hosts import SMALL, dataset, tiny_classifier, transformers

    out = sys.argv[1]
    world, rank = int(os.environ.get("WORLD_SIZE", "1")), int(os.environ.get("RANK", "0"))
    N, GLOBAL_BATCH = 16, 16
    model = tiny_classifier(dropout=0.0)
    torch.manual_seed(0)
    swap(model, "kep_svgp", layers=[-1], init="random", **SMALL["kep_svgp"])
    args = transformers.TrainingArguments(
        output_dir=os.path.join(out, f"ckpt{world}"),
        per_device_train_batch_size=GLOBAL_BATCH // world, per_device_eval_batch_size=4, max_steps=4, logging_steps=1, learning_rate=1e-2,
        save_strategy="no", report_to="none", disable_tqdm=True, use_cpu=True, seed=0,
        ddp_backend="gloo" if world > 1 else None)
    # the KL (a global term) at weight 1, so that N_data shows in the loss; ksvd_loss (a
    # per-example term) at the step-0 rule, so that the step-0 statistics must be global
    trainer = SwappedTrainer(model=model, args=args, train_dataset=dataset(n=N),
                             term_weights={"kl": 1.0}, eval_mean=True)
    trainer.remove_callback(transformers.PrinterCallback)
    losses = []
    compute_loss = trainer.compute_loss

    def recorded(model, inputs, *a, **kw):
        loss = compute_loss(model, inputs, *a, **kw)
        if model.training:
            losses.append(float(loss.detach()))
        return loss

    trainer.compute_loss = recorded
    before = torch.cat([p.detach().flatten().clone() for p in model.parameters()])
    with settings.posterior_mean(True):      # no pass draws: the runs compare exactly
        trainer.train()
    pred = trainer.predict(dataset(n=11, seed=1))
    net = trainer.accelerator.unwrap_model(trainer.model)
    with torch.no_grad():
        net(input_ids=torch.stack([d["input_ids"] for d in dataset(n=2)]))
        raw_kl = float(net.bert.encoder.layer[1].attention.unit.objective_terms()["kl"])
        share = {g: float(v) for g, v in objective_terms(net, trainer.num_data).items()}
    after = torch.cat([p.detach().flatten() for p in net.parameters()])
    with open(os.path.join(out, f"world{world}.rank{rank}.json"), "w") as fh:
        json.dump({"world": trainer.accelerator.num_processes, "num_data": trainer.num_data,
                   "losses": losses, "logged": [h["loss"] for h in trainer.state.log_history
                                                if "loss" in h],
                   "step0": trainer.step0, "weights": trainer.term_weights,
                   "raw_kl": raw_kl, "share": share,
                   "params": after.tolist(), "moved": float((after - before).abs().max()),
                   "predictions": pred.predictions.tolist(),
                   "label_ids": pred.label_ids.tolist()}, fh)
    """
)


def _run(argv: list[str], env: dict, cwd: Path) -> None:
    proc = subprocess.run(argv, env=env, cwd=cwd, capture_output=True, text=True,
                          timeout=1800)  # a hang guard, not a time bound
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-8000:]


@pytest.mark.slow
@pytest.mark.skipif(not dist.is_available() or not dist.is_gloo_available(),
                    reason="torch.distributed with gloo is not available")
def test_two_processes_train_what_one_process_trains(tmp_path: Path):
    script = tmp_path / "worker.py"
    script.write_text(WORKER)
    root = Path(__file__).resolve().parents[2]
    env = {**os.environ, "PYTHONPATH": str(root) + os.pathsep + os.environ.get("PYTHONPATH", ""),
           "OMP_NUM_THREADS": "1", "CUDA_VISIBLE_DEVICES": "", "HF_HUB_OFFLINE": "1",
           "TOKENIZERS_PARALLELISM": "false"}
    for key in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT"):
        env.pop(key, None)
    _run([sys.executable, str(script), str(tmp_path)], env, tmp_path)
    _run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2",
          str(script), str(tmp_path)], env, tmp_path)
    one = json.loads((tmp_path / "world1.rank0.json").read_text())
    ranks = [json.loads((tmp_path / f"world2.rank{r}.json").read_text()) for r in range(2)]
    assert one["world"] == 1 and [r["world"] for r in ranks] == [2, 2]

    # N_data is the global training-set size on every process, and divides the global KL
    assert one["num_data"] == 16 and [r["num_data"] for r in ranks] == [16, 16]
    kl = next(g for g in one["share"] if g.endswith(".kl"))
    for r in ranks:
        assert r["share"][kl] == pytest.approx(r["raw_kl"] / 16, rel=1e-6)

    # the same step-0 statistics and weights everywhere (from the global batch, not a shard)
    for r in ranks:
        assert r["weights"] == one["weights"]
        assert r["step0"]["cross_entropy"] == pytest.approx(one["step0"]["cross_entropy"],
                                                            rel=1e-5)
        assert r["step0"]["terms"] == pytest.approx(one["step0"]["terms"], rel=1e-5)
    assert one["weights"][kl] == 1.0 and 0 < min(one["weights"].values())

    # the loss of each step: the mean of the two shards' losses is the one-process loss. Had
    # a process divided the KL by its own 8 examples, each would be off by KL_0 / 16 at step 0
    steps = len(one["losses"])
    assert steps == 4 and [len(r["losses"]) for r in ranks] == [4, 4]
    two = np.mean([r["losses"] for r in ranks], axis=0)
    np.testing.assert_allclose(two, one["losses"], rtol=1e-5, atol=1e-6)
    assert one["step0"]["terms"][kl] > 1e3 * 1e-5 * max(one["losses"])      # that would show
    # the logged loss is the mean over the processes (transformers 4.x rounds it to 4 digits)
    assert ranks[0]["logged"] == pytest.approx(one["logged"], abs=2e-4)
    assert np.abs(np.subtract(*[r["losses"] for r in ranks])).max() > 1e-5  # shards differ

    # the final weights, and predict's gathered averaged probabilities [n, K]
    assert one["moved"] > 1e-2                                              # it trained
    for r in ranks:
        np.testing.assert_allclose(r["params"], one["params"], rtol=1e-4, atol=1e-5)
        assert np.asarray(r["predictions"]).shape == (11, 3)
        assert r["label_ids"] == one["label_ids"]
        np.testing.assert_allclose(r["predictions"], one["predictions"], atol=1e-5)
