"""Helpers of the secure sum's server half (:mod:`ghofl.secure.server`).

Reconstruction of secrets from Shamir shares, the complaint check, and the header check every
client reply passes first.
"""

from __future__ import annotations

import itertools
from typing import Any

from ghofl.secure import primitives as cr
from ghofl.secure import shamir
from ghofl.secure._common import share_aad
from ghofl.secure.messages import PROTOCOL_VERSION, ClientMessage, SealedShare

__all__ = ["first_valid", "header_problem", "level_seed", "opens"]

_MAX_RECONSTRUCTION_TRIES = 64


def level_seed(points: dict[int, bytes], t_s: int, weights: dict[tuple[int, ...], list[int]],
               valid: Any) -> bytes | None:
    """A level seed from its shares (point → share): the first ``t_s`` points first.

    Their Lagrange weights are cached in ``weights`` (every level of an owner, and usually
    every owner, has the same holders); other subsets are tried when that one fails ``valid``.
    """
    xs = tuple(sorted(points)[:t_s])
    if len(xs) == t_s:
        if xs not in weights:
            weights[xs] = shamir.lagrange_weights(xs)
        seed = shamir.reconstruct_with(weights[xs], [points[x] for x in xs])
        if seed is not None and valid(seed):
            return seed
    return first_valid(sorted(points.items()), t_s, valid)


def first_valid(points: list[tuple[int, bytes]], t_s: int, valid: Any) -> bytes | None:
    """The first secret of ``t_s`` of ``points`` that passes ``valid`` (bounded tries)."""
    for tries, subset in enumerate(itertools.combinations(points, t_s)):
        if tries >= _MAX_RECONSTRUCTION_TRIES:
            break
        secret = shamir.reconstruct(subset, t_s)
        if secret is not None and valid(secret):
            return secret
    return None


def opens(key: bytes, box: SealedShare, session: bytes, plaintext_bytes: int) -> bool:
    """Whether ``box`` opens under its pair key (the complaint check)."""
    plain = cr.aead_decrypt(key, box.sealed, share_aad(session, box.sender, box.recipient))
    return plain is not None and len(plain) == plaintext_bytes


def header_problem(msg: Any, expected: type, stage: str, client: str,
                   round_id: bytes) -> str | None:
    if not isinstance(msg, ClientMessage):
        return f"sent a {type(msg).__name__}, not a protocol message (malformed)"
    if msg.version != PROTOCOL_VERSION:
        return f"speaks protocol version {msg.version!r}, not {PROTOCOL_VERSION}"
    if msg.round_id != round_id:
        return "sent a message from another round (replayed)"
    if msg.stage != stage or not isinstance(msg, expected):
        return (f"sent a {type(msg).__name__} for stage {msg.stage!r} during stage {stage!r} "
                "(replayed or reordered)")
    if msg.sender != client:
        return f"sent a message claiming to come from {msg.sender!r}"
    return None
