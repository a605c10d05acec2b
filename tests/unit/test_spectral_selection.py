"""Shrinkage selection from one tridiagonal reduction (issue 40): same choices, same fits.

Each fast path is compared with a straightforward reference of the same criterion (the
eigendecomposition formulas, or the head with the chosen coefficient fixed) on seeded random
statistics.
"""

from __future__ import annotations

import numpy as np
import pytest
from scipy.linalg import cholesky, eigh, eigvalsh, solve_triangular

from ghofl.bench.spectrum import class_statistics, draw, spectrum_classes
from ghofl.errors import GhoflWarning
from ghofl.heads._linalg import stable_cholesky
from ghofl.heads.lda import LDAHead
from ghofl.heads.qda import QDAHead
from ghofl.heads.ridge import RidgeHead, gcv_scores, gcv_scores_tridiagonal
from ghofl.moments import selection, spectral
from ghofl.moments.core import compute_moments
from ghofl.moments.criteria import analytic_error, analytic_error_grams, shrinkage_family
from ghofl.moments.shrinkage import shrink
from ghofl.moments.spectral import shrunk_solve, tridiagonal, tridiagonal_grams
from ghofl.stats import ClientStats, compute_stats

SEEDS = range(6)


def _random_spd(rng: np.random.Generator, d: int, n: int) -> np.ndarray:
    x = rng.standard_normal((n, d)) * rng.uniform(0.1, 3.0, d)
    out: np.ndarray = x.T @ x / n
    sym: np.ndarray = 0.5 * (out + out.T)
    return sym


def _problem(seed: int, d: int = 40, c: int = 4, per_class: int = 30) -> ClientStats:
    """Random `full` statistics: d, C and the class sizes vary with the seed."""
    rng = np.random.default_rng(seed)
    d = d + 7 * (seed % 3)
    gen = spectrum_classes(seed, d, c + seed % 3, separation=0.05 + 0.05 * (seed % 2))
    return class_statistics(gen, per_class + 20 * (seed % 4), "full", int(rng.integers(9)))


def _rel(a: np.ndarray, b: np.ndarray) -> float:
    return float(np.max(np.abs(a - b)) / max(float(np.max(np.abs(b))), 1e-300))


# ------------------------------------------------------------------------- the reduction
@pytest.mark.parametrize("seed", SEEDS)
def test_tridiagonal_matches_eigendecomposition_and_solves(seed: int) -> None:
    rng = np.random.default_rng(seed)
    d = 5 + 11 * seed
    p = _random_spd(rng, d, 2 * d)
    tri = tridiagonal(p)
    assert tri is not None
    assert _rel(tri.eigvals, eigvalsh(p)) < 1e-12
    y = rng.standard_normal((d, 3))
    assert _rel(tri.expand(tri.project(y)), y) < 1e-12  # Q orthogonal
    assert _rel(tri.expand(tri.times(tri.project(y))), p @ y) < 1e-12  # P = Q T Qᵀ
    for a in (1e-4, 0.05, 0.7):
        for scale in (1.0, 0.83):
            t = float(np.trace(p)) / d
            x = shrunk_solve(tri, a, t, y, scale)
            assert x is not None
            assert _rel(x, np.linalg.solve(scale * shrink(p, a), y)) < 1e-10


def test_tridiagonal_edge_cases() -> None:
    assert tridiagonal(np.eye(1)) is None
    assert tridiagonal(np.full((3, 3), np.nan)) is None
    tri = tridiagonal(_random_spd(np.random.default_rng(0), 6, 20))
    assert tri is not None
    with pytest.raises(ValueError, match=r"expected vectors of shape \(6, m\)"):
        tri.project(np.ones((5, 2)))
    grams = tridiagonal_grams(tri, 0.0, np.ones((2, 6)))
    with pytest.raises(np.linalg.LinAlgError, match="not positive definite"):
        grams(1.0, np.zeros(6))  # M(1) = t·I = 0
    assert shrunk_solve(tri, 0.0, 1.0, np.ones((6, 1)), scale=-1.0) is None
    singular = np.zeros((6, 6))
    singular[0, 0] = 1.0
    red = tridiagonal(singular)
    assert red is not None and red.condition(1.0, 0.0) == np.inf
    assert shrunk_solve(red, 0.0, 1.0, np.ones((6, 1))) is None


