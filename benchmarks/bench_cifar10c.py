"""Distribution shift on CIFAR-10-C built locally (ghofl.data.corruptions), leak-free and leaky.

Protocol (a), clean -> corrupted: statistics of clean CIFAR-10 training images; test on every
corruption x severity of CIFAR-10 test images.

Protocol (b), corrupted holdout (the paper's CIFAR-100-C protocol, on CIFAR-10):
statistics of corrupted images at severities 1-4 of all 19 corruptions, test on severity 5 of
all 19 corruptions.
* leak-free: the statistics come from corrupted TRAINING images, the test from corrupted TEST
  images: no base image is shared.
* leaky (the paper's variant): the statistics come from the same TEST base images that are
  then tested at severity 5 (same pictures, same corruption types, other strength).
Both variants use the same number of statistics images and the same test set.

Every registered head (FedCGS included) is fitted from the statistics of the whole training set
(one aggregate: the heads are partition invariant); the centralised logistic-regression probe
is trained on the same training features. Features: EfficientNet-Lite0 at 224 px (ONNX),
through the embedding cache (corrupted views are keyed by corruption, severity and seed).

Writes benchmarks/results/cifar10c.json and the ``cifar10c`` section of BENCHMARKS.md.
Run: ``flock scratch/cpu.lock .venv/bin/python benchmarks/bench_cifar10c.py`` (encodes
19 x 5 x test-per-class x 10 + 19 x 4 x stats-per-class x 10 images once; ~100 img/s on 2 cores).
"""

from __future__ import annotations

import argparse
import statistics
import time
from typing import Any

import numpy as np
from numpy.typing import NDArray

from ghofl.bench import harness
from ghofl.bench.config import ExperimentConfig
from ghofl.bench.features import load_features
from ghofl.bench.references import fit_logreg_probe
from ghofl.bench.report import machine_summary, markdown_table
from ghofl.client.embed import embed_dataset_cached
from ghofl.client.encoders import Encoder, get_encoder
from ghofl.data.corruptions import ALL_CORRUPTIONS, SEVERITIES, CorruptedImages
from ghofl.data.registry import load_dataset, subsample
from ghofl.heads.build import build_heads
from ghofl.heads.registry import available_heads
from ghofl.stats import compute_stats

PROBE = "probe (centralised)"
#: The paper's CIFAR-100-C holdout (leaky: same base images), accuracy % (GH graphs.py).
PAPER_C100C = {"nb": 25.40, "lda": 37.60, "fishermix": 40.10, "protohyper": 39.80, "qda": 64.30}

Split = tuple[NDArray[np.float32], NDArray[np.int64]]


