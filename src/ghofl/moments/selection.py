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

Without a held-out part, the analytic error of the pooled covariance on the whole space reads
one tridiagonal reduction instead of an eigenbasis (:mod:`ghofl.moments.spectral`: the same
criterion from tridiagonal solves, and the fitted LDA solution from the same reduction,
:attr:`ShrinkageChoice.spectrum`); the eigenbasis remains for subspaces and ill-conditioned
candidates.

Ledoit–Wolf's estimator is not offered: its variance term needs Σ_i ‖x_i x_iᵀ − S‖², a fourth
moment of the data that no upload mode holds.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
from numpy.typing import NDArray
from scipy.linalg import cholesky, eigh, solve_triangular

from ghofl.errors import ConfigError, StatsValidationError
from ghofl.moments.core import Moments
from ghofl.moments.criteria import (
    ANALYTIC_GRID,
    EVIDENCE_GRID,
    SHRINKAGE_CANDIDATES,
    ShrinkageFamily,
    analytic_error,
    analytic_error_shrinkage,
    argmax_candidate,
    by_score,
    evidence_loglik,
    evidence_shrinkage,
    heldout_error,
    heldout_loglik,
    heldout_qda_error,
    refine_grid,
    release_noise,
    residual_scatter,
    search_grid,
    shrinkage_family,
)
from ghofl.moments.noise import noise_tag
from ghofl.moments.shrinkage import (
    ANALYTIC_DEFAULT,
    Shrinkage,
    check_shrinkage,
    resolve_shrinkage,
    shrink,
)
from ghofl.moments.spectral import (
    MAX_CONDITION,
    Tridiagonal,
    grid_condition,
    tridiagonal,
    tridiagonal_grams,
)

