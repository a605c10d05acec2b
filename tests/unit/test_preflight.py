"""Pre-flight resource estimates: warnings before a fit beyond the machine, silence otherwise."""

from __future__ import annotations

import warnings

import numpy as np
import pytest

from ghofl.heads import preflight as pf
from ghofl.heads.registry import make_head
from ghofl.server.job import ServerJob, run_server_job
from ghofl.stats.accumulate import compute_stats


def test_qda_memory_is_per_class_covariances() -> None:
    est = pf.estimate_fit(make_head("qda"), "full", 1000, 512)
    per_class = 1000 * 512 * 512 * 8
    assert per_class <= est.memory_bytes <= 2 * per_class
    assert pf.estimate_fit(make_head("lda"), "pooled", 1000, 512).memory_bytes < per_class / 100


def test_warns_when_memory_is_beyond_the_available(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(pf, "available_memory", lambda: 1 << 30)  # 1 GiB
    models = {"qda": make_head("qda"), "nb": make_head("nb")}
    with pytest.warns(pf.ResourceEstimateWarning, match=r"'qda'.*estimated memory 2\.\d GB "
                      r"exceeds the 1\.1 GB available.*--projection-dim") as record:
        out = pf.preflight(models, "full", 1000, 512, max_seconds=float("inf"))
    assert set(out) == {"qda", "nb"}
    assert ["'nb'" in str(w.message) for w in record] == [False]


def test_warns_when_the_work_is_too_long() -> None:
    with pytest.warns(pf.ResourceEstimateWarning, match=r"'fishermix'.*estimated time \d+ min "
                      r"exceeds 10 min.*fewer epochs"):
        pf.preflight({"fishermix": make_head("fishermix")}, "pooled", 1000, 1280,
                     available=1 << 50, flop_rate=1e9)


def test_no_warning_for_small_fits_and_predictions_unchanged(
        monkeypatch: pytest.MonkeyPatch) -> None:
    rng = np.random.default_rng(0)
    x, y = rng.standard_normal((60, 4)), np.arange(60) % 3
    stats = compute_stats(x, y, 3, mode="full")
    with warnings.catch_warnings():
        warnings.simplefilter("error", pf.ResourceEstimateWarning)
        res = run_server_job(stats, ServerJob(("lda", "qda")))
    ref = make_head("qda").fit_from_stats(stats)
    np.testing.assert_array_equal(res.heads["qda"].predict_log_proba(x), ref.predict_log_proba(x))
    monkeypatch.setattr(pf, "available_memory", lambda: 10)
    with pytest.warns(pf.ResourceEstimateWarning, match="'qda'"):
        run_server_job(stats, ServerJob(("qda",)))


def test_ridge_calibration_memory_is_capped_at_many_classes(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """The calibration's (rows, C) score array: C·256 rows up to C = 256, then 65,536 rows in
    all (ridge.calibration_rows_per_class), so its memory grows as C, not C²."""
    from ghofl.heads.ridge import calibration_rows_per_class

    assert calibration_rows_per_class(256, 200) == 256
    assert calibration_rows_per_class(256, 1000) == 65
    assert calibration_rows_per_class(256, 100_000) == 8
    big = pf.estimate_fit(make_head("ridge"), "pooled", 1000, 1280).memory_bytes
    assert 0.5e9 < big < 2e9
    assert pf.estimate_fit(make_head("ridge", n_calibration=0), "pooled", 1000, 1280
                           ).memory_bytes < 1e8
    monkeypatch.setattr(pf, "available_memory", lambda: 256 << 20)
    for name in ("ridge", "fed3r", "fedcof"):
        with pytest.warns(pf.ResourceEstimateWarning, match=rf"'{name}'.*Lower n_calibration"):
            pf.preflight({name: make_head(name)}, "pooled", 1000, 1280)


def test_blocked_calibration_objective_gives_the_one_pass_temperature(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Above the block size the objective is summed in row blocks; the temperature agrees with
    the one-pass objective (to the optimiser's tolerance)."""
    from ghofl.heads import ridge
    from ghofl.moments.core import compute_moments
    from ghofl.stats import compute_stats

    rng = np.random.default_rng(0)
    y = np.arange(600) % 6
    x = rng.standard_normal((600, 5)) + y[:, None] * 0.7
    moments = compute_moments(compute_stats(x, y, 6, "pooled"))
    coef, intercept = rng.standard_normal((5, 6)), rng.standard_normal(6)
    one = ridge.synthetic_temperature(moments, coef, intercept, 50, 0)
    monkeypatch.setattr(ridge, "_CALIBRATION_BLOCK", 64)
    blocked = ridge.synthetic_temperature(moments, coef, intercept, 50, 0)
    assert blocked == pytest.approx(one, rel=1e-3)