def _say(msg: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", flush=True)


def _corrupted(
    src: Any, split: str, idx: NDArray[np.int64], corruption: str, severity: int, enc: Encoder
) -> Split:
    view = CorruptedImages(src, corruption, severity, seed=0)
    return embed_dataset_cached(view, split, enc, idx)


class Models:
    """Every head and the probe, fitted on one training set; ``score`` evaluates them all."""

    def __init__(self, x: NDArray[Any], y: NDArray[Any], classes: tuple[str, ...], info: Any,
                 heads: list[str], probe_cv_samples: int) -> None:
        stats = compute_stats(x, y, classes, mode="full", encoder=info)
        self.fit_seconds: dict[str, float] = {}
        self.models: dict[str, Any] = {}
        for name, head in build_heads(heads, seed=0).items():
            t0 = time.perf_counter()
            self.models[name] = head.fit_from_stats(stats)
            self.fit_seconds[name] = time.perf_counter() - t0
        t0 = time.perf_counter()
        self.models[PROBE], self.probe_details = fit_logreg_probe(
            x, y, cv_max_samples=probe_cv_samples
        )
        self.fit_seconds[PROBE] = time.perf_counter() - t0

    def score(self, x: NDArray[Any], y: NDArray[Any]) -> dict[str, float]:
        return {k: float(np.mean(m.predict(x) == y)) for k, m in self.models.items()}


def _mean(vals: list[float]) -> float:
    return float(statistics.fmean(vals)) if vals else float("nan")


def run(args: argparse.Namespace) -> dict[str, Any]:
    cfg = ExperimentConfig(
        datasets=("cifar10",), encoders=(args.encoder,), resolution=args.resolution,
        train_per_class=args.train_per_class, test_per_class=args.test_per_class,
    )
    heads = available_heads() if args.heads == "all" else args.heads.split(",")
    corruptions = (
        ALL_CORRUPTIONS if args.corruptions == "all" else tuple(args.corruptions.split(","))
    )
    enc = get_encoder(args.encoder, resolution=args.resolution)
    _say(f"clean features ({args.train_per_class}/class train, {args.test_per_class}/class test)")
    feats = load_features("cifar10", args.encoder, cfg)
    test_src = load_dataset("cifar10", "test")
    train_src = load_dataset("cifar10", "train")
    test_idx = subsample(test_src.labels, per_class=args.test_per_class, seed=0)
    stats_idx = subsample(train_src.labels, per_class=args.stats_per_class, seed=1)

    # ---- corrupted test features, every corruption x severity (shared by (a) and (b))
    test: dict[tuple[str, int], Split] = {}
    for c in corruptions:
        t0 = time.perf_counter()
        for s in SEVERITIES:
            test[c, s] = _corrupted(test_src, "test", test_idx, c, s, enc)
        _say(f"test features {c}: {time.perf_counter() - t0:.0f} s")

    # ---- protocol (a)
    _say(f"protocol (a): fitting {len(heads)} heads + probe on {len(feats.y_train)} clean images")
    clean_models = Models(feats.x_train, feats.y_train, feats.classes, feats.encoder_info, heads,
                          args.probe_cv_samples)
    clean_acc = clean_models.score(feats.x_test, feats.y_test)
    a_acc = {key: clean_models.score(*xy) for key, xy in test.items()}

    # ---- protocol (b): stats at severities 1-4, test at severity 5
    train_sev = tuple(s for s in SEVERITIES if s != 5)
    free_parts = []
    for c in corruptions:
        t0 = time.perf_counter()
        for s in train_sev:
            free_parts.append(_corrupted(train_src, "train", stats_idx, c, s, enc))
        _say(f"leak-free training features {c}: {time.perf_counter() - t0:.0f} s")
    leaky_parts = [test[c, s] for c in corruptions for s in train_sev]
    results_b: dict[str, Any] = {}
    for variant, parts in (("leak-free", free_parts), ("leaky", leaky_parts)):
        x = np.concatenate([p[0] for p in parts])
        y = np.concatenate([p[1] for p in parts])
        _say(f"protocol (b) {variant}: fitting on {len(y)} corrupted images")
        models = Models(x, y, feats.classes, feats.encoder_info, heads, args.probe_cv_samples)
        per_c = {c: models.score(*test[c, 5]) for c in corruptions}
        results_b[variant] = {
            "n_train": len(y),
            "per_corruption": per_c,
            "mean": {k: _mean([per_c[c][k] for c in corruptions]) for k in models.models},
            "fit_seconds": models.fit_seconds,
            "probe": models.probe_details,
        }
    names = [*heads, PROBE]
    per_sev = {
        s: {k: _mean([a_acc[c, s][k] for c in corruptions]) for k in names} for s in SEVERITIES
    }
    per_corr = {
        c: {k: _mean([a_acc[c, s][k] for s in SEVERITIES]) for k in names} for c in corruptions
    }
    mean_corrupted = {k: _mean([per_sev[s][k] for s in SEVERITIES]) for k in names}
    return {
        "encoder": args.encoder,
        "resolution": args.resolution,
        "encoder_fingerprint": enc.info.fingerprint(),
        "machine": machine_summary(),
        "heads": heads,
        "corruptions": list(corruptions),
        "n_clean_train": len(feats.y_train),
        "n_clean_test": len(feats.y_test),
        "test_per_class": args.test_per_class,
        "stats_per_class": args.stats_per_class,
        "n_test_per_cell": len(test_idx),
        "protocol_a": {
            "clean": clean_acc,
            "per_severity": {str(s): v for s, v in per_sev.items()},
            "per_corruption": per_corr,
            "mean_corrupted": mean_corrupted,
            "cells": {f"{c}/{s}": v for (c, s), v in a_acc.items()},
            "fit_seconds": clean_models.fit_seconds,
            "probe": clean_models.probe_details,
        },
        "protocol_b": results_b,
    }


def _pct(v: float) -> str:
    return f"{100 * v:.1f}"


def _best(d: dict[str, float], among: list[str]) -> str:
    return max(among, key=lambda k: d[k])


def render(r: dict[str, Any]) -> str:
    heads = r["heads"]
    names = [*heads, PROBE]
    a = r["protocol_a"]
    sev_rows = []
    for k in names:
        drop = a["clean"][k] - a["mean_corrupted"][k]
        sev_rows.append(
            [k, _pct(a["clean"][k])]
            + [_pct(a["per_severity"][str(s)][k]) for s in SEVERITIES]
            + [_pct(a["mean_corrupted"][k]), f"{100 * drop:.1f}"]
        )
    sev_table = markdown_table(
        ["model", "clean", *[f"s{s}" for s in SEVERITIES], "mean corrupted", "drop (points)"],
        sev_rows,
    )
    corr_rows = [
        [c] + [_pct(a["per_corruption"][c][k]) for k in names] for c in r["corruptions"]
    ]
    corr_table = markdown_table(["corruption (mean of s1-s5)", *names], corr_rows)
    b = r["protocol_b"]
    b_rows = []
    for k in names:
        paper = PAPER_C100C.get(k)
        b_rows.append([
            k, _pct(b["leak-free"]["mean"][k]), _pct(b["leaky"]["mean"][k]),
            f"{100 * (b['leaky']['mean'][k] - b['leak-free']['mean'][k]):+.1f}",
            f"{paper:.1f}" if paper is not None else "",
        ])
    b_table = markdown_table(
        ["model", "leak-free s5", "leaky s5 (paper's protocol)", "leak gain (points)",
         "paper, CIFAR-100-C leaky"],
        b_rows,
    )
    bc_rows = [
        [c] + [f"{_pct(b['leak-free']['per_corruption'][c][k])} / "
               f"{_pct(b['leaky']['per_corruption'][c][k])}" for k in heads]
        for c in r["corruptions"]
    ]
    bc_table = markdown_table(["corruption (s5), leak-free / leaky", *heads], bc_rows)
    # the paper's finding: QDA is the most robust head under corruption
    best_a = _best(a["mean_corrupted"], heads)
    drops = {k: a["clean"][k] - a["mean_corrupted"][k] for k in heads}
    least_drop = min(heads, key=lambda k: drops[k])
    best_free = _best(b["leak-free"]["mean"], heads)
    best_leaky = _best(b["leaky"]["mean"], heads)
    has_qda = "qda" in heads

    def verdict(best: str) -> str:
        return "yes" if best == "qda" else f"no ({best})"

    checks = (
        f"- Highest mean accuracy over all corrupted test sets, protocol (a): **{best_a}**; "
        f"smallest clean-to-corrupted drop: **{least_drop}** "
        f"({100 * drops[least_drop]:.1f} points; QDA "
        f"{100 * drops['qda']:.1f} points).\n" if has_qda else ""
    ) + (
        f"- Protocol (b), best head at severity 5: leak-free **{best_free}**, leaky "
        f"**{best_leaky}**.\n"
        f"- Is QDA the most robust head? protocol (a) accuracy: {verdict(best_a)}; "
        f"protocol (a) drop: {verdict(least_drop)}; (b) leak-free: {verdict(best_free)}; "
        f"(b) leaky: {verdict(best_leaky)}.\n"
        if has_qda else ""
    )
    n_cell = r["n_test_per_cell"]
    return "\n".join([
        "## CIFAR-10-C: distribution shift, leak-free and leaky (`benchmarks/bench_cifar10c.py`)",
        "",
        f"Machine: {r['machine']}. Encoder {r['encoder']} at {r['resolution']} px (ONNX, "
        f"fingerprint `{r['encoder_fingerprint']}`). CIFAR-10-C generated locally by "
        "`ghofl.data.corruptions` (19 corruptions x 5 severities, CIFAR-10-C strengths, seed 0; "
        "differences from the original recipe in its module docstring). "
        f"Subsampled to fit a 2-core budget: every corruption x severity cell holds the same "
        f"{n_cell} CIFAR-10 test images ({r['test_per_class']} per class); clean training "
        f"statistics from {r['n_clean_train']} training images, clean test on "
        f"{r['n_clean_test']}. One aggregate in mode `full`; every head at its defaults; "
        "the probe is scikit-learn logistic regression on the same training features (C by "
        "3-fold CV on train only). Accuracy in %; the standard error of one cell is about "
        f"{100 * (0.25 / n_cell) ** 0.5:.0f} points, of a severity mean (19 cells) about "
        f"{100 * (0.25 / (19 * n_cell)) ** 0.5:.1f}.",
        "",
        "### Protocol (a): clean statistics, corrupted test (mean over the corruptions)",
        "",
        sev_table,
        "",
        "Per corruption (mean over severities 1-5):",
        "",
        corr_table,
        "",
        "### Protocol (b): statistics from severities 1-4, test at severity 5",
        "",
        f"Leak-free: statistics from {b['leak-free']['n_train']} corrupted TRAINING images "
        f"({r['stats_per_class']} per class per corruption and severity); leaky (the paper's "
        f"variant): statistics from {b['leaky']['n_train']} corrupted images of the same TEST "
        "base images that are tested at severity 5. Same test set for both (mean over the 19 "
        "corruptions). The paper's column is its CIFAR-100-C number (100 classes, another "
        "encoder): a different dataset, shown only to compare the ranking of the heads.",
        "",
        b_table,
        "",
        bc_table,
        "",
        "### Does QDA hold up best under corruption?",
        "",
        checks,
    ])


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The flags of this benchmark (besides the harness's --report-only / --no-write)."""
    parser.add_argument("--encoder", default="efficientnet-lite0")
    parser.add_argument("--resolution", type=int, default=224)
    parser.add_argument("--heads", default="all", help="comma-separated names, or 'all'")
    parser.add_argument("--corruptions", default="all", help="comma-separated names, or 'all'")
    parser.add_argument("--train-per-class", type=int, default=2000,
                        help="clean training images per class (protocol a; 0 = all)")
    parser.add_argument("--test-per-class", type=int, default=20,
                        help="test images per class in every corruption x severity cell")
    parser.add_argument("--stats-per-class", type=int, default=20,
                        help="training images per class per corruption x severity (protocol b)")
    parser.add_argument("--probe-cv-samples", type=int, default=5000)


BENCH = harness.Benchmark(
    script=__file__,
    description=__doc__ or "",
    sections=(harness.Section("cifar10c", "cifar10c.json", render),),
    measure=lambda ctx: {"cifar10c": run(ctx.args)},
    add_arguments=add_arguments,
)

if __name__ == "__main__":
    harness.main(BENCH)
