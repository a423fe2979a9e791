# ruff: noqa: E402 -- a tutorial imports what each section uses, where it is first used
"""
Write a new GP attention unit
=============================

A GP attention unit is two small classes: a **GP head**
(:class:`~gpattn_ppl.gp.head.GPHead`), which owns the algebra of one call, and a **unit** on
:class:`~gpattn_ppl.attention.gp_unit.GPAttentionUnit`, which owns the projections and the
output map and inherits ``attend``, ``predictive`` and ``attention_matrix`` (the protocol is in
:doc:`/architecture`, "The protocol of a GP head"). This tutorial writes **GP-regression
attention**: per head and channel, a GP on the keys observes the values with noise
:math:`\\sigma^2`, and the head outputs are its posterior at the keys,

.. math::
    f \\sim \\mathcal N\\big(K(K + \\sigma^2 I)^{-1}v,\\; K - K(K + \\sigma^2I)^{-1}K\\big),

then registers it and runs the public head mixin, :class:`~gpattn_ppl.testing.GPHeadTestCase`.
"""

# %%
# The head
# --------
#
# The state holds what every later step shares; padded tokens are removed by the block trick
# (:func:`~gpattn_ppl.linalg.block_mask`), every factorisation goes through
# :func:`gpattn_ppl.linalg.cholesky`. The latent ``f`` is drawn through ``sample``; its
# variational distribution is the posterior itself (no KL).

from dataclasses import dataclass

import torch
from torch import nn

from gpattn_ppl import linalg, settings
from gpattn_ppl.distributions import AttentionPredictive, TokenNormal
from gpattn_ppl.gp import GPHead
from gpattn_ppl.kernels import gram, make_attention_kernel


@dataclass
class RegressionState:
    K: torch.Tensor        # [B, H, N, N], block-masked
    L: torch.Tensor        # chol(K + s2 I)
    v: torch.Tensor        # [B, H, N, D], pad rows 0
    where: str


class GPRegressionHead(GPHead):
    def __init__(self, heads: int, head_dim: int, noise: float) -> None:
        super().__init__()
        self.kernel, self.noise = make_attention_kernel("rbf", heads, head_dim), noise

    def prepare(self, k, v, *, mask=None, where=""):
        dtype = settings.gp_dtype.resolve(k.dtype)
        k, v = linalg.mask_rows(k.to(dtype), mask), linalg.mask_rows(v.to(dtype), mask)
        K = linalg.block_mask(gram(self.kernel, k, k).to(dtype), mask)
        eye = torch.eye(K.shape[-1], dtype=dtype)
        L = linalg.cholesky(K + self.noise ** 2 * eye, where=f"{where} K + s2 I", head_axis=1)
        return RegressionState(K, L, v, where)

    def mean(self, state):
        return state.K @ linalg.cholesky_solve(state.v, state.L)

    def posterior(self, state) -> TokenNormal:
        A = linalg.triangular_solve(state.K, state.L)                  # L^-1 K
        cov = state.K - A.mT @ A
        jitter = settings.cholesky_jitter.value(cov.dtype)             # a computed covariance
        scale = linalg.cholesky(cov, where=f"{state.where} Sigma", head_axis=1, jitter=jitter)
        return TokenNormal(self.mean(state), scale_tril=scale)

    def draw(self, state, sample):
        return sample("f", lambda: self.posterior(state), local=True,
                      mean=lambda: self.mean(state))

    def predictive(self, state):
        return AttentionPredictive.from_token_normal(self.posterior(state))


# %%
# The unit
# --------
#
# The unit names its head, projects keys and values, and keeps the default output map (heads
# concatenated, then ``out`` = :math:`W_O`). Options are keyword-only, with defaults.

from gpattn_ppl.attention import ATTENTION, register_attention
from gpattn_ppl.attention.gp_unit import GPAttentionUnit


@register_attention("gp_regression")
class GPRegressionAttention(GPAttentionUnit):
    """GP-regression attention.

    :param noise: the observation noise sigma of the values.
    :param proj_dropout: dropout after W_O.
    """

    def __init__(self, dim: int, heads: int, *, noise: float = 0.5,
                 proj_dropout: float = 0.0) -> None:
        super().__init__(dim, heads, proj_dropout=proj_dropout)
        self.proj = nn.Linear(dim, 2 * dim, bias=False)
        self.gp = GPRegressionHead(heads, self.head_dim, noise)
        self.out = nn.Linear(dim, dim)

    @property
    def head(self):
        return self.gp

    def project(self, x, mask):
        B, N, _ = x.shape
        k, v = self.proj(x).view(B, N, 2, self.heads, self.head_dim).permute(2, 0, 3, 1, 4)
        return k, v


unit = GPRegressionAttention(8, 2)
x, mask = torch.randn(2, 5, 8), torch.tensor([[True] * 5, [True, False, True, True, False]])
pred = unit.predictive(x, mask)
print(pred.variance[1, 0, :, 0])          # the padded tokens 1 and 4: exactly 0

# %%
# The head mixin
# --------------
#
# In a test module, subclass the mixin and declare the factorisations of a training sample, a
# posterior-mean call and a predictive (here: :math:`K + \sigma^2I`, then :math:`\Sigma` where
# the posterior is built). Inside the library, ``tests/attention/test_gp_heads.py`` runs it over
# every registered GP unit. Here its checks are called one by one, as pytest would:

import pytest

from gpattn_ppl.testing import GPHeadTestCase


class TestGPRegressionHead(GPHeadTestCase):
    factorisations = {"sample": 2, "mean": 1, "predictive": 2}

    def make_unit(self, dim, heads):
        return GPRegressionAttention(dim, heads)


for name in sorted(n for n in dir(TestGPRegressionHead) if n.startswith("test_")):
    try:
        getattr(TestGPRegressionHead(), name)()
        outcome = "passed"
    except pytest.skip.Exception as skip:
        outcome = f"skipped ({skip.msg})"
    print(f"{name:<52} {outcome}")

del ATTENTION["gp_regression"]          # the toy key leaves the registry again
