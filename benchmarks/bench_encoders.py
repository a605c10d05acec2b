"""Encoder throughput and accuracy: eager PyTorch vs ONNX Runtime, and float vs int8.

Part ``torch``: for each resolution (128, 160, 224) both backends of EfficientNet-Lite0 embed
the same real CIFAR-10 test images (uint8 32x32, resized inside the model) in batches; the
reported rate is the median of ``--repeats`` timed runs after one warm-up batch (the ONNX export
and session creation are not timed). Writes benchmarks/results/encoders.json and the
``encoders`` section of BENCHMARKS.md.

Part ``int8``: for Lite0/1/2 at 224, the float ONNX encoder and its static int8 quantization
(:mod:`ghofl.client.encoders.quantize`, calibrated on 256 CIFAR-10 training images) embed the
same test images, alternating float and int8 runs so that both see the same machine load; the
speed-up is the median of the per-run ratios. Accuracy of every registered head (one aggregate,
mode ``full``) on a stratified CIFAR-10 subset (``--train-per-class``/``--test-per-class``; the
float features come from the embedding cache). Writes benchmarks/results/encoders_int8.json
and the ``encoders_int8`` section of BENCHMARKS.md.

Run: ``flock scratch/cpu.lock .venv/bin/python benchmarks/bench_encoders.py --parts int8``
(needs ``GHOFL_DATA_DIR`` or ../shared/data with cifar10.zip).
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

from ghofl.bench.report import (
    machine_summary,
    markdown_table,
    median_time,
    update_section,
    write_json,
)
from ghofl.client.encoders import Encoder, get_encoder
from ghofl.data.registry import load_dataset, subsample

ROOT = Path(__file__).resolve().parents[1]
TARGET_RATIO = 4.0
INT8_TARGET_SPEEDUP = 2.0
INT8_MAX_LOSS_POINTS = 0.3


def _data_dir() -> str:
    return os.environ.get("GHOFL_DATA_DIR") or str(ROOT.parent / "shared" / "data")


def _images(n: int) -> np.ndarray:
    src = load_dataset("cifar10", "test", data_dir=_data_dir())
    per_class = -(-n // len(src.classes))  # ceil, then trim to exactly n
    idx = subsample(src.labels, per_class=per_class, seed=0)[:n]
    return src.load_batch(idx)  # type: ignore[return-value]


def _embed_all(enc: Encoder, images: np.ndarray, batch_size: int) -> np.ndarray:
    return np.concatenate(
        [enc.embed(images[i : i + batch_size]) for i in range(0, len(images), batch_size)]
    )


def bench_resolution(
    images: np.ndarray, resolution: int, repeats: int, batch_size: int, cache_dir: str
) -> dict[str, Any]:
    out: dict[str, Any] = {"resolution": resolution, "n_images": len(images)}
    feats = {}
    for backend in ("torch", "onnx"):
        enc = get_encoder("efficientnet-lite0", resolution, backend, cache_dir=cache_dir)
        enc.embed(images[:batch_size])  # warm-up (export, session, allocator)
        seconds, samples = median_time(lambda e=enc: _embed_all(e, images, batch_size), repeats)  # type: ignore[misc]
        out[f"{backend}_img_per_s"] = len(images) / seconds
        out[f"{backend}_seconds_samples"] = samples
        feats[backend] = _embed_all(enc, images[:batch_size], batch_size)
        out["fingerprint"] = enc.info.fingerprint()
    out["onnx_over_torch"] = out["onnx_img_per_s"] / out["torch_img_per_s"]
    out["max_abs_diff"] = float(np.abs(feats["torch"] - feats["onnx"]).max())
    return out


def render(result: dict[str, Any]) -> str:
    rows = [
        [
            r["resolution"],
            f"{r['torch_img_per_s']:.1f}",
            f"{r['onnx_img_per_s']:.1f}",
            f"{r['onnx_over_torch']:.1f}x",
            f"{r['max_abs_diff']:.1e}",
        ]
        for r in result["runs"]
    ]
    table = markdown_table(
        ["resolution", "eager PyTorch img/s", "ONNX Runtime img/s", "ONNX / torch", "max abs diff"],
        rows,
    )
    r224 = result["ratio_at_224"]
    if r224 is None:
        summary = "224 was not measured in this run.\n"
    else:
        verdict = "met" if r224 >= TARGET_RATIO else "NOT met"
        summary = (
            f"ONNX/torch ratio at 224: **{r224:.1f}x** "
            f"(target >= {TARGET_RATIO:.0f}x: {verdict}).\n"
        )
    return (
        "## Encoders: EfficientNet-Lite0, eager PyTorch vs ONNX Runtime\n\n"
        "Written by `benchmarks/bench_encoders.py`. "
        f"{result['n_images']} real CIFAR-10 test images (32x32 JPEG, decoded to uint8, resized "
        f"inside the model), batch {result['batch_size']}, median of {result['repeats']} runs "
        "after a warm-up batch; both backends share the same encoder fingerprint. "
        f"Machine: {result['machine']}.\n\n"
        f"{table}\n\n{summary}"
    )


def _head_accuracies(
    enc: Encoder, train_pc: int, test_pc: int, heads: list[str]
) -> tuple[dict[str, float], np.ndarray, dict[str, np.ndarray]]:
    """Accuracy of every head fitted on the stratified train subset, scored on the test subset;
    also the test features and every head's test predictions."""
    from ghofl.client.embed import embed_dataset_cached
    from ghofl.heads.build import build_heads
    from ghofl.stats import compute_stats

    xy = {}
    for split, pc in (("train", train_pc), ("test", test_pc)):
        src = load_dataset("cifar10", split, data_dir=_data_dir())
        idx = subsample(src.labels, per_class=pc, seed=0)
        xy[split] = embed_dataset_cached("cifar10", split, enc, idx, data_dir=_data_dir())
    classes = load_dataset("cifar10", "train", data_dir=_data_dir()).classes
    stats = compute_stats(*xy["train"], classes, mode="full", encoder=enc.info)
    acc, preds = {}, {}
    for name, head in build_heads(heads, seed=0).items():
        head.fit_from_stats(stats)
        preds[name] = head.predict(xy["test"][0])
        acc[name] = float(np.mean(preds[name] == xy["test"][1]))
    return acc, xy["test"][0], preds


