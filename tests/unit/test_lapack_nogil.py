"""The GIL-free LAPACK calls and the in-place covariance helpers built on them (issue 40)."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest
from scipy.linalg import LinAlgError, cholesky, eigh, solve_triangular

from ghofl.errors import StatsValidationError
from ghofl.heads._linalg import inverse_factor_into, stable_cholesky
from ghofl.moments import GhoflWarning, compute_moments, shrink
from ghofl.moments.core import class_between, symmetrise
from ghofl.stats import compute_stats
from ghofl.stats.lapack import potrf, sygst, trtri
from tests.helpers import gaussian_mixture


def _spd(seed: int, d: int) -> np.ndarray:
    x = np.random.default_rng(seed).standard_normal((3 * d, d))
    out: np.ndarray = x.T @ x / (3 * d)
    return out


def test_potrf_and_trtri_match_scipy_in_threads() -> None:
    mats = [_spd(s, 150) for s in range(4)]

    def one(m: np.ndarray) -> tuple[np.ndarray, np.ndarray, int, int]:
        a = np.asfortranarray(m)
        info = potrf(a)
        low = np.tril(a)
        inv = a.copy(order="F")
        info_inv = trtri(inv)
        return low, np.tril(inv), info, info_inv

    with ThreadPoolExecutor(max_workers=2) as pool:
        results = list(pool.map(one, mats))
    for m, (low, inv, i1, i2) in zip(mats, results, strict=True):
        assert i1 == 0
        assert i2 == 0
        np.testing.assert_allclose(low, cholesky(m, lower=True), rtol=1e-12, atol=1e-12)
        np.testing.assert_allclose(inv @ low, np.eye(150), atol=1e-10)


def test_potrf_reports_a_matrix_that_is_not_positive_definite() -> None:
    a = np.asfortranarray(-np.eye(5))
    assert potrf(a) == 1


def test_sygst_matches_the_whitened_matrix() -> None:
    p, q = _spd(1, 60), _spd(2, 60)
    chol = np.asfortranarray(cholesky(q, lower=True))
    a = np.asfortranarray(p)
    assert sygst(a, chol) == 0
    want = solve_triangular(chol, solve_triangular(chol, p, lower=True).T, lower=True)
    np.testing.assert_allclose(np.tril(a), np.tril(want), rtol=1e-10, atol=1e-12)


def test_lapack_calls_refuse_arrays_they_cannot_work_in_place() -> None:
    with pytest.raises(ValueError, match="must be a writeable, Fortran-ordered, square float64"):
        potrf(np.ones((3, 4), order="F"))
    with pytest.raises(ValueError, match="must be a writeable, Fortran-ordered, square float64"):
        trtri(np.ones((3, 3), dtype=np.float32, order="F"))
    with pytest.raises(ValueError, match="the factor must be a Fortran-ordered float64 array"):
        sygst(np.asfortranarray(np.eye(3)), np.eye(4))


@pytest.mark.parametrize("d", [1, 127, 300])
def test_symmetrise_in_place_gives_the_values_of_the_formula(d: int) -> None:
    m = np.random.default_rng(d).standard_normal((d, d))
    want = 0.5 * (m + m.T)
    out = symmetrise(m)
    assert out is m
    np.testing.assert_array_equal(m, want)


@pytest.mark.parametrize(("c", "d"), [(1, 1), (3, 7), (10, 130)])
def test_class_between_is_the_weighted_outer_sum_in_c_order(c: int, d: int) -> None:
    rng = np.random.default_rng(c * d)
    sums, counts = rng.standard_normal((c, d)), rng.integers(1, 50, c).astype(np.float64)
    out = class_between(sums, counts)
    want = sum(np.outer(sums[k], sums[k]) / counts[k] for k in range(c))
    assert out.shape == (d, d) and out.flags.c_contiguous
    np.testing.assert_allclose(out, want, rtol=1e-12, atol=1e-12)


def test_class_covariance_into_a_buffer_and_shrink_in_place_give_the_same_values() -> None:
    x, y = gaussian_mixture(0, num_classes=3, dim=9, n=300)
    m = compute_moments(compute_stats(x, y, 3, mode="full"))
    buf = np.empty((9, 9))
    assert m.class_covariance(2, out=buf) is buf
    np.testing.assert_array_equal(buf, m.class_covariance(2))
    pooled = m.pooled_covariance()
    for target in ("scaled_identity", "identity"):
        want = shrink(pooled, 0.3, target)  # type: ignore[arg-type]
        got = shrink(pooled.copy(), 0.3, target, overwrite=True)  # type: ignore[arg-type]
        np.testing.assert_array_equal(got, want)


def test_inverse_factor_into_gives_the_inverse_transposed_factor() -> None:
    cov = _spd(3, 80)
    out = np.empty((80, 80))
    half, jitter = inverse_factor_into(out, lambda o: o.__setitem__(Ellipsis, cov), "a test")
    low, _ = stable_cholesky(cov, "a test")
    assert jitter == 0.0
    np.testing.assert_array_equal(np.tril(out, -1), 0.0)
    np.testing.assert_allclose(out.T @ low, np.eye(80), atol=1e-10)
    assert half == pytest.approx(float(np.sum(np.log(np.diag(low)))), rel=1e-12)


def test_inverse_factor_into_adds_the_jitter_of_stable_cholesky() -> None:
    v = np.random.default_rng(0).standard_normal((6, 3))
    cov = v @ v.T  # rank 3
    out = np.empty((6, 6))
    with pytest.warns(GhoflWarning, match="is singular; added a ridge"):
        _, jitter = inverse_factor_into(out, lambda o: o.__setitem__(Ellipsis, cov), "rank 3")
    with pytest.warns(GhoflWarning, match="is singular; added a ridge"):
        _, want = stable_cholesky(cov, "rank 3")
    assert jitter == want > 0.0
    np.testing.assert_allclose(out.T @ (cov + jitter * np.eye(6)) @ out, np.eye(6), atol=1e-6)


def test_inverse_factor_into_refuses_what_no_jitter_makes_positive_definite() -> None:
    w = np.diag([1.0, 1.0, -50.0])
    vec = eigh(_spd(4, 3))[1]
    cov = vec @ w @ vec.T
    with pytest.raises(LinAlgError, match="not positive definite even with a ridge"):
        inverse_factor_into(np.empty((3, 3)), lambda o: o.__setitem__(Ellipsis, cov), "bad")
    with pytest.raises(StatsValidationError, match="has non-finite entries"):
        inverse_factor_into(np.empty((2, 2)),
                            lambda o: o.__setitem__(Ellipsis, [[1.0, np.nan], [np.nan, 1.0]]),
                            "nan")
