"""project_rows on inputs that are not float64: cast block of rows by block into a small float64
buffer, never as a whole (n, d) float64 copy, with the same product, finiteness flag, scores,
predictions and error messages as the float64 input.

Where results must be bitwise equal: the casts from float32, float16 and integers of up to 32
bits to float64 are exact, so a block's buffer holds exactly the rows of
``np.ascontiguousarray(X, np.float64)``, and its product is the same BLAS call on the same
operands as that block's rows multiplied alone. So ``project_rows`` equals, bit for bit, the
product taken block by block at the same boundaries, and the whole product ``X64 @ V`` when one
block holds every row (and for any number of worker threads: the boundaries depend on n and d
only). Across several blocks the BLAS may sum a row in another order than in one (n, d) call
(e.g. OpenBLAS's small-matrix kernel for small blocks), so there the product is compared to
within 1e-12 relative to |X| |V|.
"""

from __future__ import annotations

import tracemalloc
import warnings
from typing import Any

import numpy as np
import pytest

from ghofl.errors import InputError
from ghofl.heads import _linalg, make_head
from ghofl.heads._linalg import project_rows
from ghofl.stats import ProjectionSpec, compute_stats

D, K = 12, 3
ROWS = 4  # rows per block when the block constant is patched
FAST: dict[str, Any] = {"epochs": 1, "n_per_class": 60, "val_per_class": 20, "batch_size": 64}
NAMES = ("fishermix", "protohyper")
NAN_MESSAGE = "inputs contain NaN or infinite values; clean them before predicting"


@pytest.fixture
def small_blocks(monkeypatch: pytest.MonkeyPatch) -> int:
    """Blocks of ROWS rows at d = D."""
    monkeypatch.setattr(_linalg, "PROJECT_BLOCK_BYTES", 8 * D * ROWS)
    return ROWS


def _data(n: int, d: int = D, seed: int = 0) -> tuple[Any, Any]:
    rng = np.random.default_rng(seed)
    return rng.normal(size=(n, d)) * 3.0, rng.normal(size=(d, K))


def _blockwise(X: Any, V: Any, rows: int) -> Any:
    """The product block by block at project_rows's boundaries (the bitwise reference)."""
    X64 = np.ascontiguousarray(X, dtype=np.float64)
    parts = [X64[s:s + rows] @ V for s in range(0, X.shape[0], rows)]
    return np.concatenate(parts) if parts else np.empty((0, V.shape[1]))


def _assert_close(z: Any, X: Any, V: Any) -> None:
    """z = X V to within 1e-12 relative to |X| |V| (the scale of every rounding in it)."""
    X64 = np.asarray(X, dtype=np.float64)
    assert z.shape == (X.shape[0], V.shape[1]) and z.dtype == np.float64
    bound = 1e-12 * (np.abs(X64) @ np.abs(V)) + 1e-300
    assert np.all(np.abs(z - X64 @ V) <= bound)


def _inputs(seed: int = 0, n: int = 30) -> dict[str, Any]:
    X, _ = _data(n, seed=seed)
    X32 = X.astype(np.float32)
    return {
        "float32": X32,
        "float16": X.astype(np.float16),
        "int32": np.round(X * 100).astype(np.int32),
        "uint8": np.abs(np.round(X * 10)).astype(np.uint8),
        "float32 Fortran": np.asfortranarray(X32)[:, ::1],
        "float32 reversed rows": X32[::-1],
        "float64 strided": np.repeat(X, 2, axis=0)[::2],
    }


@pytest.mark.parametrize("kind", list(_inputs()))
@pytest.mark.parametrize("n", [0, 1, 3, ROWS, 3 * ROWS, 3 * ROWS + 1, 30])
@pytest.mark.parametrize("threads", ["1", "2", "3"])
def test_blocks_equal_the_float64_product(
    small_blocks: int, monkeypatch: pytest.MonkeyPatch, kind: str, n: int, threads: str
) -> None:
    monkeypatch.setenv("GHOFL_NUM_THREADS", threads)
    X = _inputs()[kind][:n]
    V = _data(1)[1]
    z, finite = project_rows(X, V, check_finite=True)
    assert finite
    _assert_close(z, X, V)
    np.testing.assert_array_equal(z, _blockwise(X, V, small_blocks))  # same calls, same bits


@pytest.mark.parametrize("kind", list(_inputs()))
def test_one_block_equals_the_whole_float64_product_bit_for_bit(kind: str) -> None:
    X = _inputs(n=50)[kind]  # 50 rows of 12: one block of the default size
    V = _data(1)[1]
    z = project_rows(X, V)[0]
    np.testing.assert_array_equal(z, np.ascontiguousarray(X, dtype=np.float64) @ V)


