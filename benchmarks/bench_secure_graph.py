"""Sizing of the SecAgg+ communication graph: exposure and abort per honest client per round.

For n = 100, 1,000, 10,000 and 100,000 clients at the default corrupt and dropout fractions
(γ = δ = 1/3) and targets (exposure ≤ 2^-40, abort ≤ 2^-20), this script computes the degree
k and share threshold t_s that ``ghofl.secure.graph_params.required_parameters`` chooses for
all n relayed (the advertised parameters), the exact exposure and abort probabilities (log2),
the bounds on the survivors' (and the honest survivors') subgraph being disconnected, and the
same figures for the degree used before issue 19 (2·⌈1.5·log2 n⌉ with t_s = ⌈(k + 1)·t / n⌉).
At n ≤ 1,000 it confirms the model by Monte Carlo with the real graph code (``HararyGraph``
seeded per trial, a fresh random corrupt set and dropout set, every client counted): the
measured tail P(C ≥ t) at thresholds where it is large enough to see, and the exposures,
aborts and disconnected survivor sets observed at the chosen (k, t_s). It also times the
graph's construction and the survivors' connectivity check (``reveals_partial_sum``) at each n.

A second part covers the **relayed set**: the server relays m ≥ m_min = n − ⌊δ·n⌋ clients and
both halves derive (k, t_s) for m (``SessionParams.relayed``) with every corrupt client relayed
and ⌊δ·n⌋ − (n − m) dropouts still to come. For n from 100 to 100,000 it lists m_min, the
parameters and risks at m = n and at m = m_min, the worst exposure and abort over a grid of
relayed sizes (every m up to n = 1,000), and the exposure the advertised parameters would have
if kept for m_min relayed clients. At n ≤ 1,000 it builds the real graph over m_min clients
(with the parameters derived for it) and over all n (the advertised ones), a fresh random seed
per draw and the corrupt clients placed uniformly, and compares the honest clients'
corrupt-neighbour counts with the exact pmf: mean, the largest count seen against t_s, a
chi-square test and the total-variation distance on one client per draw (independent draws),
and the tail at lower thresholds where events are seen.

Writes benchmarks/results/secure_graph.json and secure_graph_relayed.json, and the
``secure_graph`` and ``secure_graph_relayed`` sections of BENCHMARKS.md.

Run: ``.venv/bin/python benchmarks/bench_secure_graph.py [--part sizing|relayed]`` (about four
minutes on 2 cores).
"""

from __future__ import annotations

import argparse
import math
import os
import time
from typing import Any

import numpy as np
from numpy.typing import NDArray

from ghofl.bench import harness
from ghofl.bench.report import machine_summary, markdown_table
from ghofl.secure.config import SecAggConfig
from ghofl.secure.graph import HararyGraph, reveals_partial_sum
from ghofl.secure.graph_params import (
    count_of,
    graph_degree,
    graph_risk,
    log2_exposure,
    log2_hypergeom_sf,
    min_relayed,
    relayed_counts,
    required_parameters,
)
from ghofl.secure.policy import ClientPolicy

SECTION = "secure_graph"
RELAYED = "secure_graph_relayed"
SIZES = (100, 1_000, 10_000, 100_000)
RELAYED_SIZES = (100, 200, 500, 1_000, 2_000, 5_000, 10_000, 100_000)
SIMULATED = 1_000  # the real graph is simulated (and every relayed size examined) up to this n
GRID_POINTS = 9  # relayed sizes examined strictly between m_min and n above SIMULATED
TAIL_LEVELS = (1e-4, 1e-6)  # tails measured where the exact P(C ≥ t) first falls below these
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
    return np.asarray(per_pos[pos], dtype=np.int64)


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
        aborted += int((k - dn[honest & alive] < t_s).sum())  # own share not counted
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
    parser.add_argument("--draws", type=int, default=200_000,
                        help="graphs drawn per n and relayed size for the relayed-set "
                             "simulation")
    parser.add_argument("--part", choices=("all", "sizing", "relayed"), default="all",
                        help="measure only one section (the other keeps its saved results)")
    parser.add_argument("--seed", type=int, default=0)


