"""The peer heads against scikit-learn on the pooled data: ``ncm`` (FedNCM) against
``NearestCentroid`` and a direct cosine computation, ``fed3r`` against ``Ridge`` without
intercept."""

from __future__ import annotations

import numpy as np
import pytest
from sklearn.linear_model import Ridge
from sklearn.metrics.pairwise import cosine_similarity
from sklearn.neighbors import NearestCentroid

from ghofl.errors import ConfigError, InputError, StatsValidationError, UnsupportedModeError
from ghofl.heads import make_head
from ghofl.heads.fed3r import fed3r_solution
from ghofl.stats import compute_stats, sum_stats
from tests.helpers import gaussian_mixture


def _federated_stats(x: np.ndarray, y: np.ndarray, c: int, mode: str = "pooled",
                     k: int = 7):  # type: ignore[no-untyped-def]
    """Statistics as the server sees them: k clients' payloads summed."""
    parts = np.array_split(np.random.default_rng(1).permutation(len(y)), k)
    return sum_stats(compute_stats(x[p], y[p], c, mode=mode) for p in parts)  # type: ignore[arg-type]


@pytest.mark.parametrize("mode", ["diag", "gram", "pooled", "full"])
@pytest.mark.parametrize(("c", "d"), [(2, 3), (6, 10)])
def test_ncm_euclidean_matches_nearest_centroid(mode: str, c: int, d: int) -> None:
    x, y = gaussian_mixture(c + d, num_classes=c, dim=d, n=400, sep=1.0)
    head = make_head("ncm", metric="euclidean").fit_from_stats(_federated_stats(x, y, c, mode))
    ref = NearestCentroid().fit(x, y)
    np.testing.assert_allclose(head.means_, ref.centroids_, rtol=1e-12, atol=1e-12)  # type: ignore[attr-defined]
    test = np.random.default_rng(5).normal(scale=2.0, size=(300, d))
    np.testing.assert_array_equal(head.predict(test), ref.predict(test))
    np.testing.assert_array_equal(head.predict(x), ref.predict(x))


def test_ncm_cosine_is_cosine_similarity_to_the_raw_class_means() -> None:
    x, y = gaussian_mixture(4, num_classes=5, dim=8, n=500, sep=1.0)
    x = x + 3.0  # a common offset: cosine and Euclidean rules then disagree on some rows
    head = make_head("ncm").fit_from_stats(_federated_stats(x, y, 5))
    means = np.stack([x[y == c].mean(axis=0) for c in range(5)])
    expected = cosine_similarity(x, means)
    np.testing.assert_allclose(head.class_scores(x), expected, atol=1e-12)
    np.testing.assert_array_equal(head.predict(x), np.argmax(expected, axis=1))
    euclid = make_head("ncm", metric="euclidean").fit(x, y)
    assert np.any(euclid.predict(x) != head.predict(x))  # the metric matters


def test_ncm_temperature_scales_scores_not_predictions() -> None:
    x, y = gaussian_mixture(2, num_classes=3, dim=4, n=200)
    a = make_head("ncm").fit(x, y)
    b = make_head("ncm", temperature=0.1).fit(x, y)
    np.testing.assert_allclose(b.class_scores(x), 10.0 * a.class_scores(x))
    np.testing.assert_array_equal(a.predict(x), b.predict(x))
    with pytest.raises(ConfigError, match="temperature"):
        make_head("ncm", temperature=0.0).fit(x, y)
    with pytest.raises(ConfigError, match="metric"):
        make_head("ncm", metric="manhattan").fit(x, y)


def test_ncm_refuses_a_corrupt_offset_array() -> None:
    x, y = gaussian_mixture(2, num_classes=3, dim=4, n=200)
    head = make_head("ncm").fit(x, y)
    arrays, scalars = head.get_state()
    arrays["offsets_"] = np.array([0.0, 1.0, 0.0])
    with pytest.raises(InputError, match="offsets_ holds values other than 0 and -inf"):
        make_head("ncm").set_state(head.meta_, arrays, scalars)


