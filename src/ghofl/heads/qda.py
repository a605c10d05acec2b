"""QDA: one shrunk full covariance per class (method.md §2); needs upload mode ``full``."""

from __future__ import annotations

from typing import Any, Literal

import numpy as np
from scipy.linalg import solve_triangular

from ghofl.errors import ConfigError
from ghofl.heads._linalg import F64, safe_log, stable_cholesky
from ghofl.heads.base import Head
from ghofl.moments.core import Moments
from ghofl.moments.selection import choose_qda_shrinkage
from ghofl.moments.shrinkage import Shrinkage, Target, check_shrinkage, shrink
from ghofl.stats.meta import StatsMeta

Shape = tuple[int, ...]


def qda_params(
    moments: Moments,
    shrinkage: Shrinkage,
    target: Target = "scaled_identity",
    divisor: str = "n-1",
) -> tuple[F64, F64, F64, list[float], str]:
    """Per-class whitening factors for QDA.

    For each class, Σ̃_c = shrink(Σ_c, a_c) = L_c L_cᵀ; returns ``P`` (C, d, d) with
    P_c = L_c⁻ᵀ so that (x−μ_c)ᵀ Σ̃_c⁻¹ (x−μ_c) = ‖(x−μ_c) P_c‖², half log-determinants
    Σ log diag L_c (C,), log priors (C,), the coefficients a_c and how they were chosen (a rule
    is resolved by :func:`ghofl.moments.selection.choose_qda_shrinkage`).
    Classes are processed one at a time, so peak memory is one (d, d) covariance plus P.
    """
    c_num, d = moments.num_classes, moments.dim
    prec = np.empty((c_num, d, d))
    half_logdet = np.empty(c_num)
    coefs, method = choose_qda_shrinkage(moments, shrinkage, divisor=divisor, target=target)
    eye = np.eye(d)
    for c in range(c_num):
        cov = moments.class_covariance(c, divisor)
        a = coefs[c]
        L, _ = stable_cholesky(
            shrink(cov, a, target), f"the QDA covariance of class {moments.meta.classes[c]!r}"
        )
        prec[c] = solve_triangular(L, eye, lower=True, check_finite=False).T
        half_logdet[c] = float(np.sum(np.log(np.diag(L))))
    return prec, half_logdet, safe_log(moments.priors), coefs, method


class QDAHead(Head):
    """Quadratic discriminant analysis from per-class second moments.

    Parameters
    ----------
    shrinkage : float in [0, 1] or rule, default "auto"
        Shrinkage of every class covariance. ``"auto"``: one coefficient for all classes chosen
        from the data: on the held-out part of the statistics when the clients uploaded one
        (held-out log-likelihood), else by the inverse-Wishart evidence of the class moments;
        ``"heldout"``, ``"oas"``, ``"rblw"``, ``"evidence"`` name one rule. The paper fixed
        a = 0.1 (``preset="paper"``).
    shrinkage_target : {"scaled_identity", "identity"}, default "scaled_identity"
        Shrink toward tr(Σ_c)/d·I (the paper) or toward I (scikit-learn's ``reg_param``).
    covariance_divisor : {"n-1", "n"}, default "n-1"
        Divide class scatter by N_c − 1 (unbiased, the paper) or N_c (maximum likelihood,
        scikit-learn >= 1.9 ``QuadraticDiscriminantAnalysis``).
    """

    name = "qda"
    min_mode = "full"
    fitted_arrays = ("means_", "precision_chol_", "half_log_det_", "log_priors_")
    fitted_scalars = ("shrinkage_", "shrinkage_method_")
    neg_inf_arrays = frozenset({"log_priors_"})

    def _fitted_shapes(self, meta: StatsMeta, scalars: dict[str, Any]) -> dict[str, Shape]:
        c, d = meta.num_classes, meta.dim
        return {"means_": (c, d), "precision_chol_": (c, d, d), "half_log_det_": (c,),
                "log_priors_": (c,)}

    def __init__(
        self,
        shrinkage: Shrinkage = "auto",
        shrinkage_target: Literal["scaled_identity", "identity"] = "scaled_identity",
        covariance_divisor: Literal["n-1", "n"] = "n-1",
    ) -> None:
        self.shrinkage = shrinkage
        self.shrinkage_target = shrinkage_target
        self.covariance_divisor = covariance_divisor

    def _validate_params(self) -> None:
        self.shrinkage = check_shrinkage("shrinkage", self.shrinkage)
        if self.shrinkage_target not in ("scaled_identity", "identity"):
            raise ConfigError(
                "shrinkage_target must be 'scaled_identity' or 'identity'; got "
                f"{self.shrinkage_target!r}"
            )
        if self.covariance_divisor not in ("n-1", "n"):
            raise ConfigError(
                f"covariance_divisor must be 'n-1' or 'n'; got {self.covariance_divisor!r}"
            )

    def _fit(self, moments: Moments) -> None:
        self.means_ = moments.means.copy()
        self.precision_chol_, self.half_log_det_, self.log_priors_, coefs, method = qda_params(
            moments, self.shrinkage, self.shrinkage_target, self.covariance_divisor
        )
        self.shrinkage_ = coefs
        self.shrinkage_method_ = method

    def set_state(
        self, meta: StatsMeta, arrays: dict[str, Any], scalars: dict[str, Any]
    ) -> QDAHead:
        """Restore a fitted head; files written before ``shrinkage_method_`` existed load as
        ``"unrecorded"``."""
        if isinstance(scalars, dict) and "shrinkage_method_" not in scalars:
            scalars = {**scalars, "shrinkage_method_": "unrecorded"}
        return super().set_state(meta, arrays, scalars)

    def _decision(self, Z: F64) -> F64:
        n, d = Z.shape
        out = np.empty((n, self.means_.shape[0]))
        for c in range(self.means_.shape[0]):
            y = (Z - self.means_[c]) @ self.precision_chol_[c]
            out[:, c] = -0.5 * np.einsum("ij,ij->i", y, y) - self.half_log_det_[c]
        out += self.log_priors_ - 0.5 * d * np.log(2.0 * np.pi)
        return out
