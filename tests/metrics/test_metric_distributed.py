"""Metric states reduce across processes: 2 gloo ranks give the single-process value.

The worker imports ``gpattn_ppl.ood`` before ``gpattn_ppl.metrics`` in a fresh interpreter, which
also pins that the two packages import in either order (``ood`` builds on ``metrics``).
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch.distributed as dist

WORKER = textwrap.dedent(
    """
    import json
    import sys
    import torch
    import torch.distributed as dist
    import gpattn_ppl.ood  # imported before gpattn_ppl.metrics: no import cycle
    from gpattn_ppl.metrics import AURC, CalibrationError, aurc, expected_calibration_error

    rank, port, out = int(sys.argv[1]), sys.argv[2], sys.argv[3]
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank,
                            world_size=2)
    g = torch.Generator().manual_seed(0)  # same full data set on both ranks
    probs = torch.softmax(2 * torch.randn(3, 101, 4, generator=g, dtype=torch.float64), -1)
    labels = torch.randint(0, 4, (101,), generator=g)
    shard = torch.arange(rank, 101, 2)  # uneven shards: 51 and 50 samples
    ece, area = CalibrationError(), AURC()
    ece.update(probs[:, shard], labels[shard])
    area.update(probs[:, shard], labels[shard])
    got = (float(ece.compute()), float(area.compute()))
    want = (expected_calibration_error(probs, labels), aurc(probs, labels))
    local = (expected_calibration_error(probs[:, shard], labels[shard]),
             aurc(probs[:, shard], labels[shard]))
    with open(f"{out}.{rank}", "w") as fh:
        json.dump([got, want, local], fh)
    dist.destroy_process_group()
    """
)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.skipif(
    not dist.is_available() or not dist.is_gloo_available(),
    reason="torch.distributed with gloo is not available",
)
def test_two_rank_gloo_reduction_equals_global(tmp_path: Path):
    script = tmp_path / "worker.py"
    script.write_text(WORKER)
    out = tmp_path / "result"
    port = str(_free_port())
    root = str(Path(__file__).resolve().parents[2])
    env = {
        **os.environ,
        "PYTHONPATH": root + os.pathsep + os.environ.get("PYTHONPATH", ""),
        "OMP_NUM_THREADS": "1",
    }
    procs = [
        subprocess.Popen(
            [sys.executable, str(script), str(r), port, str(out)],
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
        )
        for r in range(2)
    ]
    logs = [p.communicate(timeout=1800)[0].decode() for p in procs]
    assert all(p.returncode == 0 for p in procs), logs
    for r in range(2):
        got, want, local = json.loads((tmp_path / f"result.{r}").read_text())
        assert got == pytest.approx(want, abs=1e-12)
        assert got[0] != pytest.approx(local[0], abs=1e-6)  # the shard alone differs
