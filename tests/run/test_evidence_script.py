"""experiments/evidence.py at toy size: the rows the evidence table promises, from real runs."""

import importlib.util
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def _evidence():
    spec = importlib.util.spec_from_file_location("evidence", ROOT / "experiments" / "evidence.py")
    evidence = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(evidence)
    return evidence


# one epoch on a tiny slice: KEP-SVGP's KSVD term still outweighs the cross-entropy (warned once
# per run by the trainer, as it should; not what this test is about)
@pytest.mark.filterwarnings("ignore::gpattn_ppl.errors.NumericsWarning")
def test_evidence_table_rows_and_reuse(tmp_path, capsys):
    evidence = _evidence()
    args = ["cola", "--out", str(tmp_path), "--seeds", "0", "--ensemble", "2",
            "--methods", "softmax", "kep_svgp", "--set", "train.epochs=1",
            "train.warmup_epochs=0", "data.limit_train=64", "data.limit_eval=32",
            "model.dim=16", "model.heads=2", "model.mlp_dim=16",
            "eval.mc_samples=2"]
    evidence.main(args)
    table = (tmp_path / "results.md").read_text()
    rows = [line.split(" | ")[0].lstrip("| ") for line in table.splitlines()[2:]]
    assert rows == ["softmax", "softmax + TS", "deep ensemble (2)", "kep_svgp"]
    assert (tmp_path / "softmax" / "seed1" / "results.json").exists()   # the ensemble's member
    assert "(max_softmax)" in table or "(entropy)" in table or "(energy)" in table
    per_seed = (tmp_path / "per_seed.md").read_text()
    assert "| kep_svgp | " in per_seed and "worst seed" in per_seed
    assert "of the 1 ordered choices of 1 of its other seeds" in per_seed   # seed 1 vs seed 0
    first = capsys.readouterr().out
    evidence.main(args)                       # finished runs are reused: the same table
    assert capsys.readouterr().out == first


def test_per_seed_table_counts_how_often_softmax_meets_the_criterion_against_itself():
    per_seed = _evidence().per_seed_table
    runs = {"softmax": [{"test": {"mcc": 0.10}}, {"test": {"mcc": 0.20}}],
            "sgpa": [{"test": {"mcc": 0.12}}, {"test": {"mcc": 0.15}}]}
    replicas = [{"test": {"mcc": v}} for v in (0.10, 0.20, 0.15)]
    table = per_seed(runs, [0, 1], "mcc", replicas)
    assert "| sgpa | 0.120 (+0.020) | 0.150 (-0.050) | -0.050 | -0.015 |" in table
    # (o0, o1) against (0.10, 0.20) needs o0 >= 0.07 and o1 >= 0.17: (0.10, 0.20), (0.15, 0.20)
    assert "of the 6 ordered choices of 2 of its other seeds set against seeds 0, 1: 2 (33%)" \
        in table
    assert "std 0.050" in table                              # stdev of 0.1, 0.2, 0.1, 0.2, 0.15
    assert "Softmax against itself" not in per_seed(runs, [0, 1], "mcc", replicas[:1])


def test_ood_accuracy_table_has_every_labelled_ood_set():
    run = {"test": {"acc": 0.8, "mutual_info": 0.01},
           "ood": {"cr": {"classification": {"acc": 0.6, "mutual_info": 0.05}},
                   "noise": {"detection": {}}}}                   # unlabelled: no accuracy column
    other = {"test": {"acc": 0.7, "mutual_info": 0.03},
             "ood": {"cr": {"classification": {"acc": 0.65, "mutual_info": 0.07}}}}
    table = _evidence().ood_accuracy_table({"softmax": [run], "h_sto_trans": [run, other]})
    lines = table.splitlines()
    assert lines[0] == "| method | runs | Acc ID | MI ID | Acc OOD (cr) | MI OOD (cr) |"
    assert lines[2] == "| softmax | 1 | 0.800 | 1.0e-02 | 0.600 | 5.0e-02 |"
    assert lines[3] == "| h_sto_trans | 2 | 0.750 ± 0.071 | 2.0e-02 | 0.625 ± 0.035 | 6.0e-02 |"



