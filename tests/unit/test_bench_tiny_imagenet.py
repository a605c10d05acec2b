"""benchmarks/bench_tiny_imagenet.py: merging re-run heads and the prose it writes (no data)."""

from __future__ import annotations

import importlib.util
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

SCRIPT = Path(__file__).resolve().parents[2] / "benchmarks" / "bench_tiny_imagenet.py"


@pytest.fixture(scope="module")
def bench() -> ModuleType:
    spec = importlib.util.spec_from_file_location("bench_tiny_imagenet", SCRIPT)
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def _head(acc: float, **extra: Any) -> dict[str, Any]:
    return {"accuracy": acc, "fit_seconds": 1.0, "predict_seconds": 2.0,
            "fit_predict_peak_extra_bytes": 10**8, "peak_over_baseline_bytes": 2 * 10**8, **extra}


def _run(config: str, mode: str, k: int | None, heads: dict[str, Any],
         date: str = "2026-12-01") -> dict[str, Any]:
    return {"config": config, "mode": mode, "projection_dim": k, "dim": 1280, "classes": 200,
            "n_train": 20_000, "n_test": 10_000, "clients": 10, "alpha": 0.1, "seed": 0,
            "date": date, "upload_bytes_float64": 8 * 10**6, "upload_bytes_float32": 4 * 10**6,
            "payload_in_memory_bytes": 16 * 10**6, "client_seconds_median": 0.5,
            "aggregate_peak_extra_bytes": 10**8, "load_validate_seconds": 1.0,
            "load_peak_extra_bytes": 10**7, "heads": heads}


def test_merge_keeps_heads_not_rerun_with_their_date(bench: ModuleType) -> None:
    old = _run("full", "full", None, {"lda": _head(0.6661), "qda": _head(0.60)},
               date="2026-11-30")
    old["machine"] = "old machine"
    new = _run("full", "full", None, {"qda": _head(0.64, date="2026-12-01")})
    new["client_seconds_median"] = 9.0
    merged = bench.merge_heads(old, new)
    assert merged["heads"]["qda"]["accuracy"] == 0.64
    assert merged["heads"]["lda"] == {**old["heads"]["lda"], "date": "2026-11-30",
                                      "machine": "old machine"}
    assert merged["client_seconds_median"] == 9.0  # the new run's upload / aggregation
    assert bench.merge_heads(None, new) is new


def test_render_dates_each_head_row_and_prices_skipped_qda(bench: ModuleType) -> None:
    runs = [
        _run("full", "full", None, {"lda": _head(0.6669, date="2026-11-30")}),
        _run("full-k256", "full", 256, {"qda": _head(0.60)}),
    ]
    runs[0]["skipped_heads"] = ["qda"]
    text = bench.render({"machine": "test machine", "date": "2026-12-01", "runs": runs})
    assert "| `full` | - | lda | 66.69 | 1.0 | 2.0 | 0.10 | 0.20 | 2026-11-30 |" in text
    assert "| `full` | 256 | qda | 60.00 | 1.0 | 2.0 | 0.10 | 0.20 | 2026-12-01 |" in text
    assert "Not run (`--skip`): qda in `full` at d = 1280." in text
    assert "about 125 and 25 times its k = 256 row at d = 1280" in text
    assert "100 per class" in text
    assert "Machine: test machine. Measured 2026-12-01." in text


def test_render_names_the_rows_of_each_machine(bench: ModuleType) -> None:
    runs = [
        _run("full", "full", None, {"lda": _head(0.6669, machine="one thread"),
                                    "qda": _head(0.65)}),
        _run("pooled", "pooled", None, {"lda": _head(0.6669)}),
    ]
    runs[0]["machine"] = runs[1]["machine"] = "two threads"
    text = bench.render({"machine": "two threads", "date": "2026-12-01", "runs": runs})
    assert ("Machines, with the rows measured on each:\n\n"
            "* two threads: `full` (upload and aggregation, qda), `pooled`\n"
            "* one thread: `full` (lda)\n\nMeasured 2026-12-01.") in text


def _records(with_probe: bool) -> list[dict[str, Any]]:
    fed = [{"mode": "pooled", "head": h, "accuracy": a, "alpha": 0.1, "clients": 10, "seed": s}
           for s in (0, 1) for h, a in (("nb", 0.55), ("lda", 0.6669))]
    refs = [{"mode": "reference", "head": "sklearn_lda", "accuracy": 0.6586, "n_train": 20_000,
             "fit_seconds": 30.0, "details": {}}]
    if with_probe:
        refs.append({"mode": "reference", "head": "logreg", "accuracy": 0.6805,
                     "n_train": 20_000, "fit_seconds": 600.0,
                     "details": {"C": 0.003, "folds": 3, "cv_samples": 10_000,
                                 "cv_scores": {"0.001": 0.63, "0.003": 0.64}}})
    return fed + refs


@pytest.mark.parametrize("with_probe", [True, False])
def test_paper_notes_read_the_probe_and_qda_rule_from_results(
    bench: ModuleType, monkeypatch: pytest.MonkeyPatch, with_probe: bool
) -> None:
    trained = [{"mode": "pooled", "head": "fishermix", "accuracy": 0.6669, "seed": s}
               for s in (0, 1)]
    monkeypatch.setattr(bench, "_records", lambda name: (
        _records(with_probe) if name == "tiny_imagenet" else trained))
    qda = _head(0.64, params={"shrinkage_target": "pooled"},
                fitted={"shrinkage_": [0.25] * 200, "shrinkage_method_": "evidence"})
    runs = [_run("full", "full", None, {"lda": _head(0.6669), "qda": qda}),
            _run("pooled", "pooled", None, {"lda": _head(0.6661, date="2026-11-30")})]
    text = bench.paper_notes(runs)
    assert "not run at C = 200" not in text
    assert ("toward the default LDA's pooled covariance rescaled to the class, a = 0.25 "
            "(evidence)") in text
    assert "fishermix scores exactly LDA's accuracy in every seed" in text
    assert "in the table above no head scores the same in both modes, lda not" in text
    if with_probe:
        assert ("C = 0.003 chosen among 2 values by 3-fold cross-validation on 10,000 training "
                "rows, then refitted on all 20,000: 68.05 % in 10 min; the best head of the main "
                "table (lda, 66.69 %) is 1.36 points below it") in text
    else:
        assert "Centralised logistic-regression probe: not in the main table's results" in text
