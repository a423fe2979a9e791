"""CIFAR-scale common corruptions: determinism, effect, shapes, severity ordering, errors."""

import importlib.util

import numpy as np
import pytest
import torch
from scipy import ndimage

from gpattn_ppl.data.corruptions import (
    CORRUPTION_CATEGORIES,
    CORRUPTIONS,
    EXTRA_CORRUPTIONS,
    _canny,
    _equalize_hist,
    corrupt,
)
from gpattn_ppl.data.corruptions import _frost_images as _real_frost_images

#: frost reads the benchmark's photographs from the imagecorruptions package (vision extra)
HAVE_FROST = importlib.util.find_spec("imagecorruptions") is not None


@pytest.fixture(autouse=True)
def frost_photographs(monkeypatch):
    """Without the vision extra, frost runs on five seeded stand-in photographs (bright
    structured textures of the real ones' size order), so its cropping, blending and seeding
    are tested everywhere; with the extra, on the benchmark's photographs."""
    if HAVE_FROST:
        return
    from gpattn_ppl.data import corruptions

    g = np.random.default_rng(7)
    fake = [ndimage.gaussian_filter(g.uniform(100, 255, (400, 600, 3)), (3, 3, 0))
            for _ in range(5)]
    monkeypatch.setattr(corruptions, "_frost_images", lambda: fake)

#: corruptions whose benchmark parameters do not grow the pixel distance with the severity:
#: glass blur mixes sigma and iterations, elastic trades the affine part for the displacement,
#: saturate first desaturates (severities 1-2) then oversaturates (3-5), frost scales the
#: image down (0.9, 0.85, 0.75) while the frost weight stays at 0.4 from severity 3 on,
#: spatter switches from a water film (severities 1-3) to sparser opaque mud (4-5)
NOT_MONOTONE = {"glass_blur", "elastic_transform", "saturate", "frost", "spatter"}


@pytest.fixture(scope="module")
def images():
    """8 smooth random colour images with edges (natural-image-like), [8, 3, 32, 32] uint8."""
    g = np.random.default_rng(0)
    x = ndimage.gaussian_filter(g.uniform(0, 255, (8, 32, 32, 3)), (0, 2, 2, 0))
    x[:, 10:20, 5:25] += 60                                            # a bright rectangle
    x = np.clip((x - x.mean()) * 3 + 128, 0, 255).astype(np.uint8)
    return torch.from_numpy(x.transpose(0, 3, 1, 2).copy())


@pytest.mark.parametrize("name", sorted(CORRUPTIONS))
def test_deterministic_changes_the_image_and_keeps_shape(images, name):
    a = corrupt(images, name, 3, seed=1)
    assert a.dtype == torch.uint8 and a.shape == images.shape
    assert torch.equal(a, corrupt(images, name, 3, seed=1))
    assert not torch.equal(a, images)
    d = (a.float() - images.float()).abs().mean()
    assert d > 0.5, (name, float(d))


@pytest.mark.parametrize("name", sorted(set(CORRUPTIONS) - NOT_MONOTONE))
def test_severity_increases_the_distance(images, name):
    dist = [float((corrupt(images, name, s, seed=0).float() - images.float()).abs().mean())
            for s in range(1, 6)]
    assert all(b >= a - 0.05 * a for a, b in zip(dist, dist[1:])), (name, dist)
    assert dist[-1] > dist[0], (name, dist)


def test_random_corruptions_depend_on_the_seed(images):
    for name in ("gaussian_noise", "impulse_noise", "glass_blur", "motion_blur", "fog",
                 "elastic_transform", "snow"):
        assert not torch.equal(corrupt(images, name, 4, seed=0), corrupt(images, name, 4, seed=1))


def test_known_values():
    flat = torch.full((4, 3, 32, 32), 100, dtype=torch.uint8)
    # contrast keeps the per-image mean; brightness raises V by c (0.3 at severity 5)
    assert torch.equal(corrupt(flat, "contrast", 5), flat)
    v = corrupt(flat, "brightness", 5).float().max() / 255
    assert abs(float(v) - (100 / 255 + 0.3)) < 1 / 255
    # Gaussian noise of sd 0.10 at severity 5, in [0, 1] units
    sd = (corrupt(flat, "gaussian_noise", 5).float() / 255).std()
    assert abs(float(sd) - 0.10) < 0.005
    # impulse noise: a fraction 0.07 of the values at 0 or 255
    x = corrupt(flat, "impulse_noise", 5)
    frac = float(((x == 0) | (x == 255)).float().mean())
    assert abs(frac - 0.07) < 0.01
    # blurs keep a flat image flat
    for name in ("gaussian_blur", "defocus_blur", "zoom_blur", "motion_blur"):
        assert torch.equal(corrupt(flat, name, 3), flat), name


