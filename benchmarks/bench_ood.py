"""The out-of-distribution flag: near- and far-OOD at equal resolution, calibrated threshold.

A model (LDA head and the OOD score, :mod:`ghofl.heads.ood`) is fitted from the statistics of
``--train-per-class`` CIFAR-10 training images per class (EfficientNet-Lite0 through ONNX
Runtime at ``--resolution``). Its threshold is calibrated (:meth:`MahalanobisOOD.calibrate`,
the conformal rule at ``--fpr``) on ``--calibrate-per-class`` other CIFAR-10 training images
per class, none of them behind the statistics. Scored against CIFAR-10 test images (in
distribution):

* near-OOD at equal resolution: Tiny-ImageNet validation images resized to CIFAR's 32x32
  (bilinear, antialiased) before the encoder, so that they reach it exactly as CIFAR images do;
  CIFAR-10-C built locally (:mod:`ghofl.data.corruptions`), every corruption at each severity
  of ``--severities``;
* far-OOD at equal resolution: uniform-noise images and smooth random colour fields
  ("blobs": 4x4 noise upsampled), both 32x32;
* for reference, Tiny-ImageNet at its own 64x64, where resolution alone separates it.

For each set: AUROC and the false-positive rate at 95 % true-positive rate of ``ood_score``,
beside two post-hoc baselines on the same features and head: the maximum softmax probability
(1 − max p, ranked in log space to avoid ties) and the energy score (−logsumexp of the LDA head's
log-scores). Also the share of the set flagged at the calibrated threshold, and the
in-distribution flag rate of the calibrated threshold, of the threshold the federated rule sets
from the same rows' score histogram (:meth:`MahalanobisOOD.calibrate_from_histogram`), and of
the Gaussian quantile (a reference value, not a flag).

Writes benchmarks/results/ood.json and the section ``ood`` of BENCHMARKS.md. Run:
``.venv/bin/python benchmarks/bench_ood.py`` (needs ``GHOFL_DATA_DIR`` or ../shared/data with
cifar10.zip and tiny-imagenet-200.zip); ``--quick`` measures small subsets and writes nothing
(a check that the script runs); ``--report-only`` rewrites the section.
"""

from __future__ import annotations

import argparse
import hashlib
import statistics
import time
from typing import Any

import numpy as np
from numpy.typing import NDArray

from ghofl.bench import harness
from ghofl.bench.report import machine_summary, markdown_table
from ghofl.client.embed import embed_dataset_cached
from ghofl.client.encoders import Encoder, get_encoder
from ghofl.data.corruptions import ALL_CORRUPTIONS, CorruptedImages
from ghofl.data.registry import load_dataset, subsample
from ghofl.heads.ood import MahalanobisOOD, score_bin_edges, score_histogram
from ghofl.heads.registry import make_head
from ghofl.moments.core import compute_moments
from ghofl.stats import compute_stats

ENCODER = "efficientnet-lite0"
#: The issue's target: the calibrated flag marks at most 7 % of CIFAR-10 test images.
IN_FLAG_TARGET = 0.07
F64 = NDArray[np.float64]
#: The rows of the table in the order they are measured (CIFAR-10-C rows follow, by severity).
ROW_ORDER = ("tiny-imagenet 32x32", "uniform noise 32x32", "blobs 32x32",
             "tiny-imagenet 64x64 (resolution differs)",
             *(f"cifar10-c s{sev}" for sev in range(1, 6)))
QUICK = {"train_per_class": 50, "calibrate_per_class": 40, "test_per_class": 40,
         "tiny_per_class": 1, "noise": 200, "corrupt_per_class": 10, "severities": "3",
         "corruptions": "gaussian_noise,defocus_blur,fog"}


def _add_arguments(ap: argparse.ArgumentParser) -> None:
    ap.add_argument("--quick", action="store_true",
                    help="Small subsets (three corruptions at severity 3); writes nothing.")
    ap.add_argument("--resolution", type=int, default=224, help="Encoder input size.")
    ap.add_argument("--train-per-class", type=int, default=300,
                    help="CIFAR-10 training images per class behind the statistics.")
    ap.add_argument("--calibrate-per-class", type=int, default=100,
                    help="Other CIFAR-10 training images per class that calibrate the threshold.")
    ap.add_argument("--fpr", type=float, default=0.05, help="Target false-positive rate.")
    ap.add_argument("--test-per-class", type=int, default=200,
                    help="CIFAR-10 test images per class (in distribution).")
    ap.add_argument("--tiny-per-class", type=int, default=10,
                    help="Tiny-ImageNet validation images per class (200 classes).")
    ap.add_argument("--noise", type=int, default=1000, help="Images per far-OOD noise set.")
    ap.add_argument("--corrupt-per-class", type=int, default=20,
                    help="CIFAR-10 test images per class for each corruption x severity.")
    ap.add_argument("--severities", default="1,3,5", help="CIFAR-10-C severities (1..5).")
    ap.add_argument("--corruptions", default=",".join(ALL_CORRUPTIONS),
                    help="Comma-separated corruptions of CIFAR-10-C.")


