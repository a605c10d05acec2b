"""Dropout levels: seeds a survivor's holders reveal only when enough clients survived.

Distributed DP (:mod:`ghofl.privacy.distributed`) needs noise that can be taken back out of
the sum when more clients survive than the fewest the protocol allows. Each client therefore
adds, besides its input, one pseudo-random component per *level* j, expanded from its own
fresh 32-byte seed e_j. A level has a public *release point* u_j: the seed's Shamir shares are
revealed (for a surviving owner) only when the survivor set the holder signed at the
consistency stage has at least u_j members, so the server can regenerate and subtract the
component exactly then. The release points form a ladder t < u_0 < u_1 < … < u_{K-1} = n
(:func:`dropout_ladder`), fixed by the round's public parameters (signed by every client).

The seeds travel inside the same sealed, signed share boxes as the self-mask seed, with the
same holders and threshold, and a commitment to each (:func:`level_commitment`) lets the
server check a reconstruction. The secure layer only moves the seeds; what a seed expands to
is the :class:`LevelNoise` the client's encoder and the server's decoder share.
"""

from __future__ import annotations

import hashlib
import itertools
import struct
from collections.abc import Sequence
from typing import TYPE_CHECKING, Protocol, runtime_checkable

import numpy as np
from numpy.typing import NDArray

from ghofl.errors import ConfigError
from ghofl.stats.meta import StatsMeta

if TYPE_CHECKING:
    from ghofl.secure.config import SessionParams

__all__ = ["MAX_NOISE_LEVELS", "LevelNoise", "check_ladder", "dropout_ladder",
           "level_commitment", "released_levels"]

#: Default (and largest) number of levels of a ladder: integer steps up to this many, then a
#: geometric ladder (:func:`dropout_ladder`).
MAX_NOISE_LEVELS = 16


def dropout_ladder(threshold: int, num_clients: int,
                   levels: int = MAX_NOISE_LEVELS) -> tuple[int, ...]:
    """Release points u_0 < … < u_{K-1} = n between the threshold t and the clients n.

    Every integer t + 1 … n when n − t ≤ ``levels``, else K = ``levels`` points spaced
    geometrically, u_j = round(t·(n/t)^((j+1)/K)) (made strictly increasing), so the ratio of
    two consecutive points (a_0 = t) stays near (n/t)^(1/K).

    Parameters
    ----------
    threshold, num_clients : int
        t and n, 2 ≤ t ≤ n.
    levels : int, default 16
        K, at least 1.

    Returns
    -------
    tuple of int
        Empty when t = n.
    """
    t, n, k = int(threshold), int(num_clients), int(levels)
    if not 2 <= t <= n or k < 1:
        raise ConfigError(
            f"a dropout ladder needs 2 <= t <= n and at least one level; got t={t}, n={n}, "
            f"levels={k}"
        )
    if n - t <= k:
        return tuple(range(t + 1, n + 1))
    points: list[int] = []
    for j in range(1, k + 1):
        u = max(round(t * (n / t) ** (j / k)), (points[-1] if points else t) + 1)
        points.append(min(u, n - (k - j)))
    points[-1] = n
    return tuple(points)


def check_ladder(points: Sequence[int], threshold: int, num_clients: int) -> str | None:
    """What is wrong with release points for t and n (``None``: a valid ladder).

    Valid: empty, or strictly increasing integers above t whose last is n.
    """
    pts = list(points)
    if not pts:
        return None
    if any(not isinstance(u, int) for u in pts):
        return "release points that are not integers"
    if pts[0] <= threshold or pts[-1] != num_clients or any(
            b <= a for a, b in itertools.pairwise(pts)):
        return (f"release points {pts} that do not rise strictly from above the threshold "
                f"t={threshold} to the number of clients n={num_clients}")
    return None


def released_levels(points: Sequence[int], survivors: int) -> tuple[int, ...]:
    """Indices j of the levels whose seeds are revealed for ``survivors`` survivors (u_j ≤ s)."""
    return tuple(j for j, u in enumerate(points) if u <= survivors)


def level_commitment(round_id: bytes, client: str, level: int, seed: bytes) -> bytes:
    """SHA-256 commitment to a client's level-j seed (checks its reconstruction)."""
    c = client.encode()
    return hashlib.sha256(b"ghofl-secagg-v1|level|" + round_id + struct.pack(">H", len(c)) + c
                          + struct.pack(">I", level) + seed).digest()


@runtime_checkable
class LevelNoise(Protocol):
    """What a level seed expands to, identically on the client and on the server.

    Implemented by the distributed-DP encoder and decoder (:mod:`ghofl.privacy.distributed`).
    """

    def expand(self, params: SessionParams, meta: StatsMeta, level: int,
               seed: bytes) -> NDArray[np.uint64]:
        """The words (length ``params.codec.length(meta)``) level ``level`` adds."""
        ...
