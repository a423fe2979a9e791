"""Common corruptions at CIFAR scale (CIFAR-10-C, Hendrycks & Dietterich 2019), regenerated.

``corrupt(images, name, severity, seed)`` applies one corruption at one severity (1-5) to
``[n, 3, height, width]`` uint8 images and returns uint8 images of the same shape,
deterministically under ``seed``. The per-severity parameters are the CIFAR ones of the
benchmark's CIFAR script (not its ImageNet ones); the implementations are ours, on numpy,
scipy and Pillow, and batched over images. Where the original used OpenCV or ImageMagick we
use the equivalent operation:

* ``defocus_blur``: the anti-aliased disk kernel (a disk blurred by a Gaussian of the alias
  sigma), correlated with edge reflection as OpenCV's ``filter2D`` does;
* ``motion_blur``: ImageMagick's one-sided Gaussian line kernel (radius r, sigma s) along a
  random angle in [-45°, 45°], applied by shifting the image (edge pixels repeated);
* ``brightness``, ``saturate``: HSV through matplotlib's colour conversions;
* ``elastic_transform``: the random affine map and the smoothed displacement field resampled
  with ``scipy.ndimage`` (bilinear, edges reflected).

* ``snow``: the same motion kernel on the flake layer, OpenCV's RGB-to-grey weights;
* ``frost``: the benchmark's frost photographs, read from the data files of the
  ``imagecorruptions`` package (the ``vision`` extra) without importing it.

* ``spatter``: OpenCV's Canny edge detector (3 x 3 Sobel, L1 gradient, non-maximum
  suppression, 8-connected hysteresis), ``equalizeHist`` and the saturating ``filter2D`` are
  written out here (``_canny``, ``_equalize_hist``); the 5 x 5 chamfer distance
  transform is replaced by the exact Euclidean one of ``scipy.ndimage`` (they differ by < 2 %).

>>> import torch
>>> x = torch.full((2, 3, 32, 32), 128, dtype=torch.uint8)
>>> corrupt(x, "gaussian_noise", 3, seed=0).shape
torch.Size([2, 3, 32, 32])
"""

from __future__ import annotations

import io
import math
import zlib

import numpy as np
import torch
from PIL import Image
from scipy import ndimage

__all__ = ["CORRUPTIONS", "CORRUPTION_CATEGORIES", "EXTRA_CORRUPTIONS", "corrupt",
           "corrupted_sets", "parse_corruption_sets"]


def _gaussian(x: np.ndarray, sigma: float) -> np.ndarray:
    """Gaussian blur of ``[n, height, width, channels]`` over height and width (edges repeated,
    as skimage's ``gaussian``)."""
    return ndimage.gaussian_filter(x, sigma=(0, sigma, sigma, 0), mode="nearest", truncate=4.0)


# -- noise --------------------------------------------------------------------------------------

def _gaussian_noise(x, s, rng):
    c = [0.04, 0.06, 0.08, 0.09, 0.10][s - 1]
    return x + rng.normal(scale=c, size=x.shape)


def _shot_noise(x, s, rng):
    c = [500, 250, 100, 75, 50][s - 1]
    return rng.poisson(x * c) / c


def _impulse_noise(x, s, rng):
    """Salt and pepper: a fraction ``c`` of the values set to 0 or 1 (half each)."""
    c = [0.01, 0.02, 0.03, 0.05, 0.07][s - 1]
    out = x.copy()
    hit = rng.random(x.shape) < c
    salt = rng.random(x.shape) < 0.5
    out[hit & salt] = 1.0
    out[hit & ~salt] = 0.0
    return out


def _speckle_noise(x, s, rng):
    c = [0.06, 0.1, 0.12, 0.16, 0.2][s - 1]
    return x + x * rng.normal(scale=c, size=x.shape)


# -- blur ---------------------------------------------------------------------------------------

def _gaussian_blur(x, s, rng):
    return _gaussian(x, [0.4, 0.6, 0.7, 0.8, 1.0][s - 1])