# ---------------------------------------------------------------------------- image views


def _labels_digest(labels: Any) -> str:
    arr = np.ascontiguousarray(np.asarray(labels, dtype=np.int64))
    return hashlib.sha256(arr.tobytes()).hexdigest()[:8]


class ResizedImages:
    """``source`` images resized to ``size`` x ``size`` (bilinear, antialiased, Pillow)."""

    def __init__(self, source: Any, key: str, size: int) -> None:
        self.source, self.size = source, int(size)
        self.name = f"{key}-{_labels_digest(source.labels)}-resized{self.size}-bilinear"

    @property
    def labels(self) -> NDArray[np.int64]:
        return np.asarray(self.source.labels, dtype=np.int64)

    def __len__(self) -> int:
        return len(self.source)

    def load_batch(self, indices: Any) -> NDArray[np.uint8]:
        from PIL import Image

        imgs = self.source.load_batch(np.asarray(indices, dtype=np.int64))
        s = (self.size, self.size)
        return np.stack([np.asarray(Image.fromarray(im).resize(s, Image.Resampling.BILINEAR))
                         for im in imgs]).astype(np.uint8)


class NoiseImages:
    """``n`` synthetic 32x32 images: uniform noise, or ``blobs`` (4x4 noise upsampled)."""

    def __init__(self, kind: str, n: int, seed: int = 0) -> None:
        self.kind, self.n, self.seed = kind, int(n), int(seed)
        self.name = f"far-{kind}-32-n{n}-seed{seed}"

    @property
    def labels(self) -> NDArray[np.int64]:
        return np.zeros(self.n, dtype=np.int64)

    def __len__(self) -> int:
        return self.n

    def load_batch(self, indices: Any) -> NDArray[np.uint8]:
        from PIL import Image

        out = []
        for i in np.asarray(indices, dtype=np.int64):
            rng = np.random.default_rng([self.seed, int(i)])
            if self.kind == "uniform":
                out.append(rng.integers(0, 256, size=(32, 32, 3), dtype=np.uint8))
            else:
                small = rng.integers(0, 256, size=(4, 4, 3), dtype=np.uint8)
                out.append(np.asarray(Image.fromarray(small).resize(
                    (32, 32), Image.Resampling.BICUBIC)))
        return np.stack(out).astype(np.uint8)


# ---------------------------------------------------------------------------- metrics


def _auroc(inside: F64, outside: F64) -> float:
    """P(score of an outside item > score of an inside item), ties counted half."""
    from scipy.stats import rankdata

    ranks = rankdata(np.concatenate([inside, outside]))
    n_in, n_out = len(inside), len(outside)
    return float((ranks[n_in:].sum() - n_out * (n_out + 1) / 2) / (n_in * n_out))


def _fpr_at_95(inside: F64, outside: F64) -> float:
    """Share of in-distribution items at or above the score that flags 95 % of the outside."""
    return float(np.mean(inside >= np.quantile(outside, 0.05)))


def _scores(head: Any, ood: MahalanobisOOD, x: NDArray[Any]) -> dict[str, F64]:
    from scipy.special import logsumexp

    logits = np.asarray(head.decision_function(x), dtype=np.float64)
    top = np.argmax(logits, axis=1)
    others = logits.copy()
    others[np.arange(len(top)), top] = -np.inf
    # MSP ranked by log((1 − max p)/max p) = logsumexp(other log-scores) − max: the same
    # order as 1 − max p, without the ties of probabilities that round to 1
    return {"mahalanobis": ood.score(x),  # full-mode statistics: no projection
            "msp": logsumexp(others, axis=1) - logits[np.arange(len(top)), top],
            "energy": -logsumexp(logits, axis=1)}


def _compare(inside: dict[str, F64], outside: dict[str, F64], ood: MahalanobisOOD
             ) -> dict[str, float]:
    out: dict[str, float] = {"n": float(len(outside["mahalanobis"])),
                             "flagged": float(np.mean(ood.flag(outside["mahalanobis"])))}
    for name in ("mahalanobis", "msp", "energy"):
        out[f"{name}_auroc"] = _auroc(inside[name], outside[name])
        out[f"{name}_fpr95"] = _fpr_at_95(inside[name], outside[name])
    return out


