"""Which rows a client holds out for the federated evaluation: one keyed hash per row.

Row i (embedding x_i, integer label y_i) is held out iff u_i < f, where u_i in [0, 1) is the
first 53 bits of BLAKE2b (8-byte digest, keyed by the seed) of the float64 bytes of x_i and
the int64 bytes of y_i, divided by 2^53. The decision for a row depends on that row, the seed
and f only: not on the client's number of rows nor on its other rows, so adding or removing
one row (the unit of differential privacy of the evaluation, :mod:`ghofl.server.eval_privacy`)
changes no other row's assignment. Distinct rows are held out independently, each with
probability f (about f·n of n rows); equal rows fall on the same side. No rule keeps a row on
either side: a client may hold out none of its rows (it then sends zero sums) or all of them.

:func:`rows_digest` is what a client's round ledger records of the rows it scored
(:meth:`ghofl.secure.VectorPayload.ledger_key`): one evaluation round per held-out set.
"""

from __future__ import annotations

import hashlib
from typing import Any

import numpy as np
from numpy.typing import NDArray

from ghofl.errors import ConfigError, InputError

__all__ = ["held_out_mask", "rows_digest", "split_rows"]

_PERSON = b"ghofl-heldout"


def _rows(x: NDArray[Any], y: NDArray[Any]) -> tuple[NDArray[np.float64], NDArray[np.int64]]:
    """``x`` as C-contiguous float64 of shape (n, d) and ``y`` as int64 of shape (n,)."""
    xs, ys = np.asarray(x), np.asarray(y)
    if xs.ndim != 2 or ys.shape != (xs.shape[0],):
        raise InputError(f"the rows to split must be embeddings of shape (n, d) with labels of "
                         f"shape (n,); got {xs.shape} and {ys.shape}")
    return np.ascontiguousarray(xs, dtype=np.float64), ys.astype(np.int64)


def held_out_mask(x: NDArray[Any], y: NDArray[Any], fraction: float,
                  seed: int) -> NDArray[np.bool_]:
    """Which rows are held out (see the module docstring).

    Parameters
    ----------
    x : ndarray, shape (n, d)
        The client's embeddings (compared as float64).
    y : ndarray of int, shape (n,)
        Their labels.
    fraction : float
        f in [0, 1); 0 holds out nothing.
    seed : int
        The key of the hash (e.g. the plan's seed).

    Returns
    -------
    ndarray of bool, shape (n,)

    Raises
    ------
    ConfigError
        ``fraction`` is not in [0, 1).
    InputError
        ``x`` and ``y`` do not have the shapes above.
    """
    if isinstance(fraction, bool) or not isinstance(fraction, int | float) or not (
            0.0 <= float(fraction) < 1.0):
        raise ConfigError(f"the evaluation fraction must be in [0, 1) (e.g. 0.2); got "
                          f"{fraction!r}")
    rows, labels = _rows(x, y)
    out = np.zeros(labels.size, dtype=bool)
    if fraction == 0.0:
        return out
    base = hashlib.blake2b(digest_size=8, key=str(int(seed)).encode(), person=_PERSON)
    threshold = int(float(fraction) * 2.0**53)
    for i in range(labels.size):
        h = base.copy()
        h.update(rows[i].tobytes())
        h.update(labels[i].tobytes())
        out[i] = (int.from_bytes(h.digest(), "big") >> 11) < threshold
    return out


def split_rows(x: NDArray[Any], y: NDArray[Any], fraction: float, seed: int
               ) -> tuple[NDArray[np.int64], NDArray[np.int64]]:
    """(training rows, held-out rows): the sorted indices of :func:`held_out_mask`'s split.

    Returns
    -------
    train : ndarray of int64, shape (n − h,)
    held : ndarray of int64, shape (h,)
    """
    mask = held_out_mask(x, y, fraction, seed)
    return (np.flatnonzero(~mask).astype(np.int64), np.flatnonzero(mask).astype(np.int64))


def rows_digest(x: NDArray[Any], y: NDArray[Any]) -> str:
    """Hex SHA-256 of rows and labels (their float64 and int64 bytes, in order).

    Parameters
    ----------
    x : ndarray, shape (n, d)
    y : ndarray of int, shape (n,)
    """
    rows, labels = _rows(x, y)
    h = hashlib.sha256(f"ghofl.rows|{rows.shape}|".encode())
    h.update(rows.tobytes())
    h.update(labels.tobytes())
    return h.hexdigest()
