"""What the store records of one contribution, and the checks of its client id and digest."""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from typing import Any, Literal

from ghofl.errors import StoreConflictError, StoreError
from ghofl.stats.client_stats import ClientStats
from ghofl.stats.meta import StatsMeta
from ghofl.stats.schema import schema_for
from ghofl.store import _sqlite as db

__all__ = [
    "AddResult",
    "AddStatus",
    "ContributionInfo",
    "StoreHead",
    "check_client_id",
    "check_conflicts",
    "check_payload_sha256",
    "content_sha256",
    "contribution_info",
]


AddStatus = Literal["added", "already_present"]
_MAX_ID_LENGTH = 256


@dataclass(frozen=True)
class ContributionInfo:
    """One recorded contribution.

    Attributes
    ----------
    client_id : str
    sha256 : str
        SHA-256 of the payload (64 lowercase hex digits).
    n_samples, n_clipped : int
    clip_norm : float or None
        The payload's clipping bound R.
    added_at : str
        When it was recorded, ISO 8601 in UTC.
    """

    client_id: str
    sha256: str
    n_samples: int
    n_clipped: int
    clip_norm: float | None
    added_at: str


@dataclass(frozen=True)
class StoreHead:
    """What a store holds, named for evidence kept outside it (against a rolled-back copy).

    Attributes
    ----------
    digest : str
        The head: a hash chain over the digests of the contribution rows in the order they
        were added (64 lowercase hex digits; :mod:`ghofl.store._integrity`). Every add and
        remove changes it; an older copy of the store has another head.
    count : int
        Contributions recorded.
    """

    digest: str
    count: int

    def __str__(self) -> str:
        return f"head {self.digest} ({self.count} contribution{'' if self.count == 1 else 's'})"


@dataclass(frozen=True)
class AddResult:
    """Outcome of :meth:`AggregationStore.add`.

    Attributes
    ----------
    status : {"added", "already_present"}
        ``already_present``: the same client id with the same SHA-256 was recorded before;
        nothing changed (re-submitting is idempotent).
    contribution : ContributionInfo
        The recorded contribution (the earlier record when already present).
    n_contributions : int
        Contributions recorded after this call.
    total_samples : int
        Samples in the total after this call.
    head : StoreHead
        The store's head after this call (unchanged when already present).
    """

    status: AddStatus
    contribution: ContributionInfo
    n_contributions: int
    total_samples: int
    head: StoreHead

    @property
    def added(self) -> bool:
        """Whether this call recorded the contribution (``status == "added"``)."""
        return self.status == "added"


def content_sha256(stats: ClientStats) -> str:
    """SHA-256 of the content of ``stats``.

    It covers the metadata JSON, ``n_clipped`` and the flattened arrays (little-endian). The
    default payload digest when no file bytes are at hand.
    """
    ints, floats = schema_for(stats.mode).flatten(stats)
    h = hashlib.sha256(json.dumps(stats.meta.to_dict(), sort_keys=True).encode())
    h.update(db.to_blob(ints))
    h.update(db.to_blob(floats))
    return h.hexdigest()


def contribution_info(row: tuple[Any, ...], meta: StatsMeta | None) -> ContributionInfo:
    """The contribution recorded in one row of the store's contributions table.

    ``row`` starts ``(client_id, sha256, n_samples, n_clipped, added_at)``; the clipping bound
    is that of the store's metadata ``meta`` (None while the store is empty).
    """
    cid, sha, n, n_clipped, added = row[:5]
    return ContributionInfo(str(cid), str(sha), int(n), int(n_clipped),
                            None if meta is None else meta.clip_norm, str(added))


def check_conflicts(client_id: str, sha: str, known: list[tuple[Any, ...]]) -> None:
    """Refuse recording payload ``sha`` as ``client_id`` when ``known`` holds a record.

    ``known`` holds the ``(client_id, sha256, ...)`` rows recorded before with this client id
    or this digest (the same pair is idempotent and not passed here).

    Raises
    ------
    StoreConflictError
        The client contributed another payload, or another client contributed this one.
    """
    for cid, other_sha, *_ in known:
        if cid == client_id:
            raise StoreConflictError(
                f"client {client_id!r} already contributed another payload (SHA-256 "
                f"{str(other_sha)[:12]}…, this one {sha[:12]}…); a client contributes once. "
                f"To replace it, forget it first (ghofl forget --client {client_id})"
            )
        raise StoreConflictError(
            f"this payload (SHA-256 {sha[:12]}…) was already contributed by client {cid!r}; "
            f"recording it again as {client_id!r} would count the same samples twice"
        )


def check_client_id(client_id: object) -> None:
    """Refuse a client id that is not 1 to 256 printable characters without edge spaces."""
    ok = isinstance(client_id, str) and 0 < len(client_id) <= _MAX_ID_LENGTH \
        and client_id.isprintable() and client_id.strip() == client_id
    if not ok:
        raise StoreError(
            f"a client id must be 1 to {_MAX_ID_LENGTH} printable characters without leading "
            f"or trailing spaces; got {client_id!r}"
        )


def check_payload_sha256(sha: str) -> str:
    """``sha`` as 64 lowercase hex digits; a StoreError unless it is a SHA-256 hex digest."""
    s = str(sha).lower()
    if len(s) != 64 or any(ch not in "0123456789abcdef" for ch in s):
        raise StoreError(
            f"payload_sha256 must be a SHA-256 digest of 64 hex digits; got {sha!r}; pass "
            "hashlib.sha256(payload_bytes).hexdigest(), or omit it"
        )
    return s
