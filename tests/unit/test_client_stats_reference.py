"""``client_statistics`` in every mode against a plain numpy reference (issue 40).

Every path of the accumulation is covered: the modes with S_c (rows gathered by class), the
modes without it for few classes (rows in order, one-hot class sums) and for many (gathered),
float64 views and converted or clipped copies, and chunks smaller than the batch. The
finiteness of the embeddings is read from the class sums; every kind of bad entry is still
named with its first row.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from ghofl.client.job import ClientJob, client_statistics
from ghofl.errors import InputError
from ghofl.stats import StatsAccumulator
from ghofl.stats.schema import SCHEMAS, pack_upper, unpack_upper

MODES = tuple(SCHEMAS)
SAFETY = 1.0 - 2.0**-48


def reference(x: np.ndarray, y: np.ndarray, c: int, clip: float | None) -> dict[str, Any]:
    """Every statistic of ``x`` (n, d), ``y`` (n,), written directly in numpy."""
    z = np.asarray(x, dtype=np.float64).copy()
    if clip is not None:
        norms = np.linalg.norm(z, axis=1)
        over = norms > clip
        z[over] *= (clip * SAFETY / norms[over])[:, None]
    return {"counts": np.bincount(y, minlength=c),
            "sums": np.stack([z[y == k].sum(axis=0) for k in range(c)]),
            "sq_sums": np.stack([(z[y == k] ** 2).sum(axis=0) for k in range(c)]),
            "class_scatter": np.stack([z[y == k].T @ z[y == k] for k in range(c)]),
            "scatter": z.T @ z}


def assert_matches(stats: Any, want: dict[str, Any]) -> None:
    names = [a.name for a in SCHEMAS[stats.meta.mode].arrays]
    for name in names:
        np.testing.assert_allclose(getattr(stats, name), want[name], rtol=1e-12, atol=1e-9,
                                   err_msg=name)
    assert set(names) >= {"counts", "sums"}


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("classes", [3, 40])
@pytest.mark.parametrize("dtype", [np.float64, np.float32])
@pytest.mark.parametrize("clip", [None, 4.0])
def test_every_mode_matches_numpy(mode: str, classes: int, dtype: type,
                                  clip: float | None) -> None:
    rng = np.random.default_rng(classes)
    x: np.ndarray = (rng.random((700, 24)) * 2.0).astype(dtype)
    y = rng.integers(0, classes, 700)
    job = ClientJob(classes=tuple(f"c{k}" for k in range(classes)), mode=mode,  # type: ignore[arg-type]
                    clip_norm=clip)
    stats = client_statistics((x, y), job)
    want = reference(x, y, classes, clip)
    assert_matches(stats, want)
    if clip is not None:
        norms = np.linalg.norm(x.astype(np.float64), axis=1)
        assert stats.n_clipped == int(np.sum(norms > clip)) > 0


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("clip", [None, 4.0])
def test_chunks_and_slices_smaller_than_the_batch_add_up(mode: str, clip: float | None) -> None:
    rng = np.random.default_rng(5)
    x, y = rng.random((300, 10)) * 2.0, rng.integers(0, 4, 300)
    acc = StatsAccumulator(4, 10, mode, clip_norm=clip)  # type: ignore[arg-type]
    acc._chunk, acc._sum_rows = 32, 7
    acc.update(x[:170], y[:170])
    acc.update(x[170:], y[170:])
    assert_matches(acc.result(), reference(x, y, 4, clip))


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("bad", [np.nan, np.inf, -np.inf])
@pytest.mark.parametrize("clip", [None, 1.0])
def test_a_bad_entry_is_named_with_its_first_row(mode: str, bad: float,
                                                 clip: float | None) -> None:
    x, y = np.ones((50, 6)), np.arange(50) % 5
    x[[17, 30], 2] = bad
    job = ClientJob(classes=tuple("abcde"), mode=mode, clip_norm=clip)  # type: ignore[arg-type]
    with pytest.raises(InputError, match=r"^client embeddings contain NaN or infinite values "
                       r"\(first bad row 17\); fix the encoder output or drop those rows"):
        client_statistics((x, y), job)


def test_bad_entries_are_found_before_a_transform_or_the_minimum_count_rule() -> None:
    x, y = np.ones((20, 4)), np.array([0] * 18 + [1] * 2)
    x[3, 0] = -np.inf  # sqrt(max(x, 0)) would make it 0
    job = ClientJob(classes=("a", "b"), feature_transform="sqrt")
    with pytest.raises(InputError, match=r"NaN or infinite values \(first bad row 3\)"):
        client_statistics((x, y), job)
    x[3, 0] = 1.0
    x[19, 1] = np.nan  # in class b, which the minimum-count rule drops
    with pytest.raises(InputError, match=r"NaN or infinite values \(first bad row 19\)"):
        client_statistics((x, y), ClientJob(classes=("a", "b"), min_class_count=3))


def test_finite_entries_whose_sums_overflow_are_no_input_error() -> None:
    x, y = np.full((2, 3), 1e308), np.zeros(2, dtype=np.int64)
    stats = client_statistics((x, y), ClientJob(classes=("a",), mode="means"))
    assert np.isinf(stats.sums).all()


def test_labels_are_checked_without_the_pass_over_the_embeddings() -> None:
    job = ClientJob(classes=("a", "b"))
    with pytest.raises(InputError, match=r"client label 2 is out of range for 2 classes"):
        client_statistics((np.ones((3, 4)), np.array([0, 1, 2])), job)
    with pytest.raises(InputError, match=r"client embeddings must be a 2-D array \(n, d\); got "
                       r"shape \(3,\)"):
        client_statistics((np.ones(3), np.array([0, 1, 1])), job)


@pytest.mark.parametrize("shape", [(4, 4), (2, 3, 7, 7), (0, 5, 5)])
def test_pack_upper_is_the_row_major_upper_triangle(shape: tuple[int, ...]) -> None:
    a = np.random.default_rng(1).random(shape)
    m = a + np.swapaxes(a, -1, -2)
    iu = np.triu_indices(shape[-1])
    packed = pack_upper(m)
    np.testing.assert_array_equal(packed, m[..., iu[0], iu[1]])
    assert packed.flags.c_contiguous
    np.testing.assert_array_equal(unpack_upper(packed, shape[-1]), m)
