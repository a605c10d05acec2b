"""The SQLite file behind :class:`~ghofl.store.AggregationStore`: tables, pragmas, transactions.

Standard-library :mod:`sqlite3` only, with a rollback journal (``journal_mode=DELETE``) and
``synchronous=FULL``: every change is one ``BEGIN IMMEDIATE … COMMIT`` transaction, so a process
killed at any instant (SIGKILL, power loss) leaves the file in the state before or after that
change, never between, and once a change returns it is in the database file itself: no side
file (``-wal``, ``-journal``) holds acknowledged data, so losing one loses nothing. Stores
written in write-ahead-log mode by older versions are switched to the rollback journal when
opened writable (or, while another process holds them open, checkpointed after every commit).

A store whose file or folder cannot be written (mode 0444, a read-only folder or file system)
is opened read-only (``mode=ro``; ``immutable=1`` when even that needs a write) and never
written: it can be shown, verified and fitted from.

Tables (version 2)
------------------
``settings``       key/value text: ``format``, ``version``, ``meta`` (StatsMeta JSON, set by the
                   first contribution), ``max_contributions``, ``max_samples``, ``generation``
                   (bumped by every change), ``rounding`` (unit roundoff of the coarsest
                   transport of any contribution added, e.g. 2^-24 after float32; absent: 0),
                   ``head`` and ``n_contributions`` (the hash chain over the rows in the order
                   they were added and their count, recorded by every change; absent in
                   stores written before them, which then record them at their next change),
                   and ``digest`` (of all the others, :mod:`ghofl.store._integrity`).
``contributions``  one row per recorded contribution: ``client_id`` and ``sha256`` (both
                   unique), ``n_samples``, ``n_clipped``, ``added_at`` (ISO 8601, UTC), the
                   schema-flattened statistics ``ints`` (int64) and ``floats`` (float64), for
                   payloads with a clipping bound their fixed-point ``words`` (uint64), and the
                   row ``digest``.
``total``          one row: the running total as fixed-point ``words`` (payloads with a clipping
                   bound), or a cache of the recomputed total (``ints``/``floats``) valid for
                   the ``generation`` it was computed at (payloads without one); ``members``
                   (the set of rows it sums) and its ``digest``.

Arrays are stored little-endian as BLOBs. Version-1 stores (no digests) get their digests
computed, from their contents as found, the first time they are opened writable; a read-only
version-1 store is refused with that fix.
"""

from __future__ import annotations

import contextlib
import os
import sqlite3
import tempfile
import urllib.parse
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import numpy as np
from numpy.typing import NDArray

from ghofl.errors import StoreError
from ghofl.files import umask_mode
from ghofl.store import _integrity as integrity

