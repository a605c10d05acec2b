"""Public parameters of a secure aggregation round, agreed by the server and every client."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from ghofl.errors import ConfigError, ProtocolError
from ghofl.secure.fixedpoint import DEFAULT_MAX_SAMPLES, FixedPointCodec
from ghofl.secure.graph_params import (
    DEFAULT_CORRUPT_FRACTION,
    DEFAULT_DROPOUT_FRACTION,
    DEFAULT_ETA,
    DEFAULT_SIGMA,
    count_of,
    graph_degree,
    meets_targets,
    required_parameters,
    share_threshold_for,
)
from ghofl.secure.levels import check_ladder, dropout_ladder

__all__ = [
    "DEFAULT_CORRUPT_FRACTION",
    "SecAggConfig",
    "SessionParams",
    "consistency_threshold",
    "default_threshold",
]


def consistency_threshold(n: int, corrupt_fraction: float = DEFAULT_CORRUPT_FRACTION) -> int:
    """Fewest consistency signatures that make two different survivor sets impossible.

    ⌊(n + c)/2⌋ + 1 with c = ⌊γ·n⌋ corrupt clients (at least 2, at most n).

    Honest clients sign one survivor set per round and corrupt ones may sign any, so two sets
    with t signatures each need 2t ≤ n + c; above that a malicious server cannot show some
    clients "u survived" and others "u dropped" to collect both of u's secrets.
    """
    c = math.floor(corrupt_fraction * n + 1e-9)
    return min(n, max(2, (n + c) // 2 + 1))


def default_threshold(n: int) -> int:
    """Default threshold t for n clients: about two thirds, at least 2.

    :func:`consistency_threshold` at the default γ = 1/3: ⌊(n + ⌊n/3⌋)/2⌋ + 1.
    """
    return consistency_threshold(n)


@dataclass(frozen=True)
class SecAggConfig:
    """What a user chooses for a secure round; resolved per round by :meth:`for_clients`.

    Parameters
    ----------
    clip_norm : float
        R, the per-sample L2 clipping bound every client applies (public).
    threshold : int, optional
        t, the fewest clients that must remain at every stage; below it the round aborts.
        Default: :func:`consistency_threshold` at ``corrupt_fraction`` (at the default γ = 1/3,
        :func:`default_threshold`: about two thirds of the clients), the least that clients
        of the same γ accept (:class:`~ghofl.secure.policy.ClientPolicy`). The server
        learns only sums over at least t clients, and a malicious server with fewer than
        n/3 colluding clients cannot make the consistency check pass for two survivor sets.
    neighbours : int, optional
        k, neighbours per client on the SecAgg+ graph. Default: the smallest degree meeting
        exposure ≤ 2^-σ (on the worst set of at least n − ⌊δ·n⌋ clients a malicious server
        may relay) and abort ≤ 2^-η per honest client for the fractions below
        (:func:`~ghofl.secure.graph_params.required_parameters`), or the complete graph
        (k = n − 1) when no smaller one does.
    max_samples : int, default 1,000,000
        M, the public maximum number of samples per client (bounds the fixed-point range).
    limbs : {1, 2}, default 2
        64-bit words per float statistic (2: exact to float64 precision; 1: half the bytes).
    corrupt_fraction, dropout_fraction : float, default 1/3
        γ and δ, the fractions of corrupt and dropped clients the graph is sized for. A given
        ``neighbours`` or ``threshold`` that cannot meet the targets for them is refused.
    sigma, eta : float, default 40 and 20
        The targets: exposure ≤ 2^-σ and abort ≤ 2^-η per honest client per round.
    noise_levels : int, default 0
        Levels of the dropout ladder for distributed DP (:mod:`ghofl.secure.levels`): at most
        this many release points between t and n (:func:`~ghofl.secure.levels.dropout_ladder`);
        0: none (a round without removable noise).
    """

    clip_norm: float
    threshold: int | None = None
    neighbours: int | None = None
    max_samples: int = DEFAULT_MAX_SAMPLES
    limbs: int = 2
    corrupt_fraction: float = DEFAULT_CORRUPT_FRACTION
    dropout_fraction: float = DEFAULT_DROPOUT_FRACTION
    sigma: float = DEFAULT_SIGMA
    eta: float = DEFAULT_ETA
    noise_levels: int = 0

    def __post_init__(self) -> None:
        if not isinstance(self.noise_levels, int) or self.noise_levels < 0:
            raise ConfigError(f"noise_levels must be an integer >= 0; got {self.noise_levels!r}")
        if not (isinstance(self.clip_norm, int | float) and math.isfinite(self.clip_norm)
                and self.clip_norm > 0):
            raise ConfigError(
                f"secure aggregation needs a clipping bound R > 0 (--clip R); got "
                f"{self.clip_norm!r}"
            )
        if self.threshold is not None and self.threshold < 2:
            raise ConfigError(
                f"the threshold must be at least 2 (a sum over one client is that client's "
                f"statistics); got {self.threshold}"
            )
        if self.neighbours is not None and self.neighbours < 1:
            raise ConfigError(f"neighbours must be at least 1; got {self.neighbours}")
        FixedPointCodec(2, self.max_samples, float(self.clip_norm), self.limbs)  # checks
        count_of(self.corrupt_fraction, 1)  # checks both fractions lie in [0, 1)
        count_of(self.dropout_fraction, 1)

    def for_clients(self, n: int) -> SessionParams:
        """Resolve the defaults for a round over ``n`` clients.

        Raises
        ------
        ConfigError
            Fewer than two clients, or a threshold larger than the number of clients.
        """
        if n < 2:
            raise ConfigError(
                f"secure aggregation needs at least 2 clients (the sum of one client is its "
                f"own statistics); got {n}"
            )
        t = (consistency_threshold(n, self.corrupt_fraction) if self.threshold is None
             else int(self.threshold))
        if t > n:
            raise ConfigError(
                f"threshold t={t} is larger than the number of clients ({n}); give "
                f"--threshold between 2 and {n}"
            )
        k, t_s = self._graph(n, t)
        points = dropout_ladder(t, n, self.noise_levels) if self.noise_levels else ()
        return SessionParams(n, t, k, self.max_samples, float(self.clip_norm), self.limbs,
                             t_s, points, self.corrupt_fraction, self.dropout_fraction,
                             float(self.sigma), float(self.eta), self.neighbours is not None)

    def _feasible(self, n: int) -> bool:
        try:
            required_parameters(n, self.corrupt_fraction, self.dropout_fraction, self.sigma,
                                self.eta)
        except ConfigError:
            return False
        return True

    def _graph(self, n: int, t: int) -> tuple[int, int]:
        """(k, t_s) for n clients: sized by the targets, or the user's k checked against them."""
        gamma, delta = self.corrupt_fraction, self.dropout_fraction
        k = n - 1 if self.neighbours is None else min(int(self.neighbours), n - 1)
        if self.neighbours is None or graph_degree(n, k) >= n - 1:
            try:
                # a threshold the corrupt clients could reach alone is refused (exposure); a
                # high one only makes aborts likelier (never a leak), so it is allowed: the
                # default is the malicious-server consistency bound, which can exceed what
                # dropouts at δ leave (γ + 2δ ≥ 1; docs/secure-aggregation.md)
                low = self.threshold is not None and t <= count_of(gamma, n)
                k, t_s = required_parameters(n, gamma, delta, self.sigma, self.eta,
                                             complete_threshold=t if low else None)
            except ConfigError:
                if self._feasible(n):
                    raise  # a threshold that does meet the targets exists: name it
                return n - 1, t  # too few clients for any graph to meet the targets
            if self.neighbours is not None or k >= n - 1:
                return n - 1, t
            return k, t_s
        t_s = share_threshold_for(n, k, gamma, self.sigma)
        if not meets_targets(n, k, t_s, gamma, delta, self.sigma, self.eta):
            try:
                k_min = required_parameters(n, gamma, delta, self.sigma, self.eta)[0]
                hint = f"give --neighbours {k_min} or more (or leave it unset)"
            except ConfigError:
                hint = "no graph over these clients meets them"
            raise ConfigError(
                f"neighbours k={k} cannot meet exposure <= 2^-{self.sigma:g} and abort <= "
                f"2^-{self.eta:g} per client for {n} clients with corrupt fraction "
                f"{gamma:.3g} ({count_of(gamma, n)}) and dropout fraction {delta:.3g} "
                f"({count_of(delta, n)}): {hint}"
            )
        return k, t_s