def test_frost_without_the_extra_names_it(images, monkeypatch):
    from gpattn_ppl.data import corruptions

    monkeypatch.setattr(corruptions, "_frost_images", _real_frost_images)
    monkeypatch.setattr(importlib.util, "find_spec", lambda name: None)
    with pytest.raises(ImportError, match=r"gpattn-ppl\[vision\]"):
        corrupt(images, "frost", 1)


def test_categories_and_errors(images):
    assert sum(len(v) for v in CORRUPTION_CATEGORIES.values()) == 15
    with pytest.raises(ValueError, match="unknown corruption 'rain'; allowed"):
        corrupt(images, "rain", 1)
    with pytest.raises(ValueError, match="severity must be"):
        corrupt(images, "fog", 6)
    with pytest.raises(ValueError, match=r"expected images \[n, 3, height, width\] uint8"):
        corrupt(images.float(), "fog", 1)


def test_all_nineteen_corruptions():
    assert len(CORRUPTIONS) == 19 and len(EXTRA_CORRUPTIONS) == 4
    assert set(CORRUPTIONS) == {n for v in CORRUPTION_CATEGORIES.values() for n in v} | set(
        EXTRA_CORRUPTIONS)


def test_canny_finds_the_border_of_a_square_only():
    img = np.zeros((16, 16), dtype=np.uint8)
    img[4:12, 4:12] = 200
    edges = _canny(img, 50, 150)
    # one-pixel-wide closed contour on the step (on one side of it, as OpenCV's tie rule)
    inner, outer = np.zeros_like(edges), np.zeros_like(edges)
    inner[4:12, 4:12], outer[3:13, 3:13] = True, True
    assert edges.any() and not (edges & ~outer).any()           # nothing away from the step
    assert not edges[6:10, 6:10].any()                          # nothing inside the flat square
    ring = outer & ~np.pad(np.ones((6, 6), bool), 5)            # the 2-pixel band of the step
    assert (edges <= ring).all()
    # a weak step (below the low threshold after Sobel) gives no edge; a flat image neither
    faint = np.zeros((16, 16), dtype=np.uint8)
    faint[4:12, 4:12] = 10
    assert not _canny(faint, 50, 150).any() and not _canny(np.zeros((8, 8), np.uint8), 50,
                                                           150).any()
    # hysteresis: a weak edge survives only when connected to a strong one
    ramp = np.zeros((16, 16), dtype=np.uint8)
    ramp[:, 8:] = 20                                            # Sobel magnitude 80: weak only
    assert not _canny(ramp, 50, 150).any()
    ramp[2:6, 8:] = 60                                          # a strong stretch (240) joined
    assert _canny(ramp, 50, 150)[:, 7:9].any(axis=1).sum() >= 10


def test_equalize_hist_as_opencv():
    img = np.array([[0, 0, 10, 10], [20, 20, 20, 30]], dtype=np.uint8)
    # lowest level -> 0, then round(255 * count(lowest < v <= j) / count(v > lowest)), rounding
    # half to even as OpenCV's saturate_cast (lrint)
    expect = np.array([[0, 0, 85, 85], [212, 212, 212, 255]], dtype=np.uint8)   # 212.5: half to even
    assert np.array_equal(_equalize_hist(img), expect)
    const = np.full((3, 3), 7, dtype=np.uint8)
    assert np.array_equal(_equalize_hist(const), const)


def test_spatter_water_then_mud():
    clean = torch.full((16, 3, 32, 32), 60, dtype=torch.uint8)
    water = corrupt(clean, "spatter", 2, seed=0).float() - clean.float()
    mud = corrupt(clean, "spatter", 5, seed=0).float()
    # water only brightens, towards pale turquoise (green and blue at least as much as red)
    assert (water >= 0).all() and water.sum() > 0
    changed = water.sum(dim=1) > 0
    assert (water[:, 1][changed] >= water[:, 0][changed] - 1).all()
    # mud replaces pixels by (a blend towards) brown (63, 42, 20): red >= green >= blue
    hit = (mud != 60).any(dim=1)
    assert hit.any()
    r, g, b = mud[:, 0][hit], mud[:, 1][hit], mud[:, 2][hit]
    assert (r >= g - 1).all() and (g >= b - 1).all()
