"""Naive references for CGPT / SCGPT: dense float64 matrices, ``torch.linalg.solve``, the paper's
second-moment routes and Monte-Carlo chains. One (b, h) slice at a time: inputs ``[N, D]``."""

import math

import torch


def se(a, b):
    """Canonical SE kernel by explicit differences (no expansion trick)."""
    return torch.exp(-0.5 * (a[:, None, :] - b[None, :, :]).square().sum(-1))


def solve(A, B):
    return torch.linalg.solve(A, B)


def mvn_draws(mean, cov, S, gen):
    """``S`` draws of N(mean, cov) for a column mean ``[n]`` -> ``[S, n]`` (eigen square root)."""
    w, U = torch.linalg.eigh(0.5 * (cov + cov.T))
    root = U * w.clamp_min(0).sqrt()
    eps = torch.randn(S, len(w), generator=gen, dtype=cov.dtype)
    return mean + eps @ root.T


class CGPReference:
    """All CGP quantities of one head, by the paper's formulas (eqs. 19-25, 37-52)."""

    def __init__(self, q, k, xo, sq, sk, noise_var):
        n = q.shape[0]
        I = torch.eye(n, dtype=q.dtype)
        self.Kq, self.Kk, self.Ko = sq**2 * se(q, q), sk**2 * se(k, k), se(xo, xo)
        self.Kqo, self.Kok = sq * se(q, xo), sk * se(xo, k)
        self.Kkq = sk * sq * se(k, q)
        self.s2, self.I = noise_var, I
        self.Aq = solve(self.Ko + noise_var * I, self.Kqo.T).T          # K_qo P_o
        self.Ak = solve(self.Ko + noise_var * I, self.Kok).T            # K_ko P_o
        self.Sq = self.Kq - self.Aq @ self.Kqo.T                       # Cov[z_q | z_o]
        self.Sk = self.Kk - self.Ak @ self.Kok                         # Cov[z_k | z_o]
        self.Bk = solve(self.Kk + noise_var * I, self.Kok.T).T          # K_ok P_k
        self.So = self.Ko - self.Bk @ self.Kok.T                       # Cov[z_o | z_k] (eq. 52 fixed)

    def z(self, v):
        """Key observations Z = (K_k + s2 I) V (eq. 24)."""
        return (self.Kk + self.s2 * self.I) @ v

    def mean(self, v):
        """Eq. 25 literally: K_qo P_o K_ok P_k Z."""
        return self.Aq @ self.Bk @ self.z(v)

    def cov_second_moment(self, v, a=0):
        """App. B route: E[z_q z_q^T | z_k] - nu nu^T for column a (eqs. 45-52)."""
        mu_o = self.Bk @ self.z(v)[:, a]
        second = self.Sq + self.Aq @ (self.So + torch.outer(mu_o, mu_o)) @ self.Aq.T
        nu = self.Aq @ mu_o
        return second - torch.outer(nu, nu)

    def chain(self, v, S, gen):
        """Monte-Carlo chain z_o ~ p(z_o | z_k), z_q ~ p(z_q | z_o), per column -> [S, n, D]."""
        out = []
        for a in range(v.shape[1]):  # reference: loop over columns
            mu_o = self.Bk @ self.z(v)[:, a]
            zo = mvn_draws(mu_o, self.So, S, gen)
            zq = zo @ self.Aq.T + mvn_draws(torch.zeros_like(mu_o), self.Sq, S, gen)
            out.append(zq)
        return torch.stack(out, -1)

    def jensen_mc_terms(self, nu, v, S, gen, obs_var=0.0):
        """Per-draw values of the paper's estimator (eqs. 42-43) summed over columns, ``[S]``;
        ``obs_var`` adds observation noise to both conditional covariances."""
        n, D = nu.shape
        zo = mvn_draws(torch.zeros(n, dtype=nu.dtype), self.Ko, S, gen)  # [S, n]
        total = torch.zeros(S, dtype=nu.dtype)
        for target, A, Sig in ((nu, self.Aq, self.Sq + obs_var * self.I),
                               (self.z(v), self.Ak, self.Sk + obs_var * self.I)):
            r = target[None] - (zo @ A.T)[:, :, None]                     # [S, n, D]
            quad = (r * solve(Sig, r.transpose(0, 1).reshape(n, -1)).reshape(n, S, D)
                    .transpose(0, 1)).sum((1, 2))
            logdet = torch.linalg.slogdet(Sig)[1]
            total = total - 0.5 * (quad + D * logdet + D * n * math.log(2 * math.pi))
        return total

    def marginal(self, nu, v, obs_var=0.0):
        """log N(nu_a; 0, K_q - s2 F^T F [+ obs_var I]) + log N(z_a; 0, ...) over columns."""
        out = 0.0
        for target, A, Sig in ((nu, self.Aq, self.Sq), (self.z(v), self.Ak, self.Sk)):
            cov = Sig + A @ self.Ko @ A.T + obs_var * self.I
            mvn = torch.distributions.MultivariateNormal(torch.zeros(len(cov), dtype=cov.dtype),
                                                         covariance_matrix=0.5 * (cov + cov.T))
            out = out + mvn.log_prob(target.T).sum()
        return out


