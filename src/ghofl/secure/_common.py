"""Pieces both halves of the secure protocol compute identically from public information."""

from __future__ import annotations

import hashlib
import struct

from ghofl.secure.config import SessionParams
from ghofl.secure.graph import HararyGraph
from ghofl.secure.messages import RosterEntry

SHARE_PLAINTEXT_BYTES = 132  # share of the self-mask seed + share of the mask private key


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


class Topology:
    """Roster order, Shamir points and neighbourhoods of one round.

    Parameters
    ----------
    clients : tuple of str
        Roster order (client ids as relayed by the server). The Shamir point of a client is
        its position + 1; the pairwise mask of u and v is added by the lower position and
        subtracted by the higher.
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
        clients = tuple(e.client for e in roster)
        n = len(clients)
        k = n - 1 if params.complete_graph else min(params.neighbours, n - 1)
        return cls(clients, HararyGraph(n, k, round_id))

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
