"""Time the main job (`ghofl demo`) cold (empty cache: ONNX export, encoding, every federation,
the probes, FedAvg) and warm (embeddings and probes cached), side by side in one run; then
compare the demo's logistic-regression probe (one fixed C) with the cross-validated one it
replaces (4 values of C × 3 folds), on the same features. Writes benchmarks/results/demo.json,
the demo's three plots as benchmarks/results/demo_*.png and the ``demo`` section of
BENCHMARKS.md. Targets on 2 cores: cold < 5 min (the virtual environment already made).
Needs GHOFL_DATA_DIR (cifar10.zip) or ../shared/data.

Run: ``.venv/bin/python benchmarks/bench_demo.py`` (about 10 minutes on 2 cores);
``--report-only`` rewrites the section from the saved results.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from ghofl.bench import harness
from ghofl.bench.report import machine_summary, markdown_table

PLOTS = ("accuracy_vs_alpha", "fedavg_rounds", "accuracy_vs_bytes")
#: The probes compared, in the order measured (saved results sort their keys).
PROBES = ("fixed C", "CV over 4 C x 3 folds")


def timed_demo(cache: Path, out: Path, data_dir: str) -> tuple[float, dict[str, Any]]:
    env = {**os.environ, "GHOFL_CACHE_DIR": str(cache), "GHOFL_DATA_DIR": data_dir}
    t0 = time.perf_counter()
    proc = subprocess.run([sys.executable, "-m", "ghofl.cli.main", "demo", "--no-progress",
                           "--no-download", "--out", str(out)],
                          env=env, capture_output=True, text=True)
    wall = time.perf_counter() - t0
    if proc.returncode != 0:
        raise SystemExit(f"ghofl demo failed:\n{proc.stderr[-4000:]}")
    return wall, json.loads((out / "results.json").read_text())


def probe_comparison(cache: Path, data_dir: str) -> dict[str, Any]:
    """The fixed-C probe against the cross-validated one on the demo's (cached) features."""
    os.environ["GHOFL_CACHE_DIR"] = str(cache)
    from threadpoolctl import threadpool_limits

    from ghofl.bench.demo import DEMO_LOGREG_C, demo_configs
    from ghofl.bench.features import load_features
    from ghofl.bench.references import logreg_reference

    cfg = demo_configs(data_dir=data_dir)["alpha"]
    f = load_features("cifar10", "efficientnet-lite0", cfg)
    out: dict[str, Any] = {}
    with threadpool_limits(limits=1, user_api="blas"):
        for name in PROBES:
            if name == "fixed C":
                r = logreg_reference(f.x_train, f.y_train, f.x_test, f.y_test,
                                     cs=(DEMO_LOGREG_C,))
            else:
                r = logreg_reference(f.x_train, f.y_train, f.x_test, f.y_test)
            out[name] = {"accuracy": r.accuracy, "seconds": r.fit_seconds, "C": r.details["C"],
                         "cv_scores": r.details.get("cv_scores", {})}
    return out


def render(data: dict[str, Any]) -> str:
    """The section from the saved results (the demo's own results table among them)."""
    cold, warm = data["cold"], data["warm"]
    stages = ["features", "alpha", "upload", "projection", "references", "fedavg"]
    rows = [[name, f"{run['wall_seconds']:.0f}"]
            + [f"{run['stages'].get(s, 0.0):.1f}" for s in stages]
            for name, run in (("cold", cold), ("warm", warm))]
    probes = data["probes"]
    probe_rows = [[name, f"{100 * p['accuracy']:.2f}", f"{p['C']:g}", f"{p['seconds']:.1f}"]
                  for name, p in harness.in_order(probes, PROBES).items()]
    return "\n".join([
        "## Main job: `make demo` / `ghofl demo` (`benchmarks/bench_demo.py`)",
        "",
        f"Machine: {data['machine']}. CIFAR-10 from `cifar10.zip` "
        f"({data['n_train']:,} train / {data['n_test']:,} test images, a stratified subset), "
        "EfficientNet-Lite0 at 224 px through ONNX Runtime, 10 Dirichlet clients, every "
        "registered head. Grids: α ∈ {0.05, 0.1, 0.5} in mode `full`; modes `diag` and "
        "`pooled` × projections none / k=256 / k=64 and mode `full` × k=256 / k=64 at α = 0.1; "
        f"FedAvg of a linear head for {data['rounds']} rounds on the α = 0.1 clients; a logistic "
        "regression probe (one fixed C) and scikit-learn's shrinkage LDA; everything after the "
        "encoding with one BLAS thread. Cold = empty cache "
        "(ONNX export, encoding, probes, every fit); warm = second run. Creating the virtual "
        "environment is not included. Target: cold < 300 s.",
        "",
        markdown_table(["run", "wall s"] + [f"{s} s" for s in stages], rows),
        "",
        "The probe: one fit at the fixed C against the cross-validated search it replaces, on "
        "the same features (one BLAS thread, as in the demo):",
        "",
        markdown_table(["logistic-regression probe", "test accuracy %", "C", "seconds"],
                       probe_rows),
        "",
        data["results_md"],
        "",
        " ".join(f"![{p}](benchmarks/results/demo_{p}.png)" for p in PLOTS),
    ])


def measure(ctx: harness.Context) -> dict[str, Any]:
    """The demo cold then warm in a fresh cache, its plots, then the probe comparison."""
    data_dir = str(ctx.data_dir())
    with tempfile.TemporaryDirectory() as tmp:
        cache, out = Path(tmp) / "cache", Path(tmp) / "out"
        cold_wall, cold = timed_demo(cache, out, data_dir)
        warm_wall, warm = timed_demo(cache, out, data_dir)
        table = (out / "results.md").read_text().split("\n", 2)[2].strip()
        if not ctx.args.no_write:
            for p in PLOTS:
                shutil.copyfile(out / f"{p}.png", ctx.results_dir / f"demo_{p}.png")
        probes = probe_comparison(cache, data_dir)
    return {"demo": {
        "machine": machine_summary(),
        "cold": {"wall_seconds": cold_wall, "stages": cold["seconds"]},
        "warm": {"wall_seconds": warm_wall, "stages": warm["seconds"]},
        "n_train": cold["n_train"], "n_test": cold["n_test"],
        "rounds": len(cold["fedavg"]["accuracy"]) - 1,
        "probes": probes,
        "results_md": table,
    }}


BENCH = harness.Benchmark(
    script=__file__,
    description=__doc__ or "",
    sections=(harness.Section("demo", "demo.json", render),),
    measure=measure,
    child_processes=True,
)

if __name__ == "__main__":
    harness.main(BENCH)
