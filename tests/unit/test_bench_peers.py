"""benchmarks/bench_peers.py: settings at the peers' bytes, parts, and the rendered verdicts."""

from __future__ import annotations

from pathlib import Path
from types import ModuleType
from typing import Any

import numpy as np
import pytest

from ghofl.stats.schema import schema_for
from tests.helpers import load_script

BENCH = Path(__file__).resolve().parents[2] / "benchmarks"


@pytest.fixture(scope="module")
def bench() -> ModuleType:
    return load_script(BENCH / "bench_peers.py", "bench_peers")  # type: ignore[return-value]


def test_settings_put_a_ghofl_upload_at_or_below_every_budget(bench: ModuleType) -> None:
    c, d = 6, 384
    budgets = [schema_for("means").nbytes(c, d), 8 * (d * (d + 1) // 2 + c * d)]
    sets = bench.settings_for(c, d, budgets, pca=False)
    assert {s["mode"] for s in sets if s["proj"] == "none"} == {"means", "diag", "pooled",
                                                                   "full"}
    for b in budgets:
        for dt in bench.DTYPES:
            assert any(schema_for(s["mode"]).nbytes(c, s["k"] or d, float_dtype=dt) <= b
                       for s in sets)
    assert not any(s["mode"] == "full" for s in bench.settings_for(200, 1280, budgets, False))
    pca = [s["k"] for s in bench.settings_for(10, 1280, [7_000_000, 100_000], True)
           if s["proj"] == "pca"]
    assert pca and max(pca) <= bench.PCA_MAX_K  # the public basis holds 768 directions
    assert bench.part_name("trec", 10, 2) == "trec-K10-s2.json"


def _part(seed: int, peer: float, lda: float, clients: int = 10) -> dict[str, Any]:
    recs = [
        {"family": "peer", "peer": "FedCOF", "method": "FedCOF (tuned)", "config": "γ = 0.1",
         "bytes": 1000, "val": peer, "test": peer},
        {"family": "ghofl", "method": "ghofl lda", "setting": "gram random k=8",
         "dtype": "float32", "config": "default", "bytes": 900, "val": lda, "test": lda},
        {"family": "ghofl", "method": "ghofl ridge", "setting": "pooled", "dtype": "float64",
         "config": "default", "bytes": 5000, "val": 0.99, "test": 0.99},
    ]
    return {"dataset": "trec", "clients": clients, "seed": seed, "encoder": "minilm",
            "classes": 6, "dim": 384, "n_train": 100, "n_test": 50, "records": recs,
            "seconds": {"stream": 1.0}, "machine": "m", "date": "2026-01-01"}


def test_render_is_order_free_and_states_a_peer_ahead(bench: ModuleType) -> None:
    parts = {f"trec-K10-s{s}.json": _part(s, 0.90 + s / 1000, 0.80 + s / 1000)
             for s in range(3)}
    text = bench.render({"parts": parts})
    assert text == bench.render({"parts": dict(reversed(list(parts.items())))})
    row = next(ln for ln in text.splitlines() if ln.startswith("| FedCOF (tuned)")
               and "gram random" in ln)
    # the pooled ridge (5000 B) is over the budget; the 900-B lda is chosen, 10 points behind
    assert "lda, gram random k=8, float32" in row and "-10.0 ± 0.1 pt: **peer ahead**" in row
    assert "![trec: accuracy vs bytes per client](benchmarks/results/peers_trec.png)" in text


def test_render_calls_a_lead_only_beyond_two_standard_errors(bench: ModuleType) -> None:
    spread = [0.0, 0.02, 0.04]
    parts = {f"trec-K10-s{s}.json": _part(s, 0.80 + spread[s], 0.81 + spread[2 - s])
             for s in range(3)}
    row = next(ln for ln in bench.render({"parts": parts}).splitlines()
               if ln.startswith("| FedCOF (tuned)") and "gram random" in ln)
    assert "tie (within 2 SE)" in row


def test_best_at_picks_on_validation_not_test(bench: ModuleType) -> None:
    p = _part(0, 0.5, 0.6)
    p["records"][1]["val"] = 0.1  # the lda validates worse than the (too large) ridge
    p["records"].append({**p["records"][1], "method": "ghofl ridge", "val": 0.3, "test": 0.2})
    cell = bench._cells({"a.json": p})[("trec", 10)]
    assert bench.best_at(cell, 1000, [0]) == ("ghofl ridge", "gram random k=8", "float32")
    assert bench.best_at(cell, 10, [0]) is None


def test_stream_totals_equal_the_one_shot_sums(bench: ModuleType) -> None:
    from ghofl.bench.features import Features
    from ghofl.bench.peers import split_validation
    from ghofl.stats import compute_stats
    from ghofl.stats.meta import EncoderInfo

    rng = np.random.default_rng(1)
    x = rng.normal(size=(60, 4)).astype(np.float32)
    y = np.repeat(np.arange(3), 20)
    f = Features("toy", "toy", x, y, x[:6], y[:6], ("a", "b", "c"),
                 EncoderInfo(name="toy", dim=4))
    split = split_validation([np.arange(0, 30), np.arange(30, 60)], 0.2, seed=0)
    sets = bench.settings_for(3, 4, [10**6], pca=False)
    totals, means = bench.stream(f, split, sets, 0, None)
    whole = compute_stats(x, y, f.classes, "full", f.encoder_info)
    got = totals[("full", "float64", "fit")] + totals[("full", "float64", "val")]
    assert whole.class_scatter is not None
    np.testing.assert_allclose(got.class_scatter, whole.class_scatter, rtol=1e-10)
    pooled = totals[("pooled", "float64", "fit")] + totals[("pooled", "float64", "val")]
    whole_pooled = whole.to_mode("pooled").scatter
    assert whole_pooled is not None
    np.testing.assert_allclose(pooled.scatter, whole_pooled, rtol=1e-10)
    assert len(means) == 2 and sum(int(m.counts.sum()) for _, m in means) == 60
    # the secure ``means`` upload: class sums and counts, summed over the clients
    sums = totals[("means", "float64", "fit")] + totals[("means", "float64", "val")]
    np.testing.assert_allclose(sums.sums, whole.sums, rtol=1e-10)
    assert sums.scatter is None and sums.class_scatter is None


def test_errors_name_the_fix(bench: ModuleType) -> None:
    from ghofl.bench.harness import BenchmarkError

    with pytest.raises(BenchmarkError, match=r"unknown data set 'mnist'; choose from cifar10"):
        bench._features("mnist", None, 0, 0)
    with pytest.raises(BenchmarkError, match=r"a 'pca' setting needs the public basis: pass"):
        bench._spec({"proj": "pca", "k": 8, "mode": "gram"}, 16, 0, None)


def test_tuned_heads_choose_on_validation_among_the_default_and_the_grid(
    bench: ModuleType,
) -> None:
    from ghofl.stats import compute_stats
    from ghofl.stats.meta import EncoderInfo

    rng = np.random.default_rng(3)
    centres = rng.normal(size=(3, 6)) * 1.5
    y = rng.integers(0, 3, 300)
    x = centres[y] + rng.normal(size=(300, 6))
    info = EncoderInfo(name="toy", dim=6)
    fit = compute_stats(x[:200], y[:200], ("a", "b", "c"), "pooled", info)
    full = compute_stats(x[:250], y[:250], ("a", "b", "c"), "pooled", info)
    val, test = (x[200:250], y[200:250]), (x[250:], y[250:])
    recs = {r["method"]: r for r in bench.tuned_records(fit, full, val, test)}
    assert set(recs) == {"ghofl lda (tuned)", "ghofl ridge (tuned)"}
    for head, (param, grid) in bench.TUNED.items():
        rec = recs[f"ghofl {head} (tuned)"]
        assert rec["choice"] == "auto" or rec["choice"] in grid
        assert rec["config"].startswith(f"{param} = ")
        default_val, _ = bench._both(fit, full, head, val, test)
        assert rec["val"] >= default_val  # the default is a candidate
