"""Public test mixin every GP head inherits (modelled on gpytorch's ``VariationalTestCase``).

Subclass :class:`GPHeadTestCase` in a pytest module, implement :meth:`~GPHeadTestCase.make_unit`
(a :class:`~gpattn_ppl.attention.gp_unit.GPAttentionUnit`; the checks run on its
:attr:`~gpattn_ppl.attention.gp_unit.GPAttentionUnit.head` through the unit's projections) and
declare :attr:`~GPHeadTestCase.factorisations`:

>>> class TestMyHead(GPHeadTestCase):               # doctest: +SKIP
...     factorisations = {"sample": 1, "mean": 1, "predictive": 1}
...     def make_unit(self, dim, heads):
...         return MyGPAttention(dim=dim, heads=heads)

The checks: the head type and its declared terms, shapes and dtypes of the state's products,
invariance to padding anywhere in a sequence (not only trailing), an exactly zero predictive on
pads, the KL (non-negative; zero at q = prior where :meth:`~GPHeadTestCase.set_q_to_prior` is
given), the predictive mean and variance against many draws, a fixed number of factorisations
per call (every call of :func:`gpattn_ppl.linalg.cholesky`, escalations not counted),
gradients to every head parameter, float32 against float64, and pickling.
``tests/attention/test_gp_heads.py`` runs it over every registered GP unit.
"""

from __future__ import annotations

import pickle
from unittest import mock

import pytest
import torch

from .. import linalg
from ..distributions import AttentionPredictive
from ..gp.head import GPHead
from ..settings import posterior_mean

__all__ = ["GPHeadTestCase", "count_factorisations"]


def count_factorisations():
    """A context manager counting the calls of :func:`gpattn_ppl.linalg.cholesky` (every
    factorisation of the library goes through it; its jitter retries are not counted):
    ``with count_factorisations() as calls: ...; calls.call_count``."""
    return mock.patch.object(linalg, "cholesky", wraps=linalg.cholesky)


