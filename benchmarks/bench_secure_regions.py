"""Hierarchical secure aggregation: what a client pays as the federation grows.

The clients are split into regions of a fixed size S (``ghofl.secure.hierarchy``); each region
runs the default authenticated secure protocol (threshold ⌊(n + ⌊n/3⌋)/2⌋ + 1 and the graph
sized for exposure ≤ 2^-40, abort ≤ 2^-20 at γ = δ = 1/3, for n = S), then the R = n/S regional
aggregators run one more secure round over the regional sums. Statistics: C = 10 classes,
mode ``pooled``, 200 samples per client, R = 30, 2 limbs; d per run (``--runs D:N1,N2``).

Everything runs in one process, one client after another: "s per client" is the regional
clients' time (their statistics, keys, shares, masks, signatures) summed and divided by n;
"wall" is the whole run (every region one after another, then the top round). Exactness: the
relative error of the total against the float64 sum of the same statistics, and whether its
fixed-point words equal the flat fixed-point sum Σ encode(stats) (what a flat secure round over
the same clients unmasks) bit for bit. The float64 reference is the exactly rounded sum
(double-double accumulation): a running float64 sum has a rounding error of its own that
grows with n.

The cost model is fitted to the measured rows: a client's cost is its region's, a constant in
n (the measured mean); a round of m participants takes W(m) = m·(a + b·m + c·k(m)²) seconds
(k(m) the default graph degree), fitted to the measured top rounds (m = R), which gives the
whole run as (n/S)·W_S + W(R) in process and W_S + W(R) when the regions run in parallel (a
deployment), with W_S the measured mean region.

The bytes model is ``ghofl.secure.cost.hierarchical_bytes``, derived from the message formats
(no fitting): per client, per regional aggregator (as its region's server and as a client of
the top round) and for the top server, checked row by row against the bytes the in-memory
transport recorded, then evaluated at the extrapolated sizes.

Writes benchmarks/results/secure_regions.json and the ``secure_regions`` section of
BENCHMARKS.md. Run: ``.venv/bin/python benchmarks/bench_secure_regions.py [--runs 64:1000,2000
--region-size 100]``.
"""

from __future__ import annotations

import argparse
import time
from typing import Any

import numpy as np
from scipy.optimize import nnls

from _secure_cost_run import CLIP, C, N, client_stats
from ghofl.bench import harness
from ghofl.bench.report import machine_summary, markdown_table
from ghofl.secure import InMemoryTransport, SecAggClient, SecAggConfig, SecAggServer
from ghofl.secure.cost import HierarchyBytes, hierarchical_bytes, metadata_bytes
from ghofl.secure.hierarchy import (
    HierarchicalReport,
    Region,
    partition_regions,
    region_codec,
    region_encoder,
    run_hierarchical,
)
from ghofl.secure.identity import IdentityKey, Roster
from ghofl.secure.messages import PROTOCOL_VERSION
from ghofl.stats.accumulate import StatsAccumulator
from ghofl.stats.schema import schema_for

SECTION = "secure_regions"
EXTRAPOLATE = ((100_000, 100), (1_000_000, 100), (1_000_000, 1_000))


