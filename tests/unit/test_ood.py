"""The out-of-distribution score of a model: Mahalanobis distance to the nearest class mean under
the shrunk pooled covariance, against a direct numpy computation; its threshold; its file in
the model directory (digest-checked)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from scipy.stats import chi2

from ghofl.errors import ConfigError, InputError, NotFittedError, StatsValidationError
from ghofl.heads.ood import (
    MahalanobisOOD,
    nearest_mahalanobis,
    scaled_chi2_threshold,
)
from ghofl.heads.registry import make_head
from ghofl.model.directory import MANIFEST, OOD_FILE, load_model, load_ood, save_model
from ghofl.moments.core import compute_moments
from ghofl.moments.shrinkage import shrink
from ghofl.stats import compute_stats
from tests.helpers import gaussian_mixture


def _direct(z: np.ndarray, means: np.ndarray, cov: np.ndarray) -> np.ndarray:
    """min_c (z − μ_c)ᵀ Σ⁻¹ (z − μ_c) by explicit inversion, row by row."""
    inv = np.linalg.inv(cov)
    return np.array([min(float((r - m) @ inv @ (r - m)) for m in means) for r in z])


def _pooled(x: np.ndarray, y: np.ndarray, num_classes: int) -> tuple[np.ndarray, np.ndarray]:
    means = np.stack([x[y == c].mean(axis=0) for c in range(num_classes)])
    resid = x - means[y]
    return means, resid.T @ resid / (x.shape[0] - num_classes)


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_nearest_mahalanobis_equals_direct_numpy(seed: int) -> None:
    rng = np.random.default_rng(seed)
    k, c = 6, 4
    a = rng.standard_normal((k, k))
    cov = a @ a.T + 0.5 * np.eye(k)
    means = rng.standard_normal((c, k)) * 3
    z = rng.standard_normal((25, k)) * 2
    score, nearest = nearest_mahalanobis(z, means, np.linalg.cholesky(cov))
    np.testing.assert_allclose(score, _direct(z, means, cov), rtol=1e-9, atol=1e-9)
    inv = np.linalg.inv(cov)
    assert nearest.tolist() == [int(np.argmin([(r - m) @ inv @ (r - m) for m in means]))
                                for r in z]


@pytest.mark.parametrize(("mode", "seed"), [("full", 0), ("pooled", 1), ("diag", 2)])
def test_fitted_score_equals_numpy_on_the_raw_data(mode: str, seed: int) -> None:
    x, y = gaussian_mixture(seed, num_classes=3, dim=5, n=240, sep=2.0)
    ood = MahalanobisOOD().fit_from_moments(compute_moments(compute_stats(x, y, 3, mode)))
    means, cov = _pooled(x, y, 3)
    if mode == "diag":
        cov = np.diag(np.diag(cov))
        assert ood.shrinkage_ == 0.0
    else:
        assert 0.0 <= ood.shrinkage_ <= 1.0
        cov = shrink(cov, ood.shrinkage_)
    z = np.vstack([x[:20], np.random.default_rng(seed).standard_normal((10, 5)) * 6])
    np.testing.assert_allclose(ood.means_, means, rtol=1e-10, atol=1e-12)
    np.testing.assert_allclose(ood.score(z), _direct(z, means, cov), rtol=1e-7, atol=1e-9)


def test_threshold_is_the_chi_square_quantile_without_shrinkage() -> None:
    rng = np.random.default_rng(3)
    a = rng.standard_normal((7, 7))
    cov = a @ a.T + np.eye(7)
    t, scale, dof = scaled_chi2_threshold(np.linalg.cholesky(cov), cov, 0.99)
    assert scale == pytest.approx(1.0) and dof == pytest.approx(7.0)
    assert t == pytest.approx(chi2.ppf(0.99, 7))


def test_shrunk_threshold_matches_the_mean_and_variance_of_the_quadratic_form() -> None:
    rng = np.random.default_rng(4)
    a = rng.standard_normal((6, 6))
    cov = a @ a.T + 0.1 * np.eye(6)
    scoring = shrink(cov, 0.3)
    _, scale, dof = scaled_chi2_threshold(np.linalg.cholesky(scoring), cov, 0.95)
    m = np.linalg.solve(scoring, cov)  # M = Σ⁻¹Σ̂
    assert scale * dof == pytest.approx(np.trace(m))  # mean g·h = tr M
    assert 2 * scale**2 * dof == pytest.approx(2 * np.trace(m @ m))  # variance 2g²h = 2 tr M²


def test_gaussian_reference_value_holds_on_gaussian_data_but_is_not_the_flag() -> None:
    xa, ya = gaussian_mixture(5, num_classes=4, dim=8, n=8000, sep=3.0, class_cov=False)
    x, y = xa[:4000], ya[:4000]
    ood = MahalanobisOOD(0.99).fit_from_moments(compute_moments(compute_stats(x, y, 4, "full")))
    assert ood.threshold_ is None and not ood.has_threshold and ood.calibration_ == "none"
    assert ood.gaussian_threshold_ is not None
    rate = float(np.mean(ood.score(xa[4000:]) > ood.gaussian_threshold_))
    assert 0.002 <= rate <= 0.02  # the Gaussian model holds here: about 1 % of fresh samples
    with pytest.raises(InputError, match=r"this OOD score has no calibrated threshold, so "
                       r"nothing can be flagged; calibrate it on held-out in-distribution rows"):
        ood.flag(ood.score(x[:5]))
    ood.calibrate(xa[4000:6000], 0.01)
    far = x.mean(axis=0) + 50 * np.random.default_rng(0).standard_normal((50, 8))
    assert ood.flag(ood.score(far)).all()


def test_errors() -> None:
    with pytest.raises(ConfigError, match=r"the OOD quantile must lie in \(0, 1\); got 1.5"):
        MahalanobisOOD(1.5)
    with pytest.raises(NotFittedError, match="this MahalanobisOOD is not fitted"):
        MahalanobisOOD().score(np.zeros((1, 2)))
    x, y = gaussian_mixture(0, num_classes=3, dim=4, n=60, sep=2.0)
    ood = MahalanobisOOD().fit_from_moments(compute_moments(compute_stats(x, y, 3, "full")))
    with pytest.raises(InputError, match=r"takes inputs of shape \(n, 4\); got \(2, 3\)"):
        ood.score(np.zeros((2, 3)))
    few = compute_stats(x[[0, 1, 2]], np.array([0, 1, 2]), 3, "full")
    with pytest.raises(StatsValidationError, match="needs more samples than classes; got N=3"):
        MahalanobisOOD().fit_from_moments(compute_moments(few))
    arrays, scalars = ood.get_state()
    with pytest.raises(InputError, match=r"'here' is malformed \(chol_ must be finite floats of "
                       r"shape \(4, 4\); got \(3, 3\)\)"):
        MahalanobisOOD.from_state({**arrays, "chol_": np.eye(3)}, scalars, 3, 4, "'here'")
    with pytest.raises(InputError, match=r"gaussian_threshold must be a finite non-negative"):
        MahalanobisOOD.from_state(arrays, {**scalars, "gaussian_threshold": float("nan")}, 3,
                                  4, "'x'")
    with pytest.raises(InputError, match=r"'x' is malformed \(calibration 'none' with "
                       r"threshold 3.0: a threshold is recorded exactly when it was calibrated"):
        MahalanobisOOD.from_state(arrays, {**scalars, "threshold": 3.0}, 3, 4, "'x'")
    ood.calibrate(x, 0.1)
    arrays, scalars = ood.get_state()
    with pytest.raises(InputError, match=r"threshold must be a finite non-negative number"):
        MahalanobisOOD.from_state(arrays, {**scalars, "threshold": float("nan")}, 3, 4, "'x'")
    with pytest.raises(InputError, match=r"calibration 'conformal' with threshold None"):
        MahalanobisOOD.from_state(arrays, {**scalars, "threshold": None}, 3, 4, "'x'")


@pytest.fixture
def model(tmp_path: Path) -> Path:
    x, y = gaussian_mixture(1, num_classes=3, dim=4, n=120, sep=2.0)
    stats = compute_stats(x, y, 3, "full")
    ood = MahalanobisOOD().fit_from_moments(compute_moments(stats))
    save_model(tmp_path / "m", {"lda": make_head("lda").fit_from_stats(stats)},
               stats_meta=stats.meta, ood=ood)
    return tmp_path / "m"


def test_model_directory_round_trip_and_digest(model: Path) -> None:
    heads, manifest = load_model(model)
    assert list(heads) == ["lda"]
    entry = manifest["ood"]
    assert entry["file"] == OOD_FILE and entry["quantile"] == 0.99
    assert entry["calibration"] == "none" and entry["threshold"] is None
    assert entry["rule"].startswith("none: no threshold, so no ood flag") and \
        "--calibrate-ood" in entry["rule"] and entry["gaussian_threshold"] > 0
    ood = load_ood(model, manifest)
    assert ood is not None and ood.threshold_ is None
    assert ood.gaussian_threshold_ == entry["gaussian_threshold"]
    z = np.random.default_rng(0).standard_normal((5, 4))
    assert ood.score(z).shape == (5,)
    with np.load(model / OOD_FILE) as f:
        np.savez(model / OOD_FILE, means_=f["means_"] + 1.0, chol_=f["chol_"])
    with pytest.raises(InputError, match=r"ood\.npz' is not the one the manifest was written "
                       r"with \(its SHA-256 differs\)"):
        load_ood(model, manifest)
    (model / OOD_FILE).unlink()
    with pytest.raises(InputError, match=r"ood\.npz' is missing; copy the whole model"):
        load_ood(model, manifest)


def test_manifest_without_ood_and_reserved_key(model: Path, tmp_path: Path) -> None:
    raw = json.loads((model / MANIFEST).read_text())
    raw.pop("ood")
    assert load_ood(model, raw) is None  # a model written before the score existed
    stats = compute_stats(*gaussian_mixture(1, num_classes=3, dim=4, n=30, sep=2.0), 3, "full")
    with pytest.raises(ConfigError, match="save_model extra key 'ood' is reserved"):
        save_model(tmp_path / "m2", {"nb": make_head("nb").fit_from_stats(stats)},
                   stats_meta=stats.meta, extra={"ood": 1})
