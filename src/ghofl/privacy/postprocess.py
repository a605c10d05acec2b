"""Post-processing of noisy statistics into valid :class:`~ghofl.stats.ClientStats`.

Noise makes the released sums inconsistent (negative variances, indefinite scatter matrices,
non-integer or negative counts). Post-processing uses the noisy values only, so it costs no
privacy. With n_c the clamped counts and A_c the noisy sums:

* with the noise levels σ and a DP subspace (``DPConfig.subspace``), the noisy sums and
  second moments may first be projected onto public principal directions, which is the
  release the clients would have made in that subspace (:mod:`ghofl.privacy.subspace`);
  the choice is stated among the notes;                                              (P0s)
* counts: n_c = max(round(ñ_c), 0); a class with n_c < max(k, 1) becomes a placeholder
  (n_c = 1, zero sums) so every head stays fittable, k the minimum-count rule's (under DP the
  rule is this threshold on the noised counts, so it costs no privacy);              (P1)
* ``full``: the within-class scatter M_c = S̃_c − A_c A_cᵀ/n_c is projected onto the positive
  semi-definite cone (eigenvalues clipped at 0), S_c = M_c⁺ + A_c A_cᵀ/n_c;          (P2)
  when the noise levels σ are given (they are public), the noise-aware estimate (P2n) of
  :func:`noise_aware_covariances` replaces the projection, and its final intensities a_c
  are kept with the statistics (:attr:`NoisyStats.noise_shrinkage`; public, a function of
  the release and σ);
* ``pooled``: W = B̃ − Σ_c A_c A_cᵀ/n_c is projected as in (P2); the per-class variances
  V_c = max(D̃_c − A_c²/n_c, 0) are rescaled per coordinate so that Σ_c V_c = diag W⁺, hence
  diag B = Σ_c D_c with D_c = V_c + A_c²/n_c;                                          (P3)
* ``gram``: W = B̃ − Σ_c A_c A_cᵀ/n_c is projected as in (P2), B = W⁺ + Σ_c A_c A_cᵀ/n_c; (P3g)
  in ``pooled`` and ``gram`` with the noise levels σ given, W is instead estimated knowing
  the noise (P3n, :func:`noise_aware_within`): the centring's noise bias removed, and each
  eigenvalue replaced by an estimate of the noiseless variance along its eigenvector
  (:func:`denoise_covariance`), then mixed with a public within-class covariance when one
  is known (``DPConfig.prior``; :mod:`ghofl.privacy.prior`), at the weight that minimises an
  estimate of its error; the weight is stated among the notes;                         (P3p)
* ``diag``: D_c = max(D̃_c, A_c²/n_c) (variance clamped at 0).                        (P4)

Symmetric matrices were noised as upper triangles, so they are symmetric by construction.
"""

from __future__ import annotations

import math
from collections.abc import Mapping

import numpy as np
from numpy.typing import NDArray

from ghofl.privacy.prior import PriorChoice, choose_prior, mix_prior
from ghofl.privacy.subspace import choose_subspace, project_arrays
from ghofl.stats.client_stats import ClientStats
from ghofl.stats.meta import StatsMeta
from ghofl.stats.release import NoisyStats
from ghofl.stats.schema import schema_for

__all__ = [
    "NoisyStats",
    "clamp_counts",
    "denoise_covariance",
    "denoised_eigenvalues",
    "floor_noise_bulk",
    "noise_aware_covariances",
    "noise_aware_shrinkage",
    "noise_aware_within",
    "noisy_pooled_covariance",
    "postprocess",
    "project_psd",
]

F64 = NDArray[np.float64]


def project_psd(m: F64) -> F64:
    """Nearest (Frobenius) positive semi-definite matrix: V max(Λ, 0) Vᵀ of sym(m) (P2).

    Parameters
    ----------
    m : ndarray, shape (d, d)

    Returns
    -------
    ndarray, shape (d, d), exactly symmetric.
    """
    sym = 0.5 * (m + m.T)
    w, v = np.linalg.eigh(sym)
    out = (v * np.maximum(w, 0.0)) @ v.T
    return np.asarray(0.5 * (out + out.T))


