"""benchmarks/bench_tiny_levers.py: the levers' table, the verdict and the errors."""

from __future__ import annotations

from pathlib import Path
from types import ModuleType
from typing import Any

import numpy as np
import pytest

from tests.helpers import load_script

BENCH = Path(__file__).resolve().parents[2] / "benchmarks"


@pytest.fixture(scope="module")
def bench() -> ModuleType:
    return load_script(BENCH / "bench_tiny_levers.py", "bench_tiny_levers")  # type: ignore[return-value]


def _part(lever: str, lda: float, ridge: float, probe: float | None = None) -> dict[str, Any]:
    part: dict[str, Any] = {
        "lever": lever, "transform": lever, "dim": 8, "upload_bytes": 2e6,
        "heads": {"lda": {"test": lda, "choice": 0.2}, "ridge": {"test": ridge, "choice": 1.0}},
        "lda_sweep": {"0.1": lda - 0.01, "0.3": lda + 0.002}, "seconds": {"stats": 1.0},
        "machine": "m", "date": "2026-12-06"}
    if probe is not None:
        part["probe"] = {"test": probe, "seconds": 1.0, "details": {}}
    return part


def test_render_judges_the_best_default_head_against_the_raw_probe(bench: ModuleType) -> None:
    parts = {"raw": _part("raw", 0.6669, 0.6605, probe=0.6805),
             "x+sqrt": _part("x+sqrt", 0.6699, 0.6657)}
    text = bench.render({"parts": parts})
    assert ("the highest default head lda on `x+sqrt`: 66.99 %, -1.06 points from the probe "
            "on raw features (68.05 %); target ≥ −0.5: NOT met.") in text
    assert "| `raw` | raw | 8 | 2.0 | 66.69 | 66.05 | 66.89 (a = 0.3) | 68.05 | -1.36 |" in text
    assert "| `x+sqrt` | x+sqrt | 8 | 2.0 | 66.99 | 66.57 | 67.19 (a = 0.3) | – | – |" in text
    parts["x+sqrt"]["heads"]["ridge"]["test"] = 0.6760
    assert "ridge on `x+sqrt`: 67.60 %, -0.45 points" in bench.render({"parts": parts})
    assert "target ≥ −0.5: met." in bench.render({"parts": parts})


def test_without_the_raw_probe_there_is_no_verdict(bench: ModuleType) -> None:
    assert "Verdict: –" in bench.render({"parts": {"sqrt": _part("sqrt", 0.5, 0.4)}})


def test_levers_map_features_and_name_their_errors(bench: ModuleType,
                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    from ghofl.bench.harness import BenchmarkError

    x = np.abs(np.random.default_rng(0).normal(size=(40, 6)))
    fmap, what = bench.lever_map("x+sqrt", None)
    assert what == "x+sqrt" and fmap(x).shape == (40, 12)
    np.testing.assert_array_equal(bench.lever_map("raw", None)[0](x), x)
    monkeypatch.setattr(bench, "ANCHORS", 8)
    kmap, name = bench.lever_map("rbf", x)
    assert name.startswith("x+sqrt+rbf:") and "(8 CIFAR-10 anchors" in name
    assert kmap(x).shape == (40, 12 + 8)
    with pytest.raises(BenchmarkError, match=r"lever 'rbf' needs the public CIFAR-10 features"):
        bench.lever_map("rbf", None)
    with pytest.raises(BenchmarkError, match=r"unknown lever 'pca'; choose from raw, sqrt"):
        bench.lever_map("pca", None)


def test_a_probe_added_later_keeps_the_heads_stamp_and_fresh_keeps_the_probe(
    bench: ModuleType, monkeypatch: pytest.MonkeyPatch, tmp_path: Path,
) -> None:
    from argparse import Namespace
    from types import SimpleNamespace

    from ghofl.bench import harness

    monkeypatch.setattr(bench, "_features", lambda *a: SimpleNamespace())
    runs: list[str] = []

    def run_lever(f: Any, v: str, fmap: Any, what: str, log: Any) -> dict[str, Any]:
        runs.append(v)
        return {**_part(v, 0.6, 0.5), "machine": "m", "date": "d"}

    monkeypatch.setattr(bench, "run_lever", run_lever)
    monkeypatch.setattr(bench, "probe", lambda f, fmap: {"test": 0.7, "seconds": 1.0,
                                                          "details": {}})

    def measure(levers: str, probe: str, fresh: bool, code: str) -> dict[str, Any]:
        args = Namespace(levers=levers, probe=probe, fresh=fresh, no_write=False)
        ctx = harness.Context(root=tmp_path, args=args, out=tmp_path / "B.md",
                              code={"commit": code, "changed_files": 0})
        return bench.measure(ctx)["tiny_levers"]["parts"]  # type: ignore[no-any-return]

    first = measure("sqrt", "", False, "aaa")["sqrt"]
    assert runs == ["sqrt"] and first["code"]["commit"] == "aaa" and "probe" not in first
    later = measure("sqrt", "sqrt", False, "bbb")["sqrt"]
    assert runs == ["sqrt"]  # only the probe ran
    assert later["code"]["commit"] == "aaa" and later["probe"]["code"]["commit"] == "bbb"
    again = measure("sqrt", "", True, "ccc")["sqrt"]  # --fresh heads, no --probe
    assert runs == ["sqrt", "sqrt"] and again["code"]["commit"] == "ccc"
    assert again["probe"]["code"]["commit"] == "bbb"  # the saved probe is kept
