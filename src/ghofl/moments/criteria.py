"""Pure shrinkage criteria: scores of the candidates C(a) = (1 − a)·P + a·t·Q.

Each criterion scores shrinkage coefficients from moments alone (held-out log-likelihood, held-out
error estimates of the linear and quadratic rules, the analytic error estimate and the
inverse-Wishart evidence); the policy that picks among them is :mod:`ghofl.moments.selection`,
whose module docstring derives the criteria.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np
from numpy.typing import NDArray
from scipy.linalg import eigh
from scipy.special import gammaln, ndtr

from ghofl.errors import StatsValidationError
from ghofl.moments.noise import ReleaseNoise as ReleaseNoise
from ghofl.moments.noise import release_noise as release_noise

F64 = NDArray[np.float64]

#: Candidate coefficients scored by the held-out and evidence criteria: 0, then 4 per decade
#: from 1e-5 to 0.3, then 0.5 and 0.9 (the hindsight grid 0, 0.01, ..., 0.3 included).
SHRINKAGE_CANDIDATES: tuple[float, ...] = tuple(
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
    max_df: float = 1.0,
) -> F64:
    """Gaussian estimate of the test error of the linear discriminant on C(a).

    From the fitted moments alone, corrected for the noise in the fitted means and covariance.

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
    max_df : float in (0, 1], default 1.0
        Candidates with df(a) ≥ max_df·n are not trusted (error 1): the corrections grow as
        1/(1 − df/n) and are first-order only. Estimated covariances of few degrees of freedom
        (n < k, e.g. FedCOF's) use 1/2: near df = n they mistake the noise-free null space of
        the estimate for a direction the data does not vary along.

    Returns
    -------
    ndarray, shape (len(candidates),)
        Estimated error rates in [0, 1] (1 where C(a) is singular or df(a) >= max_df·n).
    """
    keep = counts > 0
    mu = means[keep] @ family.basis  # (C', k): rows Uᵀμ̂_c
    return analytic_error_grams(family, basis_grams(family, mu), n, counts, log_priors,
                                candidates, max_df)


def basis_grams(family: ShrinkageFamily, mu: F64) -> Callable[[float, F64], tuple[F64, F64]]:
    """The grams of :func:`analytic_error_grams` from the eigenbasis of the family.

    ``mu`` (m, k): the vectors in the eigenbasis, rows Uᵀμ_c. For a candidate with eigenvalues
    D: (μ_cᵀ H μ_j) and (μ_cᵀ H P H μ_j), H = C(a)⁻¹, both (m, m).
    """

    def grams(a: float, dvals: F64) -> tuple[F64, F64]:
        w_hat = mu / dvals  # rows: Uᵀ H μ̂_c
        return mu @ w_hat.T, (w_hat * family.eigvals) @ w_hat.T

    return grams


def analytic_error_grams(
    family: ShrinkageFamily,
    grams: Callable[[float, F64], tuple[F64, F64]],
    n: float,
    counts: NDArray[np.int64],
    log_priors: F64,
    candidates: Sequence[float],
    max_df: float = 1.0,
    noise: ReleaseNoise | None = None,
) -> F64:
    """:func:`analytic_error` given how to form the candidates' grams of the class means.

    With the ``noise`` of a differentially private release, P = P_s + E: P_s the sample
    covariance, E symmetric Gaussian noise of variance s² = ν²/2 off the diagonal. Gaussian
    integration by parts gives E[E·H̃] ≈ −s²·tr(H̃)·H̃ for H̃ = (P + λ)⁻¹ (λ = a·t/(1 − a)),
    so H̃ acts as (P_s + λ_e)⁻¹ with the smaller ridge λ_e = λ − s²·tr H̃, and the effective
    dimension the corrections above read is that of P_s at λ_e, df + s²·(tr H̃)²: it grows
    with the noise where the small eigenvalues of P are noise, which asks for more shrinkage.
    The fitted mean μ̂_c carries the noise variance v_c on each coordinate besides its sampling
    noise: the expected own-class score loses tr(H)·v_c as well as tr(HΣ)/N_c. Without noise
    this is the criterion of exact statistics, unchanged.

    Parameters
    ----------
    family : ShrinkageFamily
        Its eigenvalues and target (the basis is not read).
    grams : callable
        ``grams(a, D)`` → ((μ̂_cᵀ H μ̂_j), (μ̂_cᵀ H P H μ̂_j)), both (C', C') over the classes
        with samples (:func:`basis_grams`, or
        :func:`ghofl.moments.spectral.tridiagonal_grams`).
    n, counts, log_priors, candidates, max_df
        As :func:`analytic_error`.
    noise : ReleaseNoise, optional
        The public noise of the release the moments come from.

    Returns
    -------
    ndarray, shape (len(candidates),)
    """
    w = family.eigvals
    keep = counts > 0
    s2 = 0.0 if noise is None else 0.5 * noise.entry_var
    mean_var = np.zeros(int(np.sum(keep))) if noise is None else noise.mean_var[keep]
    cnt = counts[keep].astype(np.float64)
    lp = np.where(np.isfinite(log_priors[keep]), log_priors[keep], -1e300)
    priors = cnt / float(np.sum(cnt))
    c_num = cnt.shape[0]
    diag_idx = np.arange(c_num)
    out = np.ones(len(candidates))
    if c_num < 2:
        return np.zeros(len(candidates))
    for i, a in enumerate(candidates):
        dvals = family.diag(a)
        if np.any(dvals <= 0.0) or a >= 1.0:
            continue
        df = float(np.sum((1.0 - a) * w / dvals))
        tr_h = float(np.sum(1.0 / dvals)) if noise is not None else 0.0
        if s2 > 0.0:  # the release noise (see the docstring)
            df += s2 * ((1.0 - a) * tr_h) ** 2
        if df >= max_df * n:
            continue
        inflate = 1.0 / (1.0 - df / n)
        trace_h_sigma = df * inflate / (1.0 - a)
        gram_h, gram_p = grams(a, dvals)  # μ̂_cᵀ H μ̂_j, (Hμ̂_c)ᵀ P (Hμ̂_j)
        score = gram_h + (lp - 0.5 * np.diag(gram_h))[None, :]
        score[diag_idx, diag_idx] -= trace_h_sigma / cnt
        if noise is not None:
            score[diag_idx, diag_idx] -= tr_h * mean_var
        gram = gram_p * inflate**2  # (Hμ̂_c)ᵀ Σ (Hμ̂_j)
        g = np.diag(gram)
        var = g[:, None] + g[None, :] - 2.0 * gram
        margin = np.diag(score)[:, None] - score
        pair = ndtr(-margin / np.sqrt(np.maximum(var, 1e-300)))
        pair[diag_idx, diag_idx] = 0.0
        class_err = 1.0 - np.exp(np.sum(np.log1p(-np.minimum(pair, 1.0 - 1e-16)), axis=1))
        out[i] = float(priors @ class_err)
    return out


#: The analytic error's coarse grid: 49 log-spaced points from 1e-6 to 0.99.
ANALYTIC_GRID: tuple[float, ...] = tuple(float(v) for v in np.geomspace(1e-6, 0.99, 49))


def analytic_error_shrinkage(family: ShrinkageFamily, n: float, means: F64,
                             counts: NDArray[np.int64], log_priors: F64,
                             max_df: float = 1.0,
                             grams: Callable[[float, F64], tuple[F64, F64]] | None = None,
                             noise: ReleaseNoise | None = None) -> float:
    """The coefficient minimising :func:`analytic_error` over :data:`ANALYTIC_GRID`.

    Refined between the neighbours of the best point (ties go to the smallest coefficient).
    With ``max_df < 1`` or a release ``noise``, when no candidate is trusted the largest one
    is returned. ``grams`` (see :func:`analytic_error_grams`) replaces the family's basis,
    which is then not read; ``noise`` as in :func:`analytic_error_grams`.
    """
    grid = list(ANALYTIC_GRID)
    if grams is None:
        grams = basis_grams(family, means[counts > 0] @ family.basis)

    def score(cands: list[float]) -> F64:
        return -analytic_error_grams(family, grams, n, counts, log_priors, cands, max_df,
                                     noise)

    first = score(grid)
    if (max_df < 1.0 or noise is not None) and np.all(first <= -1.0):
        return grid[-1]
    best = argmax_candidate(first, grid)
    fine = refine_grid(best, grid)
    return argmax_candidate(score(fine), fine)


def _multigammaln_diff(x: F64, y: F64, k: int) -> F64:
    """The difference log Γ_k(x) − log Γ_k(y) for arrays x, y of shape (m,).

    Vectorised over the k terms of log Γ_k(a) = k(k−1)/4·log π + Σ_{j<k} log Γ(a − j/2); the
    constant cancels in the difference.
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


#: The evidence criteria's coarse grid: 49 log-spaced points from 1e-6 to 0.99.
EVIDENCE_GRID: tuple[float, ...] = tuple(float(v) for v in np.geomspace(1e-6, 0.99, 49))


def by_score(score: Callable[[list[float]], F64]) -> Callable[[list[float]], float]:
    """A picker: the candidate of highest ``score`` (ties as in :func:`argmax_candidate`)."""
    return lambda cands: argmax_candidate(score(cands), cands)


def search_grid(pick: Callable[[list[float]], float], grid: Sequence[float]) -> float:
    """The two-pass grid search of every criterion.

    ``pick`` on ``grid``, then on the refined grid around its choice (:func:`refine_grid`).
    """
    best = pick(list(grid))
    return pick(refine_grid(best, list(grid)))


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
    return search_grid(by_score(lambda cands: evidence_loglik(fam, n, cands)), EVIDENCE_GRID)


