"""The fast logistic-regression probe (ghofl.bench.logreg) against scikit-learn's oracle."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from ghofl.errors import ConfigError, InputError

pytest.importorskip("sklearn")

from ghofl.bench.logreg import LogisticProbe, fit_path, multinomial_loss_grad


def _blobs(seed: int, n: int = 400, d: int = 12, k: int = 4) -> tuple[Any, Any]:
    rng = np.random.default_rng(seed)
    means = rng.standard_normal((k, d))
    y = rng.integers(0, k, n)
    return means[y] + rng.standard_normal((n, d)), y


@pytest.mark.parametrize("c", [0.01, 0.3, 3.0])
def test_float64_probe_equals_sklearn_logistic_regression(c: float) -> None:
    from sklearn import linear_model as sklearn_lm
    x, y = _blobs(0)
    ref = sklearn_lm.LogisticRegression(C=c, tol=1e-10, max_iter=5000).fit(x, y)
    probe = LogisticProbe(C=c, tol=1e-10, max_iter=5000, matmul_dtype="float64").fit(x, y)
    scale = np.abs(ref.coef_).max()
    np.testing.assert_allclose(probe.coef_, ref.coef_, atol=1e-6 * scale)
    # the intercept is determined up to a common shift (softmax invariance)
    np.testing.assert_allclose(probe.intercept_ - probe.intercept_.mean(),
                               ref.intercept_ - ref.intercept_.mean(), atol=1e-6 * scale)
    np.testing.assert_allclose(probe.predict_proba(x), ref.predict_proba(x), atol=1e-7)
    assert probe.converged_


@pytest.mark.parametrize("c", [0.01, 1.0])
def test_float32_products_and_default_tolerance_match_sklearn(c: float) -> None:
    from sklearn import linear_model as sklearn_lm
    x, y = _blobs(1, n=600, d=20, k=6)
    ref = sklearn_lm.LogisticRegression(C=c).fit(x, y)
    probe = LogisticProbe(C=c).fit(x, y)
    np.testing.assert_allclose(probe.predict_proba(x), ref.predict_proba(x), atol=1e-3)
    assert np.mean(probe.predict(x) == ref.predict(x)) >= 0.99


def test_gradient_matches_finite_differences() -> None:
    x, y = _blobs(2, n=50, d=5, k=3)
    rng = np.random.default_rng(3)
    w = rng.standard_normal(3 * 6) * 0.3
    f, g = multinomial_loss_grad(w, x, y, 0.05, 3)
    eps = 1e-6
    num = np.array([(multinomial_loss_grad(w + eps * e, x, y, 0.05, 3)[0]
                     - multinomial_loss_grad(w - eps * e, x, y, 0.05, 3)[0]) / (2 * eps)
                    for e in np.eye(w.size)])
    np.testing.assert_allclose(g, num, atol=1e-7)
    assert np.isfinite(f)


def test_warm_started_path_reaches_each_cold_solution_in_fewer_iterations() -> None:
    x, y = _blobs(4, n=500, d=30, k=5)
    cs = (0.3, 0.01, 0.03, 0.1)
    path = fit_path(x, y, cs, tol=1e-8, max_iter=5000, matmul_dtype="float64")
    assert list(path) == sorted(cs)
    cold_iters = warm_iters = 0
    for c, warm in path.items():
        cold = LogisticProbe(C=c, tol=1e-8, max_iter=5000, matmul_dtype="float64").fit(x, y)
        np.testing.assert_allclose(warm.predict_proba(x), cold.predict_proba(x), atol=1e-6)
        cold_iters += cold.n_iter_
        warm_iters += warm.n_iter_
    assert warm_iters < cold_iters


def test_string_labels_are_returned_by_predict() -> None:
    x, y = _blobs(5)
    names = np.array(["ant", "bee", "cat", "dog"])[y]
    probe = LogisticProbe(C=1.0).fit(x, names)
    assert list(probe.classes_) == ["ant", "bee", "cat", "dog"]
    assert probe.score(x, names) > 0.9


@pytest.mark.parametrize(("kwargs", "match"), [
    ({"C": 0.0}, "C must be a finite number > 0"),
    ({"tol": -1.0}, "tol must be > 0"),
    ({"max_iter": 0}, "max_iter must be an integer >= 1"),
    ({"matmul_dtype": "float16"}, "matmul_dtype must be 'float32' or 'float64'"),
])
def test_bad_settings_are_named(kwargs: dict[str, Any], match: str) -> None:
    x, y = _blobs(6)
    with pytest.raises(ConfigError, match=match):
        LogisticProbe(**kwargs).fit(x, y)


def test_bad_inputs_are_named() -> None:
    x, y = _blobs(7)
    with pytest.raises(InputError, match="one label per row"):
        LogisticProbe().fit(x, y[:-1])
    with pytest.raises(InputError, match="at least 2"):
        LogisticProbe().fit(x, np.zeros(len(y)))
    bad = x.copy()
    bad[0, 0] = np.nan
    with pytest.raises(InputError, match="NaN or infinite"):
        LogisticProbe().fit(bad, y)
    with pytest.raises(InputError, match="not fitted"):
        LogisticProbe().predict(x)
    assert LogisticProbe(C=0.5).get_params()["C"] == 0.5
