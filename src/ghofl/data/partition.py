"""Dirichlet label-skew partitions of a labelled dataset into federated clients.

For every class c with n_c samples, client proportions p ~ Dir(α·1_K) are drawn and turned into
integer counts by largest-remainder rounding of p·n_c, so the counts sum to n_c exactly and every
sample is assigned to exactly one client (reference-notes §1.3; unlike some reference copies, no
sample is ever dropped). Small α gives each class to few clients; large α approaches an IID split.

All randomness comes from one ``numpy.random.Generator`` (a seed or a generator passed in), so a
partition is reproducible from its seed.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
from numpy.typing import NDArray

from ghofl.errors import ConfigError, InputError

I64 = NDArray[np.int64]

__all__ = ["dirichlet_partition", "largest_remainder_counts", "partition_summary"]


def dirichlet_partition(
    labels: NDArray[Any],
    num_clients: int,
    alpha: float,
    seed: int | np.random.Generator,
    min_per_client: int = 0,
    max_tries: int = 100,
) -> list[I64]:
    """Split sample indices among clients with Dirichlet label skew.

    Parameters
    ----------
    labels : array_like of int, shape (n,)
        Class label of every sample (any integer values; each distinct value is one class).
    num_clients : int
        Number of clients K >= 1.
    alpha : float
        Dirichlet concentration α > 0 (0.05 = extreme skew, 0.5 = moderate, large = IID-like).
    seed : int or numpy.random.Generator
        Seed (non-negative int) of a fresh ``numpy.random.default_rng``, or a generator to draw
        from (it is advanced).
    min_per_client : int, default 0
        Every client must receive at least this many samples; the whole draw is repeated
        (with fresh randomness) until it holds, at most ``max_tries`` times.
    max_tries : int, default 100
        Number of draws attempted when ``min_per_client > 0``.

    Returns
    -------
    list of ndarray of int64
        ``K`` index arrays into ``labels``, each in random order; together they hold every index
        in ``0..n-1`` exactly once. A client may be empty when ``min_per_client == 0``.

    Raises
    ------
    ConfigError
        A parameter is invalid, or no draw satisfied ``min_per_client`` within ``max_tries``.
    InputError
        ``labels`` is not a 1-D integer array.

    Examples
    --------
    >>> parts = dirichlet_partition(np.array([0, 0, 1, 1, 2]), num_clients=2, alpha=0.5, seed=0)
    >>> sorted(np.concatenate(parts).tolist())
    [0, 1, 2, 3, 4]
    """
    y = _check_labels(labels)
    _check_params(num_clients, alpha, min_per_client, max_tries, y.size)
    rng = _make_rng(seed)
    by_class = [np.flatnonzero(y == c) for c in np.unique(y)]
    smallest = 0
    for _ in range(max_tries):
        parts = _draw(by_class, num_clients, float(alpha), rng)
        smallest = min(p.size for p in parts)
        if smallest >= min_per_client:
            return parts
    raise ConfigError(
        f"dirichlet_partition could not give every one of num_clients={num_clients} clients at "
        f"least min_per_client={min_per_client} samples in max_tries={max_tries} draws with "
        f"alpha={alpha} (the smallest client of the last draw got {smallest}); raise alpha, "
        "lower min_per_client or num_clients, or raise max_tries"
    )


def largest_remainder_counts(proportions: NDArray[np.float64], total: int) -> I64:
    """Integer counts proportional to ``proportions`` that sum to ``total`` exactly.

    Each entry gets ``floor(p_k·total)``; the units left over go, one each, to the entries with
    the largest fractional parts (ties to the lower index).

    Parameters
    ----------
    proportions : ndarray, shape (K,)
        Non-negative weights summing to 1 (renormalised if they do not quite).
    total : int
        Non-negative number to distribute.

    Returns
    -------
    ndarray of int64, shape (K,)
    """
    p = np.asarray(proportions, dtype=np.float64)
    s = float(p.sum())
    if not np.all(np.isfinite(p)) or np.any(p < 0) or s <= 0:
        raise ConfigError(
            f"proportions must be finite, non-negative and not all zero; got {p.tolist()}"
        )
    raw = p / s * total
    base = np.floor(raw).astype(np.int64)
    left = int(total - base.sum())
    if left > 0:
        order = np.argsort(-(raw - base), kind="stable")
        base[order[:left]] += 1
    elif left < 0:  # float rounding pushed floors above total: take from the largest counts
        order = np.argsort(-base, kind="stable")
        base[order[:-left]] -= 1
    return base


def partition_summary(parts: list[I64], labels: NDArray[Any], num_classes: int) -> I64:
    """Counts of each class held by each client.

    Parameters
    ----------
    parts : list of ndarray of int
        Index arrays as returned by :func:`dirichlet_partition` (K of them).
    labels : array_like of int, shape (n,)
        Labels in ``0..num_classes-1``.
    num_classes : int
        Number of classes C.

    Returns
    -------
    ndarray of int64, shape (K, C)
        ``out[k, c]`` = number of samples of class ``c`` on client ``k``.
    """
    y = _check_labels(labels)
    if isinstance(num_classes, bool) or not isinstance(num_classes, int | np.integer) \
            or num_classes < 1:
        raise ConfigError(f"num_classes must be an integer >= 1; got {num_classes!r}")
    if y.size and (y.min() < 0 or y.max() >= num_classes):
        raise InputError(
            f"labels must lie in 0..{num_classes - 1} for num_classes={num_classes}; "
            f"got values from {y.min()} to {y.max()}"
        )
    out = np.zeros((len(parts), int(num_classes)), dtype=np.int64)
    for k, idx in enumerate(parts):
        out[k] = np.bincount(y[np.asarray(idx, dtype=np.int64)], minlength=num_classes)
    return out


# ---------------------------------------------------------------------- helpers
def _draw(
    by_class: list[I64], num_clients: int, alpha: float, rng: np.random.Generator
) -> list[I64]:
    """One partition: per class, shuffle, draw proportions, cut contiguous slices."""
    chunks: list[list[I64]] = [[] for _ in range(num_clients)]
    for idx in by_class:
        shuffled = rng.permutation(idx)
        counts = largest_remainder_counts(_dirichlet(rng, alpha, num_clients), idx.size)
        for k, piece in enumerate(np.split(shuffled, np.cumsum(counts)[:-1])):
            if piece.size:
                chunks[k].append(piece)
    return [
        rng.permutation(np.concatenate(c)).astype(np.int64) if c else np.empty(0, np.int64)
        for c in chunks
    ]


def _dirichlet(rng: np.random.Generator, alpha: float, k: int) -> NDArray[np.float64]:
    """A draw p ~ Dir(α·1_K); for tiny α, an all-underflow draw becomes a random one-hot vector."""
    p: NDArray[np.float64] = rng.dirichlet(np.full(k, alpha))
    if not np.all(np.isfinite(p)) or float(p.sum()) <= 0.0:
        p = np.zeros(k)
        p[rng.integers(k)] = 1.0
    return p


def _check_labels(labels: NDArray[Any]) -> I64:
    y = np.asarray(labels)
    if y.ndim != 1:
        raise InputError(f"labels must be a 1-D array of class indices; got shape {y.shape}")
    if y.size and y.dtype.kind not in "iu":
        if y.dtype.kind == "f" and np.all(np.isfinite(y)) and np.all(y == np.round(y)):
            return y.astype(np.int64)
        raise InputError(f"labels must be integers; got dtype {y.dtype}")
    return y.astype(np.int64, copy=False)


def _check_params(
    num_clients: Any, alpha: Any, min_per_client: Any, max_tries: Any, n: int
) -> None:
    if not _is_int(num_clients) or num_clients < 1:
        raise ConfigError(f"num_clients must be an integer >= 1; got {num_clients!r}")
    if isinstance(alpha, bool) or not isinstance(alpha, int | float | np.integer | np.floating) \
            or not math.isfinite(float(alpha)) or float(alpha) <= 0:
        raise ConfigError(
            f"alpha (the Dirichlet concentration) must be a finite number > 0; got {alpha!r}"
        )
    if not _is_int(min_per_client) or min_per_client < 0:
        raise ConfigError(f"min_per_client must be an integer >= 0; got {min_per_client!r}")
    if not _is_int(max_tries) or max_tries < 1:
        raise ConfigError(f"max_tries must be an integer >= 1; got {max_tries!r}")
    if min_per_client * num_clients > n:
        raise ConfigError(
            f"min_per_client={min_per_client} is impossible for num_clients={num_clients} with "
            f"only {n} samples (it needs at least {min_per_client * num_clients}); lower "
            "min_per_client or num_clients"
        )


def _is_int(v: Any) -> bool:
    return isinstance(v, int | np.integer) and not isinstance(v, bool)


def _make_rng(seed: int | np.random.Generator) -> np.random.Generator:
    if isinstance(seed, np.random.Generator):
        return seed
    if not _is_int(seed) or int(seed) < 0:
        raise ConfigError(
            f"seed must be a non-negative integer or a numpy.random.Generator; got {seed!r}"
        )
    return np.random.default_rng(int(seed))
