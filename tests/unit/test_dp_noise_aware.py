"""Noise-aware shrinkage of the LDA on differentially private statistics (issue 41).

The post-processed release keeps its public noise levels (:class:`NoisyStats`); the analytic
error criterion of the pooled covariance reads them (:func:`release_noise`): the noise of the
means always, the noise of the covariance where the post-processing left it (``full`` mode;
``pooled`` and ``gram`` releases are denoised, :func:`ghofl.privacy.postprocess.
denoise_covariance`).
"""

from __future__ import annotations

import itertools

import numpy as np
import pytest

from ghofl.bench.synthetic import SyntheticSplit, gaussian_classes
from ghofl.errors import StatsValidationError
from ghofl.heads.lda import LDAHead, lda_covariance_choice
from ghofl.moments.core import compute_moments
from ghofl.moments.criteria import (
    ANALYTIC_GRID,
    ReleaseNoise,
    analytic_error,
    release_noise,
    shrinkage_family,
)
from ghofl.privacy.postprocess import NoisyStats
from ghofl.stats.accumulate import compute_stats
from ghofl.stats.client_stats import ClientStats
from tests.helpers import dp_release

R = 6.0
C, D = 4, 24


@pytest.fixture(scope="module")
def data() -> tuple[SyntheticSplit, ClientStats]:
    s = gaussian_classes(3, dim=D, num_classes=C, n_train=4000, n_test=3000)
    return s, compute_stats(s.x_train, s.y_train, C, "pooled", clip_norm=R)


def _release(total: ClientStats, z: float, aware: bool = True) -> ClientStats:
    """``total`` noised at noise multiplier z (equal split), post-processed."""
    out: ClientStats = dp_release(total, R, z, seed=5, aware=aware)
    return out


def _lda(stats: ClientStats, s: SyntheticSplit) -> tuple[float, float]:
    head = LDAHead().fit_from_stats(stats)
    return head.shrinkage_, float(np.mean(head.predict(s.x_test) == s.y_test))


def test_release_keeps_its_noise_levels(data: tuple[SyntheticSplit, ClientStats]) -> None:
    _, total = data
    noisy = _release(total, 0.5)
    assert isinstance(noisy, NoisyStats)
    assert noisy.noise_sigma["scatter"] > 0 and noisy.noise_sigma["sums"] > 0
    assert not isinstance(_release(total, 0.5, aware=False), NoisyStats)
    assert isinstance(noisy.to_mode("gram"), NoisyStats)
    assert noisy.to_mode("gram").noise_sigma == noisy.noise_sigma  # type: ignore[attr-defined]


def test_release_noise_from_the_public_levels(data: tuple[SyntheticSplit, ClientStats]) -> None:
    s, total = data
    m = compute_moments(total)
    assert release_noise(total, m.counts, m.means) is None  # exact statistics: no noise
    noisy = _release(total, 0.5)
    assert isinstance(noisy, NoisyStats)
    mn = compute_moments(noisy)
    noise = release_noise(noisy, mn.counts, mn.means)
    assert noise is not None
    sig = noisy.noise_sigma
    # pooled: the post-processing denoised the covariance, only the means keep their noise
    assert noise.entry_var == 0.0
    np.testing.assert_allclose(noise.mean_var, sig["sums"] ** 2 / mn.counts**2)
    # full: the summed class scatters carry C noises, plus the centring's
    full = dp_release(compute_stats(s.x_train, s.y_train, C, "full", clip_norm=R), R, 0.5,
                      seed=5)
    mf = compute_moments(full)
    nf = release_noise(full, mf.counts, mf.means)
    assert nf is not None
    sf = full.noise_sigma
    centring = 4 * sf["sums"] ** 2 * float(np.sum(mf.means**2)) / D
    assert nf.entry_var == pytest.approx((C * sf["class_scatter"] ** 2 + centring)
                                         / (mf.n_samples - C) ** 2)
    np.testing.assert_allclose(nf.mean_var, sf["sums"] ** 2 / mf.counts**2)


def test_zero_noise_leaves_the_criterion_unchanged(
        data: tuple[SyntheticSplit, ClientStats]) -> None:
    _, total = data
    m = compute_moments(total)
    cov = m.pooled_covariance("n-c")
    fam = shrinkage_family(cov, float(np.trace(cov)) / D)
    args = (fam, float(m.n_samples - C), m.means, m.counts, np.log(m.priors),
            list(ANALYTIC_GRID))
    from ghofl.moments.criteria import analytic_error_grams, basis_grams

    grams = basis_grams(fam, m.means @ fam.basis)
    plain = analytic_error(*args)
    zero = analytic_error_grams(fam, grams, float(m.n_samples - C), m.counts,
                                np.log(m.priors), list(ANALYTIC_GRID), 1.0,
                                ReleaseNoise(0.0, np.zeros(C)))
    np.testing.assert_array_equal(plain, zero)
    loud = analytic_error_grams(fam, grams, float(m.n_samples - C), m.counts,
                                np.log(m.priors), list(ANALYTIC_GRID), 1.0,
                                ReleaseNoise(1e-2 * float(np.trace(cov)) ** 2 / D**2,
                                             np.zeros(C)))
    assert np.all(loud >= plain - 1e-12) and np.any(loud > plain + 1e-3)


def test_the_fitted_covariance_flattens_as_the_noise_grows(
        data: tuple[SyntheticSplit, ClientStats]) -> None:
    """The denoised release and the chosen shrinkage together: the LDA's covariance is better
    conditioned the louder the noise, and beats the noise-blind fit (projection to the PSD cone,
    criterion of exact statistics) at every noise level."""
    s, total = data
    conds, accs, blind = [], [], []
    for z in (0.05, 1.0, 4.0, 16.0):
        cov, _ = lda_covariance_choice(compute_moments(_release(total, z)), "auto")
        conds.append(float(np.linalg.cond(cov)))
        accs.append(_lda(_release(total, z), s)[1])
        blind.append(_lda(_release(total, z, aware=False), s)[1])
    assert all(b < a for a, b in itertools.pairwise(conds)), conds
    assert all(a > b for a, b in zip(accs, blind, strict=True)), (accs, blind)


def test_large_epsilon_approaches_the_non_private_lda(
        data: tuple[SyntheticSplit, ClientStats]) -> None:
    s, total = data
    a0, acc0 = _lda(total, s)
    a, acc = _lda(_release(total, 1e-3), s)
    assert acc >= acc0 - 0.005
    assert a == pytest.approx(a0, rel=0.2, abs=1e-3)


def test_noise_aware_lda_beats_the_noise_blind_one_at_high_noise(
        data: tuple[SyntheticSplit, ClientStats]) -> None:
    s, total = data
    assert _lda(_release(total, 16.0), s)[1] >= _lda(_release(total, 16.0, aware=False), s)[1]


def test_noisy_stats_refuse_bad_levels_and_addition(
        data: tuple[SyntheticSplit, ClientStats]) -> None:
    _, total = data
    with pytest.raises(StatsValidationError, match="noise_sigma must map every block"):
        NoisyStats(total.meta, counts=total.counts, sums=total.sums, sq_sums=total.sq_sums,
                   scatter=total.scatter, noise_sigma={"sums": -1.0})
    noisy = _release(total, 0.5)
    with pytest.raises(StatsValidationError, match="not added to other statistics"):
        noisy + total
