"""One contract, every registered head: the scikit-learn surface behaves the same everywhere."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest

from ghofl.errors import ConfigError, InputError, NotFittedError, UnsupportedModeError
from ghofl.heads import Head, available_heads, head_class, load_head, make_head, save_head
from ghofl.stats import ProjectionSpec, compute_stats
from ghofl.stats.schema import mode_supports
from tests.helpers import gaussian_mixture

# Small training budgets for the trainable heads; keys a head does not have are ignored.
FAST = {"epochs": 3, "n_per_class": 200, "batch_size": 256}


def _make(name: str, **extra: Any) -> Head:
    params = make_head(name).get_params()
    fast = {k: v for k, v in FAST.items() if k in params}
    return make_head(name, **fast, **extra)


HEADS = available_heads()


@pytest.fixture(scope="module", params=[2, 5], ids=["C2", "C5"])
def data(request: pytest.FixtureRequest) -> tuple[np.ndarray, np.ndarray, int]:
    c = int(request.param)
    x, y = gaussian_mixture(100 + c, num_classes=c, dim=7, n=120 * c)
    return x, y, c


@pytest.mark.parametrize("name", HEADS)
def test_not_fitted_error(name: str) -> None:
    head = _make(name)
    with pytest.raises(NotFittedError, match=f"this {type(head).__name__} is not fitted yet"):
        head.predict(np.zeros((2, 3)))


@pytest.mark.parametrize("name", HEADS)
def test_shapes_probabilities_and_consistency(
    name: str, data: tuple[np.ndarray, np.ndarray, int]
) -> None:
    x, y, c = data
    head = _make(name).fit_from_stats(compute_stats(x, y, c))
    n = 17
    scores = head.class_scores(x[:n])
    proba = head.predict_proba(x[:n])
    log_proba = head.predict_log_proba(x[:n])
    assert scores.shape == proba.shape == log_proba.shape == (n, c)
    np.testing.assert_allclose(proba.sum(axis=1), 1.0, atol=1e-12)
    np.testing.assert_allclose(np.exp(log_proba), proba, atol=1e-12)
    np.testing.assert_array_equal(head.predict(x[:n]), np.argmax(scores, axis=1))
    # scikit-learn's shapes: (n,) for two classes (classes_[1] vs classes_[0]), else (n, C)
    decision = head.decision_function(x[:n])
    if c == 2:
        np.testing.assert_array_equal(decision, scores[:, 1] - scores[:, 0])
        np.testing.assert_array_equal(head.predict(x[:n]), (decision > 0).astype(np.int64))
    else:
        np.testing.assert_array_equal(decision, scores)
    assert head.predict(x[:n]).dtype == np.int64
    np.testing.assert_array_equal(head.classes_, np.arange(c))
    assert head.n_features_in_ == x.shape[1]
    assert head.score(x, y) > 1.0 / c  # better than chance on separable data


@pytest.mark.parametrize("name", HEADS)
def test_float32_input_gives_same_predictions(
    name: str, data: tuple[np.ndarray, np.ndarray, int]
) -> None:
    x, y, c = data
    head = _make(name).fit_from_stats(compute_stats(x, y, c))
    x32 = x.astype(np.float32)
    np.testing.assert_allclose(head.predict_proba(x32), head.predict_proba(x32.astype(np.float64)))


@pytest.mark.parametrize("name", HEADS)
def test_save_load_round_trip(
    name: str, tmp_path: Path, data: tuple[np.ndarray, np.ndarray, int]
) -> None:
    x, y, c = data
    head = _make(name).fit_from_stats(compute_stats(x, y, c))
    save_head(head, tmp_path / f"{name}.ghh")
    back = load_head(tmp_path / f"{name}.ghh")
    assert type(back) is type(head) and back.get_params() == head.get_params()
    np.testing.assert_array_equal(back.predict_proba(x[:20]), head.predict_proba(x[:20]))


@pytest.mark.parametrize("name", HEADS)
def test_input_validation(name: str, data: tuple[np.ndarray, np.ndarray, int]) -> None:
    x, y, c = data
    head = _make(name).fit_from_stats(compute_stats(x, y, c))
    with pytest.raises(InputError, match="fitted on 7-dimensional embeddings but got 5 features"):
        head.predict(x[:3, :5])
    with pytest.raises(InputError, match=r"inputs must be a 2-D array \(n, d\); got shape \(7,\)"):
        head.predict(x[0])
    bad = x[:3].copy()
    bad[1, 2] = np.nan
    with pytest.raises(InputError, match="inputs contain NaN or infinite values"):
        head.predict_proba(bad)


@pytest.mark.parametrize("name", HEADS)
def test_projected_statistics(name: str) -> None:
    x, y = gaussian_mixture(9, num_classes=3, dim=12, n=360)
    spec = ProjectionSpec(4, 12, 6)
    head = _make(name).fit_from_stats(compute_stats(x, y, 3, projection=spec))
    assert head.predict_proba(x).shape == (360, 3) and head.n_features_in_ == 12


@pytest.mark.parametrize("name", HEADS)
def test_mode_requirement_is_enforced(name: str) -> None:
    x, y = gaussian_mixture(3, num_classes=3, dim=5, n=150)
    cls = head_class(name)
    for mode in ("means", "diag", "gram", "pooled", "full"):
        stats = compute_stats(x, y, 3, mode=mode)  # type: ignore[arg-type]
        if not mode_supports(mode, cls.min_mode):
            with pytest.raises(
                UnsupportedModeError, match=f"head '{name}' needs upload mode '{cls.min_mode}'"
            ):
                _make(name).fit_from_stats(stats)
        else:
            assert _make(name).fit_from_stats(stats).predict(x[:2]).shape == (2,)


@pytest.mark.parametrize("name", HEADS)
def test_params_round_trip_and_unknown_param(name: str) -> None:
    head = _make(name)
    params = head.get_params()
    assert make_head(name, **params).get_params() == params
    with pytest.raises(ConfigError, match=f"invalid parameters for head '{name}'"):
        make_head(name, no_such_parameter=1)
    with pytest.raises(ConfigError, match="has no parameter 'no_such_parameter'"):
        head.set_params(no_such_parameter=1)


def test_unknown_head_lists_available() -> None:
    with pytest.raises(
        ConfigError, match="unknown head 'svm'; available heads: nb, lda, qda, fedcgs"
    ):
        make_head("svm")