def bench_int8_variant(
    variant: str, images: np.ndarray, calibration: np.ndarray, args: argparse.Namespace,
    heads: list[str],
) -> dict[str, Any]:
    """Float vs int8 of one Lite variant: side-by-side throughput, then accuracy of every head."""
    flt = get_encoder(variant, args.int8_resolution)
    q = get_encoder(f"{variant}-int8", args.int8_resolution, calibration=calibration)
    t0 = time.perf_counter()
    q.embed(images[: args.batch_size])  # builds (quantizes) or loads the cached int8 model
    build_s = time.perf_counter() - t0
    flt.embed(images[: args.batch_size])
    tf, tq = [], []
    for _ in range(args.repeats):  # alternate, so both see the same load
        tf.append(median_time(lambda: _embed_all(flt, images, args.batch_size), 1)[0])
        tq.append(median_time(lambda: _embed_all(q, images, args.batch_size), 1)[0])
    out: dict[str, Any] = {
        "variant": variant,
        "float_fingerprint": flt.info.fingerprint(),
        "int8_fingerprint": q.info.fingerprint(),
        "int8_build_or_load_seconds": build_s,
        "float_seconds_samples": tf,
        "int8_seconds_samples": tq,
        "float_img_per_s": len(images) / statistics.median(tf),
        "int8_img_per_s": len(images) / statistics.median(tq),
        "speedup": statistics.median([a / b for a, b in zip(tf, tq, strict=True)]),
    }
    print(f"{variant}: float {out['float_img_per_s']:.1f} img/s, int8 "
          f"{out['int8_img_per_s']:.1f} img/s ({out['speedup']:.2f}x)", flush=True)
    if args.train_per_class > 0:
        acc_f, xf, pf = _head_accuracies(flt, args.train_per_class, args.test_per_class, heads)
        acc_q, xq, pq = _head_accuracies(q, args.train_per_class, args.test_per_class, heads)
        cos = np.sum(xf * xq, 1) / (np.linalg.norm(xf, axis=1) * np.linalg.norm(xq, axis=1))
        best_f = max(acc_f, key=lambda k: acc_f[k])
        best_q = max(acc_q, key=lambda k: acc_q[k])
        out.update({
            "float_accuracy": acc_f,
            "int8_accuracy": acc_q,
            "best_float": [best_f, acc_f[best_f]],
            "best_int8": [best_q, acc_q[best_q]],
            "best_loss_points": 100 * (acc_f[best_f] - acc_q[best_q]),
            "feature_cosine_mean": float(cos.mean()),
            "feature_cosine_min": float(cos.min()),
            "prediction_agreement": {h: float(np.mean(pf[h] == pq[h])) for h in heads},
        })
        print(f"  best head float {best_f} {acc_f[best_f]:.4f}, int8 {best_q} "
              f"{acc_q[best_q]:.4f}; feature cosine {cos.mean():.4f}", flush=True)
    return out


