"""ghofl.bench.peers: validation split, Fed3R at its best, byte budgets and the verdict rule."""

from __future__ import annotations

import numpy as np
import pytest

from ghofl.bench.peers import (
    decide_lead,
    fed3r_bytes,
    fed3r_system,
    fed3r_weights,
    largest_dim,
    linear_predict,
    split_validation,
)
from ghofl.errors import ConfigError
from ghofl.stats.schema import schema_for


def test_split_validation_partitions_each_client() -> None:
    parts = [np.arange(0, 20), np.arange(20, 23), np.array([23])]
    out = split_validation(parts, 0.1, seed=3)
    assert [len(v) for _, v in out] == [2, 0, 0]
    for idx, (fit, val) in zip(parts, out, strict=True):
        assert sorted([*fit, *val]) == list(idx)
    again = split_validation(parts, 0.1, seed=3)
    assert all(np.array_equal(a[1], b[1]) for a, b in zip(out, again, strict=True))


def test_split_validation_rejects_a_fraction_outside_0_1() -> None:
    with pytest.raises(ConfigError, match=r"validation fraction must lie in \(0, 1\); got 1.0"):
        split_validation([np.arange(5)], 1.0, seed=0)


def _data() -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(0)
    y = np.repeat(np.arange(3), 40)
    x = rng.normal(size=(120, 5)) + 3.0 * np.eye(3, 5)[y] + 2.0  # offset: an intercept matters
    return x, y


def test_fed3r_with_intercept_is_ridge_on_augmented_features() -> None:
    x, y = _data()
    onehot = np.eye(3)[y]
    sums, counts = onehot.T @ x, onehot.sum(axis=0).astype(np.int64)
    g, a = fed3r_system(x.T @ x, sums, counts, intercept=True)
    xa = np.hstack([x, np.ones((120, 1))])
    np.testing.assert_allclose(g, xa.T @ xa)
    np.testing.assert_allclose(a, onehot.T @ xa)
    w = fed3r_weights(g, a, 0.5, "cholesky", normalize=False)
    expect = np.linalg.solve(xa.T @ xa + 0.5 * np.eye(6), xa.T @ onehot)
    np.testing.assert_allclose(w, expect, rtol=1e-8)
    np.testing.assert_array_equal(linear_predict(x, w, True), np.argmax(xa @ expect, axis=1))
    assert fed3r_system(x.T @ x, sums, counts, intercept=False)[0].shape == (5, 5)


def test_fed3r_pinv32_matches_float64_on_a_well_conditioned_system() -> None:
    x, y = _data()
    onehot = np.eye(3)[y]
    g, a = x.T @ x, onehot.T @ x
    w32 = fed3r_weights(g, a, 0.01, "pinv32", normalize=True)
    w64 = fed3r_weights(g, a, 0.01, "cholesky", normalize=True)
    np.testing.assert_allclose(w32, w64, atol=1e-4)
    np.testing.assert_allclose(np.linalg.norm(w32, axis=0), 1.0, rtol=1e-6)


def test_fed3r_pinv32_drops_directions_below_its_cutoff() -> None:
    g = np.diag([1.0, 1e-9])
    w = fed3r_weights(g, np.eye(2), 0.0, "pinv32", normalize=False)
    np.testing.assert_allclose(w, np.diag([1.0, 0.0]))  # 1e-9 < 2·ε₃₂: cut, not inverted


def test_fed3r_weights_rejects_an_unknown_solver() -> None:
    with pytest.raises(ConfigError, match=r"unknown Fed3R solver 'lu'; use 'cholesky' or"):
        fed3r_weights(np.eye(2), np.eye(2), 0.1, "lu", normalize=False)  # type: ignore[arg-type]


def test_fed3r_bytes_and_largest_dim() -> None:
    assert fed3r_bytes(10, 1280, False) == 8 * (1280 * 1281 // 2 + 12800) == 6_661_120
    assert fed3r_bytes(10, 1280, True) == 8 * (1281 * 1282 // 2 + 12810)
    budget = schema_for("means").nbytes(10, 1280)  # FedNCM / FedCOF, float64: 102,480 B
    k64 = largest_dim(budget, 10, "gram", "float64", below=1280)
    k32 = largest_dim(budget, 10, "gram", "float32", below=1280)
    assert k64 == 128 and k32 == 192
    for k, dt in ((k64, "float64"), (k32, "float32")):
        assert schema_for("gram").nbytes(10, k, float_dtype=dt) <= budget
    assert largest_dim(10, 10, "gram", "float64", below=1280) is None
    assert largest_dim(1e12, 10, "gram", "float64", below=100) == 96


def test_decide_lead_two_standard_errors() -> None:
    assert decide_lead([0.80, 0.81, 0.82], [0.70, 0.71, 0.72])[0] == "lead"
    assert decide_lead([0.70, 0.71, 0.72], [0.80, 0.81, 0.82])[0] == "behind"
    word, cmp = decide_lead([0.70, 0.75, 0.80], [0.71, 0.76, 0.81])
    assert word == "tie" and cmp.diff == pytest.approx(-1.0)
    assert decide_lead([0.8], [0.7])[0] == "undecided"
