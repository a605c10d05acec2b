"""The ridge head: closed form from moments, held-out choice of the penalty, calibration."""

from __future__ import annotations

import numpy as np
import pytest

from ghofl.errors import ConfigError, StatsValidationError
from ghofl.heads import make_head
from ghofl.heads.ridge import (
    CANDIDATES,
    RidgeHead,
    gcv_scores,
    heldout_squared_error,
    ridge_solution,
)
from ghofl.moments.core import compute_moments
from ghofl.stats import compute_stats, sum_stats
from tests.helpers import gaussian_mixture


def _onehot(y: np.ndarray, c: int) -> np.ndarray:
    return np.eye(c)[y]


@pytest.mark.parametrize("alpha", [0.0, 0.01, 0.3])
@pytest.mark.parametrize("mode", ["pooled", "gram", "full"])
def test_equals_sklearn_ridge_on_pooled_data(alpha: float, mode: str) -> None:
    from sklearn.linear_model import Ridge

    x, y = gaussian_mixture(5, num_classes=4, dim=9, n=400)
    head = RidgeHead(alpha=alpha, n_calibration=0).fit_from_stats(
        compute_stats(x, y, 4, mode=mode)  # type: ignore[arg-type]
    )
    xc = x - x.mean(axis=0)
    cov = xc.T @ xc / (len(x) - 1)
    lam = alpha * np.trace(cov) / x.shape[1] * (len(x) - 1) / (1 - alpha)
    ref = Ridge(alpha=lam, fit_intercept=True, solver="cholesky").fit(x, _onehot(y, 4))
    np.testing.assert_allclose(head.coef_, ref.coef_, rtol=1e-8, atol=1e-10)
    np.testing.assert_allclose(head.intercept_, ref.intercept_, rtol=1e-8, atol=1e-10)
    np.testing.assert_allclose(head.class_scores(x), ref.predict(x), rtol=1e-8, atol=1e-9)
    assert head.temperature_ == 1.0 and head.alpha_rule_ == "fixed"


def test_eigh_and_cholesky_paths_agree() -> None:
    x, y = gaussian_mixture(6, num_classes=3, dim=7, n=300)
    m = compute_moments(compute_stats(x, y, 3, mode="pooled"))
    many = ridge_solution(m, [0.02, 0.2])
    for a, (coef, b) in zip([0.02, 0.2], many, strict=True):
        ((one_c, one_b),) = ridge_solution(m, [a])
        np.testing.assert_allclose(coef, one_c, rtol=1e-9, atol=1e-12)
        np.testing.assert_allclose(b, one_b, rtol=1e-9, atol=1e-12)


def test_heldout_squared_error_equals_direct_computation() -> None:
    x, y = gaussian_mixture(7, num_classes=3, dim=6, n=600)
    fit = compute_moments(compute_stats(x[:400], y[:400], 3, mode="pooled"))
    held = compute_moments(compute_stats(x[400:], y[400:], 3, mode="pooled"))
    sols = ridge_solution(fit, [0.0, 0.1, 0.5])
    got = heldout_squared_error(fit, held, sols)
    target = _onehot(y[400:], 3)
    want = [np.mean(np.sum((target - (x[400:] @ w + b)) ** 2, axis=1)) for w, b in sols]
    np.testing.assert_allclose(got, want, rtol=1e-9)


def test_gcv_equals_direct_computation() -> None:
    x, y = gaussian_mixture(11, num_classes=3, dim=6, n=300)
    m = compute_moments(compute_stats(x, y, 3, mode="pooled"))
    alphas = [0.0, 0.05, 0.5]
    got = gcv_scores(m, alphas)
    n = len(x)
    xc = x - x.mean(axis=0)
    want = []
    for a, (w, b) in zip(alphas, ridge_solution(m, alphas), strict=True):
        rss = np.sum((_onehot(y, 3) - (x @ w + b)) ** 2)
        cov = xc.T @ xc / (n - 1)
        lam = a * np.trace(cov) / 6 / (1 - a)
        df = np.trace(cov @ np.linalg.inv(cov + lam * np.eye(6)))
        want.append(rss / n / (1 - (df + 1) / n) ** 2)
    np.testing.assert_allclose(got, want, rtol=1e-8)


