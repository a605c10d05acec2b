"""Issue-2 benchmarks: client-statistics throughput vs one GEMM, closed-form head fit times,
and upload bytes per client vs the paper's payload. Writes benchmarks/results/core.json and the
``core`` section of BENCHMARKS.md.

Run: ``.venv/bin/python benchmarks/bench_core.py`` (about 2-4 minutes on 2 cores).
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Callable
from typing import Any

import numpy as np

from ghofl.bench import harness
from ghofl.bench.harness import median_times
from ghofl.bench.report import machine_summary, markdown_table
from ghofl.heads import make_head
from ghofl.moments import compute_moments
from ghofl.stats import ClientStats, compute_stats
from ghofl.stats.codec import expected_payload_nbytes


def stats_vs_gemm(n: int, d: int, c: int, repeats: int) -> dict[str, Any]:
    rng = np.random.default_rng(0)
    x = rng.random((n, d)) * 6.0  # float64, like post-ReLU6 features
    y = rng.integers(0, c, n)
    out: dict[str, Any] = {"n": n, "d": d, "C": c, "repeats": repeats}
    x32 = x.astype(np.float32)
    fns: dict[str, Callable[[], Any]] = {"gemm": lambda: x.T @ x}
    for mode in ("full", "pooled", "diag"):
        fns[mode] = lambda m=mode: compute_stats(x, y, c, mode=m)  # type: ignore[misc]
    fns["full_float32"] = lambda: compute_stats(x32, y, c, mode="full")
    times = median_times(fns, repeats)  # side by side: load changes fall on every row alike
    gemm = times["gemm"][0]
    out["gemm_seconds_median"], out["gemm_samples"] = times["gemm"]
    for mode in ("full", "pooled", "diag"):
        t, ts = times[mode]
        out[f"{mode}_seconds_median"], out[f"{mode}_samples"] = t, ts
        out[f"{mode}_ratio_to_gemm"] = t / gemm
    out["full_float32_input_ratio_to_gemm"] = times["full_float32"][0] / gemm
    return out


def synthetic_full_stats(c: int, d: int, n_per_class: int, seed: int = 0) -> ClientStats:
    """Statistics of random well-conditioned data, built class by class to bound memory."""
    rng = np.random.default_rng(seed)
    n = n_per_class * c
    y = np.repeat(np.arange(c), n_per_class)
    means = rng.normal(size=(c, d))
    x = rng.normal(size=(n, d)) * 0.5 + means[y]
    return compute_stats(x, y, c, mode="full")


def head_fit_times(c: int, d: int, repeats: int) -> dict[str, Any]:
    stats = synthetic_full_stats(c, d, n_per_class=max(2 * d // c, 200) if c <= 10 else 150)
    moments = compute_moments(stats)
    fns: dict[str, Callable[[], Any]] = {"moments": lambda: compute_moments(stats)}
    for name in ("nb", "lda", "qda", "fedcgs"):
        fns[name] = lambda nm=name: make_head(nm).fit_from_moments(moments)  # type: ignore[misc]
    times = median_times(fns, repeats)
    out: dict[str, Any] = {"C": c, "d": d, "moments_seconds": times["moments"][0]}
    for name in ("nb", "lda", "qda", "fedcgs"):
        out[f"{name}_fit_seconds"] = times[name][0]
    return out


def paper_bytes(c: int, d: int) -> int:
    """The paper's client payload: float64 A, D, N, B and full S = C·d²·8 + d²·8 + 2·C·d·8."""
    return c * d * d * 8 + d * d * 8 + 2 * c * d * 8


def bytes_table() -> list[dict[str, Any]]:
    rows = []
    for d in (512, 1280):
        for c in (10, 100):
            row: dict[str, Any] = {"d": d, "C": c, "paper": paper_bytes(c, d)}
            for mode in ("full", "pooled", "diag"):
                row[mode] = expected_payload_nbytes(mode, c, d)
            for k in (128, 256):
                row[f"full_rp{k}"] = expected_payload_nbytes("full", c, k)
            rows.append(row)
    return rows


def _mb(b: float) -> str:
    return f"{b / 1e6:.2f} MB"


