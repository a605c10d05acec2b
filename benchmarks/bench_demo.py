"""Time the main job (`ghofl demo`) cold (empty embedding/ONNX/reference cache: export, encoding
and every fit included) and warm (everything cached), side by side in one run; writes
benchmarks/results/demo.json and the ``demo`` section of BENCHMARKS.md.
Targets: cold < 10 min, warm < 1 min on 2 cores. Needs GHOFL_DATA_DIR (cifar10.zip).

Run: ``.venv/bin/python benchmarks/bench_demo.py`` (about 3 minutes).
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from ghofl.bench.report import machine_summary, markdown_table, update_section, write_json

ROOT = Path(__file__).resolve().parents[1]


def timed_demo(cache: Path, out: Path) -> float:
    env = {**os.environ, "GHOFL_CACHE_DIR": str(cache)}
    t0 = time.perf_counter()
    subprocess.run([sys.executable, "-m", "ghofl.cli.main", "demo", "--no-progress", "--out",
                    str(out)], env=env, check=True, capture_output=True, text=True)
    return time.perf_counter() - t0


def main() -> None:
    with tempfile.TemporaryDirectory() as tmp:
        cache, out = Path(tmp) / "cache", Path(tmp) / "out"
        cold = timed_demo(cache, out)
        warm = timed_demo(cache, out)
        table = (out / "results.md").read_text()
    res = {"cold_seconds": cold, "warm_seconds": warm, "machine": machine_summary()}
    write_json(ROOT / "benchmarks" / "results" / "demo.json", res)
    body = "\n".join([
        "## Main job: `make demo` / `ghofl demo` (`benchmarks/bench_demo.py`)",
        "",
        f"Machine: {machine_summary()}. CIFAR-10 (1,000 train + 300 test images per class), "
        "EfficientNet-Lite0 at 224 px through ONNX Runtime, 10 clients, α = 0.1, every head, "
        "centralised references. Cold = empty cache (ONNX export, encoding, references, fits); "
        "warm = second run. Creating the virtual environment is not included.",
        "",
        markdown_table(["run", "seconds", "target"],
                       [["cold", f"{cold:.0f}", "< 600"], ["warm", f"{warm:.1f}", "< 60"]]),
        "",
        table.split("\n### ", 1)[1].split("\n", 1)[1] if "\n### " in table else table,
    ])
    update_section(ROOT / "BENCHMARKS.md", "demo", body)
    print(body)


if __name__ == "__main__":
    main()