# --------------------------------------------------------------------- LDA: analytic error
@pytest.mark.parametrize("seed", SEEDS)
def test_analytic_error_grams_match_the_eigenbasis(seed: int) -> None:
    m = compute_moments(_problem(seed))
    cov = m.pooled_covariance("n-c")
    tau = float(np.trace(cov)) / cov.shape[0]
    fam = shrinkage_family(cov, tau)
    tri = tridiagonal(cov)
    assert tri is not None
    lp = np.log(m.priors)
    cands = [1e-5, 1e-3, 0.02, 0.1, 0.4, 0.9]
    n = m.pooled_dof()
    ref = analytic_error(fam, n, m.means, m.counts, lp, cands)
    fast = analytic_error_grams(fam, tridiagonal_grams(tri, tau, m.means), n, m.counts, lp,
                                cands)
    np.testing.assert_allclose(fast, ref, rtol=1e-9, atol=1e-14)


@pytest.mark.parametrize("seed", SEEDS)
def test_lda_auto_chooses_and_fits_as_the_reference(seed: int) -> None:
    stats = _problem(seed)
    m = compute_moments(stats)
    fast = selection._pooled_error_spectral(m)
    assert fast is not None and fast.spectrum is not None
    ref = selection._pooled_error_choice(m, selection.support_basis(m))
    assert fast.value == ref
    rng = np.random.default_rng(100 + seed)
    X = rng.standard_normal((200, m.dim)) + m.means[rng.integers(0, m.num_classes, 200)]
    for divisor in ("n-c", "n"):
        auto = LDAHead(covariance_divisor=divisor).fit_from_stats(stats)
        assert auto.shrinkage_ == ref and auto.shrinkage_method_ == "analytic-error"
        fixed = LDAHead(shrinkage=ref, covariance_divisor=divisor).fit_from_stats(stats)
        assert _rel(auto.coef_, fixed.coef_) < 1e-10
        assert _rel(auto.intercept_, fixed.intercept_) < 1e-10
        np.testing.assert_array_equal(auto.predict(X), fixed.predict(X))


def test_lda_falls_back_when_the_data_span_a_subspace() -> None:
    """Embeddings confined to a subspace: no certificate, the eigendecomposition path decides."""
    rng = np.random.default_rng(5)
    basis = np.linalg.qr(rng.standard_normal((20, 12)))[0]
    y = np.repeat(np.arange(3), 40)
    X = (rng.standard_normal((120, 12)) + 2.0 * rng.standard_normal((3, 12))[y]) @ basis.T
    m = compute_moments(compute_stats(X, y, 3, mode="full"))
    assert selection._pooled_error_spectral(m) is None
    support = selection.support_basis(m)
    assert support is not None and support.shape == (20, 12)
    choice = selection.choose_pooled_shrinkage(m, "auto")
    assert choice.spectrum is None
    assert choice.value == selection._pooled_error_choice(m, support)


def test_lda_falls_back_when_ill_conditioned(monkeypatch: pytest.MonkeyPatch) -> None:
    m = compute_moments(_problem(0))
    monkeypatch.setattr(selection, "MAX_CONDITION", 1.0)
    assert selection._pooled_error_spectral(m) is None
    choice = selection.choose_pooled_shrinkage(m, "auto")
    assert choice.spectrum is None and choice.method == "analytic-error"
    assert choice.value == selection._pooled_error_choice(m, None)


@pytest.mark.parametrize("seed", SEEDS)
def test_certificate_agrees_with_the_support_test(seed: int) -> None:
    m = compute_moments(_problem(seed))
    w = eigvalsh(m.within_scatter)
    if selection._certified(m, w):
        assert selection.support_basis(m) is None
    assert not selection._certified(m, np.zeros_like(w))


# ------------------------------------------------------------------------------ ridge: GCV
@pytest.mark.parametrize("seed", SEEDS)
def test_ridge_gcv_and_fit_match_the_reference(seed: int) -> None:
    stats = _problem(seed)
    m = compute_moments(stats)
    cands = [0.0, 1e-4, 0.01, 0.05, 0.3, 0.9]
    fast = gcv_scores_tridiagonal(m, cands)
    assert fast is not None
    np.testing.assert_allclose(fast[0], gcv_scores(m, cands), rtol=1e-9)
    auto = RidgeHead(n_calibration=0).fit_from_stats(stats)
    assert auto.alpha_rule_ == "gcv"
    fixed = RidgeHead(alpha=auto.alpha_, n_calibration=0).fit_from_stats(stats)
    assert _rel(auto.coef_, fixed.coef_) < 1e-10
    assert _rel(auto.intercept_, fixed.intercept_) < 1e-10
    rng = np.random.default_rng(200 + seed)
    X = rng.standard_normal((200, m.dim)) + m.means[rng.integers(0, m.num_classes, 200)]
    np.testing.assert_array_equal(auto.predict(X), fixed.predict(X))


