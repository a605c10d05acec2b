"""The pre-flight estimate of the trainable heads against their measured peak working memory.

Each head is fitted in a fresh interpreter (its own peak): the working memory is the peak
resident set size during the fit (``ru_maxrss``) minus the resident set size just before it,
after a small warm-up fit has loaded every lazily imported module. The estimate
(:func:`ghofl.heads.preflight.estimate_fit`) must be within a factor 1.5 of it. No timing is
asserted.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from ghofl.heads import preflight as pf
from ghofl.heads.registry import make_head

ROOT = Path(__file__).resolve().parents[2]

#: C, d of the measured fit: large enough that the synthetic sets dominate the peak (hundreds
#: of MB), small enough to fit in seconds
C, D = 300, 320

SCRIPT = """
import json, os, resource, sys
import numpy as np
import torch  # noqa: F401  (its import is not working memory)
from ghofl.bench.spectrum import class_statistics, spectrum_classes
from ghofl.heads.registry import make_head

name, c, d, dtype = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4]
small = class_statistics(spectrum_classes(1, 8, 3), 20, "pooled", seed=2)
make_head(name, epochs=1, train_dtype=dtype).fit_from_stats(small)  # warm-up: lazy imports
total = class_statistics(spectrum_classes(0, d, c, separation=0.15), 50, "pooled", seed=1)
def status(key):
    with open("/proc/self/status") as f:
        return next(int(line.split()[1]) * 1024 for line in f if line.startswith(key + ":"))
try:  # reset the peak (VmHWM) so that drawing the statistics above does not count
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")
    hwm = True
except OSError:
    hwm = False
before = status("VmRSS")
make_head(name, epochs=1, train_dtype=dtype).fit_from_stats(total)
peak = status("VmHWM") if hwm else resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
print(json.dumps({"before": before, "peak": peak}))
"""


def _measured_working_memory(name: str, dtype: str) -> float:
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src") + os.pathsep + str(ROOT)}
    out = subprocess.run([sys.executable, "-c", SCRIPT, name, str(C), str(D), dtype],
                         capture_output=True, text=True, check=True, env=env, cwd=ROOT)
    res = json.loads(out.stdout.strip().splitlines()[-1])
    return float(res["peak"] - res["before"])


@pytest.mark.slow
@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc and ru_maxrss")
@pytest.mark.parametrize(("name", "dtype"), [("fishermix", "float64"),
                                           ("protohyper", "float32")])
def test_estimate_is_within_1_5x_of_the_measured_peak(name: str, dtype: str) -> None:
    pytest.importorskip("torch")
    measured = _measured_working_memory(name, dtype)
    est = pf.estimate_fit(make_head(name, epochs=1, train_dtype=dtype), "pooled", C, D,
                          min_count=50).memory_bytes
    assert measured > 1e8, measured  # the synthetic sets dominate, not allocator noise
    print(f"{name} {dtype}: estimated {est / 1e9:.3f} GB, measured {measured / 1e9:.3f} GB")
    assert measured / 1.5 <= est <= 1.5 * measured, (est / 1e9, measured / 1e9)


def test_float32_and_fewer_rows_lower_the_estimate() -> None:
    def est(**kw: object) -> float:
        return pf.estimate_fit(make_head("fishermix", **kw), "pooled", C, D).memory_bytes

    assert est(train_dtype="float32") < 0.7 * est(train_dtype="float64")
    assert est(n_per_class=50, val_per_class=50) < est(n_per_class=400, val_per_class=400)
    # "auto" is float32 above C·k_f = 10⁵ only
    assert est() == est(train_dtype="float64")
    big = make_head("fishermix")
    assert (pf.estimate_fit(big, "pooled", 1000, 1280).memory_bytes
            == pf.estimate_fit(make_head("fishermix", train_dtype="float32"), "pooled", 1000,
                               1280).memory_bytes)


def test_class_covariance_synthesis_is_counted_only_when_used() -> None:
    head = make_head("fishermix")
    pooled_syn = pf.estimate_fit(head, "full", 1000, 512, min_count=50).memory_bytes
    class_syn = pf.estimate_fit(head, "full", 1000, 512, min_count=600).memory_bytes
    factors = 1000 * 511 * 511 * 8
    assert class_syn - pooled_syn == pytest.approx(2 * factors, rel=0.05)


def test_warns_before_a_trainable_fit_beyond_the_memory() -> None:
    with pytest.warns(pf.ResourceEstimateWarning, match=r"'protohyper'.*estimated memory "
                      r"\d\.\d GB exceeds the 1\.1 GB available"):
        pf.preflight({"protohyper": make_head("protohyper")}, "pooled", 1000, 1280,
                     available=1 << 30, max_seconds=float("inf"))
