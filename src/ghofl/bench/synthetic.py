"""Seeded synthetic classification sets on which fixed covariance shrinkage fails.

Both generators follow issue 10 ("defaults chosen from the data"):

``gaussian_classes``
    C Gaussian classes sharing the shape of one random covariance A Aᵀ, with A a d × d
    standard normal matrix divided by √d (its spectrum follows the Marchenko–Pastur law of
    ratio 1: eigenvalues from ≈ 0 to ≈ 4, so some directions have a variance close to 0).
    Class c has covariance s_c·A Aᵀ with s_c cycling through (1, 1.3, 1.6) over the classes
    (class 0 → 1, class 1 → 1.3, class 2 → 1.6, class 3 → 1, ...), and mean μ_c ~ N(0, σ_μ² I)
    with σ_μ = 1.3/√d. Samples are x = μ_c + √s_c · A z, z ~ N(0, I).
    Class means differ along the low-variance directions too, so any shrinkage toward a multiple
    of the identity (which inflates those variances) hides discriminative information.

``offset_classes``
    The same, plus one random offset vector o ~ N(0, 1.5² I) (drawn once per data set) added to
    a random half of the samples (each sample independently with probability 1/2, in the train
    and the test part alike): every class becomes a two-component mixture with one direction of
    large nuisance variance.

Labels are balanced: class c gets ⌊n/C⌋ samples plus one of the first n mod C classes, and the
rows are shuffled. Train and test parts are independent draws from the same distribution.
Everything is drawn from ``numpy.random.default_rng(seed)`` in a fixed order, so a seed gives
the same arrays on every machine.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from numpy.typing import NDArray

from ghofl.errors import ConfigError

F64 = NDArray[np.float64]
I64 = NDArray[np.int64]

#: Per-class covariance scales, cycled over the classes.
CLASS_SCALES = (1.0, 1.3, 1.6)


@dataclass(frozen=True)
class SyntheticSplit:
    """A generated data set.

    Attributes
    ----------
    x_train : ndarray, shape (n_train, d)
    y_train : ndarray of int64, shape (n_train,)
    x_test : ndarray, shape (n_test, d)
    y_test : ndarray of int64, shape (n_test,)
    num_classes : int
    """

    x_train: F64
    y_train: I64
    x_test: F64
    y_test: I64
    num_classes: int


def _check(name: str, value: int, lo: int) -> None:
    if isinstance(value, bool) or not isinstance(value, int | np.integer) or value < lo:
        raise ConfigError(f"{name} must be an integer >= {lo}; got {value!r}")


def _balanced_labels(rng: np.random.Generator, n: int, num_classes: int) -> I64:
    y = np.arange(n, dtype=np.int64) % num_classes
    out: I64 = rng.permutation(y).astype(np.int64)
    return out


def _generate(
    seed: int,
    dim: int,
    num_classes: int,
    n_train: int,
    n_test: int,
    offset_scale: float | None,
) -> SyntheticSplit:
    _check("dim", dim, 1)
    _check("num_classes", num_classes, 2)
    _check("n_train", n_train, num_classes)
    _check("n_test", n_test, 1)
    rng = np.random.default_rng(seed)
    a = rng.standard_normal((dim, dim)) / np.sqrt(dim)
    means = rng.normal(0.0, 1.3 / np.sqrt(dim), size=(num_classes, dim))
    scales = np.sqrt(np.array([CLASS_SCALES[c % len(CLASS_SCALES)] for c in range(num_classes)]))
    offset = rng.normal(0.0, offset_scale, size=dim) if offset_scale is not None else None

    def draw(n: int) -> tuple[F64, I64]:
        y = _balanced_labels(rng, n, num_classes)
        x: F64 = means[y] + (rng.standard_normal((n, dim)) @ a.T) * scales[y][:, None]
        if offset is not None:
            x[rng.random(n) < 0.5] += offset
        return x, y

    x_tr, y_tr = draw(n_train)
    x_te, y_te = draw(n_test)
    return SyntheticSplit(x_tr, y_tr, x_te, y_te, num_classes)


def gaussian_classes(
    seed: int = 0, dim: int = 48, num_classes: int = 10, n_train: int = 6000, n_test: int = 3000
) -> SyntheticSplit:
    """Gaussian classes with covariance s_c·A Aᵀ (module docstring); issue sizes by default.

    Parameters
    ----------
    seed : int
    dim : int, default 48
    num_classes : int, default 10
    n_train, n_test : int, default 6000, 3000

    Returns
    -------
    SyntheticSplit
    """
    return _generate(seed, dim, num_classes, n_train, n_test, None)


def offset_classes(
    seed: int = 0, dim: int = 32, num_classes: int = 10, n_train: int = 8000, n_test: int = 3000
) -> SyntheticSplit:
    """:func:`gaussian_classes` plus an N(0, 1.5² I) offset on a random half of the samples.

    Parameters
    ----------
    seed : int
    dim : int, default 32
    num_classes : int, default 10
    n_train, n_test : int, default 8000, 3000

    Returns
    -------
    SyntheticSplit
    """
    return _generate(seed, dim, num_classes, n_train, n_test, 1.5)


#: Generators by name, for benchmarks and tests.
GENERATORS = {"gaussian": gaussian_classes, "offset": offset_classes}

__all__ = ["CLASS_SCALES", "GENERATORS", "SyntheticSplit", "gaussian_classes", "offset_classes"]
