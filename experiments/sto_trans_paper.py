"""The sto-trans paper's tables (STO Tables 1-2) with this library: train, then tabulate.

``run`` trains configs x seeds with :class:`gpattn_ppl.run.experiment.Trainer` (the same code as
``gpattn-ppl compare``), optionally on seeded random subsets of the validation and test splits
(IMDB's official test split is ordered by label, so ``data.limit_eval`` cannot shrink it);
``table`` reads run directories (from ``run`` or from ``gpattn-ppl compare``) and reports, per
method, the Bayesian-model-average metric (T passes averaged) and the paper's measure: the metric
of each of the T passes, mean ± standard deviation across passes, in distribution and OOD, plus
the predictive std and mutual information of the common metric suite.

    python experiments/sto_trans_paper.py run experiments/configs/imdb/*.yaml --seeds 0 \\
        --out runs/sto_trans_paper/imdb --set data.limit_train=4000 --test-subset 2000
    python experiments/sto_trans_paper.py table runs/sto_trans_paper/imdb --metric acc
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import sys
from pathlib import Path

import torch


def _subset(ds, n: int | None, seed: int):
    if n is None or n >= len(ds):
        return ds
    idx = torch.randperm(len(ds), generator=torch.Generator().manual_seed(seed))[:n]
    return ds.subset(idx.sort().values)


def run(configs, seeds, out, overrides, test_subset=None, val_subset=None) -> None:
    from gpattn_ppl.run.assembly import load_bundle
    from gpattn_ppl.run.config import load_config
    from gpattn_ppl.run.training import Trainer

    bundles: dict[str, object] = {}
    for config in configs:
        for seed in seeds:
            run_dir = Path(out) / Path(config).stem / f"seed{seed}"
            if (run_dir / "results.json").exists():
                print(f"skip {run_dir} (done)", flush=True)
                continue
            cfg = load_config(config, list(overrides) + [f"train.seed={seed}",
                                                         "train.progress=false"])
            key = json.dumps([cfg["data"], seed], sort_keys=True)
            if key not in bundles:
                bundle = load_bundle(cfg)
                bundle.test = _subset(bundle.test, test_subset, 0)     # same for every run
                bundle.val = _subset(bundle.val, val_subset, seed)
                bundles = {key: bundle}
            bundle = bundles[key]
            run_dir.mkdir(parents=True, exist_ok=True)
            (run_dir / "subsets.json").write_text(json.dumps(
                {"test_subset": test_subset, "val_subset": val_subset, "train": len(bundle.train),
                 "val": len(bundle.val), "test": len(bundle.test),
                 "ood": {k: len(v) for k, v in bundle.ood.items()}}))
            res = Trainer(cfg, run_dir, bundle=bundle).fit()
            print(f"{run_dir}: test {json.dumps({k: res['test'].get(k) for k in ('acc', 'mcc')})}",
                  flush=True)


def _mcc(pred: torch.Tensor, y: torch.Tensor) -> float:
    tp = float(((pred == 1) & (y == 1)).sum())
    tn = float(((pred == 0) & (y == 0)).sum())
    fp = float(((pred == 1) & (y == 0)).sum())
    fn = float(((pred == 0) & (y == 1)).sum())
    den = math.sqrt((tp + fp) * (tp + fn) * (tn + fp) * (tn + fn))
    return 0.0 if den == 0 else (tp * tn - fp * fn) / den


def _per_pass(pred: dict, metric: str) -> list[float]:
    y = pred["labels"]
    out = []
    for p in pred["probs"]:
        yhat = p.argmax(-1)
        out.append(float((yhat == y).double().mean()) if metric == "acc" else _mcc(yhat, y))
    return out


def _fmt(vals: list[float], scale: float = 100.0, digits: int = 2) -> str:
    vals = [v * scale for v in vals if v is not None]
    if not vals:
        return "–"
    if len(vals) == 1:
        return f"{vals[0]:.{digits}f}"
    return f"{statistics.fmean(vals):.{digits}f} ± {statistics.stdev(vals):.{digits}f}"


def _pp(a: dict, mean_key: str, std_key: str) -> str:
    """Per-pass metric: mean over seeds of the pass mean, ± mean over seeds of the pass std."""
    return f"{statistics.fmean(a[mean_key]) * 100:.2f} ± {statistics.fmean(a[std_key]) * 100:.3f}"


def _pair(a: dict, k1: str, k2: str, scale: float = 1.0, digits: int = 3) -> str:
    def one(key):
        vals = [v for v in a[key] if v is not None]
        return f"{statistics.fmean(vals) * scale:.{digits}f}" if vals else "–"

    return f"{one(k1)} / {one(k2)}"


def table(root, metric: str = "acc") -> str:
    """Markdown table over ``root/<method>/seed*/`` run directories."""
    rows = []
    for mdir in sorted(p for p in Path(root).iterdir() if p.is_dir()):
        runs = sorted(d for d in mdir.glob("seed*") if (d / "results.json").exists())
        if not runs:
            continue
        acc = {"id": [], "ood": [], "id_pass_mean": [], "id_pass_std": [], "ood_pass_mean": [],
               "ood_pass_std": [], "id_std": [], "ood_std": [], "id_mi": [], "ood_mi": [],
               "auroc_msp": [], "auroc_mi": [], "T": []}
        for d in runs:
            res = json.loads((d / "results.json").read_text())
            preds = torch.load(d / "predictions.pt", weights_only=False)
            ood_name = next(iter(res["ood"]))
            ood = res["ood"][ood_name]
            acc["id"].append(res["test"].get(metric))
            acc["ood"].append(ood["classification"].get(metric))
            pid, pood = _per_pass(preds["test"], metric), _per_pass(preds[ood_name], metric)
            acc["T"].append(len(pid))
            acc["id_pass_mean"].append(statistics.fmean(pid))
            acc["ood_pass_mean"].append(statistics.fmean(pood))
            acc["id_pass_std"].append(statistics.pstdev(pid))
            acc["ood_pass_std"].append(statistics.pstdev(pood))
            acc["id_std"].append(res["test"].get("pred_std"))
            acc["ood_std"].append(ood["classification"].get("pred_std"))
            acc["id_mi"].append(res["test"].get("mutual_info"))
            acc["ood_mi"].append(ood["classification"].get("mutual_info"))
            det = ood["detection"]
            acc["auroc_msp"].append(det.get("max_softmax", {}).get("auroc"))
            acc["auroc_mi"].append(det.get("mutual_info", {}).get("auroc"))
        rows.append((mdir.name, len(runs), acc))
    m = metric.upper() if metric == "mcc" else "Acc"
    head = (f"| method | seeds | T | {m} ID (BMA) | {m} OOD (BMA) | {m} ID per pass, mean ± std "
            f"over T | {m} OOD per pass, mean ± std over T | pred. std ID / OOD | MI ID / OOD "
            f"(x1e3) | OOD AUROC MSP / MI |")
    lines = [head, "|---|---|---|---|---|---|---|---|---|---|"]
    for name, n, a in rows:
        lines.append(f"| {name} | {n} | {max(a['T'])} | {_fmt(a['id'])} | {_fmt(a['ood'])} | "
                     f"{_pp(a, 'id_pass_mean', 'id_pass_std')} | "
                     f"{_pp(a, 'ood_pass_mean', 'ood_pass_std')} | {_pair(a, 'id_std', 'ood_std')} | "
                     f"{_pair(a, 'id_mi', 'ood_mi', 1e3, 2)} | {_pair(a, 'auroc_msp', 'auroc_mi')} |")
    return "\n".join(lines)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = p.add_subparsers(dest="cmd", required=True)
    r = sub.add_parser("run")
    r.add_argument("configs", nargs="+")
    r.add_argument("--seeds", nargs="+", type=int, default=[0])
    r.add_argument("--out", required=True)
    r.add_argument("--set", nargs="*", default=[])
    r.add_argument("--test-subset", type=int, default=None)
    r.add_argument("--val-subset", type=int, default=None)
    r.add_argument("--threads", type=int, default=0, help="torch threads (0: leave as is)")
    t = sub.add_parser("table")
    t.add_argument("root")
    t.add_argument("--metric", choices=("acc", "mcc"), default="acc")
    a = p.parse_args(argv)
    if a.cmd == "run":
        if a.threads:
            torch.set_num_threads(a.threads)
        run(a.configs, a.seeds, a.out, a.set, a.test_subset, a.val_subset)
        print(table(a.out))
    else:
        print(table(a.root, a.metric))
    return 0


if __name__ == "__main__":
    sys.exit(main())
