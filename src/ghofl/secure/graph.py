"""The public communication graph of SecAgg+ (Bell et al., CCS 2020).

Each client exchanges keys, secret shares and pairwise masks only with its k neighbours. The
graph is a Harary graph: the n clients are placed on a ring in a public, seeded random order
and each is joined to the k/2 clients on either side, so every client has exactly k
neighbours and the graph is k-connected. When k ≥ n − 1 it is the complete graph of the
original protocol (Bonawitz et al., CCS 2017). The random order is derived from the round
identifier, so every party rebuilds the same graph from public information.
"""

from __future__ import annotations

import hashlib
import math

import numpy as np

from ghofl.errors import ConfigError

__all__ = ["HararyGraph", "default_neighbours", "harary_neighbours"]


def default_neighbours(n: int) -> int:
    """Default number of neighbours k for n clients: 2·⌈1.5·log2 n⌉, or n − 1 (complete graph)
    when that is at least n − 1 (up to 13 clients).

    The O(log n) degree is what makes the cost per client grow with log n rather than n.
    """
    if n < 2:
        return max(n - 1, 0)
    k = 2 * math.ceil(1.5 * math.log2(n))
    return n - 1 if k >= n - 1 else k


def harary_neighbours(n: int, k: int, round_id: bytes) -> list[frozenset[int]]:
    """Neighbour sets of a k-regular Harary graph on clients ``0 .. n−1``.

    Parameters
    ----------
    n : int
        Number of clients.
    k : int
        Neighbours per client; rounded up to even, and the graph is complete when k ≥ n − 1.
    round_id : bytes
        Public round identifier seeding the ring order.

    Returns
    -------
    list of frozenset of int
        ``out[i]`` holds the neighbours of client i (never i itself); the relation is symmetric.
    """
    graph = HararyGraph(n, k, round_id)
    return [graph.neighbours(i) for i in range(n)]


class HararyGraph:
    """The graph of :func:`harary_neighbours`, answering one client's neighbourhood in O(k)
    after an O(n) set-up (a client needs only its own).

    Parameters
    ----------
    n, k, round_id :
        As in :func:`harary_neighbours`.
    """

    def __init__(self, n: int, k: int, round_id: bytes) -> None:
        if n < 1:
            raise ConfigError(f"the communication graph needs at least one client; got {n}")
        if k < 1 and n > 1:
            raise ConfigError(f"each client needs at least one neighbour; got k={k}")
        self.n = n
        self.complete = k >= n - 1
        self.half = (k + 1) // 2
        digest = hashlib.sha256(b"ghofl-secagg-v1|graph|" + round_id).digest()
        rng = np.random.Generator(np.random.PCG64(int.from_bytes(digest, "big")))
        self._order = rng.permutation(n)
        self._position = np.empty(n, dtype=np.int64)
        self._position[self._order] = np.arange(n)

    def neighbours(self, i: int) -> frozenset[int]:
        """The neighbours of client ``i`` (never ``i`` itself)."""
        if self.complete:
            return frozenset(j for j in range(self.n) if j != i)
        p = int(self._position[i])
        steps = [s for s in range(-self.half, self.half + 1) if s != 0]
        return frozenset(int(self._order[(p + s) % self.n]) for s in steps)
