"""One run of :mod:`bench_secure_cost` (no benchmark harness), also the baseline's child.

``bench_secure_cost.py`` imports :func:`run` and :func:`reference` from here; for the ``v2``
row it runs this file as a child process whose ``PYTHONPATH`` is the baseline revision's
source, so this file uses only what every protocol version has (``ghofl.secure``,
``ghofl.stats``), never ``ghofl.bench``, whose API moves with the current revision. The child
prints one JSON row: ``python benchmarks/_secure_cost_run.py N``.
"""

from __future__ import annotations

import inspect
import json
import os
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

import ghofl
from ghofl.secure import (
    IdentityKey,
    InMemoryTransport,
    PlainClient,
    PlainServer,
    Roster,
    SecAggClient,
    SecAggConfig,
    SecAggServer,
    run_aggregation,
)
from ghofl.secure.messages import PROTOCOL_VERSION
from ghofl.stats import ClientStats, compute_stats
from ghofl.stats.accumulate import StatsAccumulator

CLIP = 30.0
D, C, N = 512, 10, 200


def client_stats(i: int, d: int = D) -> Callable[[], ClientStats]:
    """Client ``i``'s statistics, made when called: C classes, ``d`` features, N samples.

    Also the clients of ``bench_secure_regions.py``.
    """
    def make() -> ClientStats:
        rng = np.random.default_rng(1000 + i)
        y = rng.integers(0, C, N)
        x = rng.normal(size=(N, d)) + y[:, None] * 0.05
        return compute_stats(x, y, C, "pooled", clip_norm=CLIP)
    return make


def _halves(variant: str, n: int) -> tuple[list[Any], Any]:
    ids = [f"c{i:05d}" for i in range(n)]
    makers = [client_stats(i) for i in range(n)]
    meta = StatsAccumulator(C, D, "pooled", clip_norm=CLIP).meta  # type: ignore[arg-type]
    if variant == "plain":
        return [PlainClient(c, m) for c, m in zip(ids, makers, strict=True)], PlainServer(ids, meta)
    keys = {c: IdentityKey.generate() for c in ids}
    roster = Roster.from_identities(keys)
    # no ledger in either version (v2's default; v3 takes ledger=None)
    extra: dict[str, Any] = ({"ledger": None} if "allow_unauthenticated" in
                             inspect.signature(SecAggClient).parameters else {})
    clients = [SecAggClient(c, m, meta=meta, identity=keys[c], roster=roster, **extra)
               for c, m in zip(ids, makers, strict=True)]
    return clients, SecAggServer(SecAggConfig(clip_norm=CLIP), meta, roster=roster)


def reference(n: int) -> ClientStats:
    reference = client_stats(0)()
    for i in range(1, n):
        reference = reference + client_stats(i)()
    return reference


def run(variant: str, n: int, reference: ClientStats) -> dict[str, Any]:
    clients, server = _halves(variant, n)
    load = os.getloadavg()[0]
    t0 = time.perf_counter()
    report = run_aggregation(server, InMemoryTransport(clients))
    wall = time.perf_counter() - t0
    client_s = sum(s.client_seconds_total for s in report.stages.values())
    sent = sum(s.client_sent_bytes_mean for s in report.stages.values())
    received = sum(s.client_received_bytes_mean for s in report.stages.values())
    err = max(float(np.max(np.abs(a - b)) / max(float(np.max(np.abs(b))), 1e-300))
              for a, b in ((report.total.sums, reference.sums),
                           (report.total.scatter, reference.scatter)))
    return {"variant": variant, "clients": n, "wall_s": wall, "client_s": client_s,
            "client_s_per_client": client_s / n, "server_s": max(wall - client_s, 0.0),
            "sent_bytes_per_client": sent, "received_bytes_per_client": received,
            "rel_error": err, "params": report.params, "stages": list(report.stages),
            "protocol_version": PROTOCOL_VERSION, "ghofl_source": str(Path(ghofl.__file__).parent),
            "load_before": load, "load_after": os.getloadavg()[0]}




if __name__ == "__main__":
    n = int(sys.argv[1])
    print(json.dumps(run("now", n, reference(n)), default=str), flush=True)
