"""benchmarks/bench_vit_blocks.py: every CPU-preset unit times in every block and in the last
block, against softmax, and the JSON says so (smoke size)."""

import importlib.util
import json
from pathlib import Path

SCRIPT = Path(__file__).resolve().parents[2] / "benchmarks" / "bench_vit_blocks.py"


def test_smoke_writes_a_row_per_unit_and_placement(tmp_path):
    spec = importlib.util.spec_from_file_location("bench_vit_blocks", SCRIPT)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    out = tmp_path / "vit.json"
    assert mod.main(["--smoke", "--out", str(out)]) == 0
    res = json.loads(out.read_text())
    cases = {(r["method"], r["blocks"]) for r in res["rows"]}
    assert cases == {("softmax", "every")} | {(m, w) for m in mod.METHODS
                                               for w in ("every", "last")}
    assert res["rows"][0]["ratio_to_softmax"] == 1.0
    assert all(r["median_s"] > 0 for r in res["rows"])
    # the specs are the CPU-preset configs' own
    assert mod.unit_spec("sgpa") == {"kind": "sgpa", "variant": "decoupled", "kernel": "rbf",
                                     "num_inducing": 16}
