"""Attention in tiles over keys (settings.attention_tiles) against the untiled computation."""

import pytest
import torch

import gpattn_ppl.attention.gumbel as gumbel_module
import gpattn_ppl.attention.kernel as kernel_module
from gpattn_ppl import settings
from gpattn_ppl.attention import build_attention
from gpattn_ppl.attention._tiled import tiled_attention, use_tiles
from gpattn_ppl.distributions import relaxed_one_hot as roh

_TILE = 4


@pytest.fixture
def small_tiles(monkeypatch):
    """Tiles of 4 keys, so N = 11 runs in three uneven tiles."""
    monkeypatch.setattr(kernel_module, "TILE", _TILE)
    monkeypatch.setattr(gumbel_module, "TILE", _TILE)


def _mask(B=3, N=11):
    mask = torch.ones(B, N, dtype=torch.bool)
    mask[1, 4:8] = False                 # middle padding: a whole tile of pad keys
    mask[2, -3:] = False                 # trailing padding
    return mask


def test_tiled_attention_matches_brute_force_with_gradients():
    """softmax(S)V and exp(S)V over uneven tiles equal the dense formula, with the gradients
    of q, k, v and of a parameter of the logits; pads get no weight (float64, gradcheck)."""
    g = torch.Generator().manual_seed(0)
    q, k = (torch.randn(3, 2, 11, 5, generator=g, dtype=torch.float64) for _ in range(2))
    v = torch.randn(3, 2, 11, 3, generator=g, dtype=torch.float64)
    w = torch.tensor(0.7, dtype=torch.float64)
    mask = _mask()
    for normalize in (True, False):
        ins = [t.clone().requires_grad_(True) for t in (q, k, v, w)]
        out = tiled_attention(lambda a, b, w_=ins[3]: w_ * (a @ b.mT), *ins[:3], mask,
                              params=[ins[3]], normalize=normalize, tile=_TILE)
        ref_ins = [t.clone().requires_grad_(True) for t in (q, k, v, w)]
        S = (ref_ins[3] * ref_ins[0] @ ref_ins[1].mT).masked_fill(~mask[:, None, None], -torch.inf)
        ref = (S.softmax(-1) if normalize else S.exp()) @ ref_ins[2]
        torch.testing.assert_close(out, ref, rtol=1e-12, atol=1e-12)
        gout = torch.randn(out.shape, generator=g, dtype=out.dtype)
        for ours, theirs in zip(torch.autograd.grad(out, ins, gout),
                                torch.autograd.grad(ref, ref_ins, gout)):
            torch.testing.assert_close(ours, theirs, rtol=1e-10, atol=1e-10)
        ins = [t.clone().requires_grad_(True) for t in (q, k, v, w)]
        assert torch.autograd.gradcheck(
            lambda q_, k_, v_, w_, n=normalize: tiled_attention(
                lambda a, b: w_ * (a @ b.mT), q_, k_, v_, mask, params=[w_], normalize=n,
                tile=_TILE), ins)
    with pytest.raises(ValueError, match="tile"):
        tiled_attention(lambda a, b: a @ b.mT, q, k, v, None, tile=0)


@pytest.mark.parametrize("options", [{}, {"symmetric": True}, {"kernel": "rbf"},
                                     {"kernel": "canonical", "normalize": False}])
def test_kernel_attention_tiled_equals_untiled(small_tiles, options):
    """Output and every parameter's and the input's gradient equal the untiled path's (float64,
    middle padding), and no [B, H, N, N] tensor is kept for the backward."""
    torch.manual_seed(0)
    unit = build_attention("kernel", 8, 2, **options).double()
    x = torch.randn(3, 11, 8, dtype=torch.float64)
    mask = _mask()
    grads, outs = {}, {}
    for mode in ("off", "on"):
        xx = x.clone().requires_grad_(True)
        saved = []
        with settings.attention_tiles(mode), torch.autograd.graph.saved_tensors_hooks(
                lambda t, saved=saved: saved.append(t.numel()) or t, lambda t: t):
            out = unit(xx, mask)
        outs[mode] = out
        out.square().sum().backward()
        grads[mode] = [xx.grad] + [p.grad.clone() for p in unit.parameters() if p.requires_grad]
        unit.zero_grad()
        if mode == "on":
            assert max(saved) < 3 * 2 * 11 * 11, saved
        else:
            assert max(saved) >= 3 * 2 * 11 * 11          # the untiled path does keep one
    torch.testing.assert_close(outs["on"], outs["off"], rtol=1e-10, atol=1e-12)
    assert all(g.abs().sum() > 0 for g in grads["on"])
    for a, b in zip(grads["on"], grads["off"]):
        torch.testing.assert_close(a, b, rtol=1e-9, atol=1e-11)


