"""Encoder throughput and accuracy: eager PyTorch vs ONNX Runtime, and float vs int8.

Part ``torch``: for each resolution (128, 160, 224) both backends of EfficientNet-Lite0 embed
the same real CIFAR-10 test images (uint8 32x32, resized inside the model) in batches; the
reported rate is the median of ``--repeats`` timed runs after one warm-up batch (the ONNX export
and session creation are not timed). Writes benchmarks/results/encoders.json and the
``encoders`` section of BENCHMARKS.md.

Part ``int8``: for Lite0/1/2 at 224, the float ONNX encoder and its static int8 quantization
(:mod:`ghofl.client.encoders.quantize`, default settings, calibrated on 256 CIFAR-10 training
images) embed the same test images, alternating float and int8 runs so that both see the same
machine load; the speed-up is the median of the per-run ratios. One profiled run of each model
(ONNX Runtime profiler) splits the time by operator kind (stem, depthwise, pointwise and head
convolutions, the rest). Accuracy of every registered head (one aggregate, mode ``full``) on a
stratified CIFAR-10 subset (``--train-per-class``/``--test-per-class``; the float features
come from the embedding cache). Writes benchmarks/results/encoders_int8.json and the
``encoders_int8`` section of BENCHMARKS.md.

Part ``int8sweep``: Lite0 quantized with each of the settings in :data:`SWEEP`, each timed
against the float model in the same process (alternated runs, median ratio) and compared by
feature cosine to float on the same images. Writes benchmarks/results/encoders_int8_sweep.json
and the ``encoders_int8_sweep`` section.

Run: ``flock scratch/cpu.lock .venv/bin/python benchmarks/bench_encoders.py --parts int8``
(needs ``GHOFL_DATA_DIR`` or ../shared/data with cifar10.zip); ``--report-only`` rewrites the
three sections from the saved results.
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

from ghofl.bench import harness
from ghofl.bench.harness import median_times
from ghofl.bench.report import machine_summary, markdown_table
from ghofl.client.encoders import Encoder, get_encoder
from ghofl.client.encoders.onnx_backend import OnnxEncoder
from ghofl.data.registry import load_dataset, subsample

ROOT = Path(__file__).resolve().parents[1]
TARGET_RATIO = 4.0
INT8_TARGET_SPEEDUP = 2.0
INT8_MAX_LOSS_POINTS = 0.3
INT8_WHY = (
    "The CPU has AVX2 but neither VNNI nor AVX-512, so ONNX Runtime's uint8 x int8 kernels "
    "multiply with `vpmaddubsw` + `vpmaddwd` (two multiply instructions per 32 products, through "
    "saturating 16-bit pair sums) where the float kernels issue one `vfmadd` per 8 products and "
    "use blocked NCHWc layouts with the activation fused in: at best about twice the float rate, "
    "and much less where the integer multiplies do not issue as often as the FMAs. The same "
    "`vpmaddubsw` forces 7-bit weights in the matrix-product convolutions (with 8-bit weights "
    "the 16-bit sums saturate), which is where most of the accuracy goes; the depthwise kernel "
    "does not saturate and keeps 8-bit weights. The stem (3 input channels) and the head "
    "convolution stay float by default. The settings tried are in the section \"Encoders: int8 "
    "settings tried\" (`--parts int8sweep`).\n"
)


def _data_dir() -> str:
    return str(harness.find_data_dir(ROOT))


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
        seconds, samples = median_times(
            {backend: lambda e=enc: _embed_all(e, images, batch_size)}, repeats  # type: ignore[misc]
        )[backend]
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


def _onnx(enc: Encoder) -> OnnxEncoder:
    if not isinstance(enc, OnnxEncoder):
        raise TypeError(f"expected an ONNX Runtime encoder, got {enc!r}")
    return enc


def _conv_kinds(path: Path) -> dict[str, str]:
    """Kind of every convolution node of ONNX Runtime's optimized graph of ``path``: stem (the
    first), head (the last), depthwise (group > 1) or pointwise."""
    import onnx
    import onnxruntime as ort

    with tempfile.TemporaryDirectory() as tmp:
        opts = ort.SessionOptions()
        opts.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
        opts.optimized_model_filepath = str(Path(tmp) / "opt.onnx")
        opts.log_severity_level = 3
        ort.InferenceSession(str(path), opts, providers=["CPUExecutionProvider"])
        nodes = onnx.load(str(Path(tmp) / "opt.onnx")).graph.node
    convs = [n for n in nodes if "Conv" in n.op_type]
    kinds = {}
    for i, n in enumerate(convs):
        depthwise = any(a.name == "group" and a.i > 1 for a in n.attribute)
        kinds[n.name] = ("conv stem" if i == 0 else "conv head" if i == len(convs) - 1
                         else "conv depthwise" if depthwise else "conv pointwise")
    return kinds


def _session(path: Path, threads: int, profile_dir: str | None = None) -> Any:
    import onnxruntime as ort

    opts = ort.SessionOptions()
    opts.intra_op_num_threads = threads
    opts.inter_op_num_threads = 1
    opts.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    opts.log_severity_level = 3
    if profile_dir is not None:
        opts.enable_profiling = True
        opts.profile_file_prefix = str(Path(profile_dir) / "prof")
    return ort.InferenceSession(str(path), opts, providers=["CPUExecutionProvider"])


def _run_file(sess: Any, images: np.ndarray, batch_size: int) -> np.ndarray:
    return np.concatenate([sess.run(["features"], {"x": images[i : i + batch_size]})[0]
                           for i in range(0, len(images), batch_size)])


def op_profile(path: Path, images: np.ndarray, batch_size: int, threads: int) -> dict[str, float]:
    """Milliseconds per operator kind (convolutions split by :func:`_conv_kinds`) of one
    profiled run over ``images``, after one warm-up batch."""
    import json

    kinds = _conv_kinds(path)
    with tempfile.TemporaryDirectory() as tmp:
        sess = _session(path, threads, tmp)
        _run_file(sess, images[:batch_size], batch_size)
        _run_file(sess, images, batch_size)
        with open(sess.end_profiling()) as fh:
            events = json.load(fh)
    runs = [e for e in events if e.get("cat") == "Session" and e["name"] == "model_run"]
    start = runs[1]["ts"] if len(runs) > 1 else 0  # runs[0] is the warm-up batch
    out: dict[str, float] = {}
    for e in events:
        if e.get("cat") == "Node" and e["name"].endswith("_kernel_time") and e["ts"] >= start:
            node = e["name"].removesuffix("_kernel_time")
            kind = kinds.get(node, e["args"].get("op_name", "?"))
            out[kind] = out.get(kind, 0.0) + e["dur"] / 1e3
    return out


def bench_int8_variant(
    variant: str, images: np.ndarray, calibration: np.ndarray, args: argparse.Namespace,
    heads: list[str],
) -> dict[str, Any]:
    """Float vs int8 of one Lite variant: side-by-side throughput, then accuracy of every head."""
    flt = _onnx(get_encoder(variant, args.int8_resolution))
    q = _onnx(get_encoder(f"{variant}-int8", args.int8_resolution, calibration=calibration))
    t0 = time.perf_counter()
    q.embed(images[: args.batch_size])  # builds (quantizes) or loads the cached int8 model
    build_s = time.perf_counter() - t0
    flt.embed(images[: args.batch_size])
    times = median_times({  # side by side, so both see the same load
        "float": lambda: _embed_all(flt, images, args.batch_size),
        "int8": lambda: _embed_all(q, images, args.batch_size),
    }, args.repeats)
    tf, tq = times["float"][1], times["int8"][1]
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
    h, w = images.shape[1:3]
    prof = images[: args.profile_images]
    out["profile_ms"] = {
        "float": op_profile(flt.onnx_path(h, w), prof, args.batch_size, flt.threads),
        "int8": op_profile(q.onnx_path(h, w), prof, args.batch_size, q.threads),
    }
    out["profile_images"] = len(prof)
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


def _sweep() -> list[tuple[str, Any]]:
    from ghofl.client.encoders.quantize import QuantSettings

    return [
        ("default", QuantSettings()),
        ("all convolutions int8, 7-bit depthwise (the first default)",
         QuantSettings(keep_float=(), depthwise_8bit=False)),
        ("all convolutions int8", QuantSettings(keep_float=())),
        ("QOperator format", QuantSettings(quant_format="qoperator")),
        ("per-tensor weights", QuantSettings(per_channel=False)),
        ("8-bit weights everywhere (reduce_range off)", QuantSettings(reduce_range=False)),
        ("uint8 weights (U8U8 kernels)", QuantSettings(weight_type="uint8", reduce_range=False)),
    ]


def bench_int8_sweep(
    images: np.ndarray, calibration: np.ndarray, args: argparse.Namespace
) -> dict[str, Any]:
    """Lite0 quantized with each :func:`_sweep` setting: speed vs float side by side, cosine."""
    from ghofl.client.encoders.quantize import quantize_onnx

    flt = _onnx(get_encoder("efficientnet-lite0", args.int8_resolution))
    flt.embed(images[:2])  # make sure the float export exists
    h, w = images.shape[1:3]
    float_path = flt.onnx_path(h, w)
    sf = _session(float_path, flt.threads)
    ref = _run_file(sf, images, args.batch_size)
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for i, (label, settings) in enumerate(_sweep()):
            path = quantize_onnx(float_path, Path(tmp) / f"v{i}.onnx", calibration, settings)
            sq = _session(path, flt.threads)
            feats = _run_file(sq, images, args.batch_size)
            cos = np.sum(ref * feats, 1) / (
                np.linalg.norm(ref, axis=1) * np.linalg.norm(feats, axis=1)
            )
            times = median_times({
                "float": lambda: _run_file(sf, images, args.batch_size),
                "int8": lambda s=sq: _run_file(s, images, args.batch_size),  # type: ignore[misc]
            }, args.repeats)
            tf, tq = times["float"][1], times["int8"][1]
            rows.append({
                "label": label,
                "settings": settings.describe(),
                "speedup": statistics.median([a / b for a, b in zip(tf, tq, strict=True)]),
                "float_img_per_s": len(images) / statistics.median(tf),
                "int8_img_per_s": len(images) / statistics.median(tq),
                "cosine_mean": float(cos.mean()),
                "cosine_min": float(cos.min()),
            })
            print(f"sweep {label}: {rows[-1]['speedup']:.2f}x, cosine {cos.mean():.4f}", flush=True)
            path.unlink()
    return {"rows": rows}


def render_int8_sweep(result: dict[str, Any]) -> str:
    table = markdown_table(
        ["setting", "int8 img/s", "float img/s", "int8 / float", "feature cosine mean (min)"],
        [
            [r["label"], f"{r['int8_img_per_s']:.1f}", f"{r['float_img_per_s']:.1f}",
             f"{r['speedup']:.2f}x", f"{r['cosine_mean']:.3f} ({r['cosine_min']:.3f})"]
            for r in result["rows"]
        ],
    )
    return (
        "## Encoders: int8 settings tried (EfficientNet-Lite0, 224 px)\n\n"
        "Written by `benchmarks/bench_encoders.py --parts int8sweep`. Lite0 quantized with each "
        f"setting (calibrated on {result['n_calibration']} CIFAR-10 training images), timed "
        f"against the float model in the same process on {result['n_images']} CIFAR-10 test "
        f"images (batch {result['batch_size']}, {result['repeats']} alternated runs, median of "
        "the per-run ratios), and compared with the float features of the same images (cosine). "
        "Unless named, a row uses the default settings: "
        f"{result['default_settings']}. The histogram calibrations (percentile, entropy) are not "
        "in the sweep: they keep every activation of every calibration image in memory (entropy "
        f"needed more than 16 GiB for 256 images). Machine: {result['machine']}.\n\n{table}\n"
    )


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
    kinds = ["conv pointwise", "conv depthwise", "conv stem", "conv head"]
    prof_rows = []
    for r in result["runs"]:
        pf, pq = r["profile_ms"]["float"], r["profile_ms"]["int8"]
        rest_f = sum(v for k, v in pf.items() if k not in kinds)
        rest_q = sum(v for k, v in pq.items() if k not in kinds)
        cells = [f"{pf.get(k, 0):.0f} / {pq.get(k, 0):.0f}" for k in kinds]
        prof_rows.append([r["variant"], *cells, f"{rest_f:.0f} / {rest_q:.0f}",
                          f"{sum(pf.values()):.0f} / {sum(pq.values()):.0f}"])
    prof_table = markdown_table(
        ["encoder", *(f"{k} ms" for k in kinds), "other ops ms", "total ms"], prof_rows
    )
    n_prof = result["runs"][0]["profile_images"] if result["runs"] else 0
    kind_lines = []
    for r in result["runs"]:
        pf, pq = r["profile_ms"]["float"], r["profile_ms"]["int8"]
        ratios = [f"{k.removeprefix('conv ')} {pq[k] / pf[k]:.2f}" for k in kinds
                  if pf.get(k, 0) > 0 and k in pq]
        kind_lines.append(f"- {r['variant']}: int8 / float kernel time: " + ", ".join(ratios)
                          + " (below 1 = int8 faster).")
    return (
        "## Encoders: float vs int8 (static quantization, ONNX Runtime), "
        "EfficientNet-Lite0/1/2\n\n"
        "Written by `benchmarks/bench_encoders.py --parts int8`. Throughput: "
        f"{result['n_images']} real CIFAR-10 test images at {result['resolution']} px, batch "
        f"{result['batch_size']}, float and int8 runs alternated {result['repeats']} times "
        "(speed-up = median of the per-run ratios, so both see the same machine load); the "
        f"quantization itself is not timed. int8 settings: {result['settings']}; calibrated on "
        f"{result['n_calibration']} CIFAR-10 training images; the preprocessing and the final "
        "average stay float; own encoder fingerprint. Accuracy: every head fitted from the "
        "statistics of "
        f"{10 * result['train_per_class']} training images ({result['train_per_class']} per "
        f"class) and scored on {n_test} test images (one image = {100 / n_test:.2f} points). "
        f"Machine: {result['machine']}.\n\n"
        f"{table}\n\n" + "\n".join(lines) + "\n\n"
        f"Where the time goes (ONNX Runtime profiler, one run of {n_prof} images, float / int8 "
        "kernel milliseconds; the int8 graph is fully fused: QLinearConv and QLinearAdd, no "
        "QuantizeLinear/DequantizeLinear left inside the network):\n\n"
        f"{prof_table}\n\n" + "\n".join(kind_lines) + "\n\n" + INT8_WHY
    )


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The flags of this benchmark (besides the harness's --report-only / --no-write / --out)."""
    parser.add_argument("--parts", default="torch,int8,int8sweep",
                        help="comma-separated: torch, int8, int8sweep")
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
    parser.add_argument("--profile-images", type=int, default=64,
                        help="int8: images of the profiled run")
    parser.add_argument("--sweep-n", type=int, default=64,
                        help="int8sweep: images per timed run and for the cosine")


