"""benchmarks/bench_peers.py: upload bytes per method and the verdict's byte budgets (no data)."""

from __future__ import annotations

from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

from tests.helpers import load_script

BENCH = Path(__file__).resolve().parents[2] / "benchmarks"


@pytest.fixture(scope="module")
def bench() -> ModuleType:
    return load_script(BENCH / "bench_peers.py", "bench_peers")  # type: ignore[return-value]


def test_upload_bytes(bench: ModuleType) -> None:
    c, d = 10, 1280
    fed3r = bench.upload_bytes("Fed3R", "gram", c, d)
    assert fed3r == 8 * (c * d + d * (d + 1) // 2) == 6_661_120  # no counts
    assert bench.upload_bytes("ghofl lda (gram)", "gram", c, d) == fed3r + 8 * c
    assert bench.upload_bytes("ghofl lda", "pooled", c, d) == 6_763_600
    assert bench.upload_bytes("FedNCM", "means", c, d) == 8 * (c + c * d)


def _rec(method: str, nbytes: int, acc: float) -> dict[str, Any]:
    return {"method": method, "clients": 10, "bytes": nbytes, "accuracy": acc}


def test_verdict_budgets_name_the_counts_tier_only_when_it_adds_a_head(bench: ModuleType
                                                                      ) -> None:
    ds = {"classes": 10, "records": [
        _rec("FedNCM", 102_480, 69.8), _rec("Fed3R", 6_661_120, 78.1),
        _rec("ghofl lda (FedCOF estimate)", 102_480, 73.3),
        _rec("ghofl lda (gram)", 6_661_200, 78.16), _rec("ghofl lda", 6_763_600, 78.16)]}
    lines = [ln for ln in bench.verdict(ds) if ln]
    fed3r = [ln for ln in lines if "Fed3R" in ln]
    assert len(fed3r) == 3
    assert "at ≤ those bytes: ghofl lda (FedCOF estimate) 73.30 %" in fed3r[0]
    assert ("at ≤ those bytes + the 10 class counts (80 B): ghofl lda (gram) 78.16 % at "
            "6.66 MB: ghofl ahead by 0.06 points.") in fed3r[1]
    assert "≤ 1.05× those bytes" in fed3r[2]
    ncm = [ln for ln in lines if "FedNCM" in ln]  # counts included in its bytes: no extra tier
    assert len(ncm) == 2 and not any("class counts" in ln for ln in ncm)
