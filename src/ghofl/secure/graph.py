"""The public communication graph of SecAgg+ (Bell et al., CCS 2020).

Each client exchanges keys, secret shares and pairwise masks only with its k neighbours. The
graph is a Harary graph: the n clients are placed on a ring in a public, seeded random order
and each is joined to the k/2 clients on either side, so every client has exactly k
neighbours and the graph is k-connected. When k ≥ n − 1 it is the complete graph of the
original protocol (Bonawitz et al., CCS 2017). The random order is derived from a public seed
given by the caller (fixed only after every advertisement is in, so that no party chooses
it), and every party rebuilds the same graph from (n, k, seed) in O(n).

The degree and the share threshold are sized by
:func:`ghofl.secure.graph_params.required_parameters`; :func:`survivor_components` tells a
client whether the survivors' subgraph is connected (when it is not, unmasking would reveal
the sum of each component).
"""

from __future__ import annotations

import functools
import hashlib
from collections.abc import Iterable

import numpy as np
from numpy.typing import NDArray

from ghofl.errors import ConfigError
from ghofl.secure.graph_params import required_parameters

__all__ = ["HararyGraph", "default_neighbours", "harary_neighbours", "reveals_partial_sum",
           "survivor_components"]


@functools.lru_cache(maxsize=256)
def default_neighbours(n: int) -> int:
    """Default number of neighbours k for n clients.

    The smallest even degree meeting exposure ≤ 2^-40 and abort ≤ 2^-20 per honest client at
    γ = δ = 1/3 (:func:`~ghofl.secure.graph_params.required_parameters`), or n − 1 (complete graph)
    when no smaller one does, or when no graph meets them (very few clients).

    The degree stops growing with n once n is large (the neighbourhoods become samples with
    replacement), so the cost per client is bounded in n.
    """
    if n < 2:
        return max(n - 1, 0)
    try:
        return required_parameters(n)[0]
    except ConfigError:
        return n - 1


def harary_neighbours(n: int, k: int, seed: bytes) -> list[frozenset[int]]:
    """Neighbour sets of a k-regular Harary graph on clients ``0 .. n−1``.

    Parameters
    ----------
    n : int
        Number of clients.
    k : int
        Neighbours per client; rounded up to even, and the graph is complete when k ≥ n − 1.
    seed : bytes
        Public randomness seeding the ring order (e.g. a hash of the signed advertisements).

    Returns
    -------
    list of frozenset of int
        ``out[i]`` holds the neighbours of client i (never i itself); the relation is symmetric.
    """
    graph = HararyGraph(n, k, seed)
    return [graph.neighbours(i) for i in range(n)]


class HararyGraph:
    """The graph of :func:`harary_neighbours`, one client's neighbourhood at a time.

    Answers a neighbourhood in O(k) after an O(n) set-up (a client needs only its own).

    Parameters
    ----------
    n, k, seed :
        As in :func:`harary_neighbours`.

    Attributes
    ----------
    n : int
    complete : bool
        Whether the graph is complete (k ≥ n − 1 after rounding k up to even).
    half : int
        ⌈k/2⌉: clients at ring distance at most ``half`` are neighbours.
    """

    def __init__(self, n: int, k: int, seed: bytes) -> None:
        if n < 1:
            raise ConfigError(f"the communication graph needs at least one client; got {n}")
        if k < 1 and n > 1:
            raise ConfigError(f"each client needs at least one neighbour; got k={k}")
        self.n = n
        self.complete = 2 * ((k + 1) // 2) >= n - 1
        self.half = (k + 1) // 2
        digest = hashlib.sha256(b"ghofl-secagg-v1|graph|" + bytes(seed)).digest()
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

    @property
    def degree(self) -> int:
        """Neighbours per client."""
        return self.n - 1 if self.complete else 2 * self.half

    def positions(self, clients: Iterable[int]) -> NDArray[np.int64]:
        """Ring positions of ``clients``; shape (len(clients),)."""
        return self._position[np.fromiter(clients, dtype=np.int64)]


def survivor_components(graph: HararyGraph, survivors: Iterable[int]) -> list[list[int]]:
    """Connected components of the subgraph the survivors induce on ``graph``.

    On the Harary ring two clients are neighbours exactly when their ring distance is at most
    ``graph.half``, so sorting the survivors by ring position and cutting wherever two
    consecutive survivors lie more than ``half`` apart gives the components: one cut leaves a
    path, each further cut one more component. O(s log s) for s survivors.

    Parameters
    ----------
    graph : HararyGraph
    survivors : iterable of int
        Client indices (0 … n − 1) that survived.

    Returns
    -------
    list of list of int
        The components, each sorted; ``[]`` when there are no survivors.
    """
    ids = np.unique(np.fromiter(survivors, dtype=np.int64))
    if ids.size == 0:
        return []
    if ids[0] < 0 or ids[-1] >= graph.n:
        raise ConfigError(f"survivor indices must lie in 0 … {graph.n - 1}")
    if graph.complete or ids.size == 1:
        return [ids.tolist()]
    pos = graph.positions(ids.tolist())
    order = np.argsort(pos)
    ring = pos[order]
    gaps = np.diff(np.append(ring, ring[0] + graph.n))  # gap after each survivor, cyclically
    cuts = np.nonzero(gaps > graph.half)[0]
    if cuts.size <= 1:
        return [ids.tolist()]
    members = ids[order]
    out = []
    for a, b in zip(cuts, np.roll(cuts, -1), strict=True):
        idx = np.arange(a + 1, b + 1 if b > a else b + 1 + ring.size) % ring.size
        out.append(sorted(members[idx].tolist()))
    return sorted(out)


def reveals_partial_sum(graph: HararyGraph, survivors: Iterable[int]) -> bool:
    """Whether unmasking would reveal a partial sum.

    It would when the survivors' induced subgraph is disconnected: the sum of each component can
    then be separated from the total.
    """
    return len(survivor_components(graph, survivors)) > 1
