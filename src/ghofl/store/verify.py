"""The one check of an aggregation store that every command reading it runs, and ``verify``.

:func:`check_store` is run by every command that reads a store before it uses it (``ghofl
fit``, ``ghofl aggregate --store``, ``ghofl forget``, ``ghofl store show``, the Flower
ServerApp and the simulator with a store): the settings against their digest, every
contribution row against its digest, the rows against the list of contributions the settings
record (their ``head`` and count, :mod:`ghofl.store._integrity`), and the cached total against
the rows it claims to sum (its digest and ``members``). A store whose parts disagree, e.g. whose
``settings`` and ``total`` rows come from an older copy of the file, is refused with one line
naming what disagrees and the repair (``ghofl store verify --repair``). ``ghofl store verify``
runs the same check plus SQLite's own and the exact sum of the rows
(:func:`inspect_store` with ``full``). Nothing here writes.
"""

from __future__ import annotations

import os
import sqlite3
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from ghofl.errors import GhoflError, StoreError
from ghofl.store import _integrity as integrity
from ghofl.store import _sqlite as db
from ghofl.store._total import _canonical_sum, _unflatten
from ghofl.store.aggregation import AggregationStore
from ghofl.store.records import StoreHead

__all__ = ["StoreCheck", "check_store", "inspect_store", "inspect_within", "refusal",
           "verify_store"]

Row = tuple[Any, ...]
_TOTAL_COLUMNS = "generation, words, ints, floats, members, digest"
#: Problems named in the one-line refusal (the rest are counted; ``store verify`` lists all).
_SHOWN = 3


@dataclass(frozen=True)
class StoreCheck:
    """What :func:`inspect_store` found.

    Attributes
    ----------
    problems : tuple of str
        Every problem, one line each (empty when the store is sound).
    head : StoreHead
        Head and count of the contribution rows that pass their digests (in the order added).
    failed : tuple of str
        Client ids of the rows that fail their digests.
    repairable : bool
        Whether ``ghofl store verify --repair`` fixes every problem: rows that fail their
        digests, a total or recorded head that disagrees with the rows. It does not fix
        corrupt settings or pages SQLite cannot read.
    recorded : StoreHead or None
        The head and count the settings record (``None`` when the store records none).
    """

    problems: tuple[str, ...]
    head: StoreHead
    failed: tuple[str, ...] = ()
    repairable: bool = True
    recorded: StoreHead | None = None

    @property
    def ok(self) -> bool:
        """Whether the store passed."""
        return not self.problems


@dataclass
class _Found:
    problems: list[str] = field(default_factory=list)
    fatal: bool = False
    good: list[Row] = field(default_factory=list)  # (seq, ROW_COLUMNS...) in seq order
    failed: list[str] = field(default_factory=list)
    all_digests: list[str] = field(default_factory=list)
    recorded: StoreHead | None = None

    def step(self, what: str, check: Callable[[], list[str]], *, repairable: bool = True,
             full: bool = False) -> None:
        """Run one check; an error it raises is one more problem.

        SQLite's operational errors (disk full, busy, I/O) propagate, except in a ``full``
        verification, which lists them.
        """
        try:
            found = check()
        except sqlite3.OperationalError as exc:
            if not full:
                raise
            found, repairable = [f"{what}: {exc}"], False
        except (sqlite3.Error, GhoflError, ValueError, TypeError, OverflowError,
                LookupError) as exc:
            found, repairable = [f"{what}: {exc}"], False
        self.problems += found
        self.fatal = self.fatal or (bool(found) and not repairable)


def inspect_store(store: AggregationStore, *, full: bool = False) -> StoreCheck:
    """Every problem of an open store, in one consistent read.

    Parameters
    ----------
    store : AggregationStore
    full : bool, default False
        Also run SQLite's ``PRAGMA integrity_check`` and compare the total with the exact sum
        of the rows (fixed-point words summed modulo 2^64; on the recompute path a cached
        total against the canonical sum, bit for bit; the sample count against the rows).

    Returns
    -------
    StoreCheck
    """
    with db.transaction(store.con, write=False) as con:
        return inspect_within(store, con, full)


