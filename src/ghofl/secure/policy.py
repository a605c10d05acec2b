"""What a client accepts from a server: its own policy, never the server's word.

A malicious server could otherwise ask for a threshold of 1 (a "sum" over one client), a graph
of one neighbour, a roster other than the federation's, or a round over invented clients. The
client checks every public parameter of a round against its :class:`ClientPolicy` before it
sends anything, and refuses a request outside it with the reason.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from ghofl.errors import ConfigError
from ghofl.secure.config import SessionParams, consistency_threshold
from ghofl.secure.graph_params import (
    DEFAULT_CORRUPT_FRACTION,
    DEFAULT_DROPOUT_FRACTION,
    DEFAULT_ETA,
    DEFAULT_SIGMA,
    log2_exposure,
    min_relayed,
    required_parameters,
    share_threshold_for,
)
from ghofl.secure.identity import Roster

__all__ = ["ClientPolicy"]


@dataclass(frozen=True)
class ClientPolicy:
    """A client's own limits on the rounds it takes part in.

    Parameters
    ----------
    corrupt_fraction : float, default 1/3
        γ, the largest fraction of the roster that may collude with the server. Sets the least
        threshold accepted, :func:`~ghofl.secure.config.consistency_threshold`.
    dropout_fraction : float, default 1/3
        δ, the fraction of clients expected to drop out (sizes the least graph degree, and
        the fewest relayed clients accepted, :meth:`least_relayed`).
    sigma, eta : float, default 40 and 20
        The targets the least degree and share threshold are sized for: exposure ≤ 2^-σ and
        abort ≤ 2^-η per honest client per round
        (:func:`~ghofl.secure.graph_params.required_parameters`).
    min_threshold : int, optional
        A threshold floor above the one γ implies.
    min_neighbours : int, optional
        The fewest neighbours accepted on a sparse graph (default: the degree the targets
        need for the roster size, or the complete graph when no smaller one meets them).
    expected_clients : int, optional
        The roster size the client expects when it has no roster (with a roster: its size).
    allow_unauthenticated : bool, default False
        Take part without a roster (keys relayed by the server are then taken on trust: a
        relay or an active server can substitute them, so the round holds only against an
        honest-but-curious server, and thresholds down to 2 are accepted). Off by default.
    trust_server : bool, default False
        Assume the server follows the protocol (honest but curious): thresholds down to 2 are
        accepted, since no server splits the survivor set. Off by default: the least
        threshold is then the one that makes the consistency check hold against a malicious
        server with up to γ·n colluding clients.
    max_missing_shares : int, default 0
        Share boxes of its neighbours a client may miss (absent, unsigned, altered, or
        committed to another key) and still send its masked input. With an honest server and
        relay none is ever missing (the server checks every sharer sent a signed box to each
        neighbour), so a missing box means someone between the sender and this client acts
        against the protocol; the client then refuses before its masked input leaves it.
    """

    corrupt_fraction: float = DEFAULT_CORRUPT_FRACTION
    dropout_fraction: float = DEFAULT_DROPOUT_FRACTION
    sigma: float = DEFAULT_SIGMA
    eta: float = DEFAULT_ETA
    min_threshold: int | None = None
    min_neighbours: int | None = None
    expected_clients: int | None = None
    allow_unauthenticated: bool = False
    trust_server: bool = False
    max_missing_shares: int = 0

    def __post_init__(self) -> None:
        for name in ("corrupt_fraction", "dropout_fraction"):
            v = getattr(self, name)
            if not (isinstance(v, int | float) and math.isfinite(v) and 0 <= v < 1):
                raise ConfigError(f"{name} must be in [0, 1); got {v!r}")
        for name in ("sigma", "eta"):
            v = getattr(self, name)
            if not (isinstance(v, int | float) and math.isfinite(v) and v > 0):
                raise ConfigError(f"{name} must be a number of bits > 0 (the target "
                                  f"probability is 2^-{name}); got {v!r}")
        if not isinstance(self.max_missing_shares, int) or self.max_missing_shares < 0:
            raise ConfigError(f"max_missing_shares must be an integer >= 0; got "
                              f"{self.max_missing_shares!r}")
        for name in ("min_threshold", "min_neighbours", "expected_clients"):
            v = getattr(self, name)
            if v is not None and (not isinstance(v, int) or v < 1):
                raise ConfigError(f"{name} must be a positive integer; got {v!r}")

    def least_threshold(self, n: int) -> int:
        """The smallest threshold accepted for a round over ``n`` clients."""
        t = 2 if self.trust_server else consistency_threshold(n, self.corrupt_fraction)
        return min(n, max(t, self.min_threshold or 0))

    def least_neighbours(self, n: int) -> int:
        """The fewest neighbours accepted for ``n`` clients (n − 1: complete graph only)."""
        if self.min_neighbours is not None:
            return min(self.min_neighbours, n - 1)
        try:
            k = required_parameters(n, self.corrupt_fraction, self.dropout_fraction,
                                    self.sigma, self.eta)[0]
        except ConfigError:
            return n - 1
        return min(k, n - 1)

    def least_share_threshold(self, params: SessionParams) -> int:
        """The fewest shares per secret accepted.

        t on the complete graph, else the share threshold that keeps exposure ≤ 2^-σ at this
        policy's γ on the round's graph with all n relayed (a smaller relayed set gets its own,
        checked by :meth:`relayed_problem`).
        """
        if params.complete_graph:
            return params.threshold
        return share_threshold_for(params.num_clients, params.neighbours,
                                   self.corrupt_fraction, self.sigma)

    def relayed_problem(self, params: SessionParams, m: int) -> str | None:
        """Why the graph over the m relayed clients is outside this policy (``None``: inside).

        The degree and share threshold of the relayed size
        (:meth:`~ghofl.secure.config.SessionParams.relayed`) must keep this client's exposure
        at most 2^-σ with every one of its ⌊γ·n⌋ corrupt clients relayed. A client that trusts
        the server accepts the relayed set as it is.
        """
        if self.trust_server:
            return None
        k, t_s = params.relayed(m)
        exposure = log2_exposure(params.num_clients, k, t_s, self.corrupt_fraction, relayed=m)
        if exposure > -self.sigma:
            return (f"a graph of degree {k} and share threshold {t_s} over the {m} relayed "
                    f"clients: with every corrupt client relayed its exposure is 2^{exposure:.1f},"
                    f" above this client's 2^-{self.sigma:g}")
        return None

    def least_relayed(self, n: int) -> int:
        """The fewest relayed clients accepted for a roster of ``n``: n − ⌊δ·n⌋ (at least 2).

        Over any relayed set of at least this many clients, the corrupt ones all among them,
        the parameters derived for its size keep exposure ≤ 2^-σ (checked by
        :meth:`relayed_problem`; :func:`~ghofl.secure.graph_params.min_relayed`); a server
        that relays fewer claims more dropouts than the round is sized for.
        """
        return min_relayed(n, self.dropout_fraction)

    def problem(self, params: SessionParams, roster: Roster | None,
                roster_fingerprint: bytes) -> str | None:
        """Why a round with ``params`` is outside this policy (``None`` when it is inside).

        Parameters
        ----------
        params : SessionParams
            What the server asks for.
        roster : Roster or None
            The client's own roster.
        roster_fingerprint : bytes
            The roster fingerprint the server says it runs the round over.
        """
        if roster is None:
            if not self.allow_unauthenticated:
                return ("an unauthenticated round (this client has no roster: give it the "
                        "federation's roster, or allow unauthenticated rounds explicitly)")
            if roster_fingerprint:
                return "a round over a roster this client does not have"
            n = self.expected_clients or params.num_clients
        else:
            if roster_fingerprint != roster.fingerprint():
                return ("a round over another roster (its fingerprint differs from this "
                        "client's roster: the server may have added, dropped or swapped clients)")
            n = len(roster)
        if params.num_clients != n:
            return (f"a round over {params.num_clients} clients; the federation's roster has "
                    f"{n}")
        # Unauthenticated, the server could substitute keys and read everything whatever the
        # threshold: the round is in the honest-but-curious model, where t ≥ 2 suffices.
        least = 2 if roster is None else self.least_threshold(n)
        if not least <= params.threshold <= n:
            return (f"threshold t={params.threshold} for {n} clients; this client accepts "
                    f"t between {least} and {n} (corrupt fraction {self.corrupt_fraction:.3g})")
        k_min = self.least_neighbours(n)
        if params.neighbours < k_min:
            return (f"a graph of {params.neighbours} neighbours per client; this client "
                    f"accepts at least {k_min} for {n} clients")
        t_s = self.least_share_threshold(params)
        if params.share_threshold < max(2, t_s):
            return (f"a share threshold of {params.share_threshold} for {params.neighbours} "
                    f"neighbours; this client needs at least {max(2, t_s)} (corrupt fraction "
                    f"{self.corrupt_fraction:.3g}, exposure <= 2^-{self.sigma:g})")
        return None
