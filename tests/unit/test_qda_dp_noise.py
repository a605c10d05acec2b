"""QDA's default shrinkage on a differentially private release weighs its noise (issue 41).

On a :class:`NoisyStats` release the evidence rule's coefficient is raised to the share of the
whitened class covariances' spread around their targets that the release noise explains,
counting only the noise the post-processing (P2n) left (:mod:`ghofl.heads._qda_noise`);
``shrinkage_method_`` then reads ``"evidence+dp-noise"``. Exact statistics fit as before.
"""

from __future__ import annotations

import itertools
import math
from pathlib import Path

import numpy as np
import pytest

from ghofl.errors import StatsFormatError, StatsValidationError
from ghofl.heads._linalg import F64
from ghofl.heads._qda_noise import (
    _metric_eigvals,
    class_cov_noise,
    noise_floor_shrinkage,
    postprocess_intensities,
    postprocess_intensity,
)
from ghofl.heads.qda import QDAHead, evidence_families
from ghofl.heads.registry import load_head, save_head
from ghofl.moments.core import GhoflWarning, compute_moments
from ghofl.moments.noise import NOISE_TAG
from ghofl.privacy.accounting import calibrate_noise_multiplier
from ghofl.privacy.postprocess import NoisyStats, floor_noise_bulk
from ghofl.stats.accumulate import compute_stats
from ghofl.stats.client_stats import ClientStats
from ghofl.stats.codec import load_stats, read_stats_header, save_stats
from ghofl.stats.header import StatsHeader
from tests.helpers import dp_release

R = 6.0
C, D = 5, 16
DELTA = 1e-5
Split = tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]


def _classes(seed: int, n_train: int = 20_000, n_test: int = 5000) -> Split:
    """C Gaussian classes of distinct covariance shapes (a shared factor plus 0.7 of a class
    one), so that neither a = 0 nor a = 1 is right; norms mostly below the clip R."""
    rng = np.random.default_rng(seed)
    base = rng.standard_normal((D, D)) / math.sqrt(D)
    factors = []
    for _ in range(C):
        a = 0.3 * base + 0.7 * rng.standard_normal((D, D)) / math.sqrt(D)
        factors.append(np.linalg.cholesky(a @ a.T + 0.05 * np.eye(D)))
    chol = np.array(factors)
    means = rng.normal(0.0, 0.6 / math.sqrt(D), (C, D))

    def draw(n: int) -> tuple[np.ndarray, np.ndarray]:
        y = rng.integers(0, C, n)
        x = means[y] + np.einsum("nij,nj->ni", chol[y], rng.standard_normal((n, D)))
        return x, y

    return (*draw(n_train), *draw(n_test))


@pytest.fixture(scope="module")
def split() -> Split:
    return _classes(0)


def _total(s: Split) -> ClientStats:
    return compute_stats(s[0], s[1], C, "full", clip_norm=R)


def _at_epsilon(total: ClientStats, eps: float, seed: int) -> ClientStats:
    """``total`` released at (ε, 1e-5) through the public path, post-processed knowing σ."""
    out: ClientStats = dp_release(total, R, calibrate_noise_multiplier(eps, DELTA), seed=seed)
    return out


def _blind(noisy: ClientStats) -> ClientStats:
    """The very same released arrays without their noise levels."""
    return ClientStats(noisy.meta, counts=noisy.counts, n_clipped=0, holdout=None,
                       sums=noisy.sums, class_scatter=noisy.class_scatter)


def _same_fit(a: QDAHead, b: QDAHead) -> None:
    for name in ("means_", "precision_chol_", "half_log_det_", "log_priors_"):
        np.testing.assert_array_equal(getattr(a, name), getattr(b, name))
    assert a.shrinkage_ == b.shrinkage_


@pytest.mark.parametrize("target", ["pooled", "scaled_identity"])
def test_exact_and_silent_statistics_fit_as_before(split: Split, target: str) -> None:
    total = _total(split)
    m = compute_moments(total)
    assert class_cov_noise(m) is None
    assert noise_floor_shrinkage(m, [], [], target, None) is None
    exact = QDAHead(shrinkage_target=target).fit_from_stats(total)  # type: ignore[arg-type]
    assert exact.shrinkage_method_ == "evidence"
    silent = NoisyStats.of(total, {"counts": 0.0, "sums": 0.0, "class_scatter": 0.0})
    quiet = QDAHead(shrinkage_target=target).fit_from_stats(silent)  # type: ignore[arg-type]
    _same_fit(quiet, exact)
    assert quiet.shrinkage_method_ == "evidence"


