"""The held-out error estimate that chooses QDA's shrinkage when clients upload a held-out part."""

from __future__ import annotations

import numpy as np
import pytest
from scipy.stats import norm

from ghofl.heads.qda import QDAHead
from ghofl.moments import compute_moments
from ghofl.moments import selection as sel
from ghofl.stats import compute_stats
from tests.helpers import gaussian_mixture


def _problem(seed: int, c: int = 3, k: int = 4) -> tuple[dict[int, sel.ShrinkageFamily],
                                                            np.ndarray, np.ndarray, np.ndarray,
                                                            np.ndarray, dict[int, np.ndarray]]:
    rng = np.random.default_rng(seed)
    fams, covs = {}, {}
    q = np.eye(k) + 0.3 * np.diag(rng.random(k))  # a common metric Q (the pooled centre)
    for j in range(c):
        a = rng.standard_normal((k, k))
        cov = a @ a.T / k + 0.2 * np.eye(k)
        fams[j] = sel.shrinkage_family(cov, 0.5 + rng.random(), q)
        b = rng.standard_normal((k, k))
        covs[j] = b @ b.T / k + 0.1 * np.eye(k)
    means = rng.standard_normal((c, k))
    held_means = means + 0.3 * rng.standard_normal((c, k))
    counts = np.array([30, 10, 60][:c], dtype=np.int64)
    return fams, means, np.log(counts / counts.sum()), held_means, counts, covs


def _direct(fams: dict[int, sel.ShrinkageFamily], means: np.ndarray, lp: np.ndarray,
            hm: np.ndarray, counts: np.ndarray, covs: dict[int, np.ndarray], a: float) -> float:
    """The same estimate with explicit inverses (no shared eigenbasis)."""
    prec, logdet = {}, {}
    for j, f in fams.items():
        u_inv = np.linalg.inv(f.basis)
        c_a = u_inv.T @ np.diag(f.diag(a)) @ u_inv  # C(a) = U⁻ᵀ diag(D) U⁻¹
        prec[j] = np.linalg.inv(c_a)
        logdet[j] = np.linalg.slogdet(c_a)[1]
    err = 0.0
    for h in fams:
        s, m = covs[h], hm[h]

        def mean(j: int, s: np.ndarray = s, m: np.ndarray = m) -> float:
            r = m - means[j]
            return float(-0.5 * (np.trace(prec[j] @ s) + r @ prec[j] @ r) - 0.5 * logdet[j]
                         + lp[j])

        keep = 1.0
        for j in fams:
            if j == h:
                continue
            big_m = prec[h] - prec[j]
            g = prec[j] @ (m - means[j]) - prec[h] @ (m - means[h])
            var = 0.5 * np.trace(big_m @ s @ big_m @ s) + g @ s @ g
            keep *= 1.0 - norm.cdf(-(mean(h) - mean(j)) / np.sqrt(var))
        err += counts[h] / counts.sum() * (1.0 - keep)
    return err


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_equals_the_direct_computation(seed: int) -> None:
    fams, means, lp, hm, counts, covs = _problem(seed)
    cands = [0.01, 0.2, 0.7, 0.99]
    got = sel.heldout_qda_error(fams, means, lp, hm, counts, covs, cands)
    want = [_direct(fams, means, lp, hm, counts, covs, a) for a in cands]
    np.testing.assert_allclose(got, want, rtol=1e-9, atol=1e-12)


def test_matches_the_error_of_qda_on_gaussian_held_out_samples() -> None:
    """With Gaussian held-out classes the estimate is close to the empirical error rate."""
    fams, means, lp, hm, counts, covs = _problem(5, c=2, k=3)
    rng = np.random.default_rng(6)
    a = 0.3
    prec, logdet = {}, {}
    for j, f in fams.items():
        u_inv = np.linalg.inv(f.basis)
        c_a = u_inv.T @ np.diag(f.diag(a)) @ u_inv
        prec[j], logdet[j] = np.linalg.inv(c_a), np.linalg.slogdet(c_a)[1]
    wrong = 0.0
    for h in fams:
        x = rng.multivariate_normal(hm[h], covs[h], size=200_000)
        scores = np.stack([-0.5 * np.sum((x - means[j]) @ prec[j] * (x - means[j]), axis=1)
                           - 0.5 * logdet[j] + lp[j] for j in fams], axis=1)
        wrong_h = float(np.mean(np.argmax(scores, axis=1) != h))
        wrong += counts[h] / counts[:2].sum() * wrong_h
    est = sel.heldout_qda_error(fams, means, lp, hm, counts[:2], covs, [a])[0]
    # the score difference of a quadratic rule is not exactly Gaussian: a few points
    assert est == pytest.approx(wrong, abs=0.03)
    assert 0.02 < wrong < 0.98


def test_nothing_to_score_and_singular_candidates() -> None:
    fams, means, lp, hm, counts, covs = _problem(3)
    assert np.all(sel.heldout_qda_error({0: fams[0]}, means, lp, hm, counts, covs, [0.5]) == 0)
    none = np.zeros_like(counts)
    assert np.all(sel.heldout_qda_error(fams, means, lp, hm, none, covs, [0.5]) == 0)
    # a = 0 on a rank-deficient class covariance is singular: error 1, never chosen
    flat = sel.ShrinkageFamily(np.array([0.0, 1.0, 1.0, 1.0]), fams[0].basis, 1.0, 0.0)
    out = sel.heldout_qda_error({**fams, 0: flat}, means, lp, hm, counts, covs, [0.0, 0.5])
    assert out[0] == 1.0 and out[1] < 1.0


def test_auto_with_holdout_uses_the_error_criterion_and_loglik_above_the_class_limit(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    x, y = gaussian_mixture(8, num_classes=3, dim=5, n=900)
    stats = compute_stats(x, y, 3, holdout_fraction=0.25)
    values, method = sel.choose_qda_shrinkage(compute_moments(stats), "auto", target="pooled")
    assert method == "heldout-error" and len(set(values)) == 1 and 0.0 < values[0] < 1.0
    assert QDAHead().fit_from_stats(stats).shrinkage_method_ == "heldout-error"
    monkeypatch.setattr(sel, "QDA_ERROR_MAX_CLASSES", 2)
    assert QDAHead().fit_from_stats(stats).shrinkage_method_ == "heldout-loglik"
    monkeypatch.setattr(sel, "QDA_ERROR_MAX_CLASSES", 32)
    monkeypatch.setattr(sel, "QDA_CRITERION", "loglik")
    assert QDAHead().fit_from_stats(stats).shrinkage_method_ == "heldout-loglik"
