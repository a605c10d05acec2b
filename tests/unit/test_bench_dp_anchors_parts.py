"""bench_dp_anchors: resumable parts and a section rendered from whatever parts exist."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from tests.helpers import load_script

SCRIPT = Path(__file__).resolve().parents[2] / "benchmarks" / "bench_dp_anchors.py"


def _bench() -> Any:
    return load_script(SCRIPT, "_dp_anchors_parts")


def _part(eps: float, seed: int, shift: float) -> dict[str, Any]:
    heads = {"lda": 0.70 + shift, "ridge": 0.69 + shift, "ncm": 0.65}
    probe = {"accuracy": 0.71, "default_accuracy": 0.69, "eps_search": 1.4 * eps}
    return {"dataset": "cifar10", "epsilon": eps, "seed": seed, "upload": "pooled-k0",
            "date": "2026-12-06", "machine": "test", "seconds": {"dpsgd": 60.0},
            "methods": {"dpsgd": probe, "dpsgd_default": {"accuracy": 0.69},
                        "dpsgd_search": {**probe, "accuracy": 0.66 + shift, "eps_search": eps},
                        "dp_nb": {"accuracy": 0.2}, "dp_lr": {"accuracy": 0.15},
                        "ghofl/central": {"clients": 10, "heads": heads},
                        "ghofl/distributed/10": {"clients": 10, "heads": heads}}}


def test_part_names_and_load_from_the_folder(tmp_path: Path) -> None:
    b = _bench()
    assert b.part_name("trec", 0.5, 3) == "trec-eps0.5-seed3.json"
    assert b.part_name("trec", None, None) == "trec-reference.json"
    (tmp_path / "README.md").write_text("not a part")
    (tmp_path / b.part_name("cifar10", 8.0, 0)).write_text(json.dumps(_part(8.0, 0, 0.0)))
    assert list(b.load_parts(tmp_path)["parts"]) == ["cifar10-eps8-seed0.json"]


def test_section_renders_mean_se_and_decided_verdicts() -> None:
    b = _bench()
    parts = {b.part_name("cifar10", 8.0, s): _part(8.0, s, 0.01 * s) for s in range(5)}
    ref = {"dataset": "cifar10", "reference": True, "seconds": {},
           "methods": {"nb": 0.68, "lr": 0.74, "dp_nb_large": 0.67, "dp_lr_large": 0.73,
                       "ghofl/nodp": {"lda": 0.73, "ridge": 0.72, "ncm": 0.66}}}
    text = b.render({"parts": {**parts, "cifar10-reference.json": ref}})
    assert "72.0 ± 0.7 (lda)" in text  # best central head, mean ± se over 5 seeds
    assert "vs DP-SGD tuned, search ε +4.0 ± 1.0 pt: at or above" in text
    assert "distributed K=10 vs central +0.0 ± 1.0 pt: within 0.5" in text
    assert "vs lda without DP (73.0) -1.0 ± 0.7 pt: within 2" in text
    assert "GaussianNB 67.0 (scikit-learn's non-private GaussianNB 68.0)" in text
    assert "| 8 | 5 | 68.0 ± 0.7 | 71.0 ± 0.0 |" in text and "| 11.20 |" in text


def test_section_renders_without_parts_and_with_one_seed() -> None:
    b = _bench()
    assert "0 parts" in b.render({"parts": {}})
    one = b.render({"parts": {"x": _part(2.0, 0, 0.0)}, "quick": True})
    assert "undecided (< 2 seeds)" in one and "(--quick)" in one