def test_auto_uses_heldout_part_when_present_else_gcv() -> None:
    x, y = gaussian_mixture(8, num_classes=3, dim=6, n=900)
    stats0 = compute_stats(x, y, 3, mode="pooled")
    plain = make_head("ridge", n_calibration=0).fit_from_stats(stats0)
    gcv = gcv_scores(compute_moments(stats0), list(CANDIDATES))
    assert (plain.alpha_, plain.alpha_rule_) == (CANDIDATES[int(np.argmin(gcv))], "gcv")
    stats = compute_stats(x, y, 3, mode="pooled", holdout_fraction=0.3)
    held = make_head("ridge", n_calibration=0).fit_from_stats(stats)
    assert held.alpha_rule_ == "heldout" and held.alpha_ in CANDIDATES
    # the chosen alpha minimises the held-out error among the candidates
    fit_m, held_m = compute_moments(stats).validation_split()  # type: ignore[misc]
    errs = heldout_squared_error(fit_m, held_m, ridge_solution(fit_m, list(CANDIDATES)))
    assert held.alpha_ == CANDIDATES[int(np.argmin(errs))]


def test_temperature_calibrates_without_changing_predictions() -> None:
    x, y = gaussian_mixture(9, num_classes=4, dim=8, n=800)
    stats = compute_stats(x, y, 4, mode="pooled")
    raw = RidgeHead(alpha=0.01, n_calibration=0).fit_from_stats(stats)
    cal = RidgeHead(alpha=0.01, n_calibration=300, seed=3).fit_from_stats(stats)
    assert 0 < cal.temperature_ < 1.0  # least-squares scores are far too flat as logits
    np.testing.assert_array_equal(raw.predict(x), cal.predict(x))
    nll = [-np.mean(h.predict_log_proba(x)[np.arange(len(y)), y]) for h in (raw, cal)]
    assert nll[1] < nll[0]
    again = RidgeHead(alpha=0.01, n_calibration=300, seed=3).fit_from_stats(stats)
    assert again.temperature_ == cal.temperature_


@pytest.mark.parametrize(
    ("params", "match"),
    [
        ({"alpha": 1.0},
         r"RidgeHead: parameter 'alpha' must be a number in \[0, 1\) or 'auto'; got 1.0"),
        ({"alpha": "big"},
         r"RidgeHead: parameter 'alpha' must be a number in \[0, 1\) or 'auto'; got 'big'"),
        ({"n_calibration": -1},
         "RidgeHead: parameter 'n_calibration' must be an integer >= 0; got -1"),
        ({"seed": 1.5}, "RidgeHead: parameter 'seed' must be an integer >= 0; got 1.5"),
    ],
)
def test_invalid_parameters(params: dict[str, object], match: str) -> None:
    x, y = gaussian_mixture(1, num_classes=2, dim=3, n=60)
    with pytest.raises(ConfigError, match=match):
        make_head("ridge", **params).fit_from_stats(compute_stats(x, y, 2, mode="pooled"))


def test_singular_covariance_needs_a_penalty() -> None:
    x, y = gaussian_mixture(2, num_classes=2, dim=4, n=80)
    x = np.concatenate([x, x[:, :1]], axis=1)  # a duplicated feature: singular covariance
    with pytest.raises(StatsValidationError, match="the total covariance is singular"):
        RidgeHead(alpha=0.0, n_calibration=0).fit_from_stats(compute_stats(x, y, 2, mode="pooled"))
    ok = RidgeHead(alpha=0.01, n_calibration=0).fit_from_stats(compute_stats(x, y, 2, mode="pooled"))
    assert ok.score(x, y) > 0.5


def test_auto_fits_a_total_covariance_that_rounding_left_slightly_indefinite() -> None:
    """float32 transport of a near-constant feature with a large mean leaves the total
    covariance with an eigenvalue just below 0; the penalty GCV picks must still fit (solved on
    the clipped spectrum GCV scored), not fail as singular."""
    from ghofl.stats.codec import through_transport

    rng = np.random.default_rng(0)
    n = 3000
    x = rng.normal(size=(n, 6))
    y = (x[:, 0] > 0).astype(int)
    x[:, 5] = 50.0 + 1e-4 * rng.normal(size=n)
    total = sum_stats(through_transport(compute_stats(x[i], y[i], 2, mode="pooled"), "float32")
                      for i in np.array_split(np.arange(n), 5))
    cov = compute_moments(total).total_scatter / (n - 1)
    assert np.linalg.eigvalsh(cov)[0] < 0  # the case this test is about
    head = make_head("ridge").fit_from_stats(total)
    assert head.alpha_rule_ == "gcv" and np.mean(head.predict(x) == y) > 0.95
