"""QDA at scale: block-wise triangular scoring and the eigenvalue-only evidence rule."""

from __future__ import annotations

import numpy as np
import pytest

import ghofl.heads.qda as qda
from ghofl.errors import ConfigError, StatsValidationError
from ghofl.heads.qda import QDAHead, qda_evidence_shrinkage, qda_shrinkage, whitened_sq_norms
from ghofl.moments.core import compute_moments
from ghofl.moments.selection import choose_qda_shrinkage, pooled_center
from ghofl.moments.shrinkage import shrink
from ghofl.stats import compute_stats
from tests.helpers import gaussian_mixture


def _reference_scores(head: QDAHead, moments_x: np.ndarray, moments_y: np.ndarray,
                      z: np.ndarray, a: float, target: str) -> np.ndarray:
    """log π_c + log N(z; μ_c, Σ̃_c) computed directly from the class covariances, with
    Σ̃_c = shrink(Σ_c, a) or (1 − a)Σ_c + a·tr(B⁻¹Σ_c)/d·B toward the pooled centre B."""
    m = compute_moments(compute_stats(moments_x, moments_y, head.means_.shape[0]))
    d = z.shape[1]
    out = np.empty((z.shape[0], m.num_classes))
    for c in range(m.num_classes):
        if target == "pooled":
            b = pooled_center(m)
            sc = m.class_covariance(c)
            cov = (1 - a) * sc + a * np.trace(np.linalg.solve(b, sc)) / d * b
        else:
            cov = shrink(m.class_covariance(c), a)
        diff = z - m.means[c]
        quad = np.einsum("ij,ij->i", diff, np.linalg.solve(cov, diff.T).T)
        logdet = np.linalg.slogdet(cov)[1]
        out[:, c] = (np.log(m.priors[c]) - 0.5 * (quad + logdet)
                     - 0.5 * d * np.log(2.0 * np.pi))
    return out


@pytest.mark.parametrize("target", ["pooled", "scaled_identity"])
@pytest.mark.parametrize("block", [1, 7, 1024])
def test_block_scoring_equals_the_direct_density(monkeypatch: pytest.MonkeyPatch,
                                                 block: int, target: str) -> None:
    x, y = gaussian_mixture(3, num_classes=3, dim=6, n=240)
    head = QDAHead(shrinkage=0.05, shrinkage_target=target  # type: ignore[arg-type]
                   ).fit_from_stats(compute_stats(x, y, 3))
    z, _ = gaussian_mixture(4, num_classes=3, dim=6, n=50)
    monkeypatch.setattr(qda, "SCORE_BLOCK_ROWS", block)
    got = head.class_scores(z)
    np.testing.assert_allclose(got, _reference_scores(head, x, y, z, 0.05, target), rtol=1e-9)
    assert np.all(np.triu(head.precision_chol_) == head.precision_chol_)  # upper triangular


@pytest.mark.parametrize("triangular", [True, False])
def test_whitened_norms_match_the_dense_product(triangular: bool) -> None:
    rng = np.random.default_rng(0)
    d, n = 9, 23
    p = rng.normal(size=(d, d))
    if triangular:
        p = np.triu(p)  # the fitted case: a triangular product
    z = rng.normal(size=(n, d))
    z_before = z.copy()
    mean = rng.normal(size=d)
    ref = np.sum(((z - mean) @ p) ** 2, axis=1)
    for block in (1, 4, n, 100):
        out = np.full(n, np.nan)
        res = whitened_sq_norms(z, mean, p, out, block_rows=block)
        assert res is out
        np.testing.assert_allclose(out, ref, rtol=1e-12)
    np.testing.assert_array_equal(z, z_before)  # the inputs are only read


def test_a_loaded_non_triangular_factor_is_still_scored_exactly() -> None:
    x, y = gaussian_mixture(5, num_classes=2, dim=4, n=120)
    head = QDAHead(shrinkage=0.1).fit_from_stats(compute_stats(x, y, 2))
    rot = np.linalg.qr(np.random.default_rng(1).normal(size=(4, 4)))[0]
    arrays, scalars = head.get_state()
    arrays["precision_chol_"] = np.ascontiguousarray(arrays["precision_chol_"] @ rot)  # same norms
    other = QDAHead().set_state(head.meta_, arrays, scalars)
    np.testing.assert_allclose(other.class_scores(x), head.class_scores(x),
                               rtol=1e-10)


