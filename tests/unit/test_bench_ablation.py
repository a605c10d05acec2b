"""The ablation section renders its saved entries, with or without the code record."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from ghofl.bench.provenance import code_sentence
from tests.helpers import load_script

ROOT = Path(__file__).resolve().parents[2]


def test_the_entries_render_alike_and_the_mapping_names_its_commit() -> None:
    bench: Any = load_script(ROOT / "benchmarks" / "bench_ablation_cifar10.py", "bench_ablation")
    entries = [{"variant": "LDA (closed form, reference)", "head": "lda", "params": {},
                "reference": True, "accuracy": [0.8], "fit_seconds": [], "note": ""},
               {"variant": "FisherMix", "head": "fishermix", "params": {},
                "accuracy": [0.79, 0.8, 0.81], "fit_seconds": [1.0, 2.0, 3.0], "note": "",
                "machine": "m"}]
    record = {"entries": entries, "code": {"commit": "abc123abc123", "changed_files": 0}}
    assert bench.render(record) == bench.render(entries)
    assert "| FisherMix | 80.00 ± 1.00 | 2.0 |  |" in bench.render(record)
    assert code_sentence(record) == "Latest run measured commit `abc123abc123`."
