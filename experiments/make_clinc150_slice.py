"""Write the small CLINC150 slice bundled with the package (``gpattn_ppl/data/clinc150_slice/``).

Reads the full oos-eval release (``data_full.json``, ``domains.json``, ``LICENSE``) from
``--root`` and writes, to ``--out``:

* ``data_full.json`` -- the same layout as the release (keys ``train``, ``val``, ``test``,
  ``oos_train``, ``oos_val``, ``oos_test``; lists of ``[text, intent]``), one row per line;
* ``domains.json`` -- the chosen domains, each with its chosen intents;
* ``LICENSE`` -- the release's licence (CC BY 3.0), copied byte for byte;
* ``SOURCE.md`` -- provenance, the selection rule, counts and sha256 sums.

Selection (deterministic, no randomness): the first ``--domains`` domains in sorted name order,
in each the first ``--intents-per-domain`` intents in sorted name order; every ``train`` /
``val`` / ``test`` query of those intents (100 / 20 / 30 per intent), in file order; the first
``--oos-train`` / ``--oos-val`` / ``--oos-test`` rows of ``oos_train`` / ``oos_val`` /
``oos_test`` in file order.

    python experiments/make_clinc150_slice.py --root ../shared/data/clinc150 \\
        --out gpattn_ppl/data/clinc150_slice
"""

from __future__ import annotations

import argparse
import hashlib
import json
import shutil
from pathlib import Path

IN_SCOPE = ("train", "val", "test")
OOS = ("oos_train", "oos_val", "oos_test")
UPSTREAM = "https://github.com/clinc/oos-eval"


def sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def select(full: dict, domains: dict, n_domains: int, per_domain: int,
           n_oos: dict[str, int], train_per_intent: int | None = None) -> tuple[dict, dict]:
    """``(data, domains)`` of the slice (module docstring: the rule)."""
    names = sorted(domains)
    if n_domains > len(names):
        raise SystemExit(f"--domains {n_domains}: the release has {len(names)} domains")
    chosen = {}
    for d in names[:n_domains]:
        intents = sorted(domains[d])
        if per_domain > len(intents):
            raise SystemExit(f"--intents-per-domain {per_domain}: domain {d!r} has "
                             f"{len(intents)} intents")
        chosen[d] = intents[:per_domain]
    keep = {i for v in chosen.values() for i in v}
    data = {s: [row for row in full[s] if row[1] in keep] for s in IN_SCOPE}
    if train_per_intent is not None:
        seen: dict[str, int] = {}
        rows = []
        for row in data["train"]:
            seen[row[1]] = seen.get(row[1], 0) + 1
            if seen[row[1]] <= train_per_intent:
                rows.append(row)
        data["train"] = rows
    for s in OOS:
        if n_oos[s] > len(full[s]):
            raise SystemExit(f"{s}: asked for {n_oos[s]} rows, the release has {len(full[s])}")
        data[s] = full[s][:n_oos[s]]
    return data, chosen


def dump(obj: dict) -> str:
    """JSON with one ``[text, intent]`` row (or one intent name) per line, ASCII escapes as in
    the release."""
    parts = []
    for key, rows in obj.items():
        body = ",\n".join("    " + json.dumps(r) for r in rows)
        parts.append(f"  {json.dumps(key)}: [\n{body}\n  ]")
    return "{\n" + ",\n".join(parts) + "\n}\n"


