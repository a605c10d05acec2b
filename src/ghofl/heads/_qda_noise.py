"""The release noise in QDA's shrinkage choice on a differentially private release (issue 41).

The class second moments S̃_c of a private ``full`` release carry symmetric Gaussian noise
(σ_S on the diagonal, σ_S/√2 off it), and the class sums that centre them σ_A
(:class:`~ghofl.stats.release.NoisyStats`). On Σ̂_c = (S̃_c − Ã_cÃ_cᵀ/N_c)/(N_c − 1) that is
a symmetric noise F_c with entry variance, to first order,

    ν_c² = (σ_S² + 4σ_A²‖μ̂_c‖²/d) / (N_c − 1)²       (ν_c²/2 off the diagonal);

the noise of the counts (rounded integers) is left out. The evidence rule reads Σ̂_c whitened
by the target's centre B, W_c = L⁻¹Σ̂_cL⁻ᵀ (B = LLᵀ), where F_c becomes L⁻¹F_cL⁻ᵀ, a
Wigner-like bulk of squared Frobenius norm, in expectation,

    E_c = ν_c²/2 · (tr X² + tr² X),   X = B⁻¹ (on the support of the data; I for the
                                      identity targets),

whose spectrum spreads by about 2ν_c√(tr X²) around the signal's. The shrinkage toward t_c·I
(t_c·B before whitening) whose estimation error is the noise alone is the noise's share of the
spread around the target (Ledoit–Wolf with the noise as the error), pooled over the classes as
the evidence pools its coefficient::

    a_noise = min(1, Σ_c ρ_c E_c / Σ_c ‖W_c − t_c I‖²_F),

and QDA takes max(a_evidence, a_noise): the evidence still weighs the sampling error, and the
noise can only raise the shrinkage (a_noise → 0 as σ → 0).

Not twice for the same noise: the post-processing (P2n, :func:`ghofl.privacy.postprocess.
noise_aware_covariances`) already shrank each released Σ̃_c toward its rescaled pooled
covariance T_c by a_p, which leaves (1 − a_p)·F_c in Σ̂_c, so only the residual
ρ_c = (1 − a_p)² of the noise counts above. The release records its a_p
(:attr:`~ghofl.stats.release.NoisyStats.noise_shrinkage`, :func:`postprocess_intensities`).
Releases that do not (files written before the record) recover it: P2n's intensity was the
Ledoit–Wolf a_p = err_c/‖Σ̃_c − T_c‖²_F, err_c = d(d+1)/2·(σ_S/(N_c − 1))² + (‖Σ̃_c‖²_F +
tr² Σ̃_c)/(N_c − 1), with T_c = max(tr Σ̃_c, dν_c)/tr P̂·P̂, P̂ the pooled covariance with its
noise bulk floored; since Σ̂_c − T_c = (1 − a_p)(Σ̃_c − T_c) (tr Σ̂_c = tr Σ̃_c unless the
noise floor dν_c set the scale), a_p solves a_p/(1 − a_p)² = err_c/‖Σ̂_c − T_c‖²_F on the
released moments, with ‖Σ̃_c‖ ≈ ‖Σ̂_c‖ and P̂ re-floored from the released pooled covariance.
The recovery is approximate (those two stand-ins, and the raise of a_p that kept Σ̂_c
positive definite is not seen).
"""

from __future__ import annotations

import math

import numpy as np
from scipy.linalg import eigvalsh

from ghofl.heads._linalg import F64
from ghofl.moments.core import Moments
from ghofl.moments.criteria import ShrinkageFamily
from ghofl.moments.noise import noise_tag
from ghofl.moments.selection import support_basis
from ghofl.privacy.postprocess import floor_noise_bulk
from ghofl.stats.release import NoisyStats

__all__ = ["class_cov_noise", "noise_floor_shrinkage", "postprocess_intensities",
           "postprocess_intensity"]


def class_cov_noise(moments: Moments) -> F64 | None:
    """ν_c² (C,): the release noise variance on each diagonal entry of the class covariance.

    (σ_S² + 4σ_A²‖μ̂_c‖²/d)/(N_c − 1)² (module docstring; (N_c − 1) at least 1), σ_S the level
    of ``class_scatter``, σ_A of ``sums``. None when the statistics carry no noise levels
    (:func:`~ghofl.moments.noise.noise_tag`) or no class second moments.
    """
    stats = moments.stats
    if not noise_tag(stats) or not isinstance(stats, NoisyStats) or stats.class_scatter is None:
        return None
    var_s = float(stats.noise_sigma.get("class_scatter", 0.0)) ** 2
    var_a = float(stats.noise_sigma.get("sums", 0.0)) ** 2
    dof = np.maximum(moments.counts.astype(np.float64) - 1.0, 1.0)
    out: F64 = (var_s + 4.0 * var_a * np.sum(moments.means**2, axis=1) / moments.dim) / dof**2
    return out


