"""FedCOF's covariance estimate and classifier against direct computations, on data drawn from
known class covariances: unbiasedness within sampling error, its partition dependence, the
estimated statistics every head fits from, and the FedCOF classifier's weights."""

from __future__ import annotations

import numpy as np
import pytest

from ghofl.errors import IncompatibleStatsError, StatsValidationError, UnsupportedModeError
from ghofl.heads import make_head
from ghofl.moments.fedcof import fedcof_covariances, fedcof_statistics
from ghofl.stats import ClientStats, compute_stats
from tests.helpers import gaussian_mixture


def _covariance(d: int, seed: int) -> np.ndarray:
    a = np.random.default_rng(seed).normal(size=(d, d))
    return a @ a.T / d + 0.5 * np.eye(d)


def _clients(x: np.ndarray, y: np.ndarray, c: int, k: int, seed: int,
             mode: str = "means") -> list[ClientStats]:
    """k clients of unequal sizes (a random split of a random order)."""
    rng = np.random.default_rng(seed)
    cuts = np.sort(rng.choice(np.arange(1, len(y)), size=k - 1, replace=False))
    return [compute_stats(x[p], y[p], c, mode=mode)  # type: ignore[arg-type]
            for p in np.split(rng.permutation(len(y)), cuts)]


def _direct(clients: list[ClientStats], c: int) -> np.ndarray:
    """Σ̂_c by its definition, one client mean at a time."""
    d = clients[0].dim
    out = np.zeros((c, d, d))
    for j in range(c):
        held = [s for s in clients if s.counts[j] > 0]
        n = sum(int(s.counts[j]) for s in held)
        mu = sum(s.sums[j] for s in held) / n
        for s in held:
            diff = s.sums[j] / s.counts[j] - mu
            out[j] += s.counts[j] * np.outer(diff, diff)
        if len(held) >= 2:
            out[j] /= len(held) - 1
        else:
            out[j] = 0.0
    return out


def test_estimate_matches_its_definition() -> None:
    x, y = gaussian_mixture(3, num_classes=4, dim=6, n=900)
    clients = _clients(x, y, 4, k=12, seed=1)
    cov, k_c = fedcof_covariances(clients)
    np.testing.assert_allclose(cov, _direct(clients, 4), rtol=1e-10, atol=1e-12)
    np.testing.assert_array_equal(k_c, [sum(s.counts[j] > 0 for s in clients) for j in range(4)])


def test_estimate_is_unbiased_for_known_covariances() -> None:
    d, reps, k = 4, 400, 8
    sigma = _covariance(d, 0)
    rng = np.random.default_rng(7)
    estimates = []
    for r in range(reps):
        x = rng.multivariate_normal(np.full(d, 2.0), sigma, size=240)
        y = np.zeros(240, dtype=np.int64)
        cov, _ = fedcof_covariances(_clients(x, y, 1, k=k, seed=r))
        estimates.append(cov[0])
    est = np.asarray(estimates)
    mean, se = est.mean(axis=0), est.std(axis=0, ddof=1) / np.sqrt(reps)
    assert np.all(np.abs(mean - sigma) <= 4.0 * se + 1e-12)
    # the pooled-sample covariance of the same data is not what FedCOF estimates; the spread of
    # single estimates is large at K = 8 (K − 1 degrees of freedom), much above the bias bound
    assert float(np.median(est.std(axis=0))) > 10 * float(np.median(se))


@pytest.mark.parametrize("k", [2, 10, 100])
def test_partition_dependence_shrinks_with_the_number_of_clients(k: int) -> None:
    d = 5
    sigma = _covariance(d, 3)
    rng = np.random.default_rng(11)
    x = rng.multivariate_normal(np.zeros(d), sigma, size=20_000)
    y = np.zeros(len(x), dtype=np.int64)
    errs = [np.linalg.norm(fedcof_covariances(_clients(x, y, 1, k=k, seed=s))[0][0] - sigma)
            / np.linalg.norm(sigma) for s in range(6)]
    # relative Frobenius error ~ sqrt(2/(K-1)) in expectation: large for few clients
    assert np.median(errs) < 3.0 * np.sqrt(2.0 * (d + 1) / (k - 1))
    if k == 100:
        assert np.median(errs) < 0.5
    two = fedcof_covariances(_clients(x, y, 1, k=k, seed=0))[0]
    other = fedcof_covariances(_clients(x, y, 1, k=k, seed=1))[0]
    assert not np.allclose(two, other)  # a different split gives a different estimate