def _mean_of(per: dict[str, dict[str, float]]) -> dict[str, float]:
    keys = [k for k in next(iter(per.values())) if k != "n"]
    out = {k: float(statistics.fmean(v[k] for v in per.values())) for k in keys}
    out["n"] = float(sum(v["n"] for v in per.values()))
    return out


# ---------------------------------------------------------------------------- measurement


class _Embedder:
    """Cached embeddings with the time each set took (a cache hit takes about none)."""

    def __init__(self, ctx: harness.Context, enc: Encoder) -> None:
        self.ctx, self.enc, self.seconds = ctx, enc, 0.0

    def __call__(self, source: Any, split: str, idx: Any, what: str,
                 data_dir: str | None = None) -> NDArray[np.float32]:
        t0 = time.perf_counter()
        x, _ = embed_dataset_cached(source, split, self.enc, idx, data_dir=data_dir)
        dt = time.perf_counter() - t0
        self.seconds += dt
        self.ctx.log(f"  {what}: {len(x)} images, {dt:.1f} s")
        return x


def _settings(args: argparse.Namespace) -> dict[str, Any]:
    keys = ("train_per_class", "calibrate_per_class", "test_per_class", "tiny_per_class",
            "noise", "corrupt_per_class", "severities", "corruptions")
    if args.quick:
        args.no_write = True  # a check that the script runs, not a result
        return dict(QUICK)
    return {k: getattr(args, k) for k in keys}


def _model(emb: _Embedder, data_dir: str, s: dict[str, Any], fpr: float
           ) -> tuple[Any, MahalanobisOOD, float, float]:
    train = load_dataset("cifar10", "train", data_dir=data_dir)
    idx = subsample(train.labels, per_class=s["train_per_class"], seed=0)
    x = emb("cifar10", "train", idx, "CIFAR-10 train (statistics)", data_dir)
    stats = compute_stats(x, train.labels[idx], train.classes, mode="full",
                          encoder=emb.enc.info)
    head = make_head("lda").fit_from_stats(stats)
    ood = MahalanobisOOD().fit_from_moments(compute_moments(stats))
    gaussian = float(ood.gaussian_threshold_)
    # held out: at least calibrate_per_class images per class outside the statistics
    pool = subsample(train.labels, per_class=s["train_per_class"] + s["calibrate_per_class"],
                     seed=1)
    rest = np.setdiff1d(pool, idx)
    cal_idx = rest[subsample(train.labels[rest], per_class=s["calibrate_per_class"], seed=2)]
    x_cal = emb("cifar10", "train", cal_idx, "CIFAR-10 train (calibration, held out)", data_dir)
    # the federated rule on the same rows: only their score histogram (public bins) is used
    federated = MahalanobisOOD().fit_from_moments(compute_moments(stats))
    edges = score_bin_edges(federated.means_.shape[1])
    federated.calibrate_from_histogram(score_histogram(ood.score(x_cal), edges), edges, fpr)
    ood.calibrate(x_cal, fpr)
    return head, ood, gaussian, float(federated.threshold_)


