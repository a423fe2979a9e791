r"""A numerically safe relaxed one-hot categorical (Concrete / Gumbel-softmax) distribution.

The sample is computed from scores in log space and its density is evaluated from the cached
scores, so neither sampling nor :meth:`~SafeRelaxedOneHotCategorical.log_prob` underflows at small
temperatures (Pyro's / torch's ``RelaxedOneHotCategorical.log_prob`` is NaN for
:math:`\tau \le 0.1`). Categories whose logit is :math:`-\infty` (padded keys) are
outside the support: they get weight exactly 0 and the density lives on the face of the simplex
spanned by the remaining :math:`K_\text{eff}` categories.
"""

from __future__ import annotations

import torch
from pyro.distributions import TorchDistribution
from torch.distributions import constraints
from torch.distributions.utils import broadcast_all, logits_to_probs, probs_to_logits

__all__ = ["SafeRelaxedOneHotCategorical", "sample_gumbel", "relaxed_scores"]


def sample_gumbel(shape, *, dtype=None, device=None) -> torch.Tensor:
    r"""Standard Gumbel noise :math:`g = -\log(-\log u)`, :math:`u \sim U(0, 1)`, never infinite.

    :math:`u` is clamped below at the smallest normal number of the dtype (a truncation of the
    lower tail at :math:`g \approx -4.5` in float32, probability :math:`< 10^{-37}`); the upper
    tail ends where :math:`u` rounds to its largest value below 1 (:math:`g \approx 16.6` in
    float32, probability :math:`6 \cdot 10^{-8}`). Uniforms plus two logarithms are several
    times faster on CPU than ``Tensor.exponential_``.

    A lower ``dtype`` (bfloat16, float16 under autocast) is drawn and transformed in float32
    and rounded at the end: bfloat16 uniforms have 8 significant bits, which would leave a few
    hundred distinct draws and cut the upper tail at ~5.5.

    :param shape: output shape.
    :returns: a tensor of iid Gumbel(0, 1) draws.
    """
    dtype = torch.get_default_dtype() if dtype is None else dtype
    work = torch.promote_types(dtype, torch.float32)
    u = torch.rand(shape, dtype=work, device=device)
    g = u.clamp_min_(torch.finfo(work).tiny).log_().neg_().log_().neg_()   # in place
    return g if work == dtype else g.to(dtype)


def relaxed_scores(logits: torch.Tensor, temperature: torch.Tensor | float,
                   gumbels: torch.Tensor) -> torch.Tensor:
    r"""The tempered perturbed scores :math:`z = (\ell + g) / \tau` (``-inf`` stays ``-inf``).

    The relaxed sample is :math:`x = \mathrm{softmax}(z)` and its log is
    :math:`y = z - \operatorname{logsumexp}(z)`; both are exact in floating point for any
    :math:`\tau > 0`, since the largest score is subtracted before exponentiating.
    """
    if not torch.is_tensor(temperature):
        return (logits + gumbels) / temperature
    if temperature.dim() > 0:
        temperature = temperature.unsqueeze(-1)
    if temperature.requires_grad:
        # d(-inf / tau)/d tau = inf would turn the zero gradient of removed categories into NaN
        real = logits > float("-inf")
        z = (torch.where(real, logits, torch.zeros_like(logits)) + gumbels) / temperature
        return z.masked_fill(~real, float("-inf"))
    return (logits + gumbels) / temperature


class _RelaxedSimplex(constraints.Constraint):
    """The probability simplex with a dtype-aware tolerance on the sum (``K * 8 eps``)."""

    is_discrete = False
    event_dim = 1

    def check(self, value):
        tol = 8 * value.shape[-1] * torch.finfo(value.dtype).eps
        return (value >= 0).all(-1) & ((value.sum(-1) - 1).abs() <= max(tol, 1e-6))


class _StraightThrough(torch.autograd.Function):
    """Forward: the one-hot of ``argmax(soft)``; backward: the identity (straight-through)."""

    @staticmethod
    def forward(ctx, soft):
        hard = torch.zeros_like(soft)
        return hard.scatter_(-1, soft.argmax(-1, keepdim=True), 1.0)

    @staticmethod
    def backward(ctx, grad):
        return grad


