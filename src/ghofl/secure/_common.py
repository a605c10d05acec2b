"""Pieces both halves of the secure protocol compute identically from public information."""

from __future__ import annotations

import hashlib
import struct

from ghofl.secure import primitives as cr
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


def seed_commitment(session: bytes, client: str, seed: bytes) -> bytes:
    """SHA-256 commitment to a client's self-mask seed (checks its reconstruction)."""
    return hashlib.sha256(transcript("seed", PROTOCOL_VERSION, session, client, seed)).digest()


def nonce_commitment(round_id: bytes, client: str, nonce: bytes) -> bytes:
    """SHA-256 commitment to the graph nonce a client reveals once the roster is fixed."""
    return hashlib.sha256(transcript("nonce", PROTOCOL_VERSION, round_id, client, nonce)).digest()


def pair_key(shared: bytes, session: bytes, sender: str, recipient: str) -> bytes:
    """The key of the share box from ``sender`` to ``recipient``, and of no other box.

    HKDF of the pair's X25519 secret bound to the session and to both names in order, so
    revealing it (a complaint) opens this one box: the pair's secret itself stays hidden.
    """
    s, r = sender.encode(), recipient.encode()
    return cr.derive_key(shared, b"share|" + struct.pack(">H", len(s)) + s
                         + struct.pack(">H", len(r)) + r, session)


def key_commitment(session: bytes, sender: str, recipient: str, key: bytes) -> bytes:
    """SHA-256 commitment to a pair key; the sender signs it with the box it seals."""
    return hashlib.sha256(transcript("pair-key", PROTOCOL_VERSION, session, sender, recipient,
                                     key)).digest()


def advert_transcript(round_id: bytes, roster_fingerprint: bytes,
                      params: tuple[tuple[str, str], ...], meta: str, sender: str,
                      enc_public: bytes, mask_public: bytes, nonce_commitment: bytes) -> bytes:
    """What a client signs when it advertises its keys.

    The protocol version, the round, the roster, the public parameters and metadata it
    agreed to, itself, its two keys and the commitment to its graph nonce.
    """
    flat = [x for pair in params for x in pair]
    return transcript("advertise", PROTOCOL_VERSION, round_id, roster_fingerprint, sender,
                      enc_public, mask_public, nonce_commitment, meta, len(params), *flat)


def hello_transcript(round_id: bytes, challenge: bytes, roster_fingerprint: bytes,
                     sender: str, address: str) -> bytes:
    """What a node signs to bind its transport address to its roster identity."""
    return transcript("hello", PROTOCOL_VERSION, round_id, challenge, roster_fingerprint,
                      sender, address)


def share_transcript(session: bytes, sender: str, recipient: str, sealed: bytes,
                     key_commitment: bytes) -> bytes:
    """What a client signs for each encrypted share it sends (with its pair-key commitment)."""
    return transcript("share", PROTOCOL_VERSION, session, sender, recipient, sealed,
                      key_commitment)


def consistency_transcript(session: bytes, roster_fingerprint: bytes,
                           survivors: tuple[str, ...] | list[str],
                           dropped: tuple[str, ...] | list[str]) -> bytes:
    """What a survivor signs at the consistency check: the two sets it was told (sorted).

    Bound to the session (:func:`session_id`: every advertisement and nonce of this run), so
    a signature collected in another run, even under the same round id, never verifies here.
    """
    s, d = sorted(survivors), sorted(dropped)
    return transcript("consistency", PROTOCOL_VERSION, session, roster_fingerprint,
                      len(s), *s, len(d), *d)


def session_id(round_id: bytes, roster: tuple[RosterEntry, ...],
               nonces: dict[str, bytes]) -> bytes:
    """The round's transcript hash, which also seeds the graph.

    SHA-256 of the round id, every signed advertisement relayed (keys, nonce commitments,
    signatures) and every revealed nonce. Each advertiser committed to its nonce before the
    relayed set was fixed and revealed it only after, so while one honest client's nonce is
    in the hash no party (the server, a relay, colluding clients) can choose the graph: leaving
    a client out or re-drawing buys nothing but an abort. Fresh keys and nonces make it
    different in every run, so everything signed under it is bound to this run.
    """
    parts: list[bytes | str | int] = [round_id, len(roster)]
    for e in sorted(roster, key=lambda e: e.client):
        parts += [e.client, e.enc_public, e.mask_public, e.nonce_commitment, e.signature,
                  nonces[e.client]]
    return hashlib.sha256(transcript("session", PROTOCOL_VERSION, *parts)).digest()


def graph_seed(session: bytes) -> bytes:
    """The seed ordering the graph: the session hash, domain-separated from its other uses."""
    return hashlib.sha256(transcript("graph", PROTOCOL_VERSION, session)).digest()


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
    share_threshold : int
        t_s of the graph: the shares that recover one client's secrets
        (:meth:`~ghofl.secure.config.SessionParams.relayed`).
    """

    def __init__(self, clients: tuple[str, ...], graph: HararyGraph,
                 share_threshold: int = 2) -> None:
        self.clients = clients
        self.share_threshold = share_threshold
        self.index = {c: i for i, c in enumerate(clients)}
        self._graph = graph
        self._cache: dict[str, frozenset[str]] = {}

    @classmethod
    def build(cls, roster: tuple[RosterEntry, ...], params: SessionParams,
              session: bytes) -> Topology:
        """The topology over the relayed ``roster``, ordered by the :func:`session_id`.

        Degree and share threshold are those of the relayed size
        (:meth:`~ghofl.secure.config.SessionParams.relayed`).
        """
        clients = tuple(sorted(e.client for e in roster))
        k, t_s = params.relayed(len(clients))
        return cls(clients, HararyGraph(len(clients), k, graph_seed(session)), t_s)

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
