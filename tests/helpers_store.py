"""Payloads and an exact comparison for the store's fault and integrity tests."""

from __future__ import annotations

import sqlite3
from typing import Any

import numpy as np

from ghofl.stats import compute_stats
from ghofl.stats.client_stats import ClientStats

#: Classes and dimension of :func:`store_payloads`.
C, D = 3, 4


def store_payloads(seed: int, k: int, clip: float | None) -> list[ClientStats]:
    """``k`` small ``full`` payloads (C = 3, d = 4) of 5 to 29 samples each, from ``seed``."""
    rng = np.random.default_rng(seed)
    out = []
    for _ in range(k):
        m = int(rng.integers(5, 30))
        x = rng.normal(size=(m, D)) + rng.normal(scale=2, size=D)
        out.append(compute_stats(x, rng.integers(0, C, m), C, "full", clip_norm=clip))
    return out


def same_stats(a: ClientStats, b: ClientStats) -> bool:
    """Whether ``a`` and ``b`` are bit for bit the same statistics (metadata, counts, arrays)."""
    if a.meta.differences(b.meta) or a.n_clipped != b.n_clipped or a.n_samples != b.n_samples:
        return False
    return all(
        (x is None and y is None) or (x is not None and y is not None and np.array_equal(x, y))
        for x, y in zip(a.arrays().values(), b.arrays().values(), strict=True)
    )


class FaultyConnection:
    """A connection whose ``fail_at``-th statement (counted in ``counter[0]``) fails as a full
    disk does."""

    def __init__(self, con: sqlite3.Connection, counter: list[int], fail_at: int) -> None:
        self._con, self._counter, self._fail_at = con, counter, fail_at

    def execute(self, sql: str, *args: Any) -> sqlite3.Cursor:
        self._counter[0] += 1
        if self._counter[0] == self._fail_at:
            raise sqlite3.OperationalError("database or disk is full")
        return self._con.execute(sql, *args)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._con, name)
