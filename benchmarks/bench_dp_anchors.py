"""ghofl's DP heads beside outside DP anchors, same features, same ε (section ``dp_anchors``).

Issue 24's anchors. Features: CIFAR-10 (EfficientNet-Lite0 at 128 px, all 50,000 train /
10,000 test) and TREC (MiniLM, 5,452 / 500), read through the embedding cache
(:func:`ghofl.bench.features.load_features`; embedded on the first run). At ε ∈ {0.5, 1, 2,
4, 8}, δ = 1e-5, every method sees every row clipped to the encoder's default bound R
(:func:`ghofl.client.encoders.default_clip_norm`, a public rule: BENCHMARKS.md "Default
clipping bounds"):

- DP-SGD logistic-regression probe, central, Opacus's RDP accountant; hyperparameters chosen
  on a 10 % validation split over a small grid (:mod:`ghofl.bench.dp_anchors` states the cost
  of the search: the composed ε of all the grid's runs, and an ε-DP exponential-mechanism
  choice on the validation part);
- diffprivlib's ε-DP GaussianNB (public per-feature bounds by construction) and ε-DP
  LogisticRegression (objective perturbation, δ = 0, data_norm = R);
- ghofl's heads through the public API (FederationPlan, AggregationSpec(dp=DPConfig(...)),
  ServerJob, simulate with Population(K, α = 0.5)): central noise (a plain sum: the release
  does not depend on K, so it runs at the first K) and distributed noise (secure aggregation,
  each client adds a share) at every K of ``--clients``.

The upload (``--mode``, ``--projection``) defaults to the best of a quick sweep measured in
the same run (``sweep`` rows: central, first dataset, ε = 1, seed 0). Medians over the seeds.
Rows are saved as they finish: a rerun skips them (``--fresh`` measures all again).

Run ``python benchmarks/bench_dp_anchors.py`` (needs the ``dp-anchors`` and ``privacy``
extras); ``--quick``: seed 0, ε ∈ {0.5, 2, 8}, a two-point DP-SGD grid.
"""

from __future__ import annotations

import argparse
import os
import statistics
import time
from dataclasses import asdict
from typing import Any

from ghofl.bench import harness
from ghofl.bench.config import config_from_dict
from ghofl.bench.dp_anchors import (
    SGDConfig,
    clipped_rows,
    diffprivlib_lr,
    diffprivlib_nb,
    dpsgd_probe,
)
from ghofl.bench.features import Features, load_features
from ghofl.bench.report import markdown_table
from ghofl.client.encoders import default_clip_norm
from ghofl.client.job import ClientJob
from ghofl.privacy import DPConfig
from ghofl.server.job import ServerJob
from ghofl.server.plan import AggregationSpec, FederationPlan
from ghofl.server.simulation import Population, simulate

RESULTS = "dp_anchors.json"
DELTA = 1e-5
ALPHA = 0.5
HEADS = ("lda", "ridge", "ncm")
#: dataset -> (encoder, resolution, public per-coordinate bounds by construction)
DATASETS: dict[str, tuple[str, int, tuple[float, float]]] = {
    "cifar10": ("efficientnet-lite0", 128, (0.0, 6.0)),  # averages of ReLU6 outputs
    "trec": ("minilm", 224, (-1.0, 1.0)),  # unit vectors
}
GRID = (SGDConfig(1.0, 2.0, 10, 1024), SGDConfig(1.0, 8.0, 10, 1024),
        SGDConfig(0.5, 16.0, 20, 2048))
SWEEP = (("pooled", 0), ("pooled", 128), ("full", 64), ("full", 128))
ANCHORS = ("dpsgd", "dp_nb", "dp_lr")


def add_arguments(ap: argparse.ArgumentParser) -> None:
    ap.add_argument("--datasets", default="cifar10,trec")
    ap.add_argument("--epsilons", default="0.5,1,2,4,8")
    ap.add_argument("--clients", default="10,100")
    ap.add_argument("--seeds", default="0,1,2")
    ap.add_argument("--mode", default="pooled", choices=("pooled", "full"),
                    help="ghofl upload mode (default: the sweep's best)")
    ap.add_argument("--projection", type=int, default=0,
                    help="public random projection k (0: none)")
    ap.add_argument("--quick", action="store_true",
                    help="seed 0, ε 0.5/2/8, the first two DP-SGD grid points")
    ap.add_argument("--no-sweep", action="store_true")
    ap.add_argument("--fresh", action="store_true", help="ignore the saved rows")


