import json

from gpattn_ppl.run.benchmarking import loglog_slope
from gpattn_ppl.run.cli import main


def test_bench_writes_json_with_ratios(tmp_path, capsys):
    out = tmp_path / "b.json"
    assert main(["bench", "softmax", '{"kind": "kernel", "symmetric": true}', "--B", "2",
                 "--N", "4", "--C", "8", "--H", "2", "--repeats", "2", "--out", str(out)]) == 0
    res = json.loads(out.read_text())
    assert [r["kind"] for r in res["layers"]] == ["softmax", "kernel"]
    assert res["layers"][1]["options"] == {"symmetric": True}
    assert all(r["ratio_to_softmax"] > 0 for r in res["layers"])
    assert res["machine"]["torch"]
    assert "x" in capsys.readouterr().out


def test_loglog_slope_recovers_a_power_law():
    ns = [64, 256, 1024]
    assert abs(loglog_slope(ns, [3e-6 * n**2 for n in ns]) - 2.0) < 1e-9


def test_unknown_bench_kind_is_a_named_error(tmp_path, capsys):
    assert main(["bench", "nope", "--out", str(tmp_path / "b.json")]) == 2
    assert "unknown attention kind 'nope'" in capsys.readouterr().err