def _glass_blur(x, s, rng):
    """Blur, then swap every pixel with a random neighbour within ``delta`` (bottom-right to
    top-left, ``iterations`` times), then blur again."""
    sigma, delta, iterations = [(0.05, 1, 1), (0.25, 1, 1), (0.4, 1, 1), (0.25, 1, 2),
                                (0.4, 1, 2)][s - 1]
    y = np.floor(np.clip(_gaussian(x, sigma), 0, 1) * 255) / 255      # the uint8 round trip
    n, height, width, _ = y.shape
    rows = np.arange(n)
    for _ in range(iterations):
        for h in range(height - delta, delta, -1):
            for w in range(width - delta, delta, -1):
                d = rng.integers(-delta, delta, size=(n, 2))
                h2, w2 = h + d[:, 1], w + d[:, 0]
                a, b = y[rows, h, w].copy(), y[rows, h2, w2].copy()
                y[rows, h, w], y[rows, h2, w2] = b, a
    return _gaussian(y, sigma)


def _disk(radius: float, alias_blur: float) -> np.ndarray:
    L = np.arange(-8, 9) if radius <= 8 else np.arange(-math.ceil(radius), math.ceil(radius) + 1)
    X, Y = np.meshgrid(L, L)
    k = ((X ** 2 + Y ** 2) <= radius ** 2).astype(np.float64)
    k /= k.sum()
    return ndimage.gaussian_filter(k, alias_blur, mode="constant", truncate=1.0 / max(
        alias_blur, 1e-12)) if alias_blur > 0 else k


def _defocus_blur(x, s, rng):
    radius, alias = [(0.3, 0.4), (0.4, 0.5), (0.5, 0.6), (1, 0.2), (1.5, 0.1)][s - 1]
    k = _disk(radius, alias)
    return ndimage.correlate(x, k[None, :, :, None], mode="mirror")


def _motion_kernel(radius: int, sigma: float, angle: float) -> list[tuple[float, int, int]]:
    """(weight, dy, dx) of a one-sided Gaussian line of ``radius + 1`` taps along ``angle``."""
    taps = []
    for i in range(radius + 1):
        w = math.exp(-(i * i) / (2 * sigma * sigma))
        taps.append((w, round(i * math.sin(math.radians(angle))),
                     round(i * math.cos(math.radians(angle)))))
    total = sum(t[0] for t in taps)
    return [(w / total, dy, dx) for w, dy, dx in taps]


def _shift(img: np.ndarray, dy: int, dx: int) -> np.ndarray:
    """``img [height, width, channels]`` shifted so that out[i, j] = img[i + dy, j + dx] (edges
    repeated)."""
    height, width = img.shape[:2]
    ii = np.clip(np.arange(height) + dy, 0, height - 1)
    jj = np.clip(np.arange(width) + dx, 0, width - 1)
    return img[ii][:, jj]


def _motion_blur(x, s, rng):
    radius, sigma = [(6, 1), (6, 1.5), (6, 2), (8, 2), (9, 2.5)][s - 1]
    out = np.zeros_like(x)
    for i in range(len(x)):
        for w, dy, dx in _motion_kernel(radius, sigma, rng.uniform(-45, 45)):
            out[i] += w * _shift(x[i], dy, dx)
    return out


def _clipped_zoom(img: np.ndarray, factor: float) -> np.ndarray:
    """Zoom the centre of ``img [height, width, channels]`` by ``factor`` (bilinear) back to
    ``height x width``."""
    h = img.shape[0]
    ch = int(np.ceil(h / factor))
    top = (h - ch) // 2
    z = ndimage.zoom(img[top:top + ch, top:top + ch], (factor, factor, 1), order=1)
    trim = (z.shape[0] - h) // 2
    return z[trim:trim + h, trim:trim + h]


def _zoom_blur(x, s, rng):
    top = [1.06, 1.11, 1.16, 1.21, 1.26][s - 1]
    factors = np.arange(1, top, 0.01)
    out = np.zeros_like(x)
    for i in range(len(x)):
        for f in factors:
            out[i] += _clipped_zoom(x[i], f)
    return (x + out) / (len(factors) + 1)


