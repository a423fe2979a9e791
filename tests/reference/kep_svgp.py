"""Naive KEP-SVGP references: dense matrices, explicit SVDs, ``torch.linalg.solve``, float64.

Nothing here exploits structure (no diagonal Lambda shortcut, no low-rank root); loops over heads
and output dimensions are allowed. The library's optimised paths are compared against these.
"""

import torch


def exact_ksvd(phi_q, phi_k, s):
    """Top-s SVD of ``K_att = Phi_q Phi_k^T`` per head and the primal weights that realise it.

    :param phi_q, phi_k: ``[H, n, p]`` feature maps of one sequence.
    :returns: dict with ``K`` ``[H, n, n]``, ``H_e``, ``H_r`` ``[H, n, s]``, ``lam`` ``[H, s]``,
        ``all_sv`` ``[H, n]`` (every singular value), ``W_e = Phi_k^T H_r`` and
        ``W_r = Phi_q^T H_e`` ``[H, p, s]`` (KEP eq. 13 and App. B.2 eq. 28).
    """
    K = phi_q @ phi_k.mT
    U, S, Vh = torch.linalg.svd(K)
    H_e, H_r, lam = U[..., :s], Vh[..., :s, :].mT, S[..., :s]
    return {"K": K, "H_e": H_e, "H_r": H_r, "lam": lam, "all_sv": S,
            "W_e": phi_k.mT @ H_r, "W_r": phi_q.mT @ H_e}


def dense_svgp_posterior(K_ff, K_fu, K_uu, m, S):
    """Gaussian conditioning of the joint prior ``[f; u]`` integrated against ``q(u) = N(m, S)``.

    .. math::
        \\mu = K_{fu}K_{uu}^{-1}m,\\quad
        \\Sigma = K_{ff} - K_{fu}K_{uu}^{-1}K_{uf} + K_{fu}K_{uu}^{-1}SK_{uu}^{-1}K_{uf}

    Shapes broadcast: ``K_ff [..., n, n]``, ``K_fu [..., n, s]``, ``K_uu [..., s, s]``,
    ``m [..., s]``, ``S [..., s, s]``. Dense ``torch.linalg.solve``; no structure used.
    """
    A = torch.linalg.solve(K_uu, K_fu.mT).mT                 # K_fu K_uu^{-1}
    mean = (A @ m.unsqueeze(-1)).squeeze(-1)
    cov = K_ff - A @ K_fu.mT + A @ S @ A.mT
    return mean, cov


def kl_reference(m, S, prior_cov):
    """KL(N(m, S) || N(0, P)) with dense solves and slogdet, broadcast over leading dims."""
    s = m.shape[-1]
    trace = torch.linalg.solve(prior_cov, S).diagonal(dim1=-2, dim2=-1).sum(-1)
    maha = (m.unsqueeze(-2) @ torch.linalg.solve(prior_cov, m.unsqueeze(-1))).reshape(m.shape[:-1])
    return 0.5 * (trace + maha + torch.linalg.slogdet(prior_cov)[1] - torch.linalg.slogdet(S)[1] - s)


def ksvd_objective_reference(phi_q, phi_k, W_e, W_r, lam):
    """``J`` of KEP App. C eq. 37 for one sequence, with explicit token loops: ``[H]``."""
    H, n, _ = phi_q.shape
    out = []
    for h in range(H):
        Linv = torch.diag(1.0 / lam[h])
        J = -torch.trace(W_e[h].T @ W_r[h])
        for i in range(n):
            e = W_e[h].T @ phi_q[h, i]
            r = W_r[h].T @ phi_k[h, i]
            J = J + 0.5 * e @ Linv @ e + 0.5 * r @ Linv @ r
        out.append(J)
    return torch.stack(out)


def kep_add_forward_reference(x, mask, qk_weight, W_e, W_r, lam, u, W_add, W_out, b_out,
                              cosine=True):
    """KEP-SVGP add-merge output for given inducing values, with a loop over heads and dims.

    :param u: ``[B, H, s, s]`` laid out ``u[b, h, d, i]`` (or ``[H, s, s]`` shared by the batch).
    :returns: ``[B, N, C]``; pad rows of E, R are zeroed as the unit does.
    """
    B, N, C = x.shape
    H, D, s = W_e.shape
    if u.dim() == 3:
        u = u.expand(B, *u.shape)
    qk = x @ qk_weight.T
    q, k = qk[..., :C], qk[..., C:]
    heads = []
    for h in range(H):
        qh, kh = q[..., h * D:(h + 1) * D], k[..., h * D:(h + 1) * D]
        if cosine:
            qh = qh / qh.norm(dim=-1, keepdim=True).clamp_min(1e-12)
            kh = kh / kh.norm(dim=-1, keepdim=True).clamp_min(1e-12)
        E, R = qh @ W_e[h], kh @ W_r[h]                       # [B, N, s]
        if mask is not None:
            E, R = E * mask[..., None], R * mask[..., None]
        Linv = torch.diag(1.0 / lam[h])
        cols = [(E + R) @ Linv @ u[:, h, d].unsqueeze(-1) for d in range(s)]   # each [B, N, 1]
        F = torch.cat(cols, -1)
        heads.append(F @ W_add[h])
    O = torch.cat(heads, -1)
    return O @ W_out.T + b_out


def low_rank_feature_maps(rank, heads, p_dim, n, seed=2):
    """``Phi_q, Phi_k: [heads, n, p_dim]`` with ``K_att = Phi_q Phi_k^T`` of exactly ``rank``."""
    g = torch.Generator().manual_seed(seed)
    A = torch.randn(heads, n, rank, generator=g, dtype=torch.float64)
    Bq = torch.randn(heads, rank, p_dim, generator=g, dtype=torch.float64)
    Ck = torch.randn(heads, n, p_dim, generator=g, dtype=torch.float64)
    return A @ Bq, Ck


def set_exact_ksvd(features, phi_q, phi_k):
    """Put a :class:`~gpattn_ppl.features.KernelEigenFeatures` at the exact KSVD of
    ``Phi_q Phi_k^T`` (its ``W_e``, ``W_r`` and Lambda); returns :func:`exact_ksvd`'s dict."""
    svd = exact_ksvd(phi_q, phi_k, features.rank)
    with torch.no_grad():
        features.W_e.copy_(svd["W_e"])
        features.W_r.copy_(svd["W_r"])
    features.lambda_ = svd["lam"]
    return svd


def branch_posterior(strat, P):
    r"""The marginal of one KEP-SVGP branch under q(u), :math:`q(f_d) = \mathcal N(P\Lambda^{-1}m_d,
    P\Lambda^{-1}S_d\Lambda^{-1}P^\top)` (KEP eq. 16, symmetric form): batch ``[B, H, s]``, event
    ``N``, a rank-s lazy root :math:`(P\Lambda^{-1})L_d`. (The head's predictive is the push-forward
    through the unit's output map; this is the per-branch form the derivation checks.)"""
    from gpytorch.distributions import MultivariateNormal
    from linear_operator.operators import LowRankRootLinearOperator, MatmulLinearOperator

    m, L, lam = strat.q_params(P.dtype)
    Pt = P * lam.reciprocal()[:, None, :]
    mean = torch.einsum("bhni,hdi->bhdn", Pt, m)
    B, H, N, s = Pt.shape
    root = MatmulLinearOperator(Pt.unsqueeze(-3).expand(B, H, s, N, s), L.expand(B, H, s, s, s))
    return MultivariateNormal(mean, LowRankRootLinearOperator(root))
