"""Running a protocol: the driver and the report of what each stage cost.

The driver moves a server half through its stages over a transport.

:func:`run_aggregation` works for any server half (:class:`~ghofl.secure.SecAggServer`,
:class:`~ghofl.secure.PlainServer`) and any transport (:class:`~ghofl.secure.InMemoryTransport`,
or the Flower integration).
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from statistics import mean
from typing import Any, Protocol

from ghofl.secure.messages import ClientMessage, ServerMessage, Stage
from ghofl.secure.transport import InMemoryTransport, StageTraffic, Transport
from ghofl.stats.client_stats import ClientStats

__all__ = ["AggregationReport", "CountedReplies", "ServerHalf", "StageReport", "run_aggregation",
           "stage_report"]


class ServerHalf(Protocol):
    """The server side of a protocol (see :class:`~ghofl.secure.SecAggServer`)."""

    stages: tuple[Stage, ...]
    dropped: dict[str, str]
    excluded: dict[str, str]
    ignored: list[str]

    def requests(self) -> dict[str, ServerMessage]:
        """The request for each client still in the round, for the current stage."""

    def receive(self, replies: Iterable[tuple[str, ClientMessage]]) -> None:
        """Consume the replies of the current stage and move to the next one."""

    def result(self) -> ClientStats:
        """The total over the surviving clients, once every stage has run."""

    @property
    def survivors(self) -> tuple[str, ...]:
        """Clients whose statistics are in the sum."""


@dataclass(frozen=True)
class StageReport:
    """Cost of one stage.

    Attributes
    ----------
    server_seconds : float
        Server time (building requests, checking and processing replies).
    client_seconds_total, client_seconds_max : float
        Client time summed over clients, and of the slowest client.
    server_sent_bytes, server_received_bytes : int
        Message content the server sent and received in this stage.
    client_sent_bytes_mean, client_sent_bytes_max : float, int
        Per answering client.
    client_received_bytes_mean, client_received_bytes_max : float, int
        Per client that was sent a request.
    replies : int
        Clients that answered.
    """

    server_seconds: float
    client_seconds_total: float
    client_seconds_max: float
    server_sent_bytes: int
    server_received_bytes: int
    client_sent_bytes_mean: float
    client_sent_bytes_max: int
    client_received_bytes_mean: float
    client_received_bytes_max: int
    replies: int

    def to_dict(self) -> dict[str, Any]:
        """The report as JSON-ready fields."""
        return dict(self.__dict__)


@dataclass
class AggregationReport:
    """Outcome of :func:`run_aggregation`: the total and what it cost.

    Attributes
    ----------
    protocol : str
        ``"secure"`` or ``"plain"``.
    total : ClientStats
    stages : dict of str to StageReport
    survivors : list of str
        Clients whose statistics are in the total.
    dropped : dict of str to str
        Clients that stopped answering, with the stage.
    excluded : dict of str to str
        Clients excluded for a bad message, with the reason.
    notes : list of str
        Problems that excluded nobody.
    refused : dict of str to str
        Clients that refused a request, with their own reason (known only to transports that
        run the clients, like the in-memory one; such a client is also a dropout).
    params : dict
        Public parameters of the round (secure protocol).
    seconds : float
        Wall time of the whole run.
    """

    protocol: str
    total: ClientStats
    stages: dict[str, StageReport]
    survivors: list[str]
    dropped: dict[str, str]
    excluded: dict[str, str]
    notes: list[str] = field(default_factory=list)
    refused: dict[str, str] = field(default_factory=dict)
    params: dict[str, Any] = field(default_factory=dict)
    seconds: float = 0.0

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready summary (without the total)."""
        return {
            "protocol": self.protocol,
            "seconds": self.seconds,
            "stages": {k: v.to_dict() for k, v in self.stages.items()},
            "survivors": len(self.survivors),
            "survivor_ids": list(self.survivors),
            "dropped": dict(self.dropped),
            "excluded": dict(self.excluded),
            "notes": list(self.notes),
            "refused": dict(self.refused),
            "params": dict(self.params),
        }


def run_aggregation(server: ServerHalf, transport: Transport) -> AggregationReport:
    """Run every stage of ``server`` over ``transport`` and return the total with its report.

    Raises
    ------
    AggregationAbortedError
        The protocol aborted (too few clients, unrecoverable secret); nothing is returned.
    """
    start = time.perf_counter()
    reports: dict[str, StageReport] = {}
    for stage in server.stages:
        t0 = time.perf_counter()
        requests = server.requests()
        replies = CountedReplies(transport.exchange(stage, requests))
        server.receive(replies)
        wall = time.perf_counter() - t0
        reports[stage] = stage_report(stage, transport, requests, replies, wall)
    total = server.result()
    params = getattr(server, "params", None)
    traffic = getattr(transport, "traffic", {})
    refused = {c: why for t in (traffic.values() if isinstance(traffic, dict) else [])
               if isinstance(t, StageTraffic) for c, why in t.refused.items()}
    return AggregationReport(
        protocol="secure" if params is not None else "plain",
        total=total,
        stages=reports,
        survivors=list(server.survivors),
        dropped=dict(server.dropped),
        excluded=dict(server.excluded),
        notes=list(server.ignored),
        refused=refused,
        params=params.to_dict() if params is not None else {},
        seconds=time.perf_counter() - start,
    )


class CountedReplies:
    """The replies of one stage, counted as the server half consumes them.

    Parameters
    ----------
    it : iterator of (str, ClientMessage)
        The transport's replies of the stage.

    Attributes
    ----------
    count : int
        Replies consumed so far.
    """

    def __init__(self, it: Iterator[tuple[str, ClientMessage]]) -> None:
        self._it = it
        self.count = 0

    def __iter__(self) -> Iterator[tuple[str, ClientMessage]]:
        for item in self._it:
            self.count += 1
            yield item


def stage_report(stage: str, transport: Transport, requests: dict[str, ServerMessage],
                 replies: CountedReplies, wall: float) -> StageReport:
    """The cost of one stage from the transport's traffic record and the wall time.

    Parameters
    ----------
    stage : str
    transport : Transport
        Its ``traffic`` (when it keeps one) gives the bytes and client seconds; otherwise the
        request sizes are measured here.
    requests : dict of str to ServerMessage
        What the server sent in the stage.
    replies : CountedReplies
        The stage's replies, already consumed.
    wall : float
        Seconds the stage took end to end (server time is this minus the client seconds).
    """
    from ghofl.secure.messages import message_nbytes

    if isinstance(transport, InMemoryTransport):
        tr = transport.traffic.get(stage, StageTraffic())
    else:
        traffic = getattr(transport, "traffic", {})
        tr = traffic.get(stage, StageTraffic()) if isinstance(traffic, dict) else StageTraffic()
    if not tr.to_client:
        tr.to_client = {c: message_nbytes(r) for c, r in requests.items()}
    client_s = sum(tr.client_seconds.values())
    sent = list(tr.from_client.values())
    received = list(tr.to_client.values())
    return StageReport(
        server_seconds=max(wall - client_s, 0.0),
        client_seconds_total=client_s,
        client_seconds_max=max(tr.client_seconds.values(), default=0.0),
        server_sent_bytes=sum(received),
        server_received_bytes=sum(sent),
        client_sent_bytes_mean=mean(sent) if sent else 0.0,
        client_sent_bytes_max=max(sent, default=0),
        client_received_bytes_mean=mean(received) if received else 0.0,
        client_received_bytes_max=max(received, default=0),
        replies=replies.count,
    )