@pytest.mark.filterwarnings("ignore::gpattn_ppl.errors.NumericsWarning")
def test_mean_trained_runs_are_reused_under_their_mean_rows(tmp_path, capsys):
    """Runs trained with ``eval.predictive=mean`` are the ``<method> (mean)`` rows, reused with
    that setting (not retrained, not re-evaluated by ``--mean-predictive``)."""
    evidence = _evidence()
    toy = ["train.epochs=1", "train.warmup_epochs=0", "data.limit_train=64",
           "data.limit_eval=32", "model.dim=16", "model.heads=2", "model.mlp_dim=16",
           "eval.mc_samples=2"]
    base = ["cola", "--out", str(tmp_path), "--seeds", "0", "--ensemble", "0"]
    evidence.main(base + ["--methods", "kep_svgp", "--set", *toy, "eval.predictive=mean"])
    run = tmp_path / "kep_svgp" / "seed0" / "results.json"
    stamp = run.stat().st_mtime_ns
    evidence.main(base + ["--methods", "softmax", "kep_svgp", "--mean-trained", "kep_svgp",
                          "--mean-predictive", "--set", *toy])
    rows = [line.split(" | ")[0].lstrip("| ")
            for line in (tmp_path / "results.md").read_text().splitlines()[2:]]
    assert rows == ["softmax", "softmax + TS", "kep_svgp (mean)"]
    assert run.stat().st_mtime_ns == stamp and not (tmp_path / "_mean").exists()
    capsys.readouterr()
    with pytest.raises(SystemExit) as exc:
        evidence.main(base + ["--methods", "softmax", "--mean-trained", "softmax"])
    assert exc.value.code == 2 and "--mean-trained ['softmax']" in capsys.readouterr().err

def test_ensemble_seeds_gives_one_ensemble_of_the_first_seeds(tmp_path, capsys, monkeypatch):
    evidence = _evidence()
    # as in cola_finetune: the epochs-to-match table, which an ensemble (no curve) stays out of
    monkeypatch.setitem(evidence.TASKS["cola"], "match_epochs", True)
    args = ["cola", "--out", str(tmp_path), "--seeds", "0", "1", "--ensemble", "2",
            "--methods", "softmax", "--set", "train.epochs=1", "train.warmup_epochs=0",
            "data.limit_train=64", "data.limit_eval=32", "model.dim=16", "model.mlp_dim=16"]
    evidence.main(args + ["--ensemble-seeds", "2"])
    table = (tmp_path / "results.md").read_text()
    assert "| deep ensemble (2) | 1 | " in table           # one ensemble: seeds 0 and 1
    assert "ensemble" not in (tmp_path / "epochs_to_match.md").read_text()
    assert sorted(p.name for p in (tmp_path / "softmax").iterdir()) == ["seed0", "seed1"]
    capsys.readouterr()
    with pytest.raises(SystemExit) as exc:
        evidence.main(args + ["--ensemble-seeds", "1"])
    assert exc.value.code == 2
    assert "fewer than the 2 members" in capsys.readouterr().err


