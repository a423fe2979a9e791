"""Image OOD sets that need no download: shapes, determinism, content, registration."""

import pytest
import torch

from gpattn_ppl.data import VISION_OOD, digit_images, noise_images, photo_patches, vision_ood_sets


def test_sets_have_cifar_shape_and_are_unlabelled():
    sets = vision_ood_sets()
    assert list(sets) == list(VISION_OOD)
    for name, (x, y) in sets.items():
        assert x.dtype == torch.uint8 and x.shape[1:] == (3, 32, 32), name
        assert (y == -1).all() and len(y) == len(x)
    assert len(sets["digits"][0]) == 1797
    assert len(sets["photo_patches"][0]) == 2000


def test_deterministic_under_the_seed_and_different_across_seeds():
    torch.testing.assert_close(photo_patches(50, seed=3), photo_patches(50, seed=3))
    assert not torch.equal(photo_patches(50, seed=3), photo_patches(50, seed=4))
    torch.testing.assert_close(noise_images("gaussian", 20, seed=1),
                               noise_images("gaussian", 20, seed=1))
    assert not torch.equal(noise_images("uniform", 20, seed=1), noise_images("uniform", 20, seed=2))


def test_content():
    d = digit_images()
    assert torch.equal(d[:, 0], d[:, 1]) and torch.equal(d[:, 1], d[:, 2])   # grey
    assert d.float().mean() < 100 and d.max() > 200                            # dark background
    g = noise_images("gaussian", 200).float()
    assert abs(g.mean().item() - 128) < 2 and 55 < g.std().item() < 66         # clipped N(128, 64²)
    u = noise_images("uniform", 200).float()
    assert abs(u.mean().item() - 127.5) < 2 and u.min() == 0 and u.max() == 255
    p = photo_patches(100).float()
    assert p.std((2, 3)).mean() > 5                                            # not flat
    assert digit_images(16).shape[-1] == 16


def test_errors():
    with pytest.raises(ValueError, match="unknown image OOD set 'svhn'; allowed: digits"):
        vision_ood_sets(["svhn"])
    with pytest.raises(ValueError, match="unknown noise kind"):
        noise_images("pink", 3)