@pytest.mark.parametrize("mode", ["gram", "pooled"])  # gram: Fed3R's own upload
@pytest.mark.parametrize("lam", [1e-3, 0.01, 1.0, 50.0])
@pytest.mark.parametrize(("c", "d"), [(2, 4), (7, 12)])
def test_fed3r_matches_sklearn_ridge_without_intercept(lam: float, c: int, d: int,
                                                       mode: str) -> None:
    x, y = gaussian_mixture(c * d, num_classes=c, dim=d, n=600)
    stats = _federated_stats(x, y, c, mode)
    head = make_head("fed3r", lam=lam, n_calibration=0, normalize=False).fit_from_stats(stats)
    onehot = np.eye(c)[y]
    ref = Ridge(alpha=lam, fit_intercept=False, solver="cholesky").fit(x, onehot)
    np.testing.assert_allclose(head.coef_, ref.coef_, rtol=1e-8, atol=1e-10)  # type: ignore[attr-defined]
    np.testing.assert_allclose(head.class_scores(x), ref.predict(x), rtol=1e-8, atol=1e-9)


def test_fed3r_differs_from_the_centred_ridge_head() -> None:
    x, y = gaussian_mixture(3, num_classes=4, dim=6, n=400)
    x = x + 5.0
    fed = make_head("fed3r", lam=1.0, n_calibration=0, normalize=False).fit(x, y)
    onehot = np.eye(4)[y]
    centred = Ridge(alpha=1.0, fit_intercept=True).fit(x, onehot)
    assert not np.allclose(fed.coef_, centred.coef_, atol=1e-3)  # type: ignore[attr-defined]


def test_fed3r_normalized_weights_are_unit_columns_of_the_ridge_solution() -> None:
    x, y = gaussian_mixture(9, num_classes=4, dim=6, n=500)
    x = x * np.array([1.0, 3.0, 0.5, 2.0, 1.0, 1.0]) + 2.0
    raw = make_head("fed3r", lam=0.5, n_calibration=0, normalize=False).fit(x, y)
    unit = make_head("fed3r", lam=0.5, n_calibration=0).fit(x, y)
    w = raw.coef_  # type: ignore[attr-defined]
    np.testing.assert_allclose(unit.coef_, w / np.linalg.norm(w, axis=1, keepdims=True))  # type: ignore[attr-defined]
    np.testing.assert_allclose(np.linalg.norm(unit.coef_, axis=1), 1.0)  # type: ignore[attr-defined]
    scores = x @ w.T / np.linalg.norm(w, axis=1)
    np.testing.assert_array_equal(unit.predict(x), np.argmax(scores, axis=1))


def test_fed3r_calibration_keeps_predictions() -> None:
    x, y = gaussian_mixture(6, num_classes=3, dim=5, n=300)
    raw = make_head("fed3r", n_calibration=0).fit(x, y)
    cal = make_head("fed3r", n_calibration=64).fit(x, y)
    assert cal.temperature_ > 0 and cal.temperature_ != 1.0  # type: ignore[attr-defined]
    np.testing.assert_array_equal(raw.predict(x), cal.predict(x))


def test_fed3r_errors() -> None:
    x, y = gaussian_mixture(7, num_classes=3, dim=5, n=300)
    with pytest.raises(UnsupportedModeError, match="head 'fed3r' needs upload mode 'gram'"):
        make_head("fed3r").fit_from_stats(compute_stats(x, y, 3, mode="diag"))
    with pytest.raises(ConfigError, match="lam"):
        make_head("fed3r", lam=-1.0).fit(x, y)
    singular = np.zeros((3, 3))
    with pytest.raises(StatsValidationError, match=r"singular.*use lambda > 0"):
        fed3r_solution(singular, np.ones((2, 3)), 0.0)
