r"""Where a stochastic network's predictive spread goes: the variance budget.

A unit can carry a wide posterior and still give a network whose passes agree to five decimals:
the spread can be lost at any stage between the latent and the class probabilities. The budget
measures it stage by stage, on real tokens of a fixed set of examples
(``docs/derivations/uncertainty_budget.rst``):

* per GP unit, in closed form from :meth:`~gpattn_ppl.attention.AttentionUnit.predictive`
  (no sampling; at the unit's inputs under the posterior mean of everything upstream):

  - ``head_snr`` :math:`=\sum \mathrm{Var}[f] / \sum \bar f^2`, the head outputs' variance
    against their squared mean (how noisy the unit's own output is);
  - ``head_var_ratio`` :math:`=\sum \mathrm{Var}_q[f] / \sum \mathrm{Var}_{p}[f]`, the same
    variance under q(u) against q(u) set to the prior (:func:`q_at_prior`; units with a
    variational q(u) only): 1 where the data taught the unit nothing, 0 where q(u) collapsed;

* per stochastic unit, over ``num_samples`` passes of the whole network:
  ``output_rel_var`` :math:`=\overline{\|o_t-\bar o\|^2} / \|\bar o\|^2` of its output
  ``[B, N, C]`` (after :math:`W_O`), and ``block_rel_var``, the same for the output of the
  module that holds the unit (a Transformer block: the residual stream after it; a swapped
  encoder's attention adapter: after its residual and layer norm);
* for the network: ``features_rel_var`` (the same for the pooled features that enter the
  classifier), ``logit_std`` (the mean over examples and classes of the logits' standard
  deviation over passes) and ``mutual_info`` (its mean over examples, nats).

Reading it: a small ``head_var_ratio`` is a collapsed posterior; a large ``head_snr`` with a
small ``output_rel_var`` is variance the output map drops; a large ``output_rel_var`` with a
small ``block_rel_var`` is variance the residual stream dilutes; a large ``block_rel_var`` with
a small ``features_rel_var`` is variance the later layers or the pooling average away.
"""

from __future__ import annotations

import copy

import torch
from torch import nn

from ..attention.base import AttentionUnit
from ..metrics import mutual_information
from ..settings import posterior_mean
from .predictive import program_pass
from .program import PyroProgram

__all__ = ["q_at_prior", "set_q_to_prior", "stochastic_units", "variance_budget"]


def stochastic_units(net: nn.Module) -> dict[str, AttentionUnit]:
    """The stochastic attention units of ``net`` by module path, in module order."""
    return {name: m for name, m in net.named_modules()
            if isinstance(m, AttentionUnit) and m.stochastic}


@torch.no_grad()
def set_q_to_prior(unit: AttentionUnit) -> bool:
    """Set ``unit``'s variational distribution to its prior (KL 0) in place; ``False`` (and
    nothing changed) for a unit without a variational q(u) (CGPT, SCGPT: their variance is the
    conditional of the GP given the keys; sto-trans: no GP).

    * SGPA: zero values (:math:`m_w = 0`; the value part of ``proj``), :math:`R = I`
      (``raw_chol`` 0), decoupled :math:`a_\\beta = 0` (``inducing_weights``);
    * KEP-SVGP: :math:`q(u_d) = N(0, \\Lambda^2)`.
    """
    from ..attention.kep_svgp import KEPSVGPAttention
    from ..attention.sgpa import SGPAttention

    if isinstance(unit, SGPAttention):
        unit.proj.weight[unit.dim:].zero_()
        if unit.proj.bias is not None:
            unit.proj.bias[unit.dim:].zero_()
        unit.strategy.raw_chol.zero_()
        if unit.variant == "decoupled":
            unit.strategy.inducing_weights.zero_()
        return True
    if isinstance(unit, KEPSVGPAttention):
        q_u, lam = unit.strategy.q_u, unit.features.lambda_
        H, s = lam.shape
        q_u.variational_mean.zero_()
        q_u.chol_variational_covar.copy_(torch.diag_embed(lam)[:, None].expand(H, s, s, s))
        return True
    return False


def q_at_prior(unit: AttentionUnit) -> AttentionUnit | None:
    """A copy of ``unit`` with q(u) at its prior (:func:`set_q_to_prior`), or ``None`` for a
    unit without a variational q(u)."""
    prior = copy.deepcopy(unit)
    return prior if set_q_to_prior(prior) else None


def _masked_sum(t: torch.Tensor, mask: torch.Tensor | None) -> torch.Tensor:
    """Sum of ``t [B, H, N, D]`` over real tokens (all tokens without a mask), float64."""
    t = t.double()
    if mask is not None:
        t = t * mask[:, None, :, None].to(t.dtype)
    return t.sum()


def _rel_spread(draws: torch.Tensor) -> float:
    r""":math:`\overline{\|x_t-\bar x\|^2}/\|\bar x\|^2` of ``draws [T, ...]`` (float64)."""
    draws = draws.double()
    mean = draws.mean(0)
    return float((draws - mean).square().sum(tuple(range(1, draws.dim()))).mean()
                 / mean.square().sum().clamp_min(1e-300))


