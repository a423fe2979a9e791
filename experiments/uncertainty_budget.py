"""Where the GP units' uncertainty goes, and what changes it (issue 29, item 4).

Every GP unit is trained with ``train.track_uncertainty`` (the variance budget of
``gpattn_ppl/infer/variance_budget.py`` at every epoch, on 256 validation examples, 16 passes)
in its default recipe and in each remedy, beside softmax and MC dropout, on

* ``cola``: CoLA, official protocol, frozen all-MiniLM-L6-v2 token features, the demo's
  backbone (the ``cola_minilm`` evidence setting: C = 64, MLP 128, batch 64, Adam 2e-3, 6 epochs,
  0.5 warm-up), units in the last of 2 blocks;
* ``clinc150``: CLINC150, standard protocol, the same frozen features
  (``experiments/configs/clinc150/softmax_minilm.yaml``: C = 128, 2 blocks) for 10 epochs
  (1 warm-up), OOS detection of the 1,000 out-of-scope test queries.

Remedies (each a config change of the default recipe):

* ``every_block``: the unit in every block instead of the last one only;
* ``constant_weights``: the papers' objective, every term at weight 1 from the first step (no
  KL warm-up, no α ramp);
* ``tempered``: a cold posterior, every term's weight ramping to 0.1 instead of 1 (KL warm-up
  over the first half, α over the run), so that the global q(u) may contract where the data
  inform it.

Tables (``experiments/results/uncertainty_budget/<task>.{md,json}``): test metrics (accuracy or
MCC, NLL, ECE, MI; OOS AUROC by MSP and by MI on CLINC150) and the last epoch's budget per unit
(``head_var_ratio``, ``head_snr``, ``output_rel_var``, ``block_rel_var``) and for the network
(``features_rel_var``, validation MI). Usage, from the repository root (the ``text`` extra)::

    python experiments/uncertainty_budget.py cola --out runs/budget_cola
    python experiments/uncertainty_budget.py clinc150 --out runs/budget_clinc150 \\
        --units sgpa kep_svgp --variants default every_block

Finished runs in ``--out`` are reused and interrupted ones resumed (``run_compare``).
"""

from __future__ import annotations

import argparse
import copy
import json
from pathlib import Path

from gpattn_ppl.infer import load_predictions
from gpattn_ppl.metrics import mutual_information
from gpattn_ppl.run.compare import run_compare
from gpattn_ppl.run.config import load_config

ROOT = Path(__file__).resolve().parent
COLA = ROOT / "configs" / "cola"
GP_UNITS = ("sgpa", "kep_svgp", "cgpt", "scgpt")
VARIANTS = ("default", "every_block", "constant_weights", "tempered")
REFERENCES = ("softmax", "mc_dropout")

TASKS = {
    "cola": {
        "base": None,      # the unit's own cola config
        "settings": ["data.encoder=minilm", "data.cache_dir=runs/cache", "model.dim=64",
                     "model.mlp_dim=128", "data.batch_size=64", "train.epochs=6",
                     "train.warmup_epochs=0.5", "train.lr=2e-3"],
        "metric": "mcc",
    },
    "clinc150": {
        "base": ROOT / "configs" / "clinc150" / "softmax_minilm.yaml",
        "settings": ["train.epochs=10", "train.warmup_epochs=1"],
        "metric": "acc",
    },
}
COMMON = ["train.track_uncertainty=true", "train.progress=false"]


def unit_attention(unit: str) -> dict:
    """The unit's attention spec of its CoLA default recipe (its last-block override)."""
    cfg = load_config(COLA / f"{unit}.yaml")
    return copy.deepcopy(cfg["model"]["overrides"][0]["attention"])


def config(task: str, unit: str, variant: str) -> dict:
    """The config of ``unit`` (a GP unit or a reference) in ``variant`` on ``task``."""
    t = TASKS[task]
    settings = t["settings"] + COMMON
    if t["base"] is None:
        cfg = load_config(COLA / f"{unit}.yaml", settings)
    elif unit in REFERENCES:
        base = t["base"] if unit == "softmax" else ROOT / "configs" / "clinc150" / "mc_dropout.yaml"
        cfg = load_config(base, settings + (["data.encoder=minilm", "data.cache_dir=runs/cache"]
                                            if unit == "mc_dropout" else []))
    else:
        cfg = load_config(t["base"], settings)
        cfg["model"]["overrides"] = [{"blocks": [-1], "attention": unit_attention(unit)}]
    if variant == "every_block":
        cfg["model"]["attention"] = cfg["model"]["overrides"][0]["attention"]
        cfg["model"]["overrides"] = []
    elif variant == "constant_weights":
        cfg["train"]["objective"] = {"kl_weight": 1.0, "cgp_alpha": 1.0}
    elif variant == "tempered":
        cfg["train"]["objective"] = {
            "kl_weight": {"kind": "linear", "start": 0.0, "end": 0.1, "fraction": 0.5},
            "cgp_alpha": {"kind": "linear", "start": 0.0, "end": 0.1}}
    elif variant != "default":
        raise ValueError(f"unknown variant {variant!r}; allowed: {', '.join(VARIANTS)}")
    return cfg


