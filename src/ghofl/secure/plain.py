"""The plain protocol: the trivial, one-stage aggregation in the clear.

Each client sends its statistics as they are; the server adds them one at a time (memory
independent of the number of clients). It has the same two halves and the same driver as the
secure protocol (:mod:`ghofl.secure.server`), so every caller can run either; it offers no
privacy from the server and needs no clipping bound.
"""

from __future__ import annotations

import secrets
from collections.abc import Callable, Iterable, Sequence
from typing import Literal

from ghofl.errors import AggregationAbortedError, ConfigError, ProtocolError
from ghofl.secure.bounds import TotalLimits, bounds_message, check_stats_bounds
from ghofl.secure.messages import (
    PROTOCOL_VERSION,
    ClientMessage,
    PlainInput,
    PlainRequest,
    ServerMessage,
    Stage,
)
from ghofl.stats.client_stats import ClientStats, StatsTotal
from ghofl.stats.client_stats.packed import PackedStats
from ghofl.stats.meta import StatsMeta

__all__ = ["PlainClient", "PlainServer"]


class PlainClient:
    """A client of the plain protocol: answers the one ``input`` request with its statistics.

    Parameters
    ----------
    client_id : str
    stats : ClientStats, PackedStats or a callable returning one
        Computed lazily when it is a callable. :class:`PackedStats` (a payload read packed,
        :func:`~ghofl.stats.load_packed_stats`) travels as it is: the server adds it packed.
    """

    def __init__(self, client_id: str, stats: ClientStats | object) -> None:
        self.client_id = str(client_id)
        self._stats = stats
        self.state: Literal["ready", "done", "failed"] = "ready"

    def handle(self, request: ServerMessage) -> ClientMessage:
        """Answer the ``input`` request; any other request raises :class:`ProtocolError`."""
        if (not isinstance(request, PlainRequest) or request.version != PROTOCOL_VERSION
                or self.state != "ready"):
            self.state = "failed"
            raise ProtocolError(
                f"client {self.client_id!r} refused a {type(request).__name__} in state "
                f"{self.state!r} (out of order or replayed)"
            )
        stats = self._stats() if callable(self._stats) else self._stats
        assert isinstance(stats, ClientStats | PackedStats)
        self.state = "done"
        return PlainInput(PROTOCOL_VERSION, request.round_id, "input", self.client_id, stats)


