r"""SNGP (Liu et al., 2020, "Simple and Principled Uncertainty Estimation with Deterministic Deep
Learning via Distance Awareness"): spectrally normalised residual layers and a
random-Fourier-feature Gaussian-process output layer with a Laplace posterior over its output
weights and mean-field logits. Derivation and code names: ``docs/derivations/sngp.rst``.

* :class:`SpectralNormLinear` -- a ``Linear`` whose weight is bounded in spectral norm:
  :math:`\tilde W = W\min(1, c/\hat\sigma(W))` with :math:`\hat\sigma` from one power iteration
  per training pass (the reference code's soft bound).
* :func:`spectral_normalize` -- replace named ``nn.Linear`` submodules by that wrapper; the
  weight and bias keep their ``Parameter`` objects and their state-dict names.
* :class:`RandomFeatureGP` -- :math:`\phi(h) = \sqrt{2/D_L}\cos(W h/\ell + b)`, logits
  :math:`\beta^\top\phi`, the precision :math:`\Sigma^{-1} = sI + \sum_i p_i(1-p_i)\phi_i\phi_i^\top`
  accumulated in training passes (a buffer), and at evaluation the mean-field logits
  :math:`\mathrm{logits}/\sqrt{1 + \lambda\,\phi^\top\Sigma\phi}`.

No maintained PyTorch implementation installs here (Python 3.11, CPU torch, no torchvision):
lightning-uq-box needs Python >= 3.12, torch-uncertainty 0.13 has none, and the ``SNGP`` package
on PyPI (0.7) normalises the random projection instead of the backbone and trains in its own
loop.
"""

from __future__ import annotations

import math
from collections.abc import Iterable

import torch
import torch.nn.functional as F
from torch import nn

from .. import linalg
from ..ppl.sites import current_site_context

__all__ = ["SNGP_DEFAULTS", "RandomFeatureGP", "SpectralNormLinear", "build_sngp_head",
           "mean_field_logits", "residual_linears", "sngp_heads", "sngp_options",
           "spectral_normalize"]

#: the options of ``model.sngp`` and their defaults (``model.head: sngp``)
SNGP_DEFAULTS: dict = {
    "num_features": 1024,          # D_L, random Fourier features
    "ridge": 1.0,                  # s, the prior precision of beta
    "mean_field_factor": math.pi / 8,  # lambda of the mean-field logits (0: none)
    "length_scale": 1.0,           # ell of the RBF kernel exp(-|x - y|^2 / (2 ell^2))
    "spectral_norm": True,         # bound the residual layers' spectral norms
    "norm_bound": 0.95,            # c
    # BERT-SNGP's pretrained-encoder recipe (Liu et al.'s CLINC code: use_spec_norm_plr,
    # gp_input_normalization): a spectrally normalised dense + tanh "pooler" before the GP
    # layer, and a LayerNorm on the GP layer's input
    "pooler": False,
    "input_norm": False,
    # phi = sqrt(2/D_L) cos(.) (the kernel's normalisation) or cos(.) (the reference code's
    # scale_random_features=False, which it recommends for an output layer: under Adam the
    # factor sqrt(2/D_L) slows the logits' growth by that factor; the prior variance of the
    # logits grows by D_L/2)
    "scale_features": True,
    "momentum": None,              # None: exact sum, reset at each epoch start; m: moving average
}


# -- spectral normalisation ---------------------------------------------------------------------

