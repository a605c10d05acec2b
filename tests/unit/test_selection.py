"""Issue 10: shrinkage chosen from statistics (held-out moments, analytic rules)."""

from __future__ import annotations

import numpy as np
import pytest
from scipy.stats import multivariate_normal, norm

from ghofl.errors import ConfigError, StatsValidationError
from ghofl.moments import compute_moments
from ghofl.moments import selection as sel
from ghofl.moments.shrinkage import (
    check_shrinkage,
    oas_shrinkage,
    rblw_shrinkage,
    resolve_shrinkage,
    shrink,
)
from ghofl.stats import compute_stats
from tests.helpers import gaussian_mixture


def _split_moments(seed: int, c: int = 3, d: int = 5, n: int = 600):  # type: ignore[no-untyped-def]
    x, y = gaussian_mixture(seed, num_classes=c, dim=d, n=n)
    held = np.random.default_rng(seed).random(len(y)) < 0.3
    fit = compute_moments(compute_stats(x[~held], y[~held], c))
    part = compute_moments(compute_stats(x[held], y[held], c))
    return fit, part, x[held], y[held]


@pytest.mark.parametrize("a", [0.0, 0.03, 0.4])
def test_heldout_loglik_equals_direct_computation(a: float) -> None:
    fit, held, xh, yh = _split_moments(1)
    cov = fit.pooled_covariance()
    tau = np.trace(cov) / cov.shape[0]
    fam = sel.shrinkage_family(cov, tau)
    m = sel.residual_scatter(fit.means, held.means, held.counts, held.within_scatter)
    got = sel.heldout_loglik(fam, m, held.n_samples, [a])[0]
    shrunk = shrink(cov, a)
    direct = np.mean([multivariate_normal(fit.means[k], shrunk).logpdf(v) for v, k in zip(xh, yh, strict=True)])
    assert got == pytest.approx(direct, rel=1e-9)


def test_heldout_loglik_in_a_subspace_equals_projected_direct_computation() -> None:
    fit, held, xh, yh = _split_moments(2, d=6)
    basis = np.random.default_rng(0).normal(size=(6, 3))
    cov = fit.pooled_covariance()
    tau = np.trace(cov) / 6
    fam = sel.shrinkage_family(basis.T @ cov @ basis, tau, basis.T @ basis)
    m = sel.residual_scatter(fit.means @ basis, held.means @ basis, held.counts,
                             basis.T @ held.within_scatter @ basis)
    got = sel.heldout_loglik(fam, m, held.n_samples, [0.2])[0]
    proj = basis.T @ shrink(cov, 0.2) @ basis
    direct = np.mean([multivariate_normal(fit.means[k] @ basis, proj).logpdf(v @ basis)
                      for v, k in zip(xh, yh, strict=True)])
    assert got == pytest.approx(direct, rel=1e-9)


def test_heldout_error_matches_the_pairwise_gaussian_formula() -> None:
    fit, held, _, _ = _split_moments(3, c=2, d=4)
    cov = fit.pooled_covariance()
    a = 0.1
    fam = sel.shrinkage_family(cov, np.trace(cov) / 4)
    sigma_h = held.within_scatter / (held.n_samples - 2)
    got = sel.heldout_error(fam, fit.means, np.log(fit.priors), held.means, held.counts,
                            sigma_h, [a])[0]
    inv = np.linalg.inv(shrink(cov, a))
    w = fit.means @ inv
    b = -0.5 * np.sum(w * fit.means, axis=1) + np.log(fit.priors)
    errs = []
    for c, j in ((0, 1), (1, 0)):
        delta = w[c] - w[j]
        mean = delta @ held.means[c] + b[c] - b[j]
        errs.append(norm.cdf(-mean / np.sqrt(delta @ sigma_h @ delta)))
    expected = (held.counts[0] * errs[0] + held.counts[1] * errs[1]) / held.n_samples
    assert got == pytest.approx(expected, rel=1e-9)


def test_singular_candidates_score_minus_infinity() -> None:
    cov = np.diag([1.0, 0.0])
    fam = sel.shrinkage_family(cov, 0.5)
    scores = sel.heldout_loglik(fam, np.eye(2), 2.0, [0.0, 0.1])
    assert scores[0] == -np.inf and np.isfinite(scores[1])
    with pytest.raises(StatsValidationError, match="at least one held-out sample"):
        sel.heldout_loglik(fam, np.eye(2), 0.0, [0.1])


def test_argmax_candidate_prefers_the_smallest_tie_and_rejects_all_infinite() -> None:
    assert sel.argmax_candidate(np.array([1.0, 2.0, 2.0]), [0.0, 0.1, 0.2]) == 0.1
    with pytest.raises(StatsValidationError, match="no shrinkage candidate"):
        sel.argmax_candidate(np.array([-np.inf, -np.inf]), [0.0, 0.1])


def _cov_sample(seed: int, n: int, d: int, spread: bool) -> np.ndarray:
    rng = np.random.default_rng(seed)
    a = rng.normal(size=(d, d)) / np.sqrt(d) if spread else np.eye(d)
    x = rng.normal(size=(n, d)) @ a.T
    return np.cov(x.T)


def test_evidence_keeps_small_eigenvalues_on_well_estimated_spread_spectra() -> None:
    cov = _cov_sample(0, n=5000, d=10, spread=True)
    a = sel.evidence_shrinkage(cov, 4999)
    assert a < 0.01
    assert a < oas_shrinkage(cov * 4999 / 5000, 5000)


def test_evidence_shrinks_hard_when_samples_are_fewer_than_dimensions() -> None:
    cov = _cov_sample(1, n=15, d=40, spread=False)
    assert sel.evidence_shrinkage(cov, 14) > 0.3