FORMAT = "ghofl.store"
VERSION = 2
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
    words BLOB,
    digest TEXT
)""",
    """CREATE TABLE total (
    id INTEGER PRIMARY KEY CHECK (id = 1),
    generation INTEGER NOT NULL,
    words BLOB,
    ints BLOB,
    floats BLOB,
    members TEXT,
    digest TEXT
)""",
)
#: Columns of a contribution row that its digest covers, in digest order.
ROW_COLUMNS = "client_id, sha256, n_samples, n_clipped, added_at, ints, floats, words, digest"


def connect(path: Path, create: bool) -> tuple[sqlite3.Connection, bool]:
    """Open (and with ``create``, create) the store file at ``path``.

    Returns
    -------
    (connection, read_only)
        ``read_only``: the file or its folder cannot be written; the connection never writes.

    Raises
    ------
    StoreError
        The file does not exist (and ``create`` is false), is a directory, is empty, is not a
        SQLite database, or is a SQLite database that is not a ghofl store.
    """
    if path.is_dir():
        raise StoreError(f"store path '{path}' is a directory; give a database file path")
    if not path.exists():
        if not create:
            raise StoreError(
                f"store '{path}' does not exist; create it with "
                f"'ghofl aggregate --store {path} PAYLOAD...'"
            )
        _create(path)
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
    read_only = not writable(path)
    try:
        con = _open_read_only(path) if read_only else _open(path)
        _check_store(con, path, read_only)
    except (sqlite3.DatabaseError, UnicodeDecodeError) as exc:
        raise StoreError(
            f"'{path}' is not a readable aggregation store ({_reason(exc)}); it is corrupt or "
            "of another format; restore it from a backup"
        ) from exc
    con.text_factory = _text
    return con, read_only


def _reason(exc: BaseException) -> str:
    if isinstance(exc, UnicodeDecodeError):
        return "it holds text that is not UTF-8"
    return str(exc)


def _text(raw: bytes) -> str:
    """TEXT values as ``str``; non-UTF-8 bytes (a corrupt store) are kept as surrogates.

    No digest then matches them.
    """
    return raw.decode("utf-8", "surrogateescape")


def writable(path: Path) -> bool:
    """Whether the store file and its folder (for the journal) can be written."""
    folder = path.parent if str(path.parent) else Path(".")
    return os.access(path, os.W_OK) and os.access(folder, os.W_OK | os.X_OK)


def _open(path: Path) -> sqlite3.Connection:
    con = sqlite3.connect(path, timeout=BUSY_TIMEOUT_MS / 1000, isolation_level=None)
    try:
        con.execute(f"PRAGMA busy_timeout = {BUSY_TIMEOUT_MS}")
        # a WAL store held open elsewhere cannot switch: its commits are checkpointed instead
        with contextlib.suppress(sqlite3.OperationalError):
            con.execute("PRAGMA journal_mode = DELETE")
        con.execute("PRAGMA synchronous = FULL")
    except BaseException:
        con.close()
        raise
    return con


def _open_read_only(path: Path) -> sqlite3.Connection:
    uri = "file:" + urllib.parse.quote(str(path.absolute()))
    for mode in ("mode=ro", "mode=ro&immutable=1"):
        con = sqlite3.connect(f"{uri}?{mode}", uri=True, timeout=BUSY_TIMEOUT_MS / 1000,
                              isolation_level=None)
        try:
            con.execute(f"PRAGMA busy_timeout = {BUSY_TIMEOUT_MS}")
            con.execute("SELECT COUNT(*) FROM sqlite_master").fetchone()
            return con
        except sqlite3.OperationalError:
            con.close()
            if "immutable" in mode:
                raise
    raise AssertionError("unreachable")  # pragma: no cover


def _create(path: Path) -> None:
    """Create and initialise a new store beside ``path`` and link it into place.

    A store that cannot be created (disk full, read-only folder) leaves nothing behind, and of two
    processes creating the same store at once, one wins and the other opens its store.
    """
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    os.close(fd)
    try:
        os.chmod(tmp, umask_mode(0o666))  # mkstemp makes 0600 files; follow the umask
        con = sqlite3.connect(tmp, isolation_level=None)
        try:
            con.execute("PRAGMA journal_mode = DELETE")
            con.execute("PRAGMA synchronous = FULL")
            with transaction(con):
                for statement in _TABLES:  # one at a time: executescript would commit
                    con.execute(statement)
                put_settings(con, {"format": FORMAT, "version": str(VERSION),
                                   "generation": "0", "head": integrity.HEAD_EMPTY,
                                   "n_contributions": "0"})
                con.execute(
                    "INSERT INTO total (id, generation, members, digest) VALUES (1, -1, ?, ?)",
                    (integrity.MEMBERS_EMPTY,
                     integrity.total_digest(-1, None, None, None, integrity.MEMBERS_EMPTY)),
                )
        finally:
            con.close()
        try:
            os.link(tmp, path)
        except FileExistsError:
            pass  # another process created it first: use that one
        except OSError:  # no hard links on this file system
            if not path.exists():
                os.replace(tmp, path)
    finally:
        for leftover in (tmp, tmp + "-journal"):
            Path(leftover).unlink(missing_ok=True)


def _check_store(con: sqlite3.Connection, path: Path, read_only: bool) -> None:
    """Refuse a foreign database or a newer version; give a version-1 store its digests."""
    tables = {r[0] for r in con.execute("SELECT name FROM sqlite_master WHERE type='table'")}
    if "settings" not in tables:
        raise StoreError(
            f"'{path}' is a SQLite database but not a ghofl aggregation store (it has the "
            f"tables {', '.join(sorted(tables)) or 'none'}); give another path"
        )
    raw = dict(con.execute("SELECT key, value FROM settings").fetchall())
    if raw.get("format") != FORMAT:
        raise StoreError(
            f"'{path}' is a SQLite database but not a ghofl aggregation store (format "
            f"{raw.get('format')!r}, expected {FORMAT!r}); give another path"
        )
    version = str(raw.get("version", "0"))
    if version == "1":
        if read_only:
            raise StoreError(
                f"store '{path}' was written by an older ghofl (version 1, without integrity "
                "digests) and is read-only, so its digests cannot be added; open it once "
                "where it can be written (e.g. 'ghofl store verify' on a writable copy)"
            )
        _migrate_v1(con)
    elif version != str(VERSION):
        raise StoreError(
            f"store '{path}' has version {version!r:.20}, not one this ghofl reads "
            f"({VERSION}); upgrade ghofl, or the store is corrupt"
        )
    settings(con)  # the settings digest


def _migrate_v1(con: sqlite3.Connection) -> None:
    """Add the version-2 digest columns and compute every digest, in one transaction."""
    with transaction(con) as c:
        if setting(c, "version", check=False) != "1":
            return  # another process migrated it meanwhile
        c.execute("ALTER TABLE contributions ADD COLUMN digest TEXT")
        c.execute("ALTER TABLE total ADD COLUMN members TEXT")
        c.execute("ALTER TABLE total ADD COLUMN digest TEXT")
        digests = []
        for seq, *row in c.execute(f"SELECT seq, {ROW_COLUMNS} FROM contributions").fetchall():
            d = integrity.row_digest(*row[:8])
            c.execute("UPDATE contributions SET digest = ? WHERE seq = ?", (d, seq))
            digests.append(d)
        members = integrity.members_of(digests)
        gen, words, ints, floats = c.execute(
            "SELECT generation, words, ints, floats FROM total WHERE id = 1").fetchone()
        c.execute("UPDATE total SET members = ?, digest = ? WHERE id = 1",
                  (members, integrity.total_digest(gen, words, ints, floats, members)))
        put_setting(c, "version", str(VERSION))


@contextmanager
def transaction(con: sqlite3.Connection, write: bool = True) -> Iterator[sqlite3.Connection]:
    """One transaction: ``BEGIN IMMEDIATE`` (write) or ``BEGIN`` (a consistent read).

    Then ``COMMIT``, or ``ROLLBACK`` when the body or the ``COMMIT`` raises. A write to a
    store still in WAL mode (held open elsewhere when it was opened) is checkpointed into the
    database file.
    """
    con.execute("BEGIN IMMEDIATE" if write else "BEGIN")
    try:
        yield con
    except BaseException:
        if con.in_transaction:  # SQLite may have rolled back already (disk full)
            con.execute("ROLLBACK")
        raise
    try:
        con.execute("COMMIT")
    except BaseException:  # a failed COMMIT (busy, I/O) may leave the transaction open
        if con.in_transaction:
            con.execute("ROLLBACK")
        raise
    if write and str(con.execute("PRAGMA journal_mode").fetchone()[0]).lower() == "wal":
        con.execute("PRAGMA wal_checkpoint(TRUNCATE)")  # acknowledged: in the database file


def has_sqlite_header(path: Path) -> bool:
    """Whether the file at ``path`` starts with the SQLite 3 header."""
    with path.open("rb") as f:
        return f.read(len(SQLITE_HEADER)) == SQLITE_HEADER


def settings(con: sqlite3.Connection) -> dict[str, str]:
    """Every setting, after checking the settings digest.

    Raises
    ------
    StoreError
        The settings do not match their digest (the store is corrupt).
    """
    values = {str(k): str(v) for k, v in con.execute("SELECT key, value FROM settings")}
    if values.get("digest") != integrity.settings_digest(values):
        raise StoreError(
            "the store's settings do not match their integrity digest; the store is corrupt "
            "(run 'ghofl store verify'); restore it from a backup"
        )
    return values


def setting(con: sqlite3.Connection, key: str, check: bool = True) -> str | None:
    """One setting (``None`` when absent), after checking the settings digest."""
    if not check:
        row = con.execute("SELECT value FROM settings WHERE key = ?", (key,)).fetchone()
        return None if row is None else str(row[0])
    return settings(con).get(key)


def put_setting(con: sqlite3.Connection, key: str, value: str) -> None:
    """Set one setting and re-seal the settings digest (inside the caller's transaction)."""
    put_settings(con, {key: value})


def put_settings(con: sqlite3.Connection, values: Mapping[str, str]) -> None:
    """Set several settings and re-seal the settings digest once (in the caller's transaction)."""
    for key, value in values.items():
        con.execute(
            "INSERT INTO settings (key, value) VALUES (?, ?) "
            "ON CONFLICT(key) DO UPDATE SET value = excluded.value",
            (key, value),
        )
    stored = {str(k): str(v) for k, v in con.execute("SELECT key, value FROM settings")}
    con.execute(
        "INSERT INTO settings (key, value) VALUES ('digest', ?) "
        "ON CONFLICT(key) DO UPDATE SET value = excluded.value",
        (integrity.settings_digest(stored),),
    )


def record_change(con: sqlite3.Connection, head: str, count: int) -> int:
    """Count one more change and record the new ``head`` and ``count``; return the generation."""
    gen = int(setting(con, "generation") or "0") + 1
    put_settings(con, {"generation": str(gen), "head": head, "n_contributions": str(count)})
    return gen


def head_claim(con: sqlite3.Connection) -> tuple[str, int] | None:
    """The head and contribution count the settings record (``None`` when not recorded).

    Raises
    ------
    StoreError
        The settings fail their digest, or record a count that is not a number.
    """
    values = settings(con)
    head, count = values.get("head"), values.get("n_contributions")
    if head is None or count is None:
        return None
    if not count.isdigit():
        raise StoreError(f"the store setting 'n_contributions' is {count!r:.40}, not a count; "
                         "the store is corrupt")
    return head, int(count)


def row_head(con: sqlite3.Connection) -> tuple[str, int]:
    """The head and count of the rows as stored (their recorded digests, in the order added)."""
    digests = [str(r[0]) for r in con.execute("SELECT digest FROM contributions ORDER BY seq")]
    return integrity.head_of(digests), len(digests)


def to_blob(arr: NDArray[Any]) -> bytes:
    """Little-endian bytes of ``arr``."""
    return np.ascontiguousarray(arr, dtype=arr.dtype.newbyteorder("<")).tobytes()


def from_blob(blob: bytes, dtype: str) -> NDArray[Any]:
    """Inverse of :func:`to_blob` for ``dtype`` (``"<i8"``, ``"<f8"``, ``"<u8"``).

    A writable, native-order copy.
    """
    return np.frombuffer(blob, dtype=np.dtype(dtype)).astype(np.dtype(dtype).newbyteorder("="))
