"""Secure aggregation benchmarks: ghofl's secure sum vs the plain sum in process (seconds per
stage, bytes per client, relative error) at 10, 100 and 1,000 clients; exactness at CIFAR-10
scale (d = 1280, C = 10, mode ``full``); and Flower 1.42's SecAgg+ side by side on the same
statistics. Writes benchmarks/results/secure.json and the ``secure`` section of BENCHMARKS.md.

Run: ``make bench-secure``, or
``.venv/bin/python benchmarks/bench_secure.py [--flower-python PATH] [--skip-flower]``
(Flower's side needs the ``flower`` extra in the interpreter given)
(about 10 minutes on 2 cores).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from ghofl.bench import harness
from ghofl.bench.report import machine_summary, markdown_table
from ghofl.heads.registry import available_heads
from ghofl.secure import (
    FixedPointCodec,
    InMemoryTransport,
    PlainClient,
    PlainServer,
    SecAggClient,
    SecAggConfig,
    SecAggServer,
    run_aggregation,
)
from ghofl.secure.identity import IdentityKey, Roster
from ghofl.stats import ClientStats, compute_stats
from ghofl.stats.accumulate import StatsAccumulator
from ghofl.stats.schema import schema_for

CLIP = 30.0
STAGES = ("advertise", "share", "mask", "consistency", "unmask")
PARTS = ("scaling", "cifar", "real", "flower")


def client_data(i: int, n: int, d: int, c: int) -> tuple[np.ndarray, np.ndarray]:
    """Client ``i``'s embeddings: non-negative, ReLU6-like features of a Gaussian mixture."""
    rng = np.random.default_rng(1000 + i)
    means = np.random.default_rng(0).uniform(0.0, 1.5, size=(c, d))
    y = rng.integers(0, c, n)
    x = np.clip(means[y] + rng.normal(scale=0.6, size=(n, d)), 0.0, 6.0)
    return x, y


def lazy_stats(i: int, n: int, d: int, c: int, mode: str) -> Callable[[], ClientStats]:
    def make() -> ClientStats:
        x, y = client_data(i, n, d, c)
        return compute_stats(x, y, c, mode, clip_norm=CLIP)  # type: ignore[arg-type]
    return make


def rel_errors(got: ClientStats, ref: ClientStats) -> dict[str, float]:
    out = {}
    for name, a in got.arrays().items():
        b = ref.arrays()[name]
        if a is None or name == "counts":
            continue
        out[name] = float(np.max(np.abs(a - b)) / np.max(np.abs(b)))
    return out


def extended_sum(parts: list[Callable[[], ClientStats]]) -> dict[str, np.ndarray]:
    """Σ of every float array in extended precision (np.longdouble): the exact reference."""
    acc: dict[str, np.ndarray] = {}
    for make in parts:
        for name, a in make().arrays().items():
            if a is None or name == "counts":
                continue
            acc[name] = acc.get(name, 0) + a.astype(np.longdouble)
    return acc


def authenticated(ids: list[str], makers: list[Callable[[], ClientStats]], meta: Any
                  ) -> tuple[list[Any], SecAggServer]:
    """Clients with identity keys on one roster, and the server over it (the default, actively
    secure protocol: signed keys and shares, consistency check)."""
    keys = {cid: IdentityKey.generate() for cid in ids}
    roster = Roster.from_identities(keys)
    # simulated clients: no ledger (the repeats reuse their data; a ledger would refuse them)
    clients: list[Any] = [SecAggClient(cid, m, meta=meta, identity=keys[cid], roster=roster,
                                       ledger=None)
                          for cid, m in zip(ids, makers, strict=True)]
    return clients, SecAggServer(SecAggConfig(clip_norm=CLIP), meta, ids, roster=roster)