class SpectralNormLinear(nn.Linear):
    r"""``Linear`` with the spectral norm of its weight bounded by ``bound``:
    :math:`y = x\tilde W^\top + b`, :math:`\tilde W = W\min(1, c/\hat\sigma)`,
    :math:`\hat\sigma = u^\top W v`.

    ``u``, ``v`` (buffers ``sn_u``, ``sn_v``) are the power iteration's singular-vector estimates;
    each forward pass in training mode refines them by ``power_iterations`` steps (no gradient),
    evaluation uses them as they are (deterministic). The gradient flows through :math:`W` in
    :math:`\hat\sigma` as in ``torch.nn.utils.parametrizations.spectral_norm``; unlike that
    function (which divides by :math:`\hat\sigma` always), a weight already within the bound is left
    unchanged, as in Liu et al.'s code. ``weight`` stays the raw parameter, so code that writes
    it in place (pretrained initialisation, calibration) keeps working.
    """

    def __init__(self, in_features: int, out_features: int, bias: bool = True, *,
                 bound: float = 0.95, power_iterations: int = 1, device=None, dtype=None) -> None:
        super().__init__(in_features, out_features, bias, device=device, dtype=dtype)
        if not bound > 0:
            raise ValueError(f"spectral norm bound must be > 0, got {bound}")
        if power_iterations < 1:
            raise ValueError(f"power_iterations must be >= 1, got {power_iterations}")
        self.bound, self.power_iterations = float(bound), int(power_iterations)
        kw = {"device": self.weight.device, "dtype": self.weight.dtype}
        self.register_buffer("sn_u", torch.empty(out_features, **kw))
        self.register_buffer("sn_v", torch.empty(in_features, **kw))
        self.start_power_iteration()

    @torch.no_grad()
    def start_power_iteration(self) -> None:
        """Random unit starting vectors ``sn_u``, ``sn_v``, from a generator of their own: wrapping
        a layer leaves the global random stream (every later initialisation) as it was."""
        if self.sn_u.is_meta:
            return
        gen = torch.Generator().manual_seed(self.in_features * 1_000_003 + self.out_features)
        for buf in (self.sn_u, self.sn_v):
            buf.copy_(F.normalize(torch.randn(len(buf), generator=gen), dim=0))

    @classmethod
    def from_linear(cls, linear: nn.Linear, *, bound: float = 0.95, power_iterations: int = 1,
                    init_iterations: int = 15) -> SpectralNormLinear:
        """The wrapper of ``linear``, sharing its weight and bias parameters; its power iteration
        is run ``init_iterations`` times first."""
        # built on the meta device and moved (no initialisation of a weight replaced at once)
        new = torch.nn.utils.skip_init(cls, linear.in_features, linear.out_features,
                                       linear.bias is not None, bound=bound,
                                       power_iterations=power_iterations,
                                       device=linear.weight.device, dtype=linear.weight.dtype)
        new.weight = linear.weight
        new.bias = linear.bias
        new.train(linear.training)
        new.start_power_iteration()
        new.power_iteration(init_iterations)
        return new

    @torch.no_grad()
    def power_iteration(self, steps: int) -> None:
        """Refine ``sn_u``, ``sn_v`` by ``steps`` power-iteration steps (in place)."""
        W = self.weight.detach()
        u, v = self.sn_u, self.sn_v
        for _ in range(steps):
            v.copy_(F.normalize(W.t().mv(u.to(W.dtype)), dim=0, eps=1e-12))
            u.copy_(F.normalize(W.mv(v.to(W.dtype)), dim=0, eps=1e-12))

    def sigma(self) -> torch.Tensor:
        r""":math:`\hat\sigma = u^\top W v`, differentiable in :math:`W`."""
        u = self.sn_u.clone(memory_format=torch.contiguous_format)
        v = self.sn_v.clone(memory_format=torch.contiguous_format)
        return torch.dot(u.to(self.weight.dtype), self.weight.mv(v.to(self.weight.dtype)))

    def bounded_weight(self) -> torch.Tensor:
        r""":math:`\tilde W = W\min(1, c/\hat\sigma)` (no host synchronisation)."""
        scale = (self.bound / self.sigma().clamp_min(1e-12)).clamp(max=1.0)
        return self.weight * scale

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.training:
            self.power_iteration(self.power_iterations)
        return F.linear(x, self.bounded_weight(), self.bias)

    def extra_repr(self) -> str:
        return f"{super().extra_repr()}, bound={self.bound}"


def spectral_normalize(model: nn.Module, names: Iterable[str], *, bound: float,
                       power_iterations: int = 1) -> list[str]:
    """Replace each ``nn.Linear`` of ``model`` named in ``names`` (module paths,
    ``"blocks.0.mlp.0"``) by a :class:`SpectralNormLinear` sharing its parameters; returns the
    paths. A path already wrapped is left as it is.

    :raises ValueError: a path that is not an ``nn.Linear`` of ``model``.
    """
    done = []
    for name in names:
        parent_path, _, attr = name.rpartition(".")
        parent = model.get_submodule(parent_path) if parent_path else model
        lin = getattr(parent, attr, None)
        if isinstance(lin, SpectralNormLinear):
            done.append(name)
            continue
        if not isinstance(lin, nn.Linear):
            raise ValueError(f"spectral normalisation: {name!r} is not an nn.Linear "
                             f"(got {type(lin).__name__})")
        setattr(parent, attr, SpectralNormLinear.from_linear(
            lin, bound=bound, power_iterations=power_iterations))
        done.append(name)
    return done


# -- the random-feature GP output layer ---------------------------------------------------------

