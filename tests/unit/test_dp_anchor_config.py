"""diffprivlib anchors configured from the clipping rule; DP-SGD search at the row's ε."""

from __future__ import annotations

import importlib.util
from typing import Any

import numpy as np
import pytest

from ghofl.bench import dp_anchors as da
from ghofl.errors import ConfigError


def _needs(module: str) -> None:
    if importlib.util.find_spec(module) is None:
        pytest.skip(f"{module} (extra dp-anchors) is not installed")


def _problem(seed: int = 0, d: int = 8) -> tuple[Any, Any]:
    """Non-negative features (like ReLU6 averages in [0, 6]) clipped to R = 4, scaled by 1/R."""
    rng = np.random.default_rng(seed)
    y = rng.integers(0, 3, size=3000).astype(np.int64)
    means = 1.0 + 1.5 * np.eye(3, d)
    x = np.clip(means[y] + 0.4 * rng.normal(size=(3000, d)), 0.0, 6.0)
    x = da.clipped_rows(x, 4.0) / 4.0
    return (x[:2000], y[:2000]), (x[2000:], y[2000:])


def test_feature_bounds_follow_the_clipping_rule() -> None:
    assert da.feature_bounds((0.0, 6.0), 28.0) == (0.0, 6.0 / 28.0)
    assert da.feature_bounds((0.0, 6.0), 4.0) == (0.0, 1.0)  # the norm bound is tighter
    assert da.feature_bounds((-1.0, 1.0), 1.01) == (-1.0 / 1.01, 1.0 / 1.01)
    assert da.feature_bounds((1.0, 3.0), 10.0) == (0.0, 0.3)  # clipping shrinks towards 0
    assert da.feature_bounds(None, 5.0) == (-1.0, 1.0)
    (x, _), _ = _problem()
    lo, hi = da.feature_bounds((0.0, 6.0), 4.0)
    assert x.min() >= lo and x.max() <= hi


@pytest.mark.parametrize(("call", "match"), [
    (lambda: da.feature_bounds((0.0, 1.0), 0.0), r"clip must be a positive L2 bound"),
    (lambda: da.feature_bounds((2.0, 1.0), 1.0), r"low <= high"),
    (lambda: da.check_rows(np.array([[3.0, 4.0]]), data_norm=1.0),
     r"L2 norm up to 5 > data_norm 1: pass the rows clipped"),
    (lambda: da.check_rows(np.array([[0.5, -0.2]]), bounds=(0.0, 1.0)),
     r"outside the bounds given to GaussianNB: pass the clipped rows"),
    (lambda: da.per_run_epsilon([], 100, 1.0, 1e-5), r"needs eps > 0 and a non-empty grid"),
])
def test_bad_configuration_is_named(call: Any, match: str) -> None:
    with pytest.raises(ConfigError, match=match):
        call()


def test_diffprivlib_refuses_rows_that_are_not_the_clipped_ones() -> None:
    _needs("diffprivlib")
    (x, y), test = _problem()
    with pytest.raises(ConfigError, match="data_norm"):
        da.diffprivlib_lr((4.0 * x, y), test, 1.0, 1.0, 0)
    with pytest.raises(ConfigError, match="GaussianNB"):
        da.diffprivlib_nb((x - 0.5, y), test, 1.0, (0.0, 1.0), 0)


def test_diffprivlib_at_large_eps_reaches_the_non_private_accuracy() -> None:
    _needs("diffprivlib")
    from sklearn.linear_model import LogisticRegression
    from sklearn.naive_bayes import GaussianNB

    train, test = _problem()
    bounds = da.feature_bounds((0.0, 6.0), 4.0)
    nb = GaussianNB().fit(*train).score(*test)
    lr = LogisticRegression(C=1.0, max_iter=300).fit(*train).score(*test)
    assert nb > 0.9 and lr > 0.9
    assert da.diffprivlib_nb(train, test, 1e6, bounds, 0) >= nb - 0.02
    assert da.diffprivlib_lr(train, test, 1e6, 1.0, 0) >= lr - 0.02
    # and the noise is real: a tiny ε is far below
    assert da.diffprivlib_nb(train, test, 1e-3, bounds, 0) < nb - 0.2


def test_search_at_the_rows_eps_spends_exactly_that_eps() -> None:
    _needs("opacus")
    grid = [da.SGDConfig(1.0, 2.0, 2, 200), da.SGDConfig(1.0, 8.0, 3, 400)]
    n = 1800
    for eps in (0.5, 2.0):
        e_run = da.per_run_epsilon(grid, n, eps, 1e-5)
        assert e_run < eps
        sched = [(g.batch / n, g.epochs * round(n / g.batch)) for g in grid]
        runs = [(da._noise_multiplier(e_run, 1e-5, q, t), q, t) for q, t in sched]
        spent = da.composed_epsilon(runs, 1e-5)
        assert 0.98 * eps <= spent <= eps
    train, test = _problem()
    out = da.dpsgd_probe(train, test, 3, 2.0, 1e-5, grid, seed=1,
                         eps_run=da.per_run_epsilon(grid, 1800, 2.0, 1e-5))
    assert out["eps_search"] <= 2.0 and out["eps_runs_composed"] >= 0.98 * 2.0
    assert out["eps_select"] == 2.0 and out["eps_run"] < 2.0