def test_paired_differences_to_the_baselines():
    """method − baseline per seed, the post-hoc rows as baselines, the t-test from 2 seeds."""
    evidence = _evidence()

    def run(acc, nll, auroc, ts_nll, lla_nll=None):
        r = {"test": {"acc": acc, "nll": nll, "ece": 0.1, "brier": 0.3},
             "ood": {"oos": {"detection": {"max_softmax": {"auroc": auroc}}}},
             "ts": {"test": {"acc": acc, "nll": ts_nll, "ece": 0.05, "brier": 0.3},
                    "ood": {"oos": {"detection": {"max_softmax": {"auroc": auroc}}}}}}
        if lla_nll is not None:
            r["laplace"] = {"test": {"acc": acc, "nll": lla_nll, "ece": 0.04, "brier": 0.3},
                            "ood": {"oos": {"detection": {"max_softmax": {"auroc": auroc}}}}}
        return r

    runs = {"softmax": [run(0.90, 0.40, 0.80, 0.35, 0.33), run(0.91, 0.42, 0.82, 0.36, 0.34)],
            "unit": [run(0.92, 0.30, 0.85, 0.29), run(0.92, 0.33, 0.84, 0.31)]}
    table = evidence.paired_baselines_table(runs, ["softmax + TS", "softmax + LLA"], "acc",
                                            "oos")
    lines = {tuple(c.strip() for c in line.strip("|").split("|")[:2]): line
             for line in table.splitlines() if line.startswith("| ")}
    row = lines[("unit", "softmax + LLA")]
    assert "-0.0200 [p=" in row and "2/2]" in row      # nll: (0.30-0.33 + 0.33-0.34) / 2
    assert ("softmax + TS", "softmax + LLA") not in lines   # baselines are not rows
    assert ("unit + TS", "softmax + TS") in lines
    assert "+0.0350 [" in lines[("unit", "softmax + TS")].split("|")[7]   # AUROC


def test_pareto_points_front_and_figure(tmp_path):
    evidence = _evidence()

    def run(ms, auroc, nll, **extra):
        return {"cost": {"predict_ms_per_example": ms}, "test": {"nll": nll},
                "ood": {"oos": {"detection": {"max_softmax": {"auroc": auroc}}}}, **extra}

    lla = {"predict_ms_per_example": 9.0, "test": {"nll": 0.30},
           "ood": {"oos": {"detection": {"max_softmax": {"auroc": 0.95}}}}}
    runs = {"softmax": [run(2.0, 0.90, 0.20, laplace=lla), run(2.2, 0.92, 0.22, laplace=lla)],
            "sgpa": [run(20.0, 0.96, 0.25), run(22.0, 0.98, 0.21)],
            "slow_worse": [run(30.0, 0.80, 0.40), run(30.0, 0.80, 0.40)],
            "deep ensemble (3)": [run(6.0, 0.99, 0.10), run(6.0, 0.99, 0.10)],
            "no_cost": [{"test": {"nll": 0.1}}]}
    points = {p["method"]: p for p in evidence.pareto_points(runs, "oos")}
    assert set(points) == {"softmax", "softmax + LLA", "sgpa", "slow_worse"}
    assert points["softmax + LLA"]["ms"] == (9.0, 0.0)        # the Laplace predictive's cost
    assert points["sgpa"]["auroc"][0] == pytest.approx(0.97)
    assert points["softmax"]["ms"][1] == pytest.approx(0.1414, abs=1e-4)
    pts = list(points.values())
    assert evidence.pareto_front(pts, "auroc", True) == ["softmax", "softmax + LLA", "sgpa"]
    assert evidence.pareto_front(pts, "nll", False) == ["softmax"]
    png = evidence.pareto_figure(pts, tmp_path / "pareto.png", "toy")
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_goal_table_checks_every_criterion_and_the_cost_ratio():
    evidence = _evidence()

    def run(ms, acc, nll, ece, auroc, **extra):
        return {"cost": {"predict_ms_per_example": ms},
                "test": {"acc": acc, "nll": nll, "ece": ece, "brier": 0.1},
                "ood": {"oos": {"detection": {"max_softmax": {"auroc": auroc}}}}, **extra}

    ts = {"test": {"acc": 0.90, "nll": 0.30, "ece": 0.02, "brier": 0.1},
          "ood": {"oos": {"detection": {"max_softmax": {"auroc": 0.90}}}}}
    lla = {**ts, "predict_ms_per_example": 4.0}
    runs = {"softmax": [run(2.0, 0.90, 0.35, 0.05, 0.91, ts=ts, laplace=lla)] * 2,
            "mc_dropout (mean)": [run(2.0, 0.99, 0.01, 0.001, 0.99)] * 2,   # a baseline
            "sngp": [run(2.5, 0.95, 0.10, 0.01, 0.99, ts=ts)] * 2,           # a baseline
            "cheap": [run(2.8, 0.91, 0.29, 0.01, 0.95)] * 2,   # 1.4x softmax: met on both
            "slow": [run(5.0, 0.91, 0.29, 0.01, 0.95)] * 2,    # 2.5x softmax, 1.25x LLA
            "worse_ece": [run(2.0, 0.92, 0.20, 0.03, 0.95)] * 2,
            "one_seed": [run(2.0, 0.99, 0.01, 0.001, 0.99)]}   # not paired with the references
    table = evidence.goal_table(runs, ["softmax + TS", "softmax + LLA"], "acc", "oos")
    rows = {tuple(c.strip() for c in line.strip("|").split("|")[:2]):
            [c.strip() for c in line.strip("|").split("|")] for line in table.splitlines()
            if line.startswith("| ") and not line.startswith("| method")}
    assert {m for m, _ in rows} == {"cheap", "slow", "worse_ece"}   # baselines, 1 seed: out
    assert rows[("cheap", "softmax + TS")][-1] == "**met**"
    assert rows[("cheap", "softmax + TS")][-2] == "1.4× ✓"            # 2.8 / 2.0
    assert rows[("cheap", "softmax + LLA")][-1] == "**met**"
    assert rows[("slow", "softmax + TS")][-1] == "not met"            # cost only
    assert rows[("slow", "softmax + TS")][-2] == "2.5× ✗"
    assert rows[("slow", "softmax + LLA")][-1] == "**met**"           # 5.0 / 4.0
    assert rows[("worse_ece", "softmax + TS")][4] == "+0.0100 ✗"
    assert rows[("worse_ece", "softmax + TS")][-1] == "not met"
    assert rows[("cheap", "softmax + TS")][2] == "+0.0100 ✓"          # acc