# -- weather ------------------------------------------------------------------------------------

def _plasma(rng, size: int = 32, decay: float = 3.0) -> np.ndarray:
    """A diamond-square height map in [0, 1], ``[size, size]`` (size a power of two)."""
    m = np.zeros((size, size))
    step, wibble = size, 100.0

    def noisy(a):
        return a / 4 + wibble * rng.uniform(-wibble, wibble, a.shape)

    while step >= 2:
        half = step // 2
        corners = m[0:size:step, 0:size:step]
        sq = corners + np.roll(corners, -1, axis=0)
        sq = sq + np.roll(sq, -1, axis=1)
        m[half:size:step, half:size:step] = noisy(sq)
        centres = m[half:size:step, half:size:step]
        corners = m[0:size:step, 0:size:step]
        left = centres + np.roll(centres, 1, axis=0) + corners + np.roll(corners, -1, axis=1)
        m[0:size:step, half:size:step] = noisy(left)
        top = centres + np.roll(centres, 1, axis=1) + corners + np.roll(corners, -1, axis=0)
        m[half:size:step, 0:size:step] = noisy(top)
        step //= 2
        wibble /= decay
    m -= m.min()
    return m / m.max()


def _fog(x, s, rng):
    c, decay = [(0.2, 3), (0.5, 3), (0.75, 2.5), (1, 2), (1.5, 1.75)][s - 1]
    side = x.shape[1]                               # square images
    size = max(256, 1 << (side - 1).bit_length())     # the benchmark crops a 256 x 256 map
    out = np.empty_like(x)
    for i in range(len(x)):
        peak = x[i].max()
        fogged = x[i] + c * _plasma(rng, size, decay)[:side, :side, None]
        out[i] = fogged * peak / (peak + c)
    return out


def _gray(x: np.ndarray) -> np.ndarray:
    """Luma of ``[..., 3]`` RGB (ITU-R 601, as OpenCV's RGB2GRAY), keeping a channel axis."""
    return (x @ np.array([0.299, 0.587, 0.114]))[..., None]


def _snow(x, s, rng):
    """A thresholded, zoomed Gaussian layer of flakes, motion-blurred along an angle in
    [-135°, -45°], added twice (once rotated by 180°) to the image pulled towards its
    brightened grey version."""
    loc, scale, zoom, thresh, radius, sigma, blend = [
        (0.1, 0.2, 1, 0.6, 8, 3, 0.95), (0.1, 0.2, 1, 0.5, 10, 4, 0.9),
        (0.15, 0.3, 1.75, 0.55, 10, 4, 0.9), (0.25, 0.3, 2.25, 0.6, 12, 6, 0.85),
        (0.3, 0.3, 1.25, 0.65, 14, 12, 0.8)][s - 1]
    n, side = x.shape[:2]
    out = np.empty_like(x)
    for i in range(n):
        layer = _clipped_zoom(rng.normal(loc, scale, (side, side, 1)), zoom)
        layer[layer < thresh] = 0
        layer = np.floor(np.clip(layer, 0, 1) * 255) / 255          # the uint8 round trip
        flakes = np.zeros_like(layer)
        for w, dy, dx in _motion_kernel(radius, sigma, rng.uniform(-135, -45)):
            flakes += w * _shift(layer, dy, dx)
        img = blend * x[i] + (1 - blend) * np.maximum(x[i], _gray(x[i]) * 1.5 + 0.5)
        out[i] = img + flakes + np.rot90(flakes, k=2)
    return out


def _frost_images() -> list[np.ndarray]:
    """The benchmark's frost photographs, from the ``imagecorruptions`` package's data (found
    without importing it: its import needs OpenCV), as RGB arrays in [0, 255]."""
    import importlib.util
    from pathlib import Path

    spec = importlib.util.find_spec("imagecorruptions")
    folder = None if spec is None or not spec.submodule_search_locations else \
        Path(list(spec.submodule_search_locations)[0]) / "frost"
    names = ["frost1.png", "frost2.png", "frost3.png", "frost4.jpg", "frost5.jpg"]
    if folder is None or not all((folder / f).is_file() for f in names):
        raise ImportError('frost needs the benchmark\'s frost photographs from the vision '
                          'extra: pip install "gpattn-ppl[vision]" (package imagecorruptions)')
    return [np.asarray(Image.open(folder / f).convert("RGB"), dtype=np.float64) for f in names]


