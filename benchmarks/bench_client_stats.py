"""Client statistics vs one GEMM at n = 1,000 and n = 50,000 samples per client (issue 23).

For d = 1280 and C = 10 (random float64 features in [0, 6), like post-ReLU6 embeddings, random
labels), timed side by side (:func:`ghofl.bench.harness.median_times`: each repeat runs every
step once, so a change of machine load falls on all of them alike), medians:

* *GEMM*: ``x.T @ x`` of the client's (n, d) array (numpy's rank-n update plus its mirror);
* ``client_statistics((x, y), job)`` in modes ``full`` and ``pooled``: the whole client call
  (input checks, statistics, metadata), what a client runs;
* ``compute_stats`` in the same modes: the statistics alone.

Ratios are to the GEMM of the same run. Targets (issue 23), for ``client_statistics`` in both
modes: ≤ 1.1× at n = 50,000 and ≤ 1.3× at n = 1,000. The load average before and after the
run is recorded (the machine is shared).

Writes benchmarks/results/client_stats.json and the ``client_stats`` section of BENCHMARKS.md.
Run: ``.venv/bin/python benchmarks/bench_client_stats.py [--sizes 1000 50000]
[--repeats 21 5]`` (about a minute on 2 quiet cores).
"""

from __future__ import annotations

import argparse
import os
import time
from collections.abc import Callable
from typing import Any

import numpy as np

from ghofl.bench import harness
from ghofl.bench.report import machine_summary, markdown_table
from ghofl.client.job import ClientJob, client_statistics
from ghofl.stats import compute_stats

SECTION = "client_stats"
DIM = 1280
CLASSES = 10
MODES = ("full", "pooled")
#: Target ratio to the GEMM by sample count (the largest n at or below the row's).
TARGETS = {1_000: 1.3, 50_000: 1.1}


def target_for(n: int) -> float:
    """The target ratio of a row of ``n`` samples."""
    return TARGETS[max((k for k in TARGETS if k <= n), default=min(TARGETS))]


def measure_size(n: int, repeats: int, log: Any) -> dict[str, Any]:
    """The side-by-side timings of one client size."""
    rng = np.random.default_rng(0)
    x = rng.random((n, DIM)) * 6.0
    y = rng.integers(0, CLASSES, n)
    classes = tuple(str(c) for c in range(CLASSES))
    fns: dict[str, Callable[[], Any]] = {"gemm": lambda: x.T @ x}
    for mode in MODES:
        job = ClientJob(classes=classes, mode=mode)
        fns[f"client_{mode}"] = lambda j=job: client_statistics((x, y), j)  # type: ignore[misc]
        fns[f"compute_{mode}"] = lambda m=mode: compute_stats(x, y, CLASSES, mode=m)  # type: ignore[misc]
    log(f"n = {n:,}: timing {repeats} repeats ...")
    times = harness.median_times(fns, repeats, warmup=True)
    gemm = times["gemm"][0]
    row: dict[str, Any] = {"n": n, "dim": DIM, "classes": CLASSES, "repeats": repeats,
                           "gemm_s": gemm, "target": target_for(n),
                           "samples": {k: v[1] for k, v in times.items()}}
    for name, (t, _) in times.items():
        if name != "gemm":
            row[f"{name}_s"], row[f"{name}_ratio"] = t, t / gemm
    log("  " + ", ".join(f"{k} {row[f'{k}_ratio']:.2f}x" for k in fns if k != "gemm")
        + f" (GEMM {gemm:.3f} s)")
    return row


def measure(ctx: harness.Context) -> dict[str, Any]:
    sizes, repeats = ctx.args.sizes, ctx.args.repeats
    if len(repeats) == 1:
        repeats = repeats * len(sizes)
    load_before = os.getloadavg()[0]
    rows = [measure_size(n, r, ctx.log) for n, r in zip(sizes, repeats, strict=True)]
    return {SECTION: {"machine": machine_summary(),
                      "date": time.strftime("%Y-%m-%d", time.gmtime()),
                      "load_average": [load_before, os.getloadavg()[0]], "rows": rows}}


def verdict(row: dict[str, Any]) -> str:
    """Met when ``client_statistics`` is within the target in every mode."""
    worst = max(row[f"client_{m}_ratio"] for m in MODES)
    return "met" if worst <= row["target"] else f"NOT met (worst {worst:.2f}x)"


def render(results: dict[str, Any]) -> str:
    load = results["load_average"]
    lines = [
        "## Client statistics vs one GEMM (`benchmarks/bench_client_stats.py`)", "",
        f"Measured {results['date']}. Machine: {results['machine']}; 1-minute load average "
        f"{load[0]:.1f} before the run, {load[1]:.1f} after (a machine shared with other "
        f"jobs). d = {DIM}, C = {CLASSES}, float64 features in [0, 6), random labels. Ratio = "
        "median seconds / median seconds of one `x.T @ x` on the same array, every step timed "
        "side by side in each repeat. `client_statistics` is the whole client call on an "
        "in-memory `(x, y)` (input checks included); `compute_stats` the statistics alone. "
        "Targets (issue 23), `client_statistics` in `full` and `pooled`: "
        + "; ".join(f"≤ {t:g}× at n = {n:,}" for n, t in sorted(TARGETS.items())) + ".", ""]
    body = []
    for r in results["rows"]:
        body.append([f"{r['n']:,}", str(r["repeats"]), f"{r['gemm_s']:.4f}"]
                    + [f"{r[f'{k}_{m}_ratio']:.2f}x" for k in ("client", "compute")
                       for m in MODES]
                    + [f"≤ {r['target']:g}x", verdict(r)])
    lines.append(markdown_table(
        ["n", "repeats", "GEMM s", "client_statistics full", "client_statistics pooled",
         "compute_stats full", "compute_stats pooled", "target", "verdict"], body))
    return "\n".join(lines)


def add_arguments(ap: argparse.ArgumentParser) -> None:
    ap.add_argument("--sizes", type=int, nargs="+", default=[1_000, 50_000])
    ap.add_argument("--repeats", type=int, nargs="+", default=[21, 5])


BENCH = harness.Benchmark(
    script=__file__,
    description=__doc__ or "",
    sections=(harness.Section(SECTION, "client_stats.json", render, states_machine=True),),
    measure=measure,
    add_arguments=add_arguments,
)

if __name__ == "__main__":
    harness.main(BENCH)
