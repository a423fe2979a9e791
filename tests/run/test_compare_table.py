"""The comparison table: best OOD detector per row, significance against softmax + TS, deep
ensembles per block of seeds, and the demo's closing verdict."""

import pytest

from gpattn_ppl.run.compare import format_markdown, significantly_better, summarise
from gpattn_ppl.run.sweep import verdict


def _result(nll, ece, mcc, aurocs, ts=None):
    r = {"test": {"nll": nll, "ece": ece, "mcc": mcc},
         "ood": {"cola_ood": {"detection": {k: {"auroc": v} for k, v in aurocs.items()}}},
         "cost": {"sec_per_epoch": 1.0, "params": 10}}
    if ts is not None:
        r["ts"] = {"test": {"nll": ts[0], "ece": ts[1], "mcc": mcc}}
    return r


def test_best_detector_is_the_best_mean_over_runs_and_is_named():
    runs = {"unit": [_result(0.6, 0.05, 0.1, {"max_softmax": 0.50, "mutual_info": 0.70}),
                     _result(0.6, 0.05, 0.1, {"max_softmax": 0.56, "mutual_info": 0.52})]}
    (row,) = summarise(runs)
    assert row["best detector"] == "mutual_info"      # mean 0.61 beats 0.53
    assert row["OOD AUROC (best)"][0] == pytest.approx(0.61)
    assert "0.610 ± 0.127 (mutual_info)" in format_markdown([row])


def test_significance_is_one_sided_in_each_column_direction():
    better_nll, ref = [0.50, 0.51, 0.49], [0.60, 0.61, 0.59]
    assert significantly_better(better_nll, ref, "NLL")
    assert not significantly_better(ref, better_nll, "NLL")
    assert significantly_better(ref, better_nll, "MCC ID")          # larger is better
    assert not significantly_better([0.5, 0.7, 0.4], [0.55, 0.6, 0.5], "NLL")  # overlapping
    assert not significantly_better(better_nll, ref, "s/epoch")     # no direction: never bold
    assert not significantly_better([0.5], [0.6], "NLL")            # one run: no test


def test_cells_better_than_softmax_ts_are_bold():
    runs = {"softmax": [_result(0.70, 0.20, 0.1, {"max_softmax": 0.5}, ts=(0.62, 0.05))
                        for _ in range(3)],
            "unit": [_result(nll, 0.15, 0.1, {"max_softmax": 0.5})
                     for nll in (0.50, 0.51, 0.49)]}
    table = format_markdown(summarise(runs))
    unit = next(line for line in table.splitlines() if line.startswith("| unit "))
    assert "**0.500 ± 0.010**" in unit                  # NLL below softmax + TS's 0.62
    assert "**0.150" not in unit                         # ECE 0.15 is worse than TS's 0.05
    assert "| softmax + TS | 3 |" in table


def test_verdict_from_summarised_runs_with_ts_and_laplace_rows():
    """The demo's verdict on summarise's rows: softmax + TS and softmax + LLA (from the runs'
    "ts" and "laplace" results) are the references; a missing OOD AUROC is never a win."""
    soft = _result(0.62, 0.06, 0.1, {"max_softmax": 0.70}, ts=(0.60, 0.02))
    soft["laplace"] = {"test": {"nll": 0.59, "ece": 0.05, "mcc": 0.1},
                       "ood": {"cola_ood": {"detection": {"max_softmax": {"auroc": 0.75}}}}}
    runs = {"softmax": [soft],
            "good": [_result(0.58, 0.01, 0.1, {"max_softmax": 0.80})],
            "bad": [_result(0.61, 0.09, 0.1, {"max_softmax": 0.72})],
            "blind": [_result(0.50, 0.01, 0.1, {})]}
    ts, lla = verdict(summarise(runs))
    assert ts == ("Beat softmax + TS (NLL 0.600, ECE 0.020, OOD AUROC 0.700) on NLL, ECE and "
                  "OOD AUROC together: good. On each alone -- NLL: good, blind; ECE: good, "
                  "blind; OOD AUROC: good, bad.")
    assert lla.startswith("Beat softmax + LLA (NLL 0.590, ECE 0.050, OOD AUROC 0.750) on NLL, "
                          "ECE and OOD AUROC together: good. On each alone -- NLL: good, blind;")


def test_deep_ensembles_form_one_per_block_of_seeds(tmp_path, tiny_config):
    from gpattn_ppl.run.compare import run_compare

    tiny_config["train"]["epochs"] = 1
    rows = run_compare([tiny_config], [0, 1, 2, 3], tmp_path, names=["tiny"], ensemble=2,
                       progress=False)
    ens = next(r for r in rows if r["method"] == "tiny (ensemble of 2)")
    assert ens["runs"] == 2 and ens["NLL"][1] is not None         # two ensembles: a std
    member = next(r for r in rows if r["method"] == "tiny")
    assert ens["params"][0] == 2 * member["params"][0]
    assert ens["s/epoch"][0] > member["s/epoch"][0]               # members' summed cost
