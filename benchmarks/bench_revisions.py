"""A/B step time of every attention unit between two checkouts of the library (for example the
code before and after a refactor), in one run: rounds alternate old and new, each in a fresh
process, and the JSON holds the medians and the per-round ratio range.

    git worktree add /tmp/base <rev>
    python benchmarks/bench_revisions.py --old /tmp/base --new . --N 64 --rounds 8 --repeats 30 \
        --out benchmarks/results/revisions_n64.json

Timed: one forward + backward of a unit (B = 32, C = 128, H = 4, train mode, objective terms
included), median over ``repeats`` after 3 warm-up steps, 2 threads. With ``softmax`` among the
units, each side's ratio of every unit to its own softmax (median over rounds, and the range)
is recorded too. Never asserted by a test.
"""
import argparse
import json
import statistics
import subprocess
import sys
from pathlib import Path

CODE = r'''
import sys, json, time, torch
if sys.argv[5] == "keep":  # the command line's allocator policy (gpattn_ppl.run.allocator)
    import ctypes
    m = ctypes.CDLL("libc.so.6").mallopt
    assert m(-3, 1 << 30) == 1 and m(-1, (1 << 31) - 1) == 1 and m(-2, 64 << 20) == 1
repo = sys.argv[1]; sys.path.insert(0, repo)
import gpattn_ppl; assert gpattn_ppl.__file__.startswith(repo), gpattn_ppl.__file__
from gpattn_ppl.attention import build_attention
torch.set_num_threads(2)
specs = json.loads(sys.argv[2]); N = int(sys.argv[3])
out = {}
for name, spec in specs.items():
    spec = dict(spec); kind = spec.pop("kind")
    torch.manual_seed(0)
    u = build_attention(kind, 128, 4, **spec).train()
    g = torch.Generator().manual_seed(0)
    x = torch.randn(32, N, 128, generator=g).requires_grad_(True)
    m = torch.ones(32, N, dtype=torch.bool)
    def step():
        y = u(x, m); loss = y.square().mean() + sum(v.sum() for v in u.objective_terms().values())
        loss.backward(); u.zero_grad(set_to_none=True); x.grad = None
    for _ in range(3): step()
    ts = []
    for _ in range(int(sys.argv[4])):
        t0 = time.perf_counter(); step(); ts.append(time.perf_counter() - t0)
    out[name] = sorted(ts)[len(ts)//2]
print(json.dumps(out))
'''


def specs(N: int) -> dict:
    return {"softmax": {"kind": "softmax"}, "kernel": {"kind": "kernel"},
            "kep_add": {"kind": "kep_svgp", "rank": 10},
            "kep_concat": {"kind": "kep_svgp", "rank": 10, "merge": "concat", "seq_len": N},
            "sgpa_dec_full": {"kind": "sgpa"}, "sgpa_dec_diag": {"kind": "sgpa", "cov": "diag"},
            "sgpa_std": {"kind": "sgpa", "variant": "standard", "max_len": N},
            "cgpt": {"kind": "cgpt"}, "scgpt": {"kind": "scgpt", "num_inducing": 8},
            "gumbel": {"kind": "gumbel"}, "h_gumbel": {"kind": "h_gumbel"}}


def _revision(repo: str) -> str:
    """``git describe --always --dirty`` of a checkout (recorded instead of its local path)."""
    proc = subprocess.run(["git", "-C", repo, "describe", "--always", "--dirty"],
                          capture_output=True, text=True)
    return proc.stdout.strip() or "unknown"


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--old", required=True, help="checkout A (e.g. a git worktree)")
    p.add_argument("--new", required=True, help="checkout B")
    p.add_argument("--N", type=int, default=64)
    p.add_argument("--rounds", type=int, default=8)
    p.add_argument("--repeats", type=int, default=30)
    p.add_argument("--units", nargs="*", default=None, help="a subset of the units (default all)")
    p.add_argument("--malloc", choices=["keep", "system"], default="system",
                   help="allocator policy of both sides: glibc's defaults, or keep freed memory "
                        "as the command line does since gpattn_ppl.run.allocator")
    p.add_argument("--out", default=None)
    args = p.parse_args()
    old, new = str(Path(args.old).resolve()), str(Path(args.new).resolve())
    units = specs(args.N)
    if args.units:
        unknown = sorted(set(args.units) - set(units))
        if unknown:
            p.error(f"unknown unit(s) {unknown}; known: {', '.join(units)}")
        units = {k: units[k] for k in args.units}
    res = {"old": [], "new": []}
    for _ in range(args.rounds):
        for label, repo in (("old", old), ("new", new)):
            proc = subprocess.run([sys.executable, "-c", CODE, repo, json.dumps(units),
                                   str(args.N), str(args.repeats), args.malloc],
                                  capture_output=True, text=True, cwd="/")
            if proc.returncode:
                sys.exit(proc.stderr[-2000:])
            res[label].append(json.loads(proc.stdout))
    summary = {}
    for name in units:
        o = statistics.median(r[name] for r in res["old"])
        n = statistics.median(r[name] for r in res["new"])
        ratios = [b[name] / a[name] for a, b in zip(res["old"], res["new"])]
        summary[name] = {"old_ms": round(1e3 * o, 3), "new_ms": round(1e3 * n, 3),
                         "new/old": round(n / o, 3), "per_round_ratio_min": round(min(ratios), 3),
                         "per_round_ratio_max": round(max(ratios), 3)}
        if "softmax" in units:  # each checkout's unit over its own softmax, per process
            for side in ("old", "new"):
                per = [r[name] / r["softmax"] for r in res[side]]
                summary[name][f"{side}_over_softmax"] = round(statistics.median(per), 3)
                summary[name][f"{side}_over_softmax_range"] = [round(min(per), 3),
                                                               round(max(per), 3)]
    out = {"old": _revision(old), "new": _revision(new), "malloc": args.malloc, "N": args.N, "B": 32, "C": 128, "H": 4, "rounds": args.rounds,
           "repeats": args.repeats, "units": summary}
    text = json.dumps(out, indent=1)
    if args.out:
        Path(args.out).write_text(text + "\n")
    print(text)


if __name__ == "__main__":
    main()
