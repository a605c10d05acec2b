"""ghofl over Flower vs in process: 10 clients through Flower's simulation engine and its
deployment engine (one SuperLink and 10 SuperNodes on 127.0.0.1), secure and plain, against
the in-process simulation on the same data, partition and seed: wall time per stage, bytes
per client, and the heads' accuracies (identical in every run). Beside them, Flower's own
per-message floor on the same 10 SuperNodes: ``benchmarks/flower_floor_app`` (a ClientApp that
imports only flwr and answers every message with an empty reply) through the same four
stages, and ghofl's stage seconds as a ratio of that floor. Writes
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
from ghofl.server.plan import AggregationSpec, FederationPlan
from ghofl.server_job import ServerJob
from ghofl.simulation import Population, simulate

ROOT = Path(__file__).resolve().parents[1]
STAGES = {"secure": ("advertise", "share", "mask", "unmask"), "plain": ("input",)}
HEADS = "nb,lda,fedcgs"


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
              root: Path) -> dict[str, Any]:
    from ghofl.integrations.flower.runner import run_local

    cfg = {"protocol": protocol, "classes": json.dumps(list(feats.classes)), "mode": "pooled",
           "clip_norm": clip, "heads": HEADS, "seed": 0,
           "out-dir": str(root / f"{engine}-{protocol}"), "test-path": str(root / "test.npz"),
           "stage-timeout-s": 600.0, "wait-timeout-s": 300.0}
    t0 = time.perf_counter()
    res = run_local(engine, clients, cfg, root / f"work-{engine}-{protocol}",  # type: ignore[arg-type]
                    data_template=str(root / "parts" / "client-{partition_id}.npz"),
                    app_dir=ROOT / "examples" / "flower_app", timeout_s=3600)
    if res.get("status") != "ok":
        raise RuntimeError(f"the Flower {engine} run failed: {res.get('error')}")
    return {"engine": engine, "protocol": protocol, "wall_s": time.perf_counter() - t0,
            "stage_seconds": res["stage_seconds"], "stages": res["aggregation"]["stages"],
            "accuracy": res["accuracy"]}


def floor(clients: int, root: Path) -> dict[str, Any]:
    """Flower's per-message floor: the four secure stages, one empty message per node each."""
    from ghofl.integrations.flower.runner import run_local

    cfg = {"out-dir": str(root / "deployment-floor"), "stages": ",".join(STAGES["secure"]),
           "stage-timeout-s": 600.0, "wait-timeout-s": 300.0, "poll-s": 0.2}
    t0 = time.perf_counter()
    res = run_local("deployment", clients, cfg, root / "work-floor",
                    app_dir=ROOT / "benchmarks" / "flower_floor_app", timeout_s=3600)
    if res.get("status") != "ok":
        raise RuntimeError(f"the Flower floor run failed: {res}")
    return {"wall_s": time.perf_counter() - t0, "stage_seconds": res["stage_seconds"]}


def floor_lines(data: dict[str, Any]) -> list[str]:
    """The floor row and ghofl's deployment stage seconds as ratios of it."""
    fl = data.get("floor")
    if fl is None:
        return []
    stages = STAGES["secure"]
    per = [fl["stage_seconds"][s] for s in stages]
    lines = ["", "Flower's per-message floor (`benchmarks/flower_floor_app`: a ClientApp that "
             "imports only flwr and answers with an empty reply; the same SuperNodes, stages, "
             f"0.2 s pull interval): {' / '.join(f'{v:.2f}' for v in per)} s per stage "
             f"(median {float(np.median(per)):.2f} s).", ""]
    rows = []
    for r in data["runs"]:
        if r["engine"] != "deployment":
            continue
        own = [r["stage_seconds"].get(s, 0.0) for s in STAGES[r["protocol"]]]
        ref = per if r["protocol"] == "secure" else [float(np.median(per))]
        ratios = [a / b for a, b in zip(own, ref, strict=True)]
        rows.append([r["protocol"], " / ".join(f"{x:.2f}" for x in ratios),
                     f"{float(np.median(ratios)):.2f}"])
    lines.append(markdown_table(["deployment protocol", "ghofl stage / floor stage",
                                 "median ratio"], rows))
    lines += ["", "The plain protocol's one stage is compared with the floor's median stage."]
    return lines


def render(data: dict[str, Any]) -> str:
    lines = ["## ghofl on Flower vs in process (`benchmarks/bench_flower.py`)", "",
             f"Machine: {data['machine']}. CIFAR-10 EfficientNet-Lite0 features "
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
    return "\n".join(lines)


def add_arguments(ap: argparse.ArgumentParser) -> None:
    """The flags of this benchmark (besides the harness's --report-only / --no-write / --out)."""
    ap.add_argument("--clients", type=int, default=10)
    ap.add_argument("--engines", nargs="+", default=["simulation", "deployment"])


def measure(ctx: harness.Context) -> dict[str, Any]:
    """Secure then plain: in process, then on each engine; then Flower's floor."""
    args = ctx.args
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
        fl = None
        if "deployment" in args.engines:
            ctx.log("deployment floor ...")
            fl = floor(args.clients, root)
            ctx.log(f"  {fl['wall_s']:.1f} s")
    return {"flower": {"machine": machine_summary(), "clients": args.clients, "clip": clip,
                       "n_train": int(feats.y_train.size), "n_test": int(feats.y_test.size),
                       "runs": runs, "floor": fl}}


BENCH = harness.Benchmark(
    script=__file__,
    description=__doc__ or "",
    sections=(harness.Section("flower", "flower.json", render),),
    measure=measure,
    add_arguments=add_arguments,
)

if __name__ == "__main__":
    harness.main(BENCH)
