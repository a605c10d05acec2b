"""Moments and shrinkage from sums alone."""

from __future__ import annotations

import numpy as np
import pytest

from ghofl.errors import ConfigError, StatsValidationError, UnsupportedModeError
from ghofl.moments import GhoflWarning, check_shrinkage, compute_moments, oas_shrinkage, shrink
from ghofl.stats import compute_stats
from tests.helpers import gaussian_mixture


def test_moments_match_numpy_on_pooled_data() -> None:
    x, y = gaussian_mixture(0, num_classes=3, dim=5, n=400)
    m = compute_moments(compute_stats(x, y, 3))
    n, c = len(y), 3
    means = np.stack([x[y == k].mean(0) for k in range(c)])
    np.testing.assert_allclose(m.means, means, rtol=1e-12)
    np.testing.assert_allclose(m.priors, np.bincount(y) / n)
    within = sum((x[y == k] - means[k]).T @ (x[y == k] - means[k]) for k in range(c))
    np.testing.assert_allclose(m.pooled_covariance(), within / (n - c), rtol=1e-10)
    np.testing.assert_allclose(m.pooled_covariance("n"), within / n, rtol=1e-10)
    np.testing.assert_allclose(m.class_covariance(1), np.cov(x[y == 1].T), rtol=1e-10)
    np.testing.assert_allclose(m.total_covariance(), np.cov(x.T), rtol=1e-10)
    np.testing.assert_allclose(m.class_vars[2], x[y == 2].var(0), rtol=1e-10)
    np.testing.assert_allclose(m.global_mean, x.mean(0), rtol=1e-12)


def test_empty_class_is_refused_by_name() -> None:
    x, y = gaussian_mixture(1, num_classes=2, dim=3, n=50)
    s = compute_stats(x, y, ("a", "b", "ghost"))
    with pytest.raises(
        StatsValidationError, match=r"class\(es\) 'ghost' have no samples in the aggregate"
    ):
        compute_moments(s)
    assert compute_moments(s, allow_empty_classes=True).counts[2] == 0


def test_no_samples_at_all() -> None:
    s = compute_stats(np.zeros((0, 3)), np.zeros(0, np.int64), 2)
    with pytest.raises(StatsValidationError, match="the statistics hold no samples at all"):
        compute_moments(s)


def test_single_sample_class_falls_back_to_pooled_with_warning() -> None:
    x, y = gaussian_mixture(2, num_classes=2, dim=3, n=50)
    x = np.vstack([x, np.ones((1, 3))])
    y = np.append(y, 2)
    m = compute_moments(compute_stats(x, y, 3))
    with pytest.warns(GhoflWarning, match="class '2' has 1 sample"):
        cov = m.class_covariance(2)
    np.testing.assert_allclose(cov, m.pooled_covariance())


def test_mode_errors_explain_the_fix() -> None:
    x, y = gaussian_mixture(3, num_classes=2, dim=3, n=50)
    m = compute_moments(compute_stats(x, y, 2, mode="diag"))
    with pytest.raises(
        UnsupportedModeError, match=r"needs a second-moment matrix .* --mode pooled or --mode full"
    ):
        m.pooled_covariance()
    mp = compute_moments(compute_stats(x, y, 2, mode="pooled"))
    with pytest.raises(UnsupportedModeError, match="per-class covariances need upload mode 'full'"):
        mp.class_covariance(0)


def test_shrink_conventions() -> None:
    cov = np.diag([1.0, 3.0])
    np.testing.assert_allclose(shrink(cov, 0.5), np.diag([1.5, 2.5]))
    np.testing.assert_allclose(shrink(cov, 0.5, "identity"), np.diag([1.0, 2.0]))
    np.testing.assert_allclose(shrink(cov, 0.0), cov)


def test_oas_matches_scikit_learn() -> None:
    from sklearn.covariance import oas

    rng = np.random.default_rng(0)
    x = rng.normal(size=(40, 10)) @ rng.normal(size=(10, 10))
    _, expected = oas(x)
    emp = np.cov(x.T, bias=True)
    assert oas_shrinkage(emp, x.shape[0]) == pytest.approx(expected, rel=1e-10)


@pytest.mark.parametrize("bad", [-0.1, 1.5, "big", True, None])
def test_check_shrinkage_rejects(bad: object) -> None:
    with pytest.raises(ConfigError, match="shrinkage must be a number in \\[0, 1\\] or 'auto'"):
        check_shrinkage("shrinkage", bad)


def test_check_shrinkage_accepts() -> None:
    assert check_shrinkage("s", "auto") == "auto"
    assert check_shrinkage("s", "0.3") == 0.3
    assert check_shrinkage("s", 1) == 1.0
