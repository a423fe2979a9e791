"""Naive SGPA references: dense matrices, ``torch.linalg.solve``, explicit loops over heads.

Everything here is float64 and written from the textbook formulas (docs/derivations/sgpa.rst), never
from the library's whitened algebra, so agreement is evidence.
"""

import torch
from gpytorch.kernels import Kernel


def dense_conditional(K_ff, K_fu, K_uu, m_u, S_u):
    r"""Dense Gaussian conditioning: :math:`\int p(f|u) q(u) du` for a joint GP prior on (f, u).

    ``K_ff [n, n]``, ``K_fu [n, m]``, ``K_uu [m, m]``, ``m_u [m, D]``, ``S_u [m, m]``;
    returns mean ``[n, D]`` and covariance ``[n, n]`` with :math:`A = K_{fu}K_{uu}^{-1}`:
    :math:`\mathcal N(A m_u, K_{ff} - A K_{uf} + A S_u A^\top)`.
    """
    A = torch.linalg.solve(K_uu, K_fu.T).T
    return A @ m_u, K_ff - A @ K_fu.T + A @ S_u @ A.T


def dense_joint_conditional(K_joint, n, m_u, S_u):
    """The same, from the joint covariance of ``[f; u]`` (``[n + m, n + m]``), by Schur complement."""
    return dense_conditional(K_joint[:n, :n], K_joint[:n, n:], K_joint[n:, n:], m_u, S_u)


def standard_sgpa_reference(x, Wqk, Wv, outputscale, lengthscale, R_full, heads, jitter):
    """Standard SGPA (tied, dual mean) of ONE unpadded sequence ``x [N, C]``, head by head.

    Returns per head: mean ``[N, D]`` (= (K + j diag K) v), covariance ``[N, N]`` (L R Rᵀ Lᵀ) and
    the KL summed over channels, from the unwhitened definition KL(N(m_u, S_u) || N(0, K + j diag K)).
    """
    N, C = x.shape
    D = C // heads
    out = []
    for h in range(heads):  # reference: a plain loop over heads
        sl = slice(h * D, (h + 1) * D)
        q = x @ Wqk[sl].T
        v = x @ Wv[sl].T
        ls = lengthscale[h].reshape(-1)
        K = outputscale[h] * torch.exp((q / ls) @ (q / ls).T)
        Kj = K + jitter * torch.diag(K.diagonal())          # the relative nugget
        L = torch.linalg.cholesky(Kj)
        R = R_full[h, :N, :N]
        S_u = L @ R @ R.T @ L.T
        m_u = Kj @ v
        kl = 0.0
        for c in range(D):
            q_u = torch.distributions.MultivariateNormal(m_u[:, c], covariance_matrix=S_u)
            p_u = torch.distributions.MultivariateNormal(torch.zeros(N, dtype=x.dtype), Kj)
            kl = kl + torch.distributions.kl_divergence(q_u, p_u)
        out.append({"mean": m_u, "cov": S_u, "kl": kl})
    return out


def decoupled_sgpa_reference(q, v, k_beta, a_beta, R, kern, jitter):
    """Decoupled SGPA of one head and sequence, textbook form.

    ``q, v [N, D]``, ``k_beta [M, D]``, ``a_beta [M, D]``, ``R [D, M, M]``; ``kern(a, b)`` the
    dense kernel. Returns mean ``[N, D]``, covariances ``[D, N, N]``, KL_beta ``[D]``, KL_gamma
    ``[D]``.
    """
    N, D = v.shape
    M = k_beta.shape[0]
    K_qq = kern(q, q)
    K_qb = kern(q, k_beta)
    K_bb = kern(k_beta, k_beta)
    K_bb = K_bb + jitter * torch.diag(K_bb.diagonal())     # the relative nugget
    Q = K_qb @ torch.linalg.solve(K_bb, K_qb.T)
    mean = K_qq @ v - Q @ v + K_qb @ a_beta
    L_b = torch.linalg.cholesky(K_bb)
    P = torch.linalg.solve(L_b, K_qb.T)                   # L_b^{-1} K_bq, explicit solve
    covs, kl_b, kl_g = [], [], []
    for c in range(D):
        S = R[c] @ R[c].T
        covs.append(K_qq - Q + P.T @ S @ P)
        kl_b.append(0.5 * (torch.trace(S) - torch.logdet(S) - M + a_beta[:, c] @ K_bb @ a_beta[:, c]))
        kl_g.append(0.5 * (v[:, c] @ (K_qq - Q) @ v[:, c]))
    return mean, torch.stack(covs), torch.stack(kl_b), torch.stack(kl_g)


class PositiveFeatureKernel(Kernel):
    r"""A kernel with an explicit finite feature map and positive values (for the γ-KL check).

    :math:`\phi(x) = (1, e^{x_1}, \dots, e^{x_D})`, :math:`\kappa(x, x') = \phi(x)^\top\phi(x')
    = 1 + \sum_i e^{x_i + x'_i} > 0`, so it has the ``log_forward`` the attention kernels use.
    """

    def features(self, x):
        return torch.cat([torch.ones_like(x[..., :1]), x.exp()], -1)

    def log_forward(self, x1, x2):
        return (self.features(x1) @ self.features(x2).transpose(-1, -2)).log()

    def forward(self, x1, x2, diag=False, **params):
        if diag:
            return (self.features(x1) * self.features(x2)).sum(-1)
        return self.features(x1) @ self.features(x2).transpose(-1, -2)


def decoupled_kl_beta(strategy, state):
    """Global (β) KL part of decoupled SGPA per head and channel, ``[H, D]`` (zeros when M = 0):
    KL(q(u_w) || N(0, I)) from the strategy's distributions (the unit reports its sum as
    ``kl_global``)."""
    if strategy.num_inducing == 0:
        return state.v.new_zeros(strategy.heads, strategy.head_dim)
    q = strategy.variational_distribution(state)
    return torch.distributions.kl_divergence(q, strategy.prior_distribution(q))
