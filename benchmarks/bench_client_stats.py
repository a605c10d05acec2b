"""Client statistics against their BLAS floor at n = 1,000 and n = 50,000 samples (issue 40).

For d = 1280 and C = 10 (random float64 features in [0, 6), like post-ReLU6 embeddings, random
labels), timed side by side (:func:`ghofl.bench.harness.median_times`: each repeat runs every
step once, so a change of machine load falls on all of them alike; each step
:data:`~ghofl.bench.harness.SETTLE_S` after the one before, once the BLAS threads of the step
before have parked; the steps in the orders of a Williams design, one order per repeat, so
that every step runs right after every other equally often: a step right after the floor
had run slower, whichever step it was), medians:

* the *floor* of each mode: the same products done directly in numpy, on arrays prepared
  before the timing: for ``pooled`` one GEMM ``x.T @ x``; for ``full`` one SYRK per class
  ``x_c.T @ x_c`` on the class's rows (already contiguous) plus one GEMM ``onehot.T @ x`` for
  the class sums;
* ``client_statistics((x, y), job)`` in modes ``full`` and ``pooled``: the whole client call
  (input checks, statistics, metadata), what a client runs;
* ``compute_stats`` in the same modes: the statistics alone.

Ratios are to the floor of the same mode and run. Targets (issue 40), for
``client_statistics`` in both modes: ≤ 1.3× at n = 1,000 and ≤ 1.1× at n = 50,000. The load
average is recorded by the harness beside the timings (the machine is shared).

Writes benchmarks/results/client_stats.json and the ``client_stats`` section of BENCHMARKS.md.
Run: ``.venv/bin/python benchmarks/bench_client_stats.py [--sizes 1000 50000]
[--repeats 28 14]`` (about three minutes on 2 quiet cores).
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Callable
from typing import Any

import numpy as np

from ghofl.bench import harness
from ghofl.bench.harness import SETTLE_S
from ghofl.bench.report import machine_summary, markdown_table
from ghofl.client.job import ClientJob, client_statistics
from ghofl.stats import compute_stats
from ghofl.stats.meta import Mode

SECTION = "client_stats"
DIM = 1280
CLASSES = 10
MODES: tuple[Mode, ...] = ("full", "pooled")
#: Target ratio to the floor by sample count (the largest n at or below the row's).
TARGETS = {1_000: 1.3, 50_000: 1.1}


def target_for(n: int) -> float:
    """The target ratio of a row of ``n`` samples."""
    return TARGETS[max((k for k in TARGETS if k <= n), default=min(TARGETS))]


def floors(x: np.ndarray, y: np.ndarray) -> dict[str, Callable[[], Any]]:
    """The BLAS floor of each mode on ``x`` (n, d), ``y`` (n,), its operands prepared here."""
    order = np.argsort(y, kind="stable")
    bounds = np.concatenate([[0], np.cumsum(np.bincount(y, minlength=CLASSES))])
    blocks = [np.ascontiguousarray(x[order[bounds[c] : bounds[c + 1]]]) for c in range(CLASSES)]
    onehot = np.zeros((x.shape[0], CLASSES))
    onehot[np.arange(x.shape[0]), y] = 1.0
    return {"pooled": lambda: x.T @ x,
            "full": lambda: ([b.T @ b for b in blocks], onehot.T @ x)}


def gather(x: np.ndarray, y: np.ndarray) -> Callable[[], Any]:
    """The preparation the ``full`` floor is given: every class's rows copied contiguous.

    What ``full`` statistics of rows in any order must do besides the floor's products (the
    floor's operands are prepared before the timing): the labels sorted and the rows
    gathered by class, class by class.
    """
    def run() -> list[np.ndarray]:
        order = np.argsort(y, kind="stable")
        bounds = np.concatenate([[0], np.cumsum(np.bincount(y, minlength=CLASSES))])
        return [np.ascontiguousarray(x[order[bounds[c] : bounds[c + 1]]])
                for c in range(CLASSES)]
    return run


def measure_size(n: int, repeats: int, log: Any) -> dict[str, Any]:
    """The side-by-side timings of one client size."""
    rng = np.random.default_rng(0)
    x = rng.random((n, DIM)) * 6.0
    y = rng.integers(0, CLASSES, n)
    classes = tuple(str(c) for c in range(CLASSES))
    fns: dict[str, Callable[[], Any]] = {}
    floor = floors(x, y)
    for mode in MODES:
        job = ClientJob(classes=classes, mode=mode)
        fns[f"floor_{mode}"] = floor[mode]
        fns[f"client_{mode}"] = lambda j=job: client_statistics((x, y), j)  # type: ignore[misc]
        fns[f"compute_{mode}"] = lambda m=mode: compute_stats(x, y, CLASSES, mode=m)  # type: ignore[misc]
    fns["gather_full"] = gather(x, y)
    log(f"n = {n:,}: timing {repeats} repeats ...")
    times = harness.median_times(fns, repeats, warmup=True, settle=SETTLE_S, order="balanced")
    row: dict[str, Any] = {"n": n, "dim": DIM, "classes": CLASSES, "repeats": repeats,
                           "settle_s": SETTLE_S, "order": "balanced",
                           "target": target_for(n), "samples": {k: v[1] for k, v in times.items()}}
    for name, (t, _) in times.items():
        row[f"{name}_s"] = t
    for step in ("client", "compute"):
        for mode in MODES:
            row[f"{step}_{mode}_ratio"] = times[f"{step}_{mode}"][0] / times[f"floor_{mode}"][0]
    row["client_full_gathered_ratio"] = times["client_full"][0] / (
        times["floor_full"][0] + times["gather_full"][0])
    log("  " + ", ".join(f"{k} {row[f'{k}_{m}_ratio']:.2f}x" for k in ("client", "compute")
                         for m in MODES)
        + " (floors " + ", ".join(f"{m} {row[f'floor_{m}_s']:.3f} s" for m in MODES) + ")")
    return row


def measure(ctx: harness.Context) -> dict[str, Any]:
    sizes, repeats = ctx.args.sizes, ctx.args.repeats
    if len(repeats) == 1:
        repeats = repeats * len(sizes)
    rows = [measure_size(n, r, ctx.log) for n, r in zip(sizes, repeats, strict=True)]
    return {SECTION: {"machine": machine_summary(),
                      "date": time.strftime("%Y-%m-%d", time.gmtime()), "rows": rows}}


def verdict(row: dict[str, Any]) -> str:
    """Met when ``client_statistics`` is within the target in every mode."""
    worst = max(row[f"client_{m}_ratio"] for m in MODES)
    return "met" if worst <= row["target"] else f"NOT met (worst {worst:.2f}x)"


def _settled(results: dict[str, Any]) -> str:
    """:func:`~ghofl.bench.harness.settle_sentence` of rows measured alike (else ``""``)."""
    settle = {r.get("settle_s") for r in results["rows"]}
    if len(settle) != 1:
        return ""
    orders = {harness.saved_order(r) for r in results["rows"]}
    return harness.settle_sentence(settle.pop(), orders.pop() if len(orders) == 1 else "fixed")


def render(results: dict[str, Any]) -> str:
    lines = [
        "## Client statistics vs their BLAS floor (`benchmarks/bench_client_stats.py`)", "",
        f"Measured {results['date']}. Machine: {results['machine']}; "
        f"{harness.load_sentence(results)} d = {DIM}, C = {CLASSES}, float64 features in "
        "[0, 6), random labels. Ratio = median seconds / median seconds of the mode's floor: "
        "the same products done directly in numpy on operands prepared beforehand (`pooled`: "
        "one GEMM `x.T @ x`; `full`: one SYRK `x_c.T @ x_c` per class on its rows, already "
        "contiguous, plus one GEMM `onehot.T @ x` for the class sums), every step timed side "
        "by side in each repeat" + _settled(results) + ". `client_statistics` is the whole "
        "client call on an in-memory `(x, y)` (input checks included); `compute_stats` the "
        "statistics alone. *gather*: the preparation the `full` floor is given (labels "
        "sorted, every class's rows copied contiguous), timed as a step of its own; the "
        "column after it compares `client_statistics` with the floor plus it. Targets "
        "(issue 40), `client_statistics` in `full` and `pooled`: "
        + "; ".join(f"≤ {t:g}× at n = {n:,}" for n, t in sorted(TARGETS.items())) + ".", ""]
    body = []
    for r in results["rows"]:
        body.append([f"{r['n']:,}", str(r["repeats"])]
                    + [f"{r[f'floor_{m}_s']:.4f}" for m in MODES]
                    + [f"{r[f'{k}_{m}_ratio']:.2f}x" for k in ("client", "compute")
                       for m in MODES]
                    + [f"{r['gather_full_s']:.4f}" if "gather_full_s" in r else "—",
                       f"{r['client_full_gathered_ratio']:.2f}x"
                       if "client_full_gathered_ratio" in r else "—"]
                    + [f"≤ {r['target']:g}x", verdict(r)])
    lines.append(markdown_table(
        ["n", "repeats", "floor full s", "floor pooled s", "client_statistics full",
         "client_statistics pooled", "compute_stats full", "compute_stats pooled",
         "gather s", "client_statistics full / (floor full + gather)", "target",
         "verdict"], body))
    return "\n".join(lines)


def add_arguments(ap: argparse.ArgumentParser) -> None:
    ap.add_argument("--sizes", type=int, nargs="+", default=[1_000, 50_000])
    ap.add_argument("--repeats", type=int, nargs="+", default=[28, 14],
                    help="repeats per size (multiples of 14, the length of the Williams design "
                    "of the 7 steps, keep the orders balanced)")


BENCH = harness.Benchmark(
    script=__file__,
    description=__doc__ or "",
    sections=(harness.Section(SECTION, "client_stats.json", render, states_machine=True),),
    measure=measure,
    timings=True,
    add_arguments=add_arguments,
)

if __name__ == "__main__":
    harness.main(BENCH)