def _floats(text: str) -> list[float]:
    return [float(v) for v in text.split(",") if v.strip()]


def _features(name: str, data_dir: str | None) -> tuple[Features, float]:
    enc, res, _ = DATASETS[name]
    cfg = config_from_dict({"datasets": [name], "resolution": res, "data_dir": data_dir})
    feats = load_features(name, enc, cfg)
    clip = default_clip_norm(feats.encoder_info)
    assert clip is not None, f"no default clipping bound for {enc}"
    return feats, clip


def _ghofl(f: Features, clip: float, upload: tuple[str, int], eps: float, dp_mode: str,
           clients: int, seed: int) -> dict[str, float]:
    mode, k = upload
    dp = DPConfig(eps, DELTA, dp_mode)  # type: ignore[arg-type]
    agg = (AggregationSpec("secure", dp=dp) if dp_mode == "distributed"
           else AggregationSpec("plain", dp=dp))
    plan = FederationPlan(
        ClientJob(tuple(f.classes), mode, projection_dim=k or None, projection_seed=0,  # type: ignore[arg-type]
                  clip_norm=clip), agg, ServerJob(HEADS, seed=seed))
    res = simulate(plan, (f.x_train, f.y_train), (f.x_test, f.y_test),
                   Population(clients, ALPHA))
    return {h: float(r.accuracy) for h, r in res.heads.items()}


def _anchor(f: Features, clip: float, method: str, eps: float, seed: int,
            grid: tuple[SGDConfig, ...]) -> dict[str, Any]:
    """One anchor run on rows clipped to R and scaled by 1/R (unit ball; public)."""
    train = (clipped_rows(f.x_train, clip) / clip, f.y_train)
    test = (clipped_rows(f.x_test, clip) / clip, f.y_test)
    if method == "dpsgd":
        return dpsgd_probe(train, test, len(f.classes), eps, DELTA, grid, seed)
    if method == "dp_nb":
        lo, hi = DATASETS[f.dataset][2]
        bounds = (max(lo / clip, -1.0), min(hi / clip, 1.0))
        return {"accuracy": diffprivlib_nb(train, test, eps, bounds, seed), "bounds": bounds}
    return {"accuracy": diffprivlib_lr(train, test, eps, 1.0, seed), "data_norm": 1.0}


def _rows(args: argparse.Namespace) -> list[tuple[str, str, float, int]]:
    """(dataset, method, eps, seed); methods: anchors, ghofl/central, ghofl/distributed/K."""
    eps_list = [0.5, 2.0, 8.0] if args.quick else _floats(args.epsilons)
    seeds = [0] if args.quick else [int(s) for s in _floats(args.seeds)]
    ks = [int(k) for k in _floats(args.clients)]
    methods = [*ANCHORS, f"ghofl/central/{ks[0]}", *(f"ghofl/distributed/{k}" for k in ks)]
    datasets = [d for d in args.datasets.split(",") if d]
    return [(d, m, e, s) for d in datasets for e in eps_list for m in methods for s in seeds]


def measure(ctx: harness.Context) -> dict[str, Any]:
    args = ctx.args
    t0 = time.perf_counter()
    upload = (args.mode, args.projection)
    tag = f"{args.mode}-k{args.projection}"
    grid = GRID[:2] if args.quick else GRID
    saved = {} if args.fresh else (ctx.load(RESULTS) or {}).get("rows", {})
    data_dir = ctx.data_dir(required=False)
    cache: dict[str, tuple[Features, float]] = {}

    def feats(name: str) -> tuple[Features, float]:
        if name not in cache:
            cache[name] = _features(name, data_dir)
        return cache[name]

    def save(rows: dict[str, Any]) -> None:
        ctx.save(RESULTS, _result(rows, args, grid, tag, t0))

    datasets = [d for d in args.datasets.split(",") if d]
    sweep = [] if args.no_sweep else [(datasets[0], f"sweep/{m}-k{k}", 1.0, 0) for m, k in SWEEP]

    def run(row: tuple[str, str, float, int]) -> dict[str, Any]:
        ds, method, eps, seed = row
        f, clip = feats(ds)
        t = time.perf_counter()
        if method.startswith("sweep/"):
            m, k = method[6:].split("-k")
            out: dict[str, Any] = {"heads": _ghofl(f, clip, (m, int(k)), eps, "central", 10, 0)}
        elif method.startswith("ghofl/"):
            _, dp_mode, k = method.split("/")
            out = {"heads": _ghofl(f, clip, upload, eps, dp_mode, int(k), seed)}
        else:
            out = _anchor(f, clip, method, eps, seed, grid)
        out.update(seconds=time.perf_counter() - t, clip=clip)
        ctx.log(f"{ds} {method} eps={eps:g} seed={seed}: "
                f"{out.get('accuracy', out.get('heads'))} ({out['seconds']:.0f} s)")
        return out

    def key(row: tuple[str, str, float, int]) -> str:
        ds, method, eps, seed = row
        up = "" if not method.startswith("ghofl/") else f"|{tag}"
        return f"{ds}|{method}{up}|{eps:g}|{seed}"

    rows = harness.run_rows([*sweep, *_rows(args)], key, run, saved, save)
    return {"dp_anchors": _result(rows, args, grid, tag, t0)}


