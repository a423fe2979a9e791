"""Naive reference implementations (explicit loops-free dense maths, float64)."""

import math

import torch


def softmax_attention_reference(x, mask, W_qkv, b_qkv, heads):
    """Explicit softmax attention with -inf on padded keys, before the output projection."""
    B, N, C = x.shape
    D = C // heads
    qkv = x @ W_qkv.T + b_qkv
    q, k, v = qkv[..., :C], qkv[..., C:2 * C], qkv[..., 2 * C:]
    outs = []
    for h in range(heads):  # reference: a plain loop over heads is fine here
        sl = slice(h * D, (h + 1) * D)
        logits = q[..., sl] @ k[..., sl].transpose(1, 2) / math.sqrt(D)
        if mask is not None:
            logits = logits.masked_fill(~mask[:, None, :], float("-inf"))
        A = torch.softmax(logits, -1)
        if mask is not None:
            assert torch.all(A.masked_select(~mask[:, None, :].expand_as(A)) == 0)
        outs.append(A @ v[..., sl])
    return torch.cat(outs, -1)