def mean_field_logits(logits: torch.Tensor, variance: torch.Tensor, factor: float) -> torch.Tensor:
    r"""The mean-field approximation of the predictive softmax:
    :math:`\mathrm{logits}/\sqrt{1 + \lambda\,\mathrm{var}}` (``factor`` = :math:`\lambda`; 0
    returns ``logits``). ``logits [..., K]``, ``variance [...]``."""
    if factor == 0:
        return logits
    return logits / torch.sqrt(1.0 + factor * variance).unsqueeze(-1).to(logits.dtype)


class RandomFeatureGP(nn.Module):
    r"""The SNGP output layer: a GP with an RBF kernel on the hidden representation, approximated
    by :math:`D_L` random Fourier features, with a Laplace posterior over the output weights.

    * optional input transforms, in this order: ``pooler`` (a :class:`SpectralNormLinear`
      :math:`C\to C` with bound ``norm_bound``, then tanh: BERT-SNGP's spectrally normalised
      pooler) and ``input_norm`` (``nn.LayerNorm(C)``: the reference code's input normalisation,
      which makes :math:`\ell` comparable across backbones);
    * features (buffers ``rff_weight`` :math:`W\sim\mathcal N(0, 1)`, ``rff_bias``
      :math:`b\sim\mathcal U(0, 2\pi)`, fixed): :math:`\phi(h) = \sqrt{2/D_L}\cos(Wh/\ell + b)`,
      so :math:`\phi(x)^\top\phi(y)\approx\exp(-\lVert x-y\rVert^2/(2\ell^2))`;
    * logits :math:`\beta^\top\phi` (``beta``, trained);
    * precision (buffer ``precision``, :math:`D_L\times D_L`): :math:`sI` at each reset, then in
      every training-mode pass (not in a guide pass) :math:`\Sigma^{-1} \mathrel{+}=
      \sum_i p_i(1-p_i)\phi_i\phi_i^\top` with :math:`p_i` the largest softmax probability of
      example i (the multiclass approximation of Liu et al.'s code; exact for K = 2); with
      ``momentum`` m: :math:`\Sigma^{-1} \leftarrow m\Sigma^{-1} + (1-m)\frac1B\sum_i\ldots`
      and no reset;
    * evaluation: :math:`\mathrm{var}_i = \phi_i^\top\Sigma\phi_i = \lVert L^{-1}\phi_i\rVert^2`
      with :math:`LL^\top = \Sigma^{-1}` (:func:`gpattn_ppl.linalg.cholesky_factors`, cached until
      the precision changes), logits :func:`mean_field_logits`.

    :param in_features: width C of the hidden representation. :param num_classes: K.
    :param num_features: :math:`D_L`. :param ridge: :math:`s > 0`. :param mean_field_factor:
        :math:`\lambda \ge 0`. :param length_scale: :math:`\ell > 0`.
    :param momentum: ``None`` (exact sum over an epoch; call :meth:`reset_precision` at each
        epoch start, as the trainer does through the classifier's ``on_train_epoch_start``) or
        m in [0, 1).
    :param pooler: add the spectrally normalised dense + tanh layer (bound ``norm_bound``).
    :param input_norm: add the LayerNorm on the GP layer's input.
    :param scale_features: :math:`\phi = \sqrt{2/D_L}\cos(\cdot)` (``True``) or
        :math:`\cos(\cdot)`: the kernel approximated becomes :math:`(D_L/2)\,k`.
    """

    def __init__(self, in_features: int, num_classes: int, *, num_features: int = 1024,
                 ridge: float = 1.0, mean_field_factor: float = math.pi / 8,
                 length_scale: float = 1.0, momentum: float | None = None,
                 pooler: bool = False, input_norm: bool = False,
                 norm_bound: float = 0.95, scale_features: bool = True) -> None:
        super().__init__()
        if num_features < 1:
            raise ValueError(f"num_features must be >= 1, got {num_features}")
        if not ridge > 0:
            raise ValueError(f"ridge must be > 0, got {ridge}")
        if not mean_field_factor >= 0:
            raise ValueError(f"mean_field_factor must be >= 0, got {mean_field_factor}")
        if not length_scale > 0:
            raise ValueError(f"length_scale must be > 0, got {length_scale}")
        if momentum is not None and not 0 <= momentum < 1:
            raise ValueError(f"momentum must be None or in [0, 1), got {momentum}")
        self.in_features, self.num_classes, self.num_features = in_features, num_classes, num_features
        self.ridge, self.mean_field_factor = float(ridge), float(mean_field_factor)
        self.length_scale = float(length_scale)
        self.momentum = None if momentum is None else float(momentum)
        self.pooler = (SpectralNormLinear(in_features, in_features, bound=norm_bound)
                       if pooler else None)
        self.input_norm = nn.LayerNorm(in_features) if input_norm else None
        self.feature_scale = math.sqrt(2.0 / num_features) if scale_features else 1.0
        self.register_buffer("rff_weight", torch.randn(num_features, in_features) / length_scale)
        self.register_buffer("rff_bias", torch.rand(num_features) * (2 * math.pi))
        self.beta = nn.Linear(num_features, num_classes, bias=False)
        self.register_buffer("precision", ridge * torch.eye(num_features))
        self._factor = None  # (precision tensor, its version, L^{-1})

    def extra_repr(self) -> str:
        return (f"in_features={self.in_features}, num_classes={self.num_classes}, "
                f"num_features={self.num_features}, ridge={self.ridge}, "
                f"mean_field_factor={self.mean_field_factor:.4g}, momentum={self.momentum}, "
                f"feature_scale={self.feature_scale:.4g}")

    def transform_input(self, h: torch.Tensor) -> torch.Tensor:
        """The optional pooler (tanh of the spectrally normalised dense layer) and input
        LayerNorm: ``[..., C] -> [..., C]`` (the identity when neither is configured)."""
        if self.pooler is not None:
            h = torch.tanh(self.pooler(h))
        if self.input_norm is not None:
            h = self.input_norm(h)
        return h

    def random_features(self, h: torch.Tensor) -> torch.Tensor:
        r""":math:`\phi(h) = s\cos(Wh/\ell + b)`, :math:`s = \sqrt{2/D_L}` or 1
        (``scale_features``): ``[..., C] -> [..., D_L]``, in at least float32 with autocast off
        (a phase of size ~10 in bfloat16 is off by ~0.05)."""
        dtype = torch.promote_types(h.dtype, torch.float32)
        with torch.autocast(h.device.type, enabled=False):
            z = F.linear(h.to(dtype), self.rff_weight.to(dtype), self.rff_bias.to(dtype))
        return self.feature_scale * torch.cos(z)

    # -- the precision --------------------------------------------------------------------------
    @torch.no_grad()
    def reset_precision(self) -> None:
        r""":math:`\Sigma^{-1} \leftarrow sI` (in place: the buffer stays the same tensor)."""
        self.precision.zero_()
        self.precision.diagonal().fill_(self.ridge)

    @torch.no_grad()
    def update_precision(self, phi: torch.Tensor, logits: torch.Tensor) -> None:
        r"""Add one batch's :math:`\sum_i p_i(1-p_i)\phi_i\phi_i^\top` (or its moving average);
        device operations only, no host synchronisation."""
        P = self.precision
        phi = phi.detach().reshape(-1, phi.shape[-1]).to(P.dtype)
        p = torch.softmax(logits.detach().reshape(-1, logits.shape[-1]).to(P.dtype), -1).amax(-1)
        a = phi * (p * (1 - p)).sqrt().unsqueeze(-1)
        with torch.autocast(P.device.type, enabled=False):
            if self.momentum is None:
                P.addmm_(a.t(), a)
            else:
                P.mul_(self.momentum).addmm_(a.t(), a,
                                             alpha=(1 - self.momentum) / max(len(a), 1))

    def _inverse_factor(self) -> torch.Tensor:
        r""":math:`L^{-1}` with :math:`LL^\top = \Sigma^{-1}`, recomputed when the precision
        changed (a new tensor or an in-place update, e.g. ``load_state_dict``)."""
        P = self.precision
        try:
            version = P._version
        except RuntimeError:  # an inference-mode tensor has no version counter: no cache
            version = None
        cached = self._factor
        if cached is None or version is None or cached[0] is not P or cached[1] != version:
            with torch.no_grad():
                _, W = linalg.cholesky_factors(P, where="sngp precision")
            self._factor = cached = (P, version, W)
        return cached[2]

    def covariance(self) -> torch.Tensor:
        r""":math:`\Sigma = (\Sigma^{-1})^{-1}` by a Cholesky solve (for inspection; the forward
        pass uses :math:`L^{-1}`)."""
        with torch.no_grad():
            L = linalg.cholesky(self.precision, where="sngp precision")
            eye = torch.eye(L.shape[-1], dtype=L.dtype, device=L.device)
            return linalg.cholesky_solve(eye, L)

    def predictive_variance(self, phi: torch.Tensor) -> torch.Tensor:
        r""":math:`\phi^\top\Sigma\phi = \lVert L^{-1}\phi\rVert^2`: ``[..., D_L] -> [...]``."""
        W = self._inverse_factor()
        with torch.autocast(phi.device.type, enabled=False):
            return (phi.to(W.dtype) @ W.t()).square().sum(-1)

    # -- forward --------------------------------------------------------------------------------
    def forward(self, h: torch.Tensor) -> torch.Tensor:
        """``[..., C] -> [..., K]``: the logits in training mode (the precision updated, except
        in a guide pass of the Pyro program), the mean-field logits at evaluation."""
        phi = self.random_features(self.transform_input(h))
        logits = self.beta(phi)
        if self.training:
            ctx = current_site_context()
            if ctx is None or ctx.role == "model":
                self.update_precision(phi, logits)
            return logits
        return mean_field_logits(logits, self.predictive_variance(phi), self.mean_field_factor)

    @torch.no_grad()
    def all_reduce_precision(self) -> None:
        """Under ``torch.distributed`` with several processes: combine the ranks' precisions
        (exact: the sum of their data terms plus one ridge; momentum: their mean)."""
        import torch.distributed as dist

        if not (dist.is_available() and dist.is_initialized()) or dist.get_world_size() < 2:
            return
        P = self.precision
        if self.momentum is None:
            P.diagonal().sub_(self.ridge)
            dist.all_reduce(P)
            P.diagonal().add_(self.ridge)
        else:
            dist.all_reduce(P)
            P.div_(dist.get_world_size())


