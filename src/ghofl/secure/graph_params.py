"""Sizing the SecAgg+ graph: exact exposure and abort probabilities per honest client.

The model (stated in ``docs/secure-aggregation.md``):

- A round is run over a roster of n clients. ⌊γ·n⌋ of them are corrupt (they pool their shares
  with the server, which may be malicious); ⌊δ·n⌋ drop out. The server chooses which
  advertisers to **relay**: a client accepts any relayed set of at least
  m_min = n − ⌊δ·n⌋ clients (:func:`min_relayed`; fewer would be more dropouts than the graph
  is sized for), and the graph is built over the m relayed clients.
- The m relayed clients sit on the ring of a :class:`~ghofl.secure.graph.HararyGraph` (built
  with parameter k, so each has ``graph_degree(m, k)`` neighbours) in an order drawn from a
  public seed fixed after the relayed set is, so for any one client its neighbours are a
  uniformly random subset of the other m − 1 relayed clients.
- Client i's self-mask seed and mask key are Shamir-shared among itself and its neighbours
  with threshold t_s. Because of the consistency check, the server cannot obtain both kinds of
  shares of i from honest holders, so i is **exposed** when at least t_s of its neighbours
  are corrupt. This holds also against a server that declares honest clients dropped at will,
  because an honest client refuses to unmask when fewer than t_s of its neighbours (itself
  not counted) survive: a client whose honest neighbours are all declared dropped then needs
  t_s corrupt neighbours.
- **The parameters are derived for the relayed size.** Once the relayed set of m clients is
  fixed (and before the graph's seed exists), clients and server derive k and t_s for m with
  the worst case that every one of the c = ⌊γ·n⌋ corrupt clients was relayed and that the
  n − m left out count against the ⌊δ·n⌋ dropouts (:func:`relayed_counts`), so
  C ~ Hypergeometric(m − 1, c, graph_degree(m, k)) and exposure = P(C ≥ t_s)
  (:func:`log2_exposure` with ``relayed=m``). A server that relays fewer honest clients makes
  the corrupt ones a larger share of the graph and gets (k, t_s) sized for exactly that:
  every relayed size a client accepts meets the targets (:func:`required_parameters` with
  ``relayed=m``; fewer dropouts remain to be survived, so the degree may even be smaller).
  Parameters sized for all n and kept for a smaller relayed set would not: at n = 1,000 and
  γ = δ = 1/3 the n-sized (k, t_s) = (228, 122) expose an honest client with probability
  about 2^-3.2 on 667 relayed clients.
- The round **aborts** for an honest client i when fewer than t_s of its neighbours survive:
  k − D < t_s with D ~ Hypergeometric(m − 1, ⌊δ·n⌋ − (n − m), graph_degree(m, k)) (its own
  share is not counted). Corrupt clients are assumed to deliver their shares for this count:
  a malicious client can always abort a round, and an abort reveals nothing.
- The disconnection bounds (:func:`log2_cut`) are taken over the m relayed clients with the
  corrupt and the dropouts still to come removed.
- On a graph complete over the relayed clients both counts are certain: exposed iff c ≥ t,
  aborts iff m − (⌊δ·n⌋ − (n − m)) < t.

All tails are summed exactly in log space (``scipy.special.gammaln`` and ``logsumexp``).
"""

from __future__ import annotations

import functools
import math

import numpy as np
from numpy.typing import NDArray

from ghofl.errors import ConfigError

__all__ = [
    "DEFAULT_CORRUPT_FRACTION",
    "DEFAULT_DROPOUT_FRACTION",
    "DEFAULT_ETA",
    "DEFAULT_SIGMA",
    "GraphRisk",
    "graph_degree",
    "graph_risk",
    "log2_abort",
    "log2_cut",
    "log2_disconnected",
    "log2_exposure",
    "log2_hypergeom_sf",
    "meets_targets",
    "min_relayed",
    "relayed_counts",
    "required_parameters",
    "share_threshold_for",
    "worst_relayed",
]

DEFAULT_CORRUPT_FRACTION = 1.0 / 3.0
DEFAULT_DROPOUT_FRACTION = 1.0 / 3.0
#: exposure ≤ 2^-σ and abort ≤ 2^-η per honest client per round
DEFAULT_SIGMA = 40.0
DEFAULT_ETA = 20.0
_LN2 = math.log(2.0)


def count_of(fraction: float, n: int) -> int:
    """⌊fraction·n⌋, the number of clients a fraction stands for (robust to float rounding)."""
    if not 0.0 <= fraction < 1.0:
        raise ConfigError(f"a corrupt or dropout fraction must lie in [0, 1); got {fraction!r}")
    return math.floor(fraction * n + 1e-9)


