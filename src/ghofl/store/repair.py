"""``ghofl store verify --repair``: a store whose parts disagree made whole again, atomically.

The repair keeps the contribution rows that pass their digests, drops those that fail,
rebuilds the total from the rows kept and records their head and count, all in one SQLite
transaction (rollback journal, ``synchronous=FULL``): a crash at any instant leaves the store
as it was or repaired, never a mix. It cannot rebuild corrupt settings (the statistics'
metadata and the store's bounds come from nowhere else) or pages SQLite cannot read; such a
store is refused, to be restored from a backup.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

from ghofl.errors import StoreError
from ghofl.store import _integrity as integrity
from ghofl.store import _sqlite as db
from ghofl.store._total import _rebuilt_total, _write_total
from ghofl.store.aggregation import AggregationStore
from ghofl.store.records import StoreHead
from ghofl.store.verify import inspect_within, refusal

__all__ = ["RepairReport", "repair_store"]


@dataclass(frozen=True)
class RepairReport:
    """What :func:`repair_store` did.

    Attributes
    ----------
    problems : tuple of str
        What the check found before the repair (empty: nothing was changed).
    dropped : tuple of str
        Client ids of the contribution rows dropped (they failed their digests).
    head : StoreHead
        The store's head and count after the repair.
    recorded : StoreHead or None
        The head and count the store recorded before the repair (``None``: none recorded).
    """

    problems: tuple[str, ...]
    dropped: tuple[str, ...]
    head: StoreHead
    recorded: StoreHead | None

    @property
    def changed(self) -> bool:
        """Whether the store was repaired (it failed its check)."""
        return bool(self.problems)


def repair_store(path: str | os.PathLike[str]) -> RepairReport:
    """Repair the store at ``path`` in one transaction (module docstring).

    Returns
    -------
    RepairReport

    Raises
    ------
    StoreError
        The store is missing, foreign or read-only, or has problems a repair cannot fix
        (corrupt settings, pages SQLite cannot read): restore it from a backup.
    """
    with AggregationStore(path, create=False) as store:
        if store.read_only:
            raise StoreError(
                f"cannot repair store '{store.path}': it is read-only (the file, its folder or "
                "the media cannot be written); repair a writable copy, or make it writable"
            )
        with db.transaction(store.con) as con:  # BEGIN IMMEDIATE ... COMMIT: all or nothing
            found = inspect_within(store, con, full=False)
            if found.ok:
                return RepairReport((), (), found.head, found.recorded)
            if not found.repairable:
                raise refusal(store.path, found)
            rows = con.execute(
                f"SELECT seq, {db.ROW_COLUMNS} FROM contributions ORDER BY seq").fetchall()
            good = [r for r in rows if r[9] == integrity.row_digest(*r[1:9])]
            dropped = [r for r in rows if r[9] != integrity.row_digest(*r[1:9])]
            for r in dropped:
                con.execute("DELETE FROM contributions WHERE seq = ?", (r[0],))
            head = StoreHead(integrity.head_of([str(r[9]) for r in good]), len(good))
            generation = db.record_change(con, head.digest, head.count)
            _write_total(con, _rebuilt_total([r[1:] for r in good], store.codec, generation))
    return RepairReport(found.problems, tuple(str(r[1]) for r in dropped), head,
                        found.recorded)