def sngp_heads(model: nn.Module) -> dict[str, RandomFeatureGP]:
    """Module path -> :class:`RandomFeatureGP` of ``model``."""
    return {n: m for n, m in model.named_modules() if isinstance(m, RandomFeatureGP)}


def build_sngp_head(in_features: int, num_classes: int, options: dict | None) -> RandomFeatureGP:
    """The :class:`RandomFeatureGP` of a ``model.sngp`` section (defaults :data:`SNGP_DEFAULTS`)."""
    o = sngp_options(options)
    return RandomFeatureGP(in_features, num_classes, num_features=o["num_features"],
                           ridge=o["ridge"], mean_field_factor=o["mean_field_factor"],
                           length_scale=o["length_scale"], momentum=o["momentum"],
                           pooler=o["pooler"], input_norm=o["input_norm"],
                           norm_bound=o["norm_bound"], scale_features=o["scale_features"])


def sngp_options(options: dict | None) -> dict:
    """``options`` with the defaults of :data:`SNGP_DEFAULTS` filled in.

    :raises ValueError: an unknown option.
    """
    unknown = sorted(set(options or {}) - set(SNGP_DEFAULTS))
    if unknown:
        raise ValueError(f"sngp: unknown option {unknown[0]!r}; allowed: "
                         f"{', '.join(SNGP_DEFAULTS)}")
    return {**SNGP_DEFAULTS, **(options or {})}


