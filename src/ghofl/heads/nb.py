"""NB-diag: per-class diagonal Gaussians with log priors (method.md §2)."""

from __future__ import annotations

from typing import Any, ClassVar

import numpy as np

from ghofl.errors import InputError
from ghofl.heads._linalg import F64, safe_log
from ghofl.heads._params import Constraint, Real
from ghofl.heads.base import Head
from ghofl.moments.core import Moments
from ghofl.stats.meta import StatsMeta

Shape = tuple[int, ...]


def nb_params(
    moments: Moments, var_smoothing: float, var_floor: float = 0.0
) -> tuple[F64, F64, F64]:
    """Means (C, d), variances (C, d) and log priors (C,) of Gaussian naive Bayes.

    Variances are max(v_c + ε, f): the maximum-likelihood class variances
    v_c = D_c/N_c − μ_c², plus ε = var_smoothing · max_j Var(x_j) over all samples
    (scikit-learn's ``GaussianNB``), floored at the absolute value f = ``var_floor`` (the
    paper's clamp). Each variance is thus at least as large as under either rule alone.
    """
    n = moments.n_samples
    m = moments.global_mean
    global_var = moments.stats.diag_sums.sum(axis=0) / n - m**2
    eps = var_smoothing * float(np.max(global_var, initial=0.0))
    if eps == 0.0:
        eps = np.finfo(float).tiny
    variances = np.maximum(moments.class_vars + eps, var_floor)
    return moments.means.copy(), variances, safe_log(moments.priors)


class NBDiagHead(Head):
    """Gaussian naive Bayes from per-class sums of squares (works in every upload mode).

    Parameters
    ----------
    var_smoothing : float, default 1e-9
        Portion of the largest feature variance added to every variance (scikit-learn).
    var_floor : float, default 1e-6
        Absolute lower bound on every variance (the paper's clamp), applied after the
        smoothing, so the variances are never below those of either rule. Features that are
        constant within a class (for example ReLU outputs that stay 0) otherwise get a
        variance of ~1e-9 × the largest variance and dominate the score.
    """

    name = "nb"
    min_mode = "diag"
    fitted_arrays = ("means_", "vars_", "log_priors_")
    neg_inf_arrays = frozenset({"log_priors_"})
    parameter_constraints: ClassVar[dict[str, Constraint]] = {
        "var_smoothing": Real(lo=0.0),
        "var_floor": Real(lo=0.0),
    }

    def _fitted_shapes(self, meta: StatsMeta, scalars: dict[str, Any]) -> dict[str, Shape]:
        c, d = meta.num_classes, meta.dim
        return {"means_": (c, d), "vars_": (c, d), "log_priors_": (c,)}

    def _check_arrays(self, arrays: dict[str, F64]) -> None:
        if np.any(arrays["vars_"] <= 0):
            raise InputError(
                "saved NBDiagHead array vars_ holds variances <= 0; expected positive "
                "variances; the file is corrupt"
            )

    def __init__(self, var_smoothing: float = 1e-9, var_floor: float = 1e-6) -> None:
        self.var_smoothing = var_smoothing
        self.var_floor = var_floor

    def _fit(self, moments: Moments) -> None:
        p = self.params_
        self.means_, self.vars_, self.log_priors_ = nb_params(
            moments, p["var_smoothing"], p["var_floor"]
        )

    def _decision(self, Z: F64) -> F64:
        inv = 1.0 / self.vars_  # (C, d)
        quad = (
            (Z**2) @ inv.T - 2.0 * Z @ (self.means_ * inv).T + np.sum(self.means_**2 * inv, axis=1)
        )
        const = -0.5 * np.sum(np.log(2.0 * np.pi * self.vars_), axis=1)
        out: F64 = self.log_priors_ + const - 0.5 * quad
        return out
