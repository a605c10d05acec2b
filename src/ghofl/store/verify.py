"""Check everything in an aggregation store (``ghofl store verify``), reading it only."""

from __future__ import annotations

import os
import sqlite3
from collections.abc import Callable

import numpy as np

from ghofl.errors import GhoflError
from ghofl.store import _integrity as integrity
from ghofl.store import _sqlite as db
from ghofl.store._total import _canonical_sum, _unflatten
from ghofl.store.aggregation import AggregationStore

__all__ = ["verify_store"]


def verify_store(path: str | os.PathLike[str]) -> tuple[list[str], int]:
    """Every problem found in the store at ``path``, and its number of contributions.

    Checks, in order: SQLite's own ``PRAGMA integrity_check``; the settings digest; the digest
    of every contribution row; the digest of the total row and that it sums exactly the rows
    recorded (``members``); and the total against the exact sum of the rows (the fixed-point
    words summed modulo 2^64, or, on the recompute path, a cached total against the canonical
    sum, bit for bit; the sample count against the rows' counts). Nothing is written.

    Returns
    -------
    (problems, n_contributions)
        ``problems`` is empty when the store is sound.

    Raises
    ------
    StoreError
        The store cannot be opened at all (missing, foreign, corrupt beyond reading).
    """
    problems: list[str] = []
    with AggregationStore(path, create=False) as store:
        con = store.con
        _step(problems, "SQLite integrity check", lambda: _sqlite_check(con))
        _step(problems, "settings", lambda: _settings(con))
        rows: list[tuple[object, ...]] = []
        before = len(problems)
        _step(problems, "contributions", lambda: _rows(con, rows))
        intact = len(problems) == before
        _step(problems, "total", lambda: _total(store, con, rows, intact))
    return problems, len(rows)


def _step(problems: list[str], what: str, check: Callable[[], list[str]]) -> None:
    try:
        problems += check()
    except (sqlite3.Error, GhoflError, ValueError, TypeError, OverflowError, LookupError) as exc:
        problems.append(f"{what}: {exc}")


def _settings(con: sqlite3.Connection) -> list[str]:
    db.settings(con)  # raises StoreError on a digest mismatch
    return []


def _sqlite_check(con: sqlite3.Connection) -> list[str]:
    found = [str(r[0]) for r in con.execute("PRAGMA integrity_check(20)")]
    return [] if found == ["ok"] else [f"SQLite integrity check: {m}" for m in found]


def _rows(con: sqlite3.Connection, good: list[tuple[object, ...]]) -> list[str]:
    """Check every row digest; collect the good rows in ``good`` (sorted by client id)."""
    bad = []
    for row in con.execute(f"SELECT {db.ROW_COLUMNS} FROM contributions ORDER BY client_id"):
        if row[8] == integrity.row_digest(*row[:8]):
            good.append(row)
        else:
            bad.append(f"contribution of client {row[0]!r}: does not match its integrity "
                       "digest (corrupt)")
    return bad


def _total(store: AggregationStore, con: sqlite3.Connection,
           rows: list[tuple[object, ...]], intact: bool) -> list[str]:
    """Check the total row; against the rows' exact sum only when every row is ``intact``."""
    row = con.execute(
        "SELECT generation, words, ints, floats, members, digest FROM total WHERE id = 1"
    ).fetchone()
    if row is None:
        return ["total: the total row is missing"]
    out = []
    if row[5] != integrity.total_digest(*row[:5]):
        out.append("total: the cached total does not match its integrity digest (corrupt; "
                   "opening the store writable rebuilds it from intact contributions)")
    members = integrity.members_of([str(r[8]) for r in rows])
    if row[4] != members:
        out.append(f"total: it does not sum exactly the {len(rows)} intact contributions "
                   "recorded (its member digest differs)")
    meta = store.meta
    if not intact:
        return out
    if meta is None:
        return out + ([f"total: the store has {len(rows)} contributions but no metadata"]
                      if rows else [])
    n_rows = sum(int(str(r[2])) for r in rows)
    codec = store.codec
    if codec is not None:
        words = [db.from_blob(bytes(r[7]), "<u8") for r in rows if isinstance(r[7], bytes)]
        stored = None if row[1] is None else db.from_blob(row[1], "<u8")
        with np.errstate(over="ignore"):
            exact = sum(words[1:], words[0]) if words else None
        same = (exact is None and stored is None) or (
            exact is not None and stored is not None and exact.shape == stored.shape
            and bool(np.array_equal(exact, stored)))
        if not same:
            out.append("total: the fixed-point total differs from the exact sum of the rows")
        elif stored is not None and codec.decode(meta, stored).n_samples != n_rows:
            out.append(f"total: it counts another number of samples than the rows ({n_rows})")
        return out
    gen = int(db.setting(con, "generation") or "0")
    if row[0] == gen and row[2] is not None and row[3] is not None:
        rounding = float(db.setting(con, "rounding") or "0")
        exact_sum = _canonical_sum(meta, con, lambda r: r, rounding)
        cached = _unflatten(meta, row[2], row[3], rounding)
        arrays = zip(exact_sum.arrays().values(), cached.arrays().values(), strict=True)
        if exact_sum.n_samples != n_rows or not all(
                (a is None and b is None) or (a is not None and b is not None
                                              and np.array_equal(a, b)) for a, b in arrays):
            out.append("total: the cached total differs from the canonical sum of the rows")
    return out

