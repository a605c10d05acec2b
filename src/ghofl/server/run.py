"""The server of a federation: aggregate (any protocol, any transport), release, record, fit.

:class:`FederationServer` is the one server entry point of every front end. The in-process
simulator hands it an :class:`~ghofl.secure.InMemoryTransport`, the Flower ServerApp a
:class:`~ghofl.integrations.flower.transport.FlowerTransport`, ``ghofl aggregate`` a
:class:`~ghofl.server.files.FilesTransport` (payload files); each then calls
:meth:`FederationServer.aggregate` (the protocol's server half, built here from the plan, and
the differential-privacy release) and :meth:`FederationServer.fit` (the plan's server job,
which ``ghofl fit`` runs on a total summed elsewhere: :meth:`FederationServer.from_total`).
Only this module builds a :class:`~ghofl.secure.SecAggServer`, a
:class:`~ghofl.secure.PlainServer` or a DP release (a plan with regions hands its rounds to
:func:`~ghofl.secure.hierarchy.run_hierarchical`, :meth:`FederationServer.aggregate_regions`).
Every total is checked against what clipping allows (:mod:`ghofl.secure.bounds`) before
anything is fitted or released: the secure sum as it is decoded
(:class:`~ghofl.secure.bounds.BoundedDecoder`), the distributed-DP sum with its public noise
(:class:`~ghofl.privacy.NoisyDecoder`); a total that fails is refused with
:class:`~ghofl.errors.TotalOutOfBoundsError`. The plain server checks every payload as it
arrives and excludes one that fails (the laws are additive, so the plain sum of payloads that
pass passes too).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
from numpy.typing import NDArray

from ghofl.errors import ConfigError
from ghofl.secure import AggregationReport, PlainServer, SecAggServer, run_aggregation
from ghofl.secure.bounds import BoundedDecoder
from ghofl.secure.hierarchy import (
    HierarchicalReport,
    Region,
    TopRound,
    partition_regions,
    run_hierarchical,
)
from ghofl.secure.identity import Roster
from ghofl.secure.transport import Transport
from ghofl.server.job import ServerResult, run_server_job
from ghofl.server.plan import FederationPlan
from ghofl.stats.client_stats import ClientStats
from ghofl.stats.meta import StatsMeta

if TYPE_CHECKING:
    from ghofl.heads.base import Head
    from ghofl.privacy import NoisyDecoder
    from ghofl.server.estimate import FedCOFEstimate
    from ghofl.server.job import ServerJob
    from ghofl.store import AggregationStore, StoreHead
    from ghofl.store.records import AddResult

__all__ = ["Aggregated", "FederationServer"]


@dataclass(frozen=True)
class Aggregated:
    """What :meth:`FederationServer.aggregate` produced.

    Attributes
    ----------
    report : AggregationReport
        The protocol run (its ``total`` is the exact sum, before any DP noise).
    total : ClientStats
        What the heads are fitted from: the exact sum, or its DP release.
    privacy : dict or None
        :meth:`~ghofl.privacy.PrivateRelease.to_dict` of the release; ``None`` without DP.
    seconds : float
        Wall time of the protocol run.
    hierarchy : HierarchicalReport or None
        With regions: every region's round and the top round (``report`` is its
        :meth:`~ghofl.secure.hierarchy.HierarchicalReport.summary`).
    """

    report: AggregationReport
    total: ClientStats
    privacy: dict[str, Any] | None
    seconds: float
    hierarchy: HierarchicalReport | None = None


class FederationServer:
    """The server side of one federation plan.

    Parameters
    ----------
    plan : FederationPlan
    clients : sequence of str
        The clients invited (ids the transport delivers to).
    meta : StatsMeta
        The statistics every client produces.
    store_id : callable, optional
        Maps a client id to its id in the plan's store (default: the client id).
    roster : Roster, optional
        The federation's roster of identity keys (secure protocol): every signature is
        checked against it. Without it the secure round is unauthenticated.
    payload_sha256 : callable, optional
        With a store: maps a client id to the SHA-256 of its payload as received (e.g. of its
        ``.ghs`` file), recorded with it (default: the store's digest of the statistics).
    on_record : callable, optional
        With a store: called as ``on_record(client_id, stats, AddResult)`` once each accepted
        payload is recorded (``AddResult.added`` is false for an idempotent re-submission).

    Attributes
    ----------
    half : SecAggServer or PlainServer
        The protocol's server half (its ``dropped`` and ``excluded`` stay readable after a
        failed run); not set with regions.
    regions : tuple of Region
        With regions: the public partition of ``clients`` (empty otherwise).
    store_head : StoreHead or None
        With a store: its head digest and contribution count, as checked when it was opened
        (:func:`~ghofl.store.verify.check_store`: a store whose parts disagree is refused
        before anything is added) and after each payload recorded; ``None`` without a store.
    """

    def __init__(self, plan: FederationPlan, clients: Sequence[str], meta: StatsMeta, *,
                 store_id: Callable[[str], str] | None = None,
                 roster: Roster | None = None,
                 payload_sha256: Callable[[str], str | None] | None = None,
                 on_record: Callable[[str, ClientStats, AddResult], object] | None = None
                 ) -> None:
        self.plan = plan
        self.meta = meta
        self._noise = plan.noise_plan()
        self._decoder: NoisyDecoder | None = None
        self._store: AggregationStore | None = None
        self._fedcof: FedCOFEstimate | None = None
        self.store_head: StoreHead | None = None
        self.half: SecAggServer | PlainServer
        ids = [str(c) for c in clients]
        self.regions: tuple[Region, ...] = ()
        if plan.aggregation.regions is not None:
            self.regions = partition_regions(ids, plan.aggregation.regions)
        elif plan.secure:
            def contributors() -> int:
                return len(self.half.survivors)

            decode: Callable[..., ClientStats] = BoundedDecoder(contributors)
            if plan.distributed_dp and self._noise is not None:
                from ghofl.privacy import NoisyDecoder

                decode = self._decoder = NoisyDecoder(
                    self._noise, contributors, lambda: getattr(self.half, "levels_removed", {}))
            self.half = SecAggServer(plan.secagg_config(), meta, ids, decode=decode,
                                     roster=roster)
        elif plan.aggregation.store:
            from ghofl.store import AggregationStore, check_store

            store = self._store = AggregationStore(Path(plan.aggregation.store))
            try:
                self.store_head = check_store(store)
            except BaseException:
                store.close()
                raise
            name, sha = store_id or str, payload_sha256 or (lambda c: None)

            def record(client: str, stats: ClientStats) -> None:
                result = store.add(name(client), stats, payload_sha256=sha(client))
                self.store_head = result.head
                if on_record is not None:
                    on_record(client, stats, result)

            self.half = PlainServer(ids, meta, on_accept=record)
        else:
            if plan.aggregation.estimate == "fedcof":  # the plan allows it on plain rounds only
                from ghofl.server.estimate import FedCOFEstimate

                self._fedcof = FedCOFEstimate(plan.fit_mode)
            self.half = PlainServer(ids, meta, on_accept=None if self._fedcof is None
                                    else self._fedcof.add)

    def aggregate(self, transport: Transport, *,
                  noise_rng: np.random.Generator | None = None) -> Aggregated:
        """Run the protocol over ``transport`` and release the total.

        Parameters
        ----------
        transport : Transport
            Delivers the server's requests to the clients.
        noise_rng : numpy.random.Generator, optional
            Source of central DP noise (default: OS entropy, as a deployment needs).

        Raises
        ------
        AggregationAbortedError
            The protocol aborted; the store (if any) is closed either way.
        TotalOutOfBoundsError
            The secure total fails the bounds that clipping allows (``ghofl.secure.bounds``:
            checked on the decoded sum, also with its distributed DP noise); nothing is
            released.
        """
        if self.regions:
            raise ConfigError(
                "a plan with regions runs one secure round per region: call "
                "aggregate_regions (ghofl simulate --regions); a Flower deployment runs one "
                "federation per region (docs/secure-aggregation.md, Regions)"
            )
        t0 = time.perf_counter()
        try:
            report = run_aggregation(self.half, transport)
        finally:
            if self._store is not None:
                self._store.close()
        return self._release(report, time.perf_counter() - t0, noise_rng)

    def aggregate_regions(self, transport_for: Callable[[Region], Transport], *,
                          rosters: Mapping[str, Roster] | None = None,
                          top: TopRound | None = None,
                          noise_rng: np.random.Generator | None = None) -> Aggregated:
        """Run the plan's regions and the top round, and release the total.

        Parameters
        ----------
        transport_for : callable Region -> Transport
            Delivers a region's requests to its clients (who encode with
            :func:`~ghofl.secure.hierarchy.region_encoder`); called once per region of
            :attr:`regions`, just before its round.
        rosters : mapping of str to Roster, optional
            Each region's roster, by region name.
        top : TopRound, optional
            Settings of the top round among the regional aggregators.
        noise_rng : numpy.random.Generator, optional
            Source of central DP noise (default: OS entropy).

        Raises
        ------
        ConfigError
            The plan has no regions, or a region cannot run the protocol.
        AggregationAbortedError
            The top round aborted (a region's abort only leaves that region out).
        """
        if not self.regions:
            raise ConfigError("aggregate_regions is for plans with regions; call aggregate")
        hier = run_hierarchical(self.plan.secagg_config(), self.meta, self.regions,
                                transport_for, rosters=rosters, top=top,
                                server_half=SecAggServer)
        out = self._release(hier.summary(), hier.seconds, noise_rng)
        return Aggregated(out.report, out.total, out.privacy, out.seconds, hier)

    def _release(self, report: AggregationReport, seconds: float,
                 noise_rng: np.random.Generator | None) -> Aggregated:
        """The exact total, its DP release, or FedCOF's estimate (the plan's estimate)."""
        total, privacy = report.total, None
        if self._fedcof is not None:
            total = self._fedcof.estimate(report.total)
        if self._noise is not None:
            from ghofl.privacy import release_central

            release = (self._decoder.release if self._decoder is not None else
                       release_central(report.total, self._noise,
                                       noise_rng or np.random.default_rng()))
            assert release is not None
            total, privacy = release.stats, release.to_dict()
        return Aggregated(report, total, privacy, seconds)

    @classmethod
    def from_total(cls, job: ServerJob, meta: StatsMeta) -> FederationServer:
        """The server of a fit from a total summed elsewhere (a ``.ghs`` total, a store).

        No clients: its plan (:func:`~ghofl.server.files.payload_plan`) is read from the
        total's metadata ``meta`` and fits the heads of ``job``.
        """
        from ghofl.server.files import payload_plan

        return cls(payload_plan(meta, server=job), (), meta)

    def fit(self, total: ClientStats, *, out_dir: Path | None = None,
            test: tuple[NDArray[Any], NDArray[Any]] | None = None,
            extra: Mapping[str, Any] | None = None,
            log: Callable[[str], None] | None = None, option: str = "out_dir",
            command: str | None = None,
            heads: Mapping[str, Head] | None = None) -> ServerResult:
        """Fit the plan's heads from ``total`` (:func:`~ghofl.server.job.run_server_job`).

        Parameters
        ----------
        total : ClientStats
            The aggregate (e.g. :attr:`Aggregated.total`).
        out_dir, test, extra, log, option, command :
            As in :func:`~ghofl.server.job.run_server_job`.
        heads : mapping of str to Head, optional
            The plan's heads, unfitted, built by a check before any client worked (so they
            are built once); default: built here.
        """
        return run_server_job(total, self.plan.server, out_dir=out_dir, test=test,
                              extra=extra, log=log, option=option, command=command,
                              heads=heads)
