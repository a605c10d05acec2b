"""Typed, versioned messages of the aggregation protocols: one request and one reply per stage.

Every message carries the protocol version, the round identifier and its stage, so a message
replayed from another round or stage, or delivered out of order, is recognised and its sender
excluded. Client replies also name their sender, which must match the transport's identity of
the client. Messages hold only bytes, integers, strings, tuples of those, numpy arrays and (in
the plain protocol only) :class:`~ghofl.stats.ClientStats`, so any transport can carry them;
:func:`message_nbytes` is the size of that content, used for the byte accounting.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any, Literal

import numpy as np
from numpy.typing import NDArray

from ghofl.stats.client_stats import ClientStats

__all__ = [
    "PROTOCOL_VERSION",
    "SECURE_STAGES",
    "AdvertiseKeys",
    "AdvertiseRequest",
    "ClientMessage",
    "MaskRequest",
    "MaskedInput",
    "PlainInput",
    "PlainRequest",
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

PROTOCOL_VERSION = 1
Stage = Literal["advertise", "share", "mask", "unmask", "input"]
#: The four stages of the secure protocol, in order.
SECURE_STAGES: tuple[Stage, ...] = ("advertise", "share", "mask", "unmask")


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

    stats: ClientStats


# ---------------------------------------------------------------------- stage 1: advertise
@dataclass(frozen=True)
class AdvertiseRequest(ServerMessage):
    """Start of a secure round: the public parameters every client must agree to.

    Attributes
    ----------
    params : tuple of (str, str)
        The session's public parameters (:meth:`SecAggConfig.public_items`), as text.
    meta : str
        Canonical JSON of the expected statistics metadata.
    """

    params: tuple[tuple[str, str], ...]
    meta: str


@dataclass(frozen=True)
class AdvertiseKeys(ClientMessage):
    """A client's two X25519 public keys: one to encrypt shares, one to agree masks."""

    enc_public: bytes
    mask_public: bytes
    meta: str


# ---------------------------------------------------------------------- stage 2: share
@dataclass(frozen=True)
class RosterEntry:
    """One client that advertised its keys, as the server relays it to everyone."""

    client: str
    enc_public: bytes
    mask_public: bytes


@dataclass(frozen=True)
class ShareRequest(ServerMessage):
    """The roster of clients whose keys were accepted (order fixes indices and signs)."""

    roster: tuple[RosterEntry, ...]


@dataclass(frozen=True)
class SealedShare:
    """Shares of one client's secrets for another, encrypted and authenticated (AES-GCM)."""

    sender: str
    recipient: str
    sealed: bytes


@dataclass(frozen=True)
class ShareKeys(ClientMessage):
    """A client's encrypted shares for each of its neighbours, and a commitment to its seed."""

    shares: tuple[SealedShare, ...]
    seed_commitment: bytes


# ---------------------------------------------------------------------- stage 3: mask
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
        (client, reason) for each share that failed authentication or decoding.
    """

    vector: NDArray[np.uint64]
    complaints: tuple[tuple[str, str], ...]


# ---------------------------------------------------------------------- stage 4: unmask
@dataclass(frozen=True)
class UnmaskRequest(ServerMessage):
    """The clients whose input is in the sum, and those whose pairwise masks must be removed."""

    survivors: tuple[str, ...]
    dropped: tuple[str, ...]


@dataclass(frozen=True)
class UnmaskShares(ClientMessage):
    """Shares of survivors' self-mask seeds and of dropped clients' mask keys.

    Attributes
    ----------
    seed_shares : tuple of (str, bytes)
        (owner, share of the owner's self-mask seed) for surviving owners.
    key_shares : tuple of (str, bytes)
        (owner, share of the owner's mask private key) for dropped owners.
    """

    seed_shares: tuple[tuple[str, bytes], ...]
    key_shares: tuple[tuple[str, bytes], ...]


def message_nbytes(message: Any) -> int:
    """Bytes of content of a message: raw bytes, array data, UTF-8 text, 8 per integer.

    ClientStats count their array data (what a file of them holds, without the header).
    """
    if isinstance(message, bytes | bytearray):
        return len(message)
    if isinstance(message, np.ndarray):
        return int(message.nbytes)
    if isinstance(message, str):
        return len(message.encode())
    if isinstance(message, bool | int | float) or message is None:
        return 8
    if isinstance(message, ClientStats):
        from ghofl.stats.codec import payload_nbytes

        return payload_nbytes(message)
    if isinstance(message, tuple | list):
        if all(isinstance(m, str) for m in message):
            return len("".join(message).encode())
        return sum(message_nbytes(m) for m in message)
    if dataclasses.is_dataclass(message) and not isinstance(message, type):
        return sum(message_nbytes(getattr(message, f.name)) for f in dataclasses.fields(message))
    raise TypeError(f"cannot size a {type(message).__name__} message field")
