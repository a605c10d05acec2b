"""Covariance shrinkage: fixed coefficients and an analytic choice from moments alone."""

from __future__ import annotations

from typing import Literal

import numpy as np
from numpy.typing import NDArray

from ghofl.errors import ConfigError

Shrinkage = float | Literal["auto"]
Target = Literal["scaled_identity", "identity"]


def check_shrinkage(name: str, value: object) -> Shrinkage:
    """Validate a shrinkage parameter: a float in [0, 1] or ``"auto"``."""
    if isinstance(value, str):
        if value == "auto":
            return "auto"
        try:
            value = float(value)
        except ValueError:
            raise ConfigError(
                f"{name} must be a number in [0, 1] or 'auto'; got {value!r}"
            ) from None
    if isinstance(value, bool) or not isinstance(value, int | float | np.floating):
        raise ConfigError(f"{name} must be a number in [0, 1] or 'auto'; got {value!r}")
    v = float(value)
    if not 0.0 <= v <= 1.0:
        raise ConfigError(f"{name} must be a number in [0, 1] or 'auto'; got {v}")
    return v


def shrink(
    cov: NDArray[np.float64], a: float, target: Target = "scaled_identity"
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

    Returns
    -------
    ndarray, shape (d, d), symmetric.
    """
    d = cov.shape[-1]
    sym = 0.5 * (cov + cov.T)
    tau = max(float(np.trace(sym)), 0.0) / d if target == "scaled_identity" else 1.0
    out: NDArray[np.float64] = (1.0 - a) * sym
    out[np.diag_indices(d)] += a * tau
    return out


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


def resolve_shrinkage(a: Shrinkage, cov: NDArray[np.float64], n: float) -> float:
    """A float coefficient: ``a`` itself, or the OAS value for ``"auto"``."""
    return oas_shrinkage(cov, n) if a == "auto" else float(a)
