"""Secure aggregation with ghofl's two protocol halves, in one process.

Each "site" computes its statistics from its own data (clipped to a public bound R), the
clients and the server exchange one message per stage (advertise keys → share keys → masked
input → unmask) through a transport, and the server obtains only the total, from which it fits
a head. Here the transport is the in-memory one; any transport that implements
``exchange(stage, requests) -> iterator of (client_id, reply)`` works the same way.

Run it with ``python examples/secure_aggregation.py``.
"""

from __future__ import annotations

import numpy as np

from ghofl.heads import make_head
from ghofl.secure import (
    InMemoryTransport,
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

    # 2. The two halves: one client object per site, one server.
    clients = [SecAggClient(f"site-{i}", stats) for i, stats in enumerate(payloads)]
    server = SecAggServer(SecAggConfig(clip_norm=clip), payloads[0].meta,
                          [c.client_id for c in clients])

    # 3. Run the four stages; two sites vanish after sending their masked input.
    report = run_aggregation(server, InMemoryTransport(clients, drops={"unmask": 2}))

    # 4. The server has the exact total and nothing else.
    exact = sum_stats(payloads)
    error = float(np.max(np.abs(report.total.sums - exact.sums)) / np.max(np.abs(exact.sums)))
    print(f"survivors: {len(report.survivors)}, dropped: {report.dropped}")
    print(f"relative error of the secure sum: {error:.1e}")
    for stage, s in report.stages.items():
        print(f"  {stage:9s} server {s.server_seconds * 1e3:7.1f} ms, each client sent "
              f"{s.client_sent_bytes_mean / 1e3:8.1f} kB")

    head = make_head("lda").fit_from_stats(report.total)
    x_test, y_test = site_data(1000)
    print(f"LDA accuracy from the secure total: {np.mean(head.predict(x_test) == y_test):.3f}")


if __name__ == "__main__":
    main()
