"""The fitted model in use: ``ghofl predict`` and exported-graph throughput, and the OOD score.

Part ``throughput``: a model directory (LDA and the OOD score fitted from the statistics of
CIFAR-10 training images, EfficientNet-Lite0 at 224 through ONNX Runtime) classifies
``--n-images`` CIFAR-10 test images written as PNG files to a temporary folder. Three
timings, side by side (each repeat runs all three in turn; medians of ``--repeats``):

* ``encoder``: the encoder alone on the decoded uint8 images, in batches of ``--batch-size``;
* ``predict``: the whole ``ghofl predict MODEL --data FOLDER --out FILE.csv`` command in
  process (encoder rebuilt and fingerprint checked, files listed and decoded, transform,
  head, OOD score, CSV written atomically);
* ``export``: the graph of ``ghofl export MODEL --head lda`` (encoder + head in one ONNX file)
  on the same decoded images in plain ONNX Runtime, against ``encoder``.

Part ``ood``: how well ``ood_score`` (squared Mahalanobis distance to the nearest class mean
under the model's shrunk pooled covariance, :mod:`ghofl.heads.ood`) separates CIFAR-10 test
images (in distribution) from Tiny-ImageNet validation images and from CIFAR-10-C images built
locally (:mod:`ghofl.data.corruptions`, every corruption at each severity of
``--severities``). AUROC, the false-positive rate at 95 % true-positive rate and the rates
flagged at the Gaussian reference threshold (``gaussian_threshold_``: the 0.99 quantile of
the in-distribution score under the Gaussian model; the flag itself needs a calibrated
threshold, measured by ``benchmarks/bench_ood.py``), beside the maximum-softmax-probability
baseline of the LDA head.

Writes benchmarks/results/predict_throughput.json, benchmarks/results/predict_ood.json and
the sections ``predict_throughput`` and ``predict_ood`` of BENCHMARKS.md. Run:
``.venv/bin/python benchmarks/bench_predict.py`` (needs ``GHOFL_DATA_DIR`` or ../shared/data
with cifar10.zip and tiny-imagenet-200.zip); ``--report-only`` rewrites both sections.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import statistics
import tempfile
from pathlib import Path
from typing import Any

import numpy as np
from numpy.typing import NDArray

from ghofl.bench import harness
from ghofl.bench.report import machine_summary, markdown_table
from ghofl.client.embed import embed_dataset_cached
from ghofl.client.encoders import Encoder, get_encoder
from ghofl.data.corruptions import ALL_CORRUPTIONS, CorruptedImages
from ghofl.data.registry import load_dataset, subsample
from ghofl.heads.ood import MahalanobisOOD
from ghofl.heads.registry import make_head
from ghofl.moments.core import compute_moments
from ghofl.stats import compute_stats

ENCODER = "efficientnet-lite0"
RESOLUTION = 224
#: The issue's target: ``ghofl predict`` within 10 % of the encoder's own throughput.
PREDICT_TARGET = 0.90


def _add_arguments(ap: argparse.ArgumentParser) -> None:
    ap.add_argument("--parts", default="throughput,ood",
                    help="Comma-separated parts: throughput, ood.")
    ap.add_argument("--train-per-class", type=int, default=300,
                    help="CIFAR-10 training images per class behind the statistics.")
    ap.add_argument("--test-per-class", type=int, default=100,
                    help="CIFAR-10 test images per class (in distribution, part ood).")
    ap.add_argument("--tiny-per-class", type=int, default=5,
                    help="Tiny-ImageNet validation images per class (200 classes, part ood).")
    ap.add_argument("--corrupt-per-class", type=int, default=20,
                    help="CIFAR-10 test images per class for each corruption x severity.")
    ap.add_argument("--severities", default="1,3,5",
                    help="CIFAR-10-C severities (comma-separated, 1..5).")
    ap.add_argument("--n-images", type=int, default=1024,
                    help="Images classified per timed run (part throughput).")
    ap.add_argument("--batch-size", type=int, default=64, help="Batch size of every timing.")
    ap.add_argument("--repeats", type=int, default=3, help="Timed repeats (median).")


# ---------------------------------------------------------------------------- shared pieces


def _encoder() -> Encoder:
    return get_encoder(ENCODER, RESOLUTION, "onnx")


def _train_features(enc: Encoder, data_dir: str, per_class: int) -> tuple[Any, Any]:
    src = load_dataset("cifar10", "train", data_dir=data_dir)
    idx = subsample(src.labels, per_class=per_class, seed=0)
    x, y = embed_dataset_cached("cifar10", "train", enc, idx, data_dir=data_dir)
    return x, compute_stats(x, y, src.classes, mode="full", encoder=enc.info)


def _fit(stats: Any) -> tuple[Any, MahalanobisOOD]:
    head = make_head("lda").fit_from_stats(stats)
    ood = MahalanobisOOD().fit_from_moments(compute_moments(stats))
    return head, ood


# ---------------------------------------------------------------------------- throughput


def _write_pngs(images: NDArray[np.uint8], folder: Path) -> None:
    from PIL import Image

    folder.mkdir(parents=True)
    for i, img in enumerate(images):
        Image.fromarray(img).save(folder / f"{i:05d}.png")


def _cli(argv: list[str]) -> None:
    from ghofl.cli.main import main

    err = io.StringIO()
    with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(err):
        rc = main(argv)
    if rc != 0:
        raise harness.BenchmarkError(f"ghofl {' '.join(argv)} exited with {rc}: "
                                     f"{err.getvalue().strip()[-2000:]}")


def _throughput(ctx: harness.Context) -> dict[str, Any]:
    import onnxruntime as ort

    from ghofl.model.directory import save_model

    args = ctx.args
    data_dir = str(ctx.data_dir())
    enc = _encoder()
    stats = _train_features(enc, data_dir, args.train_per_class)[1]
    head, ood = _fit(stats)
    test = load_dataset("cifar10", "test", data_dir=data_dir)
    per_class = -(-args.n_images // len(test.classes))
    idx = subsample(test.labels, per_class=per_class, seed=1)[: args.n_images]
    images = np.asarray(test.load_batch(idx), dtype=np.uint8)
    bs = args.batch_size
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        model = save_model(root / "model", {"lda": head}, stats_meta=stats.meta, ood=ood)
        _write_pngs(images, root / "images")
        graph = root / "model.onnx"
        h, w = images.shape[1:3]
        _cli(["export", str(model), "--head", "lda", "--out", str(graph),
              "--image-size", f"{h}x{w}"])
        opts = ort.SessionOptions()
        opts.log_severity_level = 3
        session = ort.InferenceSession(str(graph), opts, providers=["CPUExecutionProvider"])

        def encoder_only() -> None:
            for i in range(0, len(images), bs):
                enc.embed(images[i : i + bs])

        def predict() -> None:
            _cli(["predict", str(model), "--data", str(root / "images"), "--out",
                  str(root / "out.csv"), "--batch-size", str(bs), "--no-progress",
                  "--force"])  # every repeat rewrites the same file

        def exported() -> None:
            for i in range(0, len(images), bs):
                session.run(None, {"images": images[i : i + bs]})

        ctx.log(f"timing encoder / predict / exported graph on {len(images)} images")
        times = harness.median_times(
            {"encoder": encoder_only, "predict": predict, "export": exported},
            args.repeats, warmup=True)
    rates = {k: len(images) / v[0] for k, v in times.items()}
    return {
        "machine": machine_summary(), "date": _today(), "n_images": len(images),
        "batch_size": bs, "repeats": args.repeats, "encoder": ENCODER,
        "resolution": RESOLUTION, "fingerprint": enc.info.fingerprint(),
        "img_per_s": rates, "seconds_samples": {k: v[1] for k, v in times.items()},
        "predict_over_encoder": _median_ratio(times, "predict"),
        "export_over_encoder": _median_ratio(times, "export"),
    }


def _median_ratio(times: dict[str, tuple[float, list[float]]], name: str) -> float:
    """Median over the repeats of (encoder seconds / ``name`` seconds) in the same repeat.

    Each repeat times the three one after another, so a change of machine load between
    repeats cancels in the ratio.
    """
    pairs = zip(times["encoder"][1], times[name][1], strict=True)
    return float(statistics.median(e / t for e, t in pairs))


def _today() -> str:
    import datetime

    return datetime.date.today().isoformat()


def render_throughput(r: dict[str, Any]) -> str:
    rates = r["img_per_s"]
    table = markdown_table(
        ["what runs", "images/s (median)", "vs encoder alone (median of per-repeat ratios)"],
        [["encoder alone (decoded uint8 in memory)", f"{rates['encoder']:.1f}", "1.00"],
         ["`ghofl predict` (PNG folder -> CSV, LDA + OOD score)", f"{rates['predict']:.1f}",
          f"{r['predict_over_encoder']:.2f}"],
         ["exported graph (`ghofl export`, encoder + LDA), plain ONNX Runtime",
          f"{rates['export']:.1f}", f"{r['export_over_encoder']:.2f}"]])
    verdict = "met" if r["predict_over_encoder"] >= PREDICT_TARGET else "NOT met"
    return (
        "## The model in use: `ghofl predict` and exported-graph throughput "
        "(`benchmarks/bench_predict.py`)\n\n"
        f"{r['n_images']} CIFAR-10 test images (32x32, written as PNG files), "
        f"{r['encoder']} at {r['resolution']} through ONNX Runtime (fingerprint "
        f"{r['fingerprint']}), batch {r['batch_size']}; the three timings alternate in each of "
        f"{r['repeats']} repeats after a warm-up, medians. `predict` is the whole command in "
        "process: encoder rebuilt and its fingerprint checked, files listed and decoded, "
        "transform, head, OOD score, CSV written atomically. "
        f"Machine: {r['machine']}. Measured {r['date']}.\n\n{table}\n\n"
        f"`ghofl predict` at {r['predict_over_encoder']:.2f} of the encoder's own throughput "
        f"(target >= {PREDICT_TARGET:.2f}: {verdict}).\n"
    )


# ---------------------------------------------------------------------------- OOD


def _auroc(inside: NDArray[np.float64], outside: NDArray[np.float64]) -> float:
    """P(score of an outside item > score of an inside item), ties counted half."""
    from scipy.stats import rankdata

    ranks = rankdata(np.concatenate([inside, outside]))
    n_in, n_out = len(inside), len(outside)
    return float((ranks[n_in:].sum() - n_out * (n_out + 1) / 2) / (n_in * n_out))


def _fpr_at_95(inside: NDArray[np.float64], outside: NDArray[np.float64]) -> float:
    cut = np.quantile(outside, 0.05)
    return float(np.mean(inside >= cut))


def _scores(head: Any, ood: MahalanobisOOD, x: NDArray[Any]) -> dict[str, NDArray[np.float64]]:
    maha = ood.score(x)  # no projection: the statistics space is the embedding space
    msp = 1.0 - np.max(head.predict_proba(x), axis=1)
    return {"mahalanobis": np.asarray(maha, dtype=np.float64),
            "msp": np.asarray(msp, dtype=np.float64)}


def _gaussian_threshold(ood: MahalanobisOOD) -> float:
    """The Gaussian reference threshold of a fitted score (set by ``fit_from_moments``)."""
    thr = ood.gaussian_threshold_
    assert thr is not None, "fit_from_moments sets the Gaussian reference threshold"
    return float(thr)


def _compare(inside: dict[str, Any], outside: dict[str, Any], ood: MahalanobisOOD
             ) -> dict[str, float]:
    m_in, m_out = inside["mahalanobis"], outside["mahalanobis"]
    return {
        "auroc": _auroc(m_in, m_out), "fpr95": _fpr_at_95(m_in, m_out),
        "flagged_out": float(np.mean(m_out > _gaussian_threshold(ood))),
        "msp_auroc": _auroc(inside["msp"], outside["msp"]),
        "msp_fpr95": _fpr_at_95(inside["msp"], outside["msp"]),
        "n": len(m_out),
    }


def _ood(ctx: harness.Context) -> dict[str, Any]:
    args = ctx.args
    data_dir = str(ctx.data_dir())
    enc = _encoder()
    x_train, stats = _train_features(enc, data_dir, args.train_per_class)
    head, ood = _fit(stats)
    train_scores = ood.score(x_train)
    test = load_dataset("cifar10", "test", data_dir=data_dir)
    idx = subsample(test.labels, per_class=args.test_per_class, seed=0)
    x_in, _ = embed_dataset_cached("cifar10", "test", enc, idx, data_dir=data_dir)
    inside = _scores(head, ood, x_in)
    tiny = load_dataset("tiny-imagenet", "test", data_dir=data_dir)
    t_idx = subsample(tiny.labels, per_class=args.tiny_per_class, seed=0)
    ctx.log(f"embedding {len(t_idx)} Tiny-ImageNet images")
    x_tiny, _ = embed_dataset_cached("tiny-imagenet", "test", enc, t_idx, data_dir=data_dir)
    rows: dict[str, Any] = {"tiny-imagenet": _compare(inside, _scores(head, ood, x_tiny), ood)}
    c_idx = subsample(test.labels, per_class=args.corrupt_per_class, seed=2)
    for sev in (int(s) for s in args.severities.split(",")):
        per = {}
        for corruption in ALL_CORRUPTIONS:
            view = CorruptedImages(test, corruption, sev, seed=0)
            x_c, _ = embed_dataset_cached(view, "test", enc, c_idx)
            per[corruption] = _compare(inside, _scores(head, ood, x_c), ood)
        ctx.log(f"severity {sev}: mean AUROC "
                f"{statistics.fmean(v['auroc'] for v in per.values()):.3f}")
        rows[f"cifar10-c s{sev}"] = {"per_corruption": per, **_mean_of(per)}
    return {
        "machine": machine_summary(), "date": _today(), "encoder": ENCODER,
        "resolution": RESOLUTION, "fingerprint": enc.info.fingerprint(),
        "train_per_class": args.train_per_class, "n_in": len(x_in),
        "in_flagged": float(np.mean(inside["mahalanobis"] > _gaussian_threshold(ood))),
        "train_flagged": float(np.mean(train_scores > _gaussian_threshold(ood))),
        "train_mean_score": float(np.mean(train_scores)),
        "in_mean_score": float(np.mean(inside["mahalanobis"])),
        "model_mean_score": float(ood.scale_ * ood.dof_),
        "threshold": _gaussian_threshold(ood), "shrinkage": float(ood.shrinkage_),
        "rows": rows,
    }


def _mean_of(per: dict[str, dict[str, float]]) -> dict[str, float]:
    keys = ("auroc", "fpr95", "flagged_out", "msp_auroc", "msp_fpr95")
    out = {k: float(statistics.fmean(v[k] for v in per.values())) for k in keys}
    out["n"] = float(sum(v["n"] for v in per.values()))
    return out


def render_ood(r: dict[str, Any]) -> str:
    rows = []
    ordered = harness.in_order(r["rows"], ["tiny-imagenet"])  # saved keys come back sorted
    for name, v in ordered.items():
        label = name if "per_corruption" not in v else (
            f"{name} (mean of {len(v['per_corruption'])} corruptions)")
        rows.append([label, int(v["n"]), f"{v['auroc']:.3f}", f"{v['fpr95']:.3f}",
                     f"{100 * v['flagged_out']:.1f}", f"{v['msp_auroc']:.3f}",
                     f"{v['msp_fpr95']:.3f}"])
    table = markdown_table(
        ["out-of-distribution set", "items", "AUROC", "FPR at 95 % TPR",
         "above the Gaussian threshold (%)", "MSP AUROC", "MSP FPR at 95 % TPR"], rows)
    last = [k for k in ordered if k.startswith("cifar10-c")]
    worst = ""
    if last:
        per = ordered[last[-1]]["per_corruption"]
        order = sorted(per, key=lambda c: per[c]["auroc"])
        worst = (f"Hardest corruptions at {last[-1].split()[-1]}: "
                 + ", ".join(f"{c} {per[c]['auroc']:.3f}" for c in order[:3])
                 + "; easiest: " + ", ".join(f"{c} {per[c]['auroc']:.3f}" for c in order[-3:])
                 + ".\n")
    return (
        "## The model in use: out-of-distribution score (`benchmarks/bench_predict.py`)\n\n"
        f"`ood_score` of a model fitted from the statistics of {r['train_per_class']} CIFAR-10 "
        f"training images per class ({r['encoder']} at {r['resolution']}, fingerprint "
        f"{r['fingerprint']}, mode `full`; shrinkage of the pooled covariance "
        f"{r['shrinkage']:.3f}), scored on {r['n_in']} CIFAR-10 test images (in distribution) "
        "against each set below. AUROC: the probability that an out-of-distribution image "
        "scores higher than an in-distribution one. MSP: the baseline 1 − max softmax "
        "probability of the LDA head. The Gaussian reference threshold "
        f"({r['threshold']:.4g}, the 0.99 quantile of the in-distribution score under the "
        f"Gaussian model) is exceeded by {100 * r['in_flagged']:.1f} % of the in-distribution test "
        f"images and {100 * r['train_flagged']:.1f} % of the training images behind the "
        "statistics, where the Gaussian model says at most 1 %. Mean score: "
        f"{r['model_mean_score']:.0f} under the model, {r['train_mean_score']:.0f} on the "
        f"training images, {r['in_mean_score']:.0f} on the test images: in sample the model's "
        "mean holds and the excess is the heavier tail of real embeddings; out of sample the "
        "covariance, estimated from as many samples as the statistics hold, adds a further "
        "factor. The threshold is therefore a floor for the score of unseen in-distribution "
        "data, not a 1 % false-alarm rate: rank by `ood_score` (the AUROC below) or set a "
        "threshold from labelled in-distribution data of your own (the model's flag needs one: "
        "\"The out-of-distribution flag, calibrated\"). "
        f"Machine: {r['machine']}. Measured {r['date']}.\n\n{table}\n\n{worst}"
    )


# ---------------------------------------------------------------------------- entry point


def measure(ctx: harness.Context) -> dict[str, Any]:
    parts = {p.strip() for p in ctx.args.parts.split(",") if p.strip()}
    unknown = parts - {"throughput", "ood"}
    if unknown:
        raise harness.BenchmarkError(f"unknown --parts {sorted(unknown)}; use throughput, ood")
    out: dict[str, Any] = {}
    if "ood" in parts:
        out["predict_ood"] = _ood(ctx)
    if "throughput" in parts:
        out["predict_throughput"] = _throughput(ctx)
    return out


BENCH = harness.Benchmark(
    script=__file__,
    description=__doc__ or "",
    sections=(
        harness.Section("predict_throughput", "predict_throughput.json", render_throughput),
        harness.Section("predict_ood", "predict_ood.json", render_ood),
    ),
    measure=measure,
    timings=True,
    add_arguments=_add_arguments,
)

if __name__ == "__main__":
    harness.main(BENCH)
