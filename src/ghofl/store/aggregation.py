"""Durable aggregation: every accepted contribution and the running total, in one SQLite file.

Exactness
---------
Removing a contribution gives exactly — bit for bit — what a fresh aggregation of the remaining
contributions gives. Two paths, chosen by the payloads' clipping bound (``meta.clip_norm``):

``fixed-point`` (payloads carry a clipping bound R)
    Each contribution is encoded once by :class:`~ghofl.secure.fixedpoint.FixedPointCodec` with
    public bounds K = ``max_contributions`` (contributions recorded at once), M =
    ``max_samples`` (samples per contribution) and R, as uint64 words; the total is their sum
    modulo 2^64, kept in the ``total`` table and updated in the transaction that records or
    removes a contribution. Integer addition is exact, associative and commutative, so the
    total depends only on the set of contributions recorded, never on the order of adds and
    removes; with at most K contributions of at most M samples each, no sum wraps (see the
    codec). :meth:`AggregationStore.total` decodes it: the float sum to within
    ``codec.error_bound`` (far below float64 resolution of the entries), counts exact.
``recompute`` (payloads without a clipping bound)
    Float addition is not associative and nothing bounds the values, so no integer encoding
    exists. The total is recomputed from the stored contributions, added in a canonical order
    (sorted by client id) with :func:`~ghofl.stats.sum_stats`, and cached until the next
    change. It equals ``sum_stats(payloads sorted by client id)`` bit for bit.

Contributions are stored as their schema-flattened arrays (symmetric matrices as upper
triangles, the held-out section appended when the payloads carry one), which
:func:`~ghofl.stats.flat.unflatten_stats` restores exactly. Payloads that went through
float32 transport are stored as received (upcast to float64); the setting ``rounding`` records
the coarsest such rounding ever added, and every read validates with a tolerance for it.
"""

from __future__ import annotations

import json
import os
import sqlite3
import warnings
from datetime import UTC, datetime
from pathlib import Path
from types import TracebackType
from typing import Any, Literal

import numpy as np
from numpy.typing import NDArray

from ghofl.errors import (
    GhoflWarning,
    InputError,
    StatsOverflowError,
    StoreError,
)
from ghofl.secure.fixedpoint import DEFAULT_MAX_SAMPLES, FixedPointCodec
from ghofl.stats.client_stats import ClientStats, check_addable
from ghofl.stats.meta import StatsMeta
from ghofl.stats.schema import schema_for
from ghofl.store import _integrity as integrity
from ghofl.store import _sqlite as db
from ghofl.store._total import (
    _blobs,
    _canonical_sum,
    _rebuilt_total,
    _Total,
    _unflatten,
    _write_total,
)
from ghofl.store.records import (
    AddResult,
    AddStatus,
    ContributionInfo,
    StoreHead,
    check_client_id,
    check_conflicts,
    check_payload_sha256,
    content_sha256,
    contribution_info,
)

__all__ = [
    "DEFAULT_MAX_CONTRIBUTIONS",
    "AddResult",
    "AggregationStore",
    "ContributionInfo",
    "ExactPath",
    "content_sha256",
]


#: Default K: contributions a store may hold at once (with M = 10^6, K·M < 2^62 as the
#: fixed-point codec requires).
DEFAULT_MAX_CONTRIBUTIONS = 1 << 20
ExactPath = Literal["fixed-point", "recompute"]


