"""ghofl over Flower vs in process: 10 clients through Flower's simulation engine and its
deployment engine (one SuperLink and 10 SuperNodes on 127.0.0.1), secure and plain, against
the in-process simulation on the same data, partition and seed: wall time per stage, bytes
per client, and the heads' accuracies (identical in every run). Beside them, Flower's own
per-message floor on the same 10 SuperNodes: ``benchmarks/flower_floor_app`` (a ClientApp that
imports only flwr and answers every message with an empty reply) through the same four
stages, and ghofl's stage seconds as a ratio of that floor. The deployment runs and the floor
run with the run config key ``client-timings``, so each node reports where its message's time
went (process start to handler, ghofl's imports, decoding, work, encoding;
:mod:`ghofl.integrations.flower.timing`): a breakdown table per run puts the medians over the
nodes beside the stage's seconds as the server saw them. Writes
benchmarks/results/flower.json and the ``flower`` section of BENCHMARKS.md.

Run: ``.venv/bin/python benchmarks/bench_flower.py`` (needs the ``flower`` extra and
``GHOFL_DATA_DIR`` or ../shared/data; about 10 minutes on 2 cores with cached embeddings).
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

from ghofl.bench import harness
from ghofl.bench.report import machine_summary, markdown_table
from ghofl.client.encoders import default_clip_norm
from ghofl.client.job import ClientJob
from ghofl.data.partition import dirichlet_partition
from ghofl.integrations.flower import TIMINGS_KEY
from ghofl.integrations.flower.timing import DECODE, ENCODE, IMPORTS, START, WORK
from ghofl.server.job import ServerJob
from ghofl.server.plan import AggregationSpec, FederationPlan
from ghofl.server.simulation import Population, simulate

ROOT = Path(__file__).resolve().parents[1]
STAGES = {"secure": ("advertise", "share", "mask", "unmask"), "plain": ("input",)}
HEADS = "nb,lda,fedcgs"
#: Seconds a Flower stage waits for its replies (--stage-timeout).
STAGE_TIMEOUT_S = [600.0]
#: Engine label of the deployment runs whose nodes read their statistics from a warm cache.
WARM = "deployment (warm stats cache)"
#: The breakdown's client-side columns and the reply field of each (run config
#: ``client-timings``); the floor's handler (its field ``seconds``) is its work.
PARTS = (("process start→handler", START), ("imports", IMPORTS), ("decode", DECODE),
         ("work", WORK), ("encode", ENCODE))
#: What the breakdown says of a run without client timings (an older results file).
NOT_MEASURED = "not measured in this run"


def features(per_class: tuple[int, int], data_dir: str | None) -> Any:
    from ghofl.bench.config import config_from_dict
    from ghofl.bench.features import load_features

    cfg = config_from_dict({"datasets": ["cifar10"], "train_per_class": per_class[0],
                            "test_per_class": per_class[1], "data_dir": data_dir})
    return load_features("cifar10", "efficientnet-lite0", cfg, log=print)


def in_process(feats: Any, clients: int, protocol: str, clip: float) -> dict[str, Any]:
    t0 = time.perf_counter()
    plan = FederationPlan(ClientJob(tuple(feats.classes), "pooled", clip_norm=clip),
                          AggregationSpec("secure" if protocol == "secure" else "plain"),
                          ServerJob(tuple(HEADS.split(",")), seed=0))
    res = simulate(plan, (feats.x_train, feats.y_train), (feats.x_test, feats.y_test),
                   Population(clients, 0.5))
    agg = res.aggregation
    return {"engine": "in process", "protocol": protocol, "wall_s": time.perf_counter() - t0,
            "stage_seconds": {s: v["server_seconds"] + v["client_seconds_total"]
                              for s, v in agg["stages"].items()},
            "stages": agg["stages"],
            "accuracy": {h: r.accuracy for h, r in res.heads.items()}}


def on_flower(feats: Any, clients: int, protocol: str, clip: float, engine: str,
              root: Path, cache: Path | None = None, label: str | None = None) -> dict[str, Any]:
    """One run on ``engine``; with ``cache``, every node keeps its statistics cache there."""
    from ghofl.integrations.flower.runner import run_local

    cfg = {**run_config(feats.classes, protocol, clip),
           "out-dir": str(root / f"{label or engine}-{protocol}"),
           "test-path": str(root / "test.npz"),
           "stage-timeout-s": STAGE_TIMEOUT_S[0], "wait-timeout-s": 300.0,
           **({TIMINGS_KEY: True} if engine == "deployment" else {})}
    t0 = time.perf_counter()
    # The measured configuration of the recorded results: unauthenticated nodes (keys on trust)
    # with no round ledger (every run federates the same parts again).
    extra = [{"insecure-keys": True, "ledger": "none",
              **({"stats-cache": str(cache / f"node-{i}")}
                 if cache is not None and engine == "deployment" else {})}
             for i in range(clients)]
    res = run_local(engine, clients, cfg,  # type: ignore[arg-type]
                    root / f"work-{label or engine}-{protocol}",
                    data_template=str(root / "parts" / "client-{partition_id}.npz"),
                    app_dir=ROOT / "examples" / "flower_app", timeout_s=3600, node_extra=extra)
    if res.get("status") != "ok":
        raise RuntimeError(f"the Flower {engine} run failed: {res.get('error')}")
    return {"engine": label or engine, "protocol": protocol, "wall_s": time.perf_counter() - t0,
            "stage_seconds": res["stage_seconds"], "stages": res["aggregation"]["stages"],
            "server_seconds": res.get("server_seconds"),
            "accuracy": res["accuracy"], "client_timings": res.get("client_timings")}


def run_config(classes: Any, protocol: str, clip: float) -> dict[str, Any]:
    """The ghofl run config keys of the Flower runs."""
    return {"protocol": protocol, "classes": json.dumps(list(classes)), "mode": "pooled",
            "clip_norm": clip, "heads": HEADS, "seed": 0}


def warm_cache(root: Path, clients: int, classes: Any, clip: float) -> Path:
    """Fill each node's statistics cache as its ClientApp would (same job, same function)."""
    from ghofl.client.stats_cache import cached_statistics
    from ghofl.server.config import plan_from_config

    job = plan_from_config(run_config(classes, "plain", clip)).clients_job
    for i in range(clients):
        cached_statistics(root / "parts" / f"client-{i}.npz", job, root / "cache" / f"node-{i}")
    return root / "cache"