def test_noise_on_the_counts_alone_leaves_the_choice(split: Split) -> None:
    total = _total(split)
    counted = NoisyStats.of(total, {"counts": 3.0})  # no noise on what the covariances read
    np.testing.assert_array_equal(class_cov_noise(compute_moments(counted)), np.zeros(C))
    head = QDAHead().fit_from_stats(counted)
    assert head.shrinkage_method_ == "evidence+dp-noise"
    _same_fit(head, QDAHead().fit_from_stats(total))


def test_the_noise_of_the_class_covariances_from_the_public_levels(split: Split) -> None:
    noisy = _at_epsilon(_total(split), 1.0, seed=1)
    assert isinstance(noisy, NoisyStats)
    m = compute_moments(noisy)
    sig = noisy.noise_sigma
    expect = ((sig["class_scatter"] ** 2 + 4 * sig["sums"] ** 2 * np.sum(m.means**2, axis=1) / D)
              / (m.counts - 1.0) ** 2)
    nu2 = class_cov_noise(m)
    assert nu2 is not None
    np.testing.assert_allclose(nu2, expect, rtol=1e-12)


def _noised(total: ClientStats, z: float, seed: int) -> tuple[ClientStats, dict[str, F64]]:
    """The release of :func:`dp_release` (same draw), and its noisy arrays before P2n."""
    from ghofl.privacy import DPConfig, NoisePlan, block_sensitivities, block_sigmas, draw_noise
    from ghofl.privacy.postprocess import postprocess
    from ghofl.stats.schema import schema_for

    c, d, sch = total.meta.num_classes, total.meta.dim, schema_for("full")
    sens = block_sensitivities("full", R)
    sigma = block_sigmas(sens, {b: 1.0 / len(sens) for b in sens}, z)
    ints, floats = sch.flatten(total)
    plan = NoisePlan(DPConfig(8.0), "full", R, 1, z, sens, {b: 1.0 / len(sens) for b in sens},
                     sigma)
    dc, df = draw_noise(plan, c, d, np.random.default_rng(seed))
    stats, _ = postprocess(total.meta, ints[:c] + dc, floats + df, 1, sigma)
    raw = {spec.name: spec.unpack((floats + df)[seg.offset:seg.stop].reshape(
               spec.packed_shape(c, d)), c, d)
           for spec, seg in zip(sch.float_arrays, sch.float_layout(c, d), strict=True)}
    return stats, raw


def _without_record(noisy: ClientStats) -> NoisyStats:
    """The release as a file written before the intensities were recorded reads it."""
    assert isinstance(noisy, NoisyStats)
    return NoisyStats.of(_blind(noisy), noisy.noise_sigma)


def test_the_release_records_the_intensities_p2n_applied(split: Split) -> None:
    """Σ̂_c = (1 − a_c) Σ̃_c + a_c T_c with the recorded a_c, from the noisy arrays before P2n."""
    noisy, raw = _noised(_total(split), calibrate_noise_multiplier(0.5, DELTA), seed=1)
    assert isinstance(noisy, NoisyStats) and noisy.noise_shrinkage is not None
    applied = np.array(noisy.noise_shrinkage)
    m = compute_moments(noisy)
    np.testing.assert_array_equal(postprocess_intensities(m), applied)  # what the heads read
    sig = noisy.noise_sigma
    n = noisy.counts.astype(float)
    outer = np.einsum("ci,cj->cij", raw["sums"], raw["sums"]) / n[:, None, None]
    scat = raw["class_scatter"] - outer + (sig["sums"] ** 2 / n)[:, None, None] * np.eye(D)
    scat = 0.5 * (scat + np.swapaxes(scat, 1, 2))
    dof = n - 1.0
    center = floor_noise_bulk(scat.sum(axis=0) / dof.sum(),
                              math.sqrt(C) * sig["class_scatter"] / dof.sum())
    for c in range(C):
        tilde = scat[c] / dof[c]
        scale = max(np.trace(tilde), D * sig["class_scatter"] / dof[c]) / np.trace(center)
        blend = (1 - applied[c]) * tilde + applied[c] * scale * center
        np.testing.assert_allclose(m.class_covariance(c), blend, rtol=1e-7,
                                   atol=1e-9 * float(np.abs(blend).max()))
    assert np.all((applied > 0.05) & (applied < 0.95)), applied
    back = postprocess_intensities(compute_moments(_without_record(noisy)))  # older files
    assert np.all((back > 0.0) & (back < 1.0)) and float(np.max(np.abs(back - applied))) < 0.25
    assert np.all(postprocess_intensities(compute_moments(_total(split))) == 0.0)