def _run(n: int, d: int, size: int, ctx: harness.Context) -> dict[str, Any]:
    cfg = SecAggConfig(clip_norm=CLIP)
    ids = [f"c{i:06d}" for i in range(n)]
    meta = StatsAccumulator(C, d, "pooled", clip_norm=CLIP).meta  # type: ignore[arg-type]
    codec = region_codec(cfg, n)
    encode = region_encoder(codec)
    t0 = time.perf_counter()
    schema = schema_for("pooled")
    flat = np.zeros(codec.length(meta), np.uint64)
    naive, exact = client_stats(0, d)(), _CompensatedSum()
    for i in range(n):
        s = client_stats(i, d)() if i else naive
        if i:
            naive = naive + s
        exact.add(schema.flatten(s)[1])
        flat += codec.encode(s)
    ctx.log(f"  reference sums: {time.perf_counter() - t0:.1f} s")
    reference = (schema.flatten(naive)[1], exact.value())
    rosters: dict[str, Roster] = {}

    def transport_for(region: Region) -> InMemoryTransport:
        keys = {c: IdentityKey.generate() for c in region.clients}
        rosters[region.name] = Roster.from_identities(keys)
        return InMemoryTransport([
            SecAggClient(c, client_stats(int(c[1:]), d), meta=meta, encode=encode,
                         identity=keys[c], roster=rosters[region.name], ledger=None)
            for c in region.clients])  # simulated clients: no ledger (runs reuse their data)

    report = run_hierarchical(cfg, meta, partition_regions(ids, n // size), transport_for,
                              rosters=rosters, server_half=SecAggServer)
    return {**_row(report, n, d, size, reference, flat), **_traffic(report),
            "protocol_version": PROTOCOL_VERSION, "words": codec.length(meta),
            "meta_bytes": metadata_bytes(meta), "id_bytes": len(ids[0].encode())}


def _traffic(report: HierarchicalReport) -> dict[str, float]:
    """Bytes of the regional servers (mean per region) and of the top round."""
    done = [o.report for o in report.regions.values() if o.report is not None]
    top = report.top.stages.values()
    return {
        "region_server_sent_bytes": sum(s.server_sent_bytes for x in done
                                        for s in x.stages.values()) / len(report.regions),
        "region_server_received_bytes": sum(s.server_received_bytes for x in done
                                            for s in x.stages.values()) / len(report.regions),
        "top_received_bytes_per_aggregator": sum(s.client_received_bytes_mean for s in top),
        "top_server_sent_bytes": sum(s.server_sent_bytes for s in top),
        "top_server_received_bytes": sum(s.server_received_bytes for s in top),
    }


class _CompensatedSum:
    """Σ of float64 vectors in double-double (Knuth's TwoSum): the exactly rounded sum."""

    def __init__(self) -> None:
        self.hi: np.ndarray | None = None
        self.lo: np.ndarray | None = None

    def add(self, x: np.ndarray) -> None:
        if self.hi is None or self.lo is None:
            self.hi, self.lo = x.astype(np.float64), np.zeros(x.size)
            return
        s = self.hi + x
        bp = s - self.hi
        self.lo += (self.hi - (s - bp)) + (x - bp)
        self.hi = s

    def value(self) -> np.ndarray:
        assert self.hi is not None and self.lo is not None
        return np.asarray(self.hi + self.lo)


def _relative(got: np.ndarray, want: np.ndarray) -> float:
    return float(np.max(np.abs(got - want)) / max(float(np.max(np.abs(want))), 1e-300))


def _row(report: HierarchicalReport, n: int, d: int, size: int,
         reference: tuple[np.ndarray, np.ndarray], flat: np.ndarray) -> dict[str, Any]:
    done = [o.report for o in report.regions.values() if o.report is not None]
    client_s = sum(s.client_seconds_total for r in done for s in r.stages.values())
    top = report.top
    top_client_s = sum(s.client_seconds_total for s in top.stages.values())
    r = len(report.regions)
    per_region = [sum(s.client_seconds_total for s in x.stages.values()) / len(o.clients)
                  for o in report.regions.values() if (x := o.report) is not None]
    floats = schema_for("pooled").flatten(report.total)[1]
    return {
        "clients": n, "dim": d, "region_size": size, "regions": r,
        "included_clients": len(report.included_clients), "wall_s": report.seconds,
        "region_wall_s_mean": float(np.mean([x.seconds for x in done])),
        "client_s_per_client": client_s / n,
        "client_s_per_client_median_region": float(np.median(per_region)),
        "client_s_per_client_fastest_region": float(np.min(per_region)),
        "sent_bytes_per_client": sum(
            sum(s.client_sent_bytes_mean * s.replies for s in x.stages.values())
            for x in done) / n,
        "received_bytes_per_client": sum(
            sum(s.client_received_bytes_mean * s.replies for s in x.stages.values())
            for x in done) / n,
        "top_wall_s": top.seconds, "top_s_per_aggregator": top_client_s / r,
        "top_sent_bytes_per_aggregator": sum(s.client_sent_bytes_mean
                                             for s in top.stages.values()),
        "region_params": next(iter(report.regions.values())).params,
        "top_params": dict(top.params),
        "rel_error": _relative(floats, reference[1]),
        "rel_error_running_sum": _relative(floats, reference[0]),
        "running_sum_error": _relative(reference[0], reference[1]),
        "bit_exact": bool(np.array_equal(report.words, flat)),
    }


def measure(ctx: harness.Context) -> dict[str, Any]:
    rows = []
    start = time.perf_counter()
    for spec in ctx.args.runs:
        dim, _, ns = spec.partition(":")
        for n in (int(v) for v in ns.split(",")):
            ctx.log(f"n = {n:,}, d = {dim}, regions of {ctx.args.region_size} ...")
            rows.append(_run(n, int(dim), ctx.args.region_size, ctx))
            row = rows[-1]
            ctx.log(f"  wall {row['wall_s']:.1f} s, {row['client_s_per_client']:.4f} s per "
                    f"client, top {row['top_wall_s']:.2f} s, rel. error {row['rel_error']:.1e}, "
                    f"bit exact {row['bit_exact']}")
    return {SECTION: {"machine": machine_summary(),
                      "date": time.strftime("%Y-%m-%d", time.gmtime()), "rows": rows,
                      "minutes": (time.perf_counter() - start) / 60}}


def _degree(m: int) -> int:
    """k of the default graph for m participants (saturates near 300)."""
    return SecAggConfig(clip_norm=CLIP).for_clients(m).neighbours


def _model(rows: list[dict[str, Any]]) -> tuple[tuple[float, float, float], float, float]:
    """(a, b, c) of W(m) = m·(a + b·m + c·k(m)²) fitted (non-negative) to the top rounds, the
    mean region W_S, the mean per-client seconds."""
    m = np.array([r["regions"] for r in rows], float)
    k = np.array([_degree(r["regions"]) for r in rows], float)
    per = np.array([r["top_wall_s"] / r["regions"] for r in rows])
    coef, _ = nnls(np.stack([np.ones_like(m), m, k * k], axis=1), per)
    return ((float(coef[0]), float(coef[1]), float(coef[2])),
            float(np.mean([r["region_wall_s_mean"] for r in rows])),
            float(np.mean([r["client_s_per_client"] for r in rows])))


def render(results: dict[str, Any]) -> str:
    rows = results["rows"]
    lines = ["## Hierarchical secure aggregation (`benchmarks/bench_secure_regions.py`)", "",
             f"Measured {results['date']}; the run took {results['minutes']:.1f} min"
             + (f" ({harness.load_sentence(results)[:-1]})" if "machine_load" in results
                else " on a shared machine (other jobs ran beside it: seconds are upper "
                "bounds)")
             + f". Machine: {results['machine']}. Regions of a fixed size S, each a default "
             "authenticated secure round (t and k sized for n = S), then one secure round "
             f"over the R = n/S regional sums; C = {C}, mode `pooled`, {N} samples per "
             f"client, R = {CLIP:g}, "
             "2 limbs. One process, clients one after another: s per client is the regional "
             "clients' time (statistics included) over n (the median and fastest region: the "
             "same per region, the fastest being the least disturbed by other jobs); wall is "
             "every region one after another, then the top round. Bit exact: the total's "
             "fixed-point words equal the flat fixed-point sum of every client's words (what "
             "one flat secure round over the same clients unmasks). Relative error: the "
             "largest entry error over the largest entry, against the exactly rounded float64 "
             "sum (double-double accumulation); the running float64 sum of the same "
             "statistics (client after client) is off by its own rounding, shown beside it.",
             ""]
    body = [[f"{r['clients']:,}", r["dim"], r["region_size"], r["regions"],
             f"{r['region_params']['threshold']}/{r['region_params']['neighbours']}",
             f"{r['top_params']['threshold']}/{r['top_params']['neighbours']}",
             f"{r['client_s_per_client']:.4f}",
             f"{r['client_s_per_client_median_region']:.4f}",
             f"{r['client_s_per_client_fastest_region']:.4f}",
             f"{r['sent_bytes_per_client'] / 1e3:,.1f}",
             f"{r['received_bytes_per_client'] / 1e3:,.1f}", f"{r['top_s_per_aggregator']:.4f}",
             f"{r['top_wall_s']:.2f}", f"{r['wall_s']:.1f}", f"{r['rel_error']:.1e}",
             f"{r['running_sum_error']:.1e}", "yes" if r["bit_exact"] else "NO"]
            for r in rows]
    lines.append(markdown_table(
        ["clients n", "d", "S", "regions R", "region t/k", "top t/k", "s per client",
         "median region", "fastest region", "sent kB/client", "received kB/client",
         "top s per aggregator", "top wall s", "wall s", "rel. error vs exact float64 sum",
         "running float64 sum's own error", "bit exact"], body))
    for dim in sorted({r["dim"] for r in rows}):
        lines += _model_table([r for r in rows if r["dim"] == dim], dim)
    lines += _bytes_check(rows)
    for dim in sorted({r["dim"] for r in rows}):
        lines += _bytes_at_scale([r for r in rows if r["dim"] == dim], dim)
    return "\n".join(lines)


def _model_table(rows: list[dict[str, Any]], dim: int) -> list[str]:
    size = rows[0]["region_size"]
    if len(rows) < 2:
        return []
    (a, b, c), w_s, per_client = _model(rows)

    def w(m: int) -> float:
        k = _degree(m)
        return m * (a + b * m + c * k * k)

    lines = ["", f"Cost model, d = {dim} (fitted to the rows above): a client's seconds are its "
             f"region's, {per_client:.4f} s (the mean above) whatever n. A round of m "
             f"participants takes W(m) = m·(a + b·m + c·k(m)²) s, k(m) the default graph "
             "degree (it stops growing near 300): each participant checks m signed keys (b) "
             "and shares, agrees and masks with k neighbours, its Shamir shares and their "
             f"reconstruction costing k·t_s ~ k² (c); a = {a:.3g}, b = {b:.3g}, c = {c:.3g}, "
             "fitted (non-negative least squares) to the top rounds (m = R). The run takes "
             f"(n/S)·W_S + W(R) in one process (W_S = {w_s:.2f} s, the mean region of "
             f"S = {size}) and W_S + W(R) with the regions in parallel (a deployment, whose "
             "aggregators would also run the top round in parallel: W(R) here is an upper "
             "bound). At 10^6 clients in regions of 100 the top round over 10^4 aggregators "
             "dominates (each checks 10^4 signed keys): S = R = 1,000, or a third level, is "
             "the better shape.", ""]
    body = []
    measured = {r["clients"]: r for r in rows}
    points = [(n, size) for n in sorted(measured)] + [p for p in EXTRAPOLATE]
    for n, s in points:
        r = n // s
        ws = w_s if s == size else w(s)
        model = (n / s) * ws + w(r)
        got = measured.get(n) if s == size else None
        body.append([f"{n:,}", f"{s:,}", f"{r:,}", f"{per_client:.4f}" if s == size else "–",
                     f"{got['client_s_per_client']:.4f}" if got else "–",
                     _seconds(model), _seconds(got["wall_s"]) if got else "–",
                     _seconds(ws + w(r))])
    lines.append(markdown_table(
        ["clients n", "S", "regions R", "model s per client", "measured s per client",
         "model wall s (one process)", "measured wall s", "model wall s (regions in "
         "parallel, top round in one process)"], body))
    return lines


#: (label, model attribute, measured field) of the bytes compared row by row.
BYTES = (("client, sent", "client_sent", "sent_bytes_per_client"),
         ("client, received", "client_received", "received_bytes_per_client"),
         ("aggregator as region server, sent", "region_server_sent",
          "region_server_sent_bytes"),
         ("aggregator as region server, received", "region_server_received",
          "region_server_received_bytes"),
         ("aggregator in the top round, sent", "top_client_sent",
          "top_sent_bytes_per_aggregator"),
         ("aggregator in the top round, received", "top_client_received",
          "top_received_bytes_per_aggregator"),
         ("top server, sent", "top_server_sent", "top_server_sent_bytes"),
         ("top server, received", "top_server_received", "top_server_received_bytes"))


def _bytes_model(n: int, size: int, dim: int, row: dict[str, Any] | None = None
                 ) -> HierarchyBytes:
    """The bytes model of a run; words, metadata and id bytes from ``row`` when it has them."""
    cfg = SecAggConfig(clip_norm=CLIP)
    meta = StatsAccumulator(C, dim, "pooled", clip_norm=CLIP).meta  # type: ignore[arg-type]
    row = row or {}
    words = row.get("words", region_codec(cfg, n).length(meta))
    return hierarchical_bytes(n, size, words, cfg, id_bytes=row.get("id_bytes", 7),
                              meta_bytes=row.get("meta_bytes", metadata_bytes(meta)))


def _model_value(model: HierarchyBytes, name: str) -> float:
    if name == "top_client_sent":
        return model.top.client_sent_total
    if name == "top_client_received":
        return model.top.client_received_total
    return float(getattr(model, name))


def _bytes_check(rows: list[dict[str, Any]]) -> list[str]:
    lines = ["", "Bytes: model vs measured. The model (`ghofl.secure.cost.hierarchical_bytes`, "
             "derived from the message formats, nothing fitted) counts message content as the "
             "transport records it (raw bytes, array data, UTF-8 text, 8 bytes per integer). "
             "In a round of n participants with k neighbours, L masked words, ι bytes per id "
             "(7 for the clients, `c000123`; 7 + the digits of R − 1 for the aggregators, "
             "`region-07`), P and M bytes of parameter text and metadata JSON, authenticated "
             "(64-byte signatures): a participant sends 8·L (its masked vector) + k·(2ι + 256) "
             "(its share boxes: an AES-GCM box of two 66-byte Shamir shares, a pair-key "
             "commitment, a signature) + (k + 1)·(ι + 66) (its unmask shares) + M + 6ι + 473 "
             "(keys, commitments, signatures, headers); it receives n·(6ι + 256) (the signed "
             "roster, every nonce, the sharer, survivor and dropped lists, the survivors' "
             "signatures) + k·(2ι + 256) (its inbox of share boxes) + P + M + 217. The server "
             "sends and receives its n participants' bytes summed, so the top server's grow "
             "as R². A regional aggregator is its region's server and a client of the top "
             "round. Relative error: model / measured − 1 (0: equal to the byte). Rows without "
             "a recorded protocol version were measured on protocol 2, before protocol 3 added "
             "the reveal stage, the nonce and pair-key commitments and longer parameter text; "
             "the model counts protocol 3's messages, so their residual is those additions (what "
             "a participant sends: exactly 32·k pair-key commitments, a 32-byte nonce "
             "commitment and the reveal reply of ι + 62 bytes; re-measure to compare like with "
             "like), and the quantities the script did not record then are left out.", ""]
    body = []
    for r in rows:
        model = _bytes_model(r["clients"], r["region_size"], r["dim"], r)
        for label, name, field in BYTES:
            if field not in r:
                continue
            want, got = _model_value(model, name), float(r[field])
            err = "0" if abs(want - got) < 0.5 else f"{want / got - 1:+.2%}"
            body.append([f"{r['clients']:,}", r["dim"], r["region_size"],
                         r.get("protocol_version", 2), label, f"{want:,.0f}", f"{got:,.0f}",
                         err])
    lines.append(markdown_table(["clients n", "d", "S", "protocol", "party, direction",
                                 "model bytes", "measured bytes", "relative error"], body))
    return lines


def _bytes_at_scale(rows: list[dict[str, Any]], dim: int) -> list[str]:
    size = rows[0]["region_size"]
    points = [(n, size) for n in sorted({r["clients"] for r in rows})] + list(EXTRAPOLATE)
    body = []
    for n, s in points:
        m = _bytes_model(n, s, dim)
        sizes = sorted(m.by_size)
        body.append([f"{n:,}", f"{s:,}", f"{m.regions:,}",
                     "/".join(str(m.by_size[x].degree) for x in sizes), m.top.degree,
                     f"{m.client_sent / 1e3:,.1f}", f"{m.client_received / 1e3:,.1f}",
                     f"{m.aggregator_sent / 1e6:,.2f}", f"{m.aggregator_received / 1e6:,.2f}",
                     f"{m.top_server_sent / 1e6:,.1f}", f"{m.top_server_received / 1e6:,.1f}"])
    return ["", f"Bytes model at scale, d = {dim} (the same formulas, the default t and k of "
            "each round's size; no participant drops; kB = 10^3 bytes, MB = 10^6): a client's "
            "bytes are its region's whatever n; an aggregator's add its region's (S times a "
            "client's) to the top round's, which grow with R; the top server's grow as R².",
            "", markdown_table(
                ["clients n", "S", "regions R", "region k", "top k", "client sent kB",
                 "client received kB", "aggregator sent MB", "aggregator received MB",
                 "top server sent MB", "top server received MB"], body)]


def _seconds(x: float) -> str:
    return f"{x:,.1f}" if x < 100 else f"{x:,.0f}"


def add_arguments(ap: argparse.ArgumentParser) -> None:
    ap.add_argument("--runs", nargs="+", default=["64:1000,2000,5000,10000", "512:1000"],
                    help="D:N1,N2,...: the federation sizes to run at dimension D")
    ap.add_argument("--region-size", type=int, default=100)


BENCH = harness.Benchmark(
    script=__file__,
    description=__doc__ or "",
    sections=(harness.Section(SECTION, "secure_regions.json", render, states_machine=True),),
    measure=measure,
    timings=True,
    add_arguments=add_arguments,
)

if __name__ == "__main__":
    harness.main(BENCH)