def measure(ctx: harness.Context) -> dict[str, Any]:
    out: dict[str, Any] = {}
    if ctx.args.part in ("all", "sizing"):
        load = os.getloadavg()[0]
        rows = []
        for n in SIZES:
            rows.append(row(n, ctx.args))
            r = rows[-1]
            ctx.log(f"n={n}: k={r['k']} t_s={r['t_s']} log2 exposure {r['log2_exposure']:.1f} "
                    f"abort {r['log2_abort']:.1f}")
        out[SECTION] = {"machine": machine_summary(), "date": time.strftime("%Y-%m-%d"),
                        "gamma": GAMMA, "delta": DELTA, "load_average": [load, os.getloadavg()[0]],
                        "sigma": SIGMA, "eta": ETA, "seed": ctx.args.seed, "rows": rows}
    if ctx.args.part in ("all", "relayed"):
        out[RELAYED] = measure_relayed(ctx)
    return out


# ---------------------------------------------------------------------- relayed sets
def relayed_grid(n: int) -> list[int]:
    """The relayed sizes examined: every m in [m_min, n] up to n = 1,000, else m_min, n and
    GRID_POINTS evenly spaced between."""
    lo = min_relayed(n, DELTA)
    if n <= SIMULATED:
        return list(range(lo, n + 1))
    step = GRID_POINTS + 1
    return sorted({lo, n, *(lo + ((n - lo) * j + step // 2) // step for j in range(1, step))})


def corrupt_counts(graph: HararyGraph, corrupt: NDArray[np.bool_]) -> NDArray[np.int64]:
    """Every client's corrupt neighbours on ``graph`` (the complete graph included)."""
    if graph.complete:
        return np.full(graph.n, int(corrupt.sum()), dtype=np.int64) - corrupt
    return window_counts(graph, corrupt)


def exact_pmf(m: int, c: int, d: int) -> NDArray[np.float64]:
    """P(C = j), j = 0 … d, for C ~ Hypergeometric(m − 1, c, d) (scipy)."""
    from scipy.stats import hypergeom

    return np.asarray(hypergeom.pmf(np.arange(d + 1), m - 1, c, d), dtype=np.float64)


def goodness_of_fit(sample: NDArray[np.int64], pmf: NDArray[np.float64],
                    rng: np.random.Generator) -> dict[str, float]:
    """Chi-square p-value and total-variation distance of independent draws against ``pmf``.

    Bins with fewer than 5 expected are merged into their neighbours; the TV distance of as
    many draws from the exact pmf itself (median of 5) is the noise level to compare with.
    """
    from scipy.stats import chisquare

    size = sample.size
    obs = np.bincount(sample, minlength=pmf.size).astype(np.float64)
    exp = pmf * size
    edges, acc = [], 0.0  # merge low bins left to right, then fold a short tail into the last
    for j in range(pmf.size):
        acc += exp[j]
        if acc >= 5.0:
            edges.append(j + 1)
            acc = 0.0
    starts = [0, *edges[:-1]]  # a short tail past the last full bin joins that bin
    o, e = np.add.reduceat(obs, starts), np.add.reduceat(exp, starts)
    p_value = float(chisquare(o, e * o.sum() / e.sum()).pvalue) if o.size > 1 else 1.0
    tv = 0.5 * float(np.abs(obs / size - pmf).sum())
    ref = [0.5 * float(np.abs(np.bincount(rng.choice(pmf.size, size=size, p=pmf / pmf.sum()),
                                          minlength=pmf.size) / size - pmf).sum())
           for _ in range(5)]
    return {"chi2_p": p_value, "chi2_bins": int(o.size), "tv": tv,
            "tv_iid": float(np.median(ref))}


def simulate_relayed(n: int, m: int, k: int, t_s: int, draws: int,
                     seed: int) -> dict[str, Any]:
    """The real graph over m relayed clients, every corrupt client among them (placed
    uniformly), per draw a fresh seed; the honest clients' corrupt-neighbour counts."""
    rng = np.random.default_rng(seed)
    c = relayed_counts(n, m, GAMMA, DELTA)[0]
    d = graph_degree(m, k)
    pooled = np.zeros(d + 1, dtype=np.int64)
    one = np.empty(draws, dtype=np.int64)  # one random honest client per draw: independent
    pmf = exact_pmf(m, c, d)
    tail = np.append(np.cumsum(pmf[::-1])[::-1], 0.0)  # P(C ≥ j), j = 0 … d + 1
    lows = sorted({int(np.nonzero(tail <= level)[0][0]) for level in TAIL_LEVELS})
    per_draw = np.empty((draws, len(lows)))  # fraction of honest clients with C ≥ t, per draw
    t0 = time.perf_counter()
    for r in range(draws):
        graph = HararyGraph(m, k, rng.bytes(16))
        corrupt = np.zeros(m, dtype=bool)
        corrupt[rng.choice(m, size=c, replace=False)] = True
        cn = corrupt_counts(graph, corrupt)
        if r < 3:  # the counts are the real neighbourhoods
            for i in rng.choice(m, size=5, replace=False).tolist():
                assert cn[i] == sum(corrupt[j] for j in graph.neighbours(i))
        honest = cn[~corrupt]
        pooled += np.bincount(honest, minlength=d + 1)
        one[r] = honest[rng.integers(honest.size)]
        per_draw[r] = [(honest >= t).mean() for t in lows]
    samples = int(pooled.sum())
    seen = int(np.nonzero(pooled)[0].max())
    tails = [{"t": t, "exact": float(tail[t]), "measured": float(per_draw[:, i].mean()),
              "se": max(float(per_draw[:, i].std(ddof=1)) / math.sqrt(draws),
                        math.sqrt(max(tail[t] * (1 - tail[t]), 1e-300) / samples))}
             for i, t in enumerate(lows)]
    return {"m": m, "k": k, "t_s": t_s, "c": c, "degree": d, "draws": draws,
            "client_samples": samples, "exposed": int(pooled[t_s:].sum()),
            "mean": float(pooled @ np.arange(d + 1)) / samples, "exact_mean": d * c / (m - 1),
            "max_seen": seen, "exact_p_max_seen": float(tail[seen]),
            "tail": tails,
            "tv_pooled": 0.5 * float(np.abs(pooled / samples - pmf).sum()),
            **goodness_of_fit(one, pmf, rng), "seconds": time.perf_counter() - t0}


def relayed_row(n: int, args: argparse.Namespace) -> dict[str, Any]:
    """The advertised (k, t_s) at m = n, the (k, t_s) each relayed size m ≥ m_min derives
    (``SessionParams.relayed``, as clients and server do), their risks, and what the advertised
    ones would risk if kept at m_min."""
    t0 = time.perf_counter()
    params = SecAggConfig(clip_norm=1.0, corrupt_fraction=GAMMA, dropout_fraction=DELTA,
                          sigma=SIGMA, eta=ETA).for_clients(n)
    k, t_s = params.neighbours, params.share_threshold
    assert (k, t_s) == required_parameters(n, GAMMA, DELTA, SIGMA, ETA)
    lo = min_relayed(n, DELTA)
    grid = relayed_grid(n)
    per_m: list[dict[str, Any]] = []
    for m in grid:
        k_m, t_m = params.relayed(m)
        risk = graph_risk(n, k_m, t_m, GAMMA, DELTA, relayed=m)
        per_m.append({"m": m, "k": k_m, "t_s": t_m, "exposure": risk.log2_exposure_,
                      "abort": risk.log2_abort_, "cut_honest": risk.log2_cut_honest_,
                      "cut_survivors": risk.log2_cut_survivors_,
                      "refused": ClientPolicy().relayed_problem(params, m) is not None})
    at_n, at_lo = per_m[-1], per_m[0]
    assert at_n["m"] == n and at_lo["m"] == lo
    worst_e = max(per_m, key=lambda r: r["exposure"])
    worst_a = max(per_m, key=lambda r: r["abort"])
    out: dict[str, Any] = {
        "n": n, "m_min": lo, "corrupt": count_of(GAMMA, n), "dropouts": count_of(DELTA, n),
        "k": k, "t_s": t_s, "log2_exposure": at_n["exposure"], "log2_abort": at_n["abort"],
        "m_min_k": at_lo["k"], "m_min_t_s": at_lo["t_s"],
        "m_min_log2_exposure": at_lo["exposure"], "m_min_log2_abort": at_lo["abort"],
        "grid": len(grid), "grid_k_min": min(r["k"] for r in per_m),
        "grid_k_max": max(r["k"] for r in per_m),
        "worst_log2_exposure": worst_e["exposure"], "worst_exposure_m": worst_e["m"],
        "worst_log2_abort": worst_a["abort"], "worst_abort_m": worst_a["m"],
        "worst_log2_cut_honest": max(r["cut_honest"] for r in per_m),
        "worst_log2_cut_survivors": max(r["cut_survivors"] for r in per_m),
        "refused": sum(r["refused"] for r in per_m),
        "kept_log2_exposure_m_min": log2_exposure(n, k, t_s, GAMMA, relayed=lo),
        "grid_seconds": time.perf_counter() - t0,
    }
    if n <= SIMULATED:
        out["simulation"] = [
            simulate_relayed(n, lo, at_lo["k"], at_lo["t_s"], args.draws, seed=args.seed + 7 * n),
            simulate_relayed(n, n, k, t_s, args.draws, seed=args.seed + 7 * n + 1),
        ]
    return out


def measure_relayed(ctx: harness.Context) -> dict[str, Any]:
    load = os.getloadavg()[0]
    rows = []
    for n in RELAYED_SIZES:
        rows.append(relayed_row(n, ctx.args))
        r = rows[-1]
        ctx.log(f"n={n}: m_min={r['m_min']} at n: ({r['k']}, {r['t_s']}) "
                f"{r['log2_exposure']:.1f}; at m_min: ({r['m_min_k']}, {r['m_min_t_s']}) "
                f"{r['m_min_log2_exposure']:.1f}; worst over {r['grid']} sizes "
                f"{r['worst_log2_exposure']:.1f} / {r['worst_log2_abort']:.1f}; kept at m_min "
                f"{r['kept_log2_exposure_m_min']:.1f}")
    return {"machine": machine_summary(), "date": time.strftime("%Y-%m-%d"),
            "load_average": [load, os.getloadavg()[0]], "gamma": GAMMA, "delta": DELTA,
            "sigma": SIGMA, "eta": ETA, "seed": ctx.args.seed, "draws": ctx.args.draws,
            "grid_points": GRID_POINTS, "rows": rows}


def _l2(x: float) -> str:
    return "−∞" if x == -math.inf else f"{x:.1f}"


def _load(res: dict[str, Any]) -> str:
    load = res.get("load_average")
    return "" if not load else f"; 1-minute load average {load[0]:.2f} before, {load[1]:.2f} after"


def render(res: dict[str, Any]) -> str:
    rows = res["rows"]
    sizing = markdown_table(
        ["n", "k", "t_s", "log2 P(exposed)", "log2 P(abort)",
         "log2 P(survivors cut) ≤",
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
        f"Measured {res['date']}. Machine: {res['machine']}{_load(res)}. "
        f"Corrupt fraction γ = {res['gamma']:.3g}, dropout fraction δ = {res['delta']:.3g}; "
        f"targets exposure ≤ 2^-{res['sigma']:g} and abort ≤ 2^-{res['eta']:g} per honest "
        "client per round. These are the advertised parameters, sized for all n relayed: C is "
        "the number of corrupt neighbours of an honest client among n − 1 others, ⌊γ·n⌋ of "
        "them corrupt (exposed when C ≥ t_s); it aborts when fewer than t_s of its k "
        "neighbours survive (its own share not counted), ⌊δ·n⌋ dropped. When the server "
        "relays fewer clients, both halves derive (k, t_s) for the relayed size (section "
        "`secure_graph_relayed`). The cut columns are union "
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


def _pair(k: int, t_s: int) -> str:
    return f"({k}, {t_s})"


def render_relayed(res: dict[str, Any]) -> str:
    rows = res["rows"]
    table = markdown_table(
        ["n", "m_min", "at m = n: (k, t_s)", "log2 P(exposed)", "log2 P(abort)",
         "at m = m_min: (k, t_s)", "log2 P(exposed)", "log2 P(abort)",
         "relayed sizes m examined (k over them)", "worst log2 P(exposed) over them",
         "worst log2 P(abort) over them", "advertised (k, t_s) kept at m_min: log2 P(exposed)"],
        [[f"{r['n']:,}", f"{r['m_min']:,}", _pair(r["k"], r["t_s"]), _l2(r["log2_exposure"]),
          _l2(r["log2_abort"]), _pair(r["m_min_k"], r["m_min_t_s"]),
          _l2(r["m_min_log2_exposure"]), _l2(r["m_min_log2_abort"]),
          f"{r['grid']:,} ({r['grid_k_min']}–{r['grid_k_max']})",
          f"{_l2(r['worst_log2_exposure'])} (m = {r['worst_exposure_m']:,})",
          f"{_l2(r['worst_log2_abort'])} (m = {r['worst_abort_m']:,})",
          _l2(r["kept_log2_exposure_m_min"])] for r in rows])
    cuts = max(r["worst_log2_cut_honest"] for r in rows)
    cut_s = max(r["worst_log2_cut_survivors"] for r in rows)
    refused = sum(r["refused"] for r in rows)
    sims = [(r, s) for r in rows for s in r.get("simulation", ())]
    sim = markdown_table(
        ["n", "relayed m", "(k, t_s)", "corrupt", "degree", "draws", "honest client samples",
         "exposed (C ≥ t_s)", "mean C (exact)", "max C seen (t_s)", "exact P(C ≥ max seen)",
         "χ² p-value (bins)", "TV distance (iid level)", "TV, all clients pooled", "seconds"],
        [[f"{r['n']:,}", f"{s['m']:,}", _pair(s["k"], s["t_s"]), s["c"], s["degree"],
          f"{s['draws']:,}", f"{s['client_samples']:,}", s["exposed"],
          f"{s['mean']:.3f} ({s['exact_mean']:.3f})", f"{s['max_seen']} ({s['t_s']})",
          f"{s['exact_p_max_seen']:.1e}", f"{s['chi2_p']:.2f} ({s['chi2_bins']})",
          f"{s['tv']:.4f} ({s['tv_iid']:.4f})", f"{s['tv_pooled']:.4f}",
          f"{s['seconds']:.0f}"] for r, s in sims])
    tails = markdown_table(
        ["n", "relayed m", "t", "exact P(C ≥ t)", "measured", "(measured − exact) / s.e."],
        [[f"{r['n']:,}", f"{s['m']:,}", t["t"], f"{t['exact']:.3e}", f"{t['measured']:.3e}",
          f"{(t['measured'] - t['exact']) / t['se']:+.1f}"] for r, s in sims
         for t in s["tail"] if t["t"] < s["t_s"]])
    grid = (f"every m from m_min to n up to n = {SIMULATED:,}, else m_min, n and "
            f"{res['grid_points']} evenly spaced between")
    return (
        f"Measured {res['date']}. Machine: {res['machine']}{_load(res)}. "
        f"γ = {res['gamma']:.3g}, δ = {res['delta']:.3g}, exposure ≤ 2^-{res['sigma']:g}, "
        f"abort ≤ 2^-{res['eta']:g}. The advertised (k, t_s) are sized for all n relayed. "
        "The server then fixes the relayed set of m clients; every client checks "
        "m ≥ m_min = n − ⌊δ·n⌋, and clients and server derive (k, t_s) for m "
        "(`SessionParams.relayed`) in the worst case: every one of the ⌊γ·n⌋ corrupt clients "
        "relayed, so an honest client's corrupt neighbours are C ~ Hypergeometric(m − 1, "
        "⌊γ·n⌋, degree over m), and ⌊δ·n⌋ − (n − m) dropouts still to come (none at m_min). "
        "The graph's seed is fixed only after the relayed set (a commit-reveal of every "
        "relayed client's nonce), so its ring order is uniform given that set. The columns: "
        "the parameters and risks at m = n and at m = m_min, the worst exposure and abort over "
        f"the relayed sizes examined ({grid}) with the per-m parameters (the worst relayed "
        "set the clients accept), and the exposure the advertised parameters would have if "
        "kept for m_min relayed clients (the fixed sizing of the previous protocol version). "
        f"Over every size examined the honest survivors' cut bound is at most "
        f"2^{_l2(cuts)} and the survivors' at most 2^{_l2(cut_s)}; the default client policy "
        f"refuses {refused} of them (`ClientPolicy.relayed_problem`).\n\n"
        f"{table}\n\nThe real graph code (`HararyGraph` over m positions with a fresh random "
        "seed per draw, every corrupt client relayed and placed uniformly among them; seed "
        f"{res['seed']}) at m = m_min with the parameters derived for it and at m = n with the "
        "advertised ones: the corrupt-neighbour counts C of the honest clients against the "
        "exact hypergeometric pmf. The χ² test and the TV distance take one random honest "
        "client per draw (independent draws; the iid level is the median TV of as many draws "
        "from the exact pmf); the pooled TV and the exposed count use every honest client "
        "(neighbours share most of their neighbourhoods, so these draws are correlated).\n\n"
        f"{sim}\n\nThe tail at thresholds below t_s where events are seen (the smallest t with "
        "exact P(C ≥ t) ≤ 10^-4 and ≤ 10^-6; all honest clients, standard error from the "
        f"spread across draws):\n\n{tails}"
    )


BENCH = harness.Benchmark(
    script=__file__,
    description=__doc__ or "",
    sections=(harness.Section(SECTION, "secure_graph.json", render),
              harness.Section(RELAYED, "secure_graph_relayed.json", render_relayed)),
    measure=measure,
    timings=True,
    add_arguments=add_arguments,
)

if __name__ == "__main__":
    harness.main(BENCH)