def _frost(x, s, rng):
    """``a x + b F`` with ``F`` a random 32 x 32 crop of one of five frost photographs scaled
    by 0.2 (bilinear), in [0, 255] units."""
    a, b = [(1, 0.2), (1, 0.3), (0.9, 0.4), (0.85, 0.4), (0.75, 0.45)][s - 1]
    photos = []
    for im in _frost_images():
        h, w = im.shape[:2]
        small = Image.fromarray(im.astype(np.uint8)).resize(
            (round(w * 0.2), round(h * 0.2)), Image.Resampling.BILINEAR)
        photos.append(np.asarray(small, dtype=np.float64) / 255)
    n, side = x.shape[:2]
    out = np.empty_like(x)
    for i in range(n):
        f = photos[rng.integers(len(photos))]
        top = rng.integers(0, f.shape[0] - side)
        left = rng.integers(0, f.shape[1] - side)
        out[i] = a * x[i] + b * f[top:top + side, left:left + side]
    return out


def _canny(img: np.ndarray, low: float, high: float) -> np.ndarray:
    """Canny edges of ``img [height, width]`` uint8 as OpenCV computes them by default: 3 x 3
    Sobel gradients (edges repeated), L1 magnitude ``|g_x| + |g_y|``, non-maximum suppression along
    the gradient direction quantised to 0/45/90/135 degrees, then hysteresis: pixels above
    ``low`` kept when 8-connected to one above ``high``. Returns ``[height, width]`` bool."""
    f = img.astype(np.float64)
    gx = ndimage.sobel(f, axis=1, mode="nearest")
    gy = ndimage.sobel(f, axis=0, mode="nearest")
    mag = np.abs(gx) + np.abs(gy)
    pad = np.pad(mag, 1)                                   # outside the image: magnitude 0
    height, width = mag.shape
    def nb(dy, dx):
        return pad[1 + dy:1 + dy + height, 1 + dx:1 + dx + width]
    ax, ay = np.abs(gx), np.abs(gy)
    tan22, tan67 = math.tan(math.radians(22.5)), math.tan(math.radians(67.5))
    horizontal = ay <= ax * tan22                          # gradient along x: compare left/right
    vertical = ay > ax * tan67
    same_sign = gx * gy > 0                                # down-right diagonal
    a = np.where(horizontal, nb(0, -1), np.where(vertical, nb(-1, 0),
                 np.where(same_sign, nb(-1, -1), nb(-1, 1))))
    b = np.where(horizontal, nb(0, 1), np.where(vertical, nb(1, 0),
                 np.where(same_sign, nb(1, 1), nb(1, -1))))
    peak = (mag > low) & (mag > a) & (mag >= b)
    labels, count = ndimage.label(peak, structure=np.ones((3, 3)))
    if count == 0:
        return peak
    strong = np.zeros(count + 1, dtype=bool)
    strong[np.unique(labels[peak & (mag > high)])] = True
    strong[0] = False
    return strong[labels]


def _equalize_hist(img: np.ndarray) -> np.ndarray:
    """OpenCV's ``equalizeHist`` of ``img`` uint8: the lookup table maps the lowest occupied
    level to 0 and level j to round(255 · #(lowest < v <= j) / #(v > lowest)); a constant
    image is returned as it is."""
    hist = np.bincount(img.ravel(), minlength=256)
    lowest = int(np.flatnonzero(hist)[0])
    rest = img.size - hist[lowest]
    if rest == 0:
        return img.copy()
    cum = np.cumsum(hist) - hist[:lowest + 1].sum()
    lut = np.clip(np.round(np.maximum(cum, 0) * 255.0 / rest), 0, 255).astype(np.uint8)
    lut[:lowest + 1] = 0
    return lut[img]


