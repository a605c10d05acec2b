"""Class-conditional Gaussian synthesis in the Fisher space (ghofl.heads.synthesis)."""

from __future__ import annotations

import numpy as np
import pytest
from scipy import stats as sps

from ghofl.errors import UnsupportedModeError
from ghofl.heads.fisher import fisher_subspace
from ghofl.heads.synthesis import (
    FisherGaussians,
    fisher_gaussians,
    fresh_batches,
    sample_class,
    sample_fixed,
    shuffled_batches,
)
from ghofl.moments import Moments, compute_moments, shrink
from ghofl.stats import compute_stats
from tests.helpers import gaussian_mixture

C, D = 4, 7


def _moments(mode: str = "full") -> Moments:
    x, y = gaussian_mixture(11, num_classes=C, dim=D, n=2000)
    return compute_moments(compute_stats(x, y, C, mode=mode))  # type: ignore[arg-type]


def _gaussians(mode: str = "full", tau: float = 0.9) -> FisherGaussians:
    m = _moments(mode)
    return fisher_gaussians(m, fisher_subspace(m).V, tau=tau, shrinkage=0.05)


def _assert_moments_match(g: FisherGaussians, z: np.ndarray, y: np.ndarray) -> None:
    """Sample means: Hotelling χ² test; covariances: whitened sample covariance ≈ I."""
    k = g.dim
    for c in range(g.num_classes):
        zc = z[y == c]
        n = zc.shape[0]
        L = g.chols[c]
        w = np.linalg.solve(L, (zc - g.means[c]).T).T  # ~ N(0, I) if the moments match
        stat = n * float(np.sum(w.mean(axis=0) ** 2))
        assert stat < sps.chi2.ppf(0.9999, k), (c, stat)
        cov_w = np.cov(w, rowvar=False, bias=True)
        # entries of a Wishart/n matrix have sd ≤ sqrt(2/n); allow 5 sd
        assert np.max(np.abs(cov_w - np.eye(k))) < 5.0 * np.sqrt(2.0 / n), c


def test_covariance_targets_full_mode() -> None:
    m = _moments("full")
    fs = fisher_subspace(m)
    g = fisher_gaussians(m, fs.V, tau=0.8, shrinkage=0.05)
    assert g.source == "class" and g.tau == 0.8
    np.testing.assert_allclose(g.means, m.means @ fs.V, atol=1e-12)
    for c in range(C):
        ref = 0.64 * fs.V.T @ shrink(m.class_covariance(c), 0.05) @ fs.V
        np.testing.assert_allclose(g.covariances()[c], ref, atol=1e-10)


def test_covariance_targets_pooled() -> None:
    m = _moments("pooled")
    fs = fisher_subspace(m)
    g = fisher_gaussians(m, fs.V, tau=0.9, shrinkage=0.05)
    assert g.source == "pooled"
    # the Fisher shrinkage equals syn_shrink here, so Vᵀ S_W V = I: τ² I for every class
    np.testing.assert_allclose(g.covariances(), np.broadcast_to(0.81 * np.eye(g.dim),
                                                                g.covariances().shape),
                               atol=1e-9)
    full = _moments("full")
    assert fisher_gaussians(full, fisher_subspace(full).V, covariance="pooled").source == "pooled"


def test_class_covariance_requires_full_mode() -> None:
    m = _moments("pooled")
    with pytest.raises(UnsupportedModeError, match="class covariances needs upload mode 'full'"):
        fisher_gaussians(m, fisher_subspace(m).V, covariance="class")


def test_fixed_samples_reproduce_moments() -> None:
    g = _gaussians()
    z, y = sample_fixed(g, 20000, np.random.default_rng(0))
    assert z.shape == (C * 20000, g.dim) and y.shape == (C * 20000,)
    np.testing.assert_array_equal(y, np.repeat(np.arange(C), 20000))  # class-blocked
    _assert_moments_match(g, z, y)


def test_fixed_samples_with_per_class_counts() -> None:
    """An array of counts (e.g. ∝ priors) draws class-blocked rows with those counts; equal
    counts give the same draws as one count."""
    g = _gaussians()
    counts = np.array([3, 0, 5, 1])
    z, y = sample_fixed(g, counts, np.random.default_rng(1))
    assert z.shape == (9, g.dim)
    np.testing.assert_array_equal(y, np.repeat(np.arange(C), counts))
    a = sample_fixed(g, np.full(C, 6), np.random.default_rng(2))
    b = sample_fixed(g, 6, np.random.default_rng(2))
    np.testing.assert_array_equal(a[0], b[0])
    np.testing.assert_array_equal(a[1], b[1])


def test_fixed_samples_are_seeded() -> None:
    g = _gaussians()
    a = sample_fixed(g, 50, np.random.default_rng(3))
    b = sample_fixed(g, 50, np.random.default_rng(3))
    c = sample_fixed(g, 50, np.random.default_rng(4))
    np.testing.assert_array_equal(a[0], b[0])
    assert not np.array_equal(a[0], c[0])