def floor(clients: int, root: Path, reply_bytes: dict[str, int] | None = None
          ) -> dict[str, Any]:
    """Flower's per-message floor: one message per node per stage.

    The four secure stages with empty replies; or, with ``reply_bytes``, its stages (ghofl's
    four secure stages and the plain ``input``) with that many random bytes per reply.
    """
    from ghofl.integrations.flower.runner import run_local

    name = "floor-bytes" if reply_bytes else "floor"
    stages = list(reply_bytes) if reply_bytes else list(STAGES["secure"])
    cfg = {"out-dir": str(root / f"deployment-{name}"), "stages": ",".join(stages),
           "stage-timeout-s": STAGE_TIMEOUT_S[0], "wait-timeout-s": 300.0, "poll-s": 0.2,
           "reply-bytes": ",".join(str(reply_bytes[s]) for s in stages) if reply_bytes else "",
           TIMINGS_KEY: True}
    t0 = time.perf_counter()
    res = run_local("deployment", clients, cfg, root / f"work-{name}",
                    app_dir=ROOT / "benchmarks" / "flower_floor_app", timeout_s=3600)
    if res.get("status") != "ok":
        raise RuntimeError(f"the Flower floor run failed: {res}")
    return {"wall_s": time.perf_counter() - t0, "stage_seconds": res["stage_seconds"],
            "reply_bytes": reply_bytes or {}, "client_timings": res.get("client_timings")}


