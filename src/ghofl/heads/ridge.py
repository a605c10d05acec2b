"""Ridge: the closed-form least-squares (ridge regression) classifier from pooled moments.

A linear map is regressed onto one-hot targets y ∈ {0, 1}^C. Everything the normal equations
need is in a ``pooled`` (or ``full``) upload: with N_c, A_c = Σ_{y=c} x and B = Σ xxᵀ,

    m = Σ_c A_c / N,   Σ_tot = (B − N m mᵀ) / (N − 1),   π_c = N_c / N,
    G = Σ_i (x_i − m)(y_i − π)ᵀ,   column c of G = A_c − N_c m          (d, C)
    ((1 − a) Σ_tot + a τ I) W = (1 − a) G / (N − 1),   τ = tr(Σ_tot)/d,   b = π − Wᵀ m,

which is exactly scikit-learn's ``Ridge(alpha=λ)`` on one-hot targets with
λ = a τ (N − 1)/(1 − a): the penalty is written as a shrinkage a ∈ [0, 1) of the total
covariance (the scaled-identity target of :func:`ghofl.moments.shrinkage.shrink`), so it is
scale-free. Scores s(x) = Wᵀx + b estimate the class posteriors
linearly; they become log-probabilities through a temperature T: log p = s/T − logsumexp(s/T).

Choosing a (``alpha="auto"``): when the statistics carry a held-out part
(:meth:`Moments.validation_split <ghofl.moments.Moments.validation_split>`), every candidate a
is fitted on the fitting part and scored by its held-out squared error, which is a quadratic
function of the held-out moments::

    Σ_held ‖y − π_F − Wᵀ(x − m_F)‖² = c₀ − 2 tr(Wᵀ P) + tr(Wᵀ Q W),
    Q = T_H + n_H δ δᵀ,   P = A_Hᵀ − m_F N_Hᵀ − n_H δ π_Fᵀ,   δ = m_H − m_F,
    c₀ = n_H − 2 N_H·π_F + n_H ‖π_F‖²

(T_H: held-out scatter around its mean m_H); the minimiser is then refitted on the total.
Without a held-out part ``"auto"`` minimises generalised cross-validation (Golub, Heath and
Wahba, 1979), which needs only the moments of the total: with Σ_tot = U diag(w) Uᵀ and
λ = a τ/(1 − a), the training residual and the degrees of freedom are

    RSS = n(1 − ‖π‖²) − 2(N − 1) Σ_j s_j ‖g_j‖² + (N − 1) Σ_j w_j s_j² ‖g_j‖²,
    df = Σ_j w_j s_j,   s_j = 1/(w_j + λ),   g = Uᵀ G/(N − 1),
    GCV(a) = (RSS/N) / (1 − (df + 1)/N)²

(the +1 counts the intercept). For estimated second moments
(:class:`~ghofl.moments.estimated.EstimatedStats`, e.g. FedCOF's from client means) the
scatter is worth far fewer than N samples: the denominator's N becomes ν + C (ν the degrees
of freedom of the estimated within-class scatter, :meth:`Moments.pooled_dof
<ghofl.moments.core.Moments.pooled_dof>`), so the criterion penalises the effective
dimension against the information the estimate holds.

On the statistics of a differentially private release
(:class:`~ghofl.stats.release.NoisyStats`) the criterion also weighs the public noise of the
release (:func:`~ghofl.moments.noise.total_release_noise`), scoring the noisy fit
W = H g, H = (Σ_tot + λ)⁻¹, by the residual and degrees of freedom of the noise-free moments
(Σ_s, g_s):

* the class sums carry Gaussian noise e_c of variance v_c per coordinate into g, and into
  Σ_tot through its between-class part (N − 1) Σ_c g_c g_cᵀ/N_c; Gaussian integration by
  parts gives E[tr(Wᵀ e)] = Σ_c v_c·δ_c exactly, with the divergence
  δ_c = tr(H)(1 − (N − 1) q_c/N_c) − (N − 1)‖W_c‖²/N_c, q_c = g_cᵀ H g_c, W_c = H g_c;
* the second moments' noise, of standard deviation ν on the diagonal of Σ_tot, spreads its
  spectrum down to about the edge e = ν√(2d). A ``full`` release keeps that noise (its
  post-processing floors the noise bulk, :mod:`ghofl.privacy.postprocess`), so in those
  directions Σ_tot under-states Σ_s, and the fit, which weighs them most, is charged
  κ = :data:`NOISE_DEPTH`·e there: tr(Wᵀ Σ_s W) ≈ tr(Wᵀ Σ_tot W) + κ‖W‖² and
  tr(H Σ_s) ≈ df + κ tr(H). A ``pooled`` or ``gram`` release has its within-class scatter
  denoised by the post-processing (each eigenvalue an estimate of the noise-free variance
  along its eigenvector), so κ = 0 there (:func:`~ghofl.moments.noise.total_release_noise`).

So RSS_s = RSS + 2(N − 1) Σ_c v_c δ_c + (N − 1) κ ‖W‖², df_s = df + κ tr(H), and
GCV(a) = (RSS_s/N) / (1 − (df_s + 1)/N)² (a candidate with df_s + 1 ≥ N is not trusted;
when none is, the largest shrinkage is taken). Both corrections grow as λ falls, so the
choice shrinks more as the noise grows; ``alpha_rule_`` then reads ``"gcv+dp-noise"``.
Without noise this is the criterion above, unchanged.

Calibration: T minimises the negative log-likelihood of ``n_calibration`` synthetic samples
per class drawn from N(μ_c, shrink(Σ_pool, 0.05)) (a seeded generator), i.e. the Gaussian model
the moments describe; no raw data is needed and argmax predictions do not depend on T.
"""