def _result(rows: dict[str, Any], args: argparse.Namespace, grid: tuple[SGDConfig, ...],
            tag: str, t0: float) -> dict[str, Any]:
    return {"rows": rows, "upload": tag, "quick": bool(args.quick),
            "grid": [asdict(g) for g in grid],
            "heads": list(HEADS), "seconds": time.perf_counter() - t0,
            "load": list(os.getloadavg()), "machine": harness.machine_summary(),
            "date": time.strftime("%Y-%m-%d")}


# ---------------------------------------------------------------- rendering


def _parse(rows: dict[str, Any], upload: str) -> dict[str, Any]:
    """dataset -> eps -> method -> median accuracy (ghofl: best head and per head).

    ghofl rows of another upload than ``upload`` (earlier runs) are left out.
    """
    out: dict[str, Any] = {}
    groups: dict[tuple[str, str, str], list[dict[str, Any]]] = {}
    for k, v in rows.items():
        ds, method, *rest = k.split("|")
        if method.startswith("sweep/") or (len(rest) == 3 and rest[0] != upload):
            continue
        eps = rest[-2]
        groups.setdefault((ds, eps, method), []).append(v)
    for (ds, eps, method), vals in groups.items():
        cell: dict[str, Any] = {"n": len(vals)}
        if method.startswith("ghofl/"):
            per = {h: statistics.median(v["heads"][h] for v in vals) for h in vals[0]["heads"]}
            best = max(per, key=lambda h: per[h])
            cell.update(per=per, best=best, accuracy=per[best])
        else:
            cell["accuracy"] = statistics.median(v["accuracy"] for v in vals)
            if method == "dpsgd":
                cell["default"] = statistics.median(v["default_accuracy"] for v in vals)
                cell["eps_search"] = max(v["eps_search"] for v in vals)
        out.setdefault(ds, {}).setdefault(eps, {})[method] = cell
    return out


def _pct(x: float | None) -> str:
    return "–" if x is None else f"{100 * x:.1f}"


def _verdicts(ds: str, cells: dict[str, Any]) -> list[str]:
    lines = []
    for eps, m in sorted(cells.items(), key=lambda kv: float(kv[0])):
        central = next((v for k, v in m.items() if k.startswith("ghofl/central")), None)
        if central is None:
            continue
        c = central["accuracy"]
        parts = []
        for name, field, label in (("dpsgd", "accuracy", "DP-SGD tuned"),
                                   ("dpsgd", "default", "DP-SGD default"),
                                   ("dp_nb", "accuracy", "diffprivlib NB"),
                                   ("dp_lr", "accuracy", "diffprivlib LR")):
            if name in m:
                gap = 100 * (c - m[name][field])
                parts.append(f"{'at/above' if gap >= 0 else 'below'} {label} by "
                             f"{abs(gap):.1f} pt")
        for k, v in sorted(m.items()):
            if k.startswith("ghofl/distributed/"):
                gap = 100 * (v["accuracy"] - c)
                parts.append(f"distributed K={k.rsplit('/', 1)[1]} {gap:+.1f} pt vs central "
                             f"({'within 0.5' if gap >= -0.5 else 'NOT within 0.5'})")
        lines.append(f"- {ds}, ε = {eps}: best ghofl central head ({central['best']}, "
                     f"{_pct(c)} %) is " + "; ".join(parts) + ".")
    return lines


