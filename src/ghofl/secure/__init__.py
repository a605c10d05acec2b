"""Aggregation protocols: the server learns only the sum of the clients' statistics.

Two protocols share one interface, so every caller can run either:

* the secure protocol (:class:`SecAggClient` / :class:`SecAggServer`): Bonawitz et al. (CCS
  2017) on the SecAgg+ graph of Bell et al. (CCS 2020), with exact fixed-point arithmetic
  (:class:`FixedPointCodec`), in six stages: advertise keys → reveal graph nonces → share
  keys → masked input → consistency check → unmask. Against an active server or relay the
  clients trust only their own configuration: the federation's :class:`Roster` of Ed25519
  identity keys (every relayed key, share box and survivor set is signed and bound to the
  run's transcript; a client without a roster refuses unless told
  ``allow_unauthenticated=True``), their :class:`ClientPolicy` (threshold, graph degree,
  roster size, relayed size, missing share boxes) and their :class:`RoundLedger` (on by
  default: a round id is used once, and no second round over the same data);
* the plain protocol (:class:`PlainClient` / :class:`PlainServer`): one stage, in the clear.

Both secure halves sum either client statistics (a :class:`~ghofl.stats.meta.StatsMeta`) or
any vectors of public shape and public per-entry bounds (a :class:`VectorMeta` with one
:class:`VectorPayload` per client; :mod:`ghofl.secure.vectors`): the server's
:meth:`SecAggServer.vector_result` is then their exact total.

:func:`run_aggregation` drives a server half over a :class:`Transport`;
:class:`InMemoryTransport` runs the clients in process (``ghofl simulate`` and the tests).

Example
-------
>>> from ghofl.secure import (InMemoryTransport, SecAggClient, SecAggConfig, SecAggServer,
...                           run_aggregation)
>>> from ghofl.secure import IdentityKey, Roster
>>> cfg = SecAggConfig(clip_norm=10.0)
>>> keys = {f"site-{i}": IdentityKey.generate() for i in range(len(payloads))}
>>> roster = Roster.from_identities(keys)  # in a deployment: fixed out of band
>>> clients = [SecAggClient(c, s, identity=keys[c], roster=roster)
...            for c, s in zip(keys, payloads)]
>>> server = SecAggServer(cfg, payloads[0].meta, roster=roster)
>>> report = run_aggregation(server, InMemoryTransport(clients))  # doctest: +SKIP
>>> report.total  # the sum of every client's statistics  # doctest: +SKIP
"""

from ghofl.secure.client import SecAggClient
from ghofl.secure.config import SecAggConfig, SessionParams, default_threshold
from ghofl.secure.fixedpoint import DEFAULT_MAX_SAMPLES, FixedPointCodec
from ghofl.secure.graph import default_neighbours
from ghofl.secure.identity import IdentityKey, Roster
from ghofl.secure.ledger import RoundLedger
from ghofl.secure.plain import PlainClient, PlainServer
from ghofl.secure.policy import ClientPolicy
from ghofl.secure.protocol import AggregationReport, ServerHalf, StageReport, run_aggregation
from ghofl.secure.server import SecAggServer
from ghofl.secure.transport import ClientHalf, InMemoryTransport, Transport, parse_drops
from ghofl.secure.vectors import VectorMeta, VectorPayload

__all__ = [
    "DEFAULT_MAX_SAMPLES",
    "AggregationReport",
    "ClientHalf",
    "ClientPolicy",
    "FixedPointCodec",
    "IdentityKey",
    "InMemoryTransport",
    "PlainClient",
    "PlainServer",
    "Roster",
    "RoundLedger",
    "SecAggClient",
    "SecAggConfig",
    "SecAggServer",
    "ServerHalf",
    "SessionParams",
    "StageReport",
    "Transport",
    "VectorMeta",
    "VectorPayload",
    "default_neighbours",
    "default_threshold",
    "parse_drops",
    "run_aggregation",
]