def clamp_counts(noisy: F64, min_count: int = 1
                 ) -> tuple[NDArray[np.int64], NDArray[np.bool_]]:
    """Rounded counts clamped at 0, and the mask of placeholder classes (P1).

    A placeholder class has a rounded count below ``max(min_count, 1)`` and is given count 1.

    Parameters
    ----------
    noisy : ndarray, shape (C,)
    min_count : int, default 1
        k of the minimum-count rule on the noised counts.

    Returns
    -------
    counts : ndarray of int64, shape (C,), every entry >= 1
    placeholder : ndarray of bool, shape (C,)
    """
    rounded = np.maximum(np.rint(noisy), 0.0).astype(np.int64)
    placeholder = rounded < max(int(min_count), 1)
    return np.where(placeholder, 1, rounded).astype(np.int64), placeholder


def postprocess(meta: StatsMeta, noisy_counts: F64, noisy_floats: F64, min_count: int = 1,
                sigma: Mapping[str, float] | None = None,
                subspace: str = "none", prior: str = "none") -> tuple[ClientStats, list[str]]:
    """Valid statistics from a noisy flattened release (P1–P4).

    Parameters
    ----------
    meta : StatsMeta
        Metadata of the release (mode, C, d).
    noisy_counts : ndarray, shape (C,)
    noisy_floats : ndarray, shape (F,)
        Layout ``schema_for(meta.mode).float_layout``.
    min_count : int, default 1
        k of the minimum-count rule: classes whose noised count rounds below k become
        placeholders (P1).
    sigma : mapping of str to float, optional
        Noise standard deviation per block (``NoisePlan.sigma``); in ``full`` mode it selects
        the noise-aware estimate (P2n) instead of the projection (P2).
    subspace : str, default "none"
        ``DPConfig.subspace``: with ``sigma``, the public subspace the release is fitted in
        (:func:`~ghofl.privacy.subspace.choose_subspace`; P0s, before P2–P4), the choice
        stated among the notes. Without ``sigma`` it is not consulted.
    prior : str, default "none"
        ``DPConfig.prior``: with ``sigma``, in ``pooled`` and ``gram`` mode, the public
        within-class covariance the denoised pooled covariance is mixed with
        (:func:`~ghofl.privacy.prior.choose_prior`; P3p), its weight stated among the notes.
        Without ``sigma``, or in other modes, it is not consulted.

    Returns
    -------
    stats : ClientStats
        Validated, with ``n_clipped = 0`` (withheld under differential privacy); a
        :class:`NoisyStats` carrying ``sigma`` when it is given.
    notes : list of str
        What was done, in words.
    """
    sch = schema_for(meta.mode)
    c, d = meta.num_classes, meta.dim
    k_min = max(int(min_count), 1)
    counts, placeholder = clamp_counts(np.asarray(noisy_counts, dtype=np.float64), k_min)
    arrays: dict[str, F64] = {}
    for spec, seg in zip(sch.float_arrays, sch.float_layout(c, d), strict=True):
        packed = np.asarray(noisy_floats[seg.offset : seg.stop], dtype=np.float64)
        arrays[spec.name] = spec.unpack(packed.reshape(spec.packed_shape(c, d)), c, d)
    keep = ~placeholder
    for spec in sch.float_arrays:
        if spec.axes[0] == "C":
            arrays[spec.name][placeholder] = 0.0
    n = counts.astype(np.float64)
    notes = ["counts rounded and clamped at 0"]
    if np.any(placeholder):
        names = ", ".join(repr(meta.classes[i]) for i in np.flatnonzero(placeholder))
        notes.append(f"classes with a noisy count below {k_min} kept as placeholders (N=1, zero "
                     f"sums): {names}")
    if sigma is not None and subspace != "none":
        choice = choose_subspace(subspace, meta, sigma, float(n[keep].sum()), arrays["sums"], n)
        if choice.spec is not None:
            meta, arrays = project_arrays(meta, arrays, n, choice.spec)
        notes.append(choice.reason)
    sums = arrays["sums"]
    prior_choice = None
    if sigma is not None and meta.mode in ("pooled", "gram"):
        prior_choice = choose_prior(prior, meta)
        if prior_choice.target is None:
            notes.append(prior_choice.reason)
    shrinkage: tuple[float, ...] | None = None
    if meta.mode == "full" and sigma is not None:
        arrays["class_scatter"], shrinkage = _noise_aware_scatter(arrays, n, keep, sigma)
        notes.append("class covariances estimated knowing the noise (P2n): noise bias of the "
                     "centring removed, the noise bulk of the pooled eigenvalues floored, each "
                     "class shrunk toward the rescaled pooled covariance with an intensity that "
                     "counts the noise variance")
    elif meta.mode == "full":
        cs = arrays["class_scatter"]
        for k in np.flatnonzero(keep):
            outer = np.outer(sums[k], sums[k]) / n[k]
            cs[k] = project_psd(cs[k] - outer) + outer
        notes.append("per-class within-class scatter S_c − A_c A_cᵀ/N_c projected to the PSD "
                     "cone (eigenvalues clipped at 0)")
    elif meta.mode == "pooled":
        sq, b = arrays["sq_sums"], arrays["scatter"]
        between = (sums.T / n) @ sums
        w = _within(b - between, n, keep, sigma, notes, prior_choice)
        var = np.maximum(sq - sums**2 / n[:, None], 0.0)
        arrays["sq_sums"] = _match_diag(var, np.diagonal(w).copy(), n) + sums**2 / n[:, None]
        arrays["scatter"] = w + between
        notes.append("within-class scatter B − Σ_c A_c A_cᵀ/N_c projected to the PSD cone; "
                     "per-class variances clamped at 0 and rescaled so that diag B = Σ_c D_c")
    elif meta.mode == "gram":
        between = (sums.T / n) @ sums
        arrays["scatter"] = (_within(arrays["scatter"] - between, n, keep, sigma, notes,
                                     prior_choice)
                             + between)
        notes.append("within-class scatter B − Σ_c A_c A_cᵀ/N_c projected to the PSD cone")
    elif meta.mode == "diag":
        arrays["sq_sums"] = np.maximum(arrays["sq_sums"], sums**2 / n[:, None])
        notes.append("per-class variances D_c/N_c − μ_c² clamped at 0")
    if sigma is None:
        stats = ClientStats(meta, counts=counts, n_clipped=0, holdout=None, **arrays)
    else:
        stats = NoisyStats(meta, counts=counts, n_clipped=0, holdout=None,
                           noise_sigma=dict(sigma), noise_shrinkage=shrinkage, **arrays)
        notes.append("the noise levels σ_b kept with the statistics for the heads' criteria")
        if shrinkage is not None:
            notes.append("the intensity a_c of (P2n) kept with the statistics (public: a "
                         "function of the release and σ)")
    notes.append("n_clipped withheld (reported as 0)")
    return stats, notes


