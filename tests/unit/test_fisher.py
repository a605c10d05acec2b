"""Fisher subspace (ghofl.heads.fisher): whitening, k_f rules, degenerate cases, projections."""

from __future__ import annotations

import numpy as np
import pytest
import scipy.linalg

from ghofl.errors import ConfigError, StatsValidationError, UnsupportedModeError
from ghofl.heads._linalg import linear_discriminant
from ghofl.heads.fisher import (
    class_coefficient,
    default_max_dim,
    fisher_class_covariances,
    fisher_pooled_covariance,
    fisher_subspace,
    project,
    project_covariance,
)
from ghofl.heads.lda import LDAHead, lda_covariance
from ghofl.moments import GhoflWarning, Moments, compute_moments, shrink
from ghofl.moments.selection import choose_class_shrinkage
from ghofl.stats import compute_stats, sum_stats
from tests.helpers import gaussian_mixture


def _moments(seed: int = 0, c: int = 6, d: int = 10, n: int = 1500, mode: str = "full",
             sep: float = 2.0) -> tuple[Moments, np.ndarray, np.ndarray]:
    x, y = gaussian_mixture(seed, num_classes=c, dim=d, n=n, sep=sep)
    return compute_moments(compute_stats(x, y, c, mode=mode)), x, y  # type: ignore[arg-type]


def _between(m: Moments) -> np.ndarray:
    dev = m.means - m.global_mean
    out: np.ndarray = (dev * m.priors[:, None]).T @ dev
    return out


@pytest.mark.parametrize("mode", ["full", "pooled"])
@pytest.mark.parametrize("shrinkage", [0.05, 0.0, "auto"])
def test_whitening_identity(mode: str, shrinkage: float | str) -> None:
    m, _, _ = _moments(mode=mode)
    fs = fisher_subspace(m, shrinkage=shrinkage)
    np.testing.assert_allclose(fs.V.T @ fs.within @ fs.V, np.eye(fs.k_f), atol=1e-8)


def test_solves_generalised_eigenproblem() -> None:
    m, _, _ = _moments(c=6, d=10)
    fs = fisher_subspace(m, energy=1.0)
    s_b = _between(m)
    ref = scipy.linalg.eigh(s_b, fs.within, eigvals_only=True)[::-1]
    assert fs.k_f == 5 == fs.rank
    np.testing.assert_allclose(fs.eigenvalues, ref[:5], rtol=1e-9)
    np.testing.assert_allclose(fs.V.T @ s_b @ fs.V, np.diag(fs.eigenvalues), atol=1e-9)
    # S_B v = λ S_W v column by column
    np.testing.assert_allclose(s_b @ fs.V, fs.within @ fs.V * fs.eigenvalues, atol=1e-9)


def test_within_is_shrunk_pooled_covariance() -> None:
    m, _, _ = _moments()
    fs = fisher_subspace(m, shrinkage=0.05)
    np.testing.assert_array_equal(fs.within, shrink(m.pooled_covariance(), 0.05))
    assert fs.shrinkage == 0.05 and fs.ridge == 0.0 and not fs.degenerate


def test_lda_in_fisher_space_matches_x_space_lda() -> None:
    """All C − 1 discriminants preserve LDA: 100% argmax agreement (reference-notes §4)."""
    c = 10
    m, _, _ = _moments(seed=3, c=c, d=24, n=3000, sep=1.0)
    x_test, _ = gaussian_mixture(4, num_classes=c, dim=24, n=5000, sep=1.0)
    fs = fisher_subspace(m, shrinkage=0.05, energy=1.0)
    assert fs.k_f == c - 1
    means_f = m.means @ fs.V
    coef, intercept, _ = linear_discriminant(
        means_f, project_covariance(fs.within, fs.V), np.log(m.priors), "test")
    pred_f = np.argmax(project(x_test, fs.V) @ coef.T + intercept, axis=1)
    lda = LDAHead(shrinkage=0.05).fit_from_moments(m)
    np.testing.assert_array_equal(pred_f, lda.predict(x_test))


def test_energy_cut_and_caps() -> None:
    m, _, _ = _moments(c=8, d=12)
    full = fisher_subspace(m, energy=1.0)
    lam = full.spectrum[: full.rank]
    share = np.cumsum(lam) / lam.sum()
    fs = fisher_subspace(m, energy=0.9)
    assert fs.k_f == int(np.searchsorted(share, 0.9)) + 1
    assert share[fs.k_f - 1] >= 0.9 > (share[fs.k_f - 2] if fs.k_f > 1 else 0.0)
    assert fisher_subspace(m, energy=1.0, max_dim=3).k_f == 3
    assert fisher_subspace(m, energy=1e-9, min_dim=4).k_f == 4
    np.testing.assert_allclose(fisher_subspace(m, energy=1.0, max_dim=3).V, full.V[:, :3],
                               atol=1e-12)


