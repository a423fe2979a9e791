# ruff: noqa: E402 -- a tutorial imports what each section uses, where it is first used
"""
Write a new attention unit, register it and test it
===================================================

Every attention method of gpattn_ppl is a subclass of
:class:`~gpattn_ppl.attention.base.AttentionUnit` registered under a string key. This tutorial
adds one more: **cosine attention**, whose logits are the cosine similarities of queries and
keys times a learned scale per head (the scaled cosine attention of Swin Transformer V2, Liu et
al., 2022, without its position bias). It then

1. registers the unit with :func:`~gpattn_ppl.attention.registry.register_attention`, so that
   configs and :func:`~gpattn_ppl.models.build.build_model` find it by its key ``"cosine"``;
2. trains a small CoLA classifier whose last block uses it;
3. runs the library's public test mixin,
   :class:`~gpattn_ppl.testing.attention_unit.AttentionUnitTestCase`, on it.

The contract a unit keeps is written out in :doc:`/architecture` ("The attention-unit
contract"). Everything here runs on the CPU in a few seconds.
"""

# %%
# The unit
# --------
#
# A unit implements :meth:`~gpattn_ppl.attention.base.AttentionUnit.attend`, which maps tokens
# ``x: [B, N, C]`` and a boolean padding mask ``[B, N]`` (True on real tokens, or ``None``) to
# ``[B, N, C]``. The base class's ``forward`` validates the inputs before calling it (shapes, a
# boolean mask, no all-padding sequence, no NaN) and resets the unit's objective terms.
#
# The rules that matter here:
#
# * padded keys get exactly zero weight: their logits are ``-inf`` before the softmax;
# * every option is a keyword-only constructor argument with a default, documented in the class
#   docstring: that signature is what a config is validated against;
# * a unit with attention weights takes ``attn_dropout`` and passes it to the base class;
# * :meth:`~gpattn_ppl.attention.base.AttentionUnit.attention_matrix` and
#   :meth:`~gpattn_ppl.attention.base.AttentionUnit.predictive` are optional; a deterministic
#   unit's predictive is a point mass
#   (:meth:`AttentionPredictive.point <gpattn_ppl.distributions.AttentionPredictive.point>`).
#
# The unit is deterministic, so it has no Pyro sites and no objective terms. A stochastic unit
# sets ``stochastic = True`` and draws every latent with
# :meth:`~gpattn_ppl.attention.base.AttentionUnit.sample`.

import math

import matplotlib.pyplot as plt
import torch
import torch.nn.functional as F
from torch import nn

from gpattn_ppl.attention import AttentionUnit, register_attention
from gpattn_ppl.distributions import AttentionPredictive


@register_attention("cosine")
class CosineAttention(AttentionUnit):
    r"""Multi-head cosine attention.

    .. math::
        A_h = \mathrm{softmax}_{\text{row}}\big(s_h \cos(Q_h, K_h) + M\big), \quad
        \text{out} = \mathrm{concat}_h(A_h V_h)\, W_O

    with :math:`\cos(Q, K)_{ab} = q_a^\top k_b / (\lVert q_a\rVert \lVert k_b\rVert)`, a learned
    scale :math:`s_h > 0` per head (the logits lie in :math:`[-s_h, s_h]`) and
    :math:`M_{ab} = -\infty` on padded keys.

    :param dim: C. :param heads: H.
    :param init_scale: the starting value of every :math:`s_h`.
    :param attn_dropout: dropout on A (kept on at test under MC dropout).
    :param proj_dropout: dropout after W_O.
    """

    def __init__(self, dim: int, heads: int, *, init_scale: float = 10.0,
                 attn_dropout: float = 0.0, proj_dropout: float = 0.0) -> None:
        super().__init__(dim, heads, attn_dropout=attn_dropout, proj_dropout=proj_dropout)
        if init_scale <= 0:
            raise ValueError(f"init_scale must be > 0, got {init_scale}")
        self.qkv = nn.Linear(dim, 3 * dim)
        self.out = nn.Linear(dim, dim)
        # log s_h, shaped [H, 1, 1] to broadcast over the [B, H, N, N] logits
        self.log_scale = nn.Parameter(torch.full((heads, 1, 1), math.log(init_scale)))

    def project(self, x):
        """Per-head queries, keys and values, each ``[B, H, N, D]``."""
        B, N, _ = x.shape
        q, k, v = self.qkv(x).view(B, N, 3, self.heads, self.head_dim).permute(2, 0, 3, 1, 4)
        return q, k, v

    def _matrix(self, q, k, mask):
        cos = F.normalize(q, dim=-1) @ F.normalize(k, dim=-1).mT      # [B, H, N, N]
        logits = self.log_scale.exp() * cos
        if mask is not None:
            logits = logits.masked_fill(~mask[:, None, None, :], float("-inf"))
        return torch.softmax(logits, dim=-1)

    def attend(self, x, mask):
        q, k, v = self.project(x)
        A = self.attn_dropout(self._matrix(q, k, mask))
        return self.proj_dropout(self.out(self.merge_heads(A @ v)))

    def attention_matrix(self, x, mask=None):
        """The attention matrix ``[B, H, N, N]`` (no dropout); padded key columns are 0."""
        mask = self._check(x, mask)
        q, k, _ = self.project(x)
        return self._matrix(q, k, mask)

    def predictive(self, x, mask=None):
        """The head outputs ``[B, H, N, D]`` as a zero-variance predictive."""
        mask = self._check(x, mask)
        q, k, v = self.project(x)
        return AttentionPredictive.point(self._matrix(q, k, mask) @ v)