def test_strided_columns_and_rows() -> None:
    X, _ = _data(40, d=2 * D)
    X32 = X.astype(np.float32)[::3, ::2]  # non-contiguous in both axes
    V = _data(1)[1]
    z = project_rows(X32, V)[0]
    _assert_close(z, X32, V)
    np.testing.assert_array_equal(z, np.ascontiguousarray(X32, dtype=np.float64) @ V)


def test_contiguous_float64_keeps_the_direct_product() -> None:
    X, V = _data(30)
    for x in (X, np.asfortranarray(X)):
        np.testing.assert_array_equal(project_rows(x, V)[0], x @ V)


@pytest.mark.parametrize("extra", [0, 5])
def test_default_blocks_on_many_rows(extra: int) -> None:
    # three blocks of the default size at d = 64 (an exact multiple), or a few rows more
    rows = _linalg.PROJECT_BLOCK_BYTES // (8 * 64)
    rng = np.random.default_rng(5)
    X = rng.normal(size=(3 * rows + extra, 64)).astype(np.float32)
    V = rng.normal(size=(64, 9))
    z = project_rows(X, V)[0]
    _assert_close(z, X, V)
    np.testing.assert_array_equal(z, _blockwise(X, V, rows))


def test_no_whole_float64_copy_of_X(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(_linalg, "PROJECT_BLOCK_BYTES", 64 * 2**10)
    rng = np.random.default_rng(6)
    X = rng.normal(size=(4000, 64)).astype(np.float32)  # a float64 copy: 2 MiB
    V = rng.normal(size=(64, 9))
    project_rows(X, V)  # warm up (thread pool, BLAS limits)
    tracemalloc.start()
    try:
        project_rows(X, V, check_finite=True)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    # z (288 KiB) and a 64 KiB buffer per worker, far from the 2 MiB of a whole copy
    assert peak < 1 * 2**20


@pytest.mark.parametrize("bad", [np.nan, np.inf, -np.inf])
@pytest.mark.parametrize("dtype", [np.float32, np.float16])
def test_check_finite_sees_a_non_finite_value_in_any_block(
    small_blocks: int, monkeypatch: pytest.MonkeyPatch, bad: float, dtype: Any
) -> None:
    monkeypatch.setenv("GHOFL_NUM_THREADS", "2")
    X, V = _data(3 * small_blocks + 2)
    X = X.astype(dtype)
    assert project_rows(X, V, check_finite=True)[1]
    for row in (0, small_blocks - 1, small_blocks, 2 * small_blocks + 1, X.shape[0] - 1):
        Y = X.copy()
        Y[row, row % D] = bad
        with np.errstate(invalid="ignore"):  # as for float64: the BLAS may flag it
            z, finite = project_rows(Y, V, check_finite=True)
        assert not finite
        assert not np.isfinite(z[row]).all() and np.isfinite(np.delete(z, row, axis=0)).all()
        with np.errstate(invalid="ignore"):
            assert project_rows(Y, V)[1]  # unchecked


def test_the_worker_threads_follow_the_callers_errstate(
    small_blocks: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    # inf - inf in the last block's product: an invalid operation in a pool thread
    monkeypatch.setenv("GHOFL_NUM_THREADS", "2")
    X = np.ones((3 * small_blocks, D), dtype=np.float32)
    X[-1, :2] = [np.inf, -np.inf]
    V = np.ones((D, K))
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        with np.errstate(invalid="ignore"):
            assert not project_rows(X, V, check_finite=True)[1]
    with np.errstate(invalid="raise"), pytest.raises(FloatingPointError):
        project_rows(X, V)


def test_integer_inputs_are_finite() -> None:
    X, V = _data(10)
    assert project_rows(np.round(X).astype(np.int64), V, check_finite=True)[1]


# ---------------------------------------------------------------------------- heads


@pytest.fixture(scope="module")
def fitted() -> dict[str, Any]:
    pytest.importorskip("torch")
    rng = np.random.default_rng(0)
    c = 4
    y = rng.integers(0, c, 600)
    x = rng.normal(size=(600, D)) + 2.0 * rng.normal(size=(c, D))[y]
    stats = compute_stats(x, y, c, mode="full")
    projected = compute_stats(x, y, c, mode="full", projection=ProjectionSpec(2, D, 8))
    heads = {name: make_head(name, **FAST).fit_from_stats(stats) for name in NAMES}
    heads.update({f"{name} projected": make_head(name, **FAST).fit_from_stats(projected)
                  for name in NAMES})
    return heads


HEADS = [*NAMES, *(f"{name} projected" for name in NAMES)]


def _as_float64(x: Any) -> Any:
    return np.asarray(x, dtype=np.float64)


@pytest.mark.parametrize("name", HEADS)
def test_head_scores_in_one_block_equal_the_float64_scores_bit_for_bit(
    fitted: dict[str, Any], name: str
) -> None:
    head = fitted[name]
    for kind, x in _inputs(seed=7, n=50).items():
        expected = head.class_scores(_as_float64(x))
        np.testing.assert_array_equal(head.class_scores(x), expected, err_msg=kind)
        np.testing.assert_array_equal(head.predict(x), head.predict(_as_float64(x)))


@pytest.mark.parametrize("name", HEADS)
def test_head_scores_over_many_blocks_equal_the_float64_scores(
    fitted: dict[str, Any], small_blocks: int, monkeypatch: pytest.MonkeyPatch, name: str
) -> None:
    monkeypatch.setenv("GHOFL_NUM_THREADS", "2")
    head = fitted[name]
    for kind, x in _inputs(seed=8, n=50).items():
        expected = head.class_scores(_as_float64(x))
        got = head.class_scores(x)
        scale = np.abs(expected).max()
        np.testing.assert_allclose(got, expected, rtol=1e-12, atol=1e-12 * scale, err_msg=kind)
        np.testing.assert_array_equal(head.predict(x), head.predict(_as_float64(x)))
        np.testing.assert_allclose(head.predict_proba(x), head.predict_proba(_as_float64(x)),
                                   rtol=1e-10, atol=1e-14)


@pytest.mark.parametrize("name", HEADS)
@pytest.mark.parametrize("bad", [np.nan, np.inf, -np.inf])
@pytest.mark.parametrize("dtype", [np.float32, np.float16])
def test_non_finite_low_precision_inputs_are_refused_with_the_clear_message(
    fitted: dict[str, Any], small_blocks: int, name: str, bad: float, dtype: Any
) -> None:
    head = fitted[name]
    X = np.random.default_rng(2).normal(size=(5 * small_blocks, D)).astype(dtype)
    for row in (0, 3 * small_blocks + 1):
        Y = X.copy()
        Y[row, 7] = bad
        for method in (head.predict, head.predict_proba, head.decision_function):
            with pytest.raises(InputError, match=NAN_MESSAGE):
                method(Y)


def test_validated_input_keeps_the_dtype_and_the_checks(fitted: dict[str, Any]) -> None:
    head = fitted["fishermix"]
    X32 = np.ones((3, D), dtype=np.float32)
    assert head._validated_input(X32) is X32
    assert head._checked_input(X32).dtype == np.float64
    assert head._validated_input(np.ones((3, D), dtype=object)).dtype.kind == "f"
    for bad in (np.ones(D, dtype=np.float32), np.ones((3, D + 1), dtype=np.float32),
                np.ones((3, D), dtype=bool)):
        with pytest.raises(InputError) as checked:
            head._checked_input(bad)
        with pytest.raises(InputError) as validated:
            head._validated_input(bad)
        assert str(validated.value) == str(checked.value)


def test_block_products_keep_the_callers_errstate_callback_and_release_the_blas_limit(
        monkeypatch: pytest.MonkeyPatch) -> None:
    from threadpoolctl import threadpool_info

    from ghofl.heads import _linalg

    before = [p["num_threads"] for p in threadpool_info() if p["user_api"] == "blas"]
    monkeypatch.setattr(_linalg, "PROJECT_BLOCK_BYTES", 8 * 12 * 4)  # 4 rows per block
    X = np.ones((40, 12), np.float32)
    X[-1, :2] = [np.inf, -np.inf]  # inf - inf in the last block's product: 'invalid'
    seen: list[str] = []
    with np.errstate(invalid="call", call=lambda kind, flag: seen.append(kind)):
        z, finite = _linalg.project_rows(X, np.ones((12, 3)), check_finite=True)
    assert not finite and np.isnan(z[-1]).all() and seen and "invalid" in seen[0]
    after = [p["num_threads"] for p in threadpool_info() if p["user_api"] == "blas"]
    assert after == before


@pytest.mark.parametrize("name", NAMES)
def test_long_double_beyond_float64_is_refused_as_not_finite(
        fitted: dict[str, Any], name: str) -> None:
    if np.finfo(np.longdouble).max <= np.finfo(np.float64).max:
        pytest.skip("long double is float64 on this platform")
    X = np.full((2, D), np.longdouble("1e400"))  # finite as long double, inf as float64
    with pytest.raises(InputError, match=NAN_MESSAGE):
        fitted[name].predict(X)
