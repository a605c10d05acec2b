"""The benchmark harness: every script's sections re-render from the committed results."""

from __future__ import annotations

import importlib.util
import shutil
import sys
from pathlib import Path
from types import ModuleType

import pytest

from ghofl.bench.harness import Benchmark, render_sections

ROOT = Path(__file__).resolve().parents[2]
BENCH = ROOT / "benchmarks"
SCRIPTS = sorted(p.name for p in BENCH.glob("bench_*.py"))


def _script(name: str) -> ModuleType:
    sys.path.insert(0, str(BENCH))
    try:
        spec = importlib.util.spec_from_file_location(f"_harness_{name[:-3]}", BENCH / name)
        assert spec is not None and spec.loader is not None
        mod = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(mod)
    finally:
        sys.path.remove(str(BENCH))
    return mod


@pytest.mark.parametrize("name", SCRIPTS)
def test_section_renders_from_committed_results(name: str, tmp_path: Path) -> None:
    bench = _script(name).BENCH
    assert isinstance(bench, Benchmark)
    out = tmp_path / "BENCHMARKS.md"
    shutil.copyfile(ROOT / "BENCHMARKS.md", out)
    bodies = render_sections(bench, out, side_products=False)
    assert set(bodies) == {s.marker for s in bench.sections}
    assert out.read_text() == (ROOT / "BENCHMARKS.md").read_text()