def _within(w: F64, n: F64, keep: NDArray[np.bool_], sigma: Mapping[str, float] | None,
            notes: list[str], prior: PriorChoice | None = None) -> F64:
    """The pooled within-class scatter from its noisy value: (P3n) with σ, else (P2).

    With σ and a public covariance in ``prior``, the denoised covariance is mixed with it
    (P3p).
    """
    if sigma is None:
        return project_psd(w)
    k = int(np.count_nonzero(keep))
    notes.append("pooled within-class scatter estimated knowing the noise (P3n): noise bias "
                 "of the centring removed, its eigenvalues denoised (rotationally invariant "
                 "estimate of the noiseless variance along each eigenvector, at least the noise "
                 "level)")
    noisy, dof = noisy_pooled_covariance(w, float(n[keep].sum()), k, sigma["sums"], n[keep])
    out = denoise_covariance(noisy, sigma["scatter"] / dof)
    if prior is not None and prior.target is not None:
        mixed = mix_prior(noisy, out, prior.target)
        out = mixed.cov
        notes.append(
            f"pooled within-class covariance mixed with the public covariance "
            f"{prior.fingerprint} (P3p): weight b = {mixed.weight:.3f} on it (scaled by "
            f"{mixed.scale:.3g} to the release's total variance), the b that minimises the "
            "estimated Frobenius error of the mix (a function of the release and public "
            "values: no budget)")
    return np.asarray(out * dof)