@dataclass(frozen=True)
class SessionParams:
    """The resolved public parameters of one round (sent to every client at stage 1).

    Attributes
    ----------
    num_clients : int
        n, clients invited to the round (the K of the fixed-point bounds).
    threshold : int
        t, fewest clients that must remain at every stage.
    neighbours : int
        k, neighbours per client (n − 1: complete graph).
    max_samples, clip_norm, limbs :
        The fixed-point bounds (:class:`~ghofl.secure.fixedpoint.FixedPointCodec`).
    shares_needed : int, optional
        t_s, the share threshold (see :attr:`share_threshold`); None: derived from n, t, k.
    release_points : tuple of int, default ()
        The dropout ladder u_0 < … < u_{K-1} = n of the level seeds (:mod:`ghofl.secure.levels`);
        empty: no level seeds.
    corrupt_fraction, dropout_fraction, sigma, eta : float
        The targets the graph is sized for (γ, δ, σ, η), from which clients and server derive
        the degree and share threshold of the relayed set (:meth:`relayed`).
    fixed_degree : bool, default False
        The degree was chosen by the user (``SecAggConfig(neighbours=k)``): kept for any
        relayed set, with the share threshold derived for it.

    Raises
    ------
    ProtocolError
        The release points are not a ladder from above t to n.
    """

    num_clients: int
    threshold: int
    neighbours: int
    max_samples: int
    clip_norm: float
    limbs: int
    shares_needed: int | None = None
    release_points: tuple[int, ...] = ()
    corrupt_fraction: float = DEFAULT_CORRUPT_FRACTION
    dropout_fraction: float = DEFAULT_DROPOUT_FRACTION
    sigma: float = DEFAULT_SIGMA
    eta: float = DEFAULT_ETA
    fixed_degree: bool = False

    def __post_init__(self) -> None:
        object.__setattr__(self, "release_points", tuple(self.release_points))
        problem = check_ladder(self.release_points, self.threshold, self.num_clients)
        if problem is not None:
            raise ProtocolError(f"the round's public parameters name {problem}")

    @property
    def complete_graph(self) -> bool:
        """Whether every client neighbours every other (k ≥ n − 1)."""
        return self.neighbours >= self.num_clients - 1

    @property
    def share_threshold(self) -> int:
        """Shares needed to recover one client's secrets.

        t on the complete graph; else ``shares_needed``, or when not given the smallest t_s with
        exposure ≤ 2^-40 at a corrupt fraction of 1/3
        (:func:`~ghofl.secure.graph_params.share_threshold_for`).
        """
        if self.complete_graph:
            return self.threshold
        if self.shares_needed is not None:
            return self.shares_needed
        return share_threshold_for(self.num_clients, self.neighbours)

    def relayed(self, m: int) -> tuple[int, int]:
        """(k, t_s) of the graph over the m clients the server relayed.

        The advertised (k, t_s) when every one of the n was relayed; otherwise derived for m
        with every corrupt client relayed (:func:`~ghofl.secure.graph_params.required_parameters`
        with ``relayed=m``), so no relayed set a client accepts is exposed more than the
        targets allow. On the complete graph: (m − 1, t).
        """
        n = self.num_clients
        if m == n:
            return self.neighbours, self.share_threshold
        if self.complete_graph:
            return m - 1, self.threshold
        if self.fixed_degree:
            k = min(self.neighbours, m - 1)
            if graph_degree(m, k) >= m - 1:
                return m - 1, self.threshold
            return k, share_threshold_for(n, k, self.corrupt_fraction, self.sigma, relayed=m)
        try:
            return required_parameters(n, self.corrupt_fraction, self.dropout_fraction,
                                       self.sigma, self.eta, complete_threshold=self.threshold,
                                       relayed=m)
        except ConfigError:
            return m - 1, self.threshold

    @property
    def codec(self) -> FixedPointCodec:
        """The fixed-point codec of these parameters."""
        return FixedPointCodec(self.num_clients, self.max_samples, self.clip_norm, self.limbs)

    def items(self) -> tuple[tuple[str, str], ...]:
        """The parameters as (name, text) pairs, as they travel."""
        return tuple((k, repr(v)) for k, v in self.to_dict().items())

    def to_dict(self) -> dict[str, Any]:
        """The parameters as JSON-ready fields, the share threshold included."""
        return {"num_clients": self.num_clients, "threshold": self.threshold,
                "neighbours": self.neighbours, "max_samples": self.max_samples,
                "clip_norm": self.clip_norm, "limbs": self.limbs,
                "shares_needed": self.share_threshold,
                "release_points": list(self.release_points),
                "corrupt_fraction": self.corrupt_fraction,
                "dropout_fraction": self.dropout_fraction, "sigma": self.sigma,
                "eta": self.eta, "fixed_degree": self.fixed_degree}

    @classmethod
    def from_items(cls, items: tuple[tuple[str, str], ...]) -> SessionParams:
        """Parse :meth:`items`; raises :class:`ProtocolError` when malformed."""
        try:
            d = dict(items)
            shares = d.get("shares_needed")
            points = d.get("release_points", "[]").strip("[]")
            return cls(int(d["num_clients"]), int(d["threshold"]), int(d["neighbours"]),
                       int(d["max_samples"]), float(d["clip_norm"]), int(d["limbs"]),
                       None if shares in (None, "None") else int(shares),
                       tuple(int(u) for u in points.split(",") if u.strip()),
                       float(d["corrupt_fraction"]), float(d["dropout_fraction"]),
                       float(d["sigma"]), float(d["eta"]), d["fixed_degree"] == "True")
        except (KeyError, TypeError, ValueError) as exc:
            raise ProtocolError(
                f"the round's public parameters are malformed ({exc!r}); the server and this "
                "client run incompatible versions of ghofl"
            ) from exc
