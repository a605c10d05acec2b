"""The prediction path of FisherMix and Proto-Hyper: the finiteness check read off z_f = X V_,
one BLAS thread on small products, and the same scores and errors as the generic path."""

from __future__ import annotations

import threading
from typing import Any

import numpy as np
import pytest
from threadpoolctl import threadpool_info

from ghofl.errors import InputError
from ghofl.heads import make_head
from ghofl.heads._linalg import ONE_THREAD_MACS, project_rows, small_product_threads
from ghofl.stats import compute_stats

pytest.importorskip("torch")

FAST: dict[str, Any] = {"epochs": 1, "n_per_class": 60, "val_per_class": 20, "batch_size": 64}
NAMES = ("fishermix", "protohyper")


@pytest.fixture(scope="module")
def fitted() -> dict[str, Any]:
    rng = np.random.default_rng(0)
    c, d = 4, 12
    y = rng.integers(0, c, 600)
    x = rng.normal(size=(600, d)) + 2.0 * rng.normal(size=(c, d))[y]
    stats = compute_stats(x, y, c, mode="full")
    return {name: make_head(name, **FAST).fit_from_stats(stats) for name in NAMES}


def _generic(head: Any, X: Any) -> Any:
    """The scores of the generic path: checks, finiteness pass over X, then _decision."""
    with np.errstate(over="ignore", invalid="ignore", divide="ignore"):
        return head._decision(head._prepare(X))


def _blas_threads() -> list[int]:
    return [int(i["num_threads"]) for i in threadpool_info() if i["user_api"] == "blas"]


@pytest.mark.parametrize("name", NAMES)
def test_scores_equal_the_generic_path_bit_for_bit(fitted: dict[str, Any], name: str) -> None:
    head = fitted[name]
    rng = np.random.default_rng(1)
    X = rng.normal(size=(50, 12)) * 3.0
    for x in (X, X.astype(np.float32), np.asfortranarray(X), X[::2], np.round(X).astype(int)):
        np.testing.assert_array_equal(head.class_scores(x), _generic(head, x))
        np.testing.assert_array_equal(head.predict(x), np.argmax(_generic(head, x), axis=1))


@pytest.mark.parametrize("name", NAMES)
@pytest.mark.parametrize("bad", [np.nan, np.inf, -np.inf])
def test_non_finite_inputs_are_refused_with_the_clear_message(
    fitted: dict[str, Any], name: str, bad: float
) -> None:
    head = fitted[name]
    X = np.random.default_rng(2).normal(size=(5, 12))
    X[3, 7] = bad
    for method in (head.predict, head.predict_proba, head.decision_function):
        with pytest.raises(InputError, match="inputs contain NaN or infinite values"):
            method(X)


@pytest.mark.parametrize("name", NAMES)
def test_a_zero_row_of_V_falls_back_to_checking_X(fitted: dict[str, Any], name: str) -> None:
    # feature 7 is ignored by the projection: X V_ stays finite, X itself is checked
    head = fitted[name]
    saved = head.V_
    try:
        head.V_ = saved.copy()
        head.V_[7] = 0.0
        X = np.random.default_rng(3).normal(size=(5, 12))
        head.predict(X)
        X[2, 7] = np.inf
        with pytest.raises(InputError, match="inputs contain NaN or infinite values"):
            head.predict(X)
    finally:
        head.V_ = saved


@pytest.mark.parametrize("name", NAMES)
def test_finite_inputs_whose_product_overflows_fail_as_before(
    fitted: dict[str, Any], name: str
) -> None:
    head = fitted[name]
    X = np.full((3, 12), 1e308)
    with pytest.raises(InputError, match="produced non-finite scores"):
        head.predict(X)


def test_project_rows_flags() -> None:
    rng = np.random.default_rng(4)
    X, V = rng.normal(size=(20, 6)), rng.normal(size=(6, 3))
    z, ok = project_rows(X, V, check_finite=True)
    assert ok
    np.testing.assert_array_equal(z, X @ V)
    X[4, 1] = np.nan
    assert not project_rows(X, V, check_finite=True)[1]
    assert project_rows(X, V)[1]  # unchecked
    V[1] = 0.0
    assert not project_rows(np.ones((2, 6)), V, check_finite=True)[1]


def test_small_products_run_on_one_blas_thread_and_restore_the_setting() -> None:
    before = _blas_threads()
    with small_product_threads(ONE_THREAD_MACS):
        assert set(_blas_threads()) <= {1}
    assert _blas_threads() == before
    with small_product_threads(ONE_THREAD_MACS + 1):
        assert _blas_threads() == before


def test_threads_predicting_at_once_leave_the_blas_setting_as_it_was(
    fitted: dict[str, Any]
) -> None:
    before = _blas_threads()
    X = np.random.default_rng(5).normal(size=(40, 12))
    expected = {name: head.predict(X) for name, head in fitted.items()}
    errors: list[BaseException] = []

    def work() -> None:
        try:
            for _ in range(20):
                for name, head in fitted.items():
                    np.testing.assert_array_equal(head.predict(X), expected[name])
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=work) for _ in range(4)]
    for t in threads:
        t.start()
    work()
    for t in threads:
        t.join(timeout=60)
    assert not errors
    assert _blas_threads() == before
