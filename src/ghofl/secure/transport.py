"""How requests reach clients and replies reach the server.

The transport interface, and the in-memory transport used by ``ghofl simulate`` and the tests.

A transport delivers one stage's requests and yields the replies as they arrive; a client that
does not answer is simply absent (a dropout). The Flower integration is another transport.
"""

from __future__ import annotations

import time
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Protocol, runtime_checkable

import numpy as np

from ghofl.errors import ConfigError, ProtocolError
from ghofl.secure.messages import (
    SECURE_STAGES,
    ClientMessage,
    ServerMessage,
    Stage,
    message_nbytes,
)

__all__ = ["ClientHalf", "InMemoryTransport", "StageTraffic", "Transport", "parse_drops"]


@runtime_checkable
class ClientHalf(Protocol):
    """The client side of a protocol: answers one request per stage."""

    client_id: str

    def handle(self, request: ServerMessage) -> ClientMessage:
        """The reply to one server request."""


@runtime_checkable
class Transport(Protocol):
    """Delivers one stage's requests and yields ``(client_id, reply)`` as replies arrive."""

    def exchange(self, stage: Stage, requests: Mapping[str, ServerMessage]
                 ) -> Iterator[tuple[str, ClientMessage]]:
        """Deliver ``requests`` (client id → request) and yield the replies as they arrive."""


@dataclass
class StageTraffic:
    """What crossed the transport in one stage, per client.

    Attributes
    ----------
    to_client, from_client : dict of str to int
        Bytes of message content delivered to / received from each client.
    client_seconds : dict of str to float
        Time each client spent computing its reply.
    refused : dict of str to str
        Clients that refused the request, with their reason.
    """

    to_client: dict[str, int] = field(default_factory=dict)
    from_client: dict[str, int] = field(default_factory=dict)
    client_seconds: dict[str, float] = field(default_factory=dict)
    refused: dict[str, str] = field(default_factory=dict)


class InMemoryTransport:
    """Calls each client half in turn, in process, optionally dropping some of them.

    Parameters
    ----------
    clients : sequence of ClientHalf
        The clients, by their ``client_id``.
    drops : mapping of stage to int, optional
        How many clients vanish at each stage: ``{"mask": 2}`` means two clients that are
        still in the round receive the mask request and never answer it (nor anything after).
        Which clients vanish is drawn with ``seed``.
    seed : int, default 0
        Seed of the numpy generator that picks the dropped clients.

    Attributes
    ----------
    traffic : dict of str to StageTraffic
    vanished : dict of str to str
        Clients dropped by the plan, with their stage.
    """

    def __init__(self, clients: Sequence[ClientHalf], drops: Mapping[str, int] | None = None,
                 seed: int = 0) -> None:
        self.clients = {c.client_id: c for c in clients}
        if len(self.clients) != len(clients):
            raise ConfigError("client ids must be unique; two clients share one")
        self.drops = dict(drops or {})
        self.traffic: dict[str, StageTraffic] = {}
        self.vanished: dict[str, str] = {}
        self._rng = np.random.default_rng(seed)

    def exchange(self, stage: Stage, requests: Mapping[str, ServerMessage]
                 ) -> Iterator[tuple[str, ClientMessage]]:
        """Deliver ``requests`` and yield each reply (lazily, one client at a time)."""
        traffic = self.traffic.setdefault(stage, StageTraffic())
        live = [c for c in requests if c in self.clients and c not in self.vanished]
        count = min(self.drops.get(stage, 0), len(live))
        if count:
            for c in self._rng.choice(np.array(sorted(live)), size=count, replace=False):
                self.vanished[str(c)] = stage
        sizes: dict[int, int] = {}  # a broadcast request is sized once
        for client, request in requests.items():
            if client not in self.clients:
                continue
            if id(request) not in sizes:
                sizes[id(request)] = message_nbytes(request)
            traffic.to_client[client] = sizes[id(request)]
            if client in self.vanished:
                continue
            t0 = time.perf_counter()
            try:
                reply = self.clients[client].handle(request)
            except ProtocolError as exc:
                traffic.refused[client] = str(exc)
                continue
            finally:
                traffic.client_seconds[client] = time.perf_counter() - t0
            traffic.from_client[client] = message_nbytes(reply)
            yield client, reply


def parse_drops(specs: Sequence[str] | None, stages: Sequence[str] = SECURE_STAGES
                ) -> dict[str, int]:
    """Parse ``["mask=2", "unmask=1"]`` into ``{"mask": 2, "unmask": 1}``.

    Raises
    ------
    ConfigError
        Unknown stage, missing ``=``, or a count that is not a non-negative integer.
    """
    out: dict[str, int] = {}
    for spec in specs or []:
        stage, sep, count = spec.partition("=")
        stage = stage.strip()
        if not sep or stage not in stages:
            raise ConfigError(
                f"--drop must look like STAGE=COUNT with STAGE one of {', '.join(stages)}; "
                f"got {spec!r}"
            )
        try:
            n = int(count)
        except ValueError:
            n = -1
        if n < 0:
            raise ConfigError(f"--drop {stage}= needs a non-negative integer count; got {count!r}")
        out[stage] = out.get(stage, 0) + n
    return out