def test_ridge_gcv_falls_back_when_ill_conditioned(monkeypatch: pytest.MonkeyPatch) -> None:
    stats = _problem(1)
    m = compute_moments(stats)
    ref = RidgeHead(n_calibration=0).fit_from_stats(stats)
    monkeypatch.setattr("ghofl.heads.ridge.MAX_CONDITION", 1.0)
    assert gcv_scores_tridiagonal(m, [0.1]) is None
    slow = RidgeHead(n_calibration=0).fit_from_stats(stats)
    assert slow.alpha_ == ref.alpha_
    assert _rel(slow.coef_, ref.coef_) < 1e-10


# ---------------------------------------------------------------------------- QDA: evidence
def _reference_qda(stats: ClientStats, X: np.ndarray, a: float, pooled_a: float) -> np.ndarray:
    """QDA toward the pooled target, written out with SciPy: Cholesky, solves, log-dets."""
    m = compute_moments(stats)
    d = m.dim
    center = shrink(m.pooled_covariance("n-c"), pooled_a)
    out = np.empty((X.shape[0], m.num_classes))
    for c in range(m.num_classes):
        cov = m.class_covariance(c, "n-1")
        t = float(np.trace(np.linalg.solve(center, cov))) / d
        L = cholesky((1 - a) * cov + a * t * center, lower=True)
        z = solve_triangular(L, (X - m.means[c]).T, lower=True)
        out[:, c] = (-0.5 * np.sum(z * z, axis=0) - np.sum(np.log(np.diag(L)))
                     + np.log(m.priors[c]))
    return out


@pytest.mark.parametrize("seed", SEEDS[:4])
def test_qda_auto_chooses_and_fits_as_the_reference(seed: int) -> None:
    gen = spectrum_classes(seed, 36 + 4 * seed, 4)
    stats = class_statistics(gen, 60 + 10 * seed, "full", 1)
    m = compute_moments(stats)
    rng = np.random.default_rng(seed)
    X = draw(gen, rng.integers(0, 4, 300), rng)
    head = QDAHead().fit_from_stats(stats)
    ref_coefs, ref_method = selection.choose_qda_shrinkage(m, "evidence", target="pooled")
    assert head.shrinkage_ == ref_coefs and head.shrinkage_method_ == ref_method == "evidence"
    pooled = selection._pooled_error_choice(m, selection.support_basis(m))
    ref = _reference_qda(stats, X, ref_coefs[0], pooled)
    np.testing.assert_array_equal(head.predict(X), np.argmax(ref, axis=1))
    fixed = QDAHead(shrinkage=ref_coefs[0], pooled_shrinkage=pooled).fit_from_stats(stats)
    assert _rel(head.precision_chol_, fixed.precision_chol_) < 1e-10
    assert np.all(np.tril(head.precision_chol_, -1) == 0.0)
    decision = head.decision_function(X)
    assert _rel(decision - decision.max(axis=1, keepdims=True),
                ref - ref.max(axis=1, keepdims=True)) < 1e-8


def test_stable_cholesky_without_the_gil_matches_scipy() -> None:
    p = _random_spd(np.random.default_rng(1), 30, 60)
    L, jitter = stable_cholesky(p, "x", release_gil=True)
    assert jitter == 0.0 and L.flags.f_contiguous
    assert _rel(L, cholesky(p, lower=True)) < 1e-12
    singular = np.zeros((4, 4))
    singular[0, 0] = 1.0
    with pytest.warns(GhoflWarning, match="the test matrix is singular; added a ridge"):
        L, jitter = stable_cholesky(singular, "the test matrix", release_gil=True)
    assert jitter > 0.0 and np.all(np.isfinite(L))


def test_tridiagonal_reference_eigh_basis_agrees() -> None:
    """The eigenvalues the criteria read are those of ``eigh`` (the reference family's)."""
    p = _random_spd(np.random.default_rng(2), 25, 40)
    tri = tridiagonal(p)
    assert tri is not None
    w, _ = eigh(p, driver="evr")
    assert _rel(tri.eigvals, w) < 1e-12
    assert spectral.grid_condition(tri, 1.0, []) == 1.0
