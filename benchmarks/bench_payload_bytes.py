"""Payload bytes of one client upload: held-out section and float32 transport (issue 10).

For C = 10 classes in dimension d = 1280 (EfficientNet-Lite0 embeddings), and for every upload
mode (full, pooled, diag), this script writes a real statistics file (``ghofl.stats.save_stats``)
with and without a held-out section (holdout fraction 0.2) and with float64 and float32
transport of the float sums, and reports:

* the array bytes of the payload (:func:`ghofl.stats.codec.payload_nbytes`, what the plain
  protocol counts as uploaded), checked against the data section of the file;
* the size of the ``.ghs`` file on disk (array bytes plus the JSON header);
* the words a client uploads under secure aggregation (fixed-point, 2 limbs per float entry,
  ``FixedPointCodec.length``; float32 does not apply there);

and each as a ratio to the float64 payload without a held-out section. Byte counts are exact
and deterministic (no timing). The statistics are zeros: sizes do not depend on the values.

Writes benchmarks/results/payload_bytes.json and the ``payload_bytes`` section of BENCHMARKS.md
("Payload bytes: holdout and float32").

Run: ``.venv/bin/python benchmarks/bench_payload_bytes.py`` (about a minute on 2 cores; peak
memory about 1.5 GB for the full mode).
"""

from __future__ import annotations

import argparse
import tempfile
from pathlib import Path
from typing import Any

from ghofl.bench import harness
from ghofl.bench.report import machine_summary, markdown_table
from ghofl.secure.fixedpoint import FixedPointCodec
from ghofl.stats import ClientStats, StatsAccumulator
from ghofl.stats.codec import expected_payload_nbytes, payload_nbytes, save_stats
from ghofl.stats.schema import SCHEMAS

SECTION = "payload_bytes"
TITLE = "Payload bytes: holdout and float32"
HOLDOUT = 0.2
DTYPES = ("float64", "float32")


def zeros(mode: str, num_classes: int, dim: int, holdout: float) -> ClientStats:
    """Statistics of ``mode`` over no sample, i.e. every sum zero (sizes do not depend on the
    values), as a client's accumulator returns them."""
    acc = StatsAccumulator(num_classes, dim, mode, clip_norm=1.0,  # type: ignore[arg-type]
                           holdout_fraction=holdout)
    return acc.result()


def measure(stats: ClientStats, dtype: str, workdir: Path) -> dict[str, Any]:
    """Bytes of the upload of ``stats`` with float sums in ``dtype``."""
    mode, c, d = stats.mode, stats.num_classes, stats.dim
    holdout = stats.holdout_fraction
    path = workdir / f"{mode}-{holdout}-{dtype}.ghs"
    file_bytes = save_stats(stats, path, dtype)
    array_bytes = payload_nbytes(stats, dtype)
    expected = expected_payload_nbytes(mode, c, d, holdout=holdout > 0, transport_dtype=dtype)
    if array_bytes != expected or file_bytes != path.stat().st_size:
        raise AssertionError(f"byte counts disagree for {mode} {holdout} {dtype}")
    header_bytes = file_bytes - array_bytes
    if not 0 < header_bytes < 4096:
        raise AssertionError(f"unexpected header size {header_bytes} for {path.name}")
    path.unlink()
    secure = FixedPointCodec(num_clients=100, max_samples=10**6, clip_norm=1.0, limbs=2)
    return {
        "mode": mode,
        "holdout_fraction": holdout,
        "transport_dtype": dtype,
        "array_bytes": array_bytes,
        "file_bytes": file_bytes,
        "header_bytes": header_bytes,
        "secure_bytes": 8 * secure.length(stats.meta) if dtype == "float64" else None,
    }


def render(result: dict[str, Any]) -> str:
    rows = []
    base = {r["mode"]: r for r in result["rows"]
            if r["holdout_fraction"] == 0 and r["transport_dtype"] == "float64"}
    for r in result["rows"]:
        b = base[r["mode"]]
        secure = "n/a" if r["secure_bytes"] is None else (
            f"{r['secure_bytes']:,} ({r['secure_bytes'] / b['secure_bytes']:.2f}x)")
        rows.append([
            r["mode"],
            f"{r['holdout_fraction']:g}" if r["holdout_fraction"] else "none",
            r["transport_dtype"],
            f"{r['array_bytes']:,}",
            f"{r['array_bytes'] / b['array_bytes']:.3f}x",
            f"{r['file_bytes']:,}",
            secure,
        ])
    c, d = result["num_classes"], result["dim"]
    return "\n".join([
        f"## {TITLE}",
        "",
        f"One client's upload for C = {c} classes in d = {d}"
        + (" (EfficientNet-Lite0)" if d == 1280 else "") + ", measured by "
        "writing real `.ghs` files (`benchmarks/bench_payload_bytes.py`; exact counts, no "
        "timing). *Array bytes* is what the plain protocol uploads; the ratio is to float64 "
        "without a held-out section in the same mode. *Secure words* is the fixed-point "
        "upload of secure aggregation (2 limbs per float entry; float32 transport does not "
        "apply there).",
        "",
        markdown_table(["mode", "held-out section", "transport", "array bytes", "ratio",
                        ".ghs file bytes", "secure words (bytes)"], rows),
        "",
        "A held-out section doubles every payload (the same arrays again over the held-out "
        "samples, whatever the fraction); float32 transport halves the float arrays (counts "
        "stay int64), so float32 with a held-out section costs about what float64 without one "
        "does. The held-out section is therefore an option (`--holdout`, config key "
        "`holdout`), off by default; float32 is an option too (`--transport-dtype`, config "
        "key `transport_dtype`).",
        "",
        f"Machine: {result['machine']}.",
    ])


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The flags of this benchmark (besides the harness's --report-only / --no-write / --out)."""
    parser.add_argument("--classes", type=int, default=10)
    parser.add_argument("--dim", type=int, default=1280)


def measure_all(ctx: harness.Context) -> dict[str, Any]:
    """Every upload mode, without and with a held-out section, in float64 and float32."""
    args = ctx.args
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for mode in SCHEMAS:
            for holdout in (0.0, HOLDOUT):
                stats = zeros(mode, args.classes, args.dim, holdout)
                for dtype in DTYPES:
                    rows.append(measure(stats, dtype, Path(tmp)))
    return {SECTION: {"num_classes": args.classes, "dim": args.dim, "rows": rows,
                      "machine": machine_summary()}}


BENCH = harness.Benchmark(
    script=__file__,
    description=__doc__ or "",
    sections=(harness.Section(SECTION, "payload_bytes.json", render),),
    measure=measure_all,
    add_arguments=add_arguments,
)

if __name__ == "__main__":
    harness.main(BENCH)