#: the attention input projections of the hosts :mod:`~gpattn_ppl.models.swap` knows (BERT,
#: DistilBERT, q/k/v/o models, nn.MultiheadAttention): not normalised, as in Liu et al.'s BERT
_INPUT_PROJECTIONS = frozenset({"query", "key", "value", "q_lin", "k_lin", "v_lin", "q_proj",
                                "k_proj", "v_proj", "qkv", "in_proj", "c_attn",
                                "query_proj", "key_proj", "value_proj"})   # DeBERTa-v2


def residual_linears(encoder: nn.Module, prefix: str = "") -> list[str]:
    """The dense layers of a pretrained encoder's residual branches: every ``nn.Linear`` outside
    the embeddings and the pooler that is not an attention input projection, and the output
    projection ``out`` of each swapped attention unit (its other projections are the attention's
    inputs). Paths are prefixed with ``prefix``."""
    from ..attention import AttentionUnit

    units = [n for n, m in encoder.named_modules() if isinstance(m, AttentionUnit)]
    out = []
    for name, m in encoder.named_modules():
        parts = name.split(".")
        if any(name == u or name.startswith(u + ".") for u in units):
            if any(name == f"{u}.out" for u in units) and isinstance(m, nn.Linear):
                out.append(name)
            continue
        if not isinstance(m, nn.Linear) or "embeddings" in parts or "pooler" in parts:
            continue
        if parts[-1] not in _INPUT_PROJECTIONS:
            out.append(name)
    return [f"{prefix}{n}" for n in out]
