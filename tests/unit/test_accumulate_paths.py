"""Accumulation (sorted class blocks, B from row chunks, first updates with beta = 0) and the
hand-over of B agree with the sums they stand for, up to float rounding."""

from __future__ import annotations

import numpy as np
import pytest

from ghofl.errors import InputError
from ghofl.stats import StatsAccumulator, compute_stats
from ghofl.stats import accumulate as acc_mod


def _oracle(x: np.ndarray, y: np.ndarray, c: int) -> dict[str, np.ndarray]:
    return {"counts": np.bincount(y, minlength=c),
            "sums": np.stack([x[y == k].sum(axis=0) for k in range(c)]),
            "sq_sums": np.stack([(x[y == k] ** 2).sum(axis=0) for k in range(c)]),
            "scatter": x.T @ x}


@pytest.mark.parametrize("c", [3, 40])
@pytest.mark.parametrize("dtype", [np.float64, np.float32])
@pytest.mark.parametrize("chunk", [None, 16])
def test_pooled_statistics_match_the_sums(c: int, dtype: type, chunk: int | None) -> None:
    rng = np.random.default_rng(c)
    x: np.ndarray = rng.standard_normal((150, 12)).astype(dtype)
    y = rng.integers(0, c, 150)
    acc = StatsAccumulator(c, 12, mode="pooled")
    if chunk is not None:
        acc._chunk = chunk
    acc.update(x, y)
    s = acc.result()
    want = _oracle(x.astype(np.float64), y, c)
    for name, value in want.items():
        np.testing.assert_allclose(getattr(s, name), value, rtol=1e-12, atol=1e-12)


def test_a_result_is_not_changed_by_later_batches() -> None:
    rng = np.random.default_rng(1)
    x, y = rng.standard_normal((60, 8)), rng.integers(0, 3, 60)
    acc = StatsAccumulator(3, 8, mode="pooled")
    acc.update(x[:30], y[:30])
    first = acc.result()
    kept = np.array(first.scatter)
    assert first.scatter is not None and first.scatter.flags.c_contiguous
    np.testing.assert_array_equal(first.scatter, first.scatter.T)
    acc.update(x[30:], y[30:])
    second = acc.result()
    np.testing.assert_array_equal(first.scatter, kept)
    assert second.scatter is not None
    np.testing.assert_allclose(np.asarray(second.scatter), x.T @ x, rtol=1e-12)
    assert acc.result().scatter is second.scatter  # twice in a row: the same array


def test_finite_skips_only_the_finiteness_pass() -> None:
    x = np.ones((4, 3))
    x[2, 1] = np.nan
    with pytest.raises(InputError, match=r"NaN or infinite values \(first bad row 2\)"):
        compute_stats(x, np.zeros(4, int), 2, mode="pooled")
    with pytest.raises(InputError, match="out of range"):
        compute_stats(np.ones((4, 3)), np.full(4, 5), 2, mode="pooled", finite=True)


def test_chunked_finiteness_finds_a_bad_entry_in_any_chunk() -> None:
    x = np.zeros((10_000, 2))
    assert acc_mod._all_finite(x)
    x[9_999, 1] = np.inf
    assert not acc_mod._all_finite(x)



@pytest.mark.parametrize("mode", ["pooled", "diag"])
@pytest.mark.parametrize("kind", ["view", "float32", "clipped", "strided"])
@pytest.mark.parametrize(("sum_rows", "chunk"), [(5, 10_000), (7, 30), (1_000, 10_000)])
def test_row_order_accumulation_matches_the_sums(
    mode: str, kind: str, sum_rows: int, chunk: int
) -> None:
    """The row-order path (few classes, no S_c): B in row chunks, the class sums in one-hot
    slices (several, a last partial one), for every kind of input, clipped or not."""
    rng = np.random.default_rng(sum_rows + chunk)
    x = rng.standard_normal((613, 9))
    y = rng.integers(0, 4, 613)
    clip = 2.5 if kind == "clipped" else None
    acc = StatsAccumulator(4, 9, mode=mode, clip_norm=clip)  # type: ignore[arg-type]
    acc._sum_rows, acc._chunk = sum_rows, chunk
    inputs: dict[str, np.ndarray] = {"view": x, "float32": x.astype(np.float32),
                                     "clipped": x, "strided": np.asfortranarray(x)}
    data = inputs[kind]
    acc.update(data, y)
    s = acc.result()
    z = data.astype(np.float64)
    if clip is not None:
        norms = np.linalg.norm(z, axis=1)
        z = z * np.minimum(1.0, clip * acc_mod._CLIP_SAFETY / norms)[:, None]
        assert s.n_clipped == int(np.sum(norms > clip)) > 0
    want = _oracle(z, y, 4)
    if mode == "diag":
        del want["scatter"]
    for name, value in want.items():
        np.testing.assert_allclose(getattr(s, name), value, rtol=1e-12, atol=1e-12)