from __future__ import annotations

from typing import Any, ClassVar

import numpy as np
from scipy.linalg import LinAlgError, cho_factor, cho_solve, eigh
from scipy.optimize import minimize_scalar
from scipy.special import logsumexp

from ghofl.errors import StatsValidationError
from ghofl.heads._linalg import F64, stable_cholesky
from ghofl.heads._params import Constraint, Integer, RealOrAuto
from ghofl.heads.base import Head, scalar_positive
from ghofl.moments.core import Moments
from ghofl.moments.noise import noise_tag, total_release_noise
from ghofl.moments.shrinkage import shrink
from ghofl.moments.spectral import MAX_CONDITION, Tridiagonal, shrunk_solve, tridiagonal
from ghofl.stats.meta import StatsMeta

Shape = tuple[int, ...]

#: Candidate shrinkages scored on held-out moments: 0, then 4 per decade from 1e-5 to 0.9.
CANDIDATES: tuple[float, ...] = (0.0, *(float(f"{v:.3g}") for v in np.logspace(-5, -0.046, 21)))
#: Shrinkage of the pooled covariance of the synthetic calibration samples.
CALIBRATION_SHRINKAGE = 0.05
#: κ/e: how far below the noise-free variance a private release's covariance is taken to lie
#: in the directions its noise dominates, as a fraction of the noise edge e = ν√(2d) (module
#: docstring); chosen on DP benchmarks of text embeddings, where the optimum is broad.
NOISE_DEPTH = 0.2


def ridge_solution(moments: Moments, alphas: list[float]) -> list[tuple[F64, F64]]:
    """Ridge coefficients for every shrinkage in ``alphas`` from one eigendecomposition.

    Parameters
    ----------
    moments : Moments
        Needs the total scatter (upload mode ``pooled`` or ``full``) and N ≥ 2.
    alphas : list of float in [0, 1)

    Returns
    -------
    list of (W (d, C), b (C,)), one per alpha: scores s(x) = x W + b.

    Raises
    ------
    StatsValidationError
        Fewer than 2 samples, or a = 0 with a singular total covariance.
    """
    n = moments.n_samples
    if n < 2:
        raise StatsValidationError(
            f"the ridge head needs at least 2 samples; the statistics hold {n}; aggregate more "
            "client payloads"
        )
    scatter = moments._require_scatter(moments.total_scatter, "the ridge head")
    cov = scatter / (n - 1)
    d = cov.shape[0]
    tau = max(float(np.trace(cov)), 0.0) / d
    m = moments.global_mean
    g = (moments.stats.sums.T - np.outer(m, moments.counts)) / (n - 1)  # (d, C)
    sym = 0.5 * (cov + cov.T)
    out: list[tuple[F64, F64]] = []
    if len(alphas) == 1:  # one system: a Cholesky solve is ~10x cheaper than eigh
        a = float(alphas[0])
        mat = (1.0 - a) * sym
        mat[np.diag_indices(d)] += a * tau
        try:
            factor = cho_factor(mat, lower=True, check_finite=False)
            coef: F64 = cho_solve(factor, (1.0 - a) * g, check_finite=False)
            if np.all(np.isfinite(coef)) and np.min(np.abs(np.diag(factor[0]))) > 1e-9 * np.sqrt(
                max(tau, np.finfo(float).tiny)
            ):
                return [(coef, moments.priors - m @ coef)]
        except LinAlgError:
            pass
        # Not positive definite in floating point (e.g. rounding left eigenvalues slightly
        # below 0): solve on the spectrum with negative eigenvalues set to 0, as the GCV and
        # held-out criteria that chose a see it.
    w, u = eigh(sym, check_finite=False)
    w = np.maximum(w, 0.0)
    ug = u.T @ g
    for a in alphas:
        den = (1.0 - a) * w + a * tau
        if np.min(den, initial=np.inf) <= 1e-12 * max(tau, np.finfo(float).tiny):
            raise _singular(a)
        coef = u @ ((1.0 - a) * ug / den[:, None])
        out.append((coef, moments.priors - m @ coef))
    return out


