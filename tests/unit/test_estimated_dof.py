"""Degrees of freedom of estimated second moments (FedCOF's from client means): carried by
:class:`EstimatedStats`, read by the shrinkage criteria; exact sums unchanged."""

from __future__ import annotations

import numpy as np
import pytest

from ghofl.errors import StatsValidationError
from ghofl.heads import make_head
from ghofl.moments import compute_moments
from ghofl.moments.criteria import analytic_error_shrinkage, shrinkage_family
from ghofl.moments.estimated import EstimatedStats, pooled_effective_dof
from ghofl.moments.fedcof import fedcof_statistics
from ghofl.stats import ClientStats, compute_stats


def _gaussians(seed: int, c: int, d: int, n_per: int, draw: int = 0,
               spread: float = 0.6) -> tuple[np.ndarray, np.ndarray]:
    """C Gaussian classes sharing a covariance with a decaying spectrum (``draw``: sample seed)."""
    rng = np.random.default_rng(seed)
    q, _ = np.linalg.qr(rng.normal(size=(d, d)))
    scale = np.sqrt(np.geomspace(10.0, 0.05, d))
    means = rng.normal(size=(c, d)) * spread
    y = np.repeat(np.arange(c), n_per)
    noise = np.random.default_rng([seed, draw]).normal(size=(y.size, d))
    x = means[y] + (noise * scale) @ q.T
    return x, y


def _clients(x: np.ndarray, y: np.ndarray, c: int, k: int, seed: int) -> list[ClientStats]:
    """k clients, each holding a random part of every class (mode ``means``)."""
    owner = np.random.default_rng(seed).integers(0, k, size=y.size)
    return [compute_stats(x[owner == j], y[owner == j], c, mode="means") for j in range(k)]


def _plain(s: ClientStats) -> ClientStats:
    """The same arrays as ordinary statistics (read with N − C degrees of freedom)."""
    return ClientStats(s.meta, counts=s.counts, sums=s.sums, sq_sums=s.sq_sums,
                       class_scatter=s.class_scatter, scatter=s.scatter)


def test_pooled_effective_dof() -> None:
    assert pooled_effective_dof(np.array([9.0, 9.0, 9.0]), np.array([5.0, 5.0, 5.0])) == pytest.approx(27.0)
    # unequal: between the smallest total and the plain sum, classes without estimate left out
    nu = pooled_effective_dof(np.array([2.0, 50.0, 0.0]), np.array([100.0, 100.0, 100.0]))
    assert 2.0 < nu < 52.0
    assert pooled_effective_dof(np.zeros(3), np.ones(3)) == 0.0


def test_fedcof_statistics_carry_the_estimates_dof() -> None:
    c = 3
    x, y = _gaussians(0, c, 8, 400)
    clients = _clients(x, y, c, k=20, seed=1)
    est = fedcof_statistics(clients)
    assert isinstance(est, EstimatedStats)
    k_c = np.sum(np.stack([s.counts for s in clients]) > 0, axis=0)
    np.testing.assert_array_equal(est.class_dof, k_c - 1)  # type: ignore[arg-type]
    assert est.scatter_dof == pytest.approx(float(np.sum(k_c - 1)), rel=1e-12)  # equal N_c
    m = compute_moments(est)
    assert m.is_estimated and m.pooled_dof() == est.scatter_dof and m.class_dof(0) == k_c[0] - 1
    full = fedcof_statistics(clients, mode="full")
    low = full.to_mode("pooled")
    assert isinstance(low, EstimatedStats) and low.scatter_dof == full.scatter_dof
    assert low.class_dof is None and "scatter_dof=57" in repr(low)
    with pytest.raises(StatsValidationError, match="not additive"):
        est + est
    with pytest.raises(StatsValidationError, match="scatter_dof must be"):
        EstimatedStats(est.meta, counts=est.counts, sums=est.sums, sq_sums=est.sq_sums,
                       scatter=est.scatter, scatter_dof=-1.0)
    with pytest.raises(StatsValidationError, match="class_dof must hold 3"):
        EstimatedStats(est.meta, counts=est.counts, sums=est.sums, sq_sums=est.sq_sums,
                       scatter=est.scatter, scatter_dof=1.0, class_dof=np.ones(2))