def test_rblw_matches_its_closed_form_and_decreases_with_n() -> None:
    cov = _cov_sample(2, n=50, d=8, spread=True)
    n, d = 50, 8
    tr, tr2 = np.trace(cov), np.sum(cov * cov)
    expected = ((n - 2) / n * tr2 + tr**2) / ((n + 2) * (tr2 - tr**2 / d))
    assert rblw_shrinkage(cov, n) == pytest.approx(min(expected, 1.0), rel=1e-12)
    assert rblw_shrinkage(cov, 5000) < rblw_shrinkage(cov, 50)
    assert rblw_shrinkage(np.eye(3), 10) == 1.0  # spherical: full shrinkage


@pytest.mark.parametrize(("rule", "fn"), [("oas", oas_shrinkage), ("rblw", rblw_shrinkage)])
def test_resolve_shrinkage_by_rule_name(rule: str, fn) -> None:  # type: ignore[no-untyped-def]
    cov = _cov_sample(3, n=30, d=6, spread=True)
    assert resolve_shrinkage(rule, cov, 30) == fn(cov, 30)  # type: ignore[arg-type]
    assert resolve_shrinkage(0.25, cov, 30) == 0.25


def test_check_shrinkage_accepts_rules_and_names_them_in_errors() -> None:
    for rule in ("auto", "heldout", "oas", "rblw", "evidence"):
        assert check_shrinkage("s", rule) == rule
    with pytest.raises(ConfigError, match=r"s must be a number in \[0, 1\] or 'auto'; got 'lw' "
                       r"\(the named rules 'heldout', 'oas', 'rblw', 'evidence' are accepted"):
        check_shrinkage("s", "lw")


def test_rescale_for_total_keeps_the_prior_strength() -> None:
    a = sel.rescale_for_total(0.2, 800, 1000)
    assert a / (1 - a) * 1000 == pytest.approx(0.2 / 0.8 * 800)
    assert sel.rescale_for_total(0.0, 800, 1000) == 0.0


def test_support_basis_finds_the_subspace_the_data_lives_in() -> None:
    rng = np.random.default_rng(4)
    x = rng.normal(size=(300, 3)) @ rng.normal(size=(3, 7))
    y = rng.integers(0, 2, 300)
    basis = sel.support_basis(compute_moments(compute_stats(x, y, 2)))
    assert basis is not None and basis.shape == (7, 3)
    full = rng.normal(size=(300, 7))
    assert sel.support_basis(compute_moments(compute_stats(full, y, 2))) is None


def test_choose_pooled_picks_small_on_well_conditioned_and_large_when_n_below_d() -> None:
    x, y = gaussian_mixture(5, num_classes=3, dim=6, n=3000)
    easy = compute_moments(compute_stats(x, y, 3, holdout_fraction=0.2))
    assert sel.choose_pooled_shrinkage(easy, "auto").value < 0.02
    rng = np.random.default_rng(6)
    x2 = rng.normal(size=(60, 80))
    y2 = rng.integers(0, 3, 60)
    hard = compute_moments(compute_stats(x2, y2, 3, holdout_fraction=0.3))
    choice = sel.choose_pooled_shrinkage(hard, "auto")
    assert choice.method == f"heldout-{sel.POOLED_CRITERION}"
    assert choice.value > 0.2


def test_choose_without_holdout_uses_the_analytic_default_and_heldout_rule_needs_one() -> None:
    x, y = gaussian_mixture(7, num_classes=3, dim=5, n=400)
    m = compute_moments(compute_stats(x, y, 3))
    assert sel.choose_pooled_shrinkage(m, "auto").method == "analytic-error"
    assert sel.choose_pooled_shrinkage(m, "evidence").method == "evidence"
    assert sel.choose_pooled_shrinkage(m, 0.3) == sel.ShrinkageChoice(0.3, "fixed")
    assert sel.choose_pooled_shrinkage(m, "oas").method == "oas"
    with pytest.raises(StatsValidationError, match="needs statistics with a held-out part"):
        sel.choose_pooled_shrinkage(m, "heldout")
    with pytest.raises(StatsValidationError, match="needs statistics with a held-out part"):
        sel.choose_qda_shrinkage(m, "heldout")


def test_choose_class_and_qda_shrinkage_with_holdout(monkeypatch: pytest.MonkeyPatch) -> None:
    x, y = gaussian_mixture(8, num_classes=3, dim=5, n=1500)
    m = compute_moments(compute_stats(x, y, 3, holdout_fraction=0.25))
    values, method = sel.choose_qda_shrinkage(m, "auto")
    assert method == "heldout-error" and len(set(values)) == 1 and 0 < values[0] < 1
    monkeypatch.setattr(sel, "QDA_CRITERION", "loglik")
    values, method = sel.choose_qda_shrinkage(m, "auto")
    assert method == "heldout-loglik" and len(set(values)) == 1 and 0 < values[0] < 0.2
    monkeypatch.undo()
    one = sel.choose_class_shrinkage(m, 1, "auto")
    assert one.method == "heldout-loglik" and 0.0 <= one.value <= 1.0


def test_criterion_is_checked() -> None:
    x, y = gaussian_mixture(9, num_classes=2, dim=3, n=300)
    m = compute_moments(compute_stats(x, y, 2, holdout_fraction=0.2))
    assert sel.choose_pooled_shrinkage(m, "auto", criterion="error").method == "heldout-error"
    with pytest.raises(ConfigError, match="criterion must be 'loglik' or 'error'; got 'mse'"):
        sel.choose_pooled_shrinkage(m, "auto", criterion="mse")
