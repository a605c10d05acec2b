"""Noise-aware class variances of the naive Bayes head on private statistics (issue 41).

On a differentially private release (:class:`NoisyStats`) the per-class variances are shrunk
toward the pooled one by an intensity that counts the public noise of the release
(:func:`noise_aware_class_vars`); on other statistics the head is that of exact statistics,
unchanged.
"""

from __future__ import annotations

import itertools
from pathlib import Path

import numpy as np
import pytest

from ghofl.bench.synthetic import SyntheticSplit, gaussian_classes
from ghofl.heads.nb import NBDiagHead, class_var_noise, noise_aware_class_vars
from ghofl.heads.registry import load_head, save_head
from ghofl.moments.core import compute_moments
from ghofl.moments.noise import NOISE_TAG
from ghofl.privacy.accounting import calibrate_noise_multiplier
from ghofl.privacy.postprocess import NoisyStats
from ghofl.stats.accumulate import compute_stats
from ghofl.stats.client_stats import ClientStats
from ghofl.stats.meta import Mode
from tests.helpers import dp_release
from tests.unit.test_qda_dp_noise import _blind, _classes
from tests.unit.test_qda_dp_noise import _total as _qda_total

R = 6.0
C, D = 5, 16
DELTA = 1e-5


@pytest.fixture(scope="module")
def split() -> SyntheticSplit:
    return gaussian_classes(0, dim=D, num_classes=C, n_train=20_000, n_test=5000)


def _total(s: SyntheticSplit, mode: Mode = "diag") -> ClientStats:
    return compute_stats(s.x_train, s.y_train, C, mode, clip_norm=R)


def _at_epsilon(total: ClientStats, eps: float, seed: int, aware: bool = True) -> ClientStats:
    """``total`` released at (ε, 1e-5) through the public path (equal split), post-processed."""
    out: ClientStats = dp_release(total, R, calibrate_noise_multiplier(eps, DELTA), seed=seed,
                                  aware=aware)
    return out


@pytest.mark.parametrize("mode", ["diag", "pooled", "full"])
def test_exact_and_silent_statistics_fit_as_before(split: SyntheticSplit, mode: Mode) -> None:
    total = _total(split, mode)
    silent = NoisyStats.of(total, {"counts": 0.0, "sums": 0.0})
    m = compute_moments(total)
    assert class_var_noise(m) is None and noise_aware_class_vars(m) is None
    global_var = total.diag_sums.sum(axis=0) / m.n_samples - m.global_mean**2
    for kw in ({}, {"var_smoothing": 0.1, "var_floor": 0.0}):
        head = NBDiagHead(**kw).fit_from_stats(total)
        eps = head.params_["var_smoothing"] * float(np.max(global_var))
        np.testing.assert_array_equal(
            head.vars_, np.maximum(m.class_vars + eps, head.params_["var_floor"]))
        assert head.var_rule_ == "fixed" and head.var_shrinkage_ == [0.0] * C
        quiet = NBDiagHead(**kw).fit_from_stats(silent)
        for name in ("means_", "vars_", "log_priors_"):
            np.testing.assert_array_equal(getattr(quiet, name), getattr(head, name))
        assert (quiet.var_rule_, quiet.var_shrinkage_) == ("fixed", [0.0] * C)


def test_noise_on_the_counts_alone_leaves_the_variances(split: SyntheticSplit) -> None:
    total = _total(split)
    counted = NoisyStats.of(total, {"counts": 3.0})  # no noise on what the variances read
    head = NBDiagHead().fit_from_stats(counted)
    assert head.var_rule_ == "pooled-shrinkage+dp-noise" and head.var_shrinkage_ == [0.0] * C
    np.testing.assert_array_equal(head.vars_, NBDiagHead().fit_from_stats(total).vars_)


@pytest.mark.parametrize(("mode", "block"), [("diag", "sq_sums"), ("full", "class_scatter")])
def test_the_noise_of_the_class_variances_from_the_public_levels(
        split: SyntheticSplit, mode: Mode, block: str) -> None:
    """In ``full`` mode only the (1 − a_p)² of the noise that P2n left is counted."""
    total = _total(split) if mode == "diag" else _qda_total(_classes(0))
    noisy = _at_epsilon(total, 1.0, seed=1)
    assert isinstance(noisy, NoisyStats)
    m = compute_moments(noisy)
    nu2 = class_var_noise(m)
    assert nu2 is not None
    sig = noisy.noise_sigma
    expect = (sig[block] ** 2 + 4 * sig["sums"] ** 2 * m.means**2) / m.counts[:, None] ** 2
    if mode == "full":  # the intensities P2n applied, recorded with the release
        applied = np.array(noisy.noise_shrinkage)
        assert np.all((applied > 0.05) & (applied < 0.9)), applied
        expect *= ((1.0 - applied) ** 2)[:, None]
    else:
        assert noisy.noise_shrinkage is None
    np.testing.assert_allclose(nu2, expect, rtol=1e-12)