def _last_budget(history: list[dict]) -> dict:
    rows = [r for r in history if any(k.startswith("val/budget/") for k in r)]
    if not rows:
        return {}
    return {k[len("val/budget/"):]: v for k, v in rows[-1].items() if k.startswith("val/budget/")}


def row(task: str, name: str, run: Path) -> dict:
    """One table row from a finished run folder."""
    res = json.loads((run / "results.json").read_text())
    hist = json.loads((run / "history.json").read_text())
    test = res["test"]
    out = {"method": name, TASKS[task]["metric"]: test[TASKS[task]["metric"]],
           "nll": test["nll"], "ece": test["ece"], "test_mi": test["mutual_info"]}
    preds = load_predictions(run / "predictions.pt")
    for name, ood in res.get("ood", {}).items():
        det = ood["detection"]
        out["ood_auroc_msp"] = det["max_softmax"]["auroc"]
        if "mutual_info" in det:
            out["ood_auroc_mi"] = det["mutual_info"]["auroc"]
        # mean MI of the OOD inputs (unlabelled sets have no classification report)
        out["ood_mi"] = float(mutual_information(preds[name]["probs"]).mean())
    b = _last_budget(hist)
    units = sorted({k.rsplit("/", 1)[0] for k in b if k.count("/") == 1})
    for key in ("head_var_ratio", "head_snr", "output_rel_var", "block_rel_var"):
        vals = [b[f"{u}/{key}"] for u in units if f"{u}/{key}" in b]
        if vals:   # the last unit's (every_block: the last block's), with the first's in the JSON
            out[key] = vals[-1]
            out[f"{key}_per_unit"] = dict(zip(units, vals))
    out["features_rel_var"] = b.get("features_rel_var")
    out["val_mi"] = b.get("mutual_info")
    out["epochs"] = res["cost"]["epochs"]
    out["sec_per_epoch"] = res["cost"]["sec_per_epoch"]
    return out


def _fmt(v) -> str:
    if v is None:
        return "–"
    if isinstance(v, float):
        return f"{v:.3g}" if abs(v) < 1e-2 or abs(v) >= 1e3 else f"{v:.4f}"
    return str(v)


def markdown(task: str, rows: list[dict]) -> str:
    cols = ["method", TASKS[task]["metric"], "nll", "ece", "test_mi"]
    if any("ood_auroc_msp" in r for r in rows):
        cols += ["ood_auroc_msp", "ood_auroc_mi", "ood_mi"]
    cols += ["head_var_ratio", "head_snr", "output_rel_var", "block_rel_var",
             "features_rel_var", "val_mi"]
    lines = ["| " + " | ".join(cols) + " |", "|" + "---|" * len(cols)]
    lines += ["| " + " | ".join(_fmt(r.get(c)) for c in cols) + " |" for r in rows]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("task", choices=sorted(TASKS))
    p.add_argument("--out", required=True, help="output folder of the run folders")
    p.add_argument("--units", nargs="+", default=list(GP_UNITS), choices=GP_UNITS)
    p.add_argument("--variants", nargs="+", default=list(VARIANTS), choices=VARIANTS)
    p.add_argument("--references", nargs="*", default=list(REFERENCES), choices=REFERENCES)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--results", default=str(ROOT / "results" / "uncertainty_budget"),
                   help="folder of the tables")
    args = p.parse_args(argv)
    out = Path(args.out)
    plan = [(r, "default") for r in args.references]
    plan += [(u, v) for v in args.variants for u in args.units]
    names = [u if u in REFERENCES else f"{u}.{v}" for u, v in plan]
    rows = []
    for (unit, variant), name in zip(plan, names):   # one at a time: each row lands at once
        run_compare([config(args.task, unit, variant)], [args.seed], out, names=[name],
                    progress=False)
        rows.append(row(args.task, name, out / name / f"seed{args.seed}"))
        results = Path(args.results)
        results.mkdir(parents=True, exist_ok=True)
        (results / f"{args.task}.json").write_text(json.dumps(rows, indent=1) + "\n")
        table = markdown(args.task, rows)
        (results / f"{args.task}.md").write_text(table + "\n")
    print(table)


if __name__ == "__main__":
    main()
