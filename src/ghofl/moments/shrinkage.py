"""Covariance shrinkage: fixed coefficients and analytic choices from moments alone.

A shrinkage parameter is a float in [0, 1] or the name of a rule (:data:`SHRINKAGE_RULES`):

- ``"auto"``: the data-driven default: chosen on a held-out part of the statistics when the
  upload holds one (:mod:`ghofl.moments.selection`); else, for the pooled covariance of LDA
  and the Fisher subspace, the analytic test-error estimate
  (:func:`ghofl.moments.selection.analytic_error_shrinkage`), and for QDA's class covariances
  :data:`ANALYTIC_DEFAULT`;
- ``"heldout"``: chosen on the held-out part; an error if the statistics hold none;
- ``"oas"`` (Chen et al. 2010, what ``"auto"`` meant before), ``"rblw"`` (Rao–Blackwellised
  Ledoit–Wolf, Chen et al. 2010) and ``"evidence"`` (inverse-Wishart marginal likelihood,
  :func:`ghofl.moments.selection.evidence_shrinkage`): analytic rules that need only the
  covariance and its sample count.
"""

from __future__ import annotations

from typing import Literal

import numpy as np
from numpy.typing import NDArray

from ghofl.errors import ConfigError
from ghofl.moments.core import symmetrise
from ghofl.moments.criteria import evidence_shrinkage

ShrinkageRule = Literal["auto", "heldout", "oas", "rblw", "evidence"]
Shrinkage = float | ShrinkageRule
#: Names accepted in place of a coefficient.
SHRINKAGE_RULES: tuple[str, ...] = ("auto", "heldout", "oas", "rblw", "evidence")
#: Rule used by ``"auto"`` for a lone covariance (QDA's class covariances) when the statistics
#: hold no held-out part; the pooled covariance of LDA uses the analytic error estimate.
ANALYTIC_DEFAULT: ShrinkageRule = "evidence"
Target = Literal["scaled_identity", "identity"]


def check_shrinkage(name: str, value: object) -> Shrinkage:
    """Validate a shrinkage parameter: a float in [0, 1] or a rule of :data:`SHRINKAGE_RULES`."""
    rules = ", ".join(repr(r) for r in SHRINKAGE_RULES[1:])

    def bad(got: object) -> ConfigError:
        return ConfigError(
            f"{name} must be a number in [0, 1] or 'auto'; got {got!r} (the named rules "
            f"{rules} are accepted too)"
        )

    if isinstance(value, str):
        if value in SHRINKAGE_RULES:
            return value  # type: ignore[return-value]
        try:
            value = float(value)
        except ValueError:
            raise bad(value) from None
    if isinstance(value, bool) or not isinstance(value, int | float | np.floating):
        raise bad(value)
    v = float(value)
    if not 0.0 <= v <= 1.0:
        raise bad(v)
    return v


def shrink(
    cov: NDArray[np.float64], a: float, target: Target = "scaled_identity",
    overwrite: bool = False,
) -> NDArray[np.float64]:
    """Shrink a covariance toward a multiple of the identity.

    Σ̃ = (1 − a) Σ + a·τ·I with τ = tr(Σ)/d (``scaled_identity``, the paper's and
    scikit-learn's ``shrunk_covariance``) or τ = 1 (``identity``, scikit-learn QDA's
    ``reg_param``).

    Parameters
    ----------
    cov : ndarray, shape (d, d)
    a : float in [0, 1]
    target : {"scaled_identity", "identity"}
    overwrite : bool, default False
        ``cov`` (C-contiguous float64) is symmetrised and shrunk in place and returned (the
        same values, no (d, d) temporary); else it is left as it is.

    Returns
    -------
    ndarray, shape (d, d), symmetric.
    """
    d = cov.shape[-1]
    sym = symmetrise(cov) if overwrite else 0.5 * (cov + cov.T)
    tau = max(float(np.trace(sym)), 0.0) / d if target == "scaled_identity" else 1.0
    sym *= 1.0 - a
    sym[np.diag_indices(d)] += a * tau
    return sym


def oas_shrinkage(cov: NDArray[np.float64], n: float) -> float:
    """Oracle Approximating Shrinkage coefficient (Chen et al., 2010) from a covariance alone.

    Uses the same closed form as ``sklearn.covariance.oas``: with μ = tr(Σ)/d and
    α = mean(Σ²), ρ = min((α + μ²) / ((n + 1)(α − μ²/d)), 1). Σ is the maximum-likelihood
    covariance of ``n`` samples; only second moments are needed, so it works from client sums.
    """
    d = cov.shape[-1]
    if n <= 0:
        return 1.0
    mu = float(np.trace(cov)) / d
    alpha = float(np.mean(cov**2))
    num = alpha + mu**2
    den = (n + 1.0) * (alpha - mu**2 / d)
    if den <= 0.0:
        return 1.0
    return float(min(num / den, 1.0))


def rblw_shrinkage(cov: NDArray[np.float64], n: float) -> float:
    """Rao–Blackwellised Ledoit–Wolf coefficient (Chen et al., 2010, eq. 17) from a covariance.

    With S the maximum-likelihood covariance of ``n`` samples and p = d::

        ρ = min(((n − 2)/n · tr(S²) + tr(S)²) / ((n + 2)(tr(S²) − tr(S)²/p)), 1)
    """
    d = cov.shape[-1]
    if n <= 0:
        return 1.0
    tr = float(np.trace(cov))
    tr2 = float(np.sum(cov * cov))
    den = (n + 2.0) * (tr2 - tr**2 / d)
    if den <= 0.0:
        return 1.0
    return float(min(max(((n - 2.0) / n * tr2 + tr**2) / den, 0.0), 1.0))


def resolve_shrinkage(a: Shrinkage, cov: NDArray[np.float64], n: float) -> float:
    """A float coefficient from the covariance alone: ``a`` itself, or an analytic rule.

    ``"oas"``, ``"rblw"`` and ``"evidence"`` apply their rule; ``"auto"`` and ``"heldout"`` (which
    need the statistics' held-out part, see :mod:`ghofl.moments.selection`) fall back to
    :data:`ANALYTIC_DEFAULT` here. ``cov`` is the maximum-likelihood covariance of ``n`` samples.
    """
    if not isinstance(a, str):
        return float(a)
    rule = ANALYTIC_DEFAULT if a in ("auto", "heldout") else a
    if rule == "oas":
        return oas_shrinkage(cov, n)
    if rule == "rblw":
        return rblw_shrinkage(cov, n)
    if rule == "evidence":
        return evidence_shrinkage(cov, n)
    raise ConfigError(
        f"unknown shrinkage rule {a!r}; use a number in [0, 1] or one of "
        + ", ".join(repr(r) for r in SHRINKAGE_RULES)
    )