def noisy_pooled_covariance(w: F64, n_total: float, num_classes: int, sigma_sums: float,
                            counts: F64) -> tuple[F64, float]:
    """P̃ = (W̃ + σ_A²·Σ_c 1/n_c · I)/(N − C) and N − C (the first step of P3n).

    The centring W̃ = B̃ − Σ_c Ã_c Ã_cᵀ/n_c is biased by the noise on the sums
    (E[Ã_c Ã_cᵀ] = A_c A_cᵀ + σ_A² I); the bias is added back, so P̃ is the pooled covariance
    plus noise of mean 0 (standard deviation σ_B/(N − C) on the diagonal, N2s).

    Parameters
    ----------
    w : ndarray, shape (d, d)
    n_total : float
        N, the (clamped) total count of the classes kept.
    num_classes : int
        C, the classes kept.
    sigma_sums : float
        σ_A.
    counts : ndarray, shape (C,)
        n_c of the classes kept.

    Returns
    -------
    (ndarray, shape (d, d), float)
    """
    d = w.shape[0]
    dof = max(n_total - num_classes, 1.0)
    bias = sigma_sums**2 * float(np.sum(1.0 / np.maximum(counts, 1.0)))
    return (0.5 * (w + w.T) + bias * np.eye(d)) / dof, dof


def noise_aware_within(w: F64, n_total: float, num_classes: int, sigma_sums: float,
                       sigma_scatter: float, counts: F64) -> F64:
    """Pooled within-class scatter W from its noisy value, knowing the noise (P3n).

    ``w`` is W̃ = B̃ − Σ_c Ã_c Ã_cᵀ/n_c. The centring is biased by the noise on the sums
    (E[Ã_c Ã_cᵀ] = A_c A_cᵀ + σ_A² I), so Σ_c σ_A²/n_c · I is added back; the entries of
    P̃ = W̃/(N − C) then carry noise of standard deviation ν = σ_B/(N − C) (ν/√2 off the
    diagonal, N2s), which :func:`denoise_covariance` removes from its eigenvalues (each
    becomes an estimate of the noiseless variance along its eigenvector, at least ν).
    Returns (N − C)·P̂.

    Parameters
    ----------
    w, n_total, num_classes, counts
        As :func:`noisy_pooled_covariance`.
    sigma_sums, sigma_scatter : float
        σ_A and σ_B of the release.

    Returns
    -------
    ndarray, shape (d, d), symmetric positive definite.
    """
    p, dof = noisy_pooled_covariance(w, n_total, num_classes, sigma_sums, counts)
    return np.asarray(denoise_covariance(p, sigma_scatter / dof) * dof)


#: Rows of the eigenvalue-difference matrix formed at once by :func:`denoised_eigenvalues`.
_RIE_BLOCK = 512


def denoised_eigenvalues(lam: F64, nu: float) -> F64:
    """ξ (d,): the noiseless variance along each eigenvector of a noisy covariance (P3n).

    ``lam`` (d,) are the eigenvalues of P̃ = P + E, E symmetric Gaussian noise of standard
    deviation ν on the diagonal and ν/√2 off it (N2s). The rotationally invariant estimator
    for additive noise (Bun, Bouchaud & Potters, "Cleaning large correlation matrices",
    Physics Reports 666, 2017, §8: ξ(λ) = λ − 2σ²·h(λ), h the Hilbert transform of the
    observed spectrum) estimates v_iᵀ P v_i, v_i the eigenvector of λ_i:

        ξ_i = λ_i − 2s²·Σ_j (λ_i − λ_j)/((λ_i − λ_j)² + η²),   s² = ν²/2,

    the sum smoothed at η = ν√2 (the semicircle radius ν√(2d) over √d, the scale of the
    spacings inside the noise bulk). It moves the eigenvalues the noise spread apart back
    toward each other: those the noise pushed below the signal rise, those it pushed above
    fall; for P = c·I it gives c. The result is floored at ν (the noise level), so the
    covariance stays positive definite. ν = 0 returns ``lam`` unchanged.
    """
    out = np.array(lam, dtype=np.float64)
    if nu <= 0.0:
        return out
    s2, eta2 = 0.5 * nu * nu, 2.0 * nu * nu
    for start in range(0, lam.shape[0], _RIE_BLOCK):
        diff = lam[start : start + _RIE_BLOCK, None] - lam[None, :]
        out[start : start + _RIE_BLOCK] -= 2.0 * s2 * np.sum(diff / (diff * diff + eta2), axis=1)
    return np.maximum(out, nu)