def _cross_covariance(moments: Moments) -> F64:
    """G/(N − 1), shape (d, C): column c is (A_c − N_c m)/(N − 1) (module docstring)."""
    out: F64 = (moments.stats.sums.T - np.outer(moments.global_mean, moments.counts)) / (
        moments.n_samples - 1)
    return out


def _singular(a: float) -> StatsValidationError:
    return StatsValidationError(
        f"the total covariance is singular, so ridge shrinkage alpha={a} leaves the normal "
        "equations without a unique solution; use alpha > 0 (e.g. 0.01 or 'auto')"
    )


def heldout_squared_error(fit: Moments, held: Moments, solutions: list[tuple[F64, F64]]) -> F64:
    """Held-out squared error Σ_held ‖y − s(x)‖² / n_H of each solution (see module docstring).

    Parameters
    ----------
    fit, held : Moments
        The fitting part (the solutions were fitted on it) and the held-out part (needs its
        total scatter).
    solutions : list of (W (d, C), b (C,))

    Returns
    -------
    ndarray, shape (len(solutions),)
    """
    n_h = float(held.n_samples)
    t_h = held._require_scatter(held.total_scatter, "held-out ridge selection")
    m_f, pi_f = fit.global_mean, fit.priors
    delta = held.global_mean - m_f
    q = t_h + n_h * np.outer(delta, delta)
    p = held.stats.sums.T - np.outer(m_f, held.counts) - n_h * np.outer(delta, pi_f)
    c0 = n_h - 2.0 * float(held.counts @ pi_f) + n_h * float(pi_f @ pi_f)
    errs = []
    for coef, _ in solutions:
        errs.append(c0 - 2.0 * float(np.sum(coef * p)) + float(np.sum(coef * (q @ coef))))
    return np.asarray(errs) / n_h


def _gcv_terms(moments: Moments) -> tuple[F64, float, float]:
    """The spectrum-free terms of the GCV criterion (module docstring).

    Returns
    -------
    g : ndarray, shape (d, C)
        Class sums centred on the global mean, over N − 1.
    c0 : float
        N (1 − Σ_c π_c²).
    n_eff : float
        The samples' worth of the scatter: N, or for an estimate its within-class degrees of
        freedom plus the C class means.
    """
    n = moments.n_samples
    g = (moments.stats.sums.T - np.outer(moments.global_mean, moments.counts)) / (n - 1)
    c0 = n * (1.0 - float(moments.priors @ moments.priors))
    n_eff = moments.pooled_dof() + moments.num_classes if moments.is_estimated else float(n)
    return g, c0, n_eff


def _gcv_noise(moments: Moments) -> tuple[float, F64, F64] | None:
    """(κ, v (C,), N_c (C,)) of a private release's noise (module docstring); None otherwise."""
    noise = total_release_noise(moments.stats, moments.counts, moments.global_mean)
    if noise is None:
        return None
    edge = float(np.sqrt(2.0 * moments.meta.dim * noise.entry_var))
    return NOISE_DEPTH * edge, noise.mean_var, np.maximum(moments.counts, 1).astype(np.float64)


