"""KEP-SVGP attention: two SVGPs on the kernel-eigen pair of the asymmetric attention kernel."""

from __future__ import annotations

import math
import warnings
from typing import Literal

import torch
from torch import nn

from ..features.kernel_eigen import FEATURE_MAPS, KernelEigenFeatures
from ..variational.kernel_eigen_pair_strategy import KernelEigenPairStrategy
from .gp_unit import GPAttentionUnit
from .pretrained import (
    SoftmaxWeights,
    copy_output_projection,
    dropped_biases,
    noise_excess,
    register_pretrained_init,
)
from .registry import register_attention

__all__ = ["KEPSVGPAttention"]

MERGES = ("add", "concat", "concat_features")
TOKEN_MIXINGS = ("dense", "low_rank")
U_DRAWS = ("sequence", "batch")


@register_attention("kep_svgp")
class KEPSVGPAttention(GPAttentionUnit):
    r"""KEP-SVGP self-attention (Chen et al., ICML 2024, eqs. 10-21).

    Per head, the KSVD projections :math:`E, R \in \mathbb R^{N\times s}` of
    :class:`~gpattn_ppl.features.KernelEigenFeatures` feed the SVGP pair of
    :class:`~gpattn_ppl.variational.KernelEigenPairStrategy`. Function values are drawn by
    reparameterisation *through u* (eq. 18 made precise), with the same :math:`U` for both
    branches (eq. 17):

    .. math::
        u_d = m_d + L_d\varepsilon_d,\ \varepsilon_d\sim\mathcal N(0, I_s),\qquad
        F^e = E\Lambda^{-1}U,\quad F^r = R\Lambda^{-1}U,\qquad U = [u_1 \dots u_s]

    so each column has exactly the covariance :math:`P\Lambda^{-1}S_d\Lambda^{-1}P^\top`. Merge
    (eq. 19) and output per head, then heads are concatenated and projected by :math:`W_O`:

    .. math::
        \texttt{add}:\ O_h = (F^e + F^r)W^{add}_h,\qquad
        \texttt{concat}:\ O_h = W_1\begin{bmatrix}F^e\\ F^r\end{bmatrix}W_{2,h},\qquad
        \texttt{concat\_features}:\ O_h = [F^e, F^r]\,W^{cat}_h

    with :math:`W_1 \in \mathbb R^{N\times 2N}` dense, or :math:`W_1 = AB^\top`,
    :math:`A\in\mathbb R^{N\times s}`, :math:`B\in\mathbb R^{2N\times s}` (App. D.2,
    ``token_mixing="low_rank"``, linear in N), shared by the heads. Inside
    :class:`~gpattn_ppl.settings.posterior_mean`, :math:`U = M` (the posterior mean).

    **Sites and terms.** The inducing values are the latent ``<site_prefix>.u`` (global: q(u)
    and p(u) do not depend on the input), drawn through
    :meth:`~gpattn_ppl.attention.AttentionUnit.sample`. ``u_draws="sequence"`` (default)
    draws an independent :math:`U` per sequence -- an unbiased, lower-variance estimate of
    the same ELBO -- with the global KL (eq. 21) counted once, in thin and sites mode alike
    (:func:`gpattn_ppl.ppl.draw`, ``per_sequence``); ``u_draws="batch"`` draws one :math:`U`
    shared by the minibatch. Inside :class:`~gpattn_ppl.settings.posterior_mean`, :math:`U = M`
    and the KL is still reported. ``ksvd_loss`` is the per-sequence ``[B]`` term of
    :meth:`KernelEigenFeatures.ksvd_loss` (weight key ``ksvd_weight``).

    **Masks.** Pad rows of E and R are zero, so pads have F = 0, take no part in the KSVD sums
    and never reach real tokens (add and concat_features are token-wise; concat mixes only the
    zeroed pad rows).

    **Predictive.** :meth:`predictive` pushes q(u) through the (linear) head output map: mean
    :math:`G(M)` and, per head and output channel j, the exact covariance over tokens
    :math:`\sum_d G_{jd}S_dG_{jd}^\top` as a rank-:math:`s^2` root (an
    :class:`~gpattn_ppl.distributions.AttentionPredictive`). KEP-SVGP has no value matrix (its
    output is a function of the KSVD projections alone); :meth:`attention_matrix` is the
    attention kernel its eigen-pair reconstructs, :math:`E\Lambda^{-1}R^\top`
    (:meth:`~gpattn_ppl.variational.KernelEigenPairStrategy.attention_matrix`), which
    ``gpattn-ppl explain`` draws.

    :param dim: C. :param heads: H.
    :param rank: s, kernel-eigen features (= GP outputs) per head; at most the head dimension
        D (a head's kernel :math:`\Phi_q\Phi_k^\top` has rank at most D): a larger rank is
        capped to D with a ``UserWarning`` (e.g. the default 5 on a host with D = 4).
    :param merge: ``"add"`` (any N, the text setting), ``"concat"`` (fixed N, the image
        setting; needs ``seq_len``), or ``"concat_features"`` [ours; any N].
    :param feature_map: ``"cosine"`` (paper) or ``"linear"``.
    :param u_draws: ``"sequence"`` (default) or ``"batch"``, see above.
    :param seq_len: N for ``merge="concat"``.
    :param token_mixing: ``"dense"`` (:math:`W_1`, paper default) or ``"low_rank"`` (:math:`AB^\top`).
    :param proj_dropout: dropout after :math:`W_O` (no attention weights, so no ``attn_dropout``).

    Cost per (b, h): O(N D s + N s²) for add / concat_features and concat with ``low_rank``;
    O(N² s) for dense concat; KL O(s³) per head, batch-free. Linear in N except dense concat.

    >>> att = KEPSVGPAttention(8, 2, rank=3)
    >>> att(torch.randn(4, 5, 8)).shape, sorted(att.objective_terms())
    (torch.Size([4, 5, 8]), ['kl', 'ksvd_loss'])
    """

    rotary_capable = True

    def __init__(self, dim: int, heads: int, *, rank: int = 5,
                 merge: Literal["add", "concat", "concat_features"] = "add",
                 feature_map: Literal["cosine", "linear"] = "cosine",
                 u_draws: Literal["sequence", "batch"] = "sequence",
                 seq_len: int | None = None, token_mixing: Literal["dense", "low_rank"] = "dense",
                 proj_dropout: float = 0.0) -> None:
        super().__init__(dim, heads, proj_dropout=proj_dropout)
        if merge not in MERGES:
            raise ValueError(f"unknown merge {merge!r}; allowed: {', '.join(MERGES)}")
        if feature_map not in FEATURE_MAPS:
            raise ValueError(f"unknown feature_map {feature_map!r}; allowed: {', '.join(FEATURE_MAPS)}")
        if u_draws not in U_DRAWS:
            raise ValueError(f"unknown u_draws {u_draws!r}; allowed: {', '.join(U_DRAWS)}")
        if token_mixing not in TOKEN_MIXINGS:
            raise ValueError(f"unknown token_mixing {token_mixing!r}; "
                             f"allowed: {', '.join(TOKEN_MIXINGS)}")
        if merge == "concat" and (seq_len is None or int(seq_len) < 1):
            raise ValueError("merge='concat' mixes tokens with W_1 in R^{N x 2N} and needs a fixed "
                             "seq_len (N); use merge='add' for variable-length inputs")
        s, D = int(rank), self.head_dim
        if s > D:
            # a head's attention kernel Phi_q Phi_k^T (N x N) has rank at most D: its singular
            # values past D are 0, and E = Phi_q W_e has no more than D independent columns
            warnings.warn(f"KEP-SVGP attention rank {s} is more than the head dimension D = {D} "
                          f"(dim {dim} / heads {heads}), the most kernel-eigen pairs a head's "
                          f"attention kernel has; using rank {D}", UserWarning, stacklevel=2)
            s = D
        self.rank, self.merge, self.u_draws = s, merge, u_draws
        self.seq_len, self.token_mixing = (None if seq_len is None else int(seq_len)), token_mixing
        self.strategy = KernelEigenPairStrategy(
            KernelEigenFeatures(dim, heads, s, feature_map=feature_map), merge=merge,
            u_draws=u_draws)
        bound = 1.0 / math.sqrt(s)
        if merge == "add":
            self.W_add = nn.Parameter(torch.empty(heads, s, D).uniform_(-bound, bound))
        elif merge == "concat_features":
            self.W_cat = nn.Parameter(torch.empty(heads, 2 * s, D).uniform_(-bound / math.sqrt(2),
                                                                          bound / math.sqrt(2)))
        else:
            N = self.seq_len
            self.W_2 = nn.Parameter(torch.empty(heads, s, D).uniform_(-bound, bound))
            if token_mixing == "dense":
                b1 = 1.0 / math.sqrt(2 * N)
                self.W_1 = nn.Parameter(torch.empty(N, 2 * N).uniform_(-b1, b1))
            else:
                # Var[(A B^T)_nm] = s * (1/s) * 1/(6N) = Var of U(-1/sqrt(2N), 1/sqrt(2N))
                self.mix_A = nn.Parameter(torch.randn(N, s) / math.sqrt(s))
                self.mix_B = nn.Parameter(torch.randn(2 * N, s) / math.sqrt(6 * N))
        self.out = nn.Linear(dim, dim)

    @property
    def features(self) -> KernelEigenFeatures:
        """The layer's :class:`~gpattn_ppl.features.KernelEigenFeatures`."""
        return self.strategy.features

    @property
    def head(self) -> KernelEigenPairStrategy:
        """The GP head: the strategy."""
        return self.strategy

    def _check_length(self, N: int) -> None:
        if self.merge == "concat" and N != self.seq_len:
            raise ValueError(f"{self._where()}: merge='concat' was built "
                             f"for seq_len={self.seq_len}, got N={N}")

    def project(self, x: torch.Tensor, mask: torch.Tensor | None) -> tuple:
        """The KSVD projections ``E, R`` ``[B, H, N, s]`` (GP dtype) and the output map."""
        self._check_length(x.shape[1])
        E, R = self.features(x, mask, rotate=self.rotate)
        return E, R, self._output_maps

    def output(self, f, x: torch.Tensor) -> torch.Tensor:
        r"""The ``merge`` of the branches into the head outputs, then :math:`W_O` and dropout."""
        if self.merge == "add":
            O = torch.matmul(f.to(x.dtype), self.W_add)                        # [B, H, N, D]
        else:
            Fe, Fr = (F.to(x.dtype) for F in f)
            if self.merge == "concat_features":
                O = torch.matmul(torch.cat([Fe, Fr], -1), self.W_cat)
            else:
                O = torch.matmul(self._mix_tokens(torch.cat([Fe, Fr], -2)), self.W_2)
        return self.proj_dropout(self.out(self.merge_heads(O)))

    def _output_maps(self, E: torch.Tensor, R: torch.Tensor
                     ) -> list[tuple[torch.Tensor, torch.Tensor]]:
        r"""The head output as a linear map of U: :math:`O = \sum_r G_r U^\top W_r` with
        ``(G_r [B, H, N, s], W_r [H, s, D])`` (:math:`G = P\Lambda^{-1}`, token-mixed for concat)."""
        inv_lam = self.features.lambda_.to(E.dtype).reciprocal()[:, None, :]
        Et, Rt = E * inv_lam, R * inv_lam
        if self.merge == "add":
            return [(Et + Rt, self.W_add)]
        if self.merge == "concat_features":
            s = self.rank
            return [(Et, self.W_cat[:, :s]), (Rt, self.W_cat[:, s:])]
        return [(self._mix_tokens(torch.cat([Et, Rt], -2)), self.W_2)]

    def _mix_tokens(self, F_cat: torch.Tensor) -> torch.Tensor:
        """``W_1 F^cat``: ``[B, H, 2N, s] -> [B, H, N, s]``, dense or as ``A (B^T F^cat)``."""
        if self.token_mixing == "dense":
            return torch.matmul(self.W_1, F_cat)
        return torch.matmul(self.mix_A, torch.matmul(self.mix_B.mT, F_cat))


