"""Read a total from either a ``.ghs`` statistics file or an aggregation store."""

from __future__ import annotations

import os
from pathlib import Path

from ghofl.errors import StatsFormatError
from ghofl.stats.client_stats import ClientStats
from ghofl.stats.codec import load_stats
from ghofl.store._sqlite import has_sqlite_header
from ghofl.store.aggregation import AggregationStore
from ghofl.store.records import StoreHead
from ghofl.store.verify import check_store

__all__ = ["is_store", "read_total", "read_total_and_head"]


def is_store(path: str | os.PathLike[str]) -> bool:
    """Whether ``path`` is an existing file that starts with the SQLite 3 header.

    Content sniffing; the file name does not matter.
    """
    p = Path(path)
    return p.is_file() and has_sqlite_header(p)


def read_total(path: str | os.PathLike[str]) -> ClientStats:
    """The total statistics held at ``path``: a ``.ghs`` file, or an aggregation store.

    Parameters
    ----------
    path : path-like
        A statistics file written by :func:`~ghofl.stats.save_stats` (e.g. ``ghofl aggregate
        --out``) or a store written by :class:`AggregationStore` (``ghofl aggregate
        --store``); which one is decided by the file's content.

    Raises
    ------
    StatsFormatError
        ``path`` does not exist or is neither format.
    StoreError
        ``path`` is a SQLite database but not a usable store (foreign, never received a
        contribution, or failing :func:`~ghofl.store.verify.check_store`).
    """
    return read_total_and_head(path)[0]


def read_total_and_head(path: str | os.PathLike[str]) -> tuple[ClientStats, StoreHead | None]:
    """:func:`read_total`, and for a store the head and count of the contributions it sums.

    A store is checked first (:func:`~ghofl.store.verify.check_store`): one whose parts
    disagree is refused before its total is read. The head is ``None`` for a ``.ghs`` file.
    """
    p = Path(path)
    if not p.exists():
        raise StatsFormatError(f"statistics file or store '{p}' does not exist; check the path")
    if is_store(p):
        with AggregationStore(p, create=False) as store:
            head = check_store(store)
            return store.total(), head
    return load_stats(p), None
