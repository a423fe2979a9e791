"""bfloat16 autocast against float32 for every attention unit on CPU: outputs, objective terms,
the dtypes of the factorisations, and a tiny training run in both precisions.

For every unit spec of ``benchmarks/bench_units.py`` (``UNITS``), at B = 8, N = 32, C = 64,
H = 4 (two sequences of the batch padded):

* ``output``: the relative Frobenius error over the real tokens of the unit's output under
  ``torch.autocast("cpu", dtype=torch.bfloat16)`` against float32 (same unit, same seed, eval
  mode, posterior mean: :class:`gpattn_ppl.settings.posterior_mean`), and the largest absolute
  error relative to the largest float32 entry;
* ``terms``: each train-mode objective term (float32 call first, so SCGPT's data-initialised
  inducing inputs are the same for both), its dtype under autocast and its relative error (norm
  over the batch);
* ``factor_ops``: the dtypes of every factorisation / solve aten op of one train-mode forward
  (under autocast) and backward (outside it, as the fit loop does);
* ``loss``: a one-block text classifier (width C, H heads, the unit as its attention) trained
  ``--steps`` AdamW steps on one fixed synthetic batch of B sequences of N tokens with the
  library's objective (:class:`~gpattn_ppl.infer.program.PyroProgram`, thin mode, every
  objective weight 1), once in float32 and once under bf16 autocast from the same seed; the loss
  every ``--every`` steps (and the last).

Writes ``benchmarks/results/precision_cpu.json`` (git revision and command line included) and
prints a compact table. The assertions live in ``tests/attention/test_mixed_precision.py``.

    python benchmarks/bench_precision.py                  # the full setting (~10 s on 2 cores)
    python benchmarks/bench_precision.py --units cgpt     # a subset
    python benchmarks/bench_precision.py --smoke          # tiny sizes, JSON to a temp file
"""

from __future__ import annotations

import argparse
import importlib.util
import math
import sys
import tempfile
import time
from pathlib import Path

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten

from gpattn_ppl import settings
from gpattn_ppl.run.benchmarking import build_unit, layer_inputs, provenance, write_json

ROOT = Path(__file__).resolve().parents[1]