def denoise_covariance(pooled: F64, nu: float) -> F64:
    """A covariance from its noisy estimate: eigenvalues :func:`denoised_eigenvalues` (P3n).

    Parameters
    ----------
    pooled : ndarray, shape (d, d)
        P̃, symmetric up to round-off.
    nu : float
        ν, the standard deviation of the noise on its diagonal entries.

    Returns
    -------
    ndarray, shape (d, d), symmetric positive definite (eigenvalues >= ν; >= 1e-300 at ν = 0).
    """
    sym = 0.5 * (pooled + pooled.T)
    lam, v = np.linalg.eigh(sym)
    xi = np.maximum(denoised_eigenvalues(lam, nu), 1e-300)
    out = (v * xi) @ v.T
    return np.asarray(0.5 * (out + out.T))


def floor_noise_bulk(pooled: F64, nu: float, floor: float = 1e-6) -> F64:
    """A pooled covariance from its noisy estimate, its noise bulk floored (P2n).

    P̃ carries symmetric noise of standard deviation ν on the diagonal and ν/√2 off it (N2s),
    whose eigenvalues spread over about ±e, e = ν·√(2d) (the semicircle edge). Eigenvalues
    of P̃ are floored at

        τ = e²/(e + μ),   μ = tr P̃/d,

    which is about e/μ·e → 0 when the noise edge is small against the mean eigenvalue (the
    spectrum is signal: keep it) and tends to e when the noise edge exceeds it (the bulk is
    noise: make it isotropic at the noise level). Also at least ``floor`` times the largest.
    (The pooled and gram releases denoise their eigenvalues instead: :func:`denoise_covariance`.)

    Parameters
    ----------
    pooled : ndarray, shape (d, d)
    nu : float
    floor : float, default 1e-6

    Returns
    -------
    ndarray, shape (d, d), symmetric positive definite.
    """
    d = pooled.shape[0]
    sym = 0.5 * (pooled + pooled.T)
    w, v = np.linalg.eigh(sym)
    edge = nu * math.sqrt(2.0 * d)
    mu = max(float(np.trace(sym)) / d, 1e-300)
    tau = edge * edge / (edge + mu)
    w = np.maximum(w, max(tau, floor * max(float(w[-1]), 0.0), 1e-300))
    out = (v * w) @ v.T
    return np.asarray(0.5 * (out + out.T))

def _match_diag(var: F64, target: F64, n: F64) -> F64:
    """Rescale per-class variance sums V (C, d) per coordinate so that Σ_c V_c = target (d,).

    Where Σ_c V_c = 0, share target in proportion to the counts n (C,) (P3).
    """
    total = var.sum(axis=0)
    share = n / n.sum()
    scaled = var * np.divide(target, total, out=np.zeros_like(target), where=total > 0)
    return np.asarray(np.where(total > 0, scaled, share[:, None] * target[None, :]))


def _noise_aware_scatter(arrays: dict[str, F64], n: F64, keep: NDArray[np.bool_],
                         sigma: Mapping[str, float]) -> tuple[F64, tuple[float, ...]]:
    """Class scatters S_c = (n_c − 1) Σ̂_c + A_c A_cᵀ/n_c (C, d, d) from (P2n), and a_c (C,).

    Placeholders and classes of one sample keep a zero within-class scatter: none of their
    noise is kept, recorded as a_c = 1.
    """
    sums, cs = arrays["sums"], arrays["class_scatter"]
    d = sums.shape[1]
    fit = keep & (n >= 2)
    out = np.einsum("ci,cj->cij", sums, sums) / n[:, None, None]
    shrink = np.ones(n.shape[0])
    if not fit.any():
        return np.asarray(out), tuple(float(a) for a in shrink)
    idx = np.flatnonzero(fit)
    scat = cs[idx] - out[idx] + (sigma["sums"] ** 2 / n[idx])[:, None, None] * np.eye(d)
    covs, shrink[idx] = noise_aware_shrinkage(scat, n[idx], sigma["class_scatter"])
    out[idx] += (n[idx] - 1.0)[:, None, None] * covs
    return np.asarray(out), tuple(float(a) for a in shrink)


