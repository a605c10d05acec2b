"""Hierarchical secure aggregation: a secure round per region, then one over the regions.

A very large federation is split into R *regions*, a public partition of the roster
(:func:`partition_regions`: the sorted client ids cut into R contiguous groups whose sizes
differ by at most one). Each region runs the ordinary secure protocol
(:class:`~ghofl.secure.SecAggServer` / :class:`~ghofl.secure.SecAggClient`) among its own
clients, with a *regional aggregator* as its server; the aggregator ends with the region's sum
as fixed-point words. The R aggregators then run one more secure round among themselves, each
masking its regional words as a client would, and the *top server* ends with the sum of the
regional sums. Statistics are additive and the words add modulo 2^64 without wrapping, so the
result is the flat secure sum bit for bit (:func:`run_hierarchical`).

**One codec for both levels.** The fixed-point scales depend on K, the number of clients that
may contribute (:class:`~ghofl.secure.FixedPointCodec`). Every client of every region encodes
with the codec of the *whole federation* (K = N clients, :func:`region_codec`,
:func:`region_encoder`), not of its region; the regional sums and the top sum are then sums
of words of that one codec: no partial sum exceeds the 62-bit headroom (it holds at most N
clients' words) and the top total is the words a flat round over the N clients would unmask.

**What each level learns.** A client's round is its region's: its cost depends on the region's
size S only. The regional aggregator learns what a flat server learns about its region: the
sum over the region's surviving clients (at least its threshold t(S) of them) and nothing
about any one client. The top server learns only the sum over the included regions; an
aggregator is a client of the top round, so the top server never sees one region's sum when
two or more regions are included (with one region included, the total is that region's sum).
A regional aggregator must be trusted with its region's sum as a server is with a flat round's
total: whoever runs it should be the party that would run the server.

**Failures.** A region whose round aborts (fewer than its threshold remain) is left out: its
aggregator still takes part in the top round, with zero words, so one region's abort never
costs the top round its threshold. An aggregator that drops out of the top round before its
masked input loses its region. The report (:class:`HierarchicalReport`) lists which regions,
and so which clients, are in the total.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from statistics import fmean
from typing import Any, Literal

import numpy as np
from numpy.typing import NDArray

from ghofl.errors import AggregationAbortedError, ConfigError, ProtocolError
from ghofl.secure.bounds import TotalLimits, check_bounds, refuse_total
from ghofl.secure.client import PayloadEncoder, SecAggClient
from ghofl.secure.config import SecAggConfig, SessionParams
from ghofl.secure.fixedpoint import FixedPointCodec
from ghofl.secure.identity import IdentityKey, Roster
from ghofl.secure.policy import ClientPolicy
from ghofl.secure.protocol import AggregationReport, StageReport, run_aggregation
from ghofl.secure.server import SecAggServer
from ghofl.secure.transport import InMemoryTransport, Transport
from ghofl.stats.client_stats import ClientStats
from ghofl.stats.flat import unflatten_stats
from ghofl.stats.meta import StatsMeta

__all__ = [
    "HierarchicalReport",
    "Region",
    "RegionOutcome",
    "TopRound",
    "partition_regions",
    "region_codec",
    "region_encoder",
    "run_hierarchical",
]

#: What became of a region: its sum is in the total, its round aborted, or its aggregator
#: dropped out of the top round.
RegionStatus = Literal["included", "aborted", "lost"]


@dataclass(frozen=True)
class Region:
    """One region: a public group of the roster's clients with its own secure round.

    Attributes
    ----------
    name : str
        The region's name, also its aggregator's id in the top round.
    clients : tuple of str
        Its clients (sorted).
    """

    name: str
    clients: tuple[str, ...]


def partition_regions(clients: Sequence[str], regions: int) -> tuple[Region, ...]:
    """Split the roster into ``regions`` public regions.

    The sorted client ids are cut into contiguous groups whose sizes differ by at most one
    (the first ``n mod R`` regions hold one client more), named ``region-0`` ...
    ``region-{R-1}`` (zero-padded). Every party derives the same regions from the roster.

    Raises
    ------
    ConfigError
        Fewer than 2 regions, or so many that a region would hold fewer than 2 clients (the
        secure protocol's minimum).
    """
    ids = sorted(str(c) for c in clients)
    n, r = len(ids), int(regions)
    if len(set(ids)) != n:
        raise ConfigError("client ids must be unique; the list of clients repeats one")
    if r < 2:
        raise ConfigError(
            f"hierarchical aggregation needs at least 2 regions (the top round adds the "
            f"regional sums of 2 or more aggregators); got {r}: leave regions unset for one "
            "flat round"
        )
    if r > n // 2:
        raise ConfigError(
            f"{r} regions for {n} clients leave a region with fewer than 2 clients, the secure "
            f"protocol's minimum; give at most {max(n // 2, 1)} regions (--regions)"
        )
    width = len(str(r - 1))
    base, extra = divmod(n, r)
    out, start = [], 0
    for i in range(r):
        size = base + (1 if i < extra else 0)
        out.append(Region(f"region-{i:0{width}d}", tuple(ids[start:start + size])))
        start += size
    return tuple(out)


def region_codec(config: SecAggConfig, total_clients: int) -> FixedPointCodec:
    """The fixed-point codec of every region and of the top round: K = the whole federation."""
    return FixedPointCodec(int(total_clients), config.max_samples, float(config.clip_norm),
                           config.limbs)


def region_encoder(codec: FixedPointCodec) -> PayloadEncoder:
    """A client's encoder for a regional round: the federation's codec, not its region's.

    The round's public parameters must agree with ``codec`` on M, R and the limbs (the client
    refuses the round otherwise).
    """
    def encode(stats: ClientStats, params: SessionParams) -> NDArray[np.uint64]:
        ours = (codec.max_samples, float(codec.clip_norm), codec.limbs)
        theirs = (params.max_samples, float(params.clip_norm), params.limbs)
        if ours != theirs or params.num_clients > codec.num_clients:
            raise ProtocolError(
                f"a regional round with fixed-point bounds (M, R, limbs, n) = "
                f"{(*theirs, params.num_clients)} other than the federation's "
                f"{(*ours, codec.num_clients)}; the regional server and this client disagree "
                "on the federation's public parameters"
            )
        return codec.encode(stats)

    return encode


@dataclass(frozen=True)
class TopRound:
    """Settings of the top round, among the regional aggregators (run in process).

    Parameters
    ----------
    threshold : int, optional
        Fewest aggregators that must remain (default: the secure protocol's default for R).
    drops : mapping of str to int, optional
        Simulated drops: aggregators that vanish per stage (see
        :class:`~ghofl.secure.InMemoryTransport`).
    seed : int, default 0
        Seed of the generator that picks the dropped aggregators.
    """

    threshold: int | None = None
    drops: Mapping[str, int] = field(default_factory=dict)
    seed: int = 0


@dataclass
class RegionOutcome:
    """One region's round and its fate.

    Attributes
    ----------
    name : str
    clients : tuple of str
        The region's clients.
    status : {"included", "aborted", "lost"}
        Its sum is in the total; its round aborted; or it completed but its aggregator dropped
        out of the top round before its masked input.
    reason : str
        Why it is not in the total ("" when included).
    params : dict
        Public parameters of the regional round (n = the region's size).
    report : AggregationReport or None
        The regional round (``None`` when it aborted).
    dropped, excluded : dict of str to str
        The regional round's dropped and excluded clients.
    """

    name: str
    clients: tuple[str, ...]
    status: RegionStatus
    reason: str
    params: dict[str, Any]
    report: AggregationReport | None
    dropped: dict[str, str] = field(default_factory=dict)
    excluded: dict[str, str] = field(default_factory=dict)

    @property
    def survivors(self) -> tuple[str, ...]:
        """Clients of the region whose statistics are in the regional sum."""
        return () if self.report is None else tuple(self.report.survivors)

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready summary (the regional report without the total)."""
        return {"clients": len(self.clients), "status": self.status, "reason": self.reason,
                "survivors": len(self.survivors), "dropped": dict(self.dropped),
                "excluded": dict(self.excluded), "params": dict(self.params),
                "seconds": 0.0 if self.report is None else self.report.seconds}


@dataclass
class HierarchicalReport:
    """Outcome of :func:`run_hierarchical`.

    Attributes
    ----------
    total : ClientStats
        The sum over the included regions' surviving clients.
    words : ndarray of uint64
        The same total as fixed-point words of :attr:`codec` (equal, bit for bit, to the words
        a flat secure round over the same clients unmasks).
    codec : FixedPointCodec
        The federation's codec (K = every client of every region).
    regions : dict of str to RegionOutcome
        Every region, in order.
    top : AggregationReport
        The top round among the aggregators.
    seconds : float
        Wall time of the whole run (regions one after another, then the top round).
    """

    total: ClientStats
    words: NDArray[np.uint64]
    codec: FixedPointCodec
    regions: dict[str, RegionOutcome]
    top: AggregationReport
    seconds: float

    @property
    def included_regions(self) -> list[str]:
        """Regions whose sum is in the total."""
        return [r for r, o in self.regions.items() if o.status == "included"]

    @property
    def included_clients(self) -> list[str]:
        """Clients whose statistics are in the total."""
        return [c for r in self.included_regions for c in self.regions[r].survivors]

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready summary: each region, the top round, what is in the total."""
        return {"regions": {r: o.to_dict() for r, o in self.regions.items()},
                "included_regions": self.included_regions,
                "included_clients": len(self.included_clients),
                "top": self.top.to_dict(), "codec": self.codec.to_dict(),
                "seconds": self.seconds}

    def summary(self) -> AggregationReport:
        """The run as one :class:`~ghofl.secure.AggregationReport`.

        Survivors are the included clients; the regional stages are merged over the regions
        (seconds and bytes added, per-client means weighted by replies), the top round's
        stages follow as ``top/<stage>``; a region left out is named in the notes.
        """
        done = [o.report for o in self.regions.values() if o.report is not None]
        stages = {s: _merge([r.stages[s] for r in done if s in r.stages])
                  for s in (done[0].stages if done else {})}
        stages.update({f"top/{s}": v for s, v in self.top.stages.items()})
        notes = [f"{o.name} ({len(o.clients)} clients) is not in the total: {o.reason}"
                 for o in self.regions.values() if o.status != "included"]
        notes += [n for r in done for n in r.notes] + [f"top: {n}" for n in self.top.notes]
        return AggregationReport(
            protocol="secure", total=self.total, stages=stages,
            survivors=self.included_clients,
            dropped={c: s for o in self.regions.values() for c, s in o.dropped.items()},
            excluded={c: s for o in self.regions.values() for c, s in o.excluded.items()},
            notes=notes,
            refused={c: w for r in done for c, w in r.refused.items()},
            params={"regions": len(self.regions), "num_clients": self.codec.num_clients,
                    "region_sizes": [len(o.clients) for o in self.regions.values()],
                    "region": next((o.params for o in self.regions.values()), {}),
                    "top": dict(self.top.params)},
            seconds=self.seconds)


def run_hierarchical(config: SecAggConfig, meta: StatsMeta, regions: Sequence[Region],
                     transport_for: Callable[[Region], Transport], *,
                     rosters: Mapping[str, Roster] | None = None,
                     top: TopRound | None = None,
                     server_half: Callable[..., SecAggServer]) -> HierarchicalReport:
    """Run a secure round in every region, then the top round over the regional aggregators.

    Parameters
    ----------
    config : SecAggConfig
        The secure round's settings; threshold and neighbours apply to each regional round
        (sized for the region's n), the fixed-point bounds to the whole federation.
    meta : StatsMeta
        The statistics every client holds.
    regions : sequence of Region
        The public partition of the roster (:func:`partition_regions`).
    transport_for : callable Region -> Transport
        Delivers a region's requests to its clients; they must encode with
        :func:`region_encoder` of :func:`region_codec` (``config``, all clients). Called once
        per region, just before its round (a simulation may build the region's clients then).
    rosters : mapping of str to Roster, optional
        Each region's roster (its clients' identity keys), by region name, read after
        ``transport_for(region)``; without one, that region's round is unauthenticated.
    top : TopRound, optional
        Settings of the top round (its aggregators run in process, authenticated by a roster
        of fresh identity keys).
    server_half : callable
        Builds each round's server half with the arguments of
        :class:`~ghofl.secure.server.SecAggServer` (``ghofl.server`` passes that class: the
        server halves of every protocol are built there).

    Returns
    -------
    HierarchicalReport

    Raises
    ------
    ConfigError
        Fewer than 2 regions, a region of fewer than 2 clients, a threshold larger than a
        region, or a client in two regions.
    AggregationAbortedError
        The top round aborted (too few aggregators), or no region's sum reached the total;
        a regional abort only leaves that region out.
    """
    start = time.perf_counter()
    top = top or TopRound()
    _check_regions(config, regions)
    codec = region_codec(config, sum(len(r.clients) for r in regions))
    outcomes: dict[str, RegionOutcome] = {}
    sums: dict[str, tuple[ClientStats, NDArray[np.uint64]]] = {}
    for region in regions:
        transport = transport_for(region)  # first: it may build the region's clients
        roster = None if rosters is None else rosters.get(region.name)
        outcome, words = _run_region(config, meta, region, codec, transport, roster,
                                     server_half)
        outcomes[region.name] = outcome
        if words is not None and outcome.report is not None:
            sums[region.name] = (outcome.report.total, words)
    if not sums:
        raise AggregationAbortedError(
            f"hierarchical aggregation aborted: the round of every one of the {len(regions)} "
            f"regions aborted, so no region's sum exists; no result was produced (first: "
            f"{next(iter(outcomes.values())).reason})"
        )
    zero = np.zeros(codec.length(meta), np.uint64)
    empty = codec.decode(meta, zero)
    inputs = {r.name: sums.get(r.name, (empty, zero)) for r in regions}
    report, words = _run_top(config, meta, codec, inputs, outcomes, top, server_half)
    in_top = set(report.survivors)
    for name, o in outcomes.items():
        if o.status == "included" and name not in in_top:
            stage = report.dropped.get(name) or report.excluded.get(name) or "the top round"
            o.status, o.reason = "lost", f"its aggregator dropped out of the top round ({stage})"
    if not any(o.status == "included" for o in outcomes.values()):
        raise AggregationAbortedError(
            "hierarchical aggregation aborted: no aggregator of a completed region is in the "
            "top round's sum; no result was produced"
        )
    return HierarchicalReport(report.total, words, codec, outcomes, report,
                              time.perf_counter() - start)


def _check_regions(config: SecAggConfig, regions: Sequence[Region]) -> None:
    """Refuse a partition the protocol cannot run, before any round starts."""
    if len(regions) < 2:
        raise ConfigError(
            f"hierarchical aggregation needs at least 2 regions; got {len(regions)}: leave "
            "regions unset for one flat round"
        )
    seen: dict[str, str] = {}
    for region in regions:
        for c in region.clients:
            if c in seen:
                raise ConfigError(f"client {c!r} is in regions {seen[c]!r} and {region.name!r}; "
                                  "regions must partition the roster (partition_regions)")
            seen[c] = region.name
        try:
            config.for_clients(len(region.clients))
        except ConfigError as exc:
            raise ConfigError(f"region {region.name!r} ({len(region.clients)} clients) cannot "
                              f"run the secure protocol: {exc}") from None


def _run_region(config: SecAggConfig, meta: StatsMeta, region: Region, codec: FixedPointCodec,
                transport: Transport, roster: Roster | None,
                server_half: Callable[..., SecAggServer]
                ) -> tuple[RegionOutcome, NDArray[np.uint64] | None]:
    """One regional round: its outcome and its sum as words (``None`` when it aborted)."""
    holder: list[SecAggServer] = []
    decoder = _WordsDecoder(codec, lambda: len(holder[0].survivors), f"region {region.name}")
    server = server_half(config, meta, region.clients, decode=decoder, roster=roster)
    holder.append(server)
    params = server.params.to_dict()
    try:
        report = run_aggregation(server, transport)
    except AggregationAbortedError as exc:
        return RegionOutcome(region.name, region.clients, "aborted", str(exc), params, None,
                             dict(server.dropped), dict(server.excluded)), None
    return RegionOutcome(region.name, region.clients, "included", "", params, report,
                         dict(report.dropped), dict(report.excluded)), decoder.words


def _run_top(config: SecAggConfig, meta: StatsMeta, codec: FixedPointCodec,
             inputs: Mapping[str, tuple[ClientStats, NDArray[np.uint64]]],
             outcomes: Mapping[str, RegionOutcome], top: TopRound,
             server_half: Callable[..., SecAggServer]
             ) -> tuple[AggregationReport, NDArray[np.uint64]]:
    """The top round: each aggregator masks its regional words (zeros for an aborted region)."""
    cfg = replace(config, threshold=top.threshold, neighbours=None)
    keys = {name: IdentityKey.generate() for name in inputs}
    roster = Roster.from_identities(keys)
    policy = ClientPolicy(corrupt_fraction=cfg.corrupt_fraction,
                          dropout_fraction=cfg.dropout_fraction, sigma=cfg.sigma, eta=cfg.eta,
                          trust_server=top.threshold is not None)
    aggregators = [SecAggClient(name, stats, encode=_fixed(words), identity=keys[name],
                                roster=roster, policy=policy, ledger=None)
                   for name, (stats, words) in inputs.items()]
    holder: list[SecAggServer] = []

    def contributors() -> int:
        return sum(len(outcomes[a].survivors) for a in holder[0].survivors)

    decoder = _WordsDecoder(codec, contributors, "the top round")
    server = server_half(cfg, meta, list(inputs), decode=decoder, roster=roster)
    holder.append(server)
    report = run_aggregation(server, InMemoryTransport(aggregators, top.drops, seed=top.seed))
    assert decoder.words is not None
    return report, decoder.words


def _fixed(words: NDArray[np.uint64]) -> PayloadEncoder:
    """An aggregator's encoder: its regional words, whatever the round's own codec."""
    def encode(stats: ClientStats, params: SessionParams) -> NDArray[np.uint64]:
        return words.copy()

    return encode


class _WordsDecoder:
    """A server's decoder that keeps the unmasked words.

    It decodes them with the federation's codec (not the round's), checking the total against
    what clipping allows.
    """

    def __init__(self, codec: FixedPointCodec, contributors: Callable[[], int],
                 what: str) -> None:
        self.codec = codec
        self.words: NDArray[np.uint64] | None = None
        self._contributors = contributors
        self._what = what

    def __call__(self, params: SessionParams, meta: StatsMeta, words: NDArray[np.uint64]
                 ) -> ClientStats:
        """Keep ``words`` and decode them into the checked total."""
        self.words = words.copy()
        ints, floats = self.codec.decode_vectors(meta, words)
        limits = TotalLimits.for_codec(self.codec, self._contributors())
        refuse_total(check_bounds(meta, ints, floats, limits), limits,
                     f"secure aggregation ({self._what})")
        return unflatten_stats(meta, ints, floats)


def _merge(stages: Sequence[StageReport]) -> StageReport:
    """One stage over every region: seconds and bytes added, per-client means weighted."""
    replies = sum(s.replies for s in stages)
    weights = [max(s.replies, 0) for s in stages]

    def weighted(values: list[float]) -> float:
        if not replies:
            return fmean(values) if values else 0.0
        return math.fsum(v * w for v, w in zip(values, weights, strict=True)) / replies

    return StageReport(
        server_seconds=math.fsum(s.server_seconds for s in stages),
        client_seconds_total=math.fsum(s.client_seconds_total for s in stages),
        client_seconds_max=max((s.client_seconds_max for s in stages), default=0.0),
        server_sent_bytes=sum(s.server_sent_bytes for s in stages),
        server_received_bytes=sum(s.server_received_bytes for s in stages),
        client_sent_bytes_mean=weighted([s.client_sent_bytes_mean for s in stages]),
        client_sent_bytes_max=max((s.client_sent_bytes_max for s in stages), default=0),
        client_received_bytes_mean=weighted([s.client_received_bytes_mean for s in stages]),
        client_received_bytes_max=max((s.client_received_bytes_max for s in stages), default=0),
        replies=replies,
    )