@torch.no_grad()
def variance_budget(program: PyroProgram, dataset, *, num_samples: int = 16,
                    limit: int = 256, device: torch.device | str = "cpu",
                    seed: int = 0) -> dict:
    """The variance budget (module docstring) of ``program.net`` on the first ``limit``
    examples of ``dataset``, in one batch, with ``num_samples`` passes.

    The random state is restored afterwards, so a training run that measures its budget draws
    what it would draw without it.

    :returns: ``{"units": {path: {...}}, "features_rel_var", "logit_std", "mutual_info",
        "num_samples", "examples"}``; a network without stochastic units gets ``units`` empty
        and zeros (one pass).
    :raises ValueError: ``num_samples`` < 2 or ``limit`` < 1.
    """
    if num_samples < 2 or limit < 1:
        raise ValueError(f"variance_budget: need num_samples >= 2 and limit >= 1, got "
                         f"{num_samples} and {limit}")
    net = program.net
    units = stochastic_units(net)
    n = min(limit, len(dataset))
    b = dataset.batch(torch.arange(n)).to(device)
    was_training = net.training
    device = torch.device(device)
    rng = torch.random.fork_rng(devices=[device] if device.type == "cuda" else [])
    captured: dict[str, list] = {p: [] for p in units}
    features: list[torch.Tensor] = []

    def unit_hook(path):
        def hook(module, args, kwargs, out):
            x = args[0]
            mask = args[1] if len(args) > 1 else kwargs.get("mask")
            # the rotary positions a host adapter gave the unit (ModernBERT), for the closed forms
            captured[path].append((x, mask, out, module._rotary))
        return hook

    blocks: dict[str, list] = {p: [] for p in units}
    modules = dict(net.named_modules())
    head = getattr(net, "head", None)
    handles = [u.register_forward_hook(unit_hook(p), with_kwargs=True) for p, u in units.items()]
    for p in units:
        parent = modules[p.rpartition(".")[0]] if "." in p else None
        if parent is not None and parent is not net:
            handles.append(parent.register_forward_hook(
                lambda module, args, out, p=p: blocks[p].append(
                    out[0] if isinstance(out, tuple) else out)))
    if isinstance(head, nn.Module):
        handles.append(head.register_forward_pre_hook(
            lambda module, args: features.append(args[0])))
    net.eval()
    try:
        with rng:
            torch.manual_seed(seed)
            return _measure(program, b, units, captured, blocks, features, num_samples, n)
    finally:
        for h in handles:
            h.remove()
        net.train(was_training)


def _per_pass(draws: list[torch.Tensor], T: int) -> torch.Tensor:
    """``[T, k, ...]`` from the ``T * k`` outputs of a module called ``k`` times per pass (a
    shared layer, e.g. ALBERT's), in call order."""
    stacked = torch.stack(draws)
    return stacked.reshape(T, len(draws) // T, *stacked.shape[1:])


def _measure(program, b, units, captured, blocks, features, num_samples: int, n: int) -> dict:
    """The budget's passes and numbers (:func:`variance_budget`, hooks in place)."""
    net = program.net
    # one posterior-mean pass: each unit's inputs for the closed forms (its first call)
    with posterior_mean(True):
        program_pass(program, b.x, b.mask)
    inputs = {p: (captured[p][0][:2], captured[p][0][3]) for p in units}
    for p in units:
        captured[p].clear()
        blocks[p].clear()
    features.clear()
    T = num_samples if net.stochastic else 1
    logits = torch.stack([program_pass(program, b.x, b.mask) for _ in range(T)])
    report: dict = {"units": {}, "num_samples": T, "examples": n}
    for path, unit in units.items():
        (x, mask), rotary = inputs[path]
        row: dict = {"kind": type(unit).__name__}
        real = None if mask is None else mask[None, None, :, :, None]
        outs = _per_pass([c[2] for c in captured[path]], T)          # [T, k, B, N, C]
        if real is not None:
            outs = outs * real.to(outs.dtype)
        row["output_rel_var"] = _rel_spread(outs)
        if blocks[path]:
            held = _per_pass(blocks[path], T)
            if real is not None and held.shape[2:4] == mask.shape:
                held = held * real.to(held.dtype)
            row["block_rel_var"] = _rel_spread(held)
        try:
            with unit.positions(rotary):
                pred = unit.predictive(x, mask)
        except NotImplementedError:
            pred = None
        if pred is not None:
            var = _masked_sum(pred.variance, mask)
            row["head_snr"] = float(var / _masked_sum(pred.mean.square(), mask)
                                    .clamp_min(1e-300))
            prior = q_at_prior(unit)
            if prior is not None:
                with prior.positions(rotary):
                    pv = _masked_sum(prior.predictive(x, mask).variance, mask)
                row["head_var_ratio"] = float(var / pv.clamp_min(1e-300))
        report["units"][path] = row
    report["features_rel_var"] = (_rel_spread(torch.stack(features))
                                  if features and T > 1 else 0.0)
    report["logit_std"] = float(logits.double().std(0).mean()) if T > 1 else 0.0
    report["mutual_info"] = (float(mutual_information(torch.softmax(logits.double(), -1)).mean())
                             if T > 1 else 0.0)
    return report