def _noise_terms(noise: tuple[float, F64, F64] | None, n: float, tr_h: float, q: F64,
                 coef_sq: F64) -> tuple[float, float] | None:
    """The corrections (of RSS, of df) for the release ``noise`` (module docstring).

    ``q`` (C,): g_cᵀ H g_c; ``coef_sq`` (C,): ‖W_c‖². None without noise.
    """
    if noise is None:
        return None
    kappa, var, cnt = noise
    div = tr_h * (1.0 - (n - 1) * q / cnt) - (n - 1) * coef_sq / cnt
    rss = 2.0 * (n - 1) * float(var @ div) + (n - 1) * kappa * float(np.sum(coef_sq))
    return rss, kappa * tr_h


def _gcv(n: float, n_eff: float, rss: float, df: float,
         extra: tuple[float, float] | None) -> float:
    """GCV(a) from the training residual and the degrees of freedom (module docstring).

    ``extra``: the corrections of a release's noise (:func:`_noise_terms`), else None;
    ``inf`` where the corrected degrees of freedom leave no residual freedom.
    """
    if extra is None:
        return (rss / n) / max(1.0 - (df + 1.0) / n_eff, 1e-12) ** 2
    rss, df = rss + extra[0], df + extra[1]
    if df + 1.0 >= n_eff:
        return float(np.inf)
    return (rss / n) / (1.0 - (df + 1.0) / n_eff) ** 2


def gcv_scores(moments: Moments, alphas: list[float]) -> F64:
    """Generalised cross-validation score of each shrinkage, from the total's moments alone.

    See the module docstring; ``inf`` where the system is singular (a = 0, singular Σ_tot).

    Returns
    -------
    ndarray, shape (len(alphas),)
    """
    n = moments.n_samples
    scatter = moments._require_scatter(moments.total_scatter, "the ridge head")
    cov = scatter / (n - 1)
    d = cov.shape[0]
    tau = max(float(np.trace(cov)), 0.0) / d
    w, u = eigh(0.5 * (cov + cov.T), check_finite=False)
    w = np.maximum(w, 0.0)
    g, c0, n_eff = _gcv_terms(moments)
    ug = u.T @ g
    g2 = np.sum(ug**2, axis=1)
    noise = _gcv_noise(moments)
    out = np.full(len(alphas), np.inf)
    for i, a in enumerate(alphas):
        den = (1.0 - a) * w + a * tau
        if np.min(den, initial=np.inf) <= 1e-12 * max(tau, np.finfo(float).tiny):
            continue
        s = (1.0 - a) / den
        rss = c0 - 2.0 * (n - 1) * float(s @ g2) + (n - 1) * float((w * s * s) @ g2)
        df = float(w @ s)
        extra = None if noise is None else _noise_terms(
            noise, n, float(np.sum(s)), s @ ug**2, (s * s) @ ug**2)
        out[i] = _gcv(n, n_eff, rss, df, extra)
    return out


def gcv_scores_tridiagonal(
    moments: Moments, alphas: list[float]
) -> tuple[F64, Tridiagonal] | None:
    """:func:`gcv_scores` from one tridiagonal reduction of Σ_tot, and the reduction.

    With Σ_tot = Q T Qᵀ (:mod:`ghofl.moments.spectral`), y = QᵀG/(N − 1) and
    M = (1 − a)T + aτI: Σ_j s_j‖g_j‖² = (1 − a)·tr(yᵀM⁻¹y) and
    Σ_j w_j s_j²‖g_j‖² = (1 − a)²·tr(xᵀTx), x = M⁻¹y; df from the eigenvalues of T. None when
    N < 2, d < 2, or a scored candidate is too ill-conditioned for the tridiagonal solves
    (:data:`~ghofl.moments.spectral.MAX_CONDITION`): :func:`gcv_scores` then decides.

    Returns
    -------
    (ndarray of shape (len(alphas),), Tridiagonal) or None
    """
    n = moments.n_samples
    if n < 2:
        return None
    scatter = moments._require_scatter(moments.total_scatter, "the ridge head")
    tri = tridiagonal(scatter / (n - 1), overwrite=True)
    if tri is None:
        return None
    d = tri.dim
    tau = max(tri.trace, 0.0) / d
    w = np.maximum(tri.eigvals, 0.0)
    g, c0, n_eff = _gcv_terms(moments)
    y = tri.project(g)
    noise = _gcv_noise(moments)
    out = np.full(len(alphas), np.inf)
    for i, a in enumerate(alphas):
        den = (1.0 - a) * w + a * tau
        if np.min(den, initial=np.inf) <= 1e-12 * max(tau, np.finfo(float).tiny):
            continue
        if tri.condition(1.0 - a, a * tau) > MAX_CONDITION:
            return None
        x = tri.solve(1.0 - a, a * tau, y)
        if x is None:
            return None
        proj = (1.0 - a) * float(np.sum(y * x))  # Σ_j s_j ‖g_j‖²
        curv = (1.0 - a) ** 2 * float(np.sum(x * tri.times(x)))  # Σ_j w_j s_j² ‖g_j‖²
        rss = c0 - 2.0 * (n - 1) * proj + (n - 1) * curv
        df = float(w @ ((1.0 - a) / den))
        extra = None if noise is None else _noise_terms(
            noise, n, float(np.sum((1.0 - a) / den)), (1.0 - a) * np.sum(y * x, axis=0),
            (1.0 - a) ** 2 * np.sum(x * x, axis=0))
        out[i] = _gcv(n, n_eff, rss, df, extra)
    return out, tri


