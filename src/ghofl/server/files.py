"""Payloads that arrive as files: a transport over files, and the plan of their server.

``ghofl aggregate`` runs the plain protocol's server half (:class:`~ghofl.secure.PlainServer`,
built by :class:`~ghofl.server.run.FederationServer`) over a :class:`FilesTransport`: every
invited client is a payload file, and its answer to the server's ``input`` request is the
file's statistics, read when the server asks for them (one payload in memory at a time). The
server's checks of every payload and its recording in a store then apply to files exactly as
to clients answering over a network. :func:`payload_plan` is the plan of such a server, read
from the payloads themselves; ``ghofl fit`` uses it for a total summed elsewhere.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import TYPE_CHECKING

from ghofl.client.job import ClientJob
from ghofl.errors import ConfigError
from ghofl.secure.messages import ClientMessage, PlainRequest, ServerMessage, Stage
from ghofl.secure.plain import PlainClient
from ghofl.secure.transport import StageTraffic
from ghofl.server.plan import AggregationSpec, FederationPlan
from ghofl.stats.client_stats import ClientStats
from ghofl.stats.client_stats.packed import PackedStats
from ghofl.stats.codec import load_stats
from ghofl.stats.meta import Mode, StatsMeta

if TYPE_CHECKING:
    from ghofl.server.job import ServerJob

__all__ = ["FilesTransport", "payload_plan"]


class FilesTransport:
    """Answers the plain server's request to each client by reading the client's payload file.

    Parameters
    ----------
    files : mapping of str to Path
        Client id → its payload file (``.ghs``); payloads are delivered in this order.
    read : callable Path -> ClientStats or PackedStats, default ``load_stats``
        Reads one payload (:func:`~ghofl.stats.codec.load_stats`); its errors propagate (the
        round stops there). A server that only adds the payloads (no store, no per-payload
        estimate) may read them packed (:func:`~ghofl.stats.codec.load_packed_stats`): it
        adds them so.
    halt : callable () -> bool, optional
        Asked before each payload is read: once it returns True no further file is read and
        the clients left are absent from the round (dropouts); e.g. stop at the first payload
        the server refused.

    Attributes
    ----------
    traffic : dict of str to StageTraffic
        Per stage: the bytes of every file read (``from_client``) and the seconds spent
        reading it (``client_seconds``).
    delivered : list of str
        Clients whose payload was delivered, in order.
    last_meta : StatsMeta or None
        Metadata of the last payload delivered.
    """

    def __init__(self, files: Mapping[str, Path], *,
                 read: Callable[[Path], ClientStats | PackedStats] = load_stats,
                 halt: Callable[[], bool] | None = None) -> None:
        self.files = {str(c): Path(p) for c, p in files.items()}
        self.read = read
        self.halt = halt
        self.traffic: dict[str, StageTraffic] = {}
        self.delivered: list[str] = []
        self.last_meta: StatsMeta | None = None
        self._first: tuple[str, ClientStats | PackedStats] | None = None

    def first_meta(self) -> StatsMeta:
        """Metadata of the first payload: read now, and kept until it is delivered.

        Raises
        ------
        ConfigError
            The transport has no files.
        """
        if not self.files:
            raise ConfigError("no payload files to deliver; give at least one .ghs file")
        if self._first is None:
            client, path = next(iter(self.files.items()))
            self._first = (client, self.read(path))
        return self._first[1].meta

    def exchange(self, stage: Stage, requests: Mapping[str, ServerMessage]
                 ) -> Iterator[tuple[str, ClientMessage]]:
        """Read each requested client's file when its turn comes and yield its answer.

        Clients without a file are absent (dropouts).

        Raises
        ------
        ConfigError
            A request is not the plain protocol's (files answer no other protocol).
        """
        traffic = self.traffic.setdefault(stage, StageTraffic())
        for client, request in requests.items():
            path = self.files.get(client)
            if path is None:
                continue
            if not isinstance(request, PlainRequest):
                raise ConfigError(
                    f"payload files answer only the plain protocol's input request, not a "
                    f"{type(request).__name__} (stage {stage!r}); aggregate files with the "
                    "plain protocol"
                )
            if self.halt is not None and self.halt():
                return
            t0 = time.perf_counter()
            stats = self._take(client, path)
            reply = PlainClient(client, stats).handle(request)
            traffic.client_seconds[client] = time.perf_counter() - t0
            traffic.from_client[client] = path.stat().st_size
            self.delivered.append(client)
            self.last_meta = stats.meta
            del stats
            yield client, reply
            del reply  # added by the server by now: one payload in memory at a time

    def _take(self, client: str, path: Path) -> ClientStats | PackedStats:
        if self._first is not None and self._first[0] == client:
            stats = self._first[1]
            self._first = None
            return stats
        return self.read(path)


def payload_plan(meta: StatsMeta, *, store: str | Path | None = None,
                 server: ServerJob | None = None) -> FederationPlan:
    """The plan of a server that receives finished payloads (files, a stored total).

    Parameters
    ----------
    meta : StatsMeta
        Metadata of the payloads: the clients' part of the plan is their class list, upload
        mode and clipping bound.
    store : path, optional
        Aggregation store recording every accepted payload (``aggregation.store``).
    server : ServerJob, optional
        The heads to fit (default: the default job's heads that ``meta.mode`` can fit).

    Returns
    -------
    FederationPlan
        The plain sum, without differential privacy.
    """
    client = ClientJob(meta.classes, meta.mode, clip_norm=meta.clip_norm)
    aggregation = AggregationSpec("plain", store="" if store is None else str(store))
    return FederationPlan(client, aggregation,
                          server if server is not None else _heads_for(meta.mode))


def _heads_for(mode: Mode) -> ServerJob:
    """The default job's heads that payloads of ``mode`` can fit (``ncm`` fits every mode)."""
    from ghofl.heads.registry import head_class
    from ghofl.server.job import ServerJob  # the heads' modules, on first use
    from ghofl.stats.schema import mode_supports

    default = ServerJob()
    heads = tuple(h for h in default.heads if mode_supports(mode, head_class(h).min_mode))
    return ServerJob(heads or ("ncm",))