def protocol_run(k: int, d: int, c: int, mode: str, n: int, secure: bool) -> dict[str, Any]:
    ids = [f"client-{i:04d}" for i in range(k)]
    makers = [lazy_stats(i, n, d, c, mode) for i in range(k)]
    meta = StatsAccumulator(c, d, mode, clip_norm=CLIP).meta  # type: ignore[arg-type]
    server: Any
    if secure:
        clients, server = authenticated(ids, makers, meta)
    else:
        clients = [PlainClient(cid, m) for cid, m in zip(ids, makers, strict=True)]
        server = PlainServer(ids, meta)
    t0 = time.perf_counter()
    report = run_aggregation(server, InMemoryTransport(clients))
    wall = time.perf_counter() - t0
    return {"report": report, "wall": wall, "makers": makers}


def stats_seconds(k: int, n: int, d: int, c: int, mode: str) -> float:
    """Time the clients spend computing their statistics (part of every run, either protocol)."""
    t0 = time.perf_counter()
    for i in range(k):
        lazy_stats(i, n, d, c, mode)()
    return time.perf_counter() - t0


def scaling_table(ks: list[int], d: int, c: int, n: int, repeats: int) -> list[dict[str, Any]]:
    rows = []
    for k in ks:
        reps = repeats if k <= 100 else 1
        walls_plain, walls_secure, reports = [], [], []
        for _ in range(reps):
            plain = protocol_run(k, d, c, "pooled", n, secure=False)
            sec = protocol_run(k, d, c, "pooled", n, secure=True)
            walls_plain.append(plain["wall"])
            walls_secure.append(sec["wall"])
            reports.append(sec["report"])
        report = reports[len(reports) // 2]
        ref = extended_sum(sec["makers"])
        err_plain = rel_errors(report.total, plain["report"].total)
        err_exact = {name: float(np.max(np.abs(getattr(report.total, name) - ref[name]))
                                 / np.max(np.abs(ref[name]))) for name in ref}
        err_plain_exact = {name: float(np.max(np.abs(getattr(plain["report"].total, name)
                                                     - ref[name])) / np.max(np.abs(ref[name])))
                           for name in ref}
        row: dict[str, Any] = {
            "clients": k, "d": d, "C": c, "mode": "pooled", "samples_per_client": n,
            "repeats": reps,
            "plain_seconds_median": statistics.median(walls_plain),
            "secure_seconds_median": statistics.median(walls_secure),
            "plain_seconds": walls_plain, "secure_seconds": walls_secure,
            "stats_seconds": stats_seconds(min(k, 100), n, d, c, "pooled") * k / min(k, 100),
            "stages": {s: r.to_dict() for s, r in report.stages.items()},
            "params": report.params,
            "rel_error_vs_plain_float64": max(err_plain.values()),
            "rel_error_vs_exact": max(err_exact.values()),
            "plain_float64_rel_error_vs_exact": max(err_plain_exact.values()),
            "counts_exact": bool(np.array_equal(report.total.counts,
                                                plain["report"].total.counts)),
            "plain_upload_bytes": int(plain["report"].stages["input"].client_sent_bytes_mean),
            "secure_upload_bytes": int(sum(r.client_sent_bytes_mean
                                           for r in report.stages.values())),
            "secure_download_bytes": int(sum(r.client_received_bytes_mean
                                             for r in report.stages.values())),
        }
        rows.append(row)
        print(f"K={k}: plain {row['plain_seconds_median']:.2f} s, secure "
              f"{row['secure_seconds_median']:.2f} s, rel error {row['rel_error_vs_exact']:.2e}",
              flush=True)
    return rows


def cifar_scale(ks: list[int]) -> list[dict[str, Any]]:
    """d = 1280, C = 10, mode full, 50,000 samples split over K clients. The full protocol at
    10 clients; at 100 the masked vectors (131 MB each) would not fit beside the rest in
    memory, so the encoding is checked alone there: the masks cancel exactly in uint64."""
    d, c, total = 1280, 10, 50_000
    out = []
    for k in ks:
        n = total // k
        makers = [lazy_stats(i, n, d, c, "full") for i in range(k)]
        meta = StatsAccumulator(c, d, "full", clip_norm=CLIP).meta
        ref = extended_sum(makers)
        plain = None
        for m in makers:
            s = m()
            plain = s if plain is None else plain + s
        assert plain is not None
        t0 = time.perf_counter()
        if k <= 10:
            ids = [f"client-{i:03d}" for i in range(k)]
            clients, server = authenticated(ids, makers, meta)
            total_stats = run_aggregation(server, InMemoryTransport(clients)).total
            how = "full protocol"
        else:
            codec = FixedPointCodec(k, 1_000_000, CLIP)
            acc = np.zeros(codec.length(meta), np.uint64)
            for m in makers:
                acc += codec.encode(m())
            total_stats = codec.decode(meta, acc)
            how = "fixed-point encoding, modular sum, decoding"
        seconds = time.perf_counter() - t0
        errs = rel_errors(total_stats, plain)
        exact = {name: float(np.max(np.abs(getattr(total_stats, name) - ref[name]))
                             / np.max(np.abs(ref[name]))) for name in ref}
        out.append({"clients": k, "how": how, "seconds": seconds,
                    "rel_error_vs_plain_float64": errs, "rel_error_vs_exact": exact,
                    "counts_exact": bool(np.array_equal(total_stats.counts, plain.counts)),
                    "words_per_client": FixedPointCodec(k, 1_000_000, CLIP).length(meta)})
        print(f"CIFAR scale K={k}: {how}, max rel error vs float64 sum "
              f"{max(errs.values()):.2e}", flush=True)
    return out


def flower_side_by_side(ks: list[int], python: str, d: int, c: int, n: int
                        ) -> list[dict[str, Any]]:
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    import flower_secaggplus as fs

    rows = []
    for k in ks:
        makers = [lazy_stats(i, n, d, c, "pooled") for i in range(k)]
        sch = schema_for("pooled")
        vectors = [sch.flatten(m())[1] for m in makers]
        exact = np.sum(np.array(vectors, dtype=np.longdouble), axis=0)

        def err(v: np.ndarray, exact: np.ndarray = exact) -> float:
            return float(np.max(np.abs(v - exact)) / np.max(np.abs(exact)))

        ours = protocol_run(k, d, c, "pooled", n, secure=True)
        our_vec = sch.flatten(ours["report"].total)[1]
        rows.append({"clients": k, "system": "ghofl secure (defaults)",
                     "rel_error": err(our_vec), "wall_s": ours["wall"],
                     "aggregate_s": ours["wall"] - stats_seconds(k, n, d, c, "pooled")})
        for name, preset in (("Flower SecAgg+ defaults", fs.FLOWER_DEFAULTS),
                             ("Flower SecAgg+ most precise", fs.FLOWER_MOST_PRECISE)):
            settings = fs.with_clipping_range(preset, vectors)
            with tempfile.TemporaryDirectory() as tmp:
                res = fs.flower_secaggplus_sum(vectors, python=python, settings=settings,
                                               workdir=Path(tmp))
            rows.append({"clients": k, "system": name, "rel_error": err(res["sum"]),
                         "wall_s": res["wall_s"], "aggregate_s": res["aggregate_s"],
                         "settings": res["settings"], "flwr_version": res["flwr_version"]})
            print(f"K={k} {name}: rel error {rows[-1]['rel_error']:.2e}, "
                  f"{res['wall_s']:.1f} s", flush=True)
    return rows


def real_features(clients: int, alpha: float, per_class: tuple[int, int],
                  data_dir: str | None) -> dict[str, Any]:
    """Every head fitted from the secure total vs the plain one, on real CIFAR-10 features
    (EfficientNet-Lite0 at 224, its default clipping bound); skipped without a data folder."""
    from ghofl.bench.config import config_from_dict
    from ghofl.bench.features import load_features
    from ghofl.client.encoders import default_clip_norm
    from ghofl.client.job import ClientJob
    from ghofl.server.job import ServerJob
    from ghofl.server.plan import AggregationSpec, FederationPlan
    from ghofl.server.simulation import Population, simulate

    if not data_dir:
        return {"skipped": "no GHOFL_DATA_DIR"}
    cfg = config_from_dict({"datasets": ["cifar10"], "train_per_class": per_class[0],
                            "test_per_class": per_class[1], "data_dir": data_dir})
    feats = load_features("cifar10", "efficientnet-lite0", cfg, log=print)
    clip = default_clip_norm(feats.encoder_info)
    assert clip is not None
    job, server = ClientJob(tuple(feats.classes), "full", clip_norm=clip), ServerJob(("all",))
    common = ((feats.x_train, feats.y_train), (feats.x_test, feats.y_test),
              Population(clients, alpha, encoder=feats.encoder_info))
    plain = simulate(FederationPlan(job, AggregationSpec("plain"), server), *common)
    secure = simulate(FederationPlan(job, AggregationSpec("secure"), server), *common)
    heads = {h: {"plain": plain.heads[h].accuracy, "secure": secure.heads[h].accuracy,
                 "differing_predictions": int(np.sum(plain.predictions[h]
                                                     != secure.predictions[h]))}
             for h in plain.heads}
    return {"clients": clients, "alpha": alpha, "clip_norm": clip, "n_train": plain.n_train,
            "n_test": plain.n_test, "n_clipped": secure.n_clipped, "heads": heads,
            "secure_aggregate_seconds": secure.stage_seconds["aggregate"],
            "plain_aggregate_seconds": plain.stage_seconds["aggregate"]}


def _kb(x: float) -> str:
    return f"{x / 1e3:,.1f}"


def render(results: dict[str, Any]) -> str:
    lines = ["## Secure aggregation (`benchmarks/bench_secure.py`)", "",
             f"Machine: {results['machine']}. Clipping bound R = {CLIP:g}, maximum samples per "
             "client M = 1,000,000, 2 limbs, the authenticated protocol (identity keys on one "
             "roster: signed keys and shares, consistency check) with its default threshold "
             "(⌊(n + ⌊n/3⌋)/2⌋ + 1) and neighbours (`ghofl.secure.default_neighbours`; the "
             "table lists t and k). Clients run one "
             "after another in one process, so client seconds add up; in a real federation "
             "they run in parallel. Relative error = max |error| / max |value| over each array, "
             "worst array; the exact reference is the sum in extended precision.", "",
             "### Secure vs plain, C = 10, d = 512, mode `pooled` "
             f"({results['scaling'][0]['samples_per_client']} samples per client)", ""]
    rows = []
    for r in results["scaling"]:
        rows.append([r["clients"], f"{r['plain_seconds_median']:.2f}",
                     f"{r['secure_seconds_median']:.2f}", f"{r['stats_seconds']:.2f}",
                     _kb(r["plain_upload_bytes"]), _kb(r["secure_upload_bytes"]),
                     _kb(r["secure_download_bytes"]),
                     f"{r['rel_error_vs_plain_float64']:.1e}", f"{r['rel_error_vs_exact']:.1e}",
                     f"{r['plain_float64_rel_error_vs_exact']:.1e}",
                     "yes" if r["counts_exact"] else "NO"])
    lines.append(markdown_table(
        ["clients", "plain s", "secure s", "of which client stats s", "plain upload kB/client",
         "secure upload kB/client", "secure download kB/client", "secure vs float64 sum",
         "secure vs exact", "float64 sum vs exact", "counts exact"], rows))
    lines += ["", "Seconds per stage of the secure run (server | all clients | slowest client) "
              "and kB each client sent in that stage:", ""]
    rows = []
    for r in results["scaling"]:
        cells = [r["clients"], r["params"]["threshold"], r["params"]["neighbours"]]
        for s in STAGES:
            st = r["stages"][s]
            cells.append(f"{st['server_seconds']:.2f} \\| {st['client_seconds_total']:.2f} \\| "
                         f"{st['client_seconds_max']:.3f} ({_kb(st['client_sent_bytes_mean'])} kB)")
        rows.append(cells)
    lines.append(markdown_table(["clients", "t", "k", *STAGES], rows))
    lines += ["", "### Exactness at CIFAR-10 scale (d = 1280, C = 10, mode `full`, 50,000 "
              "samples)", ""]
    rows = []
    for r in results["cifar_scale"]:
        rows.append([r["clients"], r["how"], *(f"{r['rel_error_vs_plain_float64'][a]:.1e}"
                                                for a in ("sums", "class_scatter")),
                     *(f"{r['rel_error_vs_exact'][a]:.1e}" for a in ("sums", "class_scatter")),
                     "yes" if r["counts_exact"] else "NO",
                     f"{8 * r['words_per_client'] / 1e6:.1f}"])
    lines.append(markdown_table(
        ["clients", "checked", "sums vs float64 sum", "class_scatter vs float64 sum",
         "sums vs exact", "class_scatter vs exact", "counts exact", "MB per client"], rows))
    real = results.get("real") or {}
    if real.get("heads"):
        lines += ["", f"### Heads from the secure total on real CIFAR-10 features "
                  f"(EfficientNet-Lite0 at 224, {real['n_train']:,} training and "
                  f"{real['n_test']:,} test images, {real['clients']} clients, α = "
                  f"{real['alpha']}, mode `full`, default R = {real['clip_norm']:g}: "
                  f"{real['n_clipped']} samples clipped)", ""]
        rows = [[h, f"{100 * v['plain']:.2f}", f"{100 * v['secure']:.2f}",
                 v["differing_predictions"]]
                for h, v in harness.in_order(real["heads"], available_heads()).items()]
        lines.append(markdown_table(["head", "plain accuracy %", "secure accuracy %",
                                     "test predictions that differ"], rows))
    if results.get("flower"):
        lines += ["", "### Side by side with Flower's SecAgg+ (same statistics: C = 10, d = 512, "
                  "`pooled`, flattened to one float vector per client)", "",
                  "Flower runs in its simulation engine (flwr "
                  f"{results['flower'][1].get('flwr_version', '?')}, Ray start-up included in "
                  "its wall time; `aggregate s` is its four SecAgg+ stages timed inside the "
                  "ServerApp). Its clipping range is set to the largest |value| so nothing is "
                  "clipped. ghofl's `aggregate s` is its whole protocol without the clients' "
                  "statistics computation.", ""]
        rows = [[r["clients"], r["system"], f"{r['rel_error']:.1e}", f"{r['wall_s']:.1f}",
                 f"{r['aggregate_s']:.1f}"] for r in results["flower"]]
        lines.append(markdown_table(["clients", "system", "relative error", "wall s",
                                     "aggregate s"], rows))
    return "\n".join(lines)


def add_arguments(ap: argparse.ArgumentParser) -> None:
    """The flags of this benchmark (besides the harness's --report-only / --no-write / --out)."""
    ap.add_argument("--clients", type=int, nargs="+", default=[10, 100, 1000])
    ap.add_argument("--flower-clients", type=int, nargs="+", default=[10, 100])
    ap.add_argument("--flower-python", default=None)
    ap.add_argument("--skip-flower", action="store_true")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--parts", nargs="+", default=list(PARTS), choices=PARTS,
                    help="run only these parts; the others are kept from the last results")


