"""Binding transport addresses to roster identities (before a round).

On a transport whose addresses are not the roster's client ids (Flower numbers its nodes
itself), the server first asks every address which roster identity it holds
(:class:`~ghofl.secure.messages.HelloRequest`, with a fresh challenge). Each node answers with
its roster id and its identity key's signature of the challenge, the roster fingerprint and
its own address (:class:`~ghofl.secure.messages.Hello`), so a relay can neither claim an
identity for a node nor move one node's answer to another. The round then runs over roster
ids; an address that does not answer, or answers badly, is simply absent (a dropout).
"""

from __future__ import annotations

import secrets
from collections.abc import Iterable

from ghofl.errors import ProtocolError
from ghofl.secure._common import hello_transcript
from ghofl.secure.identity import IdentityKey, Roster, verify_signature
from ghofl.secure.messages import PROTOCOL_VERSION, ClientMessage, Hello, HelloRequest

__all__ = ["answer_hello", "bind_addresses", "hello_request"]


def hello_request(roster: Roster, round_id: bytes | None = None) -> HelloRequest:
    """A fresh identity request for ``roster`` (random 32-byte challenge)."""
    rid = round_id if round_id is not None else secrets.token_bytes(16)
    return HelloRequest(PROTOCOL_VERSION, rid, "hello", challenge=secrets.token_bytes(32),
                        roster_fingerprint=roster.fingerprint())


def answer_hello(request: HelloRequest, identity: IdentityKey, roster: Roster,
                 address: str) -> Hello:
    """A node's answer: its roster id and signature.

    Raises
    ------
    ProtocolError
        The request names another roster, or this identity is not on the roster.
    """
    if request.version != PROTOCOL_VERSION:
        raise ProtocolError(f"refused an identity request of protocol version {request.version}")
    if request.roster_fingerprint != roster.fingerprint():
        raise ProtocolError(
            "refused an identity request for another roster (its fingerprint differs from "
            "this node's roster)"
        )
    name = next((c for c, k in roster.keys.items() if k == identity.public), None)
    if name is None:
        raise ProtocolError(
            "this node's identity key is not on its roster; rebuild the roster with this "
            "node's public key, or give the node its own key"
        )
    signature = identity.sign(hello_transcript(request.round_id, request.challenge,
                                               request.roster_fingerprint, name, address))
    return Hello(PROTOCOL_VERSION, request.round_id, "hello", name, address=address,
                 signature=signature)


def bind_addresses(request: HelloRequest, replies: Iterable[tuple[str, ClientMessage]],
                   roster: Roster) -> tuple[dict[str, str], dict[str, str]]:
    """Check the answers to ``request``.

    Parameters
    ----------
    request : HelloRequest
    replies : iterable of (address, message)
        What each address answered.
    roster : Roster

    Returns
    -------
    (bound, problems) : (dict of str to str, dict of str to str)
        Roster id → address for every valid answer, and address → reason for the others
        (an identity claimed by two addresses binds neither).
    """
    bound: dict[str, str] = {}
    problems: dict[str, str] = {}
    claims: dict[str, list[str]] = {}
    for address, msg in replies:
        why = _hello_problem(request, address, msg, roster)
        if why is not None:
            problems[address] = why
            continue
        claims.setdefault(msg.sender, []).append(address)
    for name, addresses in claims.items():
        if len(addresses) > 1:
            for a in addresses:
                problems[a] = f"claims the identity {name!r}, which {len(addresses)} nodes claim"
        else:
            bound[name] = addresses[0]
    return bound, problems


def _hello_problem(request: HelloRequest, address: str, msg: ClientMessage,
                   roster: Roster) -> str | None:
    if not isinstance(msg, Hello) or msg.version != PROTOCOL_VERSION:
        return f"answered the identity request with a {type(msg).__name__}"
    if msg.round_id != request.round_id or msg.address != address:
        return "sent an identity answer for another request or node (replayed or moved)"
    if msg.sender not in roster:
        return f"claims the identity {msg.sender!r}, which is not on the roster"
    statement = hello_transcript(request.round_id, request.challenge, request.roster_fingerprint,
                                 msg.sender, address)
    if not verify_signature(roster.public(msg.sender), msg.signature, statement):
        return f"claims the identity {msg.sender!r} without its key's signature"
    return None