def postprocess_intensity(moments: Moments, c: int, center: F64) -> float:
    """a_p of class c recovered from the release (module docstring), for releases without a record.

    The root in [0, 1) of a/(1 − a)² = err_c/‖Σ̂_c − T_c‖²_F with ``center`` P̂ (d, d) and
    T_c = max(tr Σ̂_c, dν_c)/tr P̂·P̂. 0 without noise on the class second moments or with
    fewer than 2 degrees of freedom; 1 when Σ̂_c equals its target (nothing left to shrink).
    """
    stats = moments.stats
    sigma = stats.noise_sigma.get("class_scatter", 0.0) if isinstance(stats, NoisyStats) else 0.0
    dof = moments.class_dof(c)
    if sigma <= 0.0 or dof < 1.0:
        return 0.0
    d = moments.dim
    cov = moments.class_covariance(c, "n-1")
    tr_c, tr_p = float(np.trace(cov)), float(np.trace(center))
    nu_c = float(sigma) / dof
    scale = max(tr_c, d * nu_c) / tr_p if tr_p > 0.0 else 0.0
    gap = float(np.sum((cov - scale * center) ** 2))  # directly: no cancellation
    err = 0.5 * d * (d + 1) * nu_c**2 + (float(np.sum(cov * cov)) + tr_c**2) / dof
    if not gap > 0.0:
        return 1.0
    r = err / gap
    return 1.0 - 2.0 / (1.0 + math.sqrt(1.0 + 4.0 * r))  # 1 − u, r·u² + u − 1 = 0, u > 0


def postprocess_intensities(moments: Moments) -> F64:
    """a_p (C,): how far the post-processing (P2n) shrank each class covariance.

    The intensities the release recorded (:attr:`~ghofl.stats.release.NoisyStats.
    noise_shrinkage`); else, on ``full`` statistics with noise on the class second moments,
    recovered per class (:func:`postprocess_intensity`; 1 for a class of fewer than 2
    samples, whose noisy scatter P2n discarded); else zeros (no P2n: other modes, exact
    statistics).
    """
    stats = moments.stats
    c_num = moments.num_classes
    if isinstance(stats, NoisyStats) and stats.noise_shrinkage is not None:
        return np.asarray(stats.noise_shrinkage, dtype=np.float64)
    sigma = stats.noise_sigma.get("class_scatter", 0.0) if isinstance(stats, NoisyStats) else 0.0
    if stats.class_scatter is None or sigma <= 0.0:
        return np.zeros(c_num)
    counts = moments.counts
    dof = float(np.sum(np.maximum(counts - 1, 0)))
    nu = math.sqrt(float(np.sum(counts >= 2))) * float(sigma) / max(dof, 1.0)
    center = floor_noise_bulk(moments.pooled_covariance(), nu)
    out: F64 = np.array([postprocess_intensity(moments, c, center) if counts[c] >= 2 else 1.0
                         for c in range(c_num)])
    return out


def _metric_eigvals(moments: Moments, target: str, center: F64 | None,
                    within_eigvals: F64 | None) -> F64:
    """The spectrum (k,) of X, the metric the whitening gives the noise (module docstring).

    1/eig(B) (of VᵀBV on the support V of the data) with the ``"pooled"`` target, each
    eigenvalue floored at ε_mach times the largest (a near-singular centre gives large but
    finite values); else ones, and ones too when B has no positive finite eigenvalue.
    """
    support = support_basis(moments, within_eigvals)
    k = moments.dim if support is None else support.shape[1]
    if target != "pooled" or center is None:
        return np.ones(k)
    q = center if support is None else support.T @ center @ support
    w = eigvalsh(0.5 * (q + q.T), check_finite=False)
    top = float(w[-1]) if w.size else 0.0
    if not (math.isfinite(top) and top > 0.0):
        return np.ones(k)
    out: F64 = 1.0 / np.maximum(w, np.finfo(np.float64).eps * top)
    return out


def noise_floor_shrinkage(
    moments: Moments, fams: list[tuple[ShrinkageFamily, float]], usable: list[int],
    target: str, center: F64 | None, within_eigvals: F64 | None = None,
) -> float | None:
    """a_noise, the least QDA shrinkage that the release noise calls for; None without noise.

    Parameters
    ----------
    moments : Moments
    fams : list of (ShrinkageFamily, float)
        Per class of ``usable`` the whitened eigenvalues (k,), the target t_c and the degrees
        of freedom (:func:`ghofl.heads.qda.evidence_families`).
    usable : list of int
        The classes of ``fams``.
    target : str
        QDA's shrinkage target; ``center`` (d, d): B with ``"pooled"``.
    within_eigvals : ndarray, shape (d,), optional
        As :func:`~ghofl.moments.selection.support_basis` reads them.

    Returns
    -------
    float in [0, 1] or None
        min(1, Σ_c ρ_c E_c / Σ_c ‖W_c − t_c I‖²_F) (module docstring).
    """
    nu2 = class_cov_noise(moments)
    if nu2 is None:
        return None
    x = _metric_eigvals(moments, target, center, within_eigvals)
    spread = 0.5 * (float(np.sum(x * x)) + float(np.sum(x)) ** 2)
    residual = (1.0 - postprocess_intensities(moments)) ** 2
    idx = np.asarray(usable, dtype=np.intp)
    left = float(np.sum(residual[idx] * nu2[idx])) if idx.size else 0.0
    if left <= 0.0:  # no noise left, whatever the spread
        return 0.0
    noise = left * spread
    gap = sum(float(np.sum((fam.eigvals - fam.target) ** 2)) for fam, _ in fams)
    if not (math.isfinite(noise) and math.isfinite(gap)):
        return 1.0  # the stated rule: no finite measure of the spread, the noise dominates
    return 1.0 if not gap > noise else noise / gap