def measure(ctx: harness.Context) -> dict[str, Any]:
    """The parts asked for, in order; the other parts are kept from the saved results."""
    args = ctx.args
    d, c, n = 512, 10, 200
    results: dict[str, Any] = ctx.load("secure.json", {})
    results["machine"] = machine_summary()
    if "scaling" in args.parts:
        results["scaling"] = scaling_table(args.clients, d, c, n, args.repeats)
    if "cifar" in args.parts:
        results["cifar_scale"] = cifar_scale([10, 100])
    if "real" in args.parts:
        results["real"] = real_features(10, 0.1, (300, 100), ctx.data_dir(required=False))
    if "flower" in args.parts and not args.skip_flower:
        sys.path.insert(0, str(Path(__file__).resolve().parent))
        import flower_secaggplus as fs

        # absolute, not resolved: Flower's processes start in their own folders, and a venv's
        # python must keep its venv path (resolving it would give the base interpreter)
        python = str(Path(args.flower_python).absolute()) if args.flower_python \
            else fs.DEFAULT_PYTHON
        results["flower"] = flower_side_by_side(args.flower_clients, python, d, c, n)
    return {"secure": results}


BENCH = harness.Benchmark(
    script=__file__,
    description=__doc__ or "",
    sections=(harness.Section("secure", "secure.json", render),),
    measure=measure,
    timings=True,
    add_arguments=add_arguments,
    child_processes=True,
)

if __name__ == "__main__":
    harness.main(BENCH)
