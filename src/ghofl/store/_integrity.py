"""Integrity digests of an aggregation store: every contribution row, the total, the settings.

SQLite checks its own pages (``PRAGMA integrity_check``) but not the values in them: a flipped
bit inside a stored array or the cached total reads back as another, valid-looking number. Each
part of a store therefore carries a SHA-256 over a canonical encoding of its content:

row digest
    ``client_id``, the payload ``sha256``, ``n_samples``, ``n_clipped``, ``added_at`` and the
    ``ints``/``floats``/``words`` BLOBs, each length-prefixed after a domain tag. The client id
    is inside the digest, so a row that answers for another id is refused.
members
    The sum modulo 2^256 of the row digests (read as 256-bit integers) of the recorded rows:
    it names the set of contributions the total holds and is updated in O(1) by an add or a
    remove (order does not matter).
total digest
    The total row: the generation its cache was computed at, ``members`` and the
    ``words``/``ints``/``floats`` BLOBs.
settings digest
    Every other setting (key and value, sorted by key).
head
    A hash chain over the row digests in the order the rows were added: ``HEAD_EMPTY`` for no
    row, then ``SHA-256(tag, previous head, row digest)`` per row. It names the list of
    contributions a store holds (with their count): the settings record it at every change,
    and an operator who keeps the printed head elsewhere detects a store rolled back to an
    older copy (``ghofl store verify --expect``). Unlike ``members`` it is a collision-resistant
    digest of the list, so no other list of rows has the same head.

The digests guard against corruption (bit rot, torn media, editing by hand), not against an
adversary who can write the file: such a writer can recompute them.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping
from typing import Any

__all__ = [
    "HEAD_EMPTY",
    "MEMBERS_EMPTY",
    "add_member",
    "chain",
    "head_of",
    "members_of",
    "row_digest",
    "settings_digest",
    "total_digest",
]

_ROW_TAG = b"ghofl.store.row.v2"
_TOTAL_TAG = b"ghofl.store.total.v2"
_SETTINGS_TAG = b"ghofl.store.settings.v2"
_HEAD_TAG = b"ghofl.store.head.v1"
_MOD = 1 << 256
#: ``members`` of a store without contributions.
MEMBERS_EMPTY = "0" * 64
#: ``head`` of a store without contributions.
HEAD_EMPTY = "0" * 64


def _update(h: Any, value: object) -> None:
    """Feed one field: a type byte, the 8-byte length and the bytes (``None``: type 0 only)."""
    if value is None:
        h.update(b"\x00")
        return
    if isinstance(value, int):
        data, kind = str(value).encode("ascii"), b"\x01"
    elif isinstance(value, str):
        data, kind = value.encode("utf-8", "surrogatepass"), b"\x02"
    elif isinstance(value, bytes | bytearray | memoryview):
        data, kind = bytes(value), b"\x03"
    else:  # a value of an unexpected type (a corrupt row): digested, never equal to a good one
        data, kind = repr(value).encode("utf-8", "surrogatepass"), b"\x04"
    h.update(kind + len(data).to_bytes(8, "little") + data)


def _digest(tag: bytes, *fields: object) -> str:
    h = hashlib.sha256()
    _update(h, tag)
    for field in fields:
        _update(h, field)
    return h.hexdigest()


def row_digest(client_id: object, sha256: object, n_samples: object, n_clipped: object,
               added_at: object, ints: object, floats: object, words: object) -> str:
    """SHA-256 (64 hex digits) of one contribution row, bound to its client id.

    The row as stored: ``str`` ids and dates, ``int`` counts, ``bytes`` arrays,
    ``None`` for absent words.
    """
    return _digest(_ROW_TAG, client_id, sha256, n_samples, n_clipped, added_at, ints, floats,
                   words)


def total_digest(generation: object, words: object, ints: object, floats: object,
                 members: object) -> str:
    """SHA-256 of the total row (its cache generation, BLOBs and members; column order)."""
    return _digest(_TOTAL_TAG, generation, words, ints, floats, members)


def settings_digest(settings: Mapping[str, str]) -> str:
    """SHA-256 of the settings (every key but ``digest``, sorted by key)."""
    fields: list[str] = []
    for key in sorted(k for k in settings if k != "digest"):
        fields += [key, settings[key]]
    return _digest(_SETTINGS_TAG, *fields)


def add_member(members: str, digest: str, sign: int) -> str:
    """``members`` with the row ``digest`` added (``sign`` +1) or taken out (-1)."""
    value = (int(members, 16) + sign * int(digest, 16)) % _MOD
    return f"{value:064x}"


def members_of(digests: list[str]) -> str:
    """``members`` of a set of rows, from their digests."""
    out = MEMBERS_EMPTY
    for d in digests:
        out = add_member(out, d, +1)
    return out


def chain(head: str, digest: str) -> str:
    """The head after appending the row of ``digest`` to a list whose head is ``head``."""
    return _digest(_HEAD_TAG, head, digest)


def head_of(digests: list[str]) -> str:
    """``head`` of a list of rows, from their digests in the order they were added."""
    out = HEAD_EMPTY
    for d in digests:
        out = chain(out, d)
    return out
