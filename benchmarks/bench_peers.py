"""Issue-22 benchmark: the one-shot peers side by side with ghofl's heads, on identical features.

Peers, each on its own upload (what the server sees in brackets):
- FedNCM: class counts and sums, nearest class mean (``ncm`` head, cosine; [the sum]);
- Fed3R: Σ x xᵀ and class sums, ridge without intercept, λ = 0.01, normalised weights
  (``fed3r`` head; [the sum]);
- FedCOF: class counts and means per client; covariances estimated from the spread of the
  client means, γ = 1 shrinkage, FedCOF's ridge-like classifier (``fedcof`` head on
  :func:`ghofl.moments.fedcof.fedcof_statistics`; [every client's class means: no secure sum]).
ghofl: LDA, ridge, QDA and FisherMix on the exact sums of ``pooled``/``full`` uploads (secure
aggregation possible), LDA / ridge / FisherMix on the sums of ``gram`` uploads (class counts,
class sums and Σ x xᵀ: Fed3R's upload plus the C class counts; the ``gram`` total is the
``pooled`` one without D_c, equal to the sum of the clients' ``gram`` uploads), and LDA / ridge /
FisherMix on FedCOF's estimated statistics from the same means-only upload as FedCOF.

Protocols: FedCOF's (100 clients, Dirichlet α = 0.1) and GH-OFL's (10 clients, α = 0.1), seed
0. Bytes: array data of one client's upload in float64 (symmetric matrices as upper triangles;
Fed3R's G counted the same way). Writes benchmarks/results/peers.json and the ``peers``
section of BENCHMARKS.md.

Run: ``.venv/bin/python benchmarks/bench_peers.py [--datasets cifar10,trec] [--resolution 224]``.
"""

from __future__ import annotations

import argparse
import time
from typing import Any

import numpy as np

from ghofl.bench import harness
from ghofl.bench.report import machine_summary, markdown_table
from ghofl.data.partition import dirichlet_partition
from ghofl.heads import make_head
from ghofl.moments.fedcof import fedcof_statistics
from ghofl.stats import ClientStats, compute_stats, sum_stats
from ghofl.stats.schema import schema_for

PROTOCOLS = ((100, 0.1), (10, 0.1))
TEXT = ("trec", "sst2", "agnews")
#: (method label, head, head params, statistics: "means" | "fedcof" | "gram" | "pooled" |
#: "full", what the server sees)
METHODS: tuple[tuple[str, str, dict[str, Any], str, str], ...] = (
    ("FedNCM", "ncm", {}, "means", "sum of class sums"),
    ("Fed3R", "fed3r", {}, "gram", "sum of Σxxᵀ and class sums"),
    ("FedCOF", "fedcof", {}, "fedcof", "every client's class means"),
    ("ghofl lda (FedCOF estimate)", "lda", {}, "fedcof", "every client's class means"),
    ("ghofl ridge (FedCOF estimate)", "ridge", {}, "fedcof", "every client's class means"),
    ("ghofl fishermix (FedCOF estimate)", "fishermix", {}, "fedcof",
     "every client's class means"),
    ("ghofl lda (gram)", "lda", {}, "gram", "sum only (secure aggregation)"),
    ("ghofl ridge (gram)", "ridge", {}, "gram", "sum only (secure aggregation)"),
    ("ghofl fishermix (gram)", "fishermix", {}, "gram", "sum only (secure aggregation)"),
    ("ghofl lda", "lda", {}, "pooled", "sum only (secure aggregation)"),
    ("ghofl ridge", "ridge", {}, "pooled", "sum only (secure aggregation)"),
    ("ghofl fishermix", "fishermix", {}, "pooled", "sum only (secure aggregation)"),
    ("ghofl qda", "qda", {}, "full", "sum only (secure aggregation)"),
)


def load(name: str, resolution: int, data_dir: str | None
         ) -> tuple[Any, Any, Any, Any, int, str]:
    """``(x_train, y_train, x_test, y_test, C, description)`` from the embedding cache."""
    from ghofl.bench.config import ExperimentConfig
    from ghofl.bench.features import load_features

    enc = "minilm" if name in TEXT else "efficientnet-lite0"
    cfg = ExperimentConfig(datasets=(name,), encoders=(enc,), resolution=resolution,
                           backend="onnx", data_dir=data_dir)
    f = load_features(name, enc, cfg, progress=True)
    desc = f"{enc}" + ("" if name in TEXT else f" @ {resolution} px") + \
        f" (d = {f.x_train.shape[1]})"
    return (f.x_train.astype(np.float64), f.y_train, f.x_test.astype(np.float64), f.y_test,
            len(f.classes), desc)