def render(res: dict[str, Any]) -> str:
    g = res["stats_vs_gemm"]
    lines = [
        "## Core: client statistics, closed-form heads, upload size (`benchmarks/bench_core.py`)",
        "",
        f"Machine: {res['machine']}. Measured {res['date']}. "
        + harness.load_sentence(res),
        "",
        f"### Client statistics throughput (n = {g['n']:,}, d = {g['d']}, C = {g['C']}, "
        f"float64 input, median of {g['repeats']})",
        "",
        "Ratio = time to compute the statistics / time of one `x.T @ x` on the same array, "
        "measured side by side in one run. No target here: one GEMM is not the floor of every "
        "mode (`full` does one SYRK per class); the targets are against each mode's floor in "
        "\"Client statistics vs their BLAS floor\".",
        "",
        markdown_table(
            ["what", "median seconds", "ratio to GEMM"],
            [["`x.T @ x` (numpy GEMM/SYRK)", f"{g['gemm_seconds_median']:.3f}", "1.00"]]
            + [
                [
                    f"`compute_stats` mode `{m}`",
                    f"{g[f'{m}_seconds_median']:.3f}",
                    f"{g[f'{m}_ratio_to_gemm']:.2f}",
                ]
                for m in ("full", "pooled", "diag")
            ]
            + [
                [
                    "`compute_stats` mode `full`, float32 input",
                    "",
                    f"{g['full_float32_input_ratio_to_gemm']:.2f}",
                ]
            ],
        ),
        "",
        "### Closed-form fit time from aggregated statistics (d = 1280, median of "
        f"{res['fit_repeats']}; each head at its default, shrinkage chosen from the "
        "statistics)",
        "",
        markdown_table(
            ["C", "moments s", "nb s", "lda s", "qda s", "fedcgs s"],
            [
                [
                    r["C"],
                    f"{r['moments_seconds']:.3f}",
                    f"{r['nb_fit_seconds']:.3f}",
                    f"{r['lda_fit_seconds']:.3f}",
                    f"{r['qda_fit_seconds']:.3f}",
                    f"{r['fedcgs_fit_seconds']:.3f}",
                ]
                for r in res["fit_times"]
            ],
        ),
        "",
        "### Upload bytes per client (array data; header < 1 KB)",
        "",
        "`paper` = the paper's code (float64 A, D, N, B and full S: C·d²·8 + d²·8 + 2·C·d·8). "
        "ghofl sends symmetric matrices as upper triangles and derives B and D from S in `full` "
        "mode; `full_rpK` = `full` after a public K-dim projection.",
        "",
        markdown_table(
            [
                "d",
                "C",
                "paper",
                "full",
                "full / paper",
                "pooled",
                "diag",
                "full_rp128",
                "full_rp256",
            ],
            [
                [
                    r["d"],
                    r["C"],
                    _mb(r["paper"]),
                    _mb(r["full"]),
                    f"{r['full'] / r['paper']:.2f}",
                    _mb(r["pooled"]),
                    _mb(r["diag"]),
                    _mb(r["full_rp128"]),
                    _mb(r["full_rp256"]),
                ]
                for r in res["bytes"]
            ],
        ),
    ]
    return "\n".join(lines)


def add_arguments(ap: argparse.ArgumentParser) -> None:
    """The flags of this benchmark (besides the harness's --report-only / --no-write / --out)."""
    ap.add_argument("--n", type=int, default=50_000)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--fit-repeats", type=int, default=3)


def measure(ctx: harness.Context) -> dict[str, Any]:
    """Statistics against one GEMM, head fits at C = 10 and 100, and the upload sizes."""
    args = ctx.args
    return {"core": {
        "machine": machine_summary(),
        "date": time.strftime("%Y-%m-%d"),
        "stats_vs_gemm": stats_vs_gemm(args.n, 1280, 10, args.repeats),
        "fit_repeats": args.fit_repeats,
        "fit_times": [head_fit_times(c, 1280, args.fit_repeats) for c in (10, 100)],
        "bytes": bytes_table(),
    }}


BENCH = harness.Benchmark(
    script=__file__,
    description=__doc__ or "",
    sections=(harness.Section("core", "core.json", render),),
    measure=measure,
    timings=True,
    add_arguments=add_arguments,
)

if __name__ == "__main__":
    harness.main(BENCH)
