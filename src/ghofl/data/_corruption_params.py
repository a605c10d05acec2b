"""Severity tables of the 19 CIFAR-10-C corruptions (numbers only).

The strengths are those of the CIFAR-10-C release of Hendrycks & Dietterich, "Benchmarking
Neural Network Robustness to Common Corruptions and Perturbations" (ICLR 2019), which are much
milder than the ImageNet-C strengths used by most packages (e.g. ``corrupt-tta``). Each entry
lists the parameters of severities 1..5 in order; the meaning of every field is given next to
it and used by :mod:`ghofl.data.corruptions`. Geometric sizes are in pixels of a 32x32 image.
"""

from __future__ import annotations

from typing import Any

#: The 15 benchmark corruptions, in the order of the CIFAR-10-C release.
BENCHMARK_CORRUPTIONS: tuple[str, ...] = (
    "gaussian_noise",
    "shot_noise",
    "impulse_noise",
    "defocus_blur",
    "glass_blur",
    "motion_blur",
    "zoom_blur",
    "snow",
    "frost",
    "fog",
    "brightness",
    "contrast",
    "elastic_transform",
    "pixelate",
    "jpeg_compression",
)
#: The 4 extra (held-out) corruptions of the release.
EXTRA_CORRUPTIONS: tuple[str, ...] = ("speckle_noise", "gaussian_blur", "spatter", "saturate")
ALL_CORRUPTIONS: tuple[str, ...] = BENCHMARK_CORRUPTIONS + EXTRA_CORRUPTIONS

_IM = 32.0  # elastic strengths are fractions of this image size

CIFAR10C_PARAMS: dict[str, tuple[Any, ...]] = {
    # standard deviation of additive Gaussian noise on [0, 1] values
    "gaussian_noise": (0.04, 0.06, 0.08, 0.09, 0.10),
    # photon count scale: out = Poisson(x * c) / c
    "shot_noise": (500, 250, 100, 75, 50),
    # fraction of array entries replaced by salt (1) or pepper (0), half each
    "impulse_noise": (0.01, 0.02, 0.03, 0.05, 0.07),
    # standard deviation of multiplicative Gaussian noise: out = x + x * N(0, c)
    "speckle_noise": (0.06, 0.10, 0.12, 0.16, 0.20),
    # sigma (pixels) of a Gaussian blur
    "gaussian_blur": (0.4, 0.6, 0.7, 0.8, 1.0),
    # (blur sigma, largest pixel displacement, shuffle passes)
    "glass_blur": ((0.05, 1, 1), (0.25, 1, 1), (0.4, 1, 1), (0.25, 1, 2), (0.4, 1, 2)),
    # (disk radius, sigma of the Gaussian that anti-aliases the disk)
    "defocus_blur": ((0.3, 0.4), (0.4, 0.5), (0.5, 0.6), (1.0, 0.2), (1.5, 0.1)),
    # (kernel radius, Gaussian sigma) of a one-sided motion blur at a random angle
    "motion_blur": ((6, 1.0), (6, 1.5), (6, 2.0), (8, 2.0), (9, 2.5)),
    # zoom factors averaged with the image: arange(1, stop, 0.01)
    "zoom_blur": (1.06, 1.11, 1.16, 1.21, 1.26),
    # (snow mean, snow std, snow zoom, threshold, blur radius, blur sigma, image weight)
    "snow": (
        (0.10, 0.2, 1.00, 0.60, 8, 3, 0.95),
        (0.10, 0.2, 1.00, 0.50, 10, 4, 0.90),
        (0.15, 0.3, 1.75, 0.55, 10, 4, 0.90),
        (0.25, 0.3, 2.25, 0.60, 12, 6, 0.85),
        (0.30, 0.3, 1.25, 0.65, 14, 12, 0.80),
    ),
    # (image weight, frost texture weight)
    "frost": ((1.0, 0.2), (1.0, 0.3), (0.9, 0.4), (0.85, 0.4), (0.75, 0.45)),
    # (fog strength, wibble decay of the plasma fractal)
    "fog": ((0.2, 3.0), (0.5, 3.0), (0.75, 2.5), (1.0, 2.0), (1.5, 1.75)),
    # (liquid mean, liquid std, liquid blur sigma, threshold, intensity or mud blur, mud?)
    "spatter": (
        (0.62, 0.1, 0.7, 0.70, 0.5, 0),
        (0.65, 0.1, 0.8, 0.70, 0.5, 0),
        (0.65, 0.3, 1.0, 0.69, 0.5, 0),
        (0.65, 0.1, 0.7, 0.69, 0.6, 1),
        (0.65, 0.1, 0.5, 0.68, 0.6, 1),
    ),
    # factor applied to deviations from the per-channel mean
    "contrast": (0.75, 0.5, 0.4, 0.3, 0.15),
    # amount added to the HSV value channel
    "brightness": (0.05, 0.1, 0.15, 0.2, 0.3),
    # (factor, offset) applied to the HSV saturation channel
    "saturate": ((0.3, 0.0), (0.1, 0.0), (1.5, 0.0), (2.0, 0.1), (2.5, 0.2)),
    # JPEG quality
    "jpeg_compression": (80, 65, 58, 50, 40),
    # side of the intermediate image as a fraction of the original (box filter down and up)
    "pixelate": (0.95, 0.9, 0.85, 0.75, 0.65),
    # (displacement amplitude, displacement smoothing sigma, affine jitter), in pixels
    "elastic_transform": (
        (_IM * 0.0, _IM * 0.0, _IM * 0.08),
        (_IM * 0.05, _IM * 0.2, _IM * 0.07),
        (_IM * 0.08, _IM * 0.06, _IM * 0.06),
        (_IM * 0.1, _IM * 0.04, _IM * 0.05),
        (_IM * 0.1, _IM * 0.03, _IM * 0.03),
    ),
}