def test_mean_predictive_runs_evaluate_copies_once(tmp_path, monkeypatch):
    import json

    from gpattn_ppl.run import results as results_module
    from gpattn_ppl.run.experiment import Trainer

    from .conftest import TINY

    evidence = _evidence()
    cfg = json.loads(json.dumps(TINY))
    cfg["model"]["attention"] = {"kind": "sgpa", "num_inducing": 4}
    mc = Trainer(cfg, tmp_path / "sgpa" / "seed0").fit()
    before = (tmp_path / "sgpa" / "seed0" / "results.json").read_text()
    [mean] = evidence.mean_predictive_runs(tmp_path, "sgpa", [0])
    assert mean["eval"]["predictive"] == "mean" and mc["eval"]["predictive"] == "mc"
    assert mean["test"]["mutual_info"] == pytest.approx(0.0, abs=1e-12)
    assert mc["test"]["mutual_info"] > 0
    assert (tmp_path / "sgpa" / "seed0" / "results.json").read_text() == before  # untouched
    assert not (tmp_path / "_mean" / "sgpa" / "seed0" / "last.pt").exists()
    monkeypatch.setattr(results_module, "evaluate_run", lambda *a, **k: pytest.fail("rerun"))
    assert evidence.mean_predictive_runs(tmp_path, "sgpa", [0]) == [mean]   # reused


