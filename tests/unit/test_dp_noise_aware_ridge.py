"""Noise-aware regularisation of the ridge head on differentially private statistics (issue 41).

The generalised cross-validation of the ridge penalty reads the public noise levels of a
release (:func:`total_release_noise`): the noise of the class sums always, the noise of the
second moments in ``full`` mode (``pooled`` and ``gram`` releases are denoised by the
post-processing); on other statistics it is the criterion of exact statistics, unchanged.
"""

from __future__ import annotations

import itertools

import numpy as np
import pytest

from ghofl.bench.synthetic import SyntheticSplit, gaussian_classes
from ghofl.heads.ridge import CANDIDATES, RidgeHead, gcv_scores, gcv_scores_tridiagonal
from ghofl.moments.core import compute_moments
from ghofl.moments.noise import noise_tag, total_release_noise
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


def _release(total: ClientStats, z: float, aware: bool = True, seed: int = 5) -> ClientStats:
    """``total`` noised at noise multiplier z (equal split), post-processed."""
    out: ClientStats = dp_release(total, R, z, seed=seed, aware=aware)
    return out


def _ridge(stats: ClientStats, s: SyntheticSplit) -> tuple[float, str, float]:
    head = RidgeHead(n_calibration=0).fit_from_stats(stats)
    return head.alpha_, head.alpha_rule_, float(np.mean(head.predict(s.x_test) == s.y_test))


def test_the_noise_of_the_total_from_the_public_levels(
        data: tuple[SyntheticSplit, ClientStats]) -> None:
    _, total = data
    m = compute_moments(total)
    assert total_release_noise(total, m.counts, m.global_mean) is None
    noisy = _release(total, 0.5)
    assert isinstance(noisy, NoisyStats)
    mn = compute_moments(noisy)
    noise = total_release_noise(noisy, mn.counts, mn.global_mean)
    assert noise is not None
    sig, n = noisy.noise_sigma, float(mn.n_samples)
    # pooled: the post-processing denoised the within-class scatter (full mode: below)
    assert noise.entry_var == 0.0
    pi = mn.counts / n
    np.testing.assert_allclose(noise.mean_var,
                               sig["sums"] ** 2 * (1 - 2 * pi + C * pi**2) / (n - 1) ** 2)


def test_full_mode_reads_the_summed_class_scatters(
        data: tuple[SyntheticSplit, ClientStats]) -> None:
    s, _ = data
    full = compute_stats(s.x_train, s.y_train, C, "full", clip_norm=R)
    noisy = _release(full, 0.5)
    assert isinstance(noisy, NoisyStats)
    m = compute_moments(noisy)
    noise = total_release_noise(noisy, m.counts, m.global_mean)
    assert noise is not None
    plain = noise.entry_var * (m.n_samples - 1) ** 2 - 4 * C * noisy.noise_sigma["sums"] ** 2 \
        * float(m.global_mean @ m.global_mean) / D
    assert plain == pytest.approx(C * noisy.noise_sigma["class_scatter"] ** 2)


def test_zero_noise_levels_leave_the_choice_unchanged(
        data: tuple[SyntheticSplit, ClientStats]) -> None:
    s, total = data
    silent = NoisyStats.of(total, {"counts": 0.0, "sums": 0.0, "scatter": 0.0})
    assert noise_tag(silent) == "" and noise_tag(total) == ""
    np.testing.assert_array_equal(gcv_scores(compute_moments(silent), list(CANDIDATES)),
                                  gcv_scores(compute_moments(total), list(CANDIDATES)))
    assert _ridge(silent, s) == _ridge(total, s)
    assert _ridge(total, s)[1] == "gcv"


def test_both_spectral_paths_score_the_noise_alike(
        data: tuple[SyntheticSplit, ClientStats]) -> None:
    _, total = data
    m = compute_moments(_release(total, 2.0))
    cands = list(CANDIDATES)
    fast = gcv_scores_tridiagonal(m, cands)
    assert fast is not None
    slow = gcv_scores(m, cands)
    finite = np.isfinite(slow)
    np.testing.assert_array_equal(np.isfinite(fast[0]), finite)
    np.testing.assert_allclose(fast[0][finite], slow[finite], rtol=1e-6)


def test_chosen_regularisation_rises_with_the_noise(
        data: tuple[SyntheticSplit, ClientStats]) -> None:
    s, total = data
    chosen = [_ridge(_release(total, z), s) for z in (0.05, 2.0, 8.0, 32.0)]
    alphas = [a for a, _, _ in chosen]
    assert all(b >= a for a, b in itertools.pairwise(alphas)) and alphas[-1] > alphas[0], alphas
    assert {rule for _, rule, _ in chosen} == {"gcv+dp-noise"}
    blind = _ridge(_release(total, 32.0, aware=False), s)
    assert blind[1] == "gcv" and blind[0] < alphas[-1]


def test_noise_aware_ridge_is_not_worse_than_the_noise_blind_one(
        data: tuple[SyntheticSplit, ClientStats]) -> None:
    s, total = data
    for z in (8.0, 32.0):
        assert _ridge(_release(total, z), s)[2] >= _ridge(_release(total, z, aware=False), s)[2]


def test_large_epsilon_approaches_the_non_private_ridge(
        data: tuple[SyntheticSplit, ClientStats]) -> None:
    s, total = data
    a0, _, acc0 = _ridge(total, s)
    a, rule, acc = _ridge(_release(total, 1e-3), s)
    assert rule == "gcv+dp-noise" and acc >= acc0 - 0.005
    assert a0 < 1e-3 and a < 1e-3  # next to no noise: next to no extra regularisation
