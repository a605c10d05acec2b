"""Fed3R: federated recursive ridge regression (Fanì, Camoriano, Caputo, Ciccone, ICML 2024).

Each client k uploads G_k = Φ_kᵀΦ_k (d, d) and B_k = Φ_kᵀY_k (d, C) with one-hot targets
Y_k ∈ {0, 1}^{n_k × C}; the server solves

    W = (Σ_k G_k + λ I)⁻¹ Σ_k B_k,      s(x) = Wᵀx,

a ridge regression without intercept and with an absolute penalty λ. In ghofl's statistics
Σ_k G_k is the uncentred global second moment B = Σ x xᵀ and column c of Σ_k B_k is the class
sum A_c, so a ``gram`` upload carries what Fed3R needs plus the C class counts
(d(d+1)/2 + C·d + C numbers per client); ``pooled`` and ``full`` uploads contain it.

How it differs from the ``ridge`` head (:mod:`ghofl.heads.ridge`): ``ridge`` centres the
features and fits an intercept (scikit-learn ``Ridge(fit_intercept=True)``), and writes its
penalty as a scale-free shrinkage of the total covariance chosen on held-out moments or by
GCV; Fed3R regresses on the raw (uncentred) features with no intercept and a fixed absolute λ
(scikit-learn ``Ridge(alpha=λ, fit_intercept=False)``). The two are different estimators,
not one at different settings, so the maths here is its own (a single Cholesky solve); the
temperature calibration is the ridge head's (:func:`ghofl.heads.ridge.synthetic_temperature`).

Normalised weights (``normalize=True``, the default): Fed3R's classifier is used, as in the
evaluation code published with FedNCM/Fed3R/FedCOF comparisons, with each class's weight
vector w_c divided by its norm, s_c(x) = xᵀw_c / ‖w_c‖. This changes predictions (the norms
differ between classes); ``normalize=False`` is the plain ridge solution (scikit-learn's
``Ridge(alpha=λ, fit_intercept=False)``).
"""

from __future__ import annotations

from typing import Any, ClassVar

import numpy as np
from scipy.linalg import LinAlgError, cho_factor, cho_solve, solve

from ghofl.errors import StatsValidationError
from ghofl.heads._linalg import F64
from ghofl.heads._params import Constraint, Integer, Options, Real
from ghofl.heads.base import Head, scalar_positive
from ghofl.heads.ridge import synthetic_temperature
from ghofl.moments.core import Moments
from ghofl.stats.meta import StatsMeta

Shape = tuple[int, ...]


def fed3r_solution(second_moment: F64, class_sums: F64, lam: float) -> F64:
    """Fed3R's ridge coefficients W = (G + λ I)⁻¹ Aᵀ.

    Parameters
    ----------
    second_moment : ndarray, shape (d, d)
        G = Σ x xᵀ over all samples (uncentred).
    class_sums : ndarray, shape (C, d)
        A_c = Σ_{y=c} x, i.e. Φᵀ Y transposed.
    lam : float ≥ 0
        The penalty λ.

    Returns
    -------
    ndarray, shape (d, C): scores s(x) = x W.

    Raises
    ------
    StatsValidationError
        λ = 0 and G is singular.
    """
    d = second_moment.shape[0]
    mat = 0.5 * (second_moment + second_moment.T)
    mat[np.diag_indices(d)] += lam
    rhs = class_sums.T
    try:
        factor = cho_factor(mat, lower=True, check_finite=False)
        coef: F64 = cho_solve(factor, rhs, check_finite=False)
        if np.all(np.isfinite(coef)):
            return coef
    except LinAlgError:
        pass
    try:
        coef = solve(mat, rhs, assume_a="sym", check_finite=False)
    except LinAlgError:
        coef = np.full_like(rhs, np.nan)
    if not np.all(np.isfinite(coef)):
        raise StatsValidationError(
            f"the second moment Σ x xᵀ is singular, so Fed3R with lambda={lam} has no unique "
            "solution; use lambda > 0 (Fed3R's default is 0.01)"
        )
    return coef


def normalize_columns(coef: F64) -> F64:
    """Columns of ``coef`` (d, C) divided by their norms (a zero column stays zero)."""
    norms = np.linalg.norm(coef, axis=0)
    out: F64 = coef / np.where(norms > 0, norms, 1.0)
    return out


class UnscaledLinearHead(Head):
    """Shared part of the peers' linear classifiers s(x) = xᵀW / T without intercept.

    Those of Fed3R and FedCOF: optional column normalisation, temperature calibration, storage and
    scoring. Subclasses compute W (d, C) in :meth:`_solution`.
    """

    fitted_arrays = ("coef_",)
    fitted_scalars = ("temperature_",)

    def _solution(self, moments: Moments) -> F64:  # pragma: no cover - abstract
        raise NotImplementedError

    def _fitted_shapes(self, meta: StatsMeta, scalars: dict[str, Any]) -> dict[str, Shape]:
        scalar_positive(type(self).__name__, scalars, "temperature_")
        return {"coef_": (meta.num_classes, meta.dim)}

    def _fit(self, moments: Moments) -> None:
        p = self.params_
        coef = self._solution(moments)
        if p["normalize"]:
            coef = normalize_columns(coef)
        t = 1.0
        if p["n_calibration"] > 0:
            zero = np.zeros(moments.num_classes)
            t = synthetic_temperature(moments, coef, zero, p["n_calibration"], p["seed"])
        self.coef_ = np.ascontiguousarray(coef.T)
        self.temperature_ = t

    def _decision(self, Z: F64) -> F64:
        out: F64 = (Z @ self.coef_.T) / self.temperature_
        return out


class Fed3RHead(UnscaledLinearHead):
    """Fed3R's closed-form ridge classifier (no intercept, absolute λ), from pooled moments.

    Parameters
    ----------
    lam : float ≥ 0, default 0.01
        The ridge penalty λ of W = (ΦᵀΦ + λ I)⁻¹ ΦᵀY (Fed3R's setting).
    n_calibration : int, default 256
        Synthetic samples per class used to fit the temperature (at most
        65,536 in all: fewer per class above C = 256) of the probabilities (as the
        ridge head); 0 = no calibration (T = 1). Predictions do not depend on it.
    seed : int, default 0
        Seed of the calibration samples.
    normalize : bool, default True
        Divide each class's weight vector by its norm (module docstring).
    """

    name = "fed3r"
    min_mode = "gram"
    min_samples = 2
    parameter_constraints: ClassVar[dict[str, Constraint]] = {
        "lam": Real(lo=0.0),
        "n_calibration": Integer(lo=0),
        "seed": Integer(lo=0),
        "normalize": Options((True, False)),
    }

    def __init__(self, lam: float = 0.01, n_calibration: int = 256, seed: int = 0,
                 normalize: bool = True) -> None:
        self.lam = lam
        self.n_calibration = n_calibration
        self.seed = seed
        self.normalize = normalize

    def _solution(self, moments: Moments) -> F64:
        g = moments._require_scatter(moments.stats.total_scatter, "the fed3r head")
        return fed3r_solution(g, moments.stats.sums, float(self.params_["lam"]))


__all__ = ["Fed3RHead", "UnscaledLinearHead", "fed3r_solution", "normalize_columns"]
