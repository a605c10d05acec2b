"""Secure aggregation with ghofl's two protocol halves, in one process.

Each "site" computes its statistics from its own data (clipped to a public bound R), the
clients and the server exchange one message per stage (advertise keys → reveal graph nonces →
share keys → masked input → consistency check → unmask) through a transport, and the server obtains only the
total, from which it fits a head. Every site has a long-term identity key, and the roster of
those keys (fixed out of band in a real federation) lets each site verify that the keys the
server relays are its peers' own. Here the transport is the in-memory one; any transport that implements
``exchange(stage, requests) -> iterator of (client_id, reply)`` works the same way.

Run it with ``python examples/secure_aggregation.py``.
"""

from __future__ import annotations

import tempfile
from pathlib import Path

import numpy as np

from ghofl.heads import make_head
from ghofl.secure import (
    IdentityKey,
    InMemoryTransport,
    Roster,
    RoundLedger,
    SecAggClient,
    SecAggConfig,
    SecAggServer,
    run_aggregation,
)
from ghofl.stats import compute_stats, sum_stats


def main() -> None:
    rng = np.random.default_rng(0)
    num_classes, dim, clip = 3, 16, 8.0
    means = rng.normal(scale=2.0, size=(num_classes, dim))

    def site_data(n: int) -> tuple[np.ndarray, np.ndarray]:
        y = rng.integers(0, num_classes, n)
        return means[y] + rng.normal(size=(n, dim)), y

    # 1. On each site: statistics of its own data, clipped to the public bound R.
    payloads = [compute_stats(*site_data(200), num_classes, "pooled", clip_norm=clip)
                for _ in range(8)]

    # 2. Identities: each site's key pair, and the federation's roster of public keys.
    keys = {f"site-{i}": IdentityKey.generate() for i in range(len(payloads))}
    roster = Roster.from_identities(keys)
    print(f"roster fingerprint: {roster.fingerprint().hex()[:16]}")

    # 3. The two halves: one client object per site, one server. A real site keeps its round
    #    ledger (by default under ~/.local/state/ghofl/ledgers: it refuses a reused round id and
    #    a second round over the same data); these demo sites draw the same data on every run,
    #    so each run gives them fresh ledgers.
    with tempfile.TemporaryDirectory() as state:
        clients = [SecAggClient(c, stats, identity=keys[c], roster=roster,
                                ledger=RoundLedger(Path(state) / f"{c}.json"))
                   for c, stats in zip(keys, payloads, strict=True)]
        server = SecAggServer(SecAggConfig(clip_norm=clip), payloads[0].meta, roster=roster)

        # 4. Run the six stages; two sites vanish after sending their masked input.
        report = run_aggregation(server, InMemoryTransport(clients, drops={"unmask": 2}))

    # 5. The server has the exact total and nothing else.
    exact = sum_stats(payloads)
    error = float(np.max(np.abs(report.total.sums - exact.sums)) / np.max(np.abs(exact.sums)))
    print(f"survivors: {len(report.survivors)}, dropped: {report.dropped}")
    print(f"relative error of the secure sum: {error:.1e}")
    for stage, s in report.stages.items():
        print(f"  {stage:11s} server {s.server_seconds * 1e3:7.1f} ms, each client sent "
              f"{s.client_sent_bytes_mean / 1e3:8.1f} kB")

    head = make_head("lda").fit_from_stats(report.total)
    x_test, y_test = site_data(1000)
    print(f"LDA accuracy from the secure total: {np.mean(head.predict(x_test) == y_test):.3f}")


if __name__ == "__main__":
    main()
