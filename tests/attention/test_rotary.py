"""Rotary position embeddings applied by the units (for hosts that rotate queries and keys:
ModernBERT): the rotation itself, that every built-in kind applies it, and that units whose
attention compares tokens only with tokens become functions of relative positions."""

import math

import pytest
import torch

from gpattn_ppl import settings
from gpattn_ppl.attention import ATTENTION, RotaryPositions, build_attention

C, H = 16, 4
D = C // H
#: small options so every unit runs on short inputs
SMALL = {"sgpa": {"num_inducing": 3}, "kep_svgp": {"rank": 3}, "scgpt": {"num_inducing": 3},
         "h_gumbel": {"num_centroids": 3}}


def rope(N, start=0, base=10000.0):
    """``RotaryPositions`` of positions ``start .. start + N - 1`` (the rotate-half form)."""
    inv = 1.0 / base ** (torch.arange(0, D, 2, dtype=torch.float) / D)
    freqs = torch.arange(start, start + N, dtype=torch.float)[:, None] * inv
    emb = torch.cat([freqs, freqs], -1)[None]
    return RotaryPositions(emb.cos(), emb.sin())


def test_the_rotation_is_the_rotate_half_form_and_keeps_norms():
    torch.manual_seed(0)
    t, rot = torch.randn(2, H, 5, D), rope(5, start=3)
    out = rot.apply(t)
    half = D // 2
    cos, sin = rot.cos[:, None], rot.sin[:, None]
    expected = torch.cat([t[..., :half] * cos[..., :half] - t[..., half:] * sin[..., :half],
                          t[..., half:] * cos[..., half:] + t[..., :half] * sin[..., half:]], -1)
    torch.testing.assert_close(out, expected)
    torch.testing.assert_close(out.norm(dim=-1), t.norm(dim=-1))
    # token-major layouts ([B, N, roles, H, D]) rotate the same
    torch.testing.assert_close(rot.apply(t.transpose(1, 2)[:, :, None], token_dim=1)[:, :, 0],
                               out.transpose(1, 2))
    with pytest.raises(ValueError, match=r"do not fit queries and keys of batch 2, length 4"):
        rot.apply(t[:, :, :4])


@pytest.mark.parametrize("kind", sorted(ATTENTION))
def test_every_kind_applies_the_rotation(kind):
    """Inside ``positions`` the output changes (the unit rotates its queries and keys), and is
    the same again outside; a unit marked ``requires_positions`` refuses to run without."""
    torch.manual_seed(0)
    unit = build_attention(kind, C, H, **SMALL.get(kind, {})).eval()
    assert type(unit).rotary_capable
    x = torch.randn(2, 6, C)
    with torch.no_grad(), settings.posterior_mean():
        plain = unit(x)
        with unit.positions(rope(6)):
            rotated = unit(x)
        again = unit(x)
    assert not torch.allclose(rotated, plain, atol=1e-6)
    torch.testing.assert_close(again, plain, atol=0, rtol=0)
    unit.requires_positions = True
    with pytest.raises(ValueError, match="call it through its host model"):
        unit(x)


@pytest.mark.parametrize("kind", ["softmax", "gumbel", "kernel", "cgpt"])
def test_token_to_token_units_see_relative_positions_only(kind):
    """Units whose attention compares tokens with tokens only (no inducing keys or centroids
    without a position) give the same output when every position moves by the same offset."""
    torch.manual_seed(0)
    unit = build_attention(kind, C, H).eval()
    x = torch.randn(2, 6, C)
    mask = torch.tensor([[True] * 6, [True] * 4 + [False] * 2])
    with torch.no_grad(), settings.posterior_mean():
        with unit.positions(rope(6)):
            at0 = unit(x, mask)
        with unit.positions(rope(6, start=11)):
            at11 = unit(x, mask)
    torch.testing.assert_close(at11[mask], at0[mask], atol=1e-4, rtol=1e-4)
    assert math.isfinite(float(at0.abs().sum()))
