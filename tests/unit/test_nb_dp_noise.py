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
    noisy = _at_epsilon(_total(split, mode), 1.0, seed=1)
    assert isinstance(noisy, NoisyStats)
    m = compute_moments(noisy)
    nu2 = class_var_noise(m)
    assert nu2 is not None
    sig = noisy.noise_sigma
    expect = (sig[block] ** 2 + 4 * sig["sums"] ** 2 * m.means**2) / m.counts[:, None] ** 2
    np.testing.assert_allclose(nu2, expect, rtol=1e-12)


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