def upload_bytes(method: str, stats: str, c: int, d: int) -> int:
    """Bytes of one client's upload (float64 arrays, int64 counts)."""
    if method == "Fed3R":  # G (upper triangle) and the class sums; no counts
        return 8 * (d * (d + 1) // 2 + c * d)
    mode = "means" if stats in ("means", "fedcof") else stats
    return schema_for(mode).nbytes(c, d)


def client_stats(x: Any, y: Any, c: int, parts: list[Any], mode: str) -> list[ClientStats]:
    return [compute_stats(x[p], y[p], c, mode=mode) for p in parts]  # type: ignore[arg-type]


def run_protocol(x: Any, y: Any, xt: Any, yt: Any, c: int, k: int, alpha: float,
                 with_full: bool) -> list[dict[str, Any]]:
    """Every method on one partition; one record per method."""
    parts = dirichlet_partition(y, k, alpha, seed=0)
    pooled = client_stats(x, y, c, parts, "pooled")
    totals: dict[str, ClientStats] = {"pooled": sum_stats(pooled)}
    totals["gram"] = totals["pooled"].to_mode("gram")  # exact: drops D_c
    totals["means"] = totals["pooled"].to_mode("means")
    t0 = time.perf_counter()
    totals["fedcof"] = fedcof_statistics([s.to_mode("means") for s in pooled])
    est_seconds = time.perf_counter() - t0
    if with_full:  # added as they come: at C = 200, d = 1280 one upload is 2.6 GB
        totals["full"] = sum_stats(compute_stats(x[p], y[p], c, mode="full")  # type: ignore[arg-type]
                                   for p in parts)
    out = []
    for label, head, params, stats, sees in METHODS:
        if stats not in totals:
            continue
        t0 = time.perf_counter()
        model = make_head(head, **params).fit_from_stats(totals[stats])
        fit = time.perf_counter() - t0 + (est_seconds if stats == "fedcof" else 0.0)
        acc = float(np.mean(model.predict(xt) == yt)) * 100
        out.append({"method": label, "head": head, "statistics": stats, "server_sees": sees,
                    "clients": k, "alpha": alpha, "accuracy": acc, "fit_seconds": fit,
                    "bytes": upload_bytes(label, stats, c, x.shape[1])})
        print(f"  K={k} {label}: {acc:.2f} % ({fit:.1f} s)", flush=True)
    return out


def render(results: dict[str, Any]) -> str:
    lines = [
        "## The peers side by side (`benchmarks/bench_peers.py`)",
        "",
        f"Machine: {results['machine']}. Measured {results['date']}; the run took "
        f"{results['minutes']:.1f} min. Identical features per data set (from the embedding "
        "cache); Dirichlet label skew, seed 0; bytes = array data of one client's upload in "
        "float64. FedNCM = `ncm` (cosine), Fed3R = `fed3r` (λ = 0.01, normalised weights), "
        "FedCOF = `fedcof` (γ = 1) on its covariance estimate from the clients' class means "
        "(`ghofl.moments.fedcof`); 'FedCOF estimate' rows are ghofl's heads on that same "
        "estimate and the same means-only upload; their data-driven shrinkage reads the "
        "estimate's degrees of freedom (Σ_c (K_c − 1) or so, not N − C; `EstimatedStats`, "
        "docs/method.md §3). ghofl's best at a peer's bytes counts only the 'ghofl' rows, never "
        "ghofl's implementations of the peers. Peers implemented from their papers' "
        "equations. Raw records: `benchmarks/results/peers.json`.",
        "",
    ]
    for ds in results["datasets"]:
        lines += [f"### {ds['dataset']} — {ds['encoder']}, C = {ds['classes']}, "
                  f"{ds['n_train']:,} train / {ds['n_test']:,} test", ""]
        by = {(r["method"], r["clients"]): r for r in ds["records"]}
        methods = list(dict.fromkeys(r["method"] for r in ds["records"]))
        ks = [k for k, _ in PROTOCOLS]
        rows = []
        for m in methods:
            first = next(r for r in ds["records"] if r["method"] == m)
            rows.append([m, f"{first['bytes'] / 1e6:.3g}", first["server_sees"]]
                        + [f"{by[(m, k)]['accuracy']:.2f}" if (m, k) in by else "—"
                           for k in ks])
        lines.append(markdown_table(
            ["method", "MB / client", "server sees"]
            + [f"K = {k}, α = {a} %" for k, a in PROTOCOLS], rows))
        lines.append("")
        lines += verdict(ds)
    return "\n".join(lines).rstrip() + "\n"


def verdict(ds: dict[str, Any]) -> list[str]:
    """Each peer vs the best ghofl head at the same or fewer bytes, per protocol.

    "ghofl" heads are the rows labelled ``ghofl ...``; ghofl's implementations of the peers
    (``ncm``, ``fed3r``, ``fedcof``) are the peers' rows and never count as ghofl's best.
    """
    out = []
    peers = ("FedNCM", "Fed3R", "FedCOF")
    for k, _ in PROTOCOLS:
        recs = [r for r in ds["records"] if r["clients"] == k]
        for peer in peers:
            p = next((r for r in recs if r["method"] == peer), None)
            if p is None:
                continue
            shown: list[Any] = []
            for budget, what in _budgets(p["bytes"], ds["classes"]):
                ours = [r for r in recs if r["method"].startswith("ghofl")
                        and r["bytes"] <= budget]
                if not ours or (what.startswith("≤ those bytes +") and ours == shown):
                    continue
                shown = ours
                best = max(ours, key=lambda r: r["accuracy"])
                gap = best["accuracy"] - p["accuracy"]
                side = "ahead" if gap > 0 else ("level" if gap == 0 else "BEHIND")
                out.append(f"- K = {k}: {peer} {p['accuracy']:.2f} % at "
                           f"{p['bytes'] / 1e6:.3g} MB; best ghofl head at {what}: "
                           f"{best['method']} {best['accuracy']:.2f} % at "
                           f"{best['bytes'] / 1e6:.3g} MB: ghofl {side} by {abs(gap):.2f} "
                           "points.")
    return [*out, ""]


def _budgets(peer_bytes: int, c: int) -> tuple[tuple[float, str], ...]:
    """The byte budgets of the verdict: the peer's bytes, the same plus the C class counts
    (8·C bytes: Fed3R uploads no counts, every ghofl head needs them), and 1.05× the bytes."""
    return ((peer_bytes, "≤ those bytes"),
            (peer_bytes + 8 * c, f"≤ those bytes + the {c} class counts ({8 * c} B)"),
            (1.05 * peer_bytes, "≤ 1.05× those bytes"))


def add_arguments(ap: argparse.ArgumentParser) -> None:
    """The flags of this benchmark (besides the harness's --report-only / --no-write / --out)."""
    ap.add_argument("--datasets", default="cifar10,trec")
    ap.add_argument("--resolution", type=int, default=224,
                    help="image resolution of the image data sets (every other image "
                         "benchmark uses 224)")
    ap.add_argument("--no-full", action="store_true", help="leave out mode 'full' (QDA)")


def measure(ctx: harness.Context) -> dict[str, Any]:
    """Both protocols on every data set, the data sets in the order given."""
    args = ctx.args
    data_dir = ctx.data_dir()
    t_start = time.perf_counter()
    records = []
    for name in args.datasets.split(","):
        x, y, xt, yt, c, desc = load(name, args.resolution, data_dir)
        ctx.log(f"{name}: {desc}, C = {c}")
        recs: list[dict[str, Any]] = []
        for k, alpha in PROTOCOLS:
            recs += run_protocol(x, y, xt, yt, c, k, alpha,
                                 with_full=not args.no_full and c * x.shape[1] ** 2 <= 4e8)
        records.append({"dataset": name, "encoder": desc, "classes": c,
                        "n_train": len(y), "n_test": len(yt), "records": recs})
    results = {"machine": machine_summary(), "date": time.strftime("%Y-%m-%d"),
               "minutes": (time.perf_counter() - t_start) / 60, "datasets": records}
    ctx.log(f"{results['minutes']:.1f} min")
    return {"peers": results}


BENCH = harness.Benchmark(
    script=__file__,
    description=__doc__ or "",
    sections=(harness.Section("peers", "peers.json", render),),
    measure=measure,
    add_arguments=add_arguments,
)

if __name__ == "__main__":
    harness.main(BENCH)
