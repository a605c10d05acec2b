"""Aggregation protocols: the server learns only the sum of the clients' statistics.

Two protocols share one interface, so every caller can run either:

* the secure protocol (:class:`SecAggClient` / :class:`SecAggServer`): Bonawitz et al. (CCS
  2017) on the SecAgg+ graph of Bell et al. (CCS 2020), with exact fixed-point arithmetic
  (:class:`FixedPointCodec`), in four stages: advertise keys → share keys → masked input →
  unmask;
* the plain protocol (:class:`PlainClient` / :class:`PlainServer`): one stage, in the clear.

:func:`run_aggregation` drives a server half over a :class:`Transport`;
:class:`InMemoryTransport` runs the clients in process (``ghofl simulate`` and the tests).

Example
-------
>>> from ghofl.secure import (InMemoryTransport, SecAggClient, SecAggConfig, SecAggServer,
...                           run_aggregation)
>>> cfg = SecAggConfig(clip_norm=10.0)
>>> clients = [SecAggClient(f"site-{i}", stats_i) for i, stats_i in enumerate(payloads)]
>>> server = SecAggServer(cfg, payloads[0].meta, [c.client_id for c in clients])
>>> report = run_aggregation(server, InMemoryTransport(clients))  # doctest: +SKIP
>>> report.total  # the sum of every client's statistics  # doctest: +SKIP
"""

from ghofl.secure.client import SecAggClient
from ghofl.secure.config import SecAggConfig, SessionParams, default_threshold
from ghofl.secure.fixedpoint import DEFAULT_MAX_SAMPLES, FixedPointCodec
from ghofl.secure.graph import default_neighbours
from ghofl.secure.plain import PlainClient, PlainServer
from ghofl.secure.protocol import AggregationReport, ServerHalf, StageReport, run_aggregation
from ghofl.secure.server import SecAggServer
from ghofl.secure.transport import ClientHalf, InMemoryTransport, Transport, parse_drops

__all__ = [
    "DEFAULT_MAX_SAMPLES",
    "AggregationReport",
    "ClientHalf",
    "FixedPointCodec",
    "InMemoryTransport",
    "PlainClient",
    "PlainServer",
    "SecAggClient",
    "SecAggConfig",
    "SecAggServer",
    "ServerHalf",
    "SessionParams",
    "StageReport",
    "Transport",
    "default_neighbours",
    "default_threshold",
    "parse_drops",
    "run_aggregation",
]