def test_the_recovered_intensity_measures_the_gap_directly(split: Split) -> None:
    """A centre a hair from Σ̂_c: expanding ‖Σ̂_c − T_c‖² would cancel to noise."""
    m = compute_moments(NoisyStats.of(_total(split), {"class_scatter": 1e-6}))
    cov, dof = m.class_covariance(0), m.class_dof(0)
    e = np.zeros((D, D))
    e[0, 1] = e[1, 0] = 1.0  # traceless: T_c = centre exactly
    delta = 1e-9 * float(np.abs(cov).max())
    a = postprocess_intensity(m, 0, cov + delta * e)
    err = 0.5 * D * (D + 1) * (1e-6 / dof) ** 2 + (np.sum(cov**2) + np.trace(cov) ** 2) / dof
    r = err / (2.0 * delta**2)
    np.testing.assert_allclose(1.0 - a, 2.0 / (1.0 + math.sqrt(1.0 + 4.0 * r)), rtol=1e-6)


def test_a_near_singular_centre_gives_a_finite_metric(split: Split) -> None:
    noisy = _at_epsilon(_total(split), 0.5, seed=1)
    m = compute_moments(noisy)
    w, v = np.linalg.eigh(m.pooled_covariance())
    w[0] = -1e-12 * float(w.max())  # singular, a rounding below 0
    center = (v * w) @ v.T
    x = _metric_eigvals(m, "pooled", center, None)
    assert np.all(np.isfinite(x)) and float(np.sum(x * x)) < np.inf
    assert float(x.max()) <= 1.0 / (np.finfo(float).eps * float(w.max())) * (1 + 1e-12)
    usable = list(range(C))
    fams, _ = evidence_families(m, usable, "pooled", m.pooled_covariance())
    assert isinstance(noisy, NoisyStats)
    shrunk = NoisyStats.of(_blind(noisy), noisy.noise_sigma, (1.0,) * C)  # P2n took it all
    assert noise_floor_shrinkage(compute_moments(shrunk), fams, usable, "pooled", center) == 0.0
    floor = noise_floor_shrinkage(m, fams, usable, "pooled", center)
    assert floor is not None and 0.0 < floor <= 1.0


def test_the_intensities_survive_files_and_conversions(split: Split, tmp_path: Path) -> None:
    noisy = _at_epsilon(_total(split), 0.5, seed=1)
    assert isinstance(noisy, NoisyStats) and noisy.noise_shrinkage is not None
    save_stats(noisy, tmp_path / "t.ghs")
    back = load_stats(tmp_path / "t.ghs")
    assert isinstance(back, NoisyStats) and back.noise_shrinkage == noisy.noise_shrinkage
    assert read_stats_header(tmp_path / "t.ghs").noise_shrinkage == noisy.noise_shrinkage
    _same_fit(QDAHead().fit_from_stats(back), QDAHead().fit_from_stats(noisy))
    diag = noisy.to_mode("diag")
    assert isinstance(diag, NoisyStats) and diag.noise_shrinkage == noisy.noise_shrinkage
    old = _without_record(noisy)  # a file written before the record: the heads recover it
    save_stats(old, tmp_path / "old.ghs")
    assert "noise_shrinkage" not in StatsHeader.of(old).to_entries("file")
    reread = load_stats(tmp_path / "old.ghs")
    assert isinstance(reread, NoisyStats) and reread.noise_shrinkage is None
    _same_fit(QDAHead().fit_from_stats(reread), QDAHead().fit_from_stats(old))
    entries = StatsHeader.of(noisy).to_entries("records")
    assert StatsHeader.from_entries(entries, "records", "r").noise_shrinkage \
        == noisy.noise_shrinkage


def test_bad_intensities_are_refused(split: Split) -> None:
    noisy = _at_epsilon(_total(split), 0.5, seed=1)
    assert isinstance(noisy, NoisyStats)
    for bad in ((0.5,) * (C - 1), (0.5,) * (C - 1) + (1.5,), (math.nan,) * C, "0.5"):
        with pytest.raises(StatsValidationError, match="one post-processing intensity in"):
            NoisyStats.of(_blind(noisy), noisy.noise_sigma, bad)  # type: ignore[arg-type]
    with pytest.raises(StatsValidationError, match="noise_shrinkage comes without noise_sig"):
        StatsHeader(noisy.meta, noise_shrinkage=(0.5,) * C)
    with pytest.raises(StatsValidationError, match="holds 2 intensities for 5 classes"):
        StatsHeader(noisy.meta, noise_sigma=noisy.noise_sigma, noise_shrinkage=(0.5, 0.5))
    entries = StatsHeader.of(noisy).to_entries("file")
    for value, match in (("[0.5, 0.5]", "holds 2 intensities for 5 classes"),
                         ("[0.5, 2, 0, 0, 0]", "a JSON list of one intensity in"),
                         ("{}", "a JSON list of one intensity in")):
        with pytest.raises(StatsFormatError, match=match):
            StatsHeader.from_entries({**entries, "noise_shrinkage": value}, "file", "'t.ghs'")
    alone = {k: v for k, v in entries.items() if k != "noise_sigma"}
    with pytest.raises(StatsFormatError, match="noise_shrinkage comes without noise_sigma"):
        StatsHeader.from_entries(alone, "file", "'t.ghs'")