def test_exact_sums_keep_n_minus_c() -> None:
    c = 3
    x, y = _gaussians(2, c, 10, 200)
    exact = compute_stats(x, y, c, mode="full")
    m = compute_moments(exact)
    assert not m.is_estimated and m.pooled_dof() == len(y) - c and m.class_dof(1) == 199.0
    # the same arrays declared with the exact dof fit the very same heads
    same = EstimatedStats(exact.meta, counts=exact.counts, sums=exact.sums,
                          class_scatter=exact.class_scatter, scatter_dof=float(len(y) - c),
                          class_dof=(exact.counts - 1).astype(np.float64))
    for head in ("lda", "ridge", "qda", "fishermix"):
        a = make_head(head).fit_from_stats(exact)
        b = make_head(head).fit_from_stats(same)
        np.testing.assert_array_equal(a.predict(x), b.predict(x))
        np.testing.assert_allclose(a.class_scores(x), b.class_scores(x), rtol=1e-12)


def test_fewer_clients_shrink_more_and_classify_no_worse() -> None:
    """FedCOF estimates from 200 and 20 clients (ν ≈ 800 and 76 for d = 80): the dof-aware
    choice shrinks more than the N − C reading and more with fewer clients, and its LDA is no
    worse than the old choice's (far better at ν < d) nor than FedCOF's own classifier."""
    c, d = 4, 80
    x, y = _gaussians(3, c, d, 1500, spread=0.25)
    xt, yt = _gaussians(3, c, d, 2000, draw=1, spread=0.25)  # same classes, fresh draws
    chosen = {}
    for k in (200, 20):
        est = fedcof_statistics(_clients(x, y, c, k=k, seed=k))
        lda = make_head("lda").fit_from_stats(est)
        old = make_head("lda").fit_from_stats(_plain(est))
        chosen[k] = lda.shrinkage_  # type: ignore[attr-defined]
        assert chosen[k] > old.shrinkage_  # type: ignore[attr-defined]
        acc = float(np.mean(lda.predict(xt) == yt))
        assert acc >= float(np.mean(old.predict(xt) == yt))
        assert acc >= float(np.mean(make_head("fedcof").fit_from_stats(est).predict(xt) == yt))
        ridge = make_head("ridge", n_calibration=0).fit_from_stats(est)
        ridge_old = make_head("ridge", n_calibration=0).fit_from_stats(_plain(est))
        assert ridge.alpha_ > ridge_old.alpha_  # type: ignore[attr-defined]
    assert chosen[20] > chosen[200]


def test_no_trusted_candidate_shrinks_most() -> None:
    """Three degrees of freedom in d = 50 ask for strong shrinkage; when no candidate passes
    df(a) ≤ max_df·ν the choice is the largest coefficient, not the smallest."""
    c, d = 3, 50
    x, y = _gaussians(5, c, d, 300)
    est = fedcof_statistics(_clients(x, y, c, k=2, seed=0))
    assert est.scatter_dof == pytest.approx(3.0)
    assert make_head("lda").fit_from_stats(est).shrinkage_ > 0.5  # type: ignore[attr-defined]
    m = compute_moments(est)
    cov = m.pooled_covariance()
    fam = shrinkage_family(cov, float(np.trace(cov)) / d, None)
    args = (fam, 1e-3, m.means, m.counts, np.log(m.priors))
    assert analytic_error_shrinkage(*args, max_df=0.5) == 0.99
    assert analytic_error_shrinkage(*args) == 1e-6  # exact-sums behaviour (max_df = 1) kept
