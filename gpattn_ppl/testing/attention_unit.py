"""Public test mixin every attention unit inherits (the gpytorch ``test/`` habit).

Subclass :class:`AttentionUnitTestCase` in a pytest module and implement
:meth:`~AttentionUnitTestCase.make_unit`; the dozen inherited checks then run on the new unit:

>>> class TestMyUnit(AttentionUnitTestCase):        # doctest: +SKIP
...     def make_unit(self, dim, heads):
...         return MyAttention(dim=dim, heads=heads)

Class attributes tune the checks: ``dim``/``heads``/``seq_len``, ``params_without_grad`` (names
of parameters that legitimately get no gradient), ``token_permutation_equivariant``,
``fixed_length`` (the unit is built for one N, e.g. KEP-SVGP's concat merge: the unpadded-sequence
check becomes "a shorter sequence raises"), ``atol``, ``float32_atol`` (float32 vs float64),
``mean_is_expectation`` (the posterior-mean mode returns the expectation of the sampled output;
false for the Gumbel units, whose mean mode is the modal value), ``mc_samples`` and ``device``
(where the unit and its inputs are moved: ``"cuda"`` in ``tests/run/test_cuda_mixin.py``; the
default ``None`` leaves them where torch creates them).

``tests/attention/test_registry.py`` runs this mixin over every key of the attention registry,
so a newly registered unit inherits these checks with its defaults.
"""

from __future__ import annotations

import io
import pickle

import pytest
import torch

from ..distributions import AttentionPredictive
from ..ppl import SiteContext, site_context
from ..settings import posterior_mean

__all__ = ["AttentionUnitTestCase"]