def test_gumbel_tiled_draws_once_and_backpropagates_through_the_same_draw(small_tiles):
    """One tile: the untiled draw exactly; several tiles: the tile-by-tile draw of the same
    generator (same state afterwards), the forward and its gradient equal the dense formula on
    that draw; posterior-mean mode equals the untiled path; pad keys carry no weight."""
    torch.manual_seed(0)
    unit = build_attention("gumbel", 8, 2, temperature=0.7).double()
    x = torch.randn(3, 11, 8, dtype=torch.float64, requires_grad=True)
    mask = _mask()
    q, k, v = unit.project(x)
    with settings.posterior_mean():
        ref = {m: None for m in ("off", "on")}
        for mode in ref:
            with settings.attention_tiles(mode):
                ref[mode] = unit._attend_values(q, k, v, mask)
        torch.testing.assert_close(ref["on"], ref["off"], rtol=1e-12, atol=1e-12)
    gumbel_module.TILE = 64                                      # one tile: the same draw
    for mode in ("off", "on"):
        torch.manual_seed(5)
        with settings.attention_tiles(mode):
            ref[mode] = unit._attend_values(q, k, v, mask)
    torch.testing.assert_close(ref["on"], ref["off"], rtol=1e-12, atol=1e-12)
    gumbel_module.TILE = _TILE
    torch.manual_seed(5)
    with settings.attention_tiles("on"):
        out = unit._attend_values(q, k, v, mask)
    after = torch.get_rng_state()
    torch.manual_seed(5)
    g = torch.cat([roh.sample_gumbel((3, 2, 11, j1 - j0), dtype=torch.float64)
                   for j0, j1 in ((0, 4), (4, 8), (8, 11))], -1)
    assert torch.equal(torch.get_rng_state(), after)
    S = ((q @ k.mT + g) / 0.7).masked_fill(~mask[:, None, None], -torch.inf)
    dense = S.softmax(-1) @ v
    torch.testing.assert_close(out, dense, rtol=1e-12, atol=1e-12)
    gout = torch.randn_like(out)
    ours = torch.autograd.grad(out, [x, *unit.qkv.parameters()], gout, retain_graph=True)
    theirs = torch.autograd.grad(dense, [x, *unit.qkv.parameters()], gout)
    for a, b in zip(ours, theirs):
        torch.testing.assert_close(a, b, rtol=1e-10, atol=1e-11)
    xp = x.detach().clone()
    xp[1, 4:8] = 100.0                                           # pad keys' values: no effect
    torch.manual_seed(5)
    with settings.attention_tiles("on"), torch.no_grad():
        moved = unit(xp, mask)
        torch.manual_seed(5)
        base = unit(x.detach(), mask)
    torch.testing.assert_close(moved[1, :4], base[1, :4])


def test_use_tiles_rule():
    with settings.attention_tiles("off"):
        assert not use_tiles(10**6, torch.device("cpu"), {"cpu": 1})
    with settings.attention_tiles("on"):
        assert use_tiles(2, torch.device("cpu"), {})
    assert use_tiles(512, torch.device("cpu"), {"cpu": 512})
    assert not use_tiles(511, torch.device("cpu"), {"cpu": 512})
    assert not use_tiles(10**6, torch.device("cpu"), {})
    with pytest.raises(ValueError, match="attention_tiles"):
        settings.attention_tiles("always")
