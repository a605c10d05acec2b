"""The public noise of a differentially private release, as the heads' criteria read it.

A release post-processed with its noise levels is a :class:`~ghofl.stats.release.NoisyStats`
(σ_A on the class sums, σ_B on the pooled scatter B, σ_S on each class scatter S_c; σ on the
diagonal of a symmetric block, σ/√2 off it). The functions here turn those levels into the
noise variance of what a criterion reads: :func:`release_noise` for the pooled within-class
covariance and the class means (the LDA's shrinkage), :func:`total_release_noise` for the
total covariance and the class-target cross-covariance (the ridge head's regularisation).
Other statistics give None, and the criteria are then those of exact statistics.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from numpy.typing import NDArray

from ghofl.stats.release import NoisyStats

F64 = NDArray[np.float64]

__all__ = ["NOISE_TAG", "ReleaseNoise", "noise_tag", "release_noise", "total_release_noise"]

#: Appended to the name of a data-driven choice that weighed the release noise
#: (``"analytic-error+dp-noise"``, ``"gcv+dp-noise"``).
NOISE_TAG = "+dp-noise"


@dataclass(frozen=True)
class ReleaseNoise:
    """The public noise of a differentially private release, as a criterion sees it.

    Attributes
    ----------
    entry_var : float
        ν²: variance of the release noise on each diagonal entry of the covariance the
        criterion reads (ν²/2 off the diagonal, a symmetric Gaussian matrix).
    mean_var : ndarray, shape (C,)
        Variance of the release noise on each coordinate of the per-class vector the
        criterion reads: the fitted class mean μ̂_c (:func:`release_noise`), or column c of
        the cross-covariance G/(N − 1) (:func:`total_release_noise`).
    """

    entry_var: float
    mean_var: F64


def noise_tag(stats: object) -> str:
    """:data:`NOISE_TAG` when ``stats`` carry release noise levels the criteria read, else ""."""
    return NOISE_TAG if _levels(stats) else ""


def _levels(stats: object) -> dict[str, float]:
    if isinstance(stats, NoisyStats) and any(v > 0.0 for v in stats.noise_sigma.values()):
        return dict(stats.noise_sigma)
    return {}


def release_noise(stats: object, counts: NDArray[np.int64], means: F64) -> ReleaseNoise | None:
    """The :class:`ReleaseNoise` of the pooled (N − C) covariance of a private release.

    ``stats`` is the statistics the moments were computed from. In ``full`` mode the
    within-class scatter W̃ = Σ_c S̃_c − Ã_c Ã_cᵀ/N_c carries C·σ_S² on each diagonal entry,
    plus the centring's 4σ_A²‖μ_c‖²/d per class on average; P = W̃/(N − C). In ``pooled`` and
    ``gram`` mode the post-processing has already replaced the eigenvalues of P by estimates
    of the noiseless variances along its eigenvectors (:func:`ghofl.privacy.postprocess.
    denoise_covariance`), which is what the criterion's variance terms read: its entry
    variance is 0 (counting the noise again over-shrinks, BENCHMARKS.md "dp_anchors").
    μ̂_c = Ã_c/N_c carries σ_A²/N_c² in every mode.

    Parameters
    ----------
    stats : object
    counts : ndarray of int, shape (C,)
    means : ndarray, shape (C, d)
    """
    sigma = _levels(stats)
    if not sigma:
        return None
    keep = counts > 0
    cnt = np.maximum(counts.astype(np.float64), 1.0)
    var_a = float(sigma.get("sums", 0.0)) ** 2
    if getattr(stats, "mode", None) != "full":  # W denoised by the post-processing (P3n)
        return ReleaseNoise(0.0, var_a / cnt**2)
    dof = max(float(np.sum(cnt[keep])) - float(np.sum(keep)), 1.0)
    var_w = float(np.sum(keep)) * float(sigma.get("class_scatter", 0.0)) ** 2
    var_w += 4.0 * var_a * float(np.sum(means[keep] ** 2)) / means.shape[1]
    return ReleaseNoise(var_w / dof**2, var_a / cnt**2)


def total_release_noise(stats: object, counts: NDArray[np.int64],
                        global_mean: F64) -> ReleaseNoise | None:
    """The :class:`ReleaseNoise` of the total (N − 1) covariance and the cross-covariance.

    Σ_tot = (B̃ − ã ãᵀ/N)/(N − 1), ã = Σ_c Ã_c: in ``full`` mode B̃ carries C·σ_S² on each
    diagonal entry (:meth:`NoisyStats.total_scatter_sigma`), the centring 4·C·σ_A²‖m‖²/d on
    average (m the global mean); in ``pooled`` and ``gram`` mode the post-processing denoised
    the within-class part of B (:func:`ghofl.privacy.postprocess.denoise_covariance`), so the
    entry variance is 0, as in :func:`release_noise`. Column c of G/(N − 1),
    (Ã_c − N_c m̃)/(N − 1), carries σ_A²·(1 − 2π_c + C·π_c²)/(N − 1)² on each coordinate
    (the noise of the counts, rounded integers, is left out).

    Parameters
    ----------
    stats : object
    counts : ndarray of int, shape (C,)
    global_mean : ndarray, shape (d,)
    """
    sigma = _levels(stats)
    if not sigma or not isinstance(stats, NoisyStats):
        return None
    n = float(np.sum(counts))
    c = counts.shape[0]
    scale = max(n - 1.0, 1.0) ** 2
    var_a = float(sigma.get("sums", 0.0)) ** 2
    pi = counts.astype(np.float64) / max(n, 1.0)
    mean_var = var_a * (1.0 - 2.0 * pi + c * pi**2) / scale
    if stats.mode != "full":  # W denoised by the post-processing (P3n)
        return ReleaseNoise(0.0, mean_var)
    var_b = stats.total_scatter_sigma() ** 2
    var_b += 4.0 * c * var_a * float(global_mean @ global_mean) / global_mean.shape[0]
    return ReleaseNoise(var_b / scale, mean_var)
