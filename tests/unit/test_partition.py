"""Dirichlet partitions: exact assignment, reproducibility, the effect of alpha, errors."""

from __future__ import annotations

import numpy as np
import pytest

from ghofl.data.partition import (
    dirichlet_partition,
    largest_remainder_counts,
    partition_summary,
)
from ghofl.errors import ConfigError, InputError


def _labels(num_classes: int = 5, per_class: int = 40, seed: int = 0) -> np.ndarray:
    y = np.repeat(np.arange(num_classes), per_class)
    return np.random.default_rng(seed).permutation(y)


@pytest.mark.parametrize("num_clients", [1, 3, 10, 250])
@pytest.mark.parametrize("alpha", [0.01, 0.5, 100.0])
def test_every_sample_assigned_exactly_once(num_clients: int, alpha: float) -> None:
    y = _labels()
    parts = dirichlet_partition(y, num_clients, alpha, seed=1)
    assert len(parts) == num_clients
    assert all(p.dtype == np.int64 and p.ndim == 1 for p in parts)
    np.testing.assert_array_equal(np.sort(np.concatenate(parts)), np.arange(y.size))


def test_class_counts_are_conserved() -> None:
    y = _labels(num_classes=7, per_class=13)
    parts = dirichlet_partition(y, 6, 0.3, seed=4)
    summary = partition_summary(parts, y, 7)
    assert summary.shape == (6, 7)
    np.testing.assert_array_equal(summary.sum(axis=0), np.bincount(y, minlength=7))
    np.testing.assert_array_equal(summary.sum(axis=1), [p.size for p in parts])


def test_same_seed_same_partition() -> None:
    y = _labels()
    a = dirichlet_partition(y, 8, 0.1, seed=123)
    b = dirichlet_partition(y, 8, 0.1, seed=123)
    for pa, pb in zip(a, b, strict=True):
        np.testing.assert_array_equal(pa, pb)


def test_different_seeds_differ() -> None:
    y = _labels()
    a = dirichlet_partition(y, 8, 0.1, seed=1)
    b = dirichlet_partition(y, 8, 0.1, seed=2)
    assert any(pa.size != pb.size or np.any(pa != pb) for pa, pb in zip(a, b, strict=True))


def test_generator_equals_its_seed() -> None:
    y = _labels()
    a = dirichlet_partition(y, 5, 0.5, seed=9)
    b = dirichlet_partition(y, 5, 0.5, seed=np.random.default_rng(9))
    for pa, pb in zip(a, b, strict=True):
        np.testing.assert_array_equal(pa, pb)


def _mean_max_share(alpha: float) -> float:
    y = _labels(num_classes=10, per_class=200)
    summary = partition_summary(dirichlet_partition(y, 10, alpha, seed=0), y, 10)
    return float(np.mean(summary.max(axis=0) / summary.sum(axis=0)))


def test_small_alpha_concentrates_each_class() -> None:
    assert _mean_max_share(0.01) > 0.9


def test_large_alpha_is_close_to_iid() -> None:
    assert _mean_max_share(1000.0) < 0.15


def test_skew_decreases_with_alpha() -> None:
    assert _mean_max_share(0.05) > _mean_max_share(0.5) > _mean_max_share(5.0)


def test_more_clients_than_samples_leaves_some_empty() -> None:
    y = np.array([0, 1, 1, 2])
    parts = dirichlet_partition(y, 10, 1.0, seed=0)
    assert sum(p.size == 0 for p in parts) >= 6
    np.testing.assert_array_equal(np.sort(np.concatenate(parts)), np.arange(4))


def test_empty_labels_give_empty_clients() -> None:
    parts = dirichlet_partition(np.array([], dtype=np.int64), 3, 0.5, seed=0)
    assert [p.size for p in parts] == [0, 0, 0]


def test_arbitrary_label_values_and_integral_floats() -> None:
    y = np.array([5.0, 5.0, 9.0, 9.0, 9.0, -2.0])
    parts = dirichlet_partition(y, 2, 0.5, seed=0)
    np.testing.assert_array_equal(np.sort(np.concatenate(parts)), np.arange(6))


def test_min_per_client_is_enforced_by_redrawing() -> None:
    y = _labels(num_classes=10, per_class=30)
    parts = dirichlet_partition(y, 20, 0.05, seed=0, min_per_client=3, max_tries=500)
    assert min(p.size for p in parts) >= 3
    np.testing.assert_array_equal(np.sort(np.concatenate(parts)), np.arange(y.size))


