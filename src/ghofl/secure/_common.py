"""Pieces both halves of the secure protocol compute identically from public information."""

from __future__ import annotations

import hashlib
import struct

from ghofl.secure.config import SessionParams
from ghofl.secure.graph import HararyGraph, survivor_components
from ghofl.secure.identity import transcript
from ghofl.secure.messages import PROTOCOL_VERSION, RosterEntry

SHARE_PLAINTEXT_BYTES = 132  # share of the self-mask seed + share of the mask private key
LEVEL_SHARE_BYTES = 66  # one Shamir share of a level seed (ghofl.secure.levels)


def share_plaintext_bytes(levels: int) -> int:
    """Bytes of one share box's plaintext: seed and key shares, then one share per level."""
    return SHARE_PLAINTEXT_BYTES + LEVEL_SHARE_BYTES * levels


def split_plaintext(plain: bytes) -> tuple[bytes, bytes, tuple[bytes, ...]]:
    """(seed share, key share, level shares) of a share box's plaintext."""
    half = SHARE_PLAINTEXT_BYTES // 2
    return plain[:half], plain[half:SHARE_PLAINTEXT_BYTES], split_levels(
        plain[SHARE_PLAINTEXT_BYTES:])


def split_levels(data: bytes) -> tuple[bytes, ...]:
    """The level shares concatenated in ``data``, one per :data:`LEVEL_SHARE_BYTES`."""
    return tuple(data[i : i + LEVEL_SHARE_BYTES] for i in range(0, len(data), LEVEL_SHARE_BYTES))


def share_aad(round_id: bytes, sender: str, recipient: str) -> bytes:
    """Associated data binding an encrypted share to its round, sender and recipient."""
    s, r = sender.encode(), recipient.encode()
    return b"share|" + round_id + struct.pack(">H", len(s)) + s + struct.pack(">H", len(r)) + r


def seed_commitment(round_id: bytes, client: str, seed: bytes) -> bytes:
    """SHA-256 commitment to a client's self-mask seed (checks its reconstruction)."""
    c = client.encode()
    return hashlib.sha256(
        b"ghofl-secagg-v1|seed|" + round_id + struct.pack(">H", len(c)) + c + seed
    ).digest()


def advert_transcript(round_id: bytes, roster_fingerprint: bytes,
                      params: tuple[tuple[str, str], ...], meta: str, sender: str,
                      enc_public: bytes, mask_public: bytes) -> bytes:
    """What a client signs when it advertises its keys.

    The protocol version, the round, the roster, the public parameters and metadata it
    agreed to, itself and its two keys.
    """
    flat = [x for pair in params for x in pair]
    return transcript("advertise", PROTOCOL_VERSION, round_id, roster_fingerprint, sender,
                      enc_public, mask_public, meta, len(params), *flat)


def hello_transcript(round_id: bytes, challenge: bytes, roster_fingerprint: bytes,
                     sender: str, address: str) -> bytes:
    """What a node signs to bind its transport address to its roster identity."""
    return transcript("hello", PROTOCOL_VERSION, round_id, challenge, roster_fingerprint,
                      sender, address)


def share_transcript(round_id: bytes, sender: str, recipient: str, sealed: bytes) -> bytes:
    """What a client signs for each encrypted share it sends."""
    return transcript("share", PROTOCOL_VERSION, round_id, sender, recipient, sealed)


def consistency_transcript(round_id: bytes, roster_fingerprint: bytes,
                           survivors: tuple[str, ...] | list[str],
                           dropped: tuple[str, ...] | list[str]) -> bytes:
    """What a survivor signs at the consistency check: the two sets it was told (sorted)."""
    s, d = sorted(survivors), sorted(dropped)
    return transcript("consistency", PROTOCOL_VERSION, round_id, roster_fingerprint,
                      len(s), *s, len(d), *d)


def graph_seed(round_id: bytes, roster: tuple[RosterEntry, ...]) -> bytes:
    """The public randomness ordering the graph.

    A hash of the round and of every signed advertisement in it, fixed only once all advertisements
    are in (no party picks it without re-drawing through the hash).
    """
    parts: list[bytes | str | int] = [round_id, len(roster)]
    for e in sorted(roster, key=lambda e: e.client):
        parts += [e.client, e.enc_public, e.mask_public, e.signature]
    return hashlib.sha256(transcript("graph", PROTOCOL_VERSION, *parts)).digest()


class Topology:
    """Roster order, Shamir points and neighbourhoods of one round.

    Parameters
    ----------
    clients : tuple of str
        Canonical order (client ids sorted, whatever order the server relayed them in). The
        Shamir point of a client is its position + 1; the pairwise mask of u and v is added by
        the lower position and subtracted by the higher.
    graph : HararyGraph
        The public graph over roster positions.
    """

    def __init__(self, clients: tuple[str, ...], graph: HararyGraph) -> None:
        self.clients = clients
        self.index = {c: i for i, c in enumerate(clients)}
        self._graph = graph
        self._cache: dict[str, frozenset[str]] = {}

    @classmethod
    def build(cls, roster: tuple[RosterEntry, ...], params: SessionParams,
              round_id: bytes) -> Topology:
        clients = tuple(sorted(e.client for e in roster))
        n = len(clients)
        k = n - 1 if params.complete_graph else min(params.neighbours, n - 1)
        return cls(clients, HararyGraph(n, k, graph_seed(round_id, roster)))

    def neighbours(self, client: str) -> frozenset[str]:
        """The neighbours of ``client`` on the graph."""
        found = self._cache.get(client)
        if found is None:
            found = frozenset(self.clients[j] for j in self._graph.neighbours(self.index[client]))
            self._cache[client] = found
        return found

    def holders(self, client: str) -> list[str]:
        """The clients holding shares of ``client``'s secrets: itself and its neighbours."""
        return sorted(self.neighbours(client) | {client}, key=self.index.__getitem__)

    def point(self, client: str) -> int:
        return self.index[client] + 1

    def sign(self, client: str, other: str) -> int:
        """+1 when ``client`` adds the pairwise mask shared with ``other``, else −1."""
        return 1 if self.index[client] < self.index[other] else -1

    def components(self, members: frozenset[str]) -> list[frozenset[str]]:
        """Connected components of the graph restricted to ``members``.

        The server learns the sum over each component of the surviving clients (pairwise
        masks cancel within a component), so more than one component is a partial sum.
        """
        if self._graph.complete or not members:
            return [members] if members else []
        parts = survivor_components(self._graph, (self.index[c] for c in members))
        return [frozenset(self.clients[j] for j in part) for part in parts]
