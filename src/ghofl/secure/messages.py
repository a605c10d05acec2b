"""Typed, versioned messages of the aggregation protocols: one request and one reply per stage.

Every message carries the protocol version, the round identifier and its stage, so a message
replayed from another round or stage, or delivered out of order, is recognised and its sender
excluded. What a relay could alter to its advantage (the advertised keys, the encrypted shares,
the survivor set of the consistency check) is also signed with the sender's long-term identity
key (:mod:`ghofl.secure.identity`); the signatures travel as plain ``bytes`` fields. Client
replies also name their sender, which must match the transport's identity of the client.
Messages hold only bytes, integers, strings, tuples of those, numpy arrays and (in the plain
protocol only) :class:`~ghofl.stats.ClientStats`, so any transport can carry them;
:func:`message_nbytes` is the size of that content, used for the byte accounting.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any, Literal

import numpy as np
from numpy.typing import NDArray

from ghofl.stats.client_stats import ClientStats
from ghofl.stats.client_stats.packed import PackedStats

__all__ = [
    "PROTOCOL_VERSION",
    "SECURE_STAGES",
    "AdvertiseKeys",
    "AdvertiseRequest",
    "ClientMessage",
    "ConsistencyRequest",
    "ConsistencySignature",
    "Hello",
    "HelloRequest",
    "MaskRequest",
    "MaskedInput",
    "NonceReveal",
    "PlainInput",
    "PlainRequest",
    "RevealRequest",
    "RosterEntry",
    "SealedShare",
    "ServerMessage",
    "ShareKeys",
    "ShareRequest",
    "Stage",
    "UnmaskRequest",
    "UnmaskShares",
    "message_nbytes",
]

PROTOCOL_VERSION = 3
Stage = Literal["hello", "advertise", "reveal", "share", "mask", "consistency", "unmask",
                "input"]
#: The six stages of the secure protocol, in order.
SECURE_STAGES: tuple[Stage, ...] = ("advertise", "reveal", "share", "mask", "consistency",
                                    "unmask")


@dataclass(frozen=True)
class ServerMessage:
    """Common header of every server request."""

    version: int
    round_id: bytes
    stage: Stage


@dataclass(frozen=True)
class ClientMessage:
    """Common header of every client reply."""

    version: int
    round_id: bytes
    stage: Stage
    sender: str


# ---------------------------------------------------------------------- plain protocol
@dataclass(frozen=True)
class PlainRequest(ServerMessage):
    """Ask a client for its statistics in the clear (the one stage ``input``)."""


@dataclass(frozen=True)
class PlainInput(ClientMessage):
    """A client's statistics, in the clear."""

    stats: ClientStats | PackedStats


# ---------------------------------------------------------------------- identity binding
@dataclass(frozen=True)
class HelloRequest(ServerMessage):
    """Which roster identity a node holds, asked with a fresh challenge.

    Sent before a round on a transport whose addresses are not the roster's ids (Flower node ids).
    """

    challenge: bytes
    roster_fingerprint: bytes


@dataclass(frozen=True)
class Hello(ClientMessage):
    """A node's answer: its roster id (``sender``) and its identity key's signature.

    The signature covers the challenge, the roster fingerprint and its transport address
    (:func:`ghofl.secure._common.hello_transcript`).
    """

    address: str
    signature: bytes


# ---------------------------------------------------------------------- stage 1: advertise
@dataclass(frozen=True)
class AdvertiseRequest(ServerMessage):
    """Start of a secure round: the public parameters every client must agree to.

    Attributes
    ----------
    params : tuple of (str, str)
        The session's public parameters (:meth:`SessionParams.items`), as text.
    meta : str
        Canonical JSON of the expected statistics metadata.
    roster_fingerprint : bytes
        SHA-256 of the federation's roster (:meth:`~ghofl.secure.identity.Roster.fingerprint`)
        the server runs the round over; empty when the round is unauthenticated.
    """

    params: tuple[tuple[str, str], ...]
    meta: str
    roster_fingerprint: bytes


@dataclass(frozen=True)
class AdvertiseKeys(ClientMessage):
    """A client's two X25519 public keys and a commitment to its graph nonce, signed.

    One key encrypts shares, one agrees masks. ``nonce_commitment`` commits to the fresh
    nonce the client reveals once the relayed roster is fixed (the graph's seed hashes every
    nonce, so no party chooses it). The signature covers the round, the roster fingerprint,
    the parameters, the metadata, the keys and the commitment
    (:func:`ghofl.secure._common.advert_transcript`; empty when unauthenticated).
    """

    enc_public: bytes
    mask_public: bytes
    nonce_commitment: bytes
    meta: str
    signature: bytes


# ---------------------------------------------------------------------- stage 2: reveal
@dataclass(frozen=True)
class RosterEntry:
    """One client that advertised its keys, as the server relays it to everyone.

    With the client's own signature of its advertisement, so no relay can swap the keys or
    the nonce commitment.
    """

    client: str
    enc_public: bytes
    mask_public: bytes
    nonce_commitment: bytes
    signature: bytes


@dataclass(frozen=True)
class RevealRequest(ServerMessage):
    """The relayed roster: the clients whose advertisements were accepted.

    Fixed before any nonce is revealed; each client checks it (signatures, size) and answers
    with its nonce.
    """

    roster: tuple[RosterEntry, ...]


@dataclass(frozen=True)
class NonceReveal(ClientMessage):
    """The nonce a client committed to in its advertisement."""

    nonce: bytes


