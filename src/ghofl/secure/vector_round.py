"""Driving a vector round: the stages of :class:`~ghofl.secure.SecAggServer` over a transport.

:func:`~ghofl.secure.protocol.run_aggregation` returns statistics; a round over a
:class:`~ghofl.secure.vectors.VectorMeta` ends in a
:class:`~ghofl.secure.vectors.VectorPayload` instead, which :func:`run_vector_sum` returns with
the same report of what each stage cost.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

from ghofl.secure.protocol import CountedReplies, StageReport, stage_report
from ghofl.secure.server import SecAggServer
from ghofl.secure.transport import StageTraffic, Transport
from ghofl.secure.vectors import VectorPayload

__all__ = ["VectorSumReport", "run_vector_sum"]


@dataclass(frozen=True)
class VectorSumReport:
    """Outcome of :func:`run_vector_sum`.

    Attributes
    ----------
    total : VectorPayload
        The exact sum of the surviving clients' vectors.
    summary : dict
        JSON-ready fields as :meth:`~ghofl.secure.AggregationReport.to_dict`: ``protocol``,
        ``seconds``, ``stages``, ``survivors``, ``survivor_ids``, ``dropped``, ``excluded``,
        ``notes``, ``refused``, ``params``.
    """

    total: VectorPayload
    summary: dict[str, Any]


def run_vector_sum(server: SecAggServer, transport: Transport) -> VectorSumReport:
    """Run every stage of a vector round and return its total with the report.

    Raises
    ------
    AggregationAbortedError
        The protocol aborted (too few clients, unrecoverable secret, a total beyond the
        public bounds); nothing is returned.
    """
    start = time.perf_counter()
    stages: dict[str, StageReport] = {}
    for stage in server.stages:
        t0 = time.perf_counter()
        requests = server.requests()
        replies = CountedReplies(transport.exchange(stage, requests))
        server.receive(replies)
        stages[stage] = stage_report(stage, transport, requests, replies,
                                      time.perf_counter() - t0)
    total = server.vector_result()
    traffic = getattr(transport, "traffic", {})
    refused = {c: why for t in (traffic.values() if isinstance(traffic, dict) else [])
               if isinstance(t, StageTraffic) for c, why in t.refused.items()}
    return VectorSumReport(total, {
        "protocol": "secure", "seconds": time.perf_counter() - start,
        "stages": {k: v.to_dict() for k, v in stages.items()},
        "survivors": len(server.survivors), "survivor_ids": list(server.survivors),
        "dropped": dict(server.dropped), "excluded": dict(server.excluded),
        "notes": list(server.ignored), "refused": refused, "params": server.params.to_dict()})
