"""NB-diag: per-class diagonal Gaussians with log priors (method.md §2)."""

from __future__ import annotations

from typing import Any

import numpy as np

from ghofl.errors import ConfigError, InputError
from ghofl.heads._linalg import F64, safe_log
from ghofl.heads.base import Head
from ghofl.moments.core import Moments
from ghofl.stats.meta import StatsMeta

Shape = tuple[int, ...]


def nb_params(moments: Moments, var_smoothing: float) -> tuple[F64, F64, F64]:
    """Means (C, d), variances (C, d) and log priors (C,) of Gaussian naive Bayes.

    Variances are the maximum-likelihood class variances v_c = D_c/N_c − μ_c² plus
    ε = var_smoothing · max_j Var(x_j) over all samples (scikit-learn's ``GaussianNB``).
    """
    n = moments.n_samples
    m = moments.global_mean
    global_var = moments.stats.diag_sums.sum(axis=0) / n - m**2
    eps = var_smoothing * float(np.max(global_var, initial=0.0))
    if eps == 0.0:
        eps = np.finfo(float).tiny
    return moments.means.copy(), moments.class_vars + eps, safe_log(moments.priors)


class NBDiagHead(Head):
    """Gaussian naive Bayes from per-class sums of squares (works in every upload mode).

    Parameters
    ----------
    var_smoothing : float, default 1e-9
        Portion of the largest feature variance added to every variance.
    """

    name = "nb"
    min_mode = "diag"
    fitted_arrays = ("means_", "vars_", "log_priors_")
    neg_inf_arrays = frozenset({"log_priors_"})

    def _fitted_shapes(self, meta: StatsMeta, scalars: dict[str, Any]) -> dict[str, Shape]:
        c, d = meta.num_classes, meta.dim
        return {"means_": (c, d), "vars_": (c, d), "log_priors_": (c,)}

    def _check_arrays(self, arrays: dict[str, F64]) -> None:
        if np.any(arrays["vars_"] <= 0):
            raise InputError(
                "saved NBDiagHead array vars_ holds variances <= 0; expected positive "
                "variances; the file is corrupt"
            )

    def __init__(self, var_smoothing: float = 1e-9) -> None:
        self.var_smoothing = var_smoothing

    def _validate_params(self) -> None:
        if not isinstance(self.var_smoothing, int | float) or not self.var_smoothing >= 0:
            raise ConfigError(f"var_smoothing must be a number >= 0; got {self.var_smoothing!r}")

    def _fit(self, moments: Moments) -> None:
        self.means_, self.vars_, self.log_priors_ = nb_params(moments, float(self.var_smoothing))

    def _decision(self, Z: F64) -> F64:
        inv = 1.0 / self.vars_  # (C, d)
        quad = (
            (Z**2) @ inv.T - 2.0 * Z @ (self.means_ * inv).T + np.sum(self.means_**2 * inv, axis=1)
        )
        const = -0.5 * np.sum(np.log(2.0 * np.pi * self.vars_), axis=1)
        out: F64 = self.log_priors_ + const - 0.5 * quad
        return out
