"""benchmarks/bench_defaults_cv.py: folds, the paired test, verdicts and the report (no data)."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

import numpy as np
import pytest

BENCH = Path(__file__).resolve().parents[2] / "benchmarks"


@pytest.fixture(scope="module")
def bench() -> ModuleType:
    sys.path.insert(0, str(BENCH))
    try:
        spec = importlib.util.spec_from_file_location("bench_defaults_cv",
                                                      BENCH / "bench_defaults_cv.py")
        assert spec is not None and spec.loader is not None
        mod = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(mod)
    finally:
        sys.path.remove(str(BENCH))
    return mod


@pytest.mark.parametrize("k", [2, 5])
def test_folds_spread_each_class_evenly(bench: ModuleType, k: int) -> None:
    y = np.repeat(np.arange(4), [3, 17, 40, 101])
    folds = bench.stratified_folds(y, k, seed=0)
    assert set(np.unique(folds)) <= set(range(k))
    for c in range(4):
        sizes = np.bincount(folds[y == c], minlength=k)
        assert sizes.max() - sizes.min() <= 1
    np.testing.assert_array_equal(folds, bench.stratified_folds(y, k, seed=0))
    assert not np.array_equal(folds, bench.stratified_folds(y, k, seed=1))


def test_folds_refuse_fewer_than_two(bench: ModuleType) -> None:
    with pytest.raises(ValueError, match="need at least 2 folds, got 1"):
        bench.stratified_folds(np.zeros(5, dtype=np.int64), 1, seed=0)


def test_mcnemar(bench: ModuleType) -> None:
    rng = np.random.default_rng(0)
    a = rng.random(400) < 0.8
    assert bench.mcnemar_p(a, a) == 1.0
    # 4 against 1 discordant samples (TREC's case): far from significant
    b = a.copy()
    idx = np.flatnonzero(a)[:4]
    b[idx] = False
    b[np.flatnonzero(~a)[:1]] = True
    assert bench.mcnemar_p(a, b) == pytest.approx(0.375)
    assert bench.mcnemar_p(b, a) == pytest.approx(0.375)
    worse = a & (rng.random(400) < 0.7)
    assert bench.mcnemar_p(a, worse) < 1e-6
    with pytest.raises(ValueError, match="shapes differ"):
        bench.mcnemar_p(a, a[:-1])


@pytest.mark.parametrize(("test_gap", "p", "cv_gap", "expected"), [
    (-0.2, 0.9, -3.0, "met"),
    (-0.6, 0.38, -0.3, "test noise"),
    (-0.6, 0.01, -0.3, "met in CV only"),
    (-0.7, 0.2, -0.8, "missed"),
])
def test_verdict(bench: ModuleType, test_gap: float, p: float, cv_gap: float,
                 expected: str) -> None:
    assert expected in bench.verdict(test_gap, p, cv_gap, 0.5)


def test_radial_kurtosis_separates_gaussian_from_heavy_tails(bench: ModuleType) -> None:
    rng = np.random.default_rng(1)
    n, d = 4000, 20
    y = np.repeat(np.arange(2), n // 2)
    gauss = rng.standard_normal((n, d))
    # a multivariate t with 5 degrees of freedom: elliptical, κ = 2/(ν − 4) = 2
    heavy = gauss / np.sqrt(rng.chisquare(5, size=(n, 1)) / 5)
    empty = np.zeros((0, d))
    assert abs(bench.radial_kurtosis((gauss, y, empty, y[:0], 2))) < 0.05
    assert bench.radial_kurtosis((heavy, y, empty, y[:0], 2)) > 0.8


def test_extreme_directions_find_the_planted_ratio(bench: ModuleType) -> None:
    rng = np.random.default_rng(2)
    d, n = 6, 3000
    scale = np.ones(d)
    scale[4] = 3.0  # class 0 has 9 times the variance of class 1 along coordinate 4
    x = np.vstack([rng.standard_normal((n, d)) * scale, rng.standard_normal((n, d))])
    xt = np.vstack([rng.standard_normal((n, d)) * scale, rng.standard_normal((n, d))])
    y = np.repeat(np.arange(2), n)
    found = bench.extreme_directions((x, y, xt, y, 2), per_end=1)
    top = found[-1]
    assert top["pair"] == [0, 1]
    assert top["train_ratio"] == pytest.approx(9.0, rel=0.15)
    assert top["test_ratio"] == pytest.approx(9.0, rel=0.15)
    assert abs(top["excess_kurtosis"]) < 0.5
    summary = bench.tail_summary({"real": found}, {"real": 0.01})
    assert summary.startswith("real: median excess kurtosis")
    assert "radial κ 0.010" in summary


def _kind(test: dict[str, float], cv: dict[str, float], best: str, cv_best: str,
          lda: bool) -> dict[str, Any]:
    out: dict[str, Any] = {"n_train": 1000, "n_test": 500, "test": test, "cv": cv,
                           "cv_seeds": [0, 1], "best_fixed": best, "cv_best_fixed": cv_best,
                           "p_best": 0.38, "p_best_holdout": 0.5}
    if lda:
        out["p_sklearn"] = 1.0
        out["p_sklearn_holdout"] = 1.0
    return out


def test_report_reads_every_number_from_the_results(bench: ModuleType) -> None:
    grid = {str(a): 80.0 for a in bench.bd.GRID}
    test = {**grid, "0.0": 92.6, "auto": 92.0, "auto+holdout": 92.4, "sklearn": 91.8}
    cv = {**grid, "0.0": 85.8, "auto": 85.5, "auto+holdout": 85.6, "sklearn": 84.7}
    qtest = {**grid, "0.1": 82.0, "auto": 84.0, "auto+holdout": 81.0}
    qcv = {**grid, "0.3": 74.7, "auto": 78.1, "auto+holdout": 73.0}
    results = {"machine": "test machine", "datasets": {"trec": {
        "lda": _kind(test, cv, "0.0", "0.0", True),
        "qda": _kind(qtest, qcv, "0.1", "0.3", False)}}}
    text = bench.report(results)
    assert "Machine: test machine." in text
    assert "| trec | LDA | auto | best fixed (a=0.0) | 500 | 92.0 vs 92.6 | -0.60 | 0.38" in text
    assert "85.5 vs 85.8 (a=0.0) | -0.30 | test noise" in text
    assert "| trec | LDA | auto | sklearn LW | 500 | 92.0 vs 91.8 | +0.20 | 1.00" in text
    assert "| trec | LDA | auto+holdout | best fixed (a=0.0) | 500 | 92.4 vs 92.6 | -0.20" in text
    assert "| trec | QDA | auto | best fixed (a=0.1) | 500 | 84.0 vs 82.0 | +2.00" in text
    assert "| trec | QDA | auto+holdout | best fixed (a=0.1) | 500 | 81.0 vs 82.0 | -1.00" in text
    assert "*auto*: 2 of 3 targets met on the test split; of the 1 others, 1 met" in text
    assert ("*auto+holdout*: 2 of 3 targets met on the test split; of the 1 others, 0 met in "
            "cross-validation") in text
    assert "missed in cross-validation too: trec QDA vs best fixed (a=0.1)." in text
    assert "demo subset's training set" not in text


def test_gaussian_twin_keeps_counts_and_moments(bench: ModuleType) -> None:
    rng = np.random.default_rng(3)
    d = 4
    y = np.repeat(np.arange(2), [3000, 2000])
    yt = np.repeat(np.arange(2), [300, 700])
    x = rng.standard_normal((5000, d)) * np.where(y[:, None] == 0, 1.0, 2.0) + y[:, None]
    gx, gy, gxt, gyt, c = bench.gaussian_twin((x, y, np.zeros((1000, d)), yt, 2))
    assert c == 2 and gx.shape == x.shape and gxt.shape == (1000, d)
    np.testing.assert_array_equal(np.bincount(gy), [3000, 2000])
    np.testing.assert_array_equal(np.bincount(gyt), [300, 700])
    for k, sd in ((0, 1.0), (1, 2.0)):
        np.testing.assert_allclose(gx[gy == k].mean(axis=0), k, atol=0.15)
        np.testing.assert_allclose(gx[gy == k].std(axis=0), sd, rtol=0.1)
    # fresh draws, not the training samples: the twin's statistics differ from the real ones
    assert not np.allclose(gx[gy == 0].mean(axis=0), x[y == 0].mean(axis=0), atol=1e-6)


def test_verdict_summary_counts(bench: ModuleType) -> None:
    rows = [["a", "LDA", "auto", "best fixed (a=0.0)", "met"],
            ["b", "LDA", "auto", "sklearn LW", "test noise (met in CV; p ≥ 0.05)"],
            ["c", "QDA", "auto", "best fixed (a=0.3)", "**missed** (in CV too)"],
            ["c", "QDA", "auto+holdout", "best fixed (a=0.3)", "met"]]
    first, second = bench.verdict_summary(rows).split("\n\n")
    assert first.startswith("*auto*: 1 of 3 targets met on the test split; of the 2 others, 1 met")
    assert first.endswith("missed in cross-validation too: c QDA vs best fixed (a=0.3).")
    assert second.startswith("*auto+holdout*: 1 of 1 targets met")