def test_default_max_dim_rule() -> None:
    assert default_max_dim(10) == 9
    assert default_max_dim(100) == 99
    assert default_max_dim(1000) == 999  # uncapped; the paper's 128 is max_dim=128
    assert default_max_dim(2) == 1


def test_two_classes_pads_to_min_dim() -> None:
    """C = 2: rank S_B = 1; k_f = min_dim = 2, the second direction has eigenvalue 0."""
    m, x, _ = _moments(c=2, d=5)
    fs = fisher_subspace(m)
    assert (fs.rank, fs.k_f) == (1, 2)
    assert fs.eigenvalues[0] > 0.0 and fs.eigenvalues[1] == 0.0
    np.testing.assert_allclose(fs.V.T @ fs.within @ fs.V, np.eye(2), atol=1e-10)
    np.testing.assert_allclose(fs.V[:, 1] @ _between(m) @ fs.V[:, 1], 0.0, atol=1e-10)
    one = fisher_subspace(m, min_dim=1)
    assert one.k_f == 1
    np.testing.assert_allclose(one.V[:, 0], fs.V[:, 0], atol=1e-12)
    # the padding direction carries no mean difference: LDA_f still equals x-space LDA
    means_f = m.means @ fs.V
    np.testing.assert_allclose(means_f[0, 1], means_f[1, 1], atol=1e-10)
    coef, intercept, _ = linear_discriminant(means_f, np.eye(2), np.log(m.priors), "test")
    pred = np.argmax(x @ fs.V @ coef.T + intercept, axis=1)
    np.testing.assert_array_equal(pred, LDAHead(shrinkage=0.05).fit_from_moments(m).predict(x))


def test_equal_means_fall_back_with_warning() -> None:
    rng = np.random.default_rng(0)
    block = rng.normal(size=(200, 4))
    x = np.concatenate([block, block, block])  # three classes with identical samples
    y = np.repeat(np.arange(3), 200)
    m = compute_moments(compute_stats(x, y, 3, mode="pooled"))
    with pytest.warns(GhoflWarning, match="all class means coincide"):
        fs = fisher_subspace(m, min_dim=2)
    assert fs.degenerate and fs.rank == 0 and fs.k_f == 2
    np.testing.assert_array_equal(fs.eigenvalues, np.zeros(2))
    np.testing.assert_allclose(fs.V.T @ fs.within @ fs.V, np.eye(2), atol=1e-10)
    w, u = np.linalg.eigh(fs.within)
    inv_sqrt = (u * w**-0.5) @ u.T
    np.testing.assert_allclose(fs.V, inv_sqrt[:, :2], atol=1e-10)


def test_fewer_dims_than_classes() -> None:
    m, _, _ = _moments(c=7, d=3)
    fs = fisher_subspace(m, energy=1.0)
    assert fs.rank == 3 and fs.k_f == 3
    np.testing.assert_allclose(fs.V.T @ fs.within @ fs.V, np.eye(3), atol=1e-10)


def test_fewer_dims_than_min_dim() -> None:
    m, _, _ = _moments(c=4, d=1)
    fs = fisher_subspace(m, min_dim=2)
    assert fs.k_f == 1 and fs.V.shape == (1, 1)


def test_singular_within_gets_ridge() -> None:
    m, _, _ = _moments(c=3, d=30, n=20)  # N − C < d, no shrinkage: S_W singular
    with pytest.warns(GhoflWarning, match="S_W is singular; added a ridge"):
        fs = fisher_subspace(m, shrinkage=0.0)
    assert fs.ridge > 0.0
    np.testing.assert_allclose(fs.V.T @ fs.within @ fs.V, np.eye(fs.k_f), atol=1e-8)


def test_zero_within_covariance_raises() -> None:
    x = np.repeat(np.eye(3), 4, axis=0)
    y = np.repeat(np.arange(3), 4)
    m = compute_moments(compute_stats(x, y, 3, mode="pooled"))
    with pytest.raises(StatsValidationError, match="pooled within-class covariance is zero"):
        fisher_subspace(m)


def test_partition_invariance() -> None:
    x, y = gaussian_mixture(5, num_classes=5, dim=8, n=1200)
    whole = compute_moments(compute_stats(x, y, 5, mode="full"))
    parts = np.random.default_rng(1).integers(0, 7, size=y.size)
    split = compute_moments(sum_stats(
        compute_stats(x[parts == p], y[parts == p], 5, mode="full") for p in range(7)))
    a, b = fisher_subspace(whole), fisher_subspace(split)
    assert a.k_f == b.k_f
    np.testing.assert_allclose(a.V, b.V, rtol=1e-9, atol=1e-11)


