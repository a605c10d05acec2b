"""QDA's parallel fit and scoring, and the cheap support test (issue 23: speed, same results)."""

from __future__ import annotations

import numpy as np
import pytest
from scipy.linalg import cho_factor, cho_solve, eigvalsh, solve_triangular

from ghofl.bench.spectrum import class_statistics, draw, spectrum_classes
from ghofl.heads import _linalg
from ghofl.heads.lda import LDAHead
from ghofl.heads.qda import QDAHead, qda_evidence_shrinkage
from ghofl.heads.ridge import RidgeHead
from ghofl.moments import selection
from ghofl.moments.core import compute_moments
from ghofl.moments.criteria import EVIDENCE_GRID, ShrinkageFamily, evidence_loglik, search_grid
from ghofl.moments.selection import full_support, pooled_center, support_basis
from ghofl.moments.shrinkage import Shrinkage, shrink
from ghofl.stats import ClientStats, compute_stats

Problem = tuple[ClientStats, np.ndarray]


@pytest.fixture(scope="module")
def problem() -> tuple[ClientStats, np.ndarray]:
    gen = spectrum_classes(1, 48, 5)
    stats = class_statistics(gen, 30, "full", 2)
    rng = np.random.default_rng(3)
    X = draw(gen, rng.integers(0, 5, 300), rng)
    return stats, X


def _reference_decision(stats: ClientStats, X: np.ndarray, a: float, pooled_a: float) -> np.ndarray:
    """QDA toward the pooled target, written out: Σ̃_c, Cholesky solve, log-det, log prior."""
    m = compute_moments(stats)
    d = m.dim
    center = shrink(m.pooled_covariance("n-c"), pooled_a)
    out = np.empty((X.shape[0], m.num_classes))
    for c in range(m.num_classes):
        cov = m.class_covariance(c, "n-1")
        t = np.trace(np.linalg.solve(center, cov)) / d
        sig = (1 - a) * 0.5 * (cov + cov.T) + a * t * center
        fac = cho_factor(sig, lower=True)
        z = X - m.means[c]
        maha = np.sum(z * cho_solve(fac, z.T).T, axis=1)
        logdet = 2.0 * np.sum(np.log(np.diag(fac[0])))
        out[:, c] = -0.5 * (maha + logdet + d * np.log(2 * np.pi)) + np.log(m.priors[c])
    return out


@pytest.mark.parametrize("shrinkage", [0.1, "auto"])
def test_qda_matches_the_written_out_reference(problem: Problem, shrinkage: Shrinkage) -> None:
    stats, X = problem
    head = QDAHead(shrinkage=shrinkage, pooled_shrinkage=0.05).fit_from_stats(stats)
    ref = _reference_decision(stats, X, head.shrinkage_[0], 0.05)
    np.testing.assert_allclose(head.class_scores(X), ref, rtol=1e-9, atol=1e-9)
    np.testing.assert_array_equal(head.predict(X), np.argmax(ref, axis=1))


def test_qda_results_do_not_depend_on_the_thread_count(problem: Problem, monkeypatch: pytest.MonkeyPatch) -> None:
    stats, X = problem
    runs = []
    for n in ("1", "3"):
        monkeypatch.setenv("GHOFL_NUM_THREADS", n)
        head = QDAHead().fit_from_stats(stats)
        runs.append((head.precision_chol_, head.shrinkage_, head.class_scores(X)))
    np.testing.assert_array_equal(runs[0][0], runs[1][0])
    assert runs[0][1] == runs[1][1]
    np.testing.assert_array_equal(runs[0][2], runs[1][2])


def test_evidence_choice_matches_explicit_generalised_eigenvalues(problem: Problem) -> None:
    """The dsygst reduction chooses what explicit L⁻¹ Σ_c L⁻ᵀ eigenvalues choose."""
    stats, _ = problem
    m = compute_moments(stats)
    center = pooled_center(m)
    coefs, method = qda_evidence_shrinkage(m, "pooled", center)
    L = np.linalg.cholesky(center)
    fams: list[tuple[ShrinkageFamily, float]] = []
    for c in range(m.num_classes):
        cov = m.class_covariance(c, "n-1")
        wc = solve_triangular(L, solve_triangular(L, cov, lower=True).T, lower=True)
        w = eigvalsh(0.5 * (wc + wc.T))
        fams.append((ShrinkageFamily(np.maximum(w, 0.0), np.empty((0, 0)),
                                     np.trace(wc) / m.dim, 0.0), m.class_dof(c)))

    def pick(cands: list[float]) -> float:
        score = sum(evidence_loglik(f, n, cands) for f, n in fams)
        return float(cands[int(np.argmax(score))])

    assert method == "evidence"
    assert coefs == [search_grid(pick, EVIDENCE_GRID)] * m.num_classes


def test_full_support_is_certified_only_with_margin() -> None:
    rng = np.random.default_rng(0)
    x = rng.standard_normal((200, 20))
    assert full_support(x.T @ x)
    low = x[:, :5] @ rng.standard_normal((5, 20))  # rank 5
    assert not full_support(low.T @ low)
    assert not full_support(np.zeros((4, 4)))
    assert not full_support(np.diag([1.0, 1.0, 5e-12]))  # kept by eigh, yet not certified


def test_support_on_a_subspace_still_found() -> None:
    rng = np.random.default_rng(4)
    basis = np.linalg.qr(rng.standard_normal((12, 4)))[0]
    y = np.repeat(np.arange(3), 20)
    x = (rng.standard_normal((60, 4)) + rng.standard_normal((3, 4))[y]) @ basis.T
    u = support_basis(compute_moments(compute_stats(x, y, 3, mode="full")))
    assert u is not None and u.shape == (12, 4)
    np.testing.assert_allclose(u @ u.T, basis @ basis.T, atol=1e-8)


def test_cheap_support_test_chooses_what_eigh_chose(problem: Problem, monkeypatch: pytest.MonkeyPatch) -> None:
    """Every default rule: the same coefficients with and without the Cholesky certificate."""
    stats, _ = problem

    def chosen() -> tuple[float, list[float], list[float], float]:
        return (LDAHead().fit_from_stats(stats).shrinkage_,
                QDAHead().fit_from_stats(stats).shrinkage_,
                QDAHead(shrinkage_target="scaled_identity").fit_from_stats(stats).shrinkage_,
                RidgeHead(n_calibration=0).fit_from_stats(stats).alpha_)

    now = chosen()
    monkeypatch.setattr(selection, "full_support", lambda scatter: False)
    assert chosen() == now


def test_class_map_keeps_order_and_raises_the_first_error(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("GHOFL_NUM_THREADS", "4")
    assert _linalg.class_map(lambda c: c * c, 9) == [c * c for c in range(9)]

    def fail(c: int) -> int:
        if c in (3, 6):
            raise ValueError(f"class {c}")
        return c

    with pytest.raises(ValueError, match="class 3"):
        _linalg.class_map(fail, 8)
    monkeypatch.setenv("GHOFL_NUM_THREADS", "1")
    assert _linalg.worker_count(8) == 1
    assert _linalg.class_map(lambda c: -c, 3) == [0, -1, -2]
    monkeypatch.setenv("GHOFL_NUM_THREADS", "x")
    assert 1 <= _linalg.worker_count(2) <= 2