class AggregationStore:
    """An embedded, durable aggregation of client statistics (a SQLite file; no server).

    Parameters
    ----------
    path : path-like
        The database file; created (with its folder) when absent and ``create`` is true.
    max_contributions : int, optional
        K, the most contributions recorded at once (fixed-point path). Fixed when the store is
        created (default :data:`DEFAULT_MAX_CONTRIBUTIONS`); giving another value for an
        existing store raises :class:`StoreError`.
    max_samples : int, optional
        M, the most samples one contribution may hold (fixed-point path). Fixed at creation
        (default :data:`~ghofl.secure.fixedpoint.DEFAULT_MAX_SAMPLES`).
    create : bool, default True
        Create the store when ``path`` does not exist (else :class:`StoreError`).

    Notes
    -----
    Every change (:meth:`add`, :meth:`remove`) is one transaction; see the module docstring
    for how the total stays exact. Use as a context manager, or call :meth:`close`.
    """

    def __init__(
        self,
        path: str | os.PathLike[str],
        *,
        max_contributions: int | None = None,
        max_samples: int | None = None,
        create: bool = True,
    ) -> None:
        self.path = Path(path)
        self._con: sqlite3.Connection | None
        self._con, self._read_only = db.connect(self.path, create)
        try:
            self._max_contributions = self._bound("max_contributions", max_contributions,
                                                  DEFAULT_MAX_CONTRIBUTIONS)
            self._max_samples = self._bound("max_samples", max_samples, DEFAULT_MAX_SAMPLES)
        except BaseException:
            self.close()
            raise

    # ------------------------------------------------------------------ lifecycle
    def close(self) -> None:
        """Close the database connection (idempotent)."""
        if self._con is not None:
            self._con.close()
            self._con = None

    def __enter__(self) -> AggregationStore:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    @property
    def con(self) -> sqlite3.Connection:
        """The open SQLite connection; :class:`StoreError` once the store is closed."""
        if self._con is None:
            raise StoreError(f"store '{self.path}' is closed; open a new AggregationStore")
        return self._con

    # ------------------------------------------------------------------ facts
    @property
    def meta(self) -> StatsMeta | None:
        """Metadata every contribution shares (set by the first one; ``None`` before)."""
        raw = db.setting(self.con, "meta")
        return None if raw is None else StatsMeta.from_dict(json.loads(raw))

    @property
    def exact_path(self) -> ExactPath | None:
        """How the total stays exact (module docstring); ``None`` before any contribution."""
        meta = self.meta
        if meta is None:
            return None
        return "recompute" if meta.clip_norm is None else "fixed-point"

    @property
    def codec(self) -> FixedPointCodec | None:
        """The fixed-point codec of the total (``None`` on the recompute path)."""
        meta = self.meta
        return None if meta is None else self._codec(meta)

    @property
    def read_only(self) -> bool:
        """Whether the store file or its folder cannot be written (it is then never written)."""
        return self._read_only

    @property
    def max_contributions(self) -> int:
        """K, the most contributions recorded at once (fixed when the store was created)."""
        return self._max_contributions

    @property
    def max_samples(self) -> int:
        """M, the most samples one contribution may hold (fixed when the store was created)."""
        return self._max_samples

    @property
    def head(self) -> StoreHead:
        """The head digest and contribution count the store recorded at its last change.

        Computed from the rows as stored for a store written before heads were recorded. This
        is the store's claim; :func:`ghofl.store.verify.check_store` checks it against the
        rows.
        """
        with db.transaction(self.con, write=False) as con:
            return self._head(con)

    def __len__(self) -> int:
        return int(self.con.execute("SELECT COUNT(*) FROM contributions").fetchone()[0])

    def contributions(self) -> list[ContributionInfo]:
        """Every recorded contribution, in the order they were added."""
        meta = self.meta
        with db.transaction(self.con, write=False) as con:
            rows = [self._checked(r) for r in con.execute(
                f"SELECT {db.ROW_COLUMNS} FROM contributions ORDER BY seq")]
            total = con.execute("SELECT generation, words, ints, floats, members, digest "
                                "FROM total WHERE id = 1").fetchone()
        members = integrity.members_of([str(r[8]) for r in rows])
        if total is not None and total[5] == integrity.total_digest(*total[:5]) \
                and total[4] != members:  # a corrupt total is rebuilt when read
            raise StoreError(
                f"store '{self.path}' lists {len(rows)} contributions but its total sums "
                "another set; the store is corrupt (run 'ghofl store verify'): restore it "
                "from a backup"
            )
        return [contribution_info(r, meta) for r in rows]

    def get(self, client_id: str) -> ClientStats:
        """The statistics recorded for ``client_id`` (exactly as added)."""
        meta = self._require_meta()
        row = self.con.execute(
            f"SELECT {db.ROW_COLUMNS} FROM contributions WHERE client_id = ?", (client_id,)
        ).fetchone()
        if row is None:
            raise self._unknown(client_id)
        row = self._checked(row, client_id)
        return _unflatten(meta, row[5], row[6], self._rounding(self.con))

    # ------------------------------------------------------------------ changes
    def add(
        self, client_id: str, stats: ClientStats, payload_sha256: str | None = None
    ) -> AddResult:
        """Record one contribution and add it to the total, in one transaction.

        Parameters
        ----------
        client_id : str
            Who contributed (1 to 256 printable characters).
        stats : ClientStats
            The contribution; must be compatible with the store's (mode, encoder, projection,
            classes, clipping bound).
        payload_sha256 : str, optional
            SHA-256 of the payload as received (e.g. of the ``.ghs`` file); default
            :func:`content_sha256` of ``stats``.

        Returns
        -------
        AddResult
            ``added``, or ``already_present`` when this id was recorded with this SHA-256.

        Raises
        ------
        StoreConflictError
            The id was recorded with another payload, or this payload under another id.
        IncompatibleStatsError
            ``stats`` differ from the store's metadata (the message names every difference).
        StoreError
            The store holds ``max_contributions`` already, or ``stats`` exceed the public
            bounds of the fixed-point total.
        """
        check_client_id(client_id)
        self._require_writable("add a contribution to")
        sha = (content_sha256(stats) if payload_sha256 is None
               else check_payload_sha256(payload_sha256))
        ints, floats = schema_for(stats.mode).flatten(stats)
        words = self._encode(client_id, stats)
        if words is None and self.meta is not None and not self.meta.differences(stats.meta):
            try:  # the float total must stay finite: refuse before anything is recorded
                check_addable(self.total(), stats)
            except StatsOverflowError as exc:
                raise StatsOverflowError(
                    f"cannot add the contribution of client {client_id!r} to store "
                    f"'{self.path}': {exc}"
                ) from exc
        now = datetime.now(UTC).isoformat(timespec="microseconds")
        with db.transaction(self.con) as con:
            known = [self._checked(r) for r in con.execute(
                f"SELECT {db.ROW_COLUMNS} FROM contributions WHERE client_id = ? OR sha256 = ?",
                (client_id, sha),
            ).fetchall()]
            meta = self._check_meta(con, stats)
            if stats.rounding > self._rounding(con):
                db.put_setting(con, "rounding", repr(float(stats.rounding)))
            for row in known:
                if row[0] == client_id and row[1] == sha:
                    return self._result("already_present", contribution_info(row, meta), con)
            check_conflicts(client_id, sha, known)
            count = int(con.execute("SELECT COUNT(*) FROM contributions").fetchone()[0])
            if count >= self._max_contributions:
                raise StoreError(
                    f"store '{self.path}' already holds {count} contributions, its maximum "
                    f"(max_contributions={self._max_contributions}, fixed when it was created); "
                    "remove some or aggregate into a new store with a larger maximum"
                )
            total = self._load_total(con)  # checked (or rebuilt) before the rows change
            row = (client_id, sha, int(stats.n_samples), int(stats.n_clipped), now,
                   db.to_blob(ints), db.to_blob(floats),
                   None if words is None else db.to_blob(words))
            digest = integrity.row_digest(*row)
            claim = db.head_claim(con)
            con.execute(
                f"INSERT INTO contributions ({db.ROW_COLUMNS}) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)",
                (*row, digest),
            )
            head = StoreHead(*db.row_head(con)) if claim is None else \
                StoreHead(integrity.chain(claim[0], digest), claim[1] + 1)
            self._move_total(con, total, words, digest, +1, head)
            info = ContributionInfo(client_id, sha, stats.n_samples, stats.n_clipped,
                                    meta.clip_norm, now)
            return self._result("added", info, con, head)

    def remove(self, client_id: str) -> ContributionInfo:
        """Remove the contribution of ``client_id`` and return what was removed.

        It is subtracted from the total, exactly, in one transaction.

        Raises
        ------
        StoreError
            No contribution is recorded under ``client_id``.
        """
        self._require_writable("forget a contribution in")
        with db.transaction(self.con) as con:
            row = con.execute(
                f"SELECT {db.ROW_COLUMNS} FROM contributions WHERE client_id = ?", (client_id,)
            ).fetchone()
            if row is None:
                raise self._unknown(client_id)
            row = self._checked(row, client_id)
            meta = self._require_meta()
            total = self._load_total(con)
            con.execute("DELETE FROM contributions WHERE client_id = ?", (client_id,))
            words = None if row[7] is None else db.from_blob(row[7], "<u8")
            self._move_total(con, total, words, str(row[8]), -1, StoreHead(*db.row_head(con)))
            return contribution_info(row, meta)

    # ------------------------------------------------------------------ the total
    def total(self) -> ClientStats:
        """The total of the recorded contributions (zeros when none is left).

        Raises
        ------
        StoreError
            The store never received a contribution (its metadata is unknown).
        """
        meta = self._require_meta()
        with db.transaction(self.con, write=False) as con:
            gen = int(db.setting(con, "generation") or "0")
            t = self._load_total(con, save=False)
            codec = self._codec(meta)
            rounding = self._rounding(con)
            if codec is not None:
                result = ClientStats.zeros(meta) if t.words is None else \
                    codec.decode(meta, db.from_blob(t.words, "<u8"), rounding)
            elif t.generation == gen and t.ints is not None and t.floats is not None:
                result = _unflatten(meta, t.ints, t.floats, rounding)
            else:
                result = _canonical_sum(meta, con, self._checked, rounding)
                t = _Total(gen, None, *_blobs(result), t.members, repaired=True)
        if t.repaired:
            self._save_total(t)
        return result

    # ------------------------------------------------------------------ internals
    def _bound(self, key: str, given: int | None, default: int) -> int:
        stored = db.setting(self.con, key)  # an existing store is only read
        if stored is None:
            stored = self._init_bound(key, default if given is None else int(given))
        if given is not None and int(given) != int(stored):
            raise StoreError(
                f"store '{self.path}' was created with {key}={stored}; got {key}={given}. The "
                f"bound is fixed when a store is created: omit it, or create a new store"
            )
        return int(stored)

    def _init_bound(self, key: str, value: int) -> str:
        if value < 1:
            raise StoreError(f"{key} must be >= 1; got {value}")
        if self._read_only:
            return str(value)  # never written: the default of a store that has none
        with db.transaction(self.con) as con:
            stored = db.setting(con, key)  # another process may have set it meanwhile
            if stored is None:
                db.put_setting(con, key, str(value))
                return str(value)
            return stored

    @staticmethod
    def _rounding(con: sqlite3.Connection) -> float:
        """Unit roundoff of the coarsest transport of any contribution added (0.0: none)."""
        raw = db.setting(con, "rounding")
        try:
            value = 0.0 if raw is None else float(raw)
        except ValueError:
            value = -1.0
        if not 0.0 <= value < 1.0:
            raise StoreError(
                f"the store setting 'rounding' is {raw!r:.40}, not a unit roundoff in [0, 1); "
                "the store is corrupt"
            )
        return value

    def _codec(self, meta: StatsMeta) -> FixedPointCodec | None:
        if meta.clip_norm is None:
            return None
        return FixedPointCodec(self._max_contributions, self._max_samples, meta.clip_norm)

    def _encode(self, client_id: str, stats: ClientStats) -> NDArray[np.uint64] | None:
        codec = self._codec(stats.meta)
        if codec is None:
            return None
        try:
            return codec.encode(stats)
        except InputError as exc:
            raise StoreError(
                f"cannot add the contribution of client {client_id!r} to store '{self.path}': "
                f"{exc} (store bounds: max_samples={self._max_samples} per contribution, "
                f"clipping bound R={stats.meta.clip_norm:g})"
            ) from exc

    def _check_meta(self, con: sqlite3.Connection, stats: ClientStats) -> StatsMeta:
        raw = db.setting(con, "meta")
        if raw is None:
            db.put_setting(con, "meta", json.dumps(stats.meta.to_dict(), sort_keys=True))
            return stats.meta
        meta = StatsMeta.from_dict(json.loads(raw))
        if meta.differences(stats.meta):  # ClientStats' own message names every difference
            ClientStats.zeros(meta).check_compatible(stats)
        return meta

    def _move_total(self, con: sqlite3.Connection, total: _Total,
                    words: NDArray[np.uint64] | None, digest: str, sign: int,
                    head: StoreHead) -> None:
        """Apply one added (+1) or removed (-1) row to the checked ``total`` and save it.

        The settings record the change and the store's new ``head``.
        """
        gen = db.record_change(con, head.digest, head.count)
        members = integrity.add_member(total.members, digest, sign)
        if words is None:  # recompute path: the cached total is stale from this generation on
            _write_total(con, _Total(total.generation, None, total.ints, total.floats,
                                     members))
            return
        old = np.zeros_like(words) if total.words is None else db.from_blob(total.words, "<u8")
        if old.shape != words.shape:
            raise StoreError(f"the total of store '{self.path}' has {old.size} words, not "
                             f"{words.size}; the store is corrupt: restore it from a backup")
        with np.errstate(over="ignore"):
            new = old + words if sign > 0 else old - words  # modulo 2^64, exact
        _write_total(con, _Total(gen, db.to_blob(new), None, None, members))

    def _load_total(self, con: sqlite3.Connection, save: bool = True) -> _Total:
        """The total row after checking its digest.

        When the check fails it is rebuilt from the rows (which are checked) and the user told;
        with ``save``, in a write transaction, the rebuilt total is saved at once.
        """
        row = con.execute(
            "SELECT generation, words, ints, floats, members, digest FROM total WHERE id = 1"
        ).fetchone()
        if row is not None and row[5] == integrity.total_digest(*row[:5]):
            return _Total(*row[:5])
        rows = [self._checked(r) for r in con.execute(
            f"SELECT {db.ROW_COLUMNS} FROM contributions ORDER BY client_id")]
        total = _rebuilt_total(rows, self._codec_or_none(),
                               int(db.setting(con, "generation") or "0"))
        where = "saved" if save else ("not saved: the store is read-only" if self._read_only
                                      else "saved")
        warnings.warn(
            f"the cached total of store '{self.path}' did not match its integrity digest; it "
            f"was rebuilt from the {len(rows)} contributions, whose digests hold ({where})",
            GhoflWarning, stacklevel=3,
        )
        if save:
            _write_total(con, total)
        return total

    def _save_total(self, total: _Total) -> None:
        """Write a rebuilt total or a fresh recompute cache.

        Skipped when the store is read-only or changed meanwhile (the cache is optional).
        """
        if self._read_only:
            return
        try:
            with db.transaction(self.con) as con:
                row = con.execute(
                    "SELECT generation, words, ints, floats, members, digest FROM total "
                    "WHERE id = 1").fetchone()
                intact = row is not None and row[5] == integrity.total_digest(*row[:5])
                if intact and (row[4] != total.members or row[0] == total.generation):
                    return  # another change came first, or the cache is already there
                _write_total(con, total)
        except sqlite3.OperationalError:  # busy or read-only media: the cache is optional
            pass

    def _checked(self, row: tuple[Any, ...], client_id: str | None = None) -> tuple[Any, ...]:
        """``row`` (the :data:`~ghofl.store._sqlite.ROW_COLUMNS`) after checking its digest.

        When ``client_id`` is given, also checks that it is the row of ``client_id``.
        """
        if row[8] == integrity.row_digest(*row[:8]) and client_id in (None, row[0]):
            return row
        asked = "" if client_id in (None, row[0]) else f" (looked up as {client_id!r})"
        raise StoreError(
            f"the contribution of client {row[0]!r}{asked} in store '{self.path}' does not "
            "match its integrity digest; the store is corrupt (run 'ghofl store verify'): "
            "restore it from a backup"
        )

    def _codec_or_none(self) -> FixedPointCodec | None:
        meta = self.meta
        return None if meta is None else self._codec(meta)

    def _require_writable(self, what: str) -> None:
        if self._read_only:
            raise StoreError(
                f"cannot {what} store '{self.path}': it is read-only (the file, its folder or "
                "the media cannot be written); make it writable, or only read it (ghofl store "
                "show / verify, ghofl fit)"
            )

    def _result(self, status: AddStatus, info: ContributionInfo,
                con: sqlite3.Connection, head: StoreHead | None = None) -> AddResult:
        count, samples = con.execute(
            "SELECT COUNT(*), COALESCE(SUM(n_samples), 0) FROM contributions"
        ).fetchone()
        return AddResult(status, info, int(count), int(samples), head or self._head(con))

    @staticmethod
    def _head(con: sqlite3.Connection) -> StoreHead:
        claim = db.head_claim(con)
        return StoreHead(*(db.row_head(con) if claim is None else claim))

    def _require_meta(self) -> StatsMeta:
        meta = self.meta
        if meta is None:
            raise StoreError(
                f"store '{self.path}' has never received a contribution, so it has no total "
                "yet; add one first (ghofl aggregate --store)"
            )
        return meta

    def _unknown(self, client_id: str) -> StoreError:
        ids = [r[0] for r in self.con.execute(
            "SELECT client_id FROM contributions ORDER BY client_id LIMIT 6")]
        shown = ", ".join(map(repr, ids[:5])) + (", ..." if len(ids) > 5 else "")
        return StoreError(
            f"store '{self.path}' has no contribution from client {client_id!r}; it holds "
            f"{len(self)} ({shown or 'none'}); see 'ghofl store show {self.path}'"
        )