def graph_degree(n: int, k: int) -> int:
    """Neighbours each client actually has on the Harary graph built with parameter k.

    k rounded up to even, or n − 1 (complete graph) when that reaches n − 1.
    """
    even = 2 * ((k + 1) // 2)
    return n - 1 if even >= n - 1 else even


def _log_pmf(population: int, marked: int, draws: int) -> NDArray[np.float64]:
    """Natural-log pmf of Hypergeometric(population, marked, draws) at 0 … draws.

    −inf where impossible; shape (draws + 1,).
    """
    from scipy.special import gammaln  # on first use: scipy is slow to import

    j = np.arange(draws + 1, dtype=np.float64)
    ok = (j <= marked) & (draws - j <= population - marked)
    jj = np.where(ok, j, 0.0)

    def lchoose(a: float | NDArray[np.float64],
                b: NDArray[np.float64] | float) -> NDArray[np.float64]:
        return np.asarray(gammaln(np.add(a, 1.0)) - gammaln(np.add(b, 1.0))
                          - gammaln(np.subtract(a, b) + 1.0), dtype=np.float64)

    out = (lchoose(float(marked), jj) + lchoose(float(population - marked), draws - jj)
           - lchoose(float(population), float(draws)))
    return np.where(ok, out, -np.inf)


def log2_hypergeom_sf(x: int, population: int, marked: int, draws: int) -> float:
    """log2 P(X ≥ x) for X ~ Hypergeometric(population, marked, draws); −inf when impossible."""
    if x <= 0:
        return 0.0
    if x > draws:
        return -math.inf
    from scipy.special import logsumexp

    tail = _log_pmf(population, marked, draws)[x:]
    return min(0.0, float(logsumexp(tail)) / _LN2)


def min_relayed(n: int, dropout_fraction: float = DEFAULT_DROPOUT_FRACTION) -> int:
    """The fewest relayed clients a client accepts for a roster of n: m_min = n − ⌊δ·n⌋.

    A server that relays fewer advertisers than this claims more dropouts than the round is
    sized for; over any relayed set of at least this many clients, the parameters derived for
    its size (:func:`required_parameters` with ``relayed=m``) meet the targets.

    Parameters
    ----------
    n : int
        Clients on the roster.
    dropout_fraction : float
        δ, the fraction of clients expected to drop out.

    Returns
    -------
    int
        n − ⌊δ·n⌋, at least 2 (at most n).
    """
    return min(n, max(2, n - count_of(dropout_fraction, n)))


def worst_relayed(n: int, corrupt_fraction: float = DEFAULT_CORRUPT_FRACTION,
                  dropout_fraction: float = DEFAULT_DROPOUT_FRACTION) -> tuple[int, int]:
    """The smallest relayed set clients accept with every corrupt client in it: (m*, ⌊γ·n⌋).

    m* = max(m_min, ⌊γ·n⌋ + 1). For parameters sized for all n relayed, this is the set that
    exposes an honest client most (the module docstring argues it); parameters sized for the
    relayed size (:func:`required_parameters` with ``relayed=m``) meet the targets on it too.
    """
    c = count_of(corrupt_fraction, n)
    return max(min_relayed(n, dropout_fraction), min(n, c + 1)), c


def relayed_counts(n: int, m: int, corrupt_fraction: float = DEFAULT_CORRUPT_FRACTION,
                   dropout_fraction: float = DEFAULT_DROPOUT_FRACTION) -> tuple[int, int]:
    """(corrupt, still to drop) among m relayed clients of a roster of n, in the worst case.

    Every one of the ⌊γ·n⌋ corrupt clients is relayed (at most m − 1 of them besides an honest
    client), and the n − m clients left out count against the ⌊δ·n⌋ dropouts, so
    ⌊δ·n⌋ − (n − m) may still drop among the relayed (at least 0).
    """
    if not 2 <= m <= n:
        raise ConfigError(f"a relayed roster holds between 2 and n = {n} clients; got {m}")
    c = min(count_of(corrupt_fraction, n), m - 1)
    return c, max(0, count_of(dropout_fraction, n) - (n - m))


def _relayed(n: int, relayed: int | None) -> int:
    return n if relayed is None else relayed


def log2_exposure(n: int, k: int, t_s: int,
                  corrupt_fraction: float = DEFAULT_CORRUPT_FRACTION, *,
                  relayed: int | None = None) -> float:
    """Log2 of the probability that an honest client's secrets are exposed.

    Exposed: at least t_s of its share holders (its neighbours) are corrupt. The graph is
    built with parameter k over the m = ``relayed`` clients the server relayed (default: all
    n), every corrupt client among them (:func:`relayed_counts`):
    P(Hypergeometric(m − 1, c, graph_degree(m, k)) ≥ t_s). On a graph complete over the
    relayed clients the count is certain: 0.0 when c ≥ t_s, else −inf.

    Parameters
    ----------
    n : int
        Clients on the roster.
    k : int
        The graph's parameter.
    t_s : int
        The share threshold.
    corrupt_fraction : float
        γ.
    relayed : int, optional
        m, the relayed clients the graph is built over (default n).

    Returns
    -------
    float
        log2 P(exposed).
    """
    m = _relayed(n, relayed)
    c = relayed_counts(n, m, corrupt_fraction, 0.0)[0]
    return log2_hypergeom_sf(t_s, m - 1, c, graph_degree(m, k))


def log2_abort(n: int, k: int, t_s: int,
               dropout_fraction: float = DEFAULT_DROPOUT_FRACTION, *,
               relayed: int | None = None) -> float:
    """Log2 of the probability that the round aborts for an honest client.

    It aborts when fewer than t_s of the client's neighbours survive (its own share
    not counted); on the complete graph, when fewer than t clients survive in all (the
    rule of the original protocol). Over m = ``relayed`` clients (default n), the dropouts
    still to come are ⌊δ·n⌋ − (n − m) (:func:`relayed_counts`).
    """
    m = _relayed(n, relayed)
    dropped = relayed_counts(n, m, 0.0, dropout_fraction)[1]
    d = graph_degree(m, k)
    own = 1 if d >= m - 1 else 0
    return log2_hypergeom_sf(d + 1 + own - t_s, m - 1, dropped, d)


def log2_disconnected(n: int, k: int, removed_fraction: float) -> float:
    """Log2 of an upper bound on the probability that removing clients disconnects the rest.

    ⌊removed_fraction·n⌋ uniformly random clients are removed (:func:`log2_cut`).
    """
    return log2_cut(n, k, count_of(removed_fraction, n))


def log2_cut(m: int, k: int, removed: int) -> float:
    """Log2 of an upper bound on the probability that removing clients disconnects the rest.

    ``removed`` uniformly random clients of the m on the graph are removed; the bound is on
    the remaining clients inducing a disconnected subgraph.

    On the Harary ring with h = ⌈k/2⌉ the remaining clients are disconnected only when at least
    two runs of h consecutive ring positions are all removed (one run cuts the ring into a
    path). A union bound over the fewer than m²/2 pairs of disjoint windows gives
    P ≤ m²/2 · P(2h given clients all removed). The complete graph never disconnects.
    """
    d = graph_degree(m, k)
    if d >= m - 1:
        return -math.inf
    h = (k + 1) // 2
    if 2 * h > removed:
        return -math.inf
    j = np.arange(2 * h, dtype=np.float64)
    log2_all = float(np.sum(np.log2((removed - j) / (m - j))))
    return min(0.0, math.log2(m * (m - 1) / 2.0) + log2_all)


@functools.lru_cache(maxsize=4096)
def share_threshold_for(n: int, k: int, corrupt_fraction: float = DEFAULT_CORRUPT_FRACTION,
                        sigma: float = DEFAULT_SIGMA, *, relayed: int | None = None) -> int:
    """The smallest share threshold t_s ≥ 2 with exposure ≤ 2^-σ on the graph built with k.

    Exposure over the m = ``relayed`` clients (default n), every corrupt client among them
    (:func:`log2_exposure`); the degree + 1 share holders when even that is not enough.
    """
    m = _relayed(n, relayed)
    c = relayed_counts(n, m, corrupt_fraction, 0.0)[0]
    lp = _log_pmf(m - 1, c, graph_degree(m, k))
    # log sf at x = logsumexp(lp[x:]) for every x, from the top down
    sf = np.logaddexp.accumulate(lp[::-1])[::-1] / _LN2
    ok = np.nonzero(sf <= -sigma)[0]
    t_s = int(ok[0]) if ok.size else graph_degree(m, k) + 1
    return max(2, t_s)


def meets_targets(n: int, k: int, t_s: int, corrupt_fraction: float,
                  dropout_fraction: float, sigma: float, eta: float, *,
                  relayed: int | None = None) -> bool:
    """Whether (k, t_s) on a sparse graph over the m relayed clients meets the targets.

    m = ``relayed`` (default n), with every corrupt client relayed and the dropouts still to
    come (:func:`relayed_counts`): exposure ≤ 2^-σ, and the honest survivors' subgraph
    disconnected with probability ≤ 2^-σ (else a passive server learns the sums of its
    components); abort ≤ 2^-η, and the survivors' subgraph disconnected (the clients then
    refuse to unmask) with probability ≤ 2^-η.
    """
    m = _relayed(n, relayed)
    c, dropped = relayed_counts(n, m, corrupt_fraction, dropout_fraction)
    return (log2_exposure(n, k, t_s, corrupt_fraction, relayed=m) <= -sigma
            and log2_abort(n, k, t_s, dropout_fraction, relayed=m) <= -eta
            and log2_cut(m, k, c + dropped) <= -sigma
            and log2_cut(m, k, dropped) <= -eta)


@functools.lru_cache(maxsize=4096)
def required_parameters(n: int, corrupt_fraction: float = DEFAULT_CORRUPT_FRACTION,
                        dropout_fraction: float = DEFAULT_DROPOUT_FRACTION,
                        sigma: float = DEFAULT_SIGMA, eta: float = DEFAULT_ETA,
                        complete_threshold: int | None = None, *,
                        relayed: int | None = None) -> tuple[int, int]:
    """The smallest even degree k and its share threshold t_s meeting the targets.

    For a round over a roster of n whose server relayed m = ``relayed`` clients (default n):
    the graph is built over those m, with every corrupt client among them and the dropouts
    still to come (:func:`meets_targets`). Clients and server derive the parameters of the
    relayed size once it is fixed (:meth:`~ghofl.secure.config.SessionParams.relayed`), so
    a server that relays fewer clients gets a denser graph, never a weaker one.

    Parameters
    ----------
    n : int
        Number of clients on the roster (at least 2).
    corrupt_fraction, dropout_fraction : float
        γ and δ of the model above.
    sigma, eta : float
        Targets: exposure ≤ 2^-σ and abort ≤ 2^-η per honest client per round.
    complete_threshold : int, optional
        The threshold to use when the answer is the complete graph (default: the smallest one
        meeting the exposure target, ⌊γ·n⌋ + 1, raised to a strict majority when that fits).
    relayed : int, optional
        m, the clients relayed (default n).

    Returns
    -------
    (k, t_s) : tuple of int
        k = m − 1 (complete graph) when no smaller degree meets the targets.

    Raises
    ------
    ConfigError
        Even the complete graph cannot meet the targets (too few clients for γ and δ).
    """
    if n < 2:
        raise ConfigError(f"the communication graph needs at least 2 clients; got {n}")
    m = _relayed(n, relayed)
    for k in range(2, m - 2, 2):
        if graph_degree(m, k) >= m - 1:
            break
        t_s = share_threshold_for(n, k, corrupt_fraction, sigma, relayed=m)
        if meets_targets(n, k, t_s, corrupt_fraction, dropout_fraction, sigma, eta,
                         relayed=m):
            return k, t_s
    c, d = relayed_counts(n, m, corrupt_fraction, dropout_fraction)
    lo, hi = max(2, c + 1), m - d
    t = complete_threshold if complete_threshold is not None else min(max(lo, m // 2 + 1), hi)
    if not lo <= t <= hi:
        raise ConfigError(
            f"no graph over {m} clients meets exposure <= 2^-{sigma:g} and abort <= 2^-{eta:g} "
            f"with corrupt fraction {corrupt_fraction:.3g} ({c} clients) and dropout fraction "
            f"{dropout_fraction:.3g} ({d} clients): the complete graph needs a threshold t with "
            f"{lo} <= t <= {hi}; give more clients or smaller fractions"
        )
    return m - 1, t


class GraphRisk:
    """The per-honest-client risks of one (n, k, t_s) under (γ, δ), as log2 probabilities.

    Over the m = ``relayed`` clients a server relayed (default all n), every corrupt client
    among them (:func:`relayed_counts`).

    Attributes
    ----------
    relayed_ : int
        m.
    log2_exposure_, log2_abort_ : float
        As :func:`log2_exposure` and :func:`log2_abort` over those m.
    log2_cut_survivors_ : float
        Bound on the survivors' subgraph being disconnected by the dropouts still to come
        (then the clients refuse to unmask: an abort).
    log2_cut_honest_ : float
        Bound on the honest survivors' subgraph being disconnected (corrupt and dropped
        removed: a passive server could learn the sums of its components).
    """

    def __init__(self, n: int, k: int, t_s: int, corrupt_fraction: float,
                 dropout_fraction: float, relayed: int | None = None) -> None:
        m = _relayed(n, relayed)
        c, dropped = relayed_counts(n, m, corrupt_fraction, dropout_fraction)
        self.n, self.k, self.t_s, self.relayed_ = n, k, t_s, m
        self.log2_exposure_ = log2_exposure(n, k, t_s, corrupt_fraction, relayed=m)
        self.log2_abort_ = log2_abort(n, k, t_s, dropout_fraction, relayed=m)
        self.log2_cut_survivors_ = log2_cut(m, k, dropped)
        self.log2_cut_honest_ = log2_cut(m, k, c + dropped)


def graph_risk(n: int, k: int, t_s: int,
               corrupt_fraction: float = DEFAULT_CORRUPT_FRACTION,
               dropout_fraction: float = DEFAULT_DROPOUT_FRACTION,
               relayed: int | None = None) -> GraphRisk:
    """The :class:`GraphRisk` of one configuration."""
    return GraphRisk(n, k, t_s, corrupt_fraction, dropout_fraction, relayed)
