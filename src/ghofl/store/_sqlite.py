"""The SQLite file behind :class:`~ghofl.store.AggregationStore`: tables, pragmas, transactions.

Standard-library :mod:`sqlite3` only, in write-ahead-log mode with ``synchronous=FULL``: every
change is one ``BEGIN IMMEDIATE … COMMIT`` transaction, so a process killed at any instant
(SIGKILL, power loss) leaves the file in the state before or after that change, never between.

Tables
------
``settings``       key/value text: ``format``, ``version``, ``meta`` (StatsMeta JSON, set by the
                   first contribution), ``max_contributions``, ``max_samples``, ``generation``
                   (bumped by every change), ``rounding`` (unit roundoff of the coarsest
                   transport of any contribution added, e.g. 2^-24 after float32; absent: 0).
``contributions``  one row per recorded contribution: ``client_id`` and ``sha256`` (both
                   unique), ``n_samples``, ``n_clipped``, ``added_at`` (ISO 8601, UTC), the
                   schema-flattened statistics ``ints`` (int64) and ``floats`` (float64), and,
                   for payloads with a clipping bound, their fixed-point ``words`` (uint64).
``total``          one row: the running total as fixed-point ``words`` (payloads with a clipping
                   bound), or a cache of the recomputed total (``ints``/``floats``) valid for
                   the ``generation`` it was computed at (payloads without one).

Arrays are stored little-endian as BLOBs.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import numpy as np
from numpy.typing import NDArray

from ghofl.errors import StoreError

FORMAT = "ghofl.store"
VERSION = 1
#: The first 16 bytes of every SQLite 3 database file.
SQLITE_HEADER = b"SQLite format 3\x00"
BUSY_TIMEOUT_MS = 30_000

_TABLES = (
    "CREATE TABLE settings (key TEXT PRIMARY KEY, value TEXT NOT NULL)",
    """CREATE TABLE contributions (
    seq INTEGER PRIMARY KEY AUTOINCREMENT,
    client_id TEXT NOT NULL UNIQUE,
    sha256 TEXT NOT NULL UNIQUE,
    n_samples INTEGER NOT NULL CHECK (n_samples >= 0),
    n_clipped INTEGER NOT NULL CHECK (n_clipped >= 0),
    added_at TEXT NOT NULL,
    ints BLOB NOT NULL,
    floats BLOB NOT NULL,
    words BLOB
)""",
    """CREATE TABLE total (
    id INTEGER PRIMARY KEY CHECK (id = 1),
    generation INTEGER NOT NULL,
    words BLOB,
    ints BLOB,
    floats BLOB
)""",
)


def connect(path: Path, create: bool) -> sqlite3.Connection:
    """Open (and with ``create``, initialise) the store file at ``path``.

    Raises
    ------
    StoreError
        The file does not exist (and ``create`` is false), is a directory, is not a SQLite
        database, or is a SQLite database that is not a ghofl store.
    """
    if path.is_dir():
        raise StoreError(f"store path '{path}' is a directory; give a database file path")
    if not path.exists():
        if not create:
            raise StoreError(
                f"store '{path}' does not exist; create it with "
                f"'ghofl aggregate --store {path} PAYLOAD...'"
            )
        path.parent.mkdir(parents=True, exist_ok=True)
    elif path.stat().st_size == 0:
        raise StoreError(
            f"'{path}' is an empty file, not an aggregation store; give the path of a store, "
            "or a new path (one that does not exist) to create one"
        )
    elif not has_sqlite_header(path):
        raise StoreError(
            f"'{path}' is not an aggregation store (it is not a SQLite database); give the "
            "path of a store, or of a new file to create one"
        )
    try:
        con = sqlite3.connect(path, timeout=BUSY_TIMEOUT_MS / 1000, isolation_level=None)
        con.execute(f"PRAGMA busy_timeout = {BUSY_TIMEOUT_MS}")
        con.execute("PRAGMA journal_mode = WAL")
        con.execute("PRAGMA synchronous = FULL")
        _initialise(con, path)
    except sqlite3.DatabaseError as exc:
        raise StoreError(
            f"'{path}' is not a readable aggregation store ({exc}); it is corrupt or of "
            "another format"
        ) from exc
    return con


def _initialise(con: sqlite3.Connection, path: Path) -> None:
    with transaction(con, write=not _is_store(con)):  # an existing store is only read
        tables = {r[0] for r in con.execute("SELECT name FROM sqlite_master WHERE type='table'")}
        if tables and "settings" not in tables:
            raise StoreError(
                f"'{path}' is a SQLite database but not a ghofl aggregation store (it has the "
                f"tables {', '.join(sorted(tables))}); give another path"
            )
        if not tables:  # a new file (one statement at a time: executescript would commit)
            for statement in _TABLES:
                con.execute(statement)
        settings = dict(con.execute("SELECT key, value FROM settings").fetchall())
        if not settings:
            con.executemany(
                "INSERT INTO settings (key, value) VALUES (?, ?)",
                [("format", FORMAT), ("version", str(VERSION)), ("generation", "0")],
            )
            con.execute("INSERT INTO total (id, generation) VALUES (1, -1)")
            return
        if settings.get("format") != FORMAT:
            raise StoreError(
                f"'{path}' is a SQLite database but not a ghofl aggregation store (format "
                f"{settings.get('format')!r}, expected {FORMAT!r}); give another path"
            )
        if int(settings.get("version", "0")) > VERSION:
            raise StoreError(
                f"store '{path}' has version {settings.get('version')}, newer than this ghofl "
                f"reads ({VERSION}); upgrade ghofl"
            )


def _is_store(con: sqlite3.Connection) -> bool:
    return con.execute(
        "SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = 'settings'"
    ).fetchone() is not None


@contextmanager
def transaction(con: sqlite3.Connection, write: bool = True) -> Iterator[sqlite3.Connection]:
    """One transaction: ``BEGIN IMMEDIATE`` (write) or ``BEGIN`` (a consistent read), then
    ``COMMIT``, or ``ROLLBACK`` when the body raises."""
    con.execute("BEGIN IMMEDIATE" if write else "BEGIN")
    try:
        yield con
    except BaseException:
        con.execute("ROLLBACK")
        raise
    con.execute("COMMIT")


def has_sqlite_header(path: Path) -> bool:
    """Whether the file at ``path`` starts with the SQLite 3 header."""
    with path.open("rb") as f:
        return f.read(len(SQLITE_HEADER)) == SQLITE_HEADER


def setting(con: sqlite3.Connection, key: str) -> str | None:
    row = con.execute("SELECT value FROM settings WHERE key = ?", (key,)).fetchone()
    return None if row is None else str(row[0])


def put_setting(con: sqlite3.Connection, key: str, value: str) -> None:
    con.execute(
        "INSERT INTO settings (key, value) VALUES (?, ?) "
        "ON CONFLICT(key) DO UPDATE SET value = excluded.value",
        (key, value),
    )


def bump_generation(con: sqlite3.Connection) -> int:
    """Count one more change; return the new generation."""
    gen = int(setting(con, "generation") or "0") + 1
    put_setting(con, "generation", str(gen))
    return gen


def to_blob(arr: NDArray[Any]) -> bytes:
    """Little-endian bytes of ``arr``."""
    return np.ascontiguousarray(arr, dtype=arr.dtype.newbyteorder("<")).tobytes()


def from_blob(blob: bytes, dtype: str) -> NDArray[Any]:
    """Inverse of :func:`to_blob` for ``dtype`` (``"<i8"``, ``"<f8"``, ``"<u8"``); a writable,
    native-order copy."""
    return np.frombuffer(blob, dtype=np.dtype(dtype)).astype(np.dtype(dtype).newbyteorder("="))