# -- initialisation from a pretrained softmax layer (attention/pretrained.py) ------------------

@register_pretrained_init(KEPSVGPAttention)
def _kep_svgp(unit: KEPSVGPAttention, w: SoftmaxWeights, x, mask) -> dict:
    feats = unit.features
    feats.qk.weight.copy_(torch.cat([w.q_weight, w.k_weight]))
    copy_output_projection(unit, w, fold_value_bias=True)
    fitted = []
    if x is not None:
        if unit.merge != "add":
            raise ValueError(f"{unit.site_prefix or 'KEPSVGPAttention'}: the pretrained "
                             f"calibration fits merge='add' only, not {unit.merge!r}")
        phi_q, phi_k = feats.feature_maps(x, unit.rotate)                 # [B, H, N, D]
        if mask is not None:
            real = mask[:, None, :, None].to(phi_q.dtype)
            phi_q, phi_k = phi_q * real, phi_k * real
        cross = torch.einsum("bhnd,bhne->hde", phi_q, phi_k) / x.shape[0]   # [H, D, D]
        U, S, Vh = torch.linalg.svd(cross.double())
        s = unit.rank
        feats.W_e.copy_(U[..., :s].to(feats.W_e))
        feats.W_r.copy_(Vh.mT[..., :s].to(feats.W_r))
        lam = S[:, :s].clamp_min(1e-6).float()
        feats.lambda_ = lam
        # m_d = lambda_d e_d (one prior std along its own feature): F = P Lambda^-1 M = P;
        # S_d = Lambda^2, the prior's covariance, as the strategy initialises it
        q_u = unit.strategy.q_u
        q_u.variational_mean.copy_(torch.diag_embed(lam).to(q_u.variational_mean))
        H = lam.shape[0]
        q_u.chol_variational_covar.copy_(
            torch.diag_embed(lam)[:, None].expand(H, s, s, s).to(q_u.chol_variational_covar))
        # W_add: least squares of the head outputs on the posterior-mean features
        E, R = feats(x, mask, rotate=unit.rotate)
        G, _ = unit._output_maps(E, R)[0]                                # [B, H, N, s]
        m = unit.strategy.q_params(G.dtype)[0]                           # [H, s, s]
        Gm = torch.einsum("bhni,hdi->bhnd", G, m)                         # [B, H, N, s]
        ref = w.head_outputs(x, mask, value_bias=False).to(G.dtype)      # [B, H, N, D]
        real = (mask if mask is not None
                else torch.ones(x.shape[:2], dtype=torch.bool, device=x.device))
        Gh = Gm.permute(1, 0, 2, 3)[:, real]                              # [H, P, s]
        Rh = ref.permute(1, 0, 2, 3)[:, real]                             # [H, P, D]
        sol = torch.linalg.lstsq(Gh.double(), Rh.double()).solution        # [H, s, D]
        unit.W_add.copy_(sol.to(unit.W_add))
        # the output is linear in U = M + L eps: dividing L by a divides the noise by a
        a = noise_excess(unit, w, x, mask)
        if a > 1.0:
            unit.strategy.q_u.chol_variational_covar.div_(a)
        fitted += ["W_e, W_r, Lambda (top-s SVD of the pooled Phi_q^T Phi_k)",
                   "q(u) mean m_d = lambda_d e_d (then F = E + R)",
                   "W_add (least squares onto the pretrained head outputs)",
                   f"noise: q(u) covariance factor / {a:.3g}"]
    return {"copied": ["W_q, W_k -> feature projection", "W_O", "b_O + W_O b_v"],
            "fitted": fitted, "not_carried": ["W_v (KEP-SVGP has no values)"]
            + dropped_biases(w, ("q", "k"))}