class AttentionUnitTestCase:
    """Inherited checks of the attention-unit contract (``docs/architecture.rst``)."""

    dim: int = 8
    heads: int = 2
    seq_len: int = 6
    batch: int = 3
    dtype: torch.dtype = torch.float64
    params_without_grad: frozenset = frozenset()
    token_permutation_equivariant: bool = True
    #: the unit only accepts N == seq_len (a shorter unpadded sequence must raise ValueError)
    fixed_length: bool = False
    #: atol of deterministic / posterior-mean comparisons (float64)
    atol: float = 1e-8
    #: atol of the float32 vs float64 comparison (outputs are O(1))
    float32_atol: float = 2e-3
    #: the posterior-mean mode returns E[output] (GP and deterministic units)
    mean_is_expectation: bool = True
    #: samples of the "posterior mean = average of samples" check
    mc_samples: int = 4000
    #: the device the unit and its inputs are moved to (``None``: left where torch creates
    #: them, the default device)
    device: str | None = None

    def make_unit(self, dim: int, heads: int):
        """The unit under test, of width ``dim`` with ``heads`` heads; subclasses implement it."""
        raise NotImplementedError

    # -- helpers ------------------------------------------------------------------------------
    def _unit(self):
        torch.manual_seed(0)
        unit = self.make_unit(self.dim, self.heads).to(device=self.device, dtype=self.dtype)
        unit.eval()
        return unit

    def _inputs(self, seed: int = 1):
        g = torch.Generator().manual_seed(seed)
        x = torch.randn(self.batch, self.seq_len, self.dim, generator=g, dtype=self.dtype)
        mask = torch.ones(self.batch, self.seq_len, dtype=torch.bool)
        mask[0, self.seq_len - 2:] = False
        mask[-1, 1:] = False
        return self._on_device(x), self._on_device(mask)

    def _on_device(self, t: torch.Tensor) -> torch.Tensor:
        return t if self.device is None else t.to(self.device)

    def _call(self, unit, x, mask, seed: int = 0, mean: bool | None = None):
        mean = unit.stochastic if mean is None else mean
        torch.manual_seed(seed)
        with posterior_mean(mean):
            return unit(x, mask)

    # -- checks -------------------------------------------------------------------------------
    def test_output_shape_and_dtype(self):
        """A sample has the input's shape ``[B, N, C]`` and dtype and is finite."""
        unit = self._unit()
        x, mask = self._inputs()
        out = self._call(unit, x, mask, mean=False)
        assert out.shape == x.shape and out.dtype == x.dtype
        assert torch.isfinite(out).all()

    def test_padding_invariance(self):
        """Real tokens of a padded batch give the output of the unpadded sequence (for a
        ``fixed_length`` unit: the unpadded shorter sequence is refused with a ValueError)."""
        unit = self._unit()
        x, mask = self._inputs()
        out = self._call(unit, x, mask)
        n = int(mask[0].sum())
        if self.fixed_length:
            with pytest.raises(ValueError, match=str(self.seq_len)):
                self._call(unit, x[:1, :n], None)
            return
        alone = self._call(unit, x[:1, :n], None)
        torch.testing.assert_close(out[0, :n], alone[0], atol=self.atol, rtol=1e-6)

    def test_pad_values_do_not_matter(self):
        """Changing padded tokens changes nothing on real tokens (same seed, sample mode too)."""
        unit = self._unit()
        x, mask = self._inputs()
        x2 = x.clone()
        x2[~mask] = 100.0 * torch.randn_like(x2[~mask])
        for mean in (True, False) if unit.stochastic else (False,):
            a = self._call(unit, x, mask, seed=3, mean=mean)
            b = self._call(unit, x2, mask, seed=3, mean=mean)
            torch.testing.assert_close(a[mask], b[mask], atol=self.atol, rtol=1e-6)

    def test_batch_permutation_equivariance(self):
        """Permuting the sequences of a batch permutes the outputs of the real tokens."""
        unit = self._unit()
        x, mask = self._inputs()
        perm = self._on_device(torch.tensor([2, 0, 1]))
        a = self._call(unit, x, mask)[perm]
        b = self._call(unit, x[perm], mask[perm])
        torch.testing.assert_close(a[mask[perm]], b[mask[perm]], atol=self.atol, rtol=1e-6)

    def test_token_permutation_equivariance(self):
        """Permuting the tokens permutes the outputs (skipped when
        ``token_permutation_equivariant`` is False)."""
        if not self.token_permutation_equivariant:
            pytest.skip("unit mixes tokens by position")
        unit = self._unit()
        x, _ = self._inputs()
        perm = self._on_device(torch.randperm(self.seq_len,
                                              generator=torch.Generator().manual_seed(5)))
        a = self._call(unit, x, None)[:, perm]
        b = self._call(unit, x[:, perm], None)
        torch.testing.assert_close(a, b, atol=self.atol, rtol=1e-6)

    def test_all_padding_row_raises(self):
        """A sequence without a real token raises ``ValueError`` mentioning all-padding."""
        unit = self._unit()
        x, mask = self._inputs()
        mask[1] = False
        with pytest.raises(ValueError, match="all-padding"):
            unit(x, mask)

    def test_bad_inputs_raise(self):
        """Wrong width, wrong mask shape, a non-bool mask and NaN inputs raise ``ValueError``."""
        unit = self._unit()
        x, mask = self._inputs()
        with pytest.raises(ValueError, match="shape"):
            unit(x[..., :-1], mask)
        with pytest.raises(ValueError, match="mask"):
            unit(x, mask[:, :-1])
        with pytest.raises(ValueError, match="bool"):
            unit(x, mask.long())
        bad = x.clone()
        bad[0, 0, 0] = float("nan")
        with pytest.raises(ValueError, match="NaN"):
            unit(bad, mask)

    def test_gradients_reach_every_parameter(self):
        """Finite, non-zero gradients reach every parameter (except ``params_without_grad``)."""
        unit = self._unit()
        unit.train()
        x, mask = self._inputs()
        torch.manual_seed(0)
        out = unit(x, mask)
        loss = (out[mask] ** 2).sum() + sum(v.sum() for v in unit.objective_terms().values())
        loss.backward()
        for name, p in unit.named_parameters():
            if not p.requires_grad or name in self.params_without_grad:
                continue
            assert p.grad is not None, f"no gradient reaches {name}"
            assert torch.isfinite(p.grad).all(), f"non-finite gradient for {name}"
            assert p.grad.abs().sum() > 0, f"zero gradient for {name}"

    def test_objective_terms_shapes(self):
        """Every objective term is finite and ``[B]`` (local) or 0-d (global)."""
        unit = self._unit()
        x, mask = self._inputs()
        self._call(unit, x, mask, mean=False)
        for name, value in unit.objective_terms().items():
            assert value.dim() == 0 or value.shape == (self.batch,), (name, value.shape)
            assert torch.isfinite(value).all(), name

    def test_state_dict_round_trip(self):
        """A unit loaded from a saved state dict gives the same sample under the same seed."""
        unit = self._unit()
        buf = io.BytesIO()
        torch.save(unit.state_dict(), buf)
        buf.seek(0)
        torch.manual_seed(123)
        other = self.make_unit(self.dim, self.heads).to(device=self.device, dtype=self.dtype)
        other.eval()
        other.load_state_dict(torch.load(buf))
        x, mask = self._inputs()
        torch.testing.assert_close(self._call(unit, x, mask, seed=4, mean=False),
                                   self._call(other, x, mask, seed=4, mean=False))

    def test_seeded_reproducibility(self):
        """The same seed gives the same output; a stochastic unit's output changes with the seed."""
        unit = self._unit()
        x, mask = self._inputs()
        a = self._call(unit, x, mask, seed=7, mean=False)
        b = self._call(unit, x, mask, seed=7, mean=False)
        torch.testing.assert_close(a, b)
        if unit.stochastic:
            c = self._call(unit, x, mask, seed=8, mean=False)
            assert not torch.allclose(a[mask], c[mask]), "stochastic unit ignored the seed"

    def test_pyro_sites_are_named_by_module_path(self):
        """In ``sites`` mode every stochastic site is a Pyro sample site under ``site_prefix``."""
        import pyro.poutine as poutine

        unit = self._unit()
        unit.site_prefix = "blocks.0.attn"
        x, mask = self._inputs()
        import pyro

        plate = pyro.plate("data", 100, subsample=self._on_device(torch.arange(self.batch)))
        with site_context(SiteContext("sites", "guide", plate)):
            tr = poutine.trace(lambda: unit(x, mask)).get_trace()
        names = [n for n, s in tr.nodes.items() if s["type"] == "sample" and n != "data"]
        if unit.stochastic:
            assert names and all(n.startswith("blocks.0.attn.") for n in names), names
        else:
            assert names == []

    # -- numerics, persistence, predictive ----------------------------------------------------
    def test_float32_agrees_with_float64(self):
        """The same unit in float32 gives the float64 output to ``float32_atol`` (posterior mean
        for stochastic units), and float32 outputs stay float32."""
        unit = self._unit()
        x, mask = self._inputs()
        ref = self._call(unit, x, mask)
        out = self._call(unit.float(), x.float(), mask)
        assert out.dtype == torch.float32 and torch.isfinite(out).all()
        torch.testing.assert_close(out[mask].double(), ref[mask], atol=self.float32_atol,
                                   rtol=self.float32_atol)

    def test_pickle_round_trip(self):
        """A pickled and restored unit computes the same sample under the same seed."""
        unit = self._unit()
        other = pickle.loads(pickle.dumps(unit))
        x, mask = self._inputs()
        torch.testing.assert_close(self._call(unit, x, mask, seed=6, mean=False),
                                   self._call(other, x, mask, seed=6, mean=False))

    def test_predictive_type_and_shapes(self):
        """:meth:`~gpattn_ppl.attention.AttentionUnit.predictive` returns an AttentionPredictive
        with mean and variance ``[B, H, N, D]`` (variance >= 0) and, where there is one, a joint
        MVN with batch ``[B, H, D]`` and event ``N``; its mean, through W_O, is the posterior-mean
        output."""
        unit = self._unit()
        x, mask = self._inputs()
        try:
            torch.manual_seed(0)
            pred = unit.predictive(x, mask)
        except NotImplementedError:
            pytest.skip(f"{type(unit).__name__} has no predictive")
        B, N, D = self.batch, self.seq_len, self.dim // self.heads
        assert isinstance(pred, AttentionPredictive)
        assert pred.mean.shape == (B, self.heads, N, D) == pred.variance.shape
        assert (pred.variance >= -1e-10).all() and torch.isfinite(pred.variance).all()
        if pred.mvn is not None:
            assert pred.mvn.batch_shape == (B, self.heads, D) and pred.mvn.event_shape == (N,)
            torch.testing.assert_close(pred.mvn.mean.mT, pred.mean)
        if self.mean_is_expectation:
            out = unit.out(unit.merge_heads(pred.mean.to(x.dtype)))
            torch.testing.assert_close(out[mask], self._call(unit, x, mask, mean=True)[mask],
                                       atol=1e-6, rtol=1e-6)

    def test_posterior_mean_is_the_average_of_many_samples(self):
        """Averaging ``mc_samples`` sampled outputs recovers the posterior-mean output within
        5 standard errors (deterministic units: every sample equals it).

        The input is replicated within a call for speed; the standard error comes from the
        spread of the per-call averages (independent calls), so it stays right for units whose
        draws are shared by a batch (KEP-SVGP with ``u_draws="batch"``)."""
        unit = self._unit()
        x, mask = self._inputs()
        with torch.no_grad():
            mean = self._call(unit, x, mask, mean=True)
            if not unit.stochastic:
                torch.testing.assert_close(self._call(unit, x, mask, mean=False), mean)
                return
            if not self.mean_is_expectation:
                pytest.skip("the posterior-mean mode of this unit is not the expectation")
            calls, reps = 40, max(self.mc_samples // 40, 1)
            xs, ms = x.repeat(reps, 1, 1), mask.repeat(reps, 1)
            torch.manual_seed(11)
            per_call = torch.stack([unit(xs, ms).view(reps, *x.shape).mean(0)
                                    for _ in range(calls)])          # [calls, B, N, C]
        err = (per_call.mean(0) - mean)[mask]
        se = per_call.std(0)[mask] / calls ** 0.5
        worst = float((err.abs() / (se + 1e-12)).max())
        assert (err.abs() <= 5 * se + 1e-8).all(), f"{worst:.1f} standard errors"
