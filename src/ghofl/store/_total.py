"""The total row of a store: its cache, rebuilding it, and the canonical sum of the rows."""

from __future__ import annotations

import sqlite3
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

from ghofl.secure.fixedpoint import FixedPointCodec
from ghofl.stats.client_stats import ClientStats, StatsTotal
from ghofl.stats.flat import unflatten_stats
from ghofl.stats.meta import StatsMeta
from ghofl.stats.schema import schema_for
from ghofl.store import _integrity as integrity
from ghofl.store import _sqlite as db


@dataclass(frozen=True)
class _Total:
    """The total row: cache ``generation``, BLOBs, ``members``.

    ``repaired``: rebuilt or recomputed here, to be saved.
    """

    generation: int
    words: bytes | None
    ints: bytes | None
    floats: bytes | None
    members: str
    repaired: bool = False


def _write_total(con: sqlite3.Connection, t: _Total) -> None:
    digest = integrity.total_digest(t.generation, t.words, t.ints, t.floats, t.members)
    con.execute(
        "INSERT OR REPLACE INTO total (id, generation, words, ints, floats, members, digest) "
        "VALUES (1, ?, ?, ?, ?, ?, ?)",
        (t.generation, t.words, t.ints, t.floats, t.members, digest),
    )


def _rebuilt_total(rows: list[tuple[Any, ...]], codec: FixedPointCodec | None,
                   generation: int) -> _Total:
    """The total row rebuilt from checked contribution rows.

    It holds the fixed-point sum of their words (modulo 2^64, exact), or, on the recompute
    path, no cache (recomputed when read).
    """
    members = integrity.members_of([str(r[8]) for r in rows])
    if codec is None:
        return _Total(-1, None, None, None, members, repaired=True)
    words = [db.from_blob(r[7], "<u8") for r in rows if r[7] is not None]
    if not words:
        return _Total(generation, None, None, None, members, repaired=True)
    total = np.zeros_like(words[0])
    with np.errstate(over="ignore"):
        for w in words:
            total = total + w
    return _Total(generation, db.to_blob(total), None, None, members, repaired=True)


def _blobs(stats: ClientStats) -> tuple[bytes, bytes]:
    ints, floats = schema_for(stats.mode).flatten(stats)
    return db.to_blob(ints), db.to_blob(floats)


def _canonical_sum(meta: StatsMeta, con: sqlite3.Connection,
                   check: Callable[[tuple[Any, ...]], tuple[Any, ...]],
                   rounding: float = 0.0) -> ClientStats:
    """Σ of the stored contributions (each ``check``-ed), added one at a time.

    They are added in client-id order (as :func:`~ghofl.stats.sum_stats` over them sorted by
    id would).
    """
    total = StatsTotal()  # in place: the total and one stored contribution in memory
    for row in con.execute(f"SELECT {db.ROW_COLUMNS} FROM contributions ORDER BY client_id"):
        row = check(row)
        total.add(_unflatten(meta, row[5], row[6], rounding))
    return ClientStats.zeros(meta) if not len(total) else total.result()


def _unflatten(meta: StatsMeta, ints: bytes, floats: bytes,
               rounding: float = 0.0) -> ClientStats:
    return unflatten_stats(meta, db.from_blob(ints, "<i8"), db.from_blob(floats, "<f8"),
                           rounding)