def test_goal_table_takes_the_costs_of_one_benchmark_run(tmp_path):
    import json

    evidence = _evidence()
    bench = {"rows": {"softmax/mc": {"ms_per_example_median": 4.0},
                      "softmax/lla": {"ms_per_example_median": 4.2},
                      "unit/mc": {"ms_per_example_median": 16.0},
                      "unit/mean": {"ms_per_example_median": 4.4}}}
    (tmp_path / "b.json").write_text(json.dumps(bench))
    cost = evidence.benchmark_costs(tmp_path / "b.json")
    assert cost == {"softmax": 4.0, "softmax + LLA": 4.2, "unit": 16.0, "unit (mean)": 4.4}

    def run(acc, ms=99.0):
        return {"cost": {"predict_ms_per_example": ms},
                "test": {"acc": acc, "nll": 0.2, "ece": 0.01, "brier": 0.1},
                "ood": {"oos": {"detection": {"max_softmax": {"auroc": 0.95}}}}}

    ts = {"test": {"acc": 0.9, "nll": 0.3, "ece": 0.02, "brier": 0.1},
          "ood": {"oos": {"detection": {"max_softmax": {"auroc": 0.9}}}}}
    runs = {"softmax": [{**run(0.9, ms=1.0), "ts": ts}], "unit": [run(0.95, ms=1.0)],
            "unit (mean)": [run(0.95, ms=50.0)]}
    table = evidence.goal_table(runs, ["softmax + TS"], "acc", "oos", cost=cost)
    assert "one benchmark run" in table
    rows = {line.split("|")[1].strip(): line for line in table.splitlines()
            if line.startswith("| unit")}
    assert "4.0× ✗" in rows["unit"] and "not met" in rows["unit"]       # 16 / 4, not 1 / 1
    assert "1.1× ✓" in rows["unit (mean)"] and "**met**" in rows["unit (mean)"]
    assert "recorded cost" in evidence.goal_table(runs, ["softmax + TS"], "acc", "oos")


def test_figure_points_draw_tempered_rows():
    evidence = _evidence()
    names = ["softmax", "softmax + TS", "softmax + LLA", "sngp", "sngp + TS", "cgpt", "cgpt + TS",
             "cgpt (mean)", "cgpt (mean) + TS", "mc_dropout (mean)", "mc_dropout (mean) + TS",
             "no_ts"]
    shown = [p["method"] for p in evidence.figure_points([{"method": n} for n in names])]
    assert shown == ["softmax", "softmax + TS", "softmax + LLA", "sngp", "sngp + TS",
                     "cgpt + TS", "cgpt (mean) + TS", "no_ts"]


def test_ood_sets_table_reads_each_set_and_its_detectors():
    evidence = _evidence()

    def det(msp, mi):                      # a detection entry; MI only for a stochastic run
        return {"max_softmax": {"auroc": msp}, **({"mutual_info": {"auroc": mi}} if mi else {})}

    def run(near, far, mi=None):
        return {"test": {"acc": 0.9}, "ood": {"near": {"detection": det(near, mi)},
                                              "far": {"detection": det(far, mi and mi + 0.1)}}}

    runs = {"softmax": [run(0.70, 0.90), run(0.72, 0.92)],
            "cgpt": [run(0.75, 0.95, 0.80), run(0.77, 0.97, 0.84)]}
    table = evidence.ood_sets_table(runs, ["near", "far"])
    lines = table.splitlines()
    assert lines[0] == ("| method | runs | near AUROC (MSP) | near AUROC (MI) | far AUROC (MSP) "
                        "| far AUROC (MI) |")
    assert "| softmax | 2 | 0.710 ± 0.014 | – | 0.910 ± 0.014 | – |" in lines
    assert "| cgpt | 2 | 0.760 ± 0.014 | 0.820 ± 0.028 | 0.960 ± 0.014 | 0.920 ± 0.028 |" in lines
    # the near-OOD task reports both of CLINC150's OOD sets and scores its goal on the near one
    task = evidence.TASKS["clinc150_near_ood_finetune"]
    assert task["ood_report"] == ["held_out_domains", "oos"] and task["ood_set"] == "held_out_domains"
    assert "data.protocol=near_ood" in task["settings"]
