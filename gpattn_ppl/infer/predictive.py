"""Prediction: T stochastic passes through :class:`pyro.infer.Predictive`."""

from __future__ import annotations

import contextlib

import torch
from pyro.infer import Predictive

from ..settings import posterior_mean
from .program import PyroProgram

__all__ = ["predict"]


@torch.no_grad()
def predict(program: PyroProgram, dataset, *, num_samples: int = 10, batch_size: int = 256,
            device: torch.device | str = "cpu", mean: bool = False, limit: int | None = None
            ) -> dict[str, torch.Tensor]:
    """Per-pass class probabilities and logits on ``dataset``.

    Deterministic networks are run once (T = 1); stochastic ones ``num_samples`` times through
    :class:`pyro.infer.Predictive` (guide then model, ``logits`` returned as a site).

    :param mean: use the units' posterior means (one pass) instead of samples.
    :param limit: evaluate only the first ``limit`` examples (smoke runs).
    :returns: ``{"probs": [T, n, K], "logits": [T, n, K], "labels": [n]}`` on the CPU.
    """
    net = program.net
    was_training = net.training
    net.eval()
    T = num_samples if (net.stochastic and not mean) else 1
    predictive = Predictive(program.model, guide=program.guide, num_samples=T,
                            return_sites=["logits"], parallel=False)
    logits, labels = [], []
    n = len(dataset) if limit is None else min(limit, len(dataset))
    try:
        with posterior_mean(mean):
            for start in range(0, n, batch_size):
                idx = torch.arange(start, min(start + batch_size, n))
                b = dataset.batch(idx).to(device)
                # T > 1: the deterministic prefix runs once per batch (exact, see PrefixCache)
                reuse = net.prefix_cache() if T > 1 and hasattr(net, "prefix_cache") else None
                with reuse if reuse is not None else contextlib.nullcontext():
                    out = predictive(b.x, b.mask, None, None)["logits"]
                logits.append(out.reshape(T, len(idx), -1).float().cpu())
                labels.append(b.y.cpu())
    finally:
        net.train(was_training)
    logits = torch.cat(logits, 1)
    return {"logits": logits, "probs": torch.softmax(logits.double(), -1), "labels": torch.cat(labels)}
