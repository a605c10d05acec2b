"""Choosing a covariance shrinkage from statistics alone (no test set, no raw data).

Every candidate covariance has the form

    C(a) = (1 − a)·P + a·t·Q,       a ∈ [0, 1],

with P (k, k) the estimated covariance, Q (k, k) positive definite (the identity, or VᵀV when
the covariance lives in a subspace x ↦ Vᵀx of a d-dimensional one) and t = tr(Σ)/d the
scaled-identity target of :func:`ghofl.moments.shrinkage.shrink`. One generalised eigen
decomposition P U = Q U diag(w), UᵀQU = I gives every candidate at once:

    C(a) = U⁻ᵀ diag(D) U⁻¹,   D = (1 − a)·w + a·t,   log det C(a) = Σ log D + log det Q.

Two families of criteria are computed from it:

*Held-out criteria* (:func:`heldout_loglik`, :func:`heldout_error`) score C(a) fitted on one
part of the data against the first and second moments of a disjoint held-out part: the mean
Gaussian log-likelihood of the held-out samples,

    ℓ(a) = −½ [k log 2π + log det C(a) + tr(C(a)⁻¹ M)/n'],
    M = Σ_held-out (x − μ_y)(x − μ_y)ᵀ = W' + Σ_c n'_c (m'_c − μ_c)(m'_c − μ_c)ᵀ,

(μ_c fitted means, m'_c, n'_c, W' the held-out class means, counts and within-class scatter),
and a Gaussian estimate of the held-out error of the linear discriminant built on C(a): the
score difference s_c − s_j = (w_c − w_j)ᵀx + b_c − b_j has, under held-out class c, mean
(w_c − w_j)ᵀm'_c + b_c − b_j and variance (w_c − w_j)ᵀ Σ' (w_c − w_j) (Σ' the held-out pooled
covariance), so P(s_c < s_j) ≈ Φ(−mean/sd); a class's error is 1 − Π_j (1 − P(s_c < s_j)).

*Moment-only criteria*, for statistics without a held-out part:

- :func:`analytic_error` (the LDA default, ``"auto"`` on the pooled covariance): the Gaussian
  error estimate of :func:`heldout_error` computed from the fitted moments themselves, with the
  population quantities it needs replaced by random-matrix estimates from the spectrum of the
  pooled covariance (n = N − C degrees of freedom). The plug-in estimate is far too optimistic
  (the fitted means and small eigenvalues carry noise); the corrected one asks for strong
  shrinkage when n/d is small (CIFAR-10 at 300 images per class, d = 1280: a ≈ 0.45, where the
  evidence gives 0.09 and loses a point) and for almost none when n/d is large or when the
  class means differ along low-variance directions (the issue's synthetic sets, where the
  evidence shrinks hard at n/d ≈ 2 and loses tens of points).
- :func:`evidence_shrinkage` (the QDA default, and ``"evidence"`` by name): the marginal
  likelihood of the scatter matrix under an inverse-Wishart prior centred on t·Q, maximised
  over the prior strength κ (empirical Bayes); the posterior mean is C(a) with
  a = κ/(κ + n). Unlike OAS and RBLW, which minimise a Frobenius risk, it is a likelihood
  criterion, and it keeps small eigenvalues when the spectrum is far from spherical; as a
  likelihood criterion it under-shrinks for classification when n/d is small.

With a held-out part, ``"auto"`` uses the held-out error estimate for the pooled covariance
(:data:`POOLED_CRITERION`) and, for QDA's class covariances, the Gaussian estimate of the
held-out error of the quadratic rule (:func:`heldout_qda_error`, :data:`QDA_CRITERION`): its
score differences are quadratic in x, and their held-out mean and variance, under Gaussian
held-out classes, again need only the held-out counts, means and second moments.

Ledoit–Wolf's estimator is not offered: its variance term needs Σ_i ‖x_i x_iᵀ − S‖², a fourth
moment of the data that no upload mode holds.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
from numpy.typing import NDArray
from scipy.linalg import cholesky, eigh, solve_triangular
from scipy.special import gammaln, ndtr

from ghofl.errors import ConfigError, StatsValidationError
from ghofl.moments.core import Moments
from ghofl.moments.shrinkage import (
    ANALYTIC_DEFAULT,
    Shrinkage,
    check_shrinkage,
    resolve_shrinkage,
    shrink,
)

F64 = NDArray[np.float64]

#: Candidate coefficients scored by the held-out and evidence criteria: 0, then 4 per decade
#: from 1e-5 to 0.3, then 0.5 and 0.9 (the hindsight grid 0, 0.01, ..., 0.3 included).
CANDIDATES: tuple[float, ...] = tuple(
    sorted({0.0, 0.01, 0.02, 0.05, 0.1, 0.2, 0.3, 0.5, 0.9}
           | {float(f"{v:.3g}") for v in np.logspace(-5, np.log10(0.3), 19)})
)


@dataclass(frozen=True)
class ShrinkageFamily:
    """The candidates C(a) = (1 − a)P + a·t·Q in one generalised eigenbasis.

    Attributes
    ----------
    eigvals : ndarray, shape (k,)
        w: generalised eigenvalues of (P, Q), clipped at 0.
    basis : ndarray, shape (k, k)
        U with UᵀQU = I and UᵀPU = diag(w).
    target : float
        t, the scale of the identity target.
    logdet_q : float
        log det Q.
    """

    eigvals: F64
    basis: F64
    target: float
    logdet_q: float

    def diag(self, a: float) -> F64:
        """D(a) = (1 − a)·w + a·t, shape (k,)."""
        out: F64 = (1.0 - a) * self.eigvals + a * self.target
        return out


def shrinkage_family(cov: F64, target: float, metric: F64 | None = None) -> ShrinkageFamily:
    """Decompose (P, Q) once for all candidates.

    Parameters
    ----------
    cov : ndarray, shape (k, k)
        P, symmetric positive semi-definite.
    target : float
        t (>= 0).
    metric : ndarray, shape (k, k), optional
        Q, symmetric positive definite (default: the identity).

    Returns
    -------
    ShrinkageFamily
    """
    p = 0.5 * (cov + cov.T)
    if metric is None:
        w, u = eigh(p, driver="evr", check_finite=False)
        logdet_q = 0.0
    else:
        q = 0.5 * (metric + metric.T)
        w, u = eigh(p, q, check_finite=False)
        logdet_q = float(np.linalg.slogdet(q)[1])
    return ShrinkageFamily(np.maximum(w, 0.0), u, max(float(target), 0.0), logdet_q)


def residual_scatter(
    fit_means: F64, heldout_means: F64, heldout_counts: NDArray[np.int64], heldout_within: F64
) -> F64:
    """M = W' + Σ_c n'_c (m'_c − μ_c)(m'_c − μ_c)ᵀ: held-out scatter around the fitted means.

    Parameters
    ----------
    fit_means : ndarray, shape (C, k)
    heldout_means : ndarray, shape (C, k)
    heldout_counts : ndarray of int, shape (C,)
    heldout_within : ndarray, shape (k, k)
        Held-out within-class scatter W' (one class's scatter for a per-class criterion).

    Returns
    -------
    ndarray, shape (k, k)
    """
    delta = (heldout_means - fit_means) * np.sqrt(heldout_counts.astype(np.float64))[:, None]
    out: F64 = heldout_within + delta.T @ delta
    return 0.5 * (out + out.T)


def heldout_loglik(
    family: ShrinkageFamily, residual: F64, n_heldout: float, candidates: Sequence[float]
) -> F64:
    """Mean held-out Gaussian log-likelihood ℓ(a) for each candidate (module docstring).

    Parameters
    ----------
    family : ShrinkageFamily
        Decomposition of the fitted covariance.
    residual : ndarray, shape (k, k)
        M, the held-out scatter around the fitted means (:func:`residual_scatter`).
    n_heldout : float
        n' > 0, the number of held-out samples M sums over.
    candidates : sequence of float
        Coefficients a.

    Returns
    -------
    ndarray, shape (len(candidates),)
        −inf where C(a) is singular.
    """
    if n_heldout <= 0:
        raise StatsValidationError("the held-out log-likelihood needs at least one held-out sample")
    k = family.eigvals.shape[0]
    m_diag = np.sum(family.basis * (residual @ family.basis), axis=0)  # diag(UᵀMU), BLAS
    out = np.empty(len(candidates))
    for i, a in enumerate(candidates):
        dvals = family.diag(a)
        if np.any(dvals <= 0.0):
            out[i] = -np.inf
            continue
        quad = float(np.sum(m_diag / dvals)) / n_heldout
        logdet = float(np.sum(np.log(dvals))) + family.logdet_q
        out[i] = -0.5 * (k * np.log(2.0 * np.pi) + logdet + quad)
    return out


def heldout_error(
    family: ShrinkageFamily,
    fit_means: F64,
    log_priors: F64,
    heldout_means: F64,
    heldout_counts: NDArray[np.int64],
    heldout_cov: F64,
    candidates: Sequence[float],
) -> F64:
    """Gaussian estimate of the held-out error rate of the linear discriminant on C(a).

    Parameters
    ----------
    family : ShrinkageFamily
        Decomposition of the fitted shared covariance.
    fit_means : ndarray, shape (C, k)
    log_priors : ndarray, shape (C,)
    heldout_means : ndarray, shape (C, k)
    heldout_counts : ndarray of int, shape (C,)
        Classes without held-out samples are skipped.
    heldout_cov : ndarray, shape (k, k)
        Held-out pooled within-class covariance Σ'.
    candidates : sequence of float

    Returns
    -------
    ndarray, shape (len(candidates),)
        Estimated error rates in [0, 1] (1 where C(a) is singular).
    """
    u = family.basis
    mu_hat = fit_means @ u  # (C, k): Uᵀμ_c as rows
    m_hat = heldout_means @ u
    s_hat = u.T @ heldout_cov @ u
    keep = heldout_counts > 0
    weights = heldout_counts[keep] / float(np.sum(heldout_counts[keep]))
    finite_prior = np.isfinite(log_priors)
    out = np.empty(len(candidates))
    for i, a in enumerate(candidates):
        dvals = family.diag(a)
        if np.any(dvals <= 0.0):
            out[i] = 1.0
            continue
        w_hat = mu_hat / dvals  # rows: Uᵀ w_c, since w_c = U D⁻¹ Uᵀ μ_c
        bias = -0.5 * np.sum(w_hat * mu_hat, axis=1) + np.where(finite_prior, log_priors, -1e300)
        mean_score = m_hat[keep] @ w_hat.T + bias  # (C', C): E[s_j] under held-out class c
        gram = w_hat @ s_hat @ w_hat.T  # (C, C)
        g = np.diag(gram)
        rows = np.flatnonzero(keep)
        var = g[rows][:, None] + g[None, :] - 2.0 * gram[rows]
        margin = mean_score[np.arange(rows.size), rows][:, None] - mean_score
        sd = np.sqrt(np.maximum(var, 1e-300))
        pair = ndtr(-margin / sd)
        pair[np.arange(rows.size), rows] = 0.0
        pair[:, ~finite_prior] = 0.0
        class_err = 1.0 - np.exp(np.sum(np.log1p(-np.minimum(pair, 1.0 - 1e-16)), axis=1))
        out[i] = float(weights @ class_err)
    return out


def heldout_qda_error(
    families: dict[int, ShrinkageFamily],
    fit_means: F64,
    log_priors: F64,
    heldout_means: F64,
    heldout_counts: NDArray[np.int64],
    heldout_covs: dict[int, F64],
    candidates: Sequence[float],
) -> F64:
    """Gaussian estimate of the held-out error rate of QDA on the class covariances C_c(a).

    With P_c = C_c(a)⁻¹ and δ_c(x) = −½(x − μ_c)ᵀP_c(x − μ_c) − ½ log det C_c(a) + log π_c,
    the score difference f = δ_h − δ_j is quadratic in x. Under held-out class h with mean m
    and covariance S (treated as Gaussian) it has mean E f = E δ_h − E δ_j,
    E δ_c = −½[tr(P_cS) + (m − μ_c)ᵀP_c(m − μ_c)] − ½ log det C_c(a) + log π_c, and variance
    ½ tr((MS)²) + gᵀSg with M = P_h − P_j and g = P_j(m − μ_j) − P_h(m − μ_h). So
    P(f < 0) ≈ Φ(−E f/sd f), and class h's error is 1 − Π_j (1 − P(f_hj < 0)), weighted by
    its held-out count. Like :func:`heldout_error`, this needs only held-out counts, means and
    second moments.

    Every candidate is read from the generalised eigenbases U_c of the families
    (P_c = U_c diag(1/D_c) U_cᵀ): per pair and call, the UᵀSU products are formed once
    (three k³ products), then each candidate costs O(k²).

    Parameters
    ----------
    families : dict of int to ShrinkageFamily
        The fitted classes (the rivals), each with its basis; all share the metric Q.
    fit_means : ndarray, shape (C, k)
    log_priors : ndarray, shape (C,)
    heldout_means : ndarray, shape (C, k)
    heldout_counts : ndarray of int, shape (C,)
        n'_h, the weights of the scored classes.
    heldout_covs : dict of int to ndarray, shape (k, k)
        Held-out covariance (divisor n'_h) of each scored class; classes missing from it, with
        no held-out sample, or not fitted, are not scored.
    candidates : sequence of float

    Returns
    -------
    ndarray, shape (len(candidates),)
        Estimated error rates in [0, 1] (1 where some C_c(a) is singular).
    """
    rivals = sorted(families)
    scored = [h for h in sorted(heldout_covs) if h in families and heldout_counts[h] > 0]
    out = np.zeros(len(candidates))
    if len(rivals) < 2 or not scored:
        return out
    lp = np.where(np.isfinite(log_priors), log_priors, -1e300)
    dvals = {c: np.stack([families[c].diag(a) for a in candidates]) for c in rivals}
    bad = np.zeros(len(candidates), dtype=bool)
    for c in rivals:
        bad |= np.any(dvals[c] <= 0.0, axis=1)
    inv = {c: 1.0 / np.where(dvals[c] > 0.0, dvals[c], 1.0) for c in rivals}  # (n, k)
    logdet = {c: np.sum(np.log(np.where(dvals[c] > 0.0, dvals[c], 1.0)), axis=1)
              + families[c].logdet_q for c in rivals}
    total = float(sum(int(heldout_counts[h]) for h in scored))
    weight = {h: int(heldout_counts[h]) / total for h in scored}
    for h in scored:
        s = 0.5 * (heldout_covs[h] + heldout_covs[h].T)
        m = heldout_means[h]
        uh = families[h].basis
        sv_h = s @ uh
        a_h = uh.T @ sv_h
        r_h = uh.T @ (m - fit_means[h])  # U_hᵀ(m − μ_h)
        e_h = inv[h]
        p = e_h * r_h  # rows: U_hᵀ P_h (m − μ_h) per candidate
        mean_h = -0.5 * (e_h @ np.diag(a_h) + e_h @ (r_h * r_h)) - 0.5 * logdet[h] + lp[h]
        quad_hh = np.sum((e_h @ (a_h * a_h)) * e_h, axis=1)
        grad_hh = np.sum((p @ a_h) * p, axis=1)
        log_keep = np.zeros(len(candidates))  # Σ_j log(1 − P(f_hj < 0))
        for j in rivals:
            if j == h:
                continue
            uj = families[j].basis
            sv_j = s @ uj
            a_j = uj.T @ sv_j
            x_hj = uh.T @ sv_j  # U_hᵀ S U_j
            r_j = uj.T @ (m - fit_means[j])
            e_j = inv[j]
            q = e_j * r_j
            mean_j = -0.5 * (e_j @ np.diag(a_j) + e_j @ (r_j * r_j)) - 0.5 * logdet[j] + lp[j]
            var = (0.5 * (quad_hh - 2.0 * np.sum((e_h @ (x_hj * x_hj)) * e_j, axis=1)
                          + np.sum((e_j @ (a_j * a_j)) * e_j, axis=1))
                   + grad_hh - 2.0 * np.sum((p @ x_hj) * q, axis=1)
                   + np.sum((q @ a_j) * q, axis=1))
            z = (mean_h - mean_j) / np.sqrt(np.maximum(var, 1e-300))
            log_keep += np.log1p(-np.minimum(ndtr(-z), 1.0 - 1e-16))
        out += weight[h] * (1.0 - np.exp(log_keep))
    out[bad] = 1.0
    return out


def evidence_loglik(family: ShrinkageFamily, n: float, candidates: Sequence[float]) -> F64:
    """Log marginal likelihood of the scatter n·P under an inverse-Wishart prior, per candidate.

    With prior Σ ~ IW(ν, κ·t·Q), ν = k + 1 + κ (prior mean t·Q) and scatter n·P ~ Wishart(n, Σ),
    up to terms free of κ::

        log Γ_k((ν+n)/2) − log Γ_k(ν/2) + (ν/2)·k·log(κt) − ((ν+n)/2)·Σ log(κt + n·w_i)

    The posterior mean is (κtQ + nP)/(κ + n) = C(a) with a = κ/(κ + n), so candidate a maps to
    κ = a·n/(1 − a). a = 0 (κ → 0) and a = 1 are limits; they score −inf.

    Parameters
    ----------
    family : ShrinkageFamily
    n : float
        Degrees of freedom of the scatter (N − C pooled, N_c − 1 per class).
    candidates : sequence of float

    Returns
    -------
    ndarray, shape (len(candidates),)
    """
    k = family.eigvals.shape[0]
    t = family.target
    out = np.full(len(candidates), -np.inf)
    if t <= 0.0 or n <= 0:
        return out
    a = np.asarray(candidates, dtype=np.float64)
    ok = (a > 0.0) & (a < 1.0)
    if not ok.any():
        return out
    kappa = a[ok] * n / (1.0 - a[ok])
    nu = k + 1.0 + kappa
    out[ok] = (
        _multigammaln_diff((nu + n) / 2.0, nu / 2.0, k)
        + 0.5 * nu * k * np.log(kappa * t)
        - 0.5 * (nu + n) * np.sum(np.log(kappa[:, None] * t + n * family.eigvals[None, :]), axis=1)
    )
    return out


def analytic_error(
    family: ShrinkageFamily,
    n: float,
    means: F64,
    counts: NDArray[np.int64],
    log_priors: F64,
    candidates: Sequence[float],
) -> F64:
    """Gaussian estimate of the test error of the linear discriminant on C(a), from the
    fitted moments alone, corrected for the noise in the fitted means and covariance.

    The estimate is that of :func:`heldout_error` with the unknown population quantities
    replaced by random-matrix estimates computed from the spectrum of P (a sample covariance
    with ``n`` degrees of freedom, independent of the class means as for Gaussian classes).
    With H = C(a)⁻¹, λ = a·t/(1 − a) and the effective dimension df(a) = Σ_i w_i/(w_i + λ):

    - tr(HΣ) ≈ df / ((1 − a)(1 − df/n))  (Marchenko–Pastur: (1/k)tr((P + λQ)⁻¹Σ)
      → (df/k)/(1 − df/n));
    - for a vector u independent of P, uᵀHΣHu ≈ uᵀHPHu / (1 − df/n)² (leave-one-out form of
      P = Σ_i x_i x_iᵀ/n);
    - the expected score of class j on a test sample of class c is
      μ̂_jᵀHμ_c + b_j ≈ μ̂_jᵀHμ̂_c + b_j − [j = c]·tr(HΣ)/N_c (the fitted mean μ̂_c of class c
      carries its own noise, of covariance Σ/N_c).

    Shrinking less sharpens the discriminant along low-variance directions but lets the noise
    in the means and in the small eigenvalues through; the estimate weighs the two, so it
    asks for strong shrinkage when n/k is small and for almost none when n/k is large.

    Parameters
    ----------
    family : ShrinkageFamily
        Decomposition of the pooled covariance P (k, k), with its basis.
    n : float
        Degrees of freedom of P (N − C).
    means : ndarray, shape (C, k)
        Fitted class means (in the coordinates of P).
    counts : ndarray of int, shape (C,)
        N_c; classes with no sample are skipped.
    log_priors : ndarray, shape (C,)
    candidates : sequence of float

    Returns
    -------
    ndarray, shape (len(candidates),)
        Estimated error rates in [0, 1] (1 where C(a) is singular or df(a) >= n).
    """
    w = family.eigvals
    keep = counts > 0
    cnt = counts[keep].astype(np.float64)
    mu = means[keep] @ family.basis  # (C', k): rows Uᵀμ̂_c
    lp = np.where(np.isfinite(log_priors[keep]), log_priors[keep], -1e300)
    priors = cnt / float(np.sum(cnt))
    c_num = mu.shape[0]
    diag_idx = np.arange(c_num)
    out = np.ones(len(candidates))
    if c_num < 2:
        return np.zeros(len(candidates))
    for i, a in enumerate(candidates):
        dvals = family.diag(a)
        if np.any(dvals <= 0.0) or a >= 1.0:
            continue
        df = float(np.sum((1.0 - a) * w / dvals))
        if df >= n:
            continue
        inflate = 1.0 / (1.0 - df / n)
        trace_h_sigma = df * inflate / (1.0 - a)
        w_hat = mu / dvals  # rows: Uᵀ H μ̂_c
        gram_h = mu @ w_hat.T  # μ̂_cᵀ H μ̂_j
        score = gram_h + (lp - 0.5 * np.diag(gram_h))[None, :]
        score[diag_idx, diag_idx] -= trace_h_sigma / cnt
        gram = (w_hat * w) @ w_hat.T * inflate**2  # (Hμ̂_c)ᵀ Σ (Hμ̂_j)
        g = np.diag(gram)
        var = g[:, None] + g[None, :] - 2.0 * gram
        margin = np.diag(score)[:, None] - score
        pair = ndtr(-margin / np.sqrt(np.maximum(var, 1e-300)))
        pair[diag_idx, diag_idx] = 0.0
        class_err = 1.0 - np.exp(np.sum(np.log1p(-np.minimum(pair, 1.0 - 1e-16)), axis=1))
        out[i] = float(priors @ class_err)
    return out


def analytic_error_shrinkage(family: ShrinkageFamily, n: float, means: F64,
                             counts: NDArray[np.int64], log_priors: F64) -> float:
    """The coefficient minimising :func:`analytic_error` over a log grid 1e-6 … 0.99, refined
    between the neighbours of the best point (ties go to the smallest coefficient)."""
    grid = [float(v) for v in np.geomspace(1e-6, 0.99, 49)]

    def score(cands: list[float]) -> F64:
        return -analytic_error(family, n, means, counts, log_priors, cands)

    best = argmax_candidate(score(grid), grid)
    fine = refine_grid(best, grid)
    return argmax_candidate(score(fine), fine)


def _multigammaln_diff(x: F64, y: F64, k: int) -> F64:
    """log Γ_k(x) − log Γ_k(y) for arrays x, y of shape (m,), vectorised over the k terms.

    log Γ_k(a) = k(k−1)/4·log π + Σ_{j<k} log Γ(a − j/2); the constant cancels in the difference.
    """
    half = np.arange(k, dtype=np.float64) / 2.0
    diff: F64 = np.sum(gammaln(x[:, None] - half) - gammaln(y[:, None] - half), axis=1)
    return diff


def refine_grid(best: float, candidates: Sequence[float]) -> list[float]:
    """Eight log-spaced points between the neighbours of ``best`` in ``candidates``."""
    grid = sorted(candidates)
    i = grid.index(best)
    lo = grid[i - 1] if i > 0 else best
    hi = grid[i + 1] if i + 1 < len(grid) else best
    if lo <= 0.0:
        lo = best / 10.0 if best > 0 else 0.0
    if lo <= 0.0 or hi <= lo:
        return [best]
    return [float(v) for v in np.geomspace(lo, hi, 9)]


def argmax_candidate(scores: F64, candidates: Sequence[float]) -> float:
    """The candidate with the highest score; ties go to the smallest coefficient."""
    if not np.any(np.isfinite(scores)):
        raise StatsValidationError(
            "no shrinkage candidate gives a usable covariance (all scores are infinite); the "
            "statistics are degenerate: check that the classes hold more than one sample"
        )
    best = float(np.max(scores[np.isfinite(scores)]))
    idx = [i for i, s in enumerate(scores) if np.isfinite(s) and s >= best]
    return float(min(candidates[i] for i in idx))


def evidence_shrinkage(cov: F64, n: float, metric: F64 | None = None,
                       target: float | None = None) -> float:
    """Empirical-Bayes shrinkage coefficient (maximum inverse-Wishart evidence) from moments.

    Parameters
    ----------
    cov : ndarray, shape (k, k)
        Covariance P = scatter / n.
    n : float
        Degrees of freedom of the scatter.
    metric : ndarray, shape (k, k), optional
        Q (default identity).
    target : float, optional
        t (default tr(P)/k).

    Returns
    -------
    float in (0, 1)
    """
    k = cov.shape[0]
    t = float(np.trace(cov)) / k if target is None else target
    fam = shrinkage_family(cov, t, metric)
    return _evidence_choice(fam, n)


def _evidence_choice(fam: ShrinkageFamily, n: float) -> float:
    if fam.target <= 0.0 or n <= 0:
        return 1.0
    grid = [float(v) for v in np.geomspace(1e-6, 0.99, 49)]
    scores = evidence_loglik(fam, n, grid)
    best = argmax_candidate(scores, grid)
    fine = refine_grid(best, grid)
    return argmax_candidate(evidence_loglik(fam, n, fine), fine)


def rescale_for_total(a: float, n_fit: float, n_total: float) -> float:
    """Carry a coefficient chosen on ``n_fit`` samples over to the full ``n_total``.

    The prior strength κ = a·n_fit/(1 − a) (samples' worth of the target, see
    :func:`evidence_loglik`) is kept: a_total = κ/(κ + n_total).
    """
    if not 0.0 < a < 1.0 or n_fit <= 0 or n_total <= 0:
        return a
    kappa = a * n_fit / (1.0 - a)
    return float(kappa / (kappa + n_total))


def check_criterion(value: object) -> str:
    """Validate a held-out criterion name: ``"loglik"`` or ``"error"``."""
    if value not in ("loglik", "error"):
        raise ConfigError(
            f"the held-out shrinkage criterion must be 'loglik' or 'error'; got {value!r}"
        )
    return str(value)


# ---------------------------------------------------------------------- from Moments
@dataclass(frozen=True)
class ShrinkageChoice:
    """A resolved coefficient and how it was obtained.

    Attributes
    ----------
    value : float
        The coefficient a in [0, 1] to use on the covariance of the full statistics.
    method : str
        ``"fixed"`` (given as a number), ``"oas"``, ``"rblw"``, ``"evidence"`` (analytic, from
        the covariance alone), ``"analytic-error"`` (:func:`analytic_error`, from the pooled
        covariance and the class means), or ``"heldout-loglik"`` / ``"heldout-error"`` (chosen
        on the held-out part of the statistics with that criterion).
    """

    value: float
    method: str


#: Held-out criterion of the pooled covariance, chosen from benchmarks/bench_defaults.py: the
#: held-out log-likelihood under-shrinks when n/d is small (CIFAR-10 at 300 images per class:
#: 1 point below the best fixed coefficient), the held-out error estimate does not.
POOLED_CRITERION = "error"
#: Held-out criterion of QDA's ``"auto"``/``"heldout"``: ``"error"`` (:func:`heldout_qda_error`)
#: or ``"loglik"`` (:func:`heldout_loglik` summed over the classes). On sentence embeddings the
#: log-likelihood under-shrinks for classification (BENCHMARKS.md, "Data-driven shrinkage
#: defaults"); the error estimate sees that the class covariances' differences do not hold up
#: on held-out data.
QDA_CRITERION = "error"
#: The QDA error criterion costs about 3·C²·k³ flops per fit (every class pair), against
#: C·k³ for the log-likelihood; with more classes than this the log-likelihood is used.
QDA_ERROR_MAX_CLASSES = 32
#: Analytic criterion of ``"auto"`` for the pooled covariance when the statistics hold no
#: held-out part: ``"error"`` (:func:`analytic_error`) or ``"evidence"``.
POOLED_ANALYTIC = "error"
#: Whether a coefficient chosen on the fitting part is carried over to the full counts with
#: :func:`rescale_for_total` (keeping the prior strength κ in samples).
RESCALE_TO_TOTAL = True


def holdout_parts(moments: Moments) -> tuple[Moments, Moments] | None:
    """``(fitting part, held-out part)`` when the statistics carry a held-out upload, else None.

    Uses ``Moments.validation_split()`` when the statistics layer provides it.
    """
    split = getattr(moments, "validation_split", None)
    if split is None or not callable(split):
        return None
    parts = split()
    if parts is None:
        return None
    fit, held = parts
    return fit, held


#: Directions of the total covariance with variance below this fraction of the largest one
#: are outside the support of the data (e.g. embeddings confined to a subspace): they carry no
#: held-out information and would reward vanishing shrinkage, so criteria ignore them.
SUPPORT_RTOL = 1e-12


def support_basis(moments: Moments) -> F64 | None:
    """Orthonormal basis (d, r) of the support of the data, or None when it is the whole space.

    The eigenvectors of the total covariance whose eigenvalue exceeds
    :data:`SUPPORT_RTOL` times the largest.
    """
    if moments.total_scatter is None:
        return None
    w, u = eigh(0.5 * (moments.total_scatter + moments.total_scatter.T), check_finite=False)
    keep = w > SUPPORT_RTOL * max(float(w[-1]), 0.0)
    if np.all(keep) or not np.any(keep):
        return None
    out: F64 = u[:, keep]
    return out


def _project(m: F64, basis: F64 | None) -> F64:
    if basis is None:
        return m
    out: F64 = basis.T @ m @ basis
    return 0.5 * (out + out.T)


def _rows(m: F64, basis: F64 | None) -> F64:
    return m if basis is None else m @ basis


def _dof_pooled(m: Moments, divisor: str) -> float:
    return float(m.n_samples - m.num_classes if divisor == "n-c" else m.n_samples)


def _no_holdout_error(rule: str) -> StatsValidationError:
    return StatsValidationError(
        f"shrinkage {rule!r} needs statistics with a held-out part, and these have none; "
        "recompute the client statistics with a holdout fraction (e.g. --holdout 0.2), or use "
        "'auto' (which falls back to an analytic rule)"
    )


def _analytic(
    rule: str, cov: F64, n: float, basis: F64 | None, mle: F64, n_mle: float
) -> ShrinkageChoice:
    """An analytic rule: the evidence on ``cov`` (d, d, unbiased with ``n`` degrees of
    freedom), OAS / RBLW on the maximum-likelihood ``mle`` of ``n_mle`` samples (the
    conventions ghofl's ``"auto"`` used before: N − C samples pooled, N_c per class)."""
    name = ANALYTIC_DEFAULT if rule in ("auto", "heldout") else rule
    if name == "evidence" and basis is not None:
        d = cov.shape[0]
        a = evidence_shrinkage(_project(cov, basis), n, metric=basis.T @ basis,
                               target=max(float(np.trace(cov)), 0.0) / d)
        return ShrinkageChoice(a, name)
    if name == "evidence":
        return ShrinkageChoice(evidence_shrinkage(cov, n), name)
    return ShrinkageChoice(resolve_shrinkage(name, mle, n_mle), name)  # type: ignore[arg-type]


def choose_pooled_shrinkage(
    moments: Moments,
    shrinkage: Shrinkage,
    *,
    divisor: str = "n-c",
    basis: F64 | None = None,
    criterion: str | None = None,
) -> ShrinkageChoice:
    """The coefficient a for shrink(Σ_pool, a) (LDA, the Fisher S_W, pooled synthesis).

    Parameters
    ----------
    moments : Moments
        Needs a pooled covariance (upload mode ``pooled`` or ``full``).
    shrinkage : float or rule
        A float is returned unchanged; see :mod:`ghofl.moments.shrinkage` for the rules.
        ``"auto"``: the held-out criterion when the statistics carry a held-out part, else
        :func:`analytic_error` (:data:`POOLED_ANALYTIC`).
    divisor : {"n-c", "n"}
        The divisor of the within-class scatter the head uses.
    basis : ndarray, shape (d, k), optional
        Score the candidates on Vᵀ shrink(Σ_pool, a) V (a covariance in a subspace).
    criterion : {"loglik", "error"}, optional
        Held-out criterion (default :data:`POOLED_CRITERION`).

    Returns
    -------
    ShrinkageChoice
    """
    rule = check_shrinkage("shrinkage", shrinkage)
    if not isinstance(rule, str):
        return ShrinkageChoice(float(rule), "fixed")
    parts = holdout_parts(moments) if rule in ("auto", "heldout") else None
    if basis is None and rule not in ("oas", "rblw"):
        basis = support_basis(moments)
    if parts is None:
        if rule == "heldout":
            raise _no_holdout_error(rule)
        if rule == "auto" and POOLED_ANALYTIC == "error":
            return ShrinkageChoice(_pooled_error_choice(moments, basis), "analytic-error")
        return _analytic(rule, moments.pooled_covariance("n-c"), _dof_pooled(moments, "n-c"),
                         basis, moments.pooled_covariance("n"), _dof_pooled(moments, "n-c"))
    crit = check_criterion(criterion or POOLED_CRITERION)
    fit, held = parts
    cov = fit.pooled_covariance(divisor)
    d = cov.shape[0]
    tau = max(float(np.trace(cov)), 0.0) / d
    fam = shrinkage_family(_project(cov, basis), tau,
                           None if basis is None else basis.T @ basis)
    fit_means = _rows(fit.means, basis)
    held_means = _rows(held.means, basis)
    held_w = held._require_scatter(held.within_scatter, "held-out shrinkage selection")
    grid = list(CANDIDATES)

    def score(cands: list[float]) -> F64:
        if crit == "loglik":
            m = residual_scatter(fit_means, held_means, held.counts, _project(held_w, basis))
            return heldout_loglik(fam, m, float(held.n_samples), cands)
        dof = max(held.n_samples - int(np.sum(held.counts > 0)), 1)
        return -heldout_error(fam, fit_means, np.log(np.maximum(fit.priors, 1e-300)),
                              held_means, held.counts, _project(held_w, basis) / dof, cands)

    best = argmax_candidate(score(grid), grid)
    fine = refine_grid(best, grid)
    best = argmax_candidate(score(fine), fine)
    if RESCALE_TO_TOTAL:
        best = rescale_for_total(best, _dof_pooled(fit, divisor), _dof_pooled(moments, divisor))
    return ShrinkageChoice(best, f"heldout-{crit}")


def _pooled_error_choice(moments: Moments, basis: F64 | None) -> float:
    """:func:`analytic_error_shrinkage` on the pooled (N − C) covariance of ``moments``."""
    n = _dof_pooled(moments, "n-c")
    if n <= 0:
        return 1.0
    cov = moments.pooled_covariance("n-c")
    tau = max(float(np.trace(cov)), 0.0) / cov.shape[0]
    if tau <= 0.0:
        return 1.0
    fam = shrinkage_family(_project(cov, basis), tau, None if basis is None else basis.T @ basis)
    return analytic_error_shrinkage(fam, n, _rows(moments.means, basis), moments.counts,
                                    np.log(np.maximum(moments.priors, 1e-300)))


def _class_scatter(m: Moments, c: int) -> F64:
    s = m.stats.class_scatter
    if s is None:
        m.class_covariance(c)  # raises the standard UnsupportedModeError
        raise AssertionError("unreachable")  # pragma: no cover
    mu = m.means[c]
    out: F64 = s[c] - int(m.counts[c]) * np.outer(mu, mu)
    return 0.5 * (out + out.T)


def choose_class_shrinkage(
    moments: Moments,
    c: int,
    shrinkage: Shrinkage,
    *,
    divisor: str = "n-1",
    basis: F64 | None = None,
    target: str = "scaled_identity",
) -> ShrinkageChoice:
    """The coefficient a_c for shrink(Σ_c, a_c) (QDA, per-class synthesis); needs mode ``full``.

    Held-out choice maximises the held-out log-likelihood of class c's held-out samples; a class
    with no held-out sample (or fewer than 2 fitting samples) falls back to the analytic rule.

    Parameters
    ----------
    moments : Moments
    c : int
        Class index.
    shrinkage : float or rule
    divisor : {"n-1", "n"}
    basis : ndarray, shape (d, k), optional
    target : {"scaled_identity", "identity"}
        The shrinkage target of :func:`ghofl.moments.shrinkage.shrink` (held-out scoring).

    Returns
    -------
    ShrinkageChoice
    """
    rule = check_shrinkage("shrinkage", shrinkage)
    if not isinstance(rule, str):
        return ShrinkageChoice(float(rule), "fixed")
    parts = holdout_parts(moments) if rule in ("auto", "heldout") else None
    if rule == "heldout" and parts is None:
        raise _no_holdout_error(rule)
    if parts is not None:
        fit, held = parts
        n_fit, n_held = int(fit.counts[c]), int(held.counts[c])
        if n_fit >= 2 and n_held >= 1:
            cov = fit.class_covariance(c, divisor)
            d = cov.shape[0]
            t = max(float(np.trace(cov)), 0.0) / d if target == "scaled_identity" else 1.0
            fam = shrinkage_family(_project(cov, basis), t,
                                   None if basis is None else basis.T @ basis)
            m = residual_scatter(_rows(fit.means[c:c + 1], basis),
                                 _rows(held.means[c:c + 1], basis), held.counts[c:c + 1],
                                 _project(_class_scatter(held, c), basis))
            grid = list(CANDIDATES)
            best = argmax_candidate(heldout_loglik(fam, m, float(n_held), grid), grid)
            fine = refine_grid(best, grid)
            best = argmax_candidate(heldout_loglik(fam, m, float(n_held), fine), fine)
            if RESCALE_TO_TOTAL:
                dof = 1 if divisor == "n-1" else 0
                best = rescale_for_total(best, n_fit - dof, int(moments.counts[c]) - dof)
            return ShrinkageChoice(best, "heldout-loglik")
    n_c = int(moments.counts[c])
    if n_c < 2:
        return ShrinkageChoice(1.0, "single-sample")
    return _analytic(rule, moments.class_covariance(c, "n-1"), float(n_c - 1), basis,
                     moments.class_covariance(c, "n"), float(n_c))


def pooled_center(moments: Moments, shrinkage: Shrinkage = "auto") -> F64:
    """The centre of QDA's ``"pooled"`` target: shrink(Σ_pool, a), the covariance of the
    default LDA (a from :func:`choose_pooled_shrinkage`, N − C divisor).

    Returns
    -------
    ndarray, shape (d, d), symmetric positive definite whenever a > 0 or Σ_pool is.
    """
    a = choose_pooled_shrinkage(moments, shrinkage).value
    return shrink(moments.pooled_covariance("n-c"), a)


def center_scale(cov: F64, center: F64) -> float:
    """t = tr(B⁻¹Σ)/d: the multiple of the centre B closest to Σ (its mean generalised
    eigenvalue), so that t·B has the scale of Σ.

    Parameters
    ----------
    cov : ndarray, shape (k, k)
    center : ndarray, shape (k, k), positive definite

    Returns
    -------
    float >= 0
    """
    L = cholesky(0.5 * (center + center.T), lower=True, check_finite=False)
    half = solve_triangular(L, 0.5 * (cov + cov.T), lower=True, check_finite=False)
    w = solve_triangular(L, half.T, lower=True, check_finite=False)
    return float(max(float(np.trace(w)), 0.0) / cov.shape[0])


def _class_family(
    fit: Moments, c: int, divisor: str, basis: F64 | None, target: str,
    center: F64 | None = None,
) -> ShrinkageFamily:
    cov = fit.class_covariance(c, divisor)
    d = cov.shape[0]
    if target == "pooled":
        if center is None:
            raise ValueError("the 'pooled' target needs its centre")
        q = _project(center, basis)
        # the scale over the full dimension d, as the head applies it (module docstring)
        t = center_scale(_project(cov, basis), q) * q.shape[0] / d
        return shrinkage_family(_project(cov, basis), t, q)
    t = max(float(np.trace(cov)), 0.0) / d if target == "scaled_identity" else 1.0
    return shrinkage_family(_project(cov, basis), t, None if basis is None else basis.T @ basis)


def choose_qda_shrinkage(
    moments: Moments,
    shrinkage: Shrinkage,
    *,
    divisor: str = "n-1",
    target: str = "scaled_identity",
    pooled_shrinkage: Shrinkage = "auto",
) -> tuple[list[float], str]:
    """One coefficient for every class of QDA (per class only for ``"oas"``/``"rblw"``).

    A single a keeps the classes' log-determinants comparable (per-class coefficients add a
    class bias Σ log(a_c·t_c) in every weakly estimated direction). ``"auto"``/``"heldout"``
    with a held-out part minimise the held-out error estimate of :func:`heldout_qda_error`
    (:data:`QDA_CRITERION`; the held-out log-likelihood summed over all held-out samples with
    ``"loglik"`` or above :data:`QDA_ERROR_MAX_CLASSES` classes);
    ``"auto"``/``"evidence"`` without one maximise the summed evidence of the class scatters.
    Criteria are evaluated on the support of the data (:func:`support_basis`).

    Parameters
    ----------
    moments : Moments
        Mode ``full``.
    shrinkage : float or rule
    divisor : {"n-1", "n"}
    target : {"scaled_identity", "identity", "pooled"}
        ``"pooled"``: candidates (1 − a)Σ_c + a·t_c·B, B = :func:`pooled_center`, t_c =
        :func:`center_scale`; the held-out part is scored against the centre of its fitting
        part.
    pooled_shrinkage : float or rule, default "auto"
        The shrinkage of B (``"pooled"`` target only).

    Returns
    -------
    (list of float of length C, str)
        The coefficients and how they were chosen.
    """
    rule = check_shrinkage("shrinkage", shrinkage)
    c_num = moments.num_classes
    if not isinstance(rule, str):
        return [float(rule)] * c_num, "fixed"
    if rule in ("oas", "rblw") and target == "pooled":
        raise ConfigError(
            f"shrinkage {rule!r} is defined for a multiple of the identity as target, not the "
            "pooled covariance; use shrinkage_target='scaled_identity' with it, or 'auto'"
        )
    if rule in ("oas", "rblw"):
        choices = [choose_class_shrinkage(moments, c, rule) for c in range(c_num)]
        return [ch.value for ch in choices], rule
    parts = holdout_parts(moments) if rule in ("auto", "heldout") else None
    if rule == "heldout" and parts is None:
        raise _no_holdout_error(rule)
    support = support_basis(moments)
    grid = list(CANDIDATES[1:])  # a = 0 is singular for any class with N_c <= d
    if parts is not None:
        fit, held = parts
        usable = [c for c in range(c_num) if fit.counts[c] >= 2 and held.counts[c] >= 1]
        if usable:
            center = None
            if target == "pooled":
                fit_rule = "auto" if pooled_shrinkage in ("auto", "heldout") else pooled_shrinkage
                center = pooled_center(fit, fit_rule)
            rivals = [c for c in range(c_num) if fit.counts[c] >= 2]
            crit = QDA_CRITERION if len(rivals) <= QDA_ERROR_MAX_CLASSES else "loglik"
            fams = {c: _class_family(fit, c, divisor, support, target, center) for c in
                    (rivals if crit == "error" else usable)}
            resid = {
                c: residual_scatter(_rows(fit.means[c:c + 1], support),
                                    _rows(held.means[c:c + 1], support), held.counts[c:c + 1],
                                    _project(_class_scatter(held, c), support))
                for c in usable
            }

            def loglik(cands: list[float]) -> F64:
                out = np.zeros(len(cands))
                for c in usable:
                    n_h = float(held.counts[c])
                    out += n_h * heldout_loglik(fams[c], resid[c], n_h, cands)
                return out

            if crit == "error":  # the held-out side of the estimate, shared by both passes
                fit_means = _rows(fit.means, support)
                fit_log_priors = np.log(np.maximum(fit.priors, 1e-300))
                held_means = _rows(held.means, support)
                held_covs = {c: _project(_class_scatter(held, c), support)
                             / float(held.counts[c]) for c in usable}

            def choose(cands: list[float]) -> float:
                if crit == "loglik":
                    return argmax_candidate(loglik(cands), cands)
                score = -heldout_qda_error(fams, fit_means, fit_log_priors, held_means,
                                           held.counts, held_covs, cands)
                # equal estimated errors (e.g. all 0 on well separated classes): the
                # log-likelihood decides among them
                tied = [a for a, v in zip(cands, score, strict=True)
                        if np.isfinite(v) and v >= np.max(score)]
                if len(tied) > 1:
                    return argmax_candidate(loglik(tied), tied)
                return argmax_candidate(score, cands)

            best = choose(grid)
            best = choose(refine_grid(best, grid))
            if RESCALE_TO_TOTAL:
                best = rescale_for_total(best, float(fit.n_samples), float(moments.n_samples))
            return [best] * c_num, f"heldout-{crit}"
    usable = [c for c in range(c_num) if moments.counts[c] >= 2]
    if not usable:
        return [1.0] * c_num, "single-sample"
    center = pooled_center(moments, pooled_shrinkage) if target == "pooled" else None
    fams = {c: _class_family(moments, c, "n-1", support, target, center) for c in usable}

    def evidence(cands: list[float]) -> F64:
        out = np.zeros(len(cands))
        for c in usable:
            out += evidence_loglik(fams[c], float(moments.counts[c] - 1), cands)
        return out

    grid = [float(v) for v in np.geomspace(1e-6, 0.99, 49)]
    best = argmax_candidate(evidence(grid), grid)
    fine = refine_grid(best, grid)
    return [argmax_candidate(evidence(fine), fine)] * c_num, "evidence"


__all__ = [
    "CANDIDATES",
    "POOLED_ANALYTIC",
    "POOLED_CRITERION",
    "QDA_CRITERION",
    "QDA_ERROR_MAX_CLASSES",
    "SUPPORT_RTOL",
    "ShrinkageChoice",
    "ShrinkageFamily",
    "analytic_error",
    "analytic_error_shrinkage",
    "argmax_candidate",
    "center_scale",
    "check_criterion",
    "choose_class_shrinkage",
    "choose_pooled_shrinkage",
    "choose_qda_shrinkage",
    "evidence_loglik",
    "evidence_shrinkage",
    "heldout_error",
    "heldout_loglik",
    "heldout_qda_error",
    "holdout_parts",
    "pooled_center",
    "refine_grid",
    "rescale_for_total",
    "residual_scatter",
    "shrinkage_family",
    "support_basis",
]
