"""Shared test-data makers (import as ``from tests.helpers import ...``)."""

from __future__ import annotations

import numpy as np
from numpy.typing import NDArray


def gaussian_mixture(
    seed: int,
    num_classes: int = 4,
    dim: int = 8,
    n: int = 600,
    sep: float = 2.0,
    class_cov: bool = True,
) -> tuple[NDArray[np.float64], NDArray[np.int64]]:
    """Labelled Gaussian data: class means ~ N(0, sep²), per-class random covariances.

    Returns ``(x (n, dim) float64, y (n,) int64)``; every class appears at least twice.
    """
    rng = np.random.default_rng(seed)
    means = rng.normal(scale=sep, size=(num_classes, dim))
    y = np.concatenate(
        [
            np.repeat(np.arange(num_classes), 2),
            rng.integers(0, num_classes, max(n - 2 * num_classes, 0)),
        ]
    )
    rng.shuffle(y)
    x = np.empty((y.size, dim))
    for c in range(num_classes):
        idx = np.flatnonzero(y == c)
        a = rng.normal(size=(dim, dim)) / np.sqrt(dim) if class_cov else np.eye(dim)
        x[idx] = means[c] + rng.normal(size=(idx.size, dim)) @ (a + 0.5 * np.eye(dim))
    return x, y.astype(np.int64)
