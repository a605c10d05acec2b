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

from ghofl.heads._qda_noise import class_cov_noise, noise_floor_shrinkage, postprocess_intensity
from ghofl.heads.qda import QDAHead
from ghofl.heads.registry import load_head, save_head
from ghofl.moments.core import GhoflWarning, compute_moments
from ghofl.moments.noise import NOISE_TAG
from ghofl.privacy.accounting import calibrate_noise_multiplier
from ghofl.privacy.postprocess import NoisyStats
from ghofl.stats.accumulate import compute_stats
from ghofl.stats.client_stats import ClientStats
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


def test_the_postprocessing_shrinkage_is_read_back_from_the_release(split: Split) -> None:
    noisy = _at_epsilon(_total(split), 0.5, seed=1)
    m = compute_moments(noisy)
    pooled = m.pooled_covariance()
    sigma = noisy.noise_sigma["class_scatter"]  # type: ignore[attr-defined]
    for c in range(C):
        a = postprocess_intensity(m, c, pooled)
        cov, dof = m.class_covariance(c), m.class_dof(c)
        tgt = np.trace(cov) / np.trace(pooled) * pooled
        err = (0.5 * D * (D + 1) * (sigma / dof) ** 2
               + (np.sum(cov**2) + np.trace(cov) ** 2) / dof)
        assert 0.05 < a < 0.6  # P2n shrank, not all the way
        np.testing.assert_allclose(a / (1 - a) ** 2, err / np.sum((cov - tgt) ** 2), rtol=1e-9)
    assert postprocess_intensity(compute_moments(_total(split)), 0, pooled) == 0.0


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
