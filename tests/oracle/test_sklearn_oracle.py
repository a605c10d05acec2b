"""Heads fitted from statistics vs scikit-learn (and the FedCGS formula) on the pooled data."""

from __future__ import annotations

import numpy as np
import pytest
from sklearn.discriminant_analysis import LinearDiscriminantAnalysis, QuadraticDiscriminantAnalysis
from sklearn.naive_bayes import GaussianNB

from ghofl.heads import make_head
from ghofl.stats import compute_stats, sum_stats
from tests.helpers import gaussian_mixture


def _federated_stats(x: np.ndarray, y: np.ndarray, c: int, k: int = 5):  # type: ignore[no-untyped-def]
    """Statistics as the server sees them: k clients' payloads summed."""
    parts = np.array_split(np.random.default_rng(0).permutation(len(y)), k)
    return sum_stats(compute_stats(x[p], y[p], c) for p in parts)


@pytest.mark.parametrize("shrinkage", [0.0, 0.05, 0.3, 1.0])
@pytest.mark.parametrize(("c", "d"), [(2, 4), (5, 12)])
def test_lda_matches_sklearn_lsqr(shrinkage: float, c: int, d: int) -> None:
    x, y = gaussian_mixture(c * d, num_classes=c, dim=d, n=500)
    head = make_head("lda", shrinkage=shrinkage, covariance_divisor="n")
    head.fit_from_stats(_federated_stats(x, y, c))
    ref = LinearDiscriminantAnalysis(solver="lsqr", shrinkage=shrinkage).fit(x, y)
    np.testing.assert_allclose(head.predict_proba(x), ref.predict_proba(x), atol=1e-6)


def test_lda_default_divisor_differs_from_sklearn_only_by_scale() -> None:
    x, y = gaussian_mixture(3, num_classes=3, dim=6, n=300)
    s = compute_stats(x, y, 3)
    a = make_head("lda", shrinkage=0.1).fit_from_stats(s)
    b = make_head("lda", shrinkage=0.1, covariance_divisor="n").fit_from_stats(s)
    ratio = (len(y) - 3) / len(y)
    np.testing.assert_allclose(a.coef_ / ratio, b.coef_, rtol=1e-10)  # type: ignore[attr-defined]


@pytest.mark.parametrize("reg", [0.0, 0.01, 0.1, 0.5])
@pytest.mark.parametrize(("c", "d"), [(2, 3), (4, 8)])
def test_qda_matches_sklearn_reg_param(reg: float, c: int, d: int) -> None:
    x, y = gaussian_mixture(7 + c, num_classes=c, dim=d, n=400)
    head = make_head("qda", shrinkage=reg, shrinkage_target="identity", covariance_divisor="n")
    head.fit_from_stats(_federated_stats(x, y, c))
    ref = QuadraticDiscriminantAnalysis(reg_param=reg).fit(x, y)
    np.testing.assert_allclose(head.predict_proba(x), ref.predict_proba(x), atol=1e-6)


@pytest.mark.parametrize("shrinkage", [0.0, 0.1, 0.7])
def test_qda_matches_sklearn_eigen_shrinkage(shrinkage: float) -> None:
    """The paper's convention (scaled-identity target) = sklearn's solver='eigen' shrinkage."""
    x, y = gaussian_mixture(17, num_classes=3, dim=6, n=300)
    head = make_head("qda", shrinkage=shrinkage, covariance_divisor="n",
                     shrinkage_target="scaled_identity")
    head.fit_from_stats(_federated_stats(x, y, 3))
    ref = QuadraticDiscriminantAnalysis(solver="eigen", shrinkage=shrinkage).fit(x, y)
    np.testing.assert_allclose(head.predict_proba(x), ref.predict_proba(x), atol=1e-6)


@pytest.mark.parametrize(("c", "d"), [(2, 3), (6, 10)])
def test_nb_matches_gaussian_nb(c: int, d: int) -> None:
    x, y = gaussian_mixture(11 + c, num_classes=c, dim=d, n=400)
    head = make_head("nb", var_smoothing=1e-9, var_floor=0.0)
    head.fit_from_stats(_federated_stats(x, y, c))
    ref = GaussianNB(var_smoothing=1e-9).fit(x, y)
    np.testing.assert_allclose(head.predict_proba(x), ref.predict_proba(x), atol=1e-6)
    np.testing.assert_allclose(head.predict_log_proba(x), ref.predict_log_proba(x), atol=1e-6)


def test_nb_works_from_every_mode() -> None:
    x, y = gaussian_mixture(1, num_classes=3, dim=5, n=200)
    probs = [
        make_head("nb").fit_from_stats(compute_stats(x, y, 3, mode=m)).predict_proba(x)
        for m in ("full", "pooled", "diag")
    ]
    np.testing.assert_allclose(probs[0], probs[1], atol=1e-12)
    np.testing.assert_allclose(probs[0], probs[2], atol=1e-12)


def test_fedcgs_matches_its_reference_formula() -> None:
    """FedCGS server (CGS:main_fedcgs.py): total covariance, np.linalg.inv, log priors."""
    x, y = gaussian_mixture(21, num_classes=4, dim=6, n=400)
    head = make_head("fedcgs").fit_from_stats(_federated_stats(x, y, 4))
    n = len(y)
    a_x, b_x = x.sum(0), x.T @ x
    mu = a_x / n
    s = (b_x - np.outer(mu, a_x) - np.outer(a_x, mu) + n * np.outer(mu, mu)) / (n - 1)
    s_inv = np.linalg.inv(s)
    means = np.stack([x[y == j].mean(0) for j in range(4)])
    logits = (
        x @ s_inv @ means.T
        - 0.5 * np.einsum("cd,de,ce->c", means, s_inv, means)
        + np.log(np.bincount(y) / n)
    )
    np.testing.assert_allclose(head.class_scores(x), logits, rtol=1e-8, atol=1e-8)
    assert head.jitter_ == 0.0  # type: ignore[attr-defined]


def test_lda_oas_shrinkage_uses_oas_on_pooled_covariance() -> None:
    from sklearn.covariance import oas

    x, y = gaussian_mixture(5, num_classes=3, dim=20, n=90)
    head = make_head("lda", shrinkage="oas").fit_from_stats(compute_stats(x, y, 3))
    means = np.stack([x[y == k].mean(0) for k in range(3)])
    centered = x - means[y]
    _, expected = oas(centered, assume_centered=True)
    # OAS with n = N − C effective samples on the MLE pooled covariance.
    from ghofl.moments import oas_shrinkage

    assert head.shrinkage_ == pytest.approx(  # type: ignore[attr-defined]
        oas_shrinkage(centered.T @ centered / len(y), len(y) - 3), rel=1e-10
    )
    assert 0.0 < head.shrinkage_ < 1.0  # type: ignore[attr-defined]
    assert abs(head.shrinkage_ - expected) < 0.1  # type: ignore[attr-defined]