def test_min_per_client_gives_up_with_a_clear_error() -> None:
    y = _labels(num_classes=2, per_class=50)
    with pytest.raises(
        ConfigError,
        match=r"could not give every one of num_clients=50 clients at least min_per_client=2 "
        r"samples in max_tries=3 draws with alpha=0\.01 .*raise alpha",
    ):
        dirichlet_partition(y, 50, 0.01, seed=0, min_per_client=2, max_tries=3)


def test_min_per_client_impossible_is_rejected_up_front() -> None:
    with pytest.raises(ConfigError, match=r"min_per_client=3 is impossible for num_clients=4 "
                       r"with only 10 samples \(it needs at least 12\)"):
        dirichlet_partition(np.zeros(10, dtype=int), 4, 1.0, seed=0, min_per_client=3)


@pytest.mark.parametrize("alpha", [0, -1.0, float("nan"), float("inf"), "0.1", True, None])
def test_alpha_must_be_positive_and_finite(alpha: object) -> None:
    with pytest.raises(ConfigError, match=r"alpha \(the Dirichlet concentration\) must be a "
                       r"finite number > 0; got "):
        dirichlet_partition(_labels(), 3, alpha, seed=0)  # type: ignore[arg-type]


@pytest.mark.parametrize("k", [0, -2, 2.5, True])
def test_num_clients_must_be_a_positive_integer(k: object) -> None:
    with pytest.raises(ConfigError, match=r"num_clients must be an integer >= 1; got "):
        dirichlet_partition(_labels(), k, 0.5, seed=0)  # type: ignore[arg-type]


def test_min_per_client_and_max_tries_are_checked() -> None:
    with pytest.raises(ConfigError, match=r"min_per_client must be an integer >= 0; got -1"):
        dirichlet_partition(_labels(), 2, 0.5, seed=0, min_per_client=-1)
    with pytest.raises(ConfigError, match=r"max_tries must be an integer >= 1; got 0"):
        dirichlet_partition(_labels(), 2, 0.5, seed=0, max_tries=0)


@pytest.mark.parametrize("seed", [-1, 1.5, "7", None])
def test_seed_must_be_a_non_negative_integer_or_generator(seed: object) -> None:
    with pytest.raises(ConfigError, match=r"seed must be a non-negative integer or a "
                       r"numpy\.random\.Generator; got "):
        dirichlet_partition(_labels(), 2, 0.5, seed=seed)  # type: ignore[arg-type]


def test_labels_must_be_one_dimensional_integers() -> None:
    with pytest.raises(InputError, match=r"labels must be a 1-D array of class indices; "
                       r"got shape \(2, 2\)"):
        dirichlet_partition(np.zeros((2, 2), dtype=int), 2, 0.5, seed=0)
    with pytest.raises(InputError, match=r"labels must be integers; got dtype float64"):
        dirichlet_partition(np.array([0.5, 1.0]), 2, 0.5, seed=0)


def test_largest_remainder_rounding() -> None:
    np.testing.assert_array_equal(largest_remainder_counts(np.array([0.5, 0.25, 0.25]), 3),
                                  [1, 1, 1])
    np.testing.assert_array_equal(largest_remainder_counts(np.array([0.0, 1.0]), 5), [0, 5])
    rng = np.random.default_rng(0)
    for _ in range(50):
        p = rng.dirichlet(np.full(7, 0.3))
        n = int(rng.integers(0, 1000))
        counts = largest_remainder_counts(p, n)
        assert counts.sum() == n
        assert np.all(np.abs(counts - p * n) < 1.0)


def test_largest_remainder_rejects_bad_proportions() -> None:
    with pytest.raises(ConfigError, match=r"proportions must be finite, non-negative and not "
                       r"all zero"):
        largest_remainder_counts(np.zeros(3), 4)


def test_partition_summary_checks_labels() -> None:
    with pytest.raises(InputError, match=r"labels must lie in 0\.\.1 for num_classes=2; got "
                       r"values from 0 to 2"):
        partition_summary([np.arange(3)], np.array([0, 1, 2]), 2)
    with pytest.raises(ConfigError, match=r"num_classes must be an integer >= 1; got 0"):
        partition_summary([np.arange(3)], np.array([0, 1, 2]), 0)