def render_int8(result: dict[str, Any]) -> str:
    heads = result["heads"]
    rows = []
    for r in result["runs"]:
        for kind in ("float", "int8"):
            acc = r.get(f"{kind}_accuracy", {})
            rate = r[f"{kind}_img_per_s"]
            speed = "1.00x" if kind == "float" else f"{r['speedup']:.2f}x"
            name = r["variant"] + ("" if kind == "float" else "-int8")
            rows.append(
                [name, f"{rate:.1f}", speed]
                + [f"{100 * acc[h]:.1f}" if h in acc else "" for h in heads]
            )
    table = markdown_table(["encoder", "img/s (224 px)", "vs float", *heads], rows)
    lines = []
    for r in result["runs"]:
        ok_speed = r["speedup"] >= INT8_TARGET_SPEEDUP
        line = (
            f"- {r['variant']}: int8 is **{r['speedup']:.2f}x** the float throughput "
            f"(goal >= {INT8_TARGET_SPEEDUP:.0f}x: {'met' if ok_speed else 'NOT met'})"
        )
        if "best_loss_points" in r:
            ok_acc = r["best_loss_points"] <= INT8_MAX_LOSS_POINTS
            agree = r["prediction_agreement"]
            line += (
                f"; best head {r['best_float'][0]} {100 * r['best_float'][1]:.1f} (float) vs "
                f"{r['best_int8'][0]} {100 * r['best_int8'][1]:.1f} (int8), a loss of "
                f"{r['best_loss_points']:.1f} points (goal <= {INT8_MAX_LOSS_POINTS}: "
                f"{'met' if ok_acc else 'NOT met'}); feature cosine int8 vs float "
                f"{r['feature_cosine_mean']:.3f} (min {r['feature_cosine_min']:.3f}); "
                f"prediction agreement {min(agree.values()):.3f}-{max(agree.values()):.3f}"
            )
        lines.append(line + ".")
    n_test = 10 * result["test_per_class"]
    return (
        "## Encoders: float vs int8 (static quantization, ONNX Runtime), "
        "EfficientNet-Lite0/1/2\n\n"
        "Written by `benchmarks/bench_encoders.py --parts int8`. Throughput: "
        f"{result['n_images']} real CIFAR-10 test images at {result['resolution']} px, batch "
        f"{result['batch_size']}, float and int8 runs alternated {result['repeats']} times "
        "(speed-up = median of the per-run ratios, so both see the same machine load); the "
        "quantization itself is not timed. int8: QDQ, per-channel 7-bit weights (AVX2 without "
        "VNNI saturates 8-bit products), uint8 activations calibrated (min/max) on 256 CIFAR-10 "
        "training images; preprocessing and the final average stay float; own encoder "
        "fingerprint. Accuracy: every head fitted from the statistics of "
        f"{10 * result['train_per_class']} training images ({result['train_per_class']} per "
        f"class) and scored on {n_test} test images (one image = {100 / n_test:.2f} points). "
        f"Machine: {result['machine']}.\n\n"
        f"{table}\n\n" + "\n".join(lines) + "\n"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--parts", default="torch,int8", help="comma-separated: torch, int8")
    parser.add_argument("--n", type=int, default=256, help="images per throughput run")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--resolutions", type=int, nargs="+", default=[128, 160, 224])
    parser.add_argument("--int8-variants", nargs="+",
                        default=["efficientnet-lite0", "efficientnet-lite1", "efficientnet-lite2"])
    parser.add_argument("--int8-resolution", type=int, default=224)
    parser.add_argument("--train-per-class", type=int, default=200,
                        help="int8 accuracy: training images per class (0 = skip accuracy)")
    parser.add_argument("--test-per-class", type=int, default=50)
    parser.add_argument("--heads", default="all", help="comma-separated names, or 'all'")
    args = parser.parse_args()
    parts = {p.strip() for p in args.parts.split(",") if p.strip()}
    images = _images(args.n)
    if "torch" in parts:
        main_torch(args, images)
    if "int8" in parts:
        from ghofl.client.encoders.quantize import default_calibration_images
        from ghofl.heads.registry import available_heads

        heads = available_heads() if args.heads == "all" else args.heads.split(",")
        calibration = default_calibration_images(_data_dir())
        runs = [bench_int8_variant(v, images, calibration, args, heads)
                for v in args.int8_variants]
        result = {
            "machine": machine_summary(),
            "n_images": len(images),
            "batch_size": args.batch_size,
            "repeats": args.repeats,
            "resolution": args.int8_resolution,
            "train_per_class": args.train_per_class,
            "test_per_class": args.test_per_class,
            "heads": heads,
            "runs": runs,
        }
        write_json(ROOT / "benchmarks" / "results" / "encoders_int8.json", result)
        update_section(ROOT / "BENCHMARKS.md", "encoders_int8", render_int8(result))
        print(render_int8(result))


def main_torch(args: argparse.Namespace, images: np.ndarray) -> None:
    runs = []
    with tempfile.TemporaryDirectory() as cache_dir:
        for res in args.resolutions:
            runs.append(bench_resolution(images, res, args.repeats, args.batch_size, cache_dir))
            print(
                f"res {res}: torch {runs[-1]['torch_img_per_s']:.1f} img/s, "
                f"onnx {runs[-1]['onnx_img_per_s']:.1f} img/s",
                flush=True,
            )
    by_res = {r["resolution"]: r for r in runs}
    result = {
        "encoder": "efficientnet-lite0",
        "machine": machine_summary(),
        "n_images": len(images),
        "batch_size": args.batch_size,
        "repeats": args.repeats,
        "runs": runs,
        "ratio_at_224": by_res[224]["onnx_over_torch"] if 224 in by_res else None,
        "target_ratio_at_224": TARGET_RATIO,
    }
    write_json(ROOT / "benchmarks" / "results" / "encoders.json", result)
    update_section(ROOT / "BENCHMARKS.md", "encoders", render(result))
    print(render(result))


if __name__ == "__main__":
    main()
