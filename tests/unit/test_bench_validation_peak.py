"""The validation benchmark's peak memory counts memory mapped outside NumPy's allocator."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest

from ghofl.stats import _pages
from ghofl.stats._pages import page_backed_empty
from tests.helpers import load_script

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.skipif(not Path("/proc/self/clear_refs").exists(), reason="Linux only")
def test_the_peak_counts_page_backed_arrays(monkeypatch: pytest.MonkeyPatch) -> None:
    bench: Any = load_script(ROOT / "benchmarks" / "bench_validation.py", "_bench_validation")
    monkeypatch.setattr(_pages, "PAGE_BACKED_MIN_BYTES", 1 << 20)

    def load() -> None:
        a = page_backed_empty((200, 1 << 17), np.float64)  # 200 MiB, mapped
        a[...] = 1.0

    peak, how = bench.load_peak(load)
    assert how == "rss" and peak >= 190 << 20
    assert bench.load_peak(lambda: None)[0] < 50 << 20