def test_no_shrinkage_on_top_of_a_postprocessing_that_shrank_all_the_way(
        split: SyntheticSplit) -> None:
    """One covariance shared by the classes: P2n took the pooled one (a_p = 1); NB adds none."""
    noisy = _at_epsilon(_total(split, "full"), 0.3, seed=1)
    assert isinstance(noisy, NoisyStats) and noisy.noise_shrinkage == (1.0,) * C
    head = NBDiagHead().fit_from_stats(noisy)
    assert head.var_rule_ == "pooled-shrinkage+dp-noise" and head.var_shrinkage_ == [0.0] * C
    np.testing.assert_array_equal(head.vars_, NBDiagHead().fit_from_stats(_blind(noisy)).vars_)


@pytest.mark.parametrize("mode", ["diag", "pooled"])
def test_chosen_shrinkage_grows_with_the_noise(split: SyntheticSplit, mode: Mode) -> None:
    total = _total(split, mode)
    heads = [NBDiagHead().fit_from_stats(dp_release(total, R, z, seed=3))
             for z in (0.05, 0.5, 2.0, 8.0, 32.0)]
    shrink = np.array([h.var_shrinkage_ for h in heads])  # (noise levels, C)
    assert all(np.all(b >= a) for a, b in itertools.pairwise(shrink)), shrink
    assert shrink[0].max() < 0.01 and shrink[-1].mean() > 0.5 > shrink[1].mean(), shrink
    assert {h.var_rule_ for h in heads} == {"pooled-shrinkage+dp-noise"}
    blind = NBDiagHead().fit_from_stats(dp_release(total, R, 32.0, seed=3, aware=False))
    assert blind.var_rule_ == "fixed" and blind.var_shrinkage_ == [0.0] * C


@pytest.mark.parametrize("mode", ["diag", "pooled", "full"])
def test_variances_stay_positive_at_very_low_epsilon(split: SyntheticSplit, mode: Mode) -> None:
    total = _total(split, mode)
    noisy = _at_epsilon(total, 1e-3, seed=4)
    assert np.any(compute_moments(noisy).class_vars == 0.0)  # the noise drove some below 0
    bare = {"var_smoothing": 0.0, "var_floor": 0.0}  # no safety net from the smoothing rules
    aware = NBDiagHead(**bare).fit_from_stats(noisy)
    assert np.all(np.isfinite(aware.vars_)) and float(aware.vars_.min()) > 0.0
    assert np.all(np.isfinite(aware.decision_function(split.x_test[:200])))
    blind = NBDiagHead(**bare).fit_from_stats(_at_epsilon(total, 1e-3, seed=4, aware=False))
    assert float(blind.vars_.min()) < 1e-300 < float(aware.vars_.min())


def test_noise_aware_nb_is_at_least_as_accurate_as_the_blind_one() -> None:
    seeds = range(5)
    data = [gaussian_classes(s, dim=D, num_classes=C, n_train=20_000, n_test=5000)
            for s in seeds]
    for eps in (0.5, 1.0):
        gain = []
        for seed, s in zip(seeds, data, strict=True):
            total = _total(s)
            noisy = _at_epsilon(total, eps, seed=100 + seed)
            plain = _at_epsilon(total, eps, seed=100 + seed, aware=False)
            # the diag post-processing ignores σ: both heads read the very same release
            np.testing.assert_array_equal(noisy.sq_sums, plain.sq_sums)
            gain.append(NBDiagHead().fit_from_stats(noisy).score(s.x_test, s.y_test)
                        - NBDiagHead().fit_from_stats(plain).score(s.x_test, s.y_test))
        mean, se = float(np.mean(gain)), float(np.std(gain, ddof=1) / np.sqrt(len(gain)))
        assert mean > 0.0, (eps, gain)
        if eps == 0.5:  # the noise is large against the class variances: a clear gain
            assert mean > 2.0 * se, (eps, gain)


@pytest.mark.parametrize("eps", [0.3, 0.5])
def test_noise_aware_nb_on_a_full_release_loses_nothing_to_the_blind_one(eps: float) -> None:
    """P2n already shrank the class covariances: counting its noise again costs accuracy.

    Distinct class covariances (P2n shrinks them part of the way) and one shared by the
    classes (all the way), each against the same released arrays read without σ.
    """
    gain = []
    for seed in range(5):
        x, y, xt, yt = _classes(10 + seed)
        s = gaussian_classes(seed, dim=D, num_classes=C, n_train=20_000, n_test=5000)
        for total, (tx, ty) in ((_qda_total((x, y, xt, yt)), (xt, yt)),
                                (_total(s, "full"), (s.x_test, s.y_test))):
            noisy = _at_epsilon(total, eps, seed=100 + seed)
            gain.append(NBDiagHead().fit_from_stats(noisy).score(tx, ty)
                        - NBDiagHead().fit_from_stats(_blind(noisy)).score(tx, ty))
    mean = float(np.mean(gain))
    assert mean > -0.003 and min(gain) > -0.01, (eps, gain)