def measure(ctx: harness.Context) -> dict[str, Any]:
    args = ctx.args
    s = _settings(args)
    data_dir = str(ctx.data_dir())
    enc = get_encoder(ENCODER, args.resolution, "onnx")
    emb = _Embedder(ctx, enc)
    head, ood, gaussian, federated = _model(emb, data_dir, s, args.fpr)
    test = load_dataset("cifar10", "test", data_dir=data_dir)
    x_in = emb("cifar10", "test", subsample(test.labels, per_class=s["test_per_class"], seed=0),
               "CIFAR-10 test (in distribution)", data_dir)
    inside = _scores(head, ood, x_in)
    tiny = load_dataset("tiny-imagenet", "test", data_dir=data_dir)
    t_idx = subsample(tiny.labels, per_class=s["tiny_per_class"], seed=0)
    sets = {"tiny-imagenet 32x32": (ResizedImages(tiny, "tiny-imagenet-test", 32), "near"),
            "uniform noise 32x32": (NoiseImages("uniform", s["noise"]), "far"),
            "blobs 32x32": (NoiseImages("blobs", s["noise"]), "far"),
            "tiny-imagenet 64x64 (resolution differs)": (tiny, "reference")}
    rows: dict[str, Any] = {}
    for name, (source, kind) in sets.items():
        idx = t_idx if "tiny" in name else None
        x = emb(source, "test", idx, name, data_dir if source is tiny else None)
        rows[name] = {"kind": kind, **_compare(inside, _scores(head, ood, x), ood)}
    c_idx = subsample(test.labels, per_class=s["corrupt_per_class"], seed=2)
    for sev in (int(v) for v in str(s["severities"]).split(",")):
        per = {}
        for corruption in str(s["corruptions"]).split(","):
            view = CorruptedImages(test, corruption, sev, seed=0)
            x_c = emb(view, "test", c_idx, f"CIFAR-10-C {corruption} s{sev}")
            per[corruption] = _compare(inside, _scores(head, ood, x_c), ood)
        rows[f"cifar10-c s{sev}"] = {"kind": "near", "per_corruption": per, **_mean_of(per)}
    return {"ood": {
        "machine": machine_summary(), "date": time.strftime("%Y-%m-%d"), "quick": args.quick,
        "encoder": ENCODER, "resolution": args.resolution, "fingerprint": enc.info.fingerprint(),
        "settings": s, "fpr": args.fpr, "n_in": len(x_in), "n_calibration": ood.n_calibration_,
        "threshold": ood.threshold_, "gaussian_threshold": gaussian,
        "in_flagged": float(np.mean(ood.flag(inside["mahalanobis"]))),
        "in_flagged_gaussian": float(np.mean(inside["mahalanobis"] > gaussian)),
        "federated_threshold": federated,
        "in_flagged_federated": float(np.mean(inside["mahalanobis"] > federated)),
        "embed_seconds": emb.seconds, "rows": rows,
    }}


def render(r: dict[str, Any]) -> str:
    rows = []
    for name, v in harness.in_order(r["rows"], ROW_ORDER).items():
        label = name if "per_corruption" not in v else (
            f"{name} (mean of {len(v['per_corruption'])} corruptions)")
        rows.append([label, v["kind"], int(v["n"]), f"{v['mahalanobis_auroc']:.3f}",
                     f"{v['mahalanobis_fpr95']:.3f}", f"{100 * v['flagged']:.1f}",
                     f"{v['msp_auroc']:.3f}", f"{v['msp_fpr95']:.3f}",
                     f"{v['energy_auroc']:.3f}", f"{v['energy_fpr95']:.3f}"])
    table = markdown_table(
        ["set", "kind", "items", "AUROC", "FPR@95", "flagged (%)", "MSP AUROC", "MSP FPR@95",
         "energy AUROC", "energy FPR@95"], rows)
    s = r["settings"]
    verdict = "within" if r["in_flagged"] <= IN_FLAG_TARGET else "above"
    return (
        "## The out-of-distribution flag, calibrated (`benchmarks/bench_ood.py`)\n\n"
        f"`ood_score` of a model fitted from {s['train_per_class']} CIFAR-10 training images "
        f"per class ({r['encoder']} at {r['resolution']}, fingerprint {r['fingerprint']}); "
        f"threshold calibrated by the conformal rule at false-positive rate {r['fpr']} on "
        f"{r['n_calibration']} other CIFAR-10 training images (not behind the statistics). "
        f"On {r['n_in']} CIFAR-10 test images it flags {100 * r['in_flagged']:.1f} % "
        f"({verdict} the {100 * IN_FLAG_TARGET:.0f} % target); calibrated from the same rows' "
        "score histogram alone (the federated rule: what `ghofl simulate --federated-eval` and "
        "`ghofl evaluate --report --update-card` set from the clients' held-out rows) it flags "
        f"{100 * r.get('in_flagged_federated', float('nan')):.1f} %; the Gaussian quantile "
        "(no longer a flag: a model calibrated on no data has none) would flag "
        f"{100 * r['in_flagged_gaussian']:.1f} %. Every set is fed "
        "to the encoder at CIFAR's 32x32 except the 64x64 reference row. AUROC: the "
        "probability that an out-of-distribution image scores higher than an in-distribution "
        "one; FPR@95: the share of in-distribution images flagged at the score that flags 95 % "
        "of the set; flagged: the share of the set above the calibrated threshold. Baselines on "
        "the same features and LDA head: MSP (1 − max softmax probability, ranked in log space) "
        "and energy "
        "(−logsumexp of the log-scores). "
        f"Machine: {r['machine']}. Measured {r['date']}.\n\n{table}\n"
    )


BENCH = harness.Benchmark(
    script=__file__,
    description=__doc__ or "",
    sections=(harness.Section("ood", "ood.json", render),),
    measure=measure,
    add_arguments=_add_arguments,
)

if __name__ == "__main__":
    harness.main(BENCH)