def check_store(store: AggregationStore) -> StoreHead:
    """The check every command runs before it reads or adds to a store; its head.

    Returns
    -------
    StoreHead
        The head and count of the store's contributions (equal to what it records).

    Raises
    ------
    StoreError
        One line naming what disagrees (rows that fail their digests, a total or recorded
        head that does not match the rows) and the repair.
    """
    found = inspect_store(store)
    if not found.ok:
        raise refusal(store.path, found)
    return found.head


def refusal(path: os.PathLike[str] | str, found: StoreCheck) -> StoreError:
    """The one-line error of a store that failed ``found``, naming the repair or the backup."""
    shown = "; ".join(found.problems[:_SHOWN])
    more = len(found.problems) - _SHOWN
    if more > 0:
        shown += f"; and {more} more (listed by 'ghofl store verify {path}')"
    fix = (f"repair it with 'ghofl store verify --repair {path}' (it rebuilds the total from "
           "the contributions that pass their digests and lists those it drops), or restore "
           "it from a backup" if found.repairable else
           "it cannot be repaired in place: restore it from a backup")
    return StoreError(f"store '{path}' failed its integrity check: {shown}; {fix}")


def verify_store(path: str | os.PathLike[str]) -> tuple[list[str], int]:
    """Every problem found in the store at ``path``, and its number of intact contributions.

    :func:`inspect_store` with ``full``; nothing is written.

    Raises
    ------
    StoreError
        The store cannot be opened at all (missing, foreign, corrupt beyond reading).
    """
    with AggregationStore(path, create=False) as store:
        found = inspect_store(store, full=True)
    return list(found.problems), found.head.count


def inspect_within(store: AggregationStore, con: sqlite3.Connection,
                   full: bool = False) -> StoreCheck:
    """:func:`inspect_store` inside the caller's transaction on ``con`` (``store.con``)."""
    found = _Found()
    if full:
        found.step("SQLite integrity check", lambda: _sqlite_check(con), repairable=False,
                   full=True)
    found.step("settings", lambda: _settings(con, found), repairable=False, full=full)
    before = len(found.problems)
    found.step("contributions", lambda: _rows(con, found), full=full)
    intact = len(found.problems) == before and not found.fatal
    found.step("contributions", lambda: _claims(found), full=full)
    found.step("total", lambda: _total(store, con, found, intact and full), full=full)
    digests = [str(r[9]) for r in found.good]
    return StoreCheck(tuple(found.problems), StoreHead(integrity.head_of(digests), len(digests)),
                      tuple(found.failed), not found.fatal, found.recorded)


def _settings(con: sqlite3.Connection, found: _Found) -> list[str]:
    claim = db.head_claim(con)  # raises StoreError on a digest mismatch
    found.recorded = None if claim is None else StoreHead(*claim)
    return []


def _sqlite_check(con: sqlite3.Connection) -> list[str]:
    rows = [str(r[0]) for r in con.execute("PRAGMA integrity_check(20)")]
    return [] if rows == ["ok"] else [f"SQLite integrity check: {m}" for m in rows]


def _rows(con: sqlite3.Connection, found: _Found) -> list[str]:
    """Check every row digest; collect the good rows (in the order added) and failed ids."""
    bad = []
    for row in con.execute(f"SELECT seq, {db.ROW_COLUMNS} FROM contributions ORDER BY seq"):
        found.all_digests.append(str(row[9]))
        if row[9] == integrity.row_digest(*row[1:9]):
            found.good.append(row)
        else:
            found.failed.append(str(row[1]))
            bad.append(f"the contribution of client {row[1]!r} does not match its integrity "
                       "digest (corrupt)")
    return bad