def test_fresh_epoch_is_balanced_shuffled_and_matches_moments() -> None:
    g = _gaussians()
    n, bs = 5000, 512
    batches = list(fresh_batches(g, n, bs, np.random.default_rng(1), chunk_samples=3000))
    assert all(z.shape[0] == y.shape[0] <= bs for z, y in batches)
    assert all(z.shape[0] == bs for z, _ in batches[:-1])
    z = np.concatenate([b[0] for b in batches])
    y = np.concatenate([b[1] for b in batches])
    np.testing.assert_array_equal(np.bincount(y, minlength=C), np.full(C, n))
    assert not np.all(np.diff(y) >= 0)  # shuffled, not class-blocked
    _assert_moments_match(g, z, y)


def test_fresh_epochs_differ_and_are_seeded() -> None:
    g = _gaussians()
    rng = np.random.default_rng(7)
    e1 = [b[0] for b in fresh_batches(g, 100, 64, rng)]
    e2 = [b[0] for b in fresh_batches(g, 100, 64, rng)]
    again = [b[0] for b in fresh_batches(g, 100, 64, np.random.default_rng(7))]
    assert not np.array_equal(e1[0], e2[0])
    for a, b in zip(e1, again, strict=True):
        np.testing.assert_array_equal(a, b)


def test_fresh_memory_is_chunked() -> None:
    """Each yielded batch is a view of one chunk of ≈ chunk_samples rows, never of C·n rows."""
    g = _gaussians()
    for z, _ in fresh_batches(g, 10000, 100, np.random.default_rng(0), chunk_samples=1000):
        assert z.base is not None and z.base.shape[0] <= 1000


def test_shuffled_batches_cover_every_index_once() -> None:
    idx = list(shuffled_batches(103, 10, np.random.default_rng(0)))
    assert [len(i) for i in idx] == [10] * 10 + [3]
    np.testing.assert_array_equal(np.sort(np.concatenate(idx)), np.arange(103))


def test_tau_scales_the_covariance() -> None:
    a, b = _gaussians(tau=1.0), _gaussians(tau=0.5)
    np.testing.assert_allclose(b.covariances(), 0.25 * a.covariances(), rtol=1e-10)


def test_pooled_factor_is_held_once_and_stays_shared() -> None:
    """With the pooled covariance every class shares one Cholesky factor: ``chols`` is a
    read-only broadcast view (C·k_f² never allocated), ``at_tau`` rescales it without copying
    and sampling draws the same deviates as the per-class loop."""
    g = _gaussians("pooled", tau=0.9)
    assert g.shared and g.chols.strides[0] == 0 and not g.chols.flags.writeable
    unit = g.at_tau(1.0)
    assert unit.shared and unit.tau == 1.0
    np.testing.assert_allclose(unit.chols[2], g.chols[2] / 0.9, rtol=1e-14)
    np.testing.assert_allclose(unit.covariances(), g.covariances() / 0.81, rtol=1e-12)
    z, _ = sample_fixed(g, 300, np.random.default_rng(5))
    rng = np.random.default_rng(5)
    per_class = np.concatenate([sample_class(g, c, 300, rng) for c in range(C)])
    np.testing.assert_allclose(z, per_class, rtol=1e-12, atol=1e-12)
    assert not _gaussians("full").shared


@pytest.mark.parametrize("mode", ["full", "pooled"])
def test_float32_samples_match_the_moments(mode: str) -> None:
    g = _gaussians(mode)
    z, y = sample_fixed(g, 20000, np.random.default_rng(0), np.float32)
    assert z.dtype == np.float32
    _assert_moments_match(g, z.astype(np.float64), y)
    a = sample_fixed(g, 50, np.random.default_rng(3), np.float32)[0]
    np.testing.assert_array_equal(a, sample_fixed(g, 50, np.random.default_rng(3),
                                                  np.float32)[0])
    batches = list(fresh_batches(g, 100, 64, np.random.default_rng(1), dtype=np.float32))
    assert all(b[0].dtype == np.float32 for b in batches)


def test_fixed_samples_in_chunks_equal_one_pass(monkeypatch: pytest.MonkeyPatch) -> None:
    """Chunks of whole classes draw the same rows as a single chunk (class factors: the same
    calls; shared factor: the same deviates)."""
    from ghofl.heads import synthesis

    for mode in ("full", "pooled"):
        g = _gaussians(mode)
        one = sample_fixed(g, 700, np.random.default_rng(9))[0]
        monkeypatch.setattr(synthesis, "CHUNK_SAMPLES", 1000)
        chunked = sample_fixed(g, 700, np.random.default_rng(9))[0]
        monkeypatch.undo()
        np.testing.assert_allclose(chunked, one, rtol=1e-12, atol=1e-12)