class SafeRelaxedOneHotCategorical(TorchDistribution):
    r"""Relaxed one-hot categorical (Concrete, Maddison et al. 2017; Gumbel-softmax, Jang et al.
    2017) over :math:`K` categories, sampled and scored in log space.

    **Sampling** (STO eqs. 9-11). With logits :math:`\ell \in [-\infty, \infty)^K`, temperature
    :math:`\tau > 0` and iid :math:`g_k \sim \mathrm{Gumbel}(0, 1)`,

    .. math::
        z_k = (\ell_k + g_k)/\tau, \qquad
        x_k = \frac{\exp z_k}{\sum_{k'} \exp z_{k'}}, \qquad
        y_k = \log x_k = z_k - \operatorname{logsumexp}_{k'} z_{k'} .

    :math:`\operatorname{argmax}_k x_k \sim \mathrm{Categorical}(\mathrm{softmax}(\ell))` for every
    :math:`\tau` (Gumbel-max); :math:`\tau \to 0` gives one-hot vectors, :math:`\tau \to \infty`
    the uniform vector over the support.

    **Density** on the face of the simplex spanned by the :math:`K_\text{eff}` categories with
    finite logits (sums over those categories; w.r.t. Lebesgue measure on :math:`K_\text{eff}-1`
    free coordinates):

    .. math::
        \log p(x) = \log\Gamma(K_\text{eff}) + (K_\text{eff}-1)\log\tau
            + \sum_k s_k - K_\text{eff}\operatorname{logsumexp}_k s_k - \sum_k y_k,
        \qquad s_k = \ell_k - \tau\,y_k .

    It equals torch's ``RelaxedOneHotCategorical.log_prob`` where that is finite, but uses the
    cached log-space sample :math:`y` instead of :math:`\log x`, so it stays finite when entries
    of :math:`x` underflow to 0 (small :math:`\tau`, extreme logits). Values not produced by
    :meth:`rsample` fall back to :math:`y = \log\max(x, \text{tiny})` on the support.

    **Straight-through** (``straight_through=True``): :meth:`rsample` returns the one-hot
    :math:`\mathrm{onehot}(\operatorname{argmax}_k z_k)` in the forward pass and the gradient of
    the relaxed :math:`x` in the backward pass; :meth:`log_prob` scores the relaxed sample
    behind it (as Pyro's ``RelaxedOneHotCategoricalStraightThrough``), so Monte-Carlo KLs stay
    unbiased.

    :param temperature: :math:`\tau > 0`, a float or a tensor broadcastable to the batch shape.
    :param logits: unnormalised log-probabilities ``[..., K]``; ``-inf`` removes a category.
    :param probs: probabilities ``[..., K]`` (alternative to ``logits``).
    :param straight_through: return hard one-hot samples with straight-through gradients.

    Cost O(K) per draw and per density evaluation.

    >>> d = SafeRelaxedOneHotCategorical(0.05, logits=torch.tensor([300., 0., float("-inf")]))
    >>> x = d.rsample()
    >>> x[2].item(), bool(torch.isfinite(d.log_prob(x)))
    (0.0, True)
    """

    arg_constraints = {"logits": constraints.independent(constraints.real, 1),
                       "temperature": constraints.positive}
    support = _RelaxedSimplex()
    has_rsample = True

    def __init__(self, temperature, logits=None, probs=None, *, straight_through: bool = False,
                 validate_args=None) -> None:
        if (logits is None) == (probs is None):
            raise ValueError("give exactly one of logits or probs")
        if logits is None:
            logits = probs_to_logits(probs)
        if logits.dim() < 1:
            raise ValueError("logits must have at least one dimension (the categories)")
        self.logits = logits
        # a number is filled on the device (torch.tensor(number, device=cuda) copies from
        # pageable host memory: a host synchronisation per call)
        self.temperature = (torch.full((), float(temperature), dtype=logits.dtype,
                                       device=logits.device)
                            if isinstance(temperature, (int, float)) else
                            torch.as_tensor(temperature, dtype=logits.dtype, device=logits.device))
        self.straight_through = bool(straight_through)
        batch_shape, event_shape = logits.shape[:-1], logits.shape[-1:]
        if self.temperature.dim() > 0:
            self.temperature = self.temperature.expand(batch_shape)
        super().__init__(batch_shape, event_shape, validate_args=validate_args)
        if self._validate_args:
            if not bool((logits > float("-inf")).any(-1).all()):
                raise ValueError("every row of logits needs at least one finite entry")
            if bool((logits == float("inf")).any()):
                raise ValueError("logits must not be +inf")

    # -- properties ---------------------------------------------------------------------------
    @property
    def probs(self) -> torch.Tensor:
        """Probabilities of the underlying categorical, :math:`\\mathrm{softmax}(\\ell)`."""
        return logits_to_probs(self.logits)

    @property
    def tempered_probs(self) -> torch.Tensor:
        r"""The sample at the modal Gumbel noise :math:`g = 0`: :math:`\mathrm{softmax}(\ell/\tau)`.

        Noise-free "location" of the distribution (not its mean); attention units return it in
        :class:`~gpattn_ppl.settings.posterior_mean` mode.
        """
        t = self.temperature.unsqueeze(-1) if self.temperature.dim() > 0 else self.temperature
        return torch.softmax(self.logits / t, dim=-1)

    @property
    def support_mask(self) -> torch.Tensor:
        """``[..., K]`` bool: the categories with a finite logit."""
        return self.logits > float("-inf")

    def expand(self, batch_shape, _instance=None):
        new = self._get_checked_instance(SafeRelaxedOneHotCategorical, _instance)
        batch_shape = torch.Size(batch_shape)
        new.logits = self.logits.expand(batch_shape + self.event_shape)
        new.temperature = (self.temperature if self.temperature.dim() == 0
                           else self.temperature.expand(batch_shape))
        new.straight_through = self.straight_through
        super(SafeRelaxedOneHotCategorical, new).__init__(batch_shape, self.event_shape,
                                                          validate_args=False)
        new._validate_args = self._validate_args
        return new

    # -- sampling -----------------------------------------------------------------------------
    def relax(self, gumbels: torch.Tensor) -> torch.Tensor:
        r"""The (reparameterised) sample for given Gumbel noise ``gumbels`` ``[*S, *batch, K]``.

        Deterministic given the noise; shares noise across distributions when the caller passes
        the same tensor (used for Proposition 3.1 checks). The log-space scores are cached on
        the returned tensor for :meth:`log_prob`.
        """
        return self._relax_scores(relaxed_scores(self.logits, self.temperature, gumbels))

    def _relax_scores(self, z: torch.Tensor) -> torch.Tensor:
        soft = torch.softmax(z, dim=-1)
        value = _StraightThrough.apply(soft) if self.straight_through else soft
        value._relaxed_scores = z
        return value

    def rsample(self, sample_shape=()) -> torch.Tensor:
        """A reparameterised draw ``[*sample_shape, *batch, K]`` with fresh Gumbel noise (one-hot
        in the forward pass with ``straight_through``); its log-space scores are cached on the
        returned tensor for :meth:`log_prob`."""
        shape = self._extended_shape(torch.Size(sample_shape))
        g = sample_gumbel(shape, dtype=self.logits.dtype, device=self.logits.device)
        if self.temperature.requires_grad:
            return self.relax(g)
        # fresh noise: form z = (logits + g) / tau in place in g's buffer (no temporaries)
        t = self.temperature.unsqueeze(-1) if self.temperature.dim() > 0 else self.temperature
        return self._relax_scores(g.add_(self.logits).div_(t))

    def sample(self, sample_shape=()) -> torch.Tensor:
        with torch.no_grad():
            return self.rsample(sample_shape)

    # -- density ------------------------------------------------------------------------------
    def log_value(self, value: torch.Tensor) -> torch.Tensor:
        r""":math:`y = \log x` of a sample: exact (from the cached scores) for samples drawn by this
        class, else :math:`\log\max(x, \text{tiny})` (``-inf`` outside the support)."""
        z = getattr(value, "_relaxed_scores", None)
        if z is not None:
            return torch.log_softmax(z, dim=-1)
        tiny = torch.finfo(value.dtype).tiny
        return value.clamp_min(tiny).log()

    def log_prob(self, value: torch.Tensor) -> torch.Tensor:
        r"""The log density :math:`\log p(x)` of the class docstring, ``[*sample_shape, *batch]``,
        with :math:`y` from :meth:`log_value` (exact for samples drawn by :meth:`rsample`)."""
        if self._validate_args:
            self._validate_sample(value)
        y = self.log_value(value)
        logits, y, value = broadcast_all(self.logits, y, value)
        real = logits > float("-inf")
        if self._validate_args and bool((value.masked_select(~real) != 0).any()):
            raise ValueError("value puts weight on a category with logit -inf")
        tau = self.temperature.unsqueeze(-1) if self.temperature.dim() > 0 else self.temperature
        zero = torch.zeros((), dtype=y.dtype, device=y.device)
        # sanitise before any arithmetic: where() with inf in the dropped branch poisons gradients
        ell = torch.where(real, logits, zero)
        y = torch.where(real, y, zero)
        s = ell - tau * y                                           # 0 off the support
        lse = s.masked_fill(~real, float("-inf")).logsumexp(-1)
        k = real.sum(-1).to(y.dtype)
        log_scale = torch.lgamma(k) + (k - 1) * self.temperature.log()
        return log_scale + s.sum(-1) - k * lse - y.sum(-1)
