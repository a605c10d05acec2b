"""Sizing the SecAgg+ graph: exact exposure and abort probabilities per honest client.

The model (stated in ``docs/secure-aggregation.md``):

- n clients sit on the ring of a :class:`~ghofl.secure.graph.HararyGraph` in an order drawn
  from a public seed fixed after the corrupt and dropped clients are determined, so for any one
  client its k neighbours are a uniformly random k-subset of the other n − 1 clients.
- ⌊γ·n⌋ clients are corrupt (they pool their shares with the server); ⌊δ·n⌋ clients drop out.
  Both counts are taken among the other n − 1 clients, which is exact for an honest surviving
  client and conservative otherwise.
- Client i's self-mask seed and mask key are Shamir-shared among itself and its k neighbours
  with threshold t_s. Because of the consistency check, the server cannot obtain both kinds of
  shares of i from honest holders, so i is **exposed** when at least t_s of its neighbours
  are corrupt: C ≥ t_s with C ~ Hypergeometric(n − 1, ⌊γ·n⌋, k). This holds also against a
  server that declares honest clients dropped at will, because an honest client refuses to
  unmask when fewer than t_s of its neighbours (itself not counted) survive: a client whose
  honest neighbours are all declared dropped then needs t_s corrupt neighbours.
- The round **aborts** for an honest client i when fewer than t_s of its neighbours survive:
  k − D < t_s with D ~ Hypergeometric(n − 1, ⌊δ·n⌋, k) (its own share is not counted).
  Corrupt clients are assumed to deliver their shares for this count: a malicious client can
  always abort a round, and an abort reveals nothing.
- On the complete graph both counts are certain: exposed iff ⌊γ·n⌋ ≥ t, aborts iff
  n − ⌊δ·n⌋ < t.

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
    "log2_disconnected",
    "log2_exposure",
    "log2_hypergeom_sf",
    "meets_targets",
    "required_parameters",
    "share_threshold_for",
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
    from scipy.special import gammaln  # on first use: scipy costs ~0.1 s to import

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


def log2_exposure(n: int, k: int, t_s: int,
                  corrupt_fraction: float = DEFAULT_CORRUPT_FRACTION) -> float:
    """Log2 of the probability that an honest client's secrets are exposed.

    Exposed: at least t_s of its share holders (its neighbours) are corrupt. On the complete graph
    the count is certain (0 or −inf).
    """
    d = graph_degree(n, k)
    return log2_hypergeom_sf(t_s, n - 1, count_of(corrupt_fraction, n), d)


def log2_abort(n: int, k: int, t_s: int,
               dropout_fraction: float = DEFAULT_DROPOUT_FRACTION) -> float:
    """Log2 of the probability that the round aborts for an honest client.

    It aborts when fewer than t_s of the client's k neighbours survive (its own share
    not counted); on the complete graph, when fewer than t clients survive in all (the
    rule of the original protocol).
    """
    d = graph_degree(n, k)
    own = 1 if d >= n - 1 else 0
    return log2_hypergeom_sf(d + 1 + own - t_s, n - 1, count_of(dropout_fraction, n), d)


def log2_disconnected(n: int, k: int, removed_fraction: float) -> float:
    """Log2 of an upper bound on the probability that removing clients disconnects the rest.

    ⌊removed_fraction·n⌋ uniformly random clients are removed; the bound is on the remaining clients
    inducing a disconnected subgraph.

    On the Harary ring with h = ⌈k/2⌉ the remaining clients are disconnected only when at least
    two runs of h consecutive ring positions are all removed (one run cuts the ring into a
    path). A union bound over the fewer than n²/2 pairs of disjoint windows gives
    P ≤ n²/2 · P(2h given clients all removed). The complete graph never disconnects.
    """
    d = graph_degree(n, k)
    if d >= n - 1:
        return -math.inf
    h, m = (k + 1) // 2, count_of(removed_fraction, n)
    if 2 * h > m:
        return -math.inf
    j = np.arange(2 * h, dtype=np.float64)
    log2_all = float(np.sum(np.log2((m - j) / (n - j))))
    return min(0.0, math.log2(n * (n - 1) / 2.0) + log2_all)


@functools.lru_cache(maxsize=1024)
def share_threshold_for(n: int, k: int, corrupt_fraction: float = DEFAULT_CORRUPT_FRACTION,
                        sigma: float = DEFAULT_SIGMA) -> int:
    """The smallest share threshold t_s ≥ 2 with exposure ≤ 2^-σ on the graph built with k.

    The degree + 1 share holders when even that is not enough.
    """
    d = graph_degree(n, k)
    lp = _log_pmf(n - 1, count_of(corrupt_fraction, n), d)
    # log sf at x = logsumexp(lp[x:]) for every x, from the top down
    sf = np.logaddexp.accumulate(lp[::-1])[::-1] / _LN2
    ok = np.nonzero(sf <= -sigma)[0]
    t_s = int(ok[0]) if ok.size else d + 1
    return max(2, t_s)


def meets_targets(n: int, k: int, t_s: int, corrupt_fraction: float,
                  dropout_fraction: float, sigma: float, eta: float) -> bool:
    """Whether (k, t_s) on a sparse graph meets the targets.

    Exposure ≤ 2^-σ, and the honest survivors' subgraph disconnected with probability ≤ 2^-σ (else a
    passive server learns the sums of its components); abort ≤ 2^-η, and the survivors' subgraph
    disconnected (the clients then refuse to unmask) with probability ≤ 2^-η.
    """
    both = min(corrupt_fraction + dropout_fraction, 1.0 - 1e-12)
    return (log2_exposure(n, k, t_s, corrupt_fraction) <= -sigma
            and log2_abort(n, k, t_s, dropout_fraction) <= -eta
            and log2_disconnected(n, k, both) <= -sigma
            and log2_disconnected(n, k, dropout_fraction) <= -eta)


@functools.lru_cache(maxsize=256)
def required_parameters(n: int, corrupt_fraction: float = DEFAULT_CORRUPT_FRACTION,
                        dropout_fraction: float = DEFAULT_DROPOUT_FRACTION,
                        sigma: float = DEFAULT_SIGMA, eta: float = DEFAULT_ETA,
                        complete_threshold: int | None = None) -> tuple[int, int]:
    """The smallest even degree k and its share threshold t_s meeting the targets.

    See :func:`meets_targets`.

    Parameters
    ----------
    n : int
        Number of clients (at least 2).
    corrupt_fraction, dropout_fraction : float
        γ and δ of the model above.
    sigma, eta : float
        Targets: exposure ≤ 2^-σ and abort ≤ 2^-η per honest client per round.
    complete_threshold : int, optional
        The threshold to use when the answer is the complete graph (default: the smallest one
        meeting the exposure target, ⌊γ·n⌋ + 1, raised to a strict majority when that fits).

    Returns
    -------
    (k, t_s) : tuple of int
        k = n − 1 (complete graph) when no smaller degree meets the targets.

    Raises
    ------
    ConfigError
        Even the complete graph cannot meet the targets (too few clients for γ and δ).
    """
    if n < 2:
        raise ConfigError(f"the communication graph needs at least 2 clients; got {n}")
    for k in range(2, n - 2, 2):
        if graph_degree(n, k) >= n - 1:
            break
        t_s = share_threshold_for(n, k, corrupt_fraction, sigma)
        if meets_targets(n, k, t_s, corrupt_fraction, dropout_fraction, sigma, eta):
            return k, t_s
    c, d = count_of(corrupt_fraction, n), count_of(dropout_fraction, n)
    lo, hi = max(2, c + 1), n - d
    t = complete_threshold if complete_threshold is not None else min(max(lo, n // 2 + 1), hi)
    if not lo <= t <= hi:
        raise ConfigError(
            f"no graph over {n} clients meets exposure <= 2^-{sigma:g} and abort <= 2^-{eta:g} "
            f"with corrupt fraction {corrupt_fraction:.3g} ({c} clients) and dropout fraction "
            f"{dropout_fraction:.3g} ({d} clients): the complete graph needs a threshold t with "
            f"{lo} <= t <= {hi}; give more clients or smaller fractions"
        )
    return n - 1, t


class GraphRisk:
    """The per-honest-client risks of one (n, k, t_s) under (γ, δ), as log2 probabilities.

    Attributes
    ----------
    log2_exposure_, log2_abort_ : float
        As :func:`log2_exposure` and :func:`log2_abort`.
    log2_cut_survivors_ : float
        Bound on the survivors' subgraph being disconnected under δ random dropouts (then the
        clients refuse to unmask: an abort).
    log2_cut_honest_ : float
        Bound on the honest survivors' subgraph being disconnected (corrupt and dropped
        removed: a passive server could learn the sums of its components).
    """

    def __init__(self, n: int, k: int, t_s: int, corrupt_fraction: float,
                 dropout_fraction: float) -> None:
        self.n, self.k, self.t_s = n, k, t_s
        self.log2_exposure_ = log2_exposure(n, k, t_s, corrupt_fraction)
        self.log2_abort_ = log2_abort(n, k, t_s, dropout_fraction)
        self.log2_cut_survivors_ = log2_disconnected(n, k, dropout_fraction)
        both = min(corrupt_fraction + dropout_fraction, 1.0 - 1e-12)
        self.log2_cut_honest_ = log2_disconnected(n, k, both)


def graph_risk(n: int, k: int, t_s: int,
               corrupt_fraction: float = DEFAULT_CORRUPT_FRACTION,
               dropout_fraction: float = DEFAULT_DROPOUT_FRACTION) -> GraphRisk:
    """The :class:`GraphRisk` of one configuration."""
    return GraphRisk(n, k, t_s, corrupt_fraction, dropout_fraction)