def test_deterministic_signs() -> None:
    m, _, _ = _moments()
    fs = fisher_subspace(m)
    w, u = np.linalg.eigh(fs.within)
    q = (u * w**0.5) @ u.T @ fs.V  # back to the whitened eigenvectors
    idx = np.argmax(np.abs(q), axis=0)
    assert np.all(q[idx, np.arange(fs.k_f)] > 0)


def test_projection_helpers() -> None:
    m, x, _ = _moments()
    fs = fisher_subspace(m)
    np.testing.assert_array_equal(project(x, fs.V), x @ fs.V)
    cov = m.class_covariance(0)
    np.testing.assert_allclose(project_covariance(cov, fs.V), fs.V.T @ cov @ fs.V, atol=1e-12)
    covs = fisher_class_covariances(m, fs.V, 0.1)
    for c in range(m.num_classes):
        ref = fs.V.T @ shrink(m.class_covariance(c), 0.1) @ fs.V
        np.testing.assert_allclose(covs[c], ref, atol=1e-12)
    np.testing.assert_allclose(fisher_pooled_covariance(m, fs.V, 0.05), np.eye(fs.k_f),
                               atol=1e-9)
    pooled, _ = lda_covariance(m, 0.3)
    np.testing.assert_allclose(fisher_pooled_covariance(m, fs.V, 0.3),
                               fs.V.T @ pooled @ fs.V, atol=1e-12)


@pytest.mark.parametrize("rule", ["auto", "oas"])
def test_class_covariances_rule_and_singleton_paths(rule: str) -> None:
    """A rule picks a_c per class judged in the Fisher space (basis V); N_c = 1 falls back to
    the pooled covariance on the explicit d × d path."""
    x, y = gaussian_mixture(2, num_classes=3, dim=6, n=600)
    y[0] = 3  # a class with a single sample
    m = compute_moments(compute_stats(x, y, 4, mode="full"))
    fs = fisher_subspace(m)
    with pytest.warns(GhoflWarning, match="has 1 sample"):
        covs = fisher_class_covariances(m, fs.V, rule)
    for c in range(3):
        cov = m.class_covariance(c)
        a = class_coefficient(m, c, rule, fs.V)
        assert a == choose_class_shrinkage(m, c, rule, basis=fs.V).value
        assert 0.0 <= a <= 1.0
        np.testing.assert_allclose(covs[c], fs.V.T @ shrink(cov, a) @ fs.V, atol=1e-12)
    assert class_coefficient(m, 0, 0.3, fs.V) == 0.3
    # N_c = 1: the pooled covariance, and OAS with (N_c − 1)/N_c = 0 gives a = 1 (as QDAHead)
    pooled = fs.V.T @ shrink(m.pooled_covariance(), 1.0) @ fs.V
    np.testing.assert_allclose(covs[3], pooled, atol=1e-12)
    with pytest.warns(GhoflWarning, match="has 1 sample"):
        fixed = fisher_class_covariances(m, fs.V, 0.2)
    np.testing.assert_allclose(fixed[3], fs.V.T @ shrink(m.pooled_covariance(), 0.2) @ fs.V,
                               atol=1e-12)


def test_class_covariances_need_full_mode() -> None:
    m, _, _ = _moments(mode="pooled")
    fs = fisher_subspace(m)
    with pytest.raises(UnsupportedModeError, match="need upload mode 'full'"):
        fisher_class_covariances(m, fs.V, 0.1)


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"energy": 0.0}, r"'fisher_energy' must be a number in \(0.0, 1.0\]; got 0.0"),
        ({"energy": 1.5}, r"'fisher_energy' must be a number in \(0.0, 1.0\]; got 1.5"),
        ({"energy": "x"}, r"'fisher_energy' must be a number .*; got 'x'"),
        ({"max_dim": 0}, r"'fisher_max_dim' must be an integer >= 1 or None; got 0"),
        ({"max_dim": 2.5}, r"'fisher_max_dim' must be an integer >= 1 or None; got 2.5"),
        ({"min_dim": 0}, r"'fisher_min_dim' must be an integer >= 1; got 0"),
        ({"min_dim": True}, r"'fisher_min_dim' must be an integer >= 1; got True"),
        ({"shrinkage": 2.0}, r"fisher_shrinkage must be a number in \[0, 1\] or 'auto'; got 2.0"),
    ],
)
def test_parameter_errors(kwargs: dict[str, object], match: str) -> None:
    m, _, _ = _moments(mode="pooled")
    with pytest.raises(ConfigError, match=match):
        fisher_subspace(m, **kwargs)  # type: ignore[arg-type]


def test_diag_mode_is_rejected() -> None:
    m, _, _ = _moments(mode="diag")
    with pytest.raises(UnsupportedModeError, match="needs a second-moment matrix"):
        fisher_subspace(m)