# %%
# The decorator put the class into the registry. From now on the key ``"cosine"`` works
# everywhere a kind is accepted, and the registry reads the options from the signature:

from gpattn_ppl.attention import ATTENTION, attention_options, build_attention

print(ATTENTION["cosine"].__name__, attention_options("cosine"))

unit = build_attention("cosine", dim=16, heads=2, init_scale=5.0)
x = torch.randn(2, 7, 16)
mask = torch.ones(2, 7, dtype=torch.bool)
mask[1, 4:] = False                                   # the second sequence has 4 real tokens
with torch.no_grad():
    print("output", tuple(unit(x, mask).shape))
    A = unit.attention_matrix(x, mask)
print("attention", tuple(A.shape), "| weight on padded keys:", float(A[1, :, :, 4:].abs().max()))

# %%
# In a model, by its key
# ----------------------
#
# A model spec (the ``model`` section of a config, see :ref:`config-format`) names units by
# kind. Here block 0 keeps softmax attention and the last block is replaced by the new unit with
# one of its options set. The spec is validated against the registry, so a typo in an option is
# an error that names the allowed options:

from gpattn_ppl.models import ConfigError, build_model

spec = {"arch": "text", "dim": 32, "depth": 2, "heads": 2, "mlp_dim": 64, "dropout": 0.1,
        "attention": {"kind": "softmax"},
        "overrides": [{"blocks": [-1], "attention": {"kind": "cosine", "init_scale": 5.0}}]}

try:
    build_model({**spec, "attention": {"kind": "cosine", "scale": 5.0}},
                num_classes=2, vocab_size=100)
except ConfigError as err:
    print("ConfigError:", err)

# %%
# The same spec as YAML, for ``gpattn-ppl train``, would read:
#
# .. code-block:: yaml
#
#     model:
#       arch: text
#       attention: {kind: softmax}
#       overrides:
#         - blocks: [-1]
#           attention: {kind: cosine, init_scale: 5.0}
#
# The module that defines the unit must have been imported before the config is read: the
# registry only knows the classes whose ``@register_attention`` line has run.
#
# Now a few training steps on a small subset of the CoLA data that ships with the package
# (:func:`~gpattn_ppl.data.load_data`). The network is wrapped in the Pyro program
# (:class:`~gpattn_ppl.infer.program.PyroProgram`), whose loss is the per-datum negative ELBO
# (for a deterministic network, the cross-entropy), and trained with the library's fit loop
# (:func:`~gpattn_ppl.infer.fit.fit_epoch`).

from gpattn_ppl.data import load_data
from gpattn_ppl.infer import PyroProgram, epoch_clock, fit_epoch, predict
from gpattn_ppl.metrics import classification_report

torch.manual_seed(0)
data = load_data("cola", limit_train=512, max_len=32)
net = build_model(spec, num_classes=data.num_classes, vocab_size=data.vocab_size)
print({name: type(u).__name__ for name, u in net.attention_units().items()})

program = PyroProgram(net, num_data=len(data.train))
optimizer = torch.optim.Adam(net.parameters(), lr=2e-3)
generator = torch.Generator().manual_seed(0)
steps = math.ceil(len(data.train) / 32)
for epoch in range(3):
    stats = fit_epoch(program, optimizer,
                      data.train.batches(32, shuffle=True, generator=generator, train=True),
                      clock=epoch_clock(epoch, steps))
    print(f"epoch {epoch}: loss {stats['loss']:.3f}")

cosine = net.attention_units()["blocks.1.attn"]
scales = cosine.log_scale.detach().exp().flatten().tolist()
print("learned scales:", [round(s, 3) for s in scales])

# %%
# Prediction and the metrics work on the new unit like on any other
# (:func:`~gpattn_ppl.infer.predictive.predict`,
# :func:`~gpattn_ppl.metrics.report.classification_report`). A few hundred training sentences
# and three epochs are far too few to learn CoLA; the point is that every piece runs.

out = predict(program, data.val)
report = classification_report(out["probs"], out["labels"], metrics=["acc", "mcc", "nll", "ece"])
print({k: round(v, 3) for k, v in report.items()})