def test_a_placeholder_class_is_shrunk_all_the_way(split: SyntheticSplit) -> None:
    total = _total(split)
    assert total.sq_sums is not None
    counts, sums, sq = total.counts.copy(), total.sums.copy(), total.sq_sums.copy()
    counts[0], sums[0], sq[0] = 1, 0.0, 0.0  # as the post-processing leaves a placeholder
    stats = ClientStats(total.meta, counts=counts, sums=sums, sq_sums=sq, n_clipped=0,
                        holdout=None)
    quiet = NoisyStats.of(stats, {"sums": 1e-3, "sq_sums": 1e-3})  # too little to shrink it
    head = NBDiagHead().fit_from_stats(quiet)
    assert head.var_shrinkage_[0] == 1.0 and max(head.var_shrinkage_[1:]) < 0.01


@pytest.mark.parametrize(("k", "sd_d", "sd_a"), [(1e80, 200.0, 0.5), (1e78, 1e-2, 1e-3)])
def test_the_shrinkage_does_not_depend_on_the_scale_of_the_features(
        split: SyntheticSplit, k: float, sd_d: float, sd_a: float) -> None:
    """Variances near k² (their squares past the float range) shrink as those near 1, with
    noise against them moderate (a_c in (0, 1)) or small (a_c near 0)."""
    total = compute_stats(split.x_train, split.y_train, C, "diag")
    big = compute_stats(split.x_train * k, split.y_train, C, "diag")
    a = NBDiagHead().fit_from_stats(
        NoisyStats.of(total, {"sums": sd_a, "sq_sums": sd_d})).var_shrinkage_
    b = NBDiagHead().fit_from_stats(
        NoisyStats.of(big, {"sums": sd_a * k, "sq_sums": sd_d * k * k})).var_shrinkage_
    assert max(a) < 0.99 and (min(a) > 0.01 if sd_d > 1.0 else max(a) < 1e-6), a
    np.testing.assert_allclose(b, a, rtol=1e-9, atol=1e-15)


def test_a_variance_no_noise_reached_may_be_zero_and_the_head_stays_positive(
        split: SyntheticSplit) -> None:
    """ν_cj = 0 (no noise on D, μ_cj = 0): ṽ_cj = 0 is allowed; the smoothing keeps it > 0."""
    x = split.x_train.copy()
    x[split.y_train == 1, 0] = 0.0  # feature 0 is 0 throughout class 1
    x[:, 1] = 0.0  # feature 1 is 0 everywhere: its pooled variance is 0 too
    stats = NoisyStats.of(compute_stats(x, split.y_train, C, "diag"), {"sums": 0.5})
    m = compute_moments(stats)
    nu2 = class_var_noise(m)
    out = noise_aware_class_vars(m)
    assert nu2 is not None and out is not None
    assert nu2[1, 0] == 0.0 and np.all(nu2[:, 1] == 0.0) and np.all(out[0][:, 1] == 0.0)
    assert np.all(np.isfinite(out[1])) and np.all((out[1] >= 0.0) & (out[1] <= 1.0))
    head = NBDiagHead(var_smoothing=0.0, var_floor=0.0).fit_from_stats(stats)
    assert float(head.vars_.min()) > 0.0
    z = split.x_test[:100].copy()
    z[:, 1] = 0.0
    assert np.all(np.isfinite(head.decision_function(z)))


def test_the_rule_is_recorded_and_saved(split: SyntheticSplit, tmp_path: Path) -> None:
    head = NBDiagHead().fit_from_stats(_at_epsilon(_total(split), 0.5, seed=2))
    assert head.var_rule_ == "pooled-shrinkage+dp-noise" and head.var_rule_.endswith(NOISE_TAG)
    save_head(head, tmp_path / "nb.ghh")
    back = load_head(tmp_path / "nb.ghh")
    assert isinstance(back, NBDiagHead)
    assert (back.var_rule_, back.var_shrinkage_) == (head.var_rule_, head.var_shrinkage_)
    np.testing.assert_array_equal(back.vars_, head.vars_)


def test_state_without_the_rule_loads_as_unrecorded(split: SyntheticSplit) -> None:
    fitted = NBDiagHead().fit_from_stats(_total(split))
    arrays, scalars = fitted.get_state()
    back = NBDiagHead().set_state(fitted.meta_, arrays, {})
    assert back.var_rule_ == "unrecorded" and back.var_shrinkage_ == [0.0] * C
    np.testing.assert_array_equal(back.decision_function(split.x_test[:50]),
                                  fitted.decision_function(split.x_test[:50]))
    assert set(scalars) == {"var_rule_", "var_shrinkage_"}