def _spatter(x, s, rng):
    """A thresholded, blurred Gaussian "liquid" layer. Severities 1-3: water, a pale turquoise
    film shaded by the distance to the liquid's edges (Canny, distance transform truncated at
    20, box blur, histogram equalisation, an emboss filter); 4-5: mud, opaque brown where the
    blurred liquid mask exceeds 0.8."""
    loc, scale, sigma, thresh, amount, mud = [
        (0.62, 0.1, 0.7, 0.7, 0.5, 0), (0.65, 0.1, 0.8, 0.7, 0.5, 0),
        (0.65, 0.3, 1, 0.69, 0.5, 0), (0.65, 0.1, 0.7, 0.69, 0.6, 1),
        (0.65, 0.1, 0.5, 0.68, 0.6, 1)][s - 1]
    n, height, width, _ = x.shape
    emboss = np.array([[-2, -1, 0], [-1, 1, 1], [0, 1, 2]], dtype=np.float64)
    water = np.array([175, 238, 238]) / 255.0
    brown = np.array([63, 42, 20]) / 255.0
    out = np.empty_like(x)
    for i in range(n):
        liquid = ndimage.gaussian_filter(rng.normal(loc, scale, (height, width)), sigma,
                                         mode="nearest", truncate=4.0)
        liquid[liquid < thresh] = 0
        if not mud:
            level = (liquid * 255).astype(np.uint8)
            edges = _canny(level, 50, 150)
            dist = (np.full((height, width), 20.0) if not edges.any()
                    else np.minimum(ndimage.distance_transform_edt(~edges), 20))
            dist = ndimage.uniform_filter(dist, 3, mode="mirror").astype(np.uint8)
            dist = _equalize_hist(dist)
            dist = np.clip(np.round(ndimage.correlate(dist.astype(np.float64), emboss,
                                                      mode="mirror")), 0, 255)
            dist = ndimage.uniform_filter(dist, 3, mode="mirror")
            m = level * dist
            peak = m.max()
            m = m / peak * amount if peak > 0 else m
            out[i] = x[i] + m[..., None] * water
        else:
            m = ndimage.gaussian_filter((liquid > thresh).astype(np.float64), amount,
                                        mode="nearest", truncate=4.0)
            m[m < 0.8] = 0
            out[i] = x[i] * (1 - m[..., None]) + brown * m[..., None]
    return out


# -- digital ------------------------------------------------------------------------------------

def _contrast(x, s, rng):
    c = [0.75, 0.5, 0.4, 0.3, 0.15][s - 1]
    means = x.mean(axis=(1, 2), keepdims=True)
    return (x - means) * c + means


def _hsv(x, fn):
    from matplotlib.colors import hsv_to_rgb, rgb_to_hsv

    hsv = rgb_to_hsv(np.clip(x, 0, 1))
    fn(hsv)
    return hsv_to_rgb(hsv)


def _brightness(x, s, rng):
    c = [0.05, 0.1, 0.15, 0.2, 0.3][s - 1]

    def f(hsv):
        hsv[..., 2] = np.clip(hsv[..., 2] + c, 0, 1)
    return _hsv(x, f)


def _saturate(x, s, rng):
    a, b = [(0.3, 0), (0.1, 0), (1.5, 0), (2, 0.1), (2.5, 0.2)][s - 1]

    def f(hsv):
        hsv[..., 1] = np.clip(hsv[..., 1] * a + b, 0, 1)
    return _hsv(x, f)


def _per_image_pil(x, fn):
    u8 = np.clip(np.round(x * 255), 0, 255).astype(np.uint8)
    return np.stack([np.asarray(fn(Image.fromarray(im)), dtype=np.float64) / 255 for im in u8])


def _jpeg_compression(x, s, rng):
    q = [80, 65, 58, 50, 40][s - 1]

    def f(im):
        buf = io.BytesIO()
        im.save(buf, "JPEG", quality=q)
        return Image.open(io.BytesIO(buf.getvalue())).convert("RGB")
    return _per_image_pil(x, f)


