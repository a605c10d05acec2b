"""Sizing of the SecAgg+ communication graph: exposure and abort per honest client per round.

For n = 100, 1,000, 10,000 and 100,000 clients at the default corrupt and dropout fractions
(γ = δ = 1/3) and targets (exposure ≤ 2^-40, abort ≤ 2^-20), this script computes the degree
k and share threshold t_s that ``ghofl.secure.graph_params.required_parameters`` chooses, the
exact exposure and abort probabilities (log2), the bounds on the survivors' (and the honest
survivors') subgraph being disconnected, and the same figures for the degree used before
issue 19 (2·⌈1.5·log2 n⌉ with t_s = ⌈(k + 1)·t / n⌉). At n ≤ 1,000 it confirms the model by
Monte Carlo with the real graph code (``HararyGraph`` seeded per trial, a fresh random corrupt
set and dropout set, every client counted): the measured tail P(C ≥ t) at thresholds where it
is large enough to see, and the exposures, aborts and disconnected survivor sets observed at
the chosen (k, t_s). It also times the graph's construction and the survivors' connectivity
check (``reveals_partial_sum``) at each n.

Writes benchmarks/results/secure_graph.json and the ``secure_graph`` section of BENCHMARKS.md.

Run: ``.venv/bin/python benchmarks/bench_secure_graph.py`` (about a minute on 2 cores).
"""

from __future__ import annotations

import argparse
import math
import time
from typing import Any

import numpy as np
from numpy.typing import NDArray

from ghofl.bench import harness
from ghofl.bench.report import machine_summary, markdown_table
from ghofl.secure.graph import HararyGraph, reveals_partial_sum
from ghofl.secure.graph_params import (
    count_of,
    graph_risk,
    log2_hypergeom_sf,
    required_parameters,
)

SECTION = "secure_graph"
SIZES = (100, 1_000, 10_000, 100_000)
GAMMA = DELTA = 1.0 / 3.0
SIGMA, ETA = 40.0, 20.0


