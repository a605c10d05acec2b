"""QDA's fit from one triangle of each class scatter, and the evidence on the spectrum (issue 40).

The evidence of every candidate shrinkage is read off one eigenvalue computation per class;
here it is checked against log-determinants of the candidate covariances computed directly,
and the fit (the shrunk covariance written from the class sums, the scales t_c taken from the
evidence rule) against the covariances written out.
"""

from __future__ import annotations

import warnings

import numpy as np
import pytest
from scipy.special import multigammaln

from ghofl.errors import UnsupportedModeError
from ghofl.heads.qda import QDAHead, evidence_families, summed_evidence
from ghofl.moments.core import GhoflWarning, Moments, compute_moments
from ghofl.moments.selection import pooled_center
from ghofl.moments.shrinkage import shrink
from ghofl.stats import compute_stats

CANDIDATES = [1e-4, 0.003, 0.05, 0.3, 0.7, 0.95]


def _moments(seed: int, n: int = 240, d: int = 20, c: int = 3) -> Moments:
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(n, d)) @ rng.normal(size=(d, d)) + rng.normal(size=d)
    y = np.arange(n) % c
    x += 0.5 * rng.normal(size=(c, d))[y] @ np.diag(rng.uniform(0.5, 2.0, d))
    return compute_moments(compute_stats(x, y, c, mode="full"))


def _direct_evidence(m: Moments, target: str, center: np.ndarray | None,
                     cands: list[float]) -> np.ndarray:
    """Σ_c of the inverse-Wishart evidence, each candidate's log-determinant by ``slogdet``.

    Prior IW(ν, κ·t_c·B), ν = d + 1 + κ, κ = a·n_c/(1 − a), scatter n_c·Σ_c (n_c = N_c − 1):
    log Γ_d((ν+n)/2) − log Γ_d(ν/2) + (ν/2)·d·log(κt) − ((ν+n)/2)·log det(κ·t·B + n·Σ_c)/det B.
    """
    d = m.dim
    out = np.zeros(len(cands))
    for c in range(m.num_classes):
        n = float(m.counts[c]) - 1.0
        cov = m.class_covariance(c, "n-1")
        if target == "pooled":
            assert center is not None
            b = center
            t = np.trace(np.linalg.solve(b, cov)) / d
        else:
            b = np.eye(d)
            t = np.trace(cov) / d if target == "scaled_identity" else 1.0
        logdet_b = np.linalg.slogdet(b)[1]
        for i, a in enumerate(cands):
            kappa = a * n / (1.0 - a)
            nu = d + 1.0 + kappa
            sign, logdet = np.linalg.slogdet(kappa * t * b + n * cov)
            assert sign > 0
            out[i] += (multigammaln((nu + n) / 2.0, d) - multigammaln(nu / 2.0, d)
                       + 0.5 * nu * d * np.log(kappa * t)
                       - 0.5 * (nu + n) * (logdet - logdet_b))
    return out


@pytest.mark.parametrize("target", ["pooled", "scaled_identity", "identity"])
@pytest.mark.parametrize("seed", [0, 1])
def test_evidence_on_the_spectrum_equals_direct_log_determinants(target: str, seed: int) -> None:
    m = _moments(seed)
    center = pooled_center(m) if target == "pooled" else None
    fams, scales = evidence_families(m, list(range(m.num_classes)), target,  # type: ignore[arg-type]
                                     center)
    got = summed_evidence(fams, CANDIDATES)
    ref = _direct_evidence(m, target, center, CANDIDATES)
    np.testing.assert_allclose(got, ref, rtol=1e-10)
    if target == "pooled":  # the scales the fit takes from the rule: tr(B⁻¹Σ_c)/d
        assert center is not None and scales is not None
        want = [np.trace(np.linalg.solve(center, m.class_covariance(c))) / m.dim
                for c in range(m.num_classes)]
        np.testing.assert_allclose(scales, want, rtol=1e-10)
    else:
        assert scales is None


def _written_out(m: Moments, a: float, divisor: str, pooled_a: float | None,
                 target: str = "pooled") -> list[np.ndarray]:
    """Σ̃_c written out: (1 − a)Σ_c + a·tr(B⁻¹Σ_c)/d·B, or shrink(Σ_c, a, target)."""
    out = []
    for c in range(m.num_classes):
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", GhoflWarning)
            cov = m.class_covariance(c, divisor)
        if target != "pooled":
            out.append(shrink(cov, a, target))  # type: ignore[arg-type]
            continue
        assert pooled_a is not None
        b = shrink(m.pooled_covariance("n-c"), pooled_a)
        t = np.trace(np.linalg.solve(b, cov)) / m.dim
        out.append((1 - a) * cov + a * t * b)
    return out


@pytest.mark.parametrize("divisor", ["n-1", "n"])
@pytest.mark.parametrize("shrinkage", [0.2, "auto"])
def test_fit_matches_the_written_out_covariances(divisor: str, shrinkage: float | str) -> None:
    m = _moments(3)
    head = QDAHead(shrinkage=shrinkage, covariance_divisor=divisor,  # type: ignore[arg-type]
                   pooled_shrinkage=0.1).fit_from_moments(m)
    for c, cov in enumerate(_written_out(m, head.shrinkage_[0], divisor, 0.1)):
        prec = head.precision_chol_[c]
        np.testing.assert_allclose(prec @ prec.T, np.linalg.inv(cov), rtol=1e-9, atol=1e-12)
        assert not np.any(np.tril(prec, -1))
        np.testing.assert_allclose(2.0 * head.half_log_det_[c], np.linalg.slogdet(cov)[1],
                                   rtol=1e-12)


@pytest.mark.parametrize("target", ["scaled_identity", "identity"])
def test_fit_toward_a_multiple_of_the_identity_matches_shrink(target: str) -> None:
    m = _moments(4)
    head = QDAHead(shrinkage=0.1, shrinkage_target=target).fit_from_moments(  # type: ignore[arg-type]
        m)
    for c, cov in enumerate(_written_out(m, 0.1, "n-1", None, target)):
        prec = head.precision_chol_[c]
        np.testing.assert_allclose(prec @ prec.T, np.linalg.inv(cov), rtol=1e-9, atol=1e-12)


@pytest.mark.parametrize("shrinkage", [0.3, "auto"])
def test_a_one_sample_class_takes_the_pooled_covariance(shrinkage: float | str) -> None:
    rng = np.random.default_rng(5)
    x = rng.normal(size=(121, 6)) @ rng.normal(size=(6, 6))
    y = np.r_[np.arange(120) % 2, 2]  # class 2 holds one sample
    m = compute_moments(compute_stats(x, y, 3, mode="full"))
    with pytest.warns(GhoflWarning, match=r"class '2' has 1 sample\(s\)"):
        head = QDAHead(shrinkage=shrinkage, pooled_shrinkage=0.1).fit_from_moments(  # type: ignore[arg-type]
            m)
    for c, cov in enumerate(_written_out(m, head.shrinkage_[0], "n-1", 0.1)):
        prec = head.precision_chol_[c]
        np.testing.assert_allclose(prec @ prec.T, np.linalg.inv(cov), rtol=1e-9, atol=1e-12)


def test_the_evidence_rule_refuses_statistics_without_class_second_moments() -> None:
    rng = np.random.default_rng(6)
    x = rng.normal(size=(60, 4))
    m = compute_moments(compute_stats(x, np.arange(60) % 2, 2, mode="pooled"))
    with pytest.raises(UnsupportedModeError, match=r"need upload mode 'full'.*--mode full"):
        evidence_families(m, [0, 1], "pooled", pooled_center(m))