def _pixelate(x, s, rng):
    c = [0.95, 0.9, 0.85, 0.75, 0.65][s - 1]
    height, width = x.shape[1:3]
    return _per_image_pil(x, lambda im: im.resize((int(width * c), int(height * c)),
                                                  Image.Resampling.BOX)
                          .resize((width, height), Image.Resampling.BOX))


def _elastic_transform(x, s, rng):
    """A random affine map of three points (scale ``affine``), then a displacement field of
    uniform noise smoothed by a Gaussian (``sigma``) and scaled by ``alpha`` (pixels)."""
    side = x.shape[1]
    alpha, sigma, affine = [(0, 0, 0.08), (0.05, 0.2, 0.07), (0.08, 0.06, 0.06),
                            (0.1, 0.04, 0.05), (0.1, 0.03, 0.03)][s - 1]
    alpha, sigma, affine = alpha * side, sigma * side, affine * side
    centre, half = np.float64(side // 2), side // 3
    src = np.array([[centre + half, centre + half], [centre + half, centre - half],
                    [centre - half, centre - half]])
    yy, xx = np.meshgrid(np.arange(side), np.arange(side), indexing="ij")
    out = np.empty_like(x)
    for i in range(len(x)):
        dst = src + rng.uniform(-affine, affine, size=src.shape)
        # the affine map dst -> src (points are (x, y)): solve A [x y 1]^T = src
        P = np.hstack([dst, np.ones((3, 1))])
        A = np.linalg.solve(P, src).T                                  # [2, 3]
        img = np.empty_like(x[i])
        for ch in range(x.shape[3]):
            # output (row, col) samples the input at the map of (col, row)
            cx = A[0, 0] * xx + A[0, 1] * yy + A[0, 2]
            cy = A[1, 0] * xx + A[1, 1] * yy + A[1, 2]
            img[..., ch] = ndimage.map_coordinates(x[i, ..., ch], [cy, cx], order=1,
                                                   mode="mirror")
        dx = ndimage.gaussian_filter(rng.uniform(-1, 1, (side, side)), sigma,
                                     mode="reflect") * alpha \
            if sigma > 0 else np.zeros((side, side))
        dy = ndimage.gaussian_filter(rng.uniform(-1, 1, (side, side)), sigma,
                                     mode="reflect") * alpha \
            if sigma > 0 else np.zeros((side, side))
        for ch in range(x.shape[3]):
            out[i, ..., ch] = ndimage.map_coordinates(img[..., ch], [yy + dy, xx + dx], order=1,
                                                      mode="reflect")
    return out


#: the benchmark's 15 corruptions by category (CGPT's category means), those implemented here
CORRUPTION_CATEGORIES: dict[str, tuple[str, ...]] = {
    "noise": ("gaussian_noise", "shot_noise", "impulse_noise"),
    "blur": ("defocus_blur", "glass_blur", "motion_blur", "zoom_blur"),
    "weather": ("snow", "frost", "fog", "brightness"),
    "digital": ("contrast", "elastic_transform", "pixelate", "jpeg_compression"),
}
#: the benchmark's 4 extra (held-out) corruptions
EXTRA_CORRUPTIONS = ("speckle_noise", "gaussian_blur", "spatter", "saturate")

#: name -> ``fn(x [n, height, width, 3] float in [0, 1], severity, rng) -> same shape``
#: (unclipped)
CORRUPTIONS = {name: globals()[f"_{name}"] for name in
               [n for names in CORRUPTION_CATEGORIES.values() for n in names]
               + list(EXTRA_CORRUPTIONS)}


def corrupt(images: torch.Tensor, name: str, severity: int, seed: int = 0) -> torch.Tensor:
    """``images [n, 3, height, width]`` uint8 with corruption ``name`` at ``severity`` (1-5),
    uint8.

    Deterministic under ``seed`` (the random stream is seeded by ``seed``, the corruption and
    the severity).

    :raises ValueError: an unknown name, a severity outside 1-5, or not
        ``[n, 3, height, width]`` uint8.
    """
    if name not in CORRUPTIONS:
        raise ValueError(f"unknown corruption {name!r}; allowed: {', '.join(sorted(CORRUPTIONS))}")
    if isinstance(severity, bool) or severity not in (1, 2, 3, 4, 5):
        raise ValueError(f"severity must be 1, 2, 3, 4 or 5, got {severity!r}")
    if images.dtype != torch.uint8 or images.dim() != 4 or images.shape[1] != 3:
        raise ValueError(f"expected images [n, 3, height, width] uint8, got {images.dtype} "
                         f"{tuple(images.shape)}")
    rng = np.random.default_rng([int(seed), zlib.crc32(name.encode()), int(severity)])
    x = images.permute(0, 2, 3, 1).numpy().astype(np.float64) / 255.0
    y = CORRUPTIONS[name](x, severity, rng)
    out = np.clip(np.round(np.clip(y, 0, 1) * 255), 0, 255).astype(np.uint8)
    return torch.from_numpy(np.ascontiguousarray(out.transpose(0, 3, 1, 2)))


#: format version of the cached corrupted sets (bump when a corruption changes)
_CACHE_VERSION = 1


def parse_corruption_sets(spec) -> list[tuple[str, int]]:
    """``(name, severity)`` pairs from a ``data.corruptions`` value: ``"all"`` (every implemented
    corruption at every severity), ``"severity5"`` (every one at 5), or a list of
    ``"<name>:<severity>"`` / ``"<name>"`` (all five severities) strings.

    :raises ValueError: an unknown name or severity, or another kind of value.
    """
    names = [n for names in CORRUPTION_CATEGORIES.values() for n in names] + \
        list(EXTRA_CORRUPTIONS)
    if spec == "all":
        return [(n, s) for n in names for s in range(1, 6)]
    if spec == "severity5":
        return [(n, 5) for n in names]
    if isinstance(spec, str) or not isinstance(spec, (list, tuple)):
        raise ValueError(f"data.corruptions: expected 'all', 'severity5' or a list of "
                         f"'<name>:<severity>', got {spec!r}")
    out = []
    for item in spec:
        name, _, sev = str(item).partition(":")
        if name not in CORRUPTIONS:
            raise ValueError(f"data.corruptions: unknown corruption {name!r}; allowed: "
                             f"{', '.join(sorted(CORRUPTIONS))}")
        if sev and sev not in ("1", "2", "3", "4", "5"):
            raise ValueError(f"data.corruptions: severity {sev!r} of {item!r} is not 1-5")
        out += [(name, int(sev))] if sev else [(name, s) for s in range(1, 6)]
    return out


def corrupted_sets(images: torch.Tensor, labels: torch.Tensor, pairs, *, seed: int = 0,
                   cache_dir=None) -> dict[str, tuple[torch.Tensor, torch.Tensor]]:
    """``"cifar10c:<name>:<severity>" -> (corrupted images, labels)`` for ``pairs``.

    Each set is cached as ``.npy`` under ``cache_dir`` (keyed by a hash of the clean images,
    the corruption, the severity, the seed and the cache version; written atomically), so it
    is generated once per machine.
    """
    import hashlib
    from pathlib import Path

    digest = hashlib.sha256(images.numpy().tobytes()).hexdigest()[:16]
    out = {}
    for name, sev in pairs:
        key = f"cifar10c:{name}:{sev}"
        path = None
        if cache_dir is not None:
            path = Path(cache_dir) / f"c10c_v{_CACHE_VERSION}_{digest}_{name}_{sev}_s{seed}.npy"
            if path.is_file():
                out[key] = (torch.from_numpy(np.load(path)), labels)
                continue
        x = corrupt(images, name, sev, seed=seed)
        if path is not None:
            from ..safe_files import write_atomic

            buf = io.BytesIO()
            np.save(buf, x.numpy())
            write_atomic(path, buf.getvalue())  # atomic, never through a link
        out[key] = (x, labels)
    return out
