"""What the actively secure protocol costs, side by side with the protocol it replaced.

Three runs over the same clients' statistics (C = 10, d = 512, mode ``pooled``, 200 samples per
client), one after another in one process:

* ``plain``: the statistics in the clear (the floor);
* ``before``: the protocol as it was before identities (no roster, no signatures, a strict
  majority threshold and the old degree 2·⌈1.5·log2 n⌉; the consistency exchange runs but is
  not checked against signatures);
* ``now``: the default protocol: identity keys on one roster (signed keys, shares and survivor
  sets, the consistency check), the default threshold ⌊(n + ⌊n/3⌋)/2⌋ + 1, and the graph
  sized for exposure ≤ 2^-40 and abort ≤ 2^-20 at γ = δ = 1/3.

Clients run one after another, so "client s" adds up every client's time; per client it is
that sum over n. Bytes are message content per client. Exactness is the relative error of the
secure total against the float64 sum of the same statistics.

Writes benchmarks/results/secure_cost.json and the ``secure_cost`` section of BENCHMARKS.md.
Run: ``.venv/bin/python benchmarks/bench_secure_cost.py [--clients 100 1000]``.
"""

from __future__ import annotations

import argparse
import math
import time
from collections.abc import Callable
from typing import Any

import numpy as np

from ghofl.bench import harness
from ghofl.bench.report import machine_summary, markdown_table
from ghofl.secure import (
    ClientPolicy,
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
from ghofl.stats import ClientStats, compute_stats
from ghofl.stats.accumulate import StatsAccumulator

SECTION = "secure_cost"
CLIP = 30.0
D, C, N = 512, 10, 200


def _stats(i: int) -> Callable[[], ClientStats]:
    def make() -> ClientStats:
        rng = np.random.default_rng(1000 + i)
        y = rng.integers(0, C, N)
        x = rng.normal(size=(N, D)) + y[:, None] * 0.05
        return compute_stats(x, y, C, "pooled", clip_norm=CLIP)
    return make


def _old_degree(n: int) -> int:
    k = 2 * math.ceil(1.5 * math.log2(n))
    return n - 1 if k >= n - 1 else k


def _halves(variant: str, n: int) -> tuple[list[Any], Any]:
    ids = [f"c{i:05d}" for i in range(n)]
    makers = [_stats(i) for i in range(n)]
    meta = StatsAccumulator(C, D, "pooled", clip_norm=CLIP).meta  # type: ignore[arg-type]
    if variant == "plain":
        return [PlainClient(c, m) for c, m in zip(ids, makers, strict=True)], PlainServer(ids, meta)
    if variant == "before":
        lax = {"corrupt_fraction": 0.0, "dropout_fraction": 0.0, "sigma": 1.0, "eta": 1.0}
        cfg = SecAggConfig(clip_norm=CLIP, threshold=n // 2 + 1, neighbours=_old_degree(n),
                           **lax)  # type: ignore[arg-type]
        policy = ClientPolicy(allow_unauthenticated=True, trust_server=True,
                              min_neighbours=1, **lax)  # type: ignore[arg-type]
        clients = [SecAggClient(c, m, meta=meta, policy=policy)
                   for c, m in zip(ids, makers, strict=True)]
        return clients, SecAggServer(cfg, meta, ids)
    keys = {c: IdentityKey.generate() for c in ids}
    roster = Roster.from_identities(keys)
    clients = [SecAggClient(c, m, meta=meta, identity=keys[c], roster=roster)
               for c, m in zip(ids, makers, strict=True)]
    return clients, SecAggServer(SecAggConfig(clip_norm=CLIP), meta, roster=roster)


def _run(variant: str, n: int, reference: ClientStats) -> dict[str, Any]:
    clients, server = _halves(variant, n)
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
            "rel_error": err, "params": report.params}


def measure(ctx: harness.Context) -> dict[str, Any]:
    rows = []
    for n in ctx.args.clients:
        reference = _stats(0)()
        for i in range(1, n):
            reference = reference + _stats(i)()
        for variant in ("plain", "before", "now"):
            ctx.log(f"n = {n}: {variant} ...")
            rows.append(_run(variant, n, reference))
            r = rows[-1]
            ctx.log(f"  wall {r['wall_s']:.1f} s, client {r['client_s']:.1f} s, server "
                    f"{r['server_s']:.1f} s, sent {r['sent_bytes_per_client'] / 1e3:.1f} kB")
    return {SECTION: {"machine": machine_summary(),
                      "date": time.strftime("%Y-%m-%d", time.gmtime()), "rows": rows}}


def render(results: dict[str, Any]) -> str:
    lines = [f"Measured {results['date']}. Machine: {results['machine']}. C = {C}, d = {D}, "
             f"mode `pooled`, {N} samples per client, R = {CLIP:g}, 2 limbs; clients run one "
             "after another in one process (client seconds add up; per client is that sum "
             "over n). `before`: no roster or signatures, strict majority, degree "
             "2·⌈1.5·log2 n⌉; `now`: the default authenticated protocol (signed keys, shares "
             "and survivor sets, consistency check, threshold ⌊(n + ⌊n/3⌋)/2⌋ + 1, graph "
             "sized for exposure ≤ 2^-40 and abort ≤ 2^-20 at γ = δ = 1/3).", ""]
    plain = {r["clients"]: r for r in results["rows"] if r["variant"] == "plain"}
    body = []
    for r in results["rows"]:
        p = plain[r["clients"]]
        params = r["params"] or {}
        body.append([
            f"{r['clients']:,}", r["variant"], params.get("threshold", "–"),
            params.get("neighbours", "–"), f"{r['wall_s']:.2f}", f"{r['server_s']:.2f}",
            f"{r['client_s_per_client']:.3f}", f"{r['sent_bytes_per_client'] / 1e3:,.1f}",
            f"{r['sent_bytes_per_client'] / p['sent_bytes_per_client']:.2f}x",
            f"{r['received_bytes_per_client'] / 1e3:,.1f}", f"{r['rel_error']:.1e}"])
    lines.append(markdown_table(
        ["clients", "protocol", "t", "k", "wall s", "server s", "s per client",
         "sent kB/client", "sent vs plain", "received kB/client", "rel. error vs float64 sum"],
        body))
    return "\n".join(lines)


def add_arguments(ap: argparse.ArgumentParser) -> None:
    ap.add_argument("--clients", type=int, nargs="+", default=[100, 1000])


BENCH = harness.Benchmark(
    script=__file__,
    description=__doc__ or "",
    sections=(harness.Section(SECTION, "secure_cost.json", render, states_machine=True),),
    measure=measure,
    add_arguments=add_arguments,
)

if __name__ == "__main__":
    harness.main(BENCH)
