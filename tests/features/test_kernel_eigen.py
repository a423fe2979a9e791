"""KernelEigenFeatures (KEP-SVGP's KSVD projections and regulariser) against dense references."""

import pytest
import torch

from gpattn_ppl.features import KernelEigenFeatures
from tests.reference.kep_svgp import (
    ksvd_objective_reference,
    low_rank_feature_maps,
    set_exact_ksvd,
)

H, P_DIM, N, S = 2, 6, 7, 3


def _features(heads=H, head_dim=P_DIM, s=S, seed=0, feature_map="linear"):
    torch.manual_seed(seed)
    return KernelEigenFeatures(heads * head_dim, heads, s, feature_map=feature_map).double()


def _low_rank_features(rank):
    return low_rank_feature_maps(rank, H, P_DIM, N)


def test_projections_are_scaled_singular_vectors_at_exact_ksvd():
    feats = _features()
    phi_q, phi_k = _low_rank_features(S)
    svd = set_exact_ksvd(feats, phi_q, phi_k)
    E, R = feats.project(phi_q[None], phi_k[None])
    lam = svd["lam"][:, None, :]
    torch.testing.assert_close(E[0], svd["H_e"] * lam, rtol=1e-9, atol=1e-10)
    torch.testing.assert_close(R[0], svd["H_r"] * lam, rtol=1e-9, atol=1e-10)


def test_ksvd_zero_at_exact_svd_and_positive_away():
    feats = _features()
    phi_q, phi_k = _low_rank_features(P_DIM)                                 # fixed asymmetric K
    svd = set_exact_ksvd(feats, phi_q, phi_k)
    assert (svd["K"] - svd["K"].mT).abs().max() > 1.0                         # really asymmetric
    E, R = feats.project(phi_q[None], phi_k[None])
    J = feats.ksvd_objective(E, R)
    torch.testing.assert_close(J, torch.zeros_like(J), rtol=0, atol=1e-9)
    assert feats.ksvd_loss(E, R).item() < 1e-18
    torch.testing.assert_close(J[0], ksvd_objective_reference(phi_q, phi_k, feats.W_e.detach(),
                                                              feats.W_r.detach(), svd["lam"]))
    with torch.no_grad():
        feats.W_e.mul_(1.1)
    E, R = feats.project(phi_q[None], phi_k[None])
    assert feats.ksvd_loss(E, R).item() > 1e-3
    torch.testing.assert_close(feats.ksvd_objective(E, R)[0],
                               ksvd_objective_reference(phi_q, phi_k, feats.W_e.detach(),
                                                        feats.W_r.detach(), svd["lam"]))


def test_ksvd_sums_over_real_tokens_only():
    feats = _features(feature_map="cosine")
    g = torch.Generator().manual_seed(7)
    x = torch.randn(2, N, H * P_DIM, generator=g, dtype=torch.float64)
    mask = torch.ones(2, N, dtype=torch.bool)
    mask[0, 4:] = False
    x2 = x.clone()
    x2[~mask] = 50.0 * torch.randn_like(x2[~mask])
    E, R = feats(x, mask)
    assert (E[0, :, 4:] == 0).all() and (R[0, :, 4:] == 0).all()
    loss = feats.ksvd_loss(E, R, mask)
    torch.testing.assert_close(loss, feats.ksvd_loss(*feats(x2, mask), mask))
    Ea, Ra = feats(x[:1, :4])
    torch.testing.assert_close(loss[0], feats.ksvd_loss(Ea, Ra)[0])
    # unmasked pad rows handed in are ignored as well
    Eu, Ru = feats(x2)
    torch.testing.assert_close(feats.ksvd_loss(Eu, Ru, mask), loss)


def test_cosine_feature_map_is_unit_norm_and_zero_safe():
    feats = _features(feature_map="cosine")
    x = torch.randn(2, N, H * P_DIM, dtype=torch.float64)
    x[1, 2] = 0.0
    phi_q, phi_k = feats.feature_maps(x)
    norms = phi_q.norm(dim=-1)
    torch.testing.assert_close(norms[0], torch.ones_like(norms[0]))
    assert torch.isfinite(phi_q).all() and (phi_q[1, :, 2] == 0).all()


@pytest.mark.parametrize("feature_map", ["cosine", "linear"])
def test_fused_forward_equals_explicit_feature_maps_and_projection(feature_map):
    feats = _features(feature_map=feature_map)
    x = torch.randn(3, N, H * P_DIM, dtype=torch.float64)
    x[1, 2] = 0.0                                                            # a zero (pad-like) row
    mask = torch.ones(3, N, dtype=torch.bool)
    mask[0, 5:] = False
    for m in (None, mask):
        E, R = feats(x, m)
        E2, R2 = feats.project(*feats.feature_maps(x), m)
        torch.testing.assert_close(E, E2, rtol=1e-12, atol=1e-12)
        torch.testing.assert_close(R, R2, rtol=1e-12, atol=1e-12)
        assert torch.isfinite(E).all()