def _moments(seed: int, n: int, d: int, c: int, rank: int | None = None) -> object:
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(n, rank or d)) @ rng.normal(size=(rank or d, d))
    return compute_moments(compute_stats(x, rng.integers(0, c, n), c))


@pytest.mark.parametrize("target", ["pooled", "scaled_identity", "identity"])
@pytest.mark.parametrize(("n", "d", "c", "rank"), [(400, 6, 3, None), (50, 20, 4, None),
                                                   (300, 8, 3, 4)])
def test_eigenvalue_evidence_equals_the_selection_rule(target: str, n: int, d: int, c: int,
                                                       rank: int | None) -> None:
    m = _moments(n + d, n, d, c, rank)  # rank < d: the support basis is used
    center = pooled_center(m) if target == "pooled" else None  # type: ignore[arg-type]
    lean = qda_evidence_shrinkage(m, target, center)  # type: ignore[arg-type]
    ref = choose_qda_shrinkage(m, "evidence", target=target)  # type: ignore[arg-type]
    assert lean[1] == ref[1] == "evidence"
    np.testing.assert_allclose(lean[0], ref[0], rtol=1e-12)
    assert qda_shrinkage(m, "auto", target=target) == lean  # type: ignore[arg-type]


def test_single_sample_classes_and_other_rules() -> None:
    rng = np.random.default_rng(2)
    m = compute_moments(compute_stats(rng.normal(size=(2, 3)), np.array([0, 1]), 2))
    assert qda_evidence_shrinkage(m) == ([1.0, 1.0], "single-sample")  # type: ignore[arg-type]
    m2 = _moments(7, 200, 5, 2)
    assert qda_shrinkage(m2, 0.3) == ([0.3, 0.3], "fixed")  # type: ignore[arg-type]
    assert (qda_shrinkage(m2, "oas", target="scaled_identity")  # type: ignore[arg-type]
            == choose_qda_shrinkage(m2, "oas"))  # type: ignore[arg-type]


@pytest.mark.parametrize("rule", ["oas", "rblw"])
def test_identity_only_rules_refuse_the_pooled_target(rule: str) -> None:
    m = _moments(9, 200, 5, 2)
    with pytest.raises(ConfigError, match=rf"{rule}.*not the pooled covariance.*scaled_identity"):
        choose_qda_shrinkage(m, rule, target="pooled")  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match=rf"{rule}.*not the pooled covariance.*scaled_identity"):
        QDAHead(shrinkage=rule).fit_from_moments(m)  # type: ignore[arg-type]


def test_auto_with_a_held_out_part_uses_the_held_out_rule() -> None:
    x, y = gaussian_mixture(8, num_classes=3, dim=5, n=900)
    head = QDAHead().fit_from_stats(compute_stats(x, y, 3, holdout_fraction=0.25))
    assert head.shrinkage_method_ == "heldout-error"
    assert QDAHead().fit_from_stats(compute_stats(x, y, 3)).shrinkage_method_ == "evidence"


def test_non_finite_class_covariances_are_refused_with_the_fix() -> None:
    x, y = gaussian_mixture(10, num_classes=2, dim=4, n=200)
    m = compute_moments(compute_stats(x * 1e-160, y, 2))
    with pytest.raises(StatsValidationError,
                       match=r"non-finite entries.*rescale the embeddings"):
        QDAHead().fit_from_moments(m)


@pytest.mark.parametrize("pooled_shrinkage", [0.0, 0.2, 1.0])
def test_pooled_target_uses_the_given_pooled_shrinkage(pooled_shrinkage: float) -> None:
    """Σ̃_c = (1 − a)Σ_c + a·tr(B⁻¹Σ_c)/d·B with B = shrink(Σ_pool, pooled_shrinkage)."""
    x, y = gaussian_mixture(11, num_classes=3, dim=5, n=300)
    m = compute_moments(compute_stats(x, y, 3))
    head = QDAHead(shrinkage=0.4, pooled_shrinkage=pooled_shrinkage).fit_from_moments(m)
    b = shrink(m.pooled_covariance("n-c"), pooled_shrinkage)
    for c in range(3):
        sc = m.class_covariance(c)
        cov = 0.6 * sc + 0.4 * np.trace(np.linalg.solve(b, sc)) / 5 * b
        prec = head.precision_chol_[c]
        np.testing.assert_allclose(prec @ prec.T, np.linalg.inv(cov), rtol=1e-8)
