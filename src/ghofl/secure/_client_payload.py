"""What a :class:`~ghofl.secure.client.SecAggClient` masks: statistics or a vector payload.

A client holds either :class:`~ghofl.stats.client_stats.ClientStats` (described by a
:class:`~ghofl.stats.meta.StatsMeta`) or a :class:`~ghofl.secure.vectors.VectorPayload`
(described by a :class:`~ghofl.secure.vectors.VectorMeta`), or a function computing one when
the masked input is due. The helpers here treat both alike for the client.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Literal

from ghofl.errors import ProtocolError
from ghofl.secure.ledger import RoundLedger, default_ledger_path, stats_digest
from ghofl.secure.vectors import VectorMeta, VectorPayload
from ghofl.stats.client_stats import ClientStats
from ghofl.stats.meta import StatsMeta

__all__ = ["PayloadSource", "names", "payload_differs", "payload_digest", "resolve_ledger",
           "spent"]

#: A client's payload, or a function computing it when the masked input is due.
PayloadSource = (ClientStats | VectorPayload | Callable[[], ClientStats]
                 | Callable[[], VectorPayload])


def payload_differs(payload: ClientStats | VectorPayload, meta: StatsMeta | VectorMeta) -> bool:
    """Whether ``payload``'s description is not ``meta`` (what the client advertised)."""
    if isinstance(payload, VectorPayload):
        return not isinstance(meta, VectorMeta) or bool(payload.meta.differences(meta))
    return not isinstance(meta, StatsMeta) or bool(payload.meta.differences(meta))


def payload_digest(payload: ClientStats | VectorPayload) -> str:
    """What the client's round ledger records of a payload.

    Statistics: their SHA-256. Vectors: the digest of the data they came from when the
    payload names it (:meth:`~ghofl.secure.vectors.VectorPayload.ledger_key`), so that a
    second round over the same rows is a repeat even though the model scored or the noise
    share differs.
    """
    return payload.ledger_key() if isinstance(payload, VectorPayload) else stats_digest(payload)


def resolve_ledger(ledger: RoundLedger | Literal["default"] | None,
                   client_id: str) -> RoundLedger | None:
    """``ledger``, with ``"default"`` made the client's default ledger file."""
    return RoundLedger(default_ledger_path(client_id)) if ledger == "default" else ledger


def spent() -> ClientStats:
    """The payload source of a client that already masked its payload: refuses."""
    raise ProtocolError("this client's statistics were already masked and sent once")


def names(clients: list[str], most: int = 5) -> str:
    """The first ``most`` client ids, quoted, and how many more."""
    shown = ", ".join(repr(c) for c in clients[:most])
    return shown + (f" and {len(clients) - most} more" if len(clients) > most else "")