def _bench_units():
    spec = importlib.util.spec_from_file_location("_bench_units", ROOT / "benchmarks" /
                                                  "bench_units.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


_BU = _bench_units()
UNITS: dict[str, dict] = dict(_BU.UNITS)

#: aten factorisation / solve / determinant / eigen ops whose dtypes are recorded
FACTOR_OPS = frozenset({
    "cholesky", "linalg_cholesky", "linalg_cholesky_ex", "cholesky_solve", "_cholesky_solve_helper",
    "cholesky_inverse", "triangular_solve", "linalg_solve_triangular", "linalg_solve",
    "linalg_solve_ex", "_linalg_solve_ex", "linalg_eigh", "_linalg_eigh", "linalg_eigvalsh",
    "linalg_eig", "logdet", "slogdet", "linalg_slogdet", "_linalg_slogdet", "det",
    "linalg_det", "_linalg_det", "inverse", "linalg_inv", "linalg_inv_ex", "linalg_lu_factor_ex",
    "linalg_lu_solve", "lu_solve", "linalg_qr", "linalg_svd", "_linalg_svd"})


class _FactorOps(TorchDispatchMode):
    """``ops``: aten op name -> floating dtypes of its inputs and outputs (ops of FACTOR_OPS)."""

    def __init__(self) -> None:
        super().__init__()
        self.ops: dict[str, set[str]] = {}

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        out = func(*args, **kwargs)
        name = func.overloadpacket.__name__
        if name in FACTOR_OPS:
            self.ops.setdefault(name, set()).update(
                str(t.dtype).removeprefix("torch.") for t in tree_flatten((args, kwargs, out))[0]
                if isinstance(t, torch.Tensor) and t.is_floating_point())
        return out


def _bf16():
    return torch.autocast("cpu", dtype=torch.bfloat16)


def relative_error(a: torch.Tensor, ref: torch.Tensor) -> float:
    """``||a - ref||_F / ||ref||_F`` in float64."""
    a, ref = a.double(), ref.double()
    return float((a - ref).norm() / ref.norm().clamp_min(1e-30))


def _inputs(B: int, N: int, C: int):
    x, mask = layer_inputs(B, N, C, seed=1)
    mask[0, N - N // 4:] = False
    mask[B - 1, N // 2:] = False
    return x.detach().float(), mask


def _unit(name: str, N: int, C: int, H: int):
    torch.manual_seed(0)
    return build_unit(_BU.spec_at(UNITS[name], N), C, H).float()


def output_error(name: str, B: int, N: int, C: int, H: int) -> dict:
    unit = _unit(name, N, C, H).eval()
    x, mask = _inputs(B, N, C)
    with torch.no_grad(), settings.posterior_mean(True):
        torch.manual_seed(3)
        ref = unit(x, mask)
        torch.manual_seed(3)
        with _bf16():
            out = unit(x, mask)
    diff = (out.double() - ref.double())[mask]
    return {"rel_fro": relative_error(out[mask], ref[mask]),
            "max_abs_over_max": float(diff.abs().max() / ref[mask].abs().max()),
            "dtype_bf16": str(out.dtype).removeprefix("torch."),
            "finite": bool(torch.isfinite(out).all())}


def term_errors(name: str, B: int, N: int, C: int, H: int) -> dict:
    unit = _unit(name, N, C, H).train()
    x, mask = _inputs(B, N, C)
    with torch.no_grad():
        torch.manual_seed(5)
        unit(x, mask)
        ref = {k: v.clone() for k, v in unit.objective_terms().items()}
        torch.manual_seed(5)
        with _bf16():
            unit(x, mask)
        got = unit.objective_terms()
    return {k: {"fp32_mean": float(ref[k].double().mean()),
                "bf16_mean": float(got[k].double().mean()) if k in got else None,
                "dtype_bf16": str(got[k].dtype).removeprefix("torch.") if k in got else None,
                "rel_err": relative_error(got[k], ref[k]) if k in got else None}
            for k in ref}


def factor_ops(name: str, B: int, N: int, C: int, H: int) -> dict:
    unit = _unit(name, N, C, H).train()
    x, mask = _inputs(B, N, C)
    rec = _FactorOps()
    with rec:
        torch.manual_seed(0)
        with _bf16():
            out = unit(x, mask)
            terms = unit.objective_terms()
        (out.float().square().mean() + sum(v.float().sum() for v in terms.values())).backward()
    return {op: sorted(d) for op, d in sorted(rec.ops.items())}


def tiny_training(name: str, *, precision: str, B: int, N: int, C: int, H: int, steps: int,
                  every: int, lr: float = 1e-3, vocab: int = 30) -> dict:
    """The loss of a one-block text classifier with unit ``name`` trained ``steps`` AdamW steps on
    one fixed batch, every ``every`` steps (and the last), forward under ``precision``."""
    from gpattn_ppl.infer.precision import autocast
    from gpattn_ppl.infer.program import PyroProgram
    from gpattn_ppl.models import build_model
    from gpattn_ppl.ppl.objective import OBJECTIVE_WEIGHTS

    g = torch.Generator().manual_seed(0)
    tok = torch.randint(1, vocab, (B, N), generator=g)
    mask = torch.ones(B, N, dtype=torch.bool)
    mask[1, N - N // 4:] = False
    mask[B - 1, N // 3:] = False
    tok = tok.masked_fill(~mask, 0)
    y = torch.randint(0, 2, (B,), generator=g)
    torch.manual_seed(0)
    net = build_model({"arch": "text", "dim": C, "heads": H, "depth": 1, "mlp_dim": C,
                       "dropout": 0.0, "max_len": N,
                       "attention": _BU.spec_at(UNITS[name], N)},
                      num_classes=2, vocab_size=vocab).float()
    prog = PyroProgram(net, num_data=B,
                       objective={key: 1.0 for key, _ in OBJECTIVE_WEIGHTS.values()})
    opt = torch.optim.AdamW(net.parameters(), lr=lr)
    index = torch.arange(B)
    at, losses = [], []
    t0 = time.perf_counter()
    for i in range(steps):
        torch.manual_seed(100 + i)
        with autocast(precision, "cpu"):
            loss = prog.loss(tok, mask, y, index)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        if i % every == 0 or i == steps - 1:
            at.append(i)
            losses.append(float(loss.detach()))
    return {"steps": at, "loss": losses, "seconds": time.perf_counter() - t0}


def run_unit(name: str, a) -> dict:
    t0 = time.perf_counter()
    row = {"spec": UNITS[name],
           "output": output_error(name, a.B, a.N, a.C, a.H),
           "terms": term_errors(name, a.B, a.N, a.C, a.H),
           "factor_ops": factor_ops(name, a.B, a.N, a.C, a.H)}
    curves = {p: tiny_training(name, precision=p, B=a.B, N=a.N, C=a.C, H=a.H, steps=a.steps,
                               every=a.every, lr=a.lr) for p in ("fp32", "bf16")}
    fp, bf = curves["fp32"]["loss"], curves["bf16"]["loss"]
    row["loss"] = {"steps": curves["fp32"]["steps"], "fp32": fp, "bf16": bf,
                   "seconds": {p: c["seconds"] for p, c in curves.items()},
                   # largest |fp32 - bf16| over the recorded steps, relative to the first loss
                   "max_gap_over_initial": max(abs(u - v) for u, v in zip(fp, bf)) / abs(fp[0]),
                   "finite": all(map(math.isfinite, fp + bf)),
                   "decreased": {"fp32": fp[-1] < fp[0], "bf16": bf[-1] < bf[0]}}
    row["seconds"] = time.perf_counter() - t0
    return row


def print_table(res: dict) -> None:
    units = res["units"]
    print(f"{'unit':14s} {'out err':>8s} {'max|d|':>8s} {'term err':>8s} {'factor dtypes':>14s}"
          f"  {'loss fp32':>15s}  {'loss bf16':>15s} {'gap':>6s}")
    for name, r in units.items():
        terms = [t["rel_err"] for t in r["terms"].values() if t["rel_err"] is not None]
        dts = sorted({d for v in r["factor_ops"].values() for d in v}) or ["-"]
        fp, bf = r["loss"]["fp32"], r["loss"]["bf16"]
        print(f"{name:14s} {r['output']['rel_fro']:8.1e} {r['output']['max_abs_over_max']:8.1e} "
              f"{(f'{max(terms):.1e}' if terms else '-'):>8s} {','.join(dts):>14s}  "
              f"{fp[0]:6.3f} -> {fp[-1]:6.3f}  {bf[0]:6.3f} -> {bf[-1]:6.3f} "
              f"{r['loss']['max_gap_over_initial']:6.3f}")
    print("loss curves (steps " + ", ".join(map(str, next(iter(units.values()))["loss"]["steps"]))
          + "):")
    for name, r in units.items():
        for p in ("fp32", "bf16"):
            print(f"  {name:14s} {p}: " + " ".join(f"{v:.3f}" for v in r["loss"][p]))


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--B", type=int, default=8)
    p.add_argument("--N", type=int, default=32)
    p.add_argument("--C", type=int, default=64)
    p.add_argument("--H", type=int, default=4)
    p.add_argument("--steps", type=int, default=30, help="AdamW steps of the tiny training")
    p.add_argument("--every", type=int, default=5, help="record the loss every so many steps")
    p.add_argument("--lr", type=float, default=1e-3, help="AdamW learning rate")
    p.add_argument("--units", nargs="+", choices=list(UNITS), default=list(UNITS),
                   metavar="UNIT", help=f"a subset of: {', '.join(UNITS)}")
    p.add_argument("--threads", type=int, default=2,
                   help="torch intra-op threads (0: leave torch's default)")
    p.add_argument("--smoke", action="store_true",
                   help="tiny sizes (B=2, N=8, C=16, H=2, 4 steps)")
    p.add_argument("--out", default=None,
                   help="JSON path (default benchmarks/results/precision_cpu.json; a temp file "
                        "with --smoke)")
    return p


def main(argv: list[str] | None = None) -> int:
    a = build_parser().parse_args(argv)
    if a.smoke:
        a.B, a.N, a.C, a.H, a.steps, a.every = 2, 8, 16, 2, 4, 2
    if a.out is None:
        a.out = (str(Path(tempfile.gettempdir()) / "precision_smoke.json") if a.smoke
                 else "benchmarks/results/precision_cpu.json")
    if a.threads > 0:
        torch.set_num_threads(a.threads)
    units = list(dict.fromkeys(a.units))
    res = {**provenance(argv, ROOT), "smoke": a.smoke, "device": "cpu",
           "autocast_dtype": "bfloat16", "gp_dtype": str(settings.gp_dtype.value()),
           "setting": {"B": a.B, "N": a.N, "C": a.C, "H": a.H, "steps": a.steps,
                       "every": a.every, "lr": a.lr, "optimizer": "AdamW",
                       "classifier": {"arch": "text", "dim": a.C, "heads": a.H, "depth": 1,
                                      "mlp_dim": a.C, "dropout": 0.0, "vocab_size": 30,
                                      "num_classes": 2},
                       "objective_weights": 1.0},
           "units": {}}
    for name in units:
        res["units"][name] = run_unit(name, a)
    path = write_json(res, a.out)
    print_table(res)
    print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