# ---------------------------------------------------------------------- stage 3: share
@dataclass(frozen=True)
class ShareRequest(ServerMessage):
    """Every relayed client's revealed nonce: together they seed the graph.

    Attributes
    ----------
    nonces : tuple of (str, bytes)
        (client, nonce) for exactly the clients of the relayed roster.
    """

    nonces: tuple[tuple[str, bytes], ...]


@dataclass(frozen=True)
class SealedShare:
    """Shares of one client's secrets for another, encrypted, authenticated and signed.

    Encrypted and authenticated with AES-GCM under a key of this sender–recipient pair only
    (:func:`ghofl.secure._common.pair_key`); ``key_commitment`` commits to that key, and the
    sender signs the box with the commitment, so a recipient can prove a bad box by revealing
    the pair key, which opens no other box.
    """

    sender: str
    recipient: str
    sealed: bytes
    key_commitment: bytes
    signature: bytes


@dataclass(frozen=True)
class ShareKeys(ClientMessage):
    """A client's encrypted shares for each of its neighbours, and a commitment to its seed.

    ``level_commitments``: one commitment per level seed of the round's dropout ladder
    (:func:`ghofl.secure.levels.level_commitment`), empty without one.
    """

    shares: tuple[SealedShare, ...]
    seed_commitment: bytes
    level_commitments: tuple[bytes, ...] = ()


# ---------------------------------------------------------------------- stage 4: mask
@dataclass(frozen=True)
class MaskRequest(ServerMessage):
    """Who completed the share stage, and the shares addressed to this client."""

    sharers: tuple[str, ...]
    shares: tuple[SealedShare, ...]


@dataclass(frozen=True)
class MaskedInput(ClientMessage):
    """The masked, fixed-point encoded statistics, and complaints about bad shares received.

    Attributes
    ----------
    vector : ndarray of uint64, shape (L,)
    complaints : tuple of (str, str)
        (sender, reason) for each signed share box that failed to open.
    complaint_keys : tuple of (str, bytes)
        (sender, the pair key of that box): the key of one sender–recipient pair, which opens
        that box only, so the server can check the complaint against the signed box it
        relayed and learns nothing else.
    """

    vector: NDArray[np.uint64]
    complaints: tuple[tuple[str, str], ...]
    complaint_keys: tuple[tuple[str, bytes], ...]


# ---------------------------------------------------------------------- stage 5: consistency
@dataclass(frozen=True)
class ConsistencyRequest(ServerMessage):
    """The survivor and dropped sets, for every survivor to sign before shares are revealed.

    The clients whose masked input is in the sum and the sharers that dropped
    (together: exactly the sharers).
    """

    survivors: tuple[str, ...]
    dropped: tuple[str, ...]


@dataclass(frozen=True)
class ConsistencySignature(ClientMessage):
    """A survivor's signature of the survivor and dropped sets it was told.

    See :func:`ghofl.secure._common.consistency_transcript`.
    """

    signature: bytes


# ---------------------------------------------------------------------- stage 6: unmask
@dataclass(frozen=True)
class UnmaskRequest(ServerMessage):
    """The sets to unmask, with the survivors' signatures of them.

    The clients whose input is in the sum, those whose pairwise masks must be removed, and the
    survivors' signatures of exactly these two sets (the consistency check).

    Attributes
    ----------
    signatures : tuple of (str, bytes)
        (survivor, its :class:`ConsistencySignature`) for every survivor that signed.
    """

    survivors: tuple[str, ...]
    dropped: tuple[str, ...]
    signatures: tuple[tuple[str, bytes], ...]


@dataclass(frozen=True)
class UnmaskShares(ClientMessage):
    """Shares of survivors' self-mask seeds and of dropped clients' mask keys.

    Attributes
    ----------
    seed_shares : tuple of (str, bytes)
        (owner, share of the owner's self-mask seed) for surviving owners.
    key_shares : tuple of (str, bytes)
        (owner, share of the owner's mask private key) for dropped owners.
    level_shares : tuple of (str, int, bytes)
        (owner, level j, share of the owner's level-j seed) for surviving owners, only for the
        levels whose release point is at most the number of survivors signed
        (:mod:`ghofl.secure.levels`).
    """

    seed_shares: tuple[tuple[str, bytes], ...]
    key_shares: tuple[tuple[str, bytes], ...]
    level_shares: tuple[tuple[str, int, bytes], ...] = ()


def message_nbytes(message: Any) -> int:
    """Bytes of content of a message: raw bytes, array data, UTF-8 text, 8 per integer.

    ClientStats (and PackedStats) count their array data (what a file of them holds, without
    the header).
    """
    if isinstance(message, bytes | bytearray):
        return len(message)
    if isinstance(message, np.ndarray):
        return int(message.nbytes)
    if isinstance(message, str):
        return len(message.encode())
    if isinstance(message, bool | int | float) or message is None:
        return 8
    if isinstance(message, ClientStats | PackedStats):
        from ghofl.stats.codec import payload_nbytes

        return payload_nbytes(message)
    if isinstance(message, tuple | list):
        if all(isinstance(m, str) for m in message):
            return len("".join(message).encode())
        return sum(message_nbytes(m) for m in message)
    if dataclasses.is_dataclass(message) and not isinstance(message, type):
        return sum(message_nbytes(getattr(message, f.name)) for f in dataclasses.fields(message))
    raise TypeError(f"cannot size a {type(message).__name__} message field")