def choose_alpha(moments: Moments, alpha: float | str) -> tuple[float, str]:
    """The shrinkage a and how it was chosen.

    ``"fixed"``, ``"heldout"``, ``"gcv"``, or ``"gcv+dp-noise"`` when GCV weighed the noise of
    a private release (module docstring).
    """
    a, rule, _ = _choose_alpha(moments, alpha)
    return a, rule


def _choose_alpha(moments: Moments, alpha: float | str) -> tuple[float, str, Tridiagonal | None]:
    """:func:`choose_alpha`, with the reduction of Σ_tot that GCV used (None otherwise)."""
    if not isinstance(alpha, str):
        return float(alpha), "fixed", None
    split = moments.validation_split()
    if split is None or np.any(split[0].counts == 0):
        cands, rule = list(CANDIDATES), "gcv" + noise_tag(moments.stats)
        fast = gcv_scores_tridiagonal(moments, cands)
        if fast is not None and np.any(np.isfinite(fast[0])):
            return cands[int(np.argmin(fast[0]))], rule, fast[1]
        scores = gcv_scores(moments, cands)
        if rule != "gcv" and not np.any(np.isfinite(scores)):  # no candidate trusted
            return cands[-1], rule, None
        return cands[int(np.argmin(scores))], rule, None
    fit, held = split
    cands = list(CANDIDATES)
    try:
        sols = ridge_solution(fit, cands)
    except StatsValidationError:  # singular total covariance: a = 0 has no solution
        cands = [a for a in cands if a > 0]
        sols = ridge_solution(fit, cands)
    errs = heldout_squared_error(fit, held, sols)
    return cands[int(np.argmin(errs))], "heldout", None


#: Calibration rows across all classes at most (per class: ``n_calibration``, lowered above
#: this total so the (rows, C) score array stays near 65,536 · C values: 0.5 GB at C = 1,000).
CALIBRATION_MAX_ROWS = 65_536
#: Score values per block of the calibration objective when the array is large.
_CALIBRATION_BLOCK = 1 << 24