def source_md(root: Path, out: Path, data: dict, chosen: dict, args) -> str:
    counts = {s: len(v) for s, v in data.items()}
    per_intent = {s: counts[s] // sum(len(v) for v in chosen.values()) for s in IN_SCOPE}
    rows = "\n".join(f"| {d} | {', '.join(v)} |" for d, v in chosen.items())
    files = "\n".join(f"| {p.name} | {p.stat().st_size} | {sha256(p)} |"
                      for p in (out / "data_full.json", out / "domains.json", out / "LICENSE"))
    n_int = sum(len(v) for v in chosen.values())
    train_rule = ("every `train`" if args.train_per_intent is None else
                  f"the first {args.train_per_intent} `train` queries of each intent, every")
    return f"""# CLINC150 slice: {n_int} intents of {len(chosen)} domains, with out-of-scope queries

A small, deterministic slice of CLINC150, shipped so that {args.purpose} run without the
full dataset (``data: {{name: {args.out.name}}}``). For the benchmark use the full release
(``data: {{name: clinc150, root: ...}}``).

Source: {UPSTREAM} @ 828f809 (files `data/data_full.json`, `data/domains.json`,
`LICENSE`), read from the project's full copy (`shared/data/clinc150/`, see its `SOURCE.md`).
Upstream files read:

| file | sha256 |
|---|---|
| data_full.json | {sha256(root / "data_full.json")} |
| domains.json | {sha256(root / "domains.json")} |

Licence: Creative Commons Attribution 3.0 Unported (`LICENSE`, copied byte for byte from the
release). Attribution: Stefan Larson, Anish Mahendran, Joseph J. Peper, Christopher Clarke,
Andrew Lee, Parker Hill, Jonathan K. Kummerfeld, Kevin Leach, Michael A. Laurenzano, Lingjia
Tang, Jason Mars, "An Evaluation Dataset for Intent Classification and Out-of-Scope
Prediction", EMNLP-IJCNLP 2019. Changes: the selection below, and the JSON re-serialised one
row per line (the rows themselves, texts and intents, are unchanged; non-ASCII characters keep
the release's `\\uXXXX` escapes).

Selection (written by `experiments/make_clinc150_slice.py`, no randomness):

* the first {args.domains} domains of `domains.json` in sorted name order;
* in each, the first {args.intents_per_domain} intents in sorted name order;
* {train_rule} / `val` / `test` query of those intents, in file order;
* the first {args.oos_train} / {args.oos_val} / {args.oos_test} rows of `oos_train` / `oos_val` / `oos_test`, in file order.

| domain | intents |
|---|---|
{rows}

| key | rows |
|---|---|
| train / val / test | {counts['train']} / {counts['val']} / {counts['test']} ({per_intent['train']} / {per_intent['val']} / {per_intent['test']} per intent) |
| oos_train / oos_val / oos_test | {counts['oos_train']} / {counts['oos_val']} / {counts['oos_test']} |

Files written:

| file | bytes | sha256 |
|---|---|---|
{files}

Regenerate:

    python experiments/make_clinc150_slice.py --root ../shared/data/clinc150 \\
        --out gpattn_ppl/data/{args.out.name} {args.flags}
"""


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--root", required=True, type=Path,
                   help="folder of the full release (data_full.json, domains.json, LICENSE)")
    p.add_argument("--out", type=Path, default=Path(__file__).resolve().parents[1]
                   / "gpattn_ppl" / "data" / "clinc150_slice")
    p.add_argument("--domains", type=int, default=5)
    p.add_argument("--intents-per-domain", type=int, default=2)
    p.add_argument("--oos-train", type=int, default=50)
    p.add_argument("--oos-val", type=int, default=50)
    p.add_argument("--oos-test", type=int, default=200)
    p.add_argument("--train-per-intent", type=int, default=None,
                   help="keep the first N training queries of each intent (default: all)")
    p.add_argument("--purpose", default="tutorials and tests",
                   help="what the slice is for, in its SOURCE.md")
    args = p.parse_args(argv)
    defaults = {a.dest: a.default for a in p._actions}
    args.flags = " ".join(f"--{k.replace('_', '-')} {v}" for k, v in vars(args).items()
                          if k not in ("root", "out", "purpose") and v != defaults.get(k))
    if args.purpose != defaults["purpose"]:
        args.flags += f" --purpose {json.dumps(args.purpose)}"
    root = args.root.expanduser()
    full = json.loads((root / "data_full.json").read_text(encoding="utf-8"))
    domains = json.loads((root / "domains.json").read_text(encoding="utf-8"))
    data, chosen = select(full, domains, args.domains, args.intents_per_domain,
                          {"oos_train": args.oos_train, "oos_val": args.oos_val,
                           "oos_test": args.oos_test}, args.train_per_intent)
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "data_full.json").write_text(dump(data), encoding="utf-8")
    (args.out / "domains.json").write_text(dump(chosen), encoding="utf-8")
    shutil.copyfile(root / "LICENSE", args.out / "LICENSE")
    (args.out / "SOURCE.md").write_text(source_md(root, args.out, data, chosen, args),
                                        encoding="utf-8")
    total = sum(f.stat().st_size for f in args.out.iterdir() if f.is_file())
    print(f"{args.out}: " + ", ".join(f"{s} {len(v)}" for s, v in data.items())
          + f"; {sum(len(v) for v in chosen.values())} intents; {total} bytes")


if __name__ == "__main__":
    main()