def sent_bytes(runs: list[dict[str, Any]]) -> dict[str, int]:
    """Mean bytes a client sent per stage in the deployment runs (secure stages, then input)."""
    out: dict[str, int] = {}
    for r in runs:
        if r["engine"] == "deployment":
            for st in STAGES[r["protocol"]]:
                out[st] = round(r["stages"][st]["client_sent_bytes_mean"])
    return out


def _ratios(r: dict[str, Any], ref: dict[str, float]) -> list[float]:
    stages = STAGES[r["protocol"]]
    ref_of = ({s: ref[s] for s in stages} if all(s in ref for s in stages)
              else {s: float(np.median(list(ref.values()))) for s in stages})
    return [r["stage_seconds"].get(s, 0.0) / ref_of[s] for s in stages]


def floor_lines(data: dict[str, Any]) -> list[str]:
    """The floor rows and ghofl's deployment stage seconds as ratios of them."""
    fl, fb = data.get("floor"), data.get("floor_bytes")
    if fl is None:
        return []
    per = [fl["stage_seconds"][s] for s in STAGES["secure"]]
    lines = ["", "Flower's per-message floor (`benchmarks/flower_floor_app`: a ClientApp that "
             "imports only flwr and answers with an empty reply; the same SuperNodes, stages, "
             f"0.2 s pull interval): {' / '.join(f'{v:.2f}' for v in per)} s per stage "
             f"(median {float(np.median(per)):.2f} s)."]
    if fb:
        order = [s for s in (*STAGES["secure"], *STAGES["plain"]) if s in fb["reply_bytes"]]
        order += sorted(set(fb["reply_bytes"]) - set(order))
        sizes = ", ".join(f"{s} {fb['reply_bytes'][s] / 1e6:.3g} MB" for s in order)
        secs = " / ".join(f"{fb['stage_seconds'][s]:.2f}" for s in order)
        lines[-1] += (f" The same floor replying with ghofl's payload sizes (random bytes: "
                      f"{sizes}): {secs} s.")
    head = ["deployment run", "ghofl stage / floor stage", "median"]
    if fb:
        head += ["ghofl stage / same-bytes floor stage", "median"]
    rows = []
    for r in data["runs"]:
        if not r["engine"].startswith("deployment"):
            continue
        ratios = _ratios(r, dict(fl["stage_seconds"]))
        row = [f"{r['protocol']}{r['engine'][len('deployment'):]}",
               " / ".join(f"{x:.2f}" for x in ratios), f"{float(np.median(ratios)):.2f}"]
        if fb:
            rb = _ratios(r, dict(fb["stage_seconds"]))
            row += [" / ".join(f"{x:.2f}" for x in rb), f"{float(np.median(rb)):.2f}"]
        rows.append(row)
    lines += ["", markdown_table(head, rows), "",
              "The plain protocol's one stage is compared with the empty floor's median stage "
              "and with the same-bytes floor's `input` stage."]
    return lines


def _parts(fields: dict[str, float]) -> dict[str, float]:
    """One reply's timing fields as the breakdown's columns (the floor's handler is work)."""
    out = {col: float(fields[f]) for col, f in PARTS if f in fields}
    if WORK not in fields and "seconds" in fields:
        out["work"] = float(fields["seconds"])
    return out


def breakdown_rows(stage_seconds: dict[str, float],
                   timings: dict[str, dict[str, dict[str, float]]],
                   stages: list[str],
                   server_seconds: dict[str, float] | None = None) -> list[list[str]]:
    """One row per stage with timings: the server's seconds, the medians over the clients of
    each part, of their totals, the slowest total, the server's own work in the stage (when
    measured: encoding, decoding and adding the replies), and the server's seconds less the
    median total and that work (what nobody measured: Flower's transport, process launch and
    pulls)."""
    rows = []
    for st in stages:
        per = [_parts(f) for f in (timings.get(st) or {}).values()]
        per = [p for p in per if p]
        if not per:
            continue
        seen = float(stage_seconds.get(st, 0.0))
        cells = [st, f"{seen:.2f}"]
        for col, _ in PARTS:
            vals = [p[col] for p in per if col in p]
            cells.append(f"{float(np.median(vals)):.3f}" if vals else "—")
        totals = [sum(p.values()) for p in per]
        total = float(np.median(totals))
        own = None if server_seconds is None else server_seconds.get(st)
        cells += [f"{total:.3f}", f"{max(totals):.3f}",
                  "—" if own is None else f"{own:.3f}",
                  f"{seen - total - (own or 0.0):.3f}"]
        rows.append(cells)
    return rows