def old_defaults(n: int) -> tuple[int, int]:
    """Degree and share threshold of the protocol before issue 19."""
    k = 2 * math.ceil(1.5 * math.log2(n))
    if k >= n - 1:
        return n - 1, n // 2 + 1
    return k, max(2, math.ceil((k + 1) * (n // 2 + 1) / n))


def window_counts(graph: HararyGraph, marked: NDArray[np.bool_]) -> NDArray[np.int64]:
    """For every client, how many of its neighbours on ``graph`` are marked; shape (n,).

    Uses the ring order of the real graph (a window of ``half`` positions on either side)."""
    n, h = graph.n, graph.half
    pos = graph.positions(range(n))
    ring = np.zeros(n, dtype=np.int64)
    ring[pos] = marked
    ext = np.concatenate([ring[-h:], ring, ring[:h]])
    csum = np.concatenate([[0], np.cumsum(ext)])
    per_pos = csum[2 * h + 1:] - csum[: n] - ring  # window [p - h, p + h] minus p itself
    return per_pos[pos]


def monte_carlo(n: int, k: int, t_s: int, trials: int, seed: int) -> dict[str, Any]:
    """Per trial: a fresh public seed, ⌊γn⌋ corrupt and ⌊δn⌋ dropped clients drawn at random
    (independently); every client's corrupt and dropped neighbours on the real graph."""
    rng = np.random.default_rng(seed)
    c, d = count_of(GAMMA, n), count_of(DELTA, n)
    hist = np.zeros((trials, k + 1), dtype=np.int64)  # corrupt neighbours, honest clients
    exposed = aborted = samples = alive_samples = cut = checked = old_exposed = 0
    k0, t0_s = old_defaults(n)
    t0 = time.perf_counter()
    for r in range(trials):
        graph = HararyGraph(n, k, rng.bytes(16))
        corrupt = np.zeros(n, dtype=bool)
        corrupt[rng.choice(n, size=c, replace=False)] = True
        dropped = np.zeros(n, dtype=bool)
        dropped[rng.choice(n, size=d, replace=False)] = True
        cn, dn = window_counts(graph, corrupt), window_counts(graph, dropped)
        if r < 3:  # the window counts are the real neighbourhoods
            for i in rng.choice(n, size=5, replace=False).tolist():
                assert cn[i] == sum(corrupt[j] for j in graph.neighbours(i))
        honest, alive = ~corrupt, ~dropped
        hist[r] = np.bincount(cn[honest], minlength=k + 1)
        old = window_counts(HararyGraph(n, k0, rng.bytes(16)), corrupt)
        old_exposed += int((old[honest] >= t0_s).sum())
        exposed += int((cn[honest] >= t_s).sum())
        aborted += int((k + 1 - dn[honest & alive] < t_s).sum())
        samples += int(honest.sum())
        alive_samples += int((honest & alive).sum())
        if r % 10 == 0:  # the connectivity check on the survivors, on a tenth of the trials
            cut += reveals_partial_sum(graph, np.flatnonzero(alive).tolist())
            checked += 1
    # per round, the fraction of honest clients with C >= t; clients of one round are
    # correlated (neighbours on the ring share most neighbours), so the standard error comes
    # from the spread across rounds
    per_round = np.cumsum(hist[:, ::-1], axis=1)[:, ::-1] / hist.sum(axis=1, keepdims=True)
    rows = []
    for t in range(1, k + 1):
        p = 2.0 ** log2_hypergeom_sf(t, n - 1, c, k)
        if 1e-5 <= p <= 0.5:
            se = float(per_round[:, t].std(ddof=1)) / math.sqrt(trials)
            rows.append({"t": t, "exact": p, "measured": float(per_round[:, t].mean()),
                         "se": max(se, math.sqrt(p * (1 - p) / samples))})
    old_p = 2.0 ** log2_hypergeom_sf(t0_s, n - 1, c, k0)
    risk = graph_risk(n, k, t_s, GAMMA, DELTA)
    return {"trials": trials, "client_samples": samples, "exposed": exposed,
            "expected_exposed": samples * 2.0 ** risk.log2_exposure_,
            "expected_aborted": alive_samples * 2.0 ** risk.log2_abort_,
            "surviving_samples": alive_samples,
            "old_k": k0, "old_t_s": t0_s, "old_exposed": old_exposed, "old_exact": old_p,
            "aborted": aborted, "survivor_checks": checked, "disconnected": int(cut),
            "tail": rows[:: max(1, len(rows) // 6)], "seconds": time.perf_counter() - t0}


def time_check(n: int, k: int, repeats: int = 5) -> dict[str, float]:
    """Seconds to build the graph and to check the survivors' connectivity (median)."""
    rng = np.random.default_rng(n)
    build, check = [], []
    for _ in range(repeats):
        t0 = time.perf_counter()
        graph = HararyGraph(n, k, rng.bytes(16))
        build.append(time.perf_counter() - t0)
        alive = rng.permutation(n)[: n - count_of(DELTA, n)].tolist()
        t0 = time.perf_counter()
        reveals_partial_sum(graph, alive)
        check.append(time.perf_counter() - t0)
    return {"build_s": float(np.median(build)), "check_s": float(np.median(check))}


def row(n: int, args: argparse.Namespace) -> dict[str, Any]:
    k, t_s = required_parameters(n, GAMMA, DELTA, SIGMA, ETA)
    risk = graph_risk(n, k, t_s, GAMMA, DELTA)
    k0, t0 = old_defaults(n)
    old = graph_risk(n, k0, t0, GAMMA, DELTA)
    out: dict[str, Any] = {
        "n": n, "k": k, "t_s": t_s, "log2_exposure": risk.log2_exposure_,
        "log2_abort": risk.log2_abort_, "log2_cut_survivors": risk.log2_cut_survivors_,
        "log2_cut_honest": risk.log2_cut_honest_, "old_k": k0, "old_t_s": t0,
        "old_log2_exposure": old.log2_exposure_, "old_log2_abort": old.log2_abort_,
        **time_check(n, k),
    }
    if n <= 1_000:
        trials = args.trials if n >= 1_000 else args.trials * 10
        out["monte_carlo"] = monte_carlo(n, k, t_s, trials, seed=args.seed + n)
    return out


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--trials", type=int, default=5_000,
                        help="Monte Carlo rounds at n = 1,000 (ten times as many at n = 100)")
    parser.add_argument("--seed", type=int, default=0)


def measure(ctx: harness.Context) -> dict[str, Any]:
    rows = []
    for n in SIZES:
        rows.append(row(n, ctx.args))
        r = rows[-1]
        ctx.log(f"n={n}: k={r['k']} t_s={r['t_s']} log2 exposure {r['log2_exposure']:.1f} "
                f"abort {r['log2_abort']:.1f}")
    return {SECTION: {"machine": machine_summary(), "date": time.strftime("%Y-%m-%d"),
                      "gamma": GAMMA, "delta": DELTA,
                      "sigma": SIGMA, "eta": ETA, "seed": ctx.args.seed, "rows": rows}}


def _l2(x: float) -> str:
    return "−∞" if x == -math.inf else f"{x:.1f}"


def render(res: dict[str, Any]) -> str:
    rows = res["rows"]
    sizing = markdown_table(
        ["n", "k", "t_s", "log2 P(exposed)", "log2 P(abort)", "log2 P(survivors cut) ≤",
         "log2 P(honest survivors cut) ≤", "masks per client (complete: n − 1)",
         "build graph (s)", "connectivity check (s)"],
        [[f"{r['n']:,}", r["k"], r["t_s"], _l2(r["log2_exposure"]), _l2(r["log2_abort"]),
          _l2(r["log2_cut_survivors"]), _l2(r["log2_cut_honest"]),
          f"{r['k']} ({r['n'] - 1:,})", f"{r['build_s']:.4f}", f"{r['check_s']:.4f}"]
         for r in rows])
    before = markdown_table(
        ["n", "old k", "old t_s", "log2 P(exposed)", "log2 P(abort)"],
        [[f"{r['n']:,}", r["old_k"], r["old_t_s"], _l2(r["old_log2_exposure"]),
          _l2(r["old_log2_abort"])] for r in rows])
    mc_rows, tails = [], []
    for r in rows:
        mc = r.get("monte_carlo")
        if mc is None:
            continue
        mc_rows.append([f"{r['n']:,}", f"{mc['trials']:,}", f"{mc['client_samples']:,}",
                        f"{mc['exposed']} (expected {mc['expected_exposed']:.1e})",
                        f"{mc['aborted']} of {mc['surviving_samples']:,} (expected "
                        f"{mc['expected_aborted']:.2f})",
                        f"{mc['old_exposed']:,} ({mc['old_exposed'] / mc['client_samples']:.2%};"
                        f" exact {mc['old_exact']:.2%})",
                        f"{mc['disconnected']} of {mc['survivor_checks']:,}",
                        f"{mc['seconds']:.0f}"])
        tails += [[f"{r['n']:,}", t["t"], f"{t['exact']:.3e}", f"{t['measured']:.3e}",
                   f"{(t['measured'] - t['exact']) / t['se']:+.1f}"] for t in mc["tail"]]
    mc_table = markdown_table(
        ["n", "rounds", "honest client-rounds", "exposed", "aborted",
         "exposed on the old graph", "survivor sets disconnected", "seconds"], mc_rows)
    tail_table = markdown_table(
        ["n", "t", "exact P(C ≥ t)", "measured", "(measured − exact) / s.e."], tails)
    return (
        f"Measured {res['date']}. Machine: {res['machine']}. "
        f"Corrupt fraction γ = {res['gamma']:.3g}, dropout fraction δ = {res['delta']:.3g}; "
        f"targets exposure ≤ 2^-{res['sigma']:g} and abort ≤ 2^-{res['eta']:g} per honest "
        "client per round. C is the number of corrupt neighbours of an honest client "
        "(exposed when C ≥ t_s); it aborts when fewer than t_s of its k + 1 share holders "
        "(itself included) survive. The cut columns are union "
        "bounds (two runs of ⌈k/2⌉ removed clients on the ring); the honest-survivors cut "
        "removes corrupt and dropped clients together.\n\n"
        f"{sizing}\n\nThe degree used before (2·⌈1.5·log2 n⌉, t_s = ⌈(k + 1)·t/n⌉):\n\n"
        f"{before}\n\nMonte Carlo with the real graph code (a fresh public seed, corrupt set "
        "and dropout set per round; every honest client counted; the connectivity check on "
        f"every tenth round's survivors), seed {res['seed']}. Expected counts are the exact "
        "probabilities times the client-rounds; clients of one round share most of their "
        f"neighbours, so events cluster and counts vary more than Poisson's:\n\n{mc_table}\n\n"
        f"The measured tail of C against the exact hypergeometric tail, where it is large "
        f"enough to measure:\n\n{tail_table}\n\nCost: each client agrees keys with, shares its "
        "secrets among and expands one pairwise mask per neighbour, so its work and bytes grow "
        "with k, which stops growing with n (the neighbourhoods become samples with "
        "replacement), instead of n − 1 on the complete graph."
    )


BENCH = harness.Benchmark(
    script=__file__,
    description=__doc__ or "",
    sections=(harness.Section(SECTION, "secure_graph.json", render),),
    measure=measure,
    add_arguments=add_arguments,
)

if __name__ == "__main__":
    harness.main(BENCH)
