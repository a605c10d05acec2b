"""Encoder throughput: eager PyTorch vs ONNX Runtime for EfficientNet-Lite0 on real CIFAR-10.

For each resolution (128, 160, 224) both backends embed the same real CIFAR-10 test images
(uint8 32x32, resized inside the model) in batches; the reported rate is the median of
``--repeats`` timed runs after one warm-up batch (the ONNX export and session creation are not
timed). Writes benchmarks/results/encoders.json and the ``encoders`` section of BENCHMARKS.md.

Run: ``.venv/bin/python benchmarks/bench_encoders.py`` (about 3-5 minutes on 2 cores; needs
``GHOFL_DATA_DIR`` or ../shared/data with cifar10.zip).
"""

from __future__ import annotations

import argparse
import os
import tempfile
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


def _images(n: int) -> np.ndarray:
    data_dir = os.environ.get("GHOFL_DATA_DIR") or str(ROOT.parent / "shared" / "data")
    src = load_dataset("cifar10", "test", data_dir=data_dir)
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


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, default=256, help="images per resolution")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--resolutions", type=int, nargs="+", default=[128, 160, 224])
    args = parser.parse_args()
    images = _images(args.n)
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