def calibration_rows_per_class(n_per_class: int, num_classes: int) -> int:
    """Synthetic calibration rows per class: ``n_per_class``, capped by the total.

    ``min(n_per_class, max(8, CALIBRATION_MAX_ROWS // C))``: unchanged up to C = 256 at the
    default 256 per class; 65 per class at C = 1,000. A temperature does not move the argmax,
    so predictions never depend on it.
    """
    if num_classes < 1:
        return n_per_class
    return min(n_per_class, max(8, CALIBRATION_MAX_ROWS // num_classes))


def synthetic_temperature(
    moments: Moments, coef: F64, intercept: F64, n_per_class: int, seed: int
) -> float:
    """Temperature T minimising the NLL of softmax((x W + b)/T) on Gaussian synthetic samples.

    Parameters
    ----------
    moments : Moments
        Class means and pooled covariance of the synthetic Gaussians.
    coef : ndarray, shape (d, C)
    intercept : ndarray, shape (C,)
    n_per_class : int
        Samples drawn per class with ``numpy.random.default_rng(seed)``.
    seed : int

    Returns
    -------
    float, T > 0.
    """
    cov = shrink(moments.pooled_covariance(), CALIBRATION_SHRINKAGE)
    chol, _ = stable_cholesky(cov, "the calibration covariance of the ridge head")
    rng = np.random.default_rng(seed)
    c = moments.num_classes
    keep = [k for k in range(c) if moments.counts[k] > 0]
    n_per_class = calibration_rows_per_class(n_per_class, len(keep))
    scores = []
    for k in keep:
        z = moments.means[k] + rng.standard_normal((n_per_class, cov.shape[0])) @ chol.T
        scores.append(z @ coef + intercept)
    s = np.concatenate(scores)
    y = np.repeat(np.asarray(keep), n_per_class)
    own = s[np.arange(y.size), y]
    # one pass over the whole score array when it is small (as always before); in row
    # blocks when it is large, so no copy of the (rows, C) array is ever made
    step = s.shape[0] if s.size <= _CALIBRATION_BLOCK else max(1, _CALIBRATION_BLOCK // c)

    def nll(log_t: float) -> float:
        if step == s.shape[0]:
            z = s / np.exp(log_t)
            return float(np.mean(logsumexp(z, axis=1) - z[np.arange(y.size), y]))
        inv = np.exp(-log_t)
        total = sum(float(np.sum(logsumexp(s[i:i + step] * inv, axis=1)))
                    for i in range(0, s.shape[0], step))
        return float((total - float(np.sum(own)) * inv) / s.shape[0])

    res = minimize_scalar(nll, bounds=(np.log(1e-4), np.log(1e2)), method="bounded",
                          options={"xatol": 1e-4})
    return float(np.exp(res.x))


class RidgeHead(Head):
    """Ridge-regression (least-squares) classifier on one-hot targets, from pooled moments.

    Parameters
    ----------
    alpha : float in [0, 1) or "auto", default "auto"
        Shrinkage of the total covariance (the ridge penalty, see module docstring);
        ``"auto"`` picks it on the held-out part of the statistics when they have one, else
        by generalised cross-validation from the moments.
    n_calibration : int, default 256
        Synthetic samples per class used to fit the temperature (at most
        65,536 in all: fewer per class above C = 256); 0 = no calibration (T = 1).
    seed : int, default 0
        Seed of the calibration samples.
    """

    name = "ridge"
    min_mode = "gram"
    min_samples = 2
    fitted_arrays = ("coef_", "intercept_")
    fitted_scalars = ("alpha_", "alpha_rule_", "temperature_")
    parameter_constraints: ClassVar[dict[str, Constraint]] = {
        "alpha": RealOrAuto(0.0, 1.0),
        "n_calibration": Integer(lo=0),
        "seed": Integer(lo=0),
    }

    def __init__(
        self, alpha: float | str = "auto", n_calibration: int = 256, seed: int = 0
    ) -> None:
        self.alpha = alpha
        self.n_calibration = n_calibration
        self.seed = seed

    def _fitted_shapes(self, meta: StatsMeta, scalars: dict[str, Any]) -> dict[str, Shape]:
        scalar_positive(type(self).__name__, scalars, "temperature_")
        c, d = meta.num_classes, meta.dim
        return {"coef_": (c, d), "intercept_": (c,)}

    def _fit(self, moments: Moments) -> None:
        p = self.params_
        a, rule, tri = _choose_alpha(moments, p["alpha"])
        coef = None if tri is None else shrunk_solve(tri, a, max(tri.trace, 0.0) / tri.dim,
                                                     _cross_covariance(moments))
        if coef is not None and np.all(np.isfinite(coef)):  # the reduction GCV used
            coef = (1.0 - a) * coef
            intercept = moments.priors - moments.global_mean @ coef
        else:  # a fixed or held-out coefficient: one Cholesky
            ((coef, intercept),) = ridge_solution(moments, [a])
        t = 1.0
        if p["n_calibration"] > 0:
            t = synthetic_temperature(moments, coef, intercept, p["n_calibration"], p["seed"])
        self.coef_ = np.ascontiguousarray(coef.T)
        self.intercept_ = intercept
        self.alpha_ = float(a)
        self.alpha_rule_ = rule
        self.temperature_ = t

    def _decision(self, Z: F64) -> F64:
        out: F64 = (Z @ self.coef_.T + self.intercept_) / self.temperature_
        return out


__all__ = [
    "CANDIDATES",
    "RidgeHead",
    "choose_alpha",
    "gcv_scores",
    "gcv_scores_tridiagonal",
    "heldout_squared_error",
    "ridge_solution",
    "synthetic_temperature",
]