class PlainServer:
    """The server of the plain protocol.

    Parameters
    ----------
    clients : sequence of str
        The clients invited.
    meta : StatsMeta, optional
        The statistics expected; default: those of the first valid reply.
    threshold : int, default 1
        Fewest clients whose statistics must arrive; below it the round aborts.
    round_id : bytes, optional
    record_view : bool, default False
        Keep every reply in :attr:`view`.
    on_accept : callable, optional
        Called as ``on_accept(client_id, stats)`` for every contribution accepted into the
        total, in arrival order (e.g. ``AggregationStore.add`` to record it durably);
        ``stats`` is :class:`ClientStats` (a payload sent packed is unpacked for it).

    Attributes
    ----------
    state, dropped, excluded, ignored, view :
        As in :class:`~ghofl.secure.server.SecAggServer`.
    """

    stages: tuple[Stage, ...] = ("input",)

    def __init__(self, clients: Sequence[str], meta: StatsMeta | None = None, *,
                 threshold: int = 1, round_id: bytes | None = None,
                 record_view: bool = False,
                 on_accept: Callable[[str, ClientStats], object] | None = None) -> None:
        ids = [str(c) for c in clients]
        if len(set(ids)) != len(ids):
            raise ConfigError("client ids must be unique; the list of clients repeats one")
        if not 1 <= threshold <= max(len(ids), 1):
            raise ConfigError(
                f"threshold must be between 1 and the number of clients ({len(ids)}); "
                f"got {threshold}"
            )
        self.clients = tuple(ids)
        self.meta = meta
        self.threshold = threshold
        self.round_id = round_id if round_id is not None else secrets.token_bytes(16)
        self.state: Literal["input", "done", "aborted"] = "input"
        self.dropped: dict[str, str] = {}
        self.excluded: dict[str, str] = {}
        self.ignored: list[str] = []
        self.view: list[tuple[str, str, ClientMessage]] = []
        self._record = record_view
        self.on_accept = on_accept
        self._total = StatsTotal()  # payloads added in place as they arrive
        self._survivors: list[str] = []

    def requests(self) -> dict[str, ServerMessage]:
        """One ``input`` request per invited client."""
        req = PlainRequest(PROTOCOL_VERSION, self.round_id, "input")
        return {c: req for c in self.clients}

    def receive(self, replies: Iterable[tuple[str, ClientMessage]]) -> None:
        """Add each valid reply to the total as it arrives (one payload in memory at a time).

        Raises
        ------
        AggregationAbortedError
            Fewer than ``threshold`` clients sent valid statistics.
        """
        seen: set[str] = set()
        for client, msg in replies:
            if self._record:
                self.view.append(("input", client, msg))
            reason = self._problem(client, msg, seen)
            if reason is not None:
                self.excluded.setdefault(client, f"input: {reason}")
                continue
            seen.add(client)
            assert isinstance(msg, PlainInput)
            self._add(msg.stats)
            if self.on_accept is not None:  # called with the values (a packed payload unpacked)
                self.on_accept(client, msg.stats if isinstance(msg.stats, ClientStats)
                               else msg.stats.unpack())
            self._survivors.append(client)
        for client in self.clients:
            if client not in seen and client not in self.excluded:
                self.dropped[client] = "input"
        if len(self._survivors) < self.threshold or not len(self._total):
            self.state = "aborted"
            raise AggregationAbortedError(
                f"aggregation aborted: {len(self._survivors)} of {len(self.clients)} clients "
                f"sent valid statistics, fewer than the {self.threshold} required"
                + (f" (excluded: {'; '.join(f'{k}: {v}' for k, v in self.excluded.items())})"
                   if self.excluded else "")
            )
        self.state = "done"

    def _problem(self, client: str, msg: object, seen: set[str]) -> str | None:
        if client not in self.clients:
            return "is not one of the invited clients"
        if client in seen:
            return "sent its statistics twice"
        if not isinstance(msg, PlainInput) or not isinstance(msg.stats,
                                                             ClientStats | PackedStats):
            return f"sent a {type(msg).__name__}, not its statistics (malformed)"
        if msg.version != PROTOCOL_VERSION or msg.round_id != self.round_id:
            return "sent a message of another protocol version or round (replayed)"
        if msg.sender != client:
            return f"sent a message claiming to come from {msg.sender!r}"
        reference = self.meta if self.meta is not None else self._total.meta
        if reference is not None:
            diffs = reference.differences(msg.stats.meta)
            if diffs:
                return "holds statistics that differ from the federation's in " + "; ".join(diffs)
        return _out_of_bounds(msg.stats)

    def _add(self, stats: ClientStats | PackedStats) -> None:
        self._total.add(stats)

    def result(self) -> ClientStats:
        """The total over the clients whose statistics arrived."""
        if not len(self._total) or self.state != "done":
            raise AggregationAbortedError(
                f"the round has no result (state {self.state!r}); run the input stage first"
            )
        return self._total.result()

    @property
    def survivors(self) -> tuple[str, ...]:
        """Clients whose statistics are in the sum."""
        return tuple(self._survivors)


def _out_of_bounds(stats: ClientStats | PackedStats) -> str | None:
    """Why one payload is not what clipping at its R can produce.

    ``None`` when it is, or when it was not clipped. No public M in the plain protocol, so counts
    are only checked to be non-negative integers. PSD is validated when the payload is built.
    """
    clip = stats.meta.clip_norm
    if clip is None:
        return None
    limits = TotalLimits(float(clip), rounding=stats.rounding)
    failures = check_stats_bounds(stats, limits, psd=False)
    if not failures:
        return None
    return (f"sent statistics that {limits.describe()} cannot produce: "
            f"{bounds_message(failures)}")