class GPHeadTestCase:
    """Inherited checks of the GP-head protocol (``docs/architecture.rst``)."""

    dim: int = 8
    heads: int = 2
    seq_len: int = 6
    batch: int = 3
    dtype: torch.dtype = torch.float64
    #: factorisations per call, asserted: ``{"sample": training-mode sample, "mean":
    #: posterior-mean call, "predictive": :meth:`predictive`}``
    factorisations: dict = {}
    #: the unit only accepts N == seq_len (no padding-invariance against a shorter sequence)
    fixed_length: bool = False
    #: parameters that legitimately get no gradient
    params_without_grad: frozenset = frozenset()
    #: draws of the predictive-against-samples check, and its tolerance in standard errors
    mc_samples: int = 6000
    #: atol of the float32 vs float64 predictive
    float32_atol: float = 2e-3

    def make_unit(self, dim: int, heads: int):
        """The GP attention unit under test; subclasses implement it."""
        raise NotImplementedError

    def set_q_to_prior(self, unit) -> None:
        """Set the unit's variational distribution to its prior (KL 0); ``pytest.skip`` where
        the head has no q(u) (the default)."""
        pytest.skip("the head has no variational distribution")

    # -- helpers ------------------------------------------------------------------------------
    def _unit(self):
        torch.manual_seed(0)
        return self.make_unit(self.dim, self.heads).to(self.dtype).eval()

    def _inputs(self, seed: int = 1):
        g = torch.Generator().manual_seed(seed)
        x = torch.randn(self.batch, self.seq_len, self.dim, generator=g, dtype=self.dtype)
        mask = torch.ones(self.batch, self.seq_len, dtype=torch.bool)
        mask[0, self.seq_len - 2:] = False          # trailing pads
        mask[1, 1] = mask[1, 3] = False             # pads in the middle
        mask[2, 0] = False                          # a leading pad
        return x, mask

    def _forward(self, unit, x, mask, mean: bool, seed: int = 0):
        torch.manual_seed(seed)
        with posterior_mean(mean):
            return unit(x, mask)

    # -- checks -------------------------------------------------------------------------------
    def test_head_type_and_declared_terms(self):
        """The unit's head is a GPHead; every term a call reports is declared in
        ``term_names``, in the declared order."""
        from ..attention.gp_unit import GPAttentionUnit

        unit = self._unit()
        assert isinstance(unit, GPAttentionUnit) and isinstance(unit.head, GPHead)
        x, mask = self._inputs()
        for training in (True, False):
            unit.train(training)
            self._forward(unit, x, mask, mean=False)
            names = list(unit.objective_terms())
            assert set(names) <= set(unit.head.term_names), (names, unit.head.term_names)
            order = [n for n in unit.head.term_names if n in names]
            assert names == order, (names, unit.head.term_names)

    def test_state_shapes_and_dtypes(self):
        """The predictive of a prepared state is ``[B, H, N, D]`` in the GP dtype, its joint
        per head and channel; a draw is finite; the output keeps the input dtype."""
        unit = self._unit()
        x, mask = self._inputs()
        pred = unit.predictive(x, mask)
        B, H, N, D = self.batch, self.heads, self.seq_len, self.dim // self.heads
        assert isinstance(pred, AttentionPredictive)
        assert pred.mean.shape == pred.variance.shape == (B, H, N, D)
        assert pred.mean.dtype == self.dtype
        if pred.mvn is not None:
            assert pred.mvn.batch_shape == (B, H, D) and pred.mvn.event_shape == (N,)
        out = self._forward(unit, x, mask, mean=False)
        assert out.shape == x.shape and out.dtype == x.dtype and torch.isfinite(out).all()

    def test_padding_anywhere_gives_the_unpadded_predictive(self):
        """Real tokens of a sequence padded anywhere get the predictive (mean and variance) of
        the unpadded sequence."""
        if self.fixed_length:
            pytest.skip("the unit is built for one sequence length")
        unit = self._unit()
        x, mask = self._inputs()
        pred = unit.predictive(x, mask)
        for b in range(self.batch):
            real = mask[b].nonzero().squeeze(-1)
            alone = unit.predictive(x[b:b + 1, real])
            torch.testing.assert_close(pred.mean[b][:, real], alone.mean[0], atol=1e-8, rtol=1e-6)
            torch.testing.assert_close(pred.variance[b][:, real], alone.variance[0], atol=1e-8,
                                       rtol=1e-6)

    def test_predictive_is_exactly_zero_on_pads(self):
        """Mean, variance and the joint's rows of padded tokens are exactly 0."""
        unit = self._unit()
        x, mask = self._inputs()
        pred = unit.predictive(x, mask)
        pads = ~mask
        assert (pred.mean.transpose(1, 2)[pads] == 0).all()
        assert (pred.variance.transpose(1, 2)[pads] == 0).all()
        if pred.mvn is not None:
            cov = pred.mvn.lazy_covariance_matrix.to_dense()                # [B, H, D, N, N]
            assert (cov.permute(0, 3, 1, 2, 4)[pads] == 0).all()
            assert (pred.mvn.mean.mT.transpose(1, 2)[pads] == 0).all()

    def test_kl_is_nonnegative_and_zero_at_the_prior(self):
        """Every ``kl`` term is >= 0; with q(u) set to the prior it is 0 (where the head has a
        q(u): :meth:`set_q_to_prior`)."""
        unit = self._unit()
        x, mask = self._inputs()
        self._forward(unit, x, mask, mean=True)
        kl = {n: v for n, v in unit.objective_terms().items() if n.startswith("kl")}
        for name, value in kl.items():
            assert (value >= -1e-10).all(), (name, value)
        with torch.no_grad():
            self.set_q_to_prior(unit)
        self._forward(unit, x, mask, mean=True)
        kl = {n: v for n, v in unit.objective_terms().items() if n.startswith("kl")}
        assert kl, "no KL term reported"
        for name, value in kl.items():
            torch.testing.assert_close(value, torch.zeros_like(value), atol=1e-10, rtol=0,
                                       msg=lambda m, name=name: f"{name} at q = prior: {m}")

    def test_predictive_matches_many_draws(self):
        """With :math:`W_O = I`, the sampled head outputs of ``mc_samples`` calls have the
        predictive's mean and variance (within 5 standard errors, per token and channel)."""
        unit = self._unit()
        with torch.no_grad():
            unit.out.weight.copy_(torch.eye(self.dim, dtype=self.dtype))
            unit.out.bias.zero_()
        x, mask = self._inputs()
        pred = unit.predictive(x, mask)
        reps = self.mc_samples
        torch.manual_seed(11)
        with torch.no_grad():
            out = unit(x.repeat(reps, 1, 1), mask.repeat(reps, 1))
        B, N, H = self.batch, self.seq_len, self.heads
        out = out.view(reps, B, N, H, -1).transpose(2, 3)                   # [S, B, H, N, D]
        real = mask[:, None, :, None].expand_as(pred.mean)
        mean, var = out.mean(0), out.var(0)
        se = (pred.variance.clamp_min(0) / reps).sqrt()
        assert ((mean - pred.mean).abs()[real] <= 5 * se[real] + 1e-8).all()
        se_var = pred.variance * (2.0 / (reps - 1)) ** 0.5
        assert ((var - pred.variance).abs()[real] <= 5 * se_var[real] + 1e-8).all()

    def test_factorisations_per_call(self):
        """The number of factorisations of a training sample, a posterior-mean call and a
        predictive is the declared one (a change of the algebra's cost shows here)."""
        if not self.factorisations:
            pytest.skip("no factorisation counts declared")
        unit = self._unit()
        x, mask = self._inputs()
        counts = {}
        for name, call in (("sample", lambda: self._forward(unit.train(), x, mask, False)),
                           ("mean", lambda: self._forward(unit.eval(), x, mask, True)),
                           ("predictive", lambda: unit.eval().predictive(x, mask))):
            with count_factorisations() as calls:
                call()
            counts[name] = calls.call_count
        assert counts == self.factorisations

    def test_gradients_reach_every_head_parameter(self):
        """A training call's output and terms send finite, non-zero gradients to every
        parameter of the head (except ``params_without_grad``)."""
        unit = self._unit().train()
        x, mask = self._inputs()
        out = self._forward(unit, x, mask, mean=False)
        loss = out[mask].square().sum() + sum(v.sum() for v in unit.objective_terms().values())
        loss.backward()
        head_params = {id(p) for p in unit.head.parameters()}
        for name, p in unit.named_parameters():
            if id(p) not in head_params or not p.requires_grad or name in self.params_without_grad:
                continue
            assert p.grad is not None, f"no gradient reaches {name}"
            assert torch.isfinite(p.grad).all() and p.grad.abs().sum() > 0, name

    def test_float32_agrees_with_float64(self):
        """The predictive of the float32 unit is float32 and matches float64."""
        unit = self._unit()
        x, mask = self._inputs()
        ref = unit.predictive(x, mask)
        pred = unit.float().predictive(x.float(), mask)
        assert pred.mean.dtype == torch.float32
        for a, b in ((pred.mean, ref.mean), (pred.variance, ref.variance)):
            torch.testing.assert_close(a.double(), b, atol=self.float32_atol,
                                       rtol=self.float32_atol)

    def test_pickle_round_trip(self):
        """A pickled head (through its unit) gives the same predictive and the same draw."""
        unit = self._unit()
        other = pickle.loads(pickle.dumps(unit))
        assert type(other.head) is type(unit.head)
        x, mask = self._inputs()
        torch.testing.assert_close(other.predictive(x, mask).mean, unit.predictive(x, mask).mean)
        torch.testing.assert_close(self._forward(other, x, mask, False, seed=6),
                                   self._forward(unit, x, mask, False, seed=6))