class SCGPReference:
    """SCGP quantities of one head with the paper's un-rescaled DTC matrices (eqs. 31-35, 59-72)."""

    def __init__(self, q, k, xo, sm, sl, sq, sk, noise_var):
        s2 = noise_var
        self.s2 = s2
        self.Kqm, self.Kmo = sq * se(q, sm), se(sm, xo)
        self.Kol, self.Klk = se(xo, sl), sk * se(sl, k)
        self.Kmm, self.Kll, self.Ko = se(sm, sm), se(sl, sl), se(xo, xo)
        self.Bm = self.Kmm + self.Kmo @ self.Kmo.T / s2
        self.Bl = self.Kll + self.Klk @ self.Klk.T / s2
        self.Blo = self.Kll + self.Kol.T @ self.Kol / s2   # key side of the loss
        self.Kkl = self.Klk.T

    def mean(self, v):
        """Eq. 33 with Z = V."""
        return (self.Kqm @ solve(self.Bm, self.Kmo @ self.Kol @ solve(self.Bl, self.Klk @ v))
                / self.s2**2)

    def cov_second_moment(self, v, a=0):
        """App. D: eq. 66 with eq. 67 substituted, minus nu nu^T (column a)."""
        s2, n = self.s2, self.Kqm.shape[0]
        z = v[:, a]
        Bl_inv_lk = solve(self.Bl, self.Klk)
        Eoo = (s2 * torch.eye(n, dtype=z.dtype) + self.Kol @ solve(self.Bl, self.Kol.T)
               + self.Kol @ torch.outer(Bl_inv_lk @ z, Bl_inv_lk @ z) @ self.Kol.T / s2**2)
        G = solve(self.Bm, self.Kmo)
        inner = solve(self.Bm, torch.eye(len(self.Bm), dtype=z.dtype)) + G @ Eoo @ G.T / s2**2
        second = s2 * torch.eye(n, dtype=z.dtype) + self.Kqm @ inner @ self.Kqm.T
        nu = self.mean(v)[:, a]
        return second - torch.outer(nu, nu)

    def chain(self, v, S, gen):
        """DTC chain z_l | z_k, z_o | z_l, z_m | z_o, z_q | z_m, per column -> [S, n, D]."""
        s2, out = self.s2, []
        Kll_inv_lo = solve(self.Kll, self.Kol.T)
        Kmm_inv_mq = solve(self.Kmm, self.Kqm.T)
        cov_l = self.Kll @ solve(self.Bl, self.Kll)
        cov_m = self.Kmm @ solve(self.Bm, self.Kmm)
        for a in range(v.shape[1]):
            mu_l = self.Kll @ solve(self.Bl, self.Klk @ v[:, a]) / s2
            zl = mvn_draws(mu_l, cov_l, S, gen)
            zo = zl @ Kll_inv_lo + s2**0.5 * torch.randn(S, self.Ko.shape[0], generator=gen,
                                                        dtype=v.dtype)
            mu_m = (zo @ (self.Kmm @ solve(self.Bm, self.Kmo)).T) / s2
            zm = mu_m + mvn_draws(torch.zeros(mu_m.shape[1], dtype=v.dtype), cov_m, S, gen)
            zq = zm @ Kmm_inv_mq + s2**0.5 * torch.randn(S, self.Kqm.shape[0], generator=gen,
                                                        dtype=v.dtype)
            out.append(zq)
        return torch.stack(out, -1)

    def loss_mc_terms(self, nu, v, S, gen):
        """Per-draw values of E_{z_o} E_{z_m|z_o} log N(target; K K^-1 z, s2 I), both sides, ``[S]``."""
        s2 = self.s2
        n, D = nu.shape
        zo = mvn_draws(torch.zeros(n, dtype=nu.dtype), self.Ko, S, gen)
        total = torch.zeros(S, dtype=nu.dtype)
        sides = ((nu, self.Kqm, self.Kmo, self.Kmm, self.Bm),
                 (v, self.Kkl, self.Kol.T, self.Kll, self.Blo))
        for target, Kxu, Kuo, Kuu, Bu in sides:
            mu_u = (zo @ (Kuu @ solve(Bu, Kuo)).T) / s2                   # [S, r]
            zu = mu_u + mvn_draws(torch.zeros(mu_u.shape[1], dtype=nu.dtype),
                                  Kuu @ solve(Bu, Kuu), S, gen)
            pred = zu @ solve(Kuu, Kxu.T)                                 # [S, n]
            r = target[None] - pred[:, :, None]
            total = total - r.square().sum((1, 2)) / (2 * s2) - D * n / 2 * math.log(2 * math.pi * s2)
        return total


def conditional_mean(t, z_k):
    r""":math:`\mathbb E[z_q\mid z_k] = K_{qo}P_oK_{ok}P_kz_k` (CGPT eq. 22) for arbitrary key
    observations ``z_k [B, H, N, D]``, from a :class:`~gpattn_ppl.gp.CGPTState`; the library's
    ``CorrelatedGP.mean`` is the case :math:`z_k = (K_k + \sigma^2 I)V`."""
    from gpattn_ppl import linalg

    return t.F_q.mT @ (t.K_ok @ linalg.cholesky_solve(z_k.to(t.dtype), t.L_k))