def breakdown_lines(data: dict[str, Any]) -> list[str]:
    """Where each deployment run's and each floor's stage time goes, one table each."""
    named = [(f"ghofl {r['protocol']}{r['engine'][len('deployment'):]}", r,
              list(STAGES[r["protocol"]]))
             for r in data["runs"] if r["engine"].startswith("deployment")]
    for key, name in (("floor", "Flower floor (empty replies)"),
                      ("floor_bytes", "Flower floor (ghofl's payload sizes)")):
        if data.get(key):
            named.append((name, data[key], list(data[key]["stage_seconds"])))
    if not named:
        return []
    tables = [(name, breakdown_rows(run["stage_seconds"], run.get("client_timings") or {},
                                    stages, run.get("server_seconds")))
              for name, run, stages in named]
    if not any(rows for _, rows in tables):
        return ["", "Where a deployment stage's time goes (process start, imports, decoding, "
                f"work, encoding; run config `client-timings`): {NOT_MEASURED}."]
    lines = ["", "Where a deployment stage's time goes (run config `client-timings`: each node "
             "measures its own message; medians over the nodes, seconds). Process "
             "start→handler: from the ClientApp process's start to ghofl's handler (Python, "
             "Flower's imports, its pull of the message, context and app), less ghofl's "
             "imports; imports: ghofl's modules (the ClientApp's loading and those a stage "
             "loads on first use); decode / encode: the request's record to the protocol "
             "message and the reply to its record; work: the rest of the handler (plan, "
             "statistics, masking, shares, state). The floor's handler is its work. Client "
             "total: the sum of a node's parts (median, and the slowest node); server work: "
             "the server's own seconds within the stage (encoding the requests, decoding the "
             "replies, checking and adding each payload; — where not measured); unexplained: "
             "the server's stage seconds less the median client total and the server work "
             "(the SuperNode's launch of the process, Flower's serialisation and transport, "
             "the 0.2 s pull interval, waiting for slower nodes)."]
    head = ["stage", "server-seen s", *(col for col, _ in PARTS), "client total",
            "slowest client", "server work", "unexplained"]
    for name, rows in tables:
        lines += ["", f"{name}:" if rows else f"{name}: {NOT_MEASURED}."]
        if rows:
            lines += ["", markdown_table(head, rows)]
    return lines


def render(data: dict[str, Any]) -> str:
    load = harness.load_sentence(data)
    lines = ["## ghofl on Flower vs in process (`benchmarks/bench_flower.py`)", "",
             (f"Measured {data['date']}. " if data.get("date") else "")
             + f"Machine: {data['machine']}. "
             + (f"{load} " if load else "")
             + "CIFAR-10 EfficientNet-Lite0 features "
             f"({data['n_train']:,} training / {data['n_test']:,} test images), "
             f"{data['clients']} Dirichlet clients (α = 0.5, seed 0), mode `pooled`, clipping "
             f"bound R = {data['clip']:g}, heads {HEADS}. Flower 1.42: the simulation engine "
             "runs the nodes under Ray; the deployment engine runs one SuperLink and one "
             "SuperNode per client on 127.0.0.1, where each message starts a fresh ClientApp "
             "process. Wall time is the whole run (start-up, every stage, fitting and "
             "evaluation; without the SuperLink's own start); stage seconds are as seen by the "
             "server (Flower: from sending a stage's requests to its last reply).", ""]
    rows = []
    for r in data["runs"]:
        stages = STAGES[r["protocol"]]
        cells = [r["engine"], r["protocol"], f"{r['wall_s']:.1f}"]
        cells.append(" / ".join(f"{r['stage_seconds'].get(s, 0.0):.2f}" for s in stages))
        sent = sum(r["stages"][s]["client_sent_bytes_mean"] for s in stages)
        recv = sum(r["stages"][s]["client_received_bytes_mean"] for s in stages)
        cells += [f"{sent / 1e6:.2f}", f"{recv / 1e6:.3f}"]
        cells += [f"{100 * r['accuracy'][h]:.2f}" for h in HEADS.split(",")]
        rows.append(cells)
    lines.append(markdown_table(
        ["engine", "protocol", "wall s", "seconds per stage", "MB sent per client",
         "MB received per client", *(f"{h} %" for h in HEADS.split(","))], rows))
    same = all(r["accuracy"] == data["runs"][0]["accuracy"] for r in data["runs"])
    lines += ["", "Stages: secure = advertise / share / mask / unmask; plain = input. "
              + ("Every run gives the same accuracies." if same
                 else "**The accuracies differ between runs.**")]
    lines += floor_lines(data)
    lines += breakdown_lines(data)
    return "\n".join(lines)