def measure(ctx: harness.Context) -> dict[str, Any]:
    """The parts asked for, in the order torch, int8, int8sweep (one section each).

    Each part's results are saved as soon as it is done, so a later part that fails keeps them.
    """
    args = ctx.args
    parts = {p.strip() for p in args.parts.split(",") if p.strip()}
    images = _images(args.n)
    out: dict[str, Any] = {}
    if "torch" in parts:
        out["encoders"] = measure_torch(args, images)
        ctx.save("encoders.json", out["encoders"])
    if "int8" in parts:
        from ghofl.client.encoders.quantize import default_calibration_images
        from ghofl.heads.registry import available_heads

        heads = available_heads() if args.heads == "all" else args.heads.split(",")
        from ghofl.client.encoders.quantize import QuantSettings

        calibration = default_calibration_images(_data_dir())
        runs = [bench_int8_variant(v, images, calibration, args, heads)
                for v in args.int8_variants]
        out["encoders_int8"] = {
            "machine": machine_summary(),
            "settings": QuantSettings().describe(),
            "n_calibration": len(calibration),
            "n_images": len(images),
            "batch_size": args.batch_size,
            "repeats": args.repeats,
            "resolution": args.int8_resolution,
            "train_per_class": args.train_per_class,
            "test_per_class": args.test_per_class,
            "heads": heads,
            "runs": runs,
        }
        ctx.save("encoders_int8.json", out["encoders_int8"])
    if "int8sweep" in parts:
        from ghofl.client.encoders.quantize import QuantSettings, default_calibration_images

        calibration = default_calibration_images(_data_dir())
        sweep_images = images[: args.sweep_n]
        out["encoders_int8_sweep"] = {
            "machine": machine_summary(),
            "n_images": len(sweep_images),
            "n_calibration": len(calibration),
            "batch_size": args.batch_size,
            "repeats": args.repeats,
            "resolution": args.int8_resolution,
            "default_settings": QuantSettings().describe(),
            **bench_int8_sweep(sweep_images, calibration, args),
        }
    return out


def measure_torch(args: argparse.Namespace, images: np.ndarray) -> dict[str, Any]:
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
    return {
        "encoder": "efficientnet-lite0",
        "machine": machine_summary(),
        "n_images": len(images),
        "batch_size": args.batch_size,
        "repeats": args.repeats,
        "runs": runs,
        "ratio_at_224": by_res[224]["onnx_over_torch"] if 224 in by_res else None,
        "target_ratio_at_224": TARGET_RATIO,
    }


BENCH = harness.Benchmark(
    script=__file__,
    description=__doc__ or "",
    sections=(
        harness.Section("encoders", "encoders.json", render),
        harness.Section("encoders_int8", "encoders_int8.json", render_int8),
        harness.Section("encoders_int8_sweep", "encoders_int8_sweep.json", render_int8_sweep),
    ),
    measure=measure,
    add_arguments=add_arguments,
)

if __name__ == "__main__":
    harness.main(BENCH)