def test_chosen_shrinkage_grows_with_the_noise(split: Split) -> None:
    total = _total(split)
    heads = [QDAHead().fit_from_stats(dp_release(total, R, z, seed=3))
             for z in (0.05, 0.5, 2.0, 8.0, 32.0)]
    shrink = [h.shrinkage_[0] for h in heads]
    assert all(b > a for a, b in itertools.pairwise(shrink)), shrink
    assert shrink[0] < 0.01 and shrink[-1] > 0.5, shrink
    assert {h.shrinkage_method_ for h in heads} == {"evidence+dp-noise"}
    blind = QDAHead().fit_from_stats(dp_release(total, R, 32.0, seed=3, aware=False))
    assert blind.shrinkage_method_ == "evidence" and blind.shrinkage_[0] < 0.01


@pytest.mark.parametrize("target", ["pooled", "scaled_identity"])
def test_covariances_stay_positive_definite_at_very_low_epsilon(split: Split,
                                                                target: str) -> None:
    noisy = _at_epsilon(_total(split), 1e-3, seed=4)
    assert np.any(noisy.counts == 1)  # the noise left a placeholder class
    with pytest.warns(GhoflWarning, match="1 sample"):
        head = QDAHead(shrinkage_target=target).fit_from_stats(noisy)  # type: ignore[arg-type]
    assert head.shrinkage_[0] > 0.9 and head.shrinkage_method_.endswith(NOISE_TAG)
    p = head.precision_chol_  # P_c = L_c⁻ᵀ: Σ̃_c⁻¹ = P_c P_cᵀ
    assert np.all(np.isfinite(p)) and np.all(np.isfinite(head.half_log_det_))
    for c in range(C):
        assert np.linalg.eigvalsh(p[c] @ p[c].T)[0] > 0.0
        cov = np.linalg.inv(p[c] @ p[c].T)
        assert np.all(np.isfinite(cov)) and np.linalg.eigvalsh(cov)[0] > 0.0
    assert np.all(np.isfinite(head.decision_function(split[2][:200])))


@pytest.mark.parametrize("eps", [0.5, 1.0])
def test_noise_aware_qda_is_more_accurate_than_the_blind_one(eps: float) -> None:
    gain = []
    for seed in range(5):
        x, y, xt, yt = _classes(10 + seed)
        noisy = _at_epsilon(compute_stats(x, y, C, "full", clip_norm=R), eps, seed=100 + seed)
        aware, blind = QDAHead().fit_from_stats(noisy), QDAHead().fit_from_stats(_blind(noisy))
        assert blind.shrinkage_method_ == "evidence"
        gain.append(aware.score(xt, yt) - blind.score(xt, yt))
    mean, se = float(np.mean(gain)), float(np.std(gain, ddof=1) / math.sqrt(len(gain)))
    assert mean > 0.05 and mean > 3.0 * se, (eps, gain)


def test_the_rule_is_recorded_and_saved(split: Split, tmp_path: Path) -> None:
    head = QDAHead().fit_from_stats(_at_epsilon(_total(split), 0.5, seed=2))
    assert head.shrinkage_method_ == "evidence+dp-noise"
    save_head(head, tmp_path / "qda.ghh")
    back = load_head(tmp_path / "qda.ghh")
    assert isinstance(back, QDAHead)
    assert (back.shrinkage_method_, back.shrinkage_) == (head.shrinkage_method_, head.shrinkage_)
    np.testing.assert_array_equal(back.decision_function(split[2][:50]),
                                  head.decision_function(split[2][:50]))
    arrays, scalars = head.get_state()
    old = QDAHead().set_state(head.meta_, arrays, {"shrinkage_": scalars["shrinkage_"]})
    assert old.shrinkage_method_ == "unrecorded"