def add_arguments(ap: argparse.ArgumentParser) -> None:
    """The flags of this benchmark (besides the harness's --report-only / --no-write / --out)."""
    ap.add_argument("--clients", type=int, default=10)
    ap.add_argument("--engines", nargs="+", default=["simulation", "deployment"])
    ap.add_argument("--stage-timeout", type=float, default=600.0,
                    help="seconds a stage waits for its replies (raise it on a loaded machine)")


def measure(ctx: harness.Context) -> dict[str, Any]:
    """Secure then plain: in process, then on each engine; then Flower's floor."""
    args = ctx.args
    STAGE_TIMEOUT_S[0] = float(args.stage_timeout)
    feats = features((300, 100), ctx.data_dir())
    clip = default_clip_norm(feats.encoder_info)
    assert clip is not None
    runs = []
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        (root / "parts").mkdir()
        parts = dirichlet_partition(feats.y_train, args.clients, 0.5, 0)
        for i, idx in enumerate(parts):
            np.savez(root / "parts" / f"client-{i}.npz", x=feats.x_train[idx],
                     y=feats.y_train[idx])
        np.savez(root / "test.npz", x=feats.x_test, y=feats.y_test)
        for protocol in ("secure", "plain"):
            runs.append(in_process(feats, args.clients, protocol, clip))
            for engine in args.engines:
                ctx.log(f"{engine} {protocol} ...")
                runs.append(on_flower(feats, args.clients, protocol, clip, engine, root))
                ctx.log(f"  {runs[-1]['wall_s']:.1f} s")
        fl = fb = None
        if "deployment" in args.engines:
            cache = warm_cache(root, args.clients, feats.classes, clip)
            for protocol in ("secure", "plain"):
                ctx.log(f"deployment {protocol}, warm statistics cache ...")
                runs.append(on_flower(feats, args.clients, protocol, clip, "deployment", root,
                                      cache=cache, label=WARM))
                ctx.log(f"  {runs[-1]['wall_s']:.1f} s")
            ctx.log("deployment floor ...")
            fl = floor(args.clients, root)
            ctx.log(f"  {fl['wall_s']:.1f} s")
            ctx.log("deployment floor with ghofl's payload sizes ...")
            fb = floor(args.clients, root, sent_bytes(runs))
            ctx.log(f"  {fb['wall_s']:.1f} s")
    return {"flower": {"machine": machine_summary(),
                       "date": time.strftime("%Y-%m-%d", time.gmtime()),
                       "clients": args.clients, "clip": clip,
                       "n_train": int(feats.y_train.size), "n_test": int(feats.y_test.size),
                       "runs": runs, "floor": fl, "floor_bytes": fb}}


BENCH = harness.Benchmark(
    script=__file__,
    description=__doc__ or "",
    sections=(harness.Section("flower", "flower.json", render),),
    measure=measure,
    timings=True,
    add_arguments=add_arguments,
    child_processes=True,
)

if __name__ == "__main__":
    harness.main(BENCH)