def _claims(found: _Found) -> list[str]:
    """The rows as stored against the head and count the settings record."""
    recorded = found.recorded
    if recorded is None:
        return []
    stored = StoreHead(integrity.head_of(found.all_digests), len(found.all_digests))
    if stored == recorded:
        return []
    return [f"its settings record {recorded.count} contributions (head "
            f"{recorded.digest[:12]}…) but it holds {stored.count} rows (head "
            f"{stored.digest[:12]}…): the rows and the settings come from different copies"]


def _total(store: AggregationStore, con: sqlite3.Connection, found: _Found,
           exact: bool) -> list[str]:
    """Check the total row; against the rows' exact sum only with ``exact`` (rows intact)."""
    row = con.execute(f"SELECT {_TOTAL_COLUMNS} FROM total WHERE id = 1").fetchone()
    if row is None:
        return ["the total row is missing"]
    out = []
    if row[5] != integrity.total_digest(*row[:5]):
        out.append("the cached total does not match its integrity digest (corrupt)")
    rows = [r[1:] for r in found.good]
    if row[4] != integrity.members_of(found.all_digests):  # the rows as recorded
        samples = _total_samples(store, con, row)
        counts = "" if samples is None or found.failed else \
            f"; it counts {samples} samples, the rows {sum(int(r[2]) for r in rows)}"
        out.append(f"its total sums another set of contributions than the "
                   f"{len(found.all_digests)} rows it holds (its member digest differs{counts})")
    meta = store.meta
    if meta is None:
        if rows:
            found.fatal = True
            return [*out, f"the store has {len(rows)} contributions but no metadata"]
        return out
    if not exact:
        return out
    return out + _exact_sum(store, con, rows, row)


def _total_samples(store: AggregationStore, con: sqlite3.Connection, row: Row) -> int | None:
    """The sample count the cached total holds (``None`` when it holds no readable one)."""
    try:
        meta, codec = store.meta, store.codec
        if meta is None:
            return None
        if codec is not None:
            return 0 if row[1] is None else codec.decode(
                meta, db.from_blob(bytes(row[1]), "<u8")).n_samples
        current = row[0] == int(db.setting(con, "generation") or "0")
        if current and isinstance(row[2], bytes) and isinstance(row[3], bytes):
            rounding = float(db.setting(con, "rounding") or "0")
            return _unflatten(meta, row[2], row[3], rounding).n_samples
    except (GhoflError, ValueError, TypeError, OverflowError, sqlite3.Error):
        pass
    return None


def _exact_sum(store: AggregationStore, con: sqlite3.Connection, rows: list[Row],
               row: Row) -> list[str]:
    """The total against the exact sum of the (intact) ``rows``."""
    meta, codec = store.meta, store.codec
    assert meta is not None
    n_rows = sum(int(r[2]) for r in rows)
    if codec is not None:
        words = [db.from_blob(bytes(r[7]), "<u8") for r in rows if isinstance(r[7], bytes)]
        stored = None if row[1] is None else db.from_blob(bytes(row[1]), "<u8")
        with np.errstate(over="ignore"):
            exact = sum(words[1:], words[0]) if words else None
        same = (exact is None and stored is None) or (
            exact is not None and stored is not None and exact.shape == stored.shape
            and bool(np.array_equal(exact, stored)))
        if not same:
            return ["the fixed-point total differs from the exact sum of the rows"]
        if stored is not None and codec.decode(meta, stored).n_samples != n_rows:
            return [f"the total counts another number of samples than the rows ({n_rows})"]
        return []
    gen = int(db.setting(con, "generation") or "0")
    if row[0] == gen and isinstance(row[2], bytes) and isinstance(row[3], bytes):
        rounding = float(db.setting(con, "rounding") or "0")
        exact_sum = _canonical_sum(meta, con, lambda r: r, rounding)
        cached = _unflatten(meta, row[2], row[3], rounding)
        arrays = zip(exact_sum.arrays().values(), cached.arrays().values(), strict=True)
        if exact_sum.n_samples != n_rows or not all(
                (a is None and b is None) or (a is not None and b is not None
                                              and np.array_equal(a, b)) for a, b in arrays):
            return ["the cached total differs from the canonical sum of the rows"]
    return []