def noise_aware_covariances(scatters: F64, counts: F64, sigma_scatter: float,
                            floor: float = 1e-6) -> F64:
    """Class covariances (K, d, d) from noisy within-class scatters, knowing the noise (P2n).

    The covariances of :func:`noise_aware_shrinkage` (its parameters), without the
    intensities.
    """
    return noise_aware_shrinkage(scatters, counts, sigma_scatter, floor)[0]


def noise_aware_shrinkage(scatters: F64, counts: F64, sigma_scatter: float,
                          floor: float = 1e-6) -> tuple[F64, F64]:
    """Class covariances from noisy within-class scatters knowing the noise, and a_c (P2n).

    ``scatters`` are M̃_c = M_c + F_c with F_c symmetric, every entry N(0, σ²) (σ =
    ``sigma_scatter``), already corrected for the noise of the sums (+σ_A²/n_c·I, so that
    E[M̃_c] = M_c). With Σ̃_c = M̃_c/(n_c − 1) and the pooled P̃ = Σ_c M̃_c/(N − C), whose entries
    carry noise of variance ν² = C·σ²/(N − C)²:

    * P̂: P̃ with its noise bulk floored (:func:`floor_noise_bulk`);
    * Σ̂_c = (1 − a_c) Σ̃_c + a_c t_c P̂, t_c = max(tr Σ̃_c, d ν_c) / tr P̂ (ν_c below), with
      the Ledoit–Wolf intensity
      a_c = (d² ν_c² + (tr Σ̃_c² + tr² Σ̃_c)/(n_c − 1)) / ‖Σ̃_c − t_c P̂‖²_F: the estimation
      error counts the noise variance ν_c² = σ²/(n_c − 1)² of every entry as well as the
      sampling error; a_c is raised (no other projection) until the smallest eigenvalue of
      Σ̂_c is at least ``floor`` times its largest.

    Parameters
    ----------
    scatters : ndarray, shape (K, d, d)
    counts : ndarray, shape (K,)
        n_c ≥ 2 of each class.
    sigma_scatter : float
    floor : float, default 1e-6

    Returns
    -------
    covariances : ndarray, shape (K, d, d), symmetric positive definite.
    intensities : ndarray, shape (K,)
        The final a_c in [0, 1] of each class (after the raise).
    """
    k, d = scatters.shape[0], scatters.shape[1]
    sym = 0.5 * (scatters + np.swapaxes(scatters, 1, 2))
    dof = counts - 1.0
    pooled = sym.sum(axis=0) / max(float(dof.sum()), 1.0)
    nu = math.sqrt(k) * sigma_scatter / max(float(dof.sum()), 1.0)
    center = floor_noise_bulk(pooled, nu, floor)
    out = np.empty_like(sym)
    shrink = np.empty(k)
    for c in range(k):
        cov = sym[c] / dof[c]
        nu_c = sigma_scatter / dof[c]
        scale = max(float(np.trace(cov)), d * nu_c)  # a trace below the noise is noise
        target = center * (scale / float(np.trace(center)))
        err = 0.5 * d * (d + 1) * nu_c**2 + (  # noise energy of a symmetric matrix (N2s)
            float(np.sum(cov * cov)) + float(np.trace(cov)) ** 2) / dof[c]
        gap = float(np.sum((cov - target) ** 2))
        a = 1.0 if gap <= 0.0 else min(err / gap, 1.0)
        out[c], shrink[c] = _raise_to_pd(cov, target, a, floor)
    return out, shrink


def _raise_to_pd(cov: F64, target: F64, a: float, floor: float) -> tuple[F64, float]:
    """The blend (1 − b) cov + b target for the smallest well-conditioned b ≥ a, and b.

    b runs over a geometric grid; well-conditioned means the smallest eigenvalue is at least
    ``floor`` times the largest (b = 1 when none is).
    """
    for b in (a, *np.geomspace(max(a, 1e-4), 1.0, 40)):
        m = (1.0 - b) * cov + b * target
        ev = np.linalg.eigvalsh(m)
        if ev[0] >= floor * max(float(ev[-1]), 1e-300):
            return np.asarray(0.5 * (m + m.T)), float(b)
    return np.asarray(0.5 * (target + target.T)), 1.0