def test_one_client_per_class_gives_no_covariance() -> None:
    x, y = gaussian_mixture(5, num_classes=2, dim=3, n=200)
    cov, k_c = fedcof_covariances([compute_stats(x, y, 2, mode="means")])
    assert np.array_equal(k_c, [1, 1]) and not np.any(cov)


@pytest.mark.parametrize("mode", ["means", "diag", "full"])
def test_estimated_statistics_carry_the_estimate_as_second_moments(mode: str) -> None:
    c = 3
    x, y = gaussian_mixture(8, num_classes=c, dim=5, n=600)
    clients = _clients(x, y, c, k=9, seed=2, mode=mode)
    cov, _ = fedcof_covariances(clients)
    full = fedcof_statistics(clients, mode="full")
    pooled = fedcof_statistics(clients)
    exact = compute_stats(x, y, c, mode="full")
    assert full.meta.mode == "full" and pooled.meta.mode == "pooled"
    np.testing.assert_array_equal(full.counts, exact.counts)
    np.testing.assert_allclose(full.sums, exact.sums, rtol=1e-12)
    n = exact.counts.astype(float)
    assert full.class_scatter is not None
    for j in range(c):
        centred = full.class_scatter[j] - np.outer(full.sums[j], full.sums[j]) / n[j]
        np.testing.assert_allclose(centred, (n[j] - 1) * cov[j], rtol=1e-9, atol=1e-9)
    np.testing.assert_allclose(pooled.total_scatter, full.total_scatter, rtol=1e-10, atol=1e-9)
    np.testing.assert_allclose(pooled.diag_sums, full.diag_sums, rtol=1e-10, atol=1e-9)
    # every head fits from them: LDA on the estimate is close to LDA on the exact moments
    lda_est = make_head("lda").fit_from_stats(pooled)
    lda = make_head("lda").fit_from_stats(exact)
    assert np.mean(lda_est.predict(x) == lda.predict(x)) > 0.9


def test_fedcof_head_is_fedcofs_published_classifier() -> None:
    c, d = 4, 6
    x, y = gaussian_mixture(12, num_classes=c, dim=d, n=800)
    x = x + 1.5
    clients = _clients(x, y, c, k=20, seed=4)
    head = make_head("fedcof", n_calibration=0).fit_from_stats(fedcof_statistics(clients))
    cov, _ = fedcof_covariances(clients)
    n_c = np.bincount(y, minlength=c).astype(float)
    sums = np.stack([x[y == j].sum(axis=0) for j in range(c)])
    m = x.mean(axis=0)
    gram = sum((n_c[j] - 1) * (cov[j] + np.eye(d)) for j in range(c)) + len(y) * np.outer(m, m)
    w = np.linalg.pinv(gram) @ sums.T
    w = w / np.linalg.norm(w, axis=0)
    np.testing.assert_allclose(head.coef_, w.T, rtol=1e-7, atol=1e-9)  # type: ignore[attr-defined]
    np.testing.assert_array_equal(head.predict(x), np.argmax(x @ w, axis=1))
    raw = make_head("fedcof", n_calibration=0, normalize=False, gamma=0.0).fit(x, y)
    assert raw.coef_.shape == (c, d)  # type: ignore[attr-defined]


def test_fedcof_refusals() -> None:
    x, y = gaussian_mixture(2, num_classes=3, dim=4, n=300)
    with pytest.raises(StatsValidationError, match="FedCOF needs the statistics of each client"):
        fedcof_statistics([])
    with pytest.raises(StatsValidationError, match="built in mode 'pooled' or 'full'; got 'diag'"):
        fedcof_statistics([compute_stats(x, y, 3, mode="means")], mode="diag")  # type: ignore[arg-type]
    other = compute_stats(x[:, :3], y, 3, mode="means")
    with pytest.raises(IncompatibleStatsError):
        fedcof_statistics([compute_stats(x, y, 3, mode="means"), other])
    with pytest.raises(UnsupportedModeError, match="head 'fedcof' needs upload mode 'gram'"):
        make_head("fedcof").fit_from_stats(compute_stats(x, y, 3, mode="means"))