F64 = NDArray[np.float64]

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
        covariance and the class means; ``"analytic-error+dp-noise"`` when it weighed the noise
        of a private release), or ``"heldout-loglik"`` / ``"heldout-error"`` (chosen on the
        held-out part of the statistics with that criterion).
    spectrum : Tridiagonal or None
        The tridiagonal reduction of the pooled (N − C) covariance the choice was computed
        from, when it was (the analytic error on the whole space), so that a fit can reuse it
        (:func:`ghofl.moments.spectral.shrunk_solve`); not compared.
    """

    value: float
    method: str
    spectrum: Tridiagonal | None = field(default=None, compare=False, repr=False)


#: Held-out criterion of the pooled covariance, chosen from benchmarks/bench_defaults.py: the
#: held-out log-likelihood under-shrinks when n/d is small (BENCHMARKS.md, "Data-driven
#: shrinkage defaults"), the held-out error estimate does not.
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
#: Largest df(a)/n the analytic error trusts for estimated covariances (:func:`analytic_error`).
ESTIMATED_MAX_DF = 0.5
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


def support_basis(moments: Moments, within_eigvals: F64 | None = None) -> F64 | None:
    """Orthonormal basis (d, r) of the support of the data, or None when it is the whole space.

    The eigenvectors of the total covariance whose eigenvalue exceeds
    :data:`SUPPORT_RTOL` times the largest. None for estimated second moments, whose rank is
    the estimate's (e.g. FedCOF's Σ_c (K_c − 1) + C), not the data's.

    ``within_eigvals`` (d,): the eigenvalues of the within-class scatter when known; they
    certify full support for free when the smallest clears the test of :func:`full_support`
    (the total scatter is the within-class one plus a positive semi-definite between-class
    part) with room for the rounding of both.
    """
    if moments.total_scatter is None or moments.is_estimated:
        return None
    if within_eigvals is not None and _certified(moments, within_eigvals):
        return None
    sym = 0.5 * (moments.total_scatter + moments.total_scatter.T)
    if full_support(sym):
        return None
    w, u = eigh(sym, check_finite=False)
    keep = w > SUPPORT_RTOL * max(float(w[-1]), 0.0)
    if np.all(keep) or not np.any(keep):
        return None
    out: F64 = u[:, keep]
    return out


#: :func:`full_support` certifies λ_min > SUPPORT_MARGIN·SUPPORT_RTOL·tr(T): the margin covers
#: the rounding of the Cholesky factorisation and of the eigenvalues ``eigh`` would compute.
SUPPORT_MARGIN = 16.0


def full_support(scatter: F64) -> bool:
    """Whether every eigenvalue of ``scatter`` (d, d) exceeds :data:`SUPPORT_RTOL` × the largest.

    A sufficient test in one Cholesky factorisation (d³/3 flops, a thirtieth of ``eigh``): if
    T − δI is positive definite with δ = :data:`SUPPORT_MARGIN`·:data:`SUPPORT_RTOL`·tr(T), then
    λ_min(T) > δ ≥ SUPPORT_RTOL·λ_max(T) with room for rounding. False means "not certified"
    (the eigenvalues decide), not "rank deficient".
    """
    d = scatter.shape[0]
    tr = float(np.trace(scatter))
    if not np.isfinite(tr) or tr <= 0.0:
        return False
    shifted = scatter - (SUPPORT_MARGIN * SUPPORT_RTOL * tr) * np.eye(d)
    try:
        cholesky(shifted, lower=True, check_finite=False, overwrite_a=True)
    except np.linalg.LinAlgError:
        return False
    return True


def _certified(moments: Moments, within_eigvals: F64) -> bool:
    """Whether the within-class eigenvalues certify a total scatter of full support."""
    total = moments.total_scatter
    if total is None or within_eigvals.size == 0:
        return False
    d = total.shape[0]
    m = moments.global_mean
    tr_total = float(np.trace(total))
    tr_raw = tr_total + moments.n_samples * float(m @ m)  # tr(B) = tr(T) + N‖m‖²
    if not (np.isfinite(tr_total) and np.isfinite(tr_raw)) or tr_total <= 0.0:
        return False
    # rounding of W, T (computed from B by cancellation) and of the eigenvalues
    slack = 8.0 * d * np.finfo(float).eps * abs(tr_raw)
    delta = SUPPORT_MARGIN * SUPPORT_RTOL * tr_total
    return bool(float(np.min(within_eigvals)) > 2.0 * delta + slack)


def _project(m: F64, basis: F64 | None) -> F64:
    if basis is None:
        return m
    out: F64 = basis.T @ m @ basis
    return 0.5 * (out + out.T)


def _rows(m: F64, basis: F64 | None) -> F64:
    return m if basis is None else m @ basis


def _dof_pooled(m: Moments, divisor: str) -> float:
    return m.pooled_dof() if m.is_estimated or divisor == "n-c" else float(m.n_samples)


def _no_holdout_error(rule: str) -> StatsValidationError:
    return StatsValidationError(
        f"shrinkage {rule!r} needs statistics with a held-out part, and these have none; "
        "recompute the client statistics with a holdout fraction (e.g. --holdout 0.2), or use "
        "'auto' (which falls back to an analytic rule)"
    )


def _analytic(
    rule: str, cov: F64, n: float, basis: F64 | None, mle: F64, n_mle: float
) -> ShrinkageChoice:
    """An analytic rule.

    The evidence on ``cov`` (d, d, unbiased with ``n`` degrees of freedom), OAS / RBLW on the
    maximum-likelihood ``mle`` of ``n_mle`` samples (the conventions ghofl's ``"auto"`` used before:
    N − C samples pooled, N_c per class).
    """
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
    if parts is None and rule == "auto" and POOLED_ANALYTIC == "error" and basis is None:
        fast = _pooled_error_spectral(moments)
        if fast is not None:
            return fast
    if basis is None and rule not in ("oas", "rblw"):
        basis = support_basis(moments)
    if parts is None:
        if rule == "heldout":
            raise _no_holdout_error(rule)
        if rule == "auto" and POOLED_ANALYTIC == "error":
            return ShrinkageChoice(_pooled_error_choice(moments, basis),
                                   "analytic-error" + noise_tag(moments.stats))
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
    grid = list(SHRINKAGE_CANDIDATES)

    def score(cands: list[float]) -> F64:
        if crit == "loglik":
            m = residual_scatter(fit_means, held_means, held.counts, _project(held_w, basis))
            return heldout_loglik(fam, m, float(held.n_samples), cands)
        dof = max(held.n_samples - int(np.sum(held.counts > 0)), 1)
        return -heldout_error(fam, fit_means, np.log(np.maximum(fit.priors, 1e-300)),
                              held_means, held.counts, _project(held_w, basis) / dof, cands)

    best = search_grid(by_score(score), grid)
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
                                    np.log(np.maximum(moments.priors, 1e-300)),
                                    ESTIMATED_MAX_DF if moments.is_estimated else 1.0,
                                    noise=release_noise(moments.stats, moments.counts,
                                                        moments.means))


def _pooled_error_spectral(moments: Moments) -> ShrinkageChoice | None:
    """:func:`_pooled_error_choice` on the whole space from one tridiagonal reduction.

    The same criterion and grids, its grams from tridiagonal solves
    (:mod:`ghofl.moments.spectral`). None (the caller takes the eigendecomposition path) when
    the data may not span the whole space, or when some candidate is too ill-conditioned for
    the solves (:data:`ghofl.moments.spectral.MAX_CONDITION`).
    """
    n = _dof_pooled(moments, "n-c")
    if n <= 0 or moments.within_scatter is None:
        return None
    cov = moments.pooled_covariance("n-c")
    d = cov.shape[0]
    tau = max(float(np.trace(cov)), 0.0) / d
    tri = tridiagonal(cov, overwrite=True) if tau > 0.0 else None
    del cov
    if tri is None:
        return None
    within = tri.eigvals * (moments.n_samples - moments.num_classes)
    if not moments.is_estimated and not _certified(moments, within):
        return None
    if grid_condition(tri, tau, [ANALYTIC_GRID[0]]) > MAX_CONDITION:
        return None
    fam = ShrinkageFamily(np.maximum(tri.eigvals, 0.0), np.empty((0, 0)), tau, 0.0)
    grams = tridiagonal_grams(tri, tau, moments.means[moments.counts > 0])
    a = analytic_error_shrinkage(fam, n, moments.means, moments.counts,
                                 np.log(np.maximum(moments.priors, 1e-300)),
                                 ESTIMATED_MAX_DF if moments.is_estimated else 1.0, grams,
                                 release_noise(moments.stats, moments.counts, moments.means))
    return ShrinkageChoice(a, "analytic-error" + noise_tag(moments.stats), tri)


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
            grid = list(SHRINKAGE_CANDIDATES)
            best = search_grid(
                by_score(lambda cands: heldout_loglik(fam, m, float(n_held), cands)), grid)
            if RESCALE_TO_TOTAL:
                dof = 1 if divisor == "n-1" else 0
                best = rescale_for_total(best, n_fit - dof, int(moments.counts[c]) - dof)
            return ShrinkageChoice(best, "heldout-loglik")
    n_c, n_dof = int(moments.counts[c]), moments.class_dof(c)
    if n_c < 2 or n_dof < 1:
        return ShrinkageChoice(1.0, "single-sample")
    return _analytic(rule, moments.class_covariance(c, "n-1"), n_dof, basis,
                     moments.class_covariance(c, "n"), n_dof + 1.0)


def pooled_center(moments: Moments, shrinkage: Shrinkage = "auto") -> F64:
    """The centre of QDA's ``"pooled"`` target: shrink(Σ_pool, a), the default LDA's covariance.

    a from :func:`choose_pooled_shrinkage`, N − C divisor.

    Returns
    -------
    ndarray, shape (d, d), symmetric positive definite whenever a > 0 or Σ_pool is.
    """
    return pooled_center_choice(moments, shrinkage)[0]


def pooled_center_choice(moments: Moments,
                         shrinkage: Shrinkage = "auto") -> tuple[F64, ShrinkageChoice]:
    """:func:`pooled_center` (d, d) and the choice of its coefficient."""
    choice = choose_pooled_shrinkage(moments, shrinkage)
    return shrink(moments.pooled_covariance("n-c"), choice.value), choice


def center_scale(cov: F64, center: F64) -> float:
    """The scale t = tr(B⁻¹Σ)/d: the multiple of the centre B closest to Σ.

    Its mean generalised eigenvalue, so that t·B has the scale of Σ.

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
    grid = list(SHRINKAGE_CANDIDATES[1:])  # a = 0 is singular for any class with N_c <= d
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

            best = search_grid(choose, grid)
            if RESCALE_TO_TOTAL:
                best = rescale_for_total(best, float(fit.n_samples), float(moments.n_samples))
            return [best] * c_num, f"heldout-{crit}"
    return _qda_evidence_choice(moments, support, target, pooled_shrinkage)


