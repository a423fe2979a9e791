"""Image OOD sets that need no download, at CIFAR scale (``[n, 3, 32, 32]`` uint8, unlabelled).

====================  ==========================================================================
name                  what and where from (provenance)
====================  ==========================================================================
``digits``            far OOD: the 1,797 8x8 handwritten digits bundled with scikit-learn
                      (``sklearn.datasets.load_digits``: UCI ML hand-written digits, 16 grey
                      levels), scaled to 0-255, upsampled bicubically to 32x32 (Pillow), grey
                      copied to the three channels
``photo_patches``     texture / natural patches: seeded square crops (side 32-128 pixels) of the
                      two photographs bundled with scikit-learn (``load_sample_images``:
                      ``china.jpg`` and ``flower.jpg``, 427x640, CC-BY), resized to 32x32
``gaussian_noise``    iid pixels :math:`\\mathcal N(128, 64^2)`, rounded and clipped to 0-255,
                      seeded
``uniform_noise``     iid pixels uniform on 0-255, seeded
====================  ==========================================================================

Every set is deterministic under its seed. Labels are ``-1`` (unlabelled): the OOD report
scores detection only.
"""

from __future__ import annotations

import numpy as np
import torch
from PIL import Image

__all__ = ["VISION_OOD", "digit_images", "noise_images", "photo_patches", "vision_ood_sets"]

#: name -> default number of images (digits: all of them)
VISION_OOD: dict[str, int | None] = {"digits": None, "photo_patches": 2000,
                                     "gaussian_noise": 2000, "uniform_noise": 2000}


def _resize(img: np.ndarray, size: int) -> np.ndarray:
    return np.asarray(Image.fromarray(img).resize((size, size), Image.Resampling.BICUBIC))


def digit_images(size: int = 32) -> torch.Tensor:
    """scikit-learn's 1,797 digits as ``[1797, 3, size, size]`` uint8 (see the module table)."""
    from sklearn.datasets import load_digits

    grey = np.round(load_digits().images * (255.0 / 16.0)).astype(np.uint8)     # [n, 8, 8]
    up = np.stack([_resize(im, size) for im in grey])                          # [n, S, S]
    return torch.from_numpy(np.repeat(up[:, None], 3, axis=1).copy())


def photo_patches(n: int = 2000, size: int = 32, seed: int = 0) -> torch.Tensor:
    """``n`` seeded square crops (side ``size`` to ``4 size``) of scikit-learn's two sample
    photographs, resized to ``[n, 3, size, size]`` uint8."""
    from sklearn.datasets import load_sample_images

    photos = load_sample_images().images
    g = np.random.default_rng(seed)
    out = np.empty((n, size, size, 3), dtype=np.uint8)
    for i in range(n):
        img = photos[g.integers(len(photos))]
        side = int(g.integers(size, 4 * size + 1))
        top = int(g.integers(0, img.shape[0] - side + 1))
        left = int(g.integers(0, img.shape[1] - side + 1))
        out[i] = _resize(np.ascontiguousarray(img[top:top + side, left:left + side]), size)
    return torch.from_numpy(out.transpose(0, 3, 1, 2).copy())


def noise_images(kind: str, n: int = 2000, size: int = 32, seed: int = 0) -> torch.Tensor:
    """``n`` iid noise images ``[n, 3, size, size]`` uint8: ``"gaussian"`` (mean 128, sd 64,
    clipped) or ``"uniform"`` (0-255)."""
    g = torch.Generator().manual_seed(seed)
    shape = (n, 3, size, size)
    if kind == "gaussian":
        return (torch.randn(shape, generator=g) * 64 + 128).round().clamp(0, 255).to(torch.uint8)
    if kind == "uniform":
        return torch.randint(0, 256, shape, generator=g, dtype=torch.uint8)
    raise ValueError(f"unknown noise kind {kind!r}; allowed: gaussian, uniform")


def vision_ood_sets(names=None, *, size: int = 32, seed: int = 0
                    ) -> dict[str, tuple[torch.Tensor, torch.Tensor]]:
    """The sets ``names`` (default: all of :data:`VISION_OOD`) as ``name -> (x, y)``, ``x``
    ``[n, 3, size, size]`` uint8 and ``y`` all ``-1``.

    :raises ValueError: an unknown name (listing the allowed ones).
    """
    names = list(VISION_OOD) if names is None else list(names)
    unknown = [n for n in names if n not in VISION_OOD]
    if unknown:
        raise ValueError(f"unknown image OOD set {unknown[0]!r}; allowed: {', '.join(VISION_OOD)}")
    out = {}
    for name in names:
        n = VISION_OOD[name]
        if name == "digits":
            x = digit_images(size)
        elif name == "photo_patches":
            x = photo_patches(n, size, seed)
        else:
            x = noise_images(name.split("_")[0], n, size, seed)
        out[name] = (x, torch.full((len(x),), -1, dtype=torch.long))
    return out