# %%
# The attention of the new unit on a validation sentence, head by head. A forward pre-hook
# catches the unit's input inside the network, and
# :meth:`~gpattn_ppl.attention.base.AttentionUnit.attention_matrix` is evaluated on it:

net.eval()
sentence = data.val.batch(torch.tensor([0]))
words = data.tokenizer.decode(sentence.x[0])
inputs = {}
hook = cosine.register_forward_pre_hook(lambda module, args: inputs.update(x=args[0], mask=args[1]))
with torch.no_grad():
    net(sentence.x, sentence.mask)
    A = cosine.attention_matrix(inputs["x"], inputs["mask"])[0]        # [H, N, N]
hook.remove()

fig, axes = plt.subplots(1, cosine.heads, figsize=(4 * cosine.heads, 3.6), layout="constrained")
for head, ax in enumerate(axes):
    ax.imshow(A[head], vmin=0, vmax=float(A.max()), cmap="viridis")
    ax.set_xticks(range(len(words)), words, rotation=60, ha="right")
    ax.set_yticks(range(len(words)), words)
    ax.set_title(f"head {head}, scale {scales[head]:.2f}")
fig.suptitle("cosine attention, block 1 (rows: queries, columns: keys)")
plt.show()

# %%
# Test it with the public mixin
# -----------------------------
#
# :class:`~gpattn_ppl.testing.attention_unit.AttentionUnitTestCase` holds the checks every unit
# of the library passes: output shape and dtype, padding invariance, pad values that do not
# matter, batch and token permutation, bad inputs and all-padding rows that raise, gradients
# reaching every parameter, objective-term shapes, state-dict and pickle round trips, seeding,
# Pyro site names, float32 against float64, the predictive type, and "the posterior mean is the
# average of many samples". A test class implements ``make_unit``; class attributes tune the
# checks (``params_without_grad``, ``token_permutation_equivariant``, ``atol``, ...).
#
# In your own project this is a pytest module, for example ``tests/test_cosine_attention.py``:
#
# .. code-block:: python
#
#     from gpattn_ppl.testing import AttentionUnitTestCase
#     from my_package.attention import CosineAttention   # importing it registers "cosine"
#
#
#     class TestCosineAttention(AttentionUnitTestCase):
#         def make_unit(self, dim, heads):
#             return CosineAttention(dim=dim, heads=heads)
#
# and ``pytest`` collects the inherited ``test_*`` methods. Inside the library, a unit added to
# :mod:`gpattn_ppl.attention` is also swept by ``tests/attention/test_registry.py``, which runs
# these checks on every registered kind with its default options.
#
# Here the same class is built and its checks are called one by one, the way pytest would
# (a check that does not apply calls ``pytest.skip``):

import pytest

from gpattn_ppl.testing import AttentionUnitTestCase


class TestCosineAttention(AttentionUnitTestCase):
    def make_unit(self, dim, heads):
        return CosineAttention(dim=dim, heads=heads)


def run_checks(test_class) -> dict[str, str]:
    """Run every ``test_*`` method of ``test_class`` on a fresh instance: name -> outcome."""
    outcomes = {}
    for name in sorted(n for n in dir(test_class) if n.startswith("test_")):
        try:
            getattr(test_class(), name)()
            outcomes[name] = "passed"
        except pytest.skip.Exception as skip:
            outcomes[name] = f"skipped ({skip.msg})"
        except Exception as error:  # noqa: BLE001 - report every failing check, not the first
            outcomes[name] = f"FAILED: {type(error).__name__}: {error}"
    return outcomes


outcomes = run_checks(TestCosineAttention)
for name, outcome in outcomes.items():
    print(f"{name:<52} {outcome}")
failed = [name for name, outcome in outcomes.items() if outcome.startswith("FAILED")]
assert not failed, failed

# %%
# A check that fails says what broke. A unit that forgets the mask in ``attend``, for instance,
# lets padded keys change the output of real tokens, and its ``predictive``, which still masks,
# no longer matches its output:


class LeakyCosineAttention(CosineAttention):
    """The same unit with the padding mask ignored (a bug)."""

    def attend(self, x, mask):
        return super().attend(x, None)


class TestLeakyCosineAttention(AttentionUnitTestCase):
    def make_unit(self, dim, heads):
        return LeakyCosineAttention(dim=dim, heads=heads)


for name, outcome in run_checks(TestLeakyCosineAttention).items():
    if outcome != "passed":
        print(f"{name:<52} {outcome.splitlines()[0]}")

# %%
# Cleaning up
# -----------
#
# The registry is one dictionary per process. A unit registered in a library module stays there
# for good; this tutorial removes its toy key again, so that nothing run after it in the same
# process (here: the build of these pages) sees a ``"cosine"`` kind.

del ATTENTION["cosine"]
print(sorted(ATTENTION))