def _qda_evidence_choice(moments: Moments, support: F64 | None, target: str,
                         pooled_shrinkage: Shrinkage) -> tuple[list[float], str]:
    """QDA without a held-out part: maximise the summed evidence of the class scatters."""
    c_num = moments.num_classes
    usable = [c for c in range(c_num) if moments.counts[c] >= 2 and moments.class_dof(c) >= 1]
    if not usable:
        return [1.0] * c_num, "single-sample"
    center = pooled_center(moments, pooled_shrinkage) if target == "pooled" else None
    fams = {c: _class_family(moments, c, "n-1", support, target, center) for c in usable}

    def evidence(cands: list[float]) -> F64:
        out = np.zeros(len(cands))
        for c in usable:
            out += evidence_loglik(fams[c], moments.class_dof(c), cands)
        return out

    return [search_grid(by_score(evidence), EVIDENCE_GRID)] * c_num, "evidence"


__all__ = [
    "POOLED_ANALYTIC",
    "POOLED_CRITERION",
    "QDA_CRITERION",
    "QDA_ERROR_MAX_CLASSES",
    "SHRINKAGE_CANDIDATES",
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
    "pooled_center_choice",
    "refine_grid",
    "rescale_for_total",
    "residual_scatter",
    "shrinkage_family",
    "support_basis",
]