def render(data: dict[str, Any]) -> str:
    parsed = _parse(data["rows"], data["upload"])
    sweep = [[k.split("|")[1][6:], *(_pct(v["heads"].get(h)) for h in data["heads"])]
             for k, v in data["rows"].items() if k.split("|")[1].startswith("sweep/")]
    blocks = []
    for ds, cells in parsed.items():
        methods = sorted({m for c in cells.values() for m in c},
                         key=lambda m: (m not in ANCHORS, m))
        header = ["ε", *(("DP-SGD tuned", "DP-SGD default", "search ε") if "dpsgd" in methods
                         else ()), *(m for m in methods if m != "dpsgd")]
        body = []
        for eps, m in sorted(cells.items(), key=lambda kv: float(kv[0])):
            row = [eps]
            if "dpsgd" in methods:
                d = m.get("dpsgd", {})
                row += [_pct(d.get("accuracy")), _pct(d.get("default")),
                        f"{d['eps_search']:.2f}" if d else "–"]
            for name in methods:
                if name == "dpsgd":
                    continue
                c = m.get(name)
                row.append("–" if c is None else _pct(c["accuracy"]) +
                           (f" ({c['best']})" if "best" in c else ""))
            body.append(row)
        seeds = max(c["n"] for m in cells.values() for c in m.values())
        blocks.append(f"**{ds}** (median over {seeds} seed{'s' if seeds > 1 else ''})\n\n"
                      f"{markdown_table(header, body)}\n\n" + "\n".join(_verdicts(ds, cells)))
    return _text(data, sweep, blocks)


def _text(data: dict[str, Any], sweep: list[list[str]], blocks: list[str]) -> str:
    grid = ", ".join(f"(clip {g['clip']:g}, lr {g['lr']:g}, {g['epochs']} ep, batch "
                     f"{g['batch']})" for g in data["grid"])
    sweep_md = (markdown_table(["upload", *data["heads"]], sweep) if sweep else "(no sweep)")
    return "\n".join([
        "## Differential privacy beside outside anchors (`benchmarks/bench_dp_anchors.py`)",
        "",
        "Same features for every method: CIFAR-10 (EfficientNet-Lite0 @128 px, all 50,000 "
        "train / 10,000 test) and TREC (MiniLM), rows clipped to the encoder's default "
        "bound R (public rule of \"Default clipping bounds\": 58 and 1.01), δ = 1e-5. "
        "Test accuracy (%). Anchors train centrally on rows clipped to R and scaled by 1/R: "
        f"**DP-SGD** softmax probe (Opacus RDP accountant; grid {grid}; the first point is "
        "the untuned *default*, at exactly (ε, δ)). *Tuned*: each grid point is one "
        "(ε, δ)-DP run on 90 % of the training set, picked by an ε-DP exponential mechanism "
        "on the other 10 % (validation counts, sensitivity 1); *search ε* is the cost of the "
        "whole search at δ: max(RDP composition of all the grid's runs, ε of the choice) — "
        "the tuned column is NOT at the row's ε. **diffprivlib** 0.6.6: GaussianNB (ε-DP, "
        "δ = 0; per-feature bounds by construction: EfficientNet features in [0, 6]/R, "
        "MiniLM in [-1, 1]/R) and LogisticRegression (ε-DP objective perturbation, δ = 0, "
        "C = 1, data_norm = 1 after the 1/R scaling; one-vs-rest, ε/C per class). "
        f"**ghofl** heads {', '.join(data['heads'])} (`{data['upload']}` upload, clip R), "
        f"Dirichlet α = {ALPHA} clients, through FederationPlan / AggregationSpec(dp=DPConfig) "
        "/ simulate: *central* = plain sum, the server noises the total (the same release "
        "for any K, measured at the first K); *distributed* = secure aggregation, each "
        "client adds a share. Cells: the best head (named) of the medians.",
        "",
        "Upload sweep (central, ε = 1, seed 0, K = 10, first dataset):",
        "",
        sweep_md,
        "",
        *(b + "\n" for b in blocks),
        f"Machine: {data['machine']}. Measured {data['date']} in {data['seconds']:.0f} s"
        f"{' (--quick)' if data.get('quick') else ''}; load average at the end "
        f"{', '.join(f'{v:.1f}' for v in data['load'])} (shared machine: times are inflated).",
    ])


BENCH = harness.Benchmark(
    script=__file__,
    description=__doc__ or "",
    sections=(harness.Section("dp_anchors", RESULTS, render),),
    measure=measure,
    add_arguments=add_arguments,
)

if __name__ == "__main__":
    harness.main(BENCH)
