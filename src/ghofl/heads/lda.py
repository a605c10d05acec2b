"""LDA: shared (pooled within-class) covariance with shrinkage (method.md §2)."""

from __future__ import annotations

from typing import Any, ClassVar, Literal

import numpy as np

from ghofl.heads._linalg import F64, linear_discriminant, safe_log
from ghofl.heads._params import Constraint, Options, ShrinkageParam
from ghofl.heads.base import Head
from ghofl.moments.core import Moments
from ghofl.moments.selection import ShrinkageChoice, choose_pooled_shrinkage
from ghofl.moments.shrinkage import Shrinkage, shrink
from ghofl.moments.spectral import shrunk_solve
from ghofl.stats.meta import StatsMeta

Shape = tuple[int, ...]


def lda_covariance_choice(
    moments: Moments, shrinkage: Shrinkage, divisor: str = "n-c"
) -> tuple[F64, ShrinkageChoice]:
    """Shrunk pooled covariance Σ̃_pool (d, d) and the coefficient chosen, with its method.

    A rule (``"auto"``, ``"heldout"``, ``"oas"``, ...) is resolved by
    :func:`ghofl.moments.selection.choose_pooled_shrinkage`; the shrunk covariance is always
    built from the full statistics.
    """
    choice = choose_pooled_shrinkage(moments, shrinkage, divisor=divisor)
    return shrink(moments.pooled_covariance(divisor), choice.value, overwrite=True), choice


def lda_covariance(
    moments: Moments, shrinkage: Shrinkage, divisor: str = "n-c"
) -> tuple[F64, float]:
    """Shrunk pooled covariance Σ̃_pool (d, d) and the coefficient used.

    See :func:`lda_covariance_choice`.
    """
    cov, choice = lda_covariance_choice(moments, shrinkage, divisor)
    return cov, choice.value


def _spectral_discriminant(
    moments: Moments, choice: ShrinkageChoice, divisor: str
) -> tuple[F64, F64, float] | None:
    """:func:`linear_discriminant` from the reduction the choice was computed on, if any.

    W = shrink(Σ_pool, a)⁻¹ μᵀ by tridiagonal solves (:func:`ghofl.moments.spectral.
    shrunk_solve`): the reduction is of the N − C covariance, the ``"n"`` divisor a factor
    (N − C)/N of it. None when there is no reduction or the shrunk matrix is ill-conditioned.
    Returns ``(coef (C, d), intercept (C,), jitter 0.0)``.
    """
    tri = choice.spectrum
    if tri is None:
        return None
    n, c = moments.n_samples, moments.num_classes
    scale = 1.0 if divisor == "n-c" else (n - c) / n
    tau = max(tri.trace, 0.0) / tri.dim
    w = shrunk_solve(tri, choice.value, tau, moments.means.T, scale)
    if w is None or not np.all(np.isfinite(w)):
        return None
    intercept = -0.5 * np.einsum("cd,dc->c", moments.means, w) + safe_log(moments.priors)
    return np.ascontiguousarray(w.T), intercept, 0.0


class LDAHead(Head):
    """Linear discriminant analysis fitted from pooled second moments.

    Parameters
    ----------
    shrinkage : float in [0, 1] or rule, default "auto"
        Σ̃ = (1−a)Σ_pool + a·tr(Σ_pool)/d·I. ``"auto"``: chosen from the data with no tuning
        set: on the held-out part of the statistics when the clients uploaded one (held-out
        Gaussian error estimate), else by minimising an analytic estimate of the test error
        computed from the moments (random-matrix corrected; ``shrinkage_method_`` records
        ``"analytic-error"``, or ``"analytic-error+dp-noise"`` when it weighed the public
        noise of a differentially private release);
        ``"heldout"``, ``"oas"``, ``"rblw"``, ``"evidence"`` name one rule
        (:mod:`ghofl.moments.shrinkage`). The paper fixed a = 0.05 (``preset="paper"``).
    covariance_divisor : {"n-c", "n"}, default "n-c"
        Divide the within-class scatter by N − C (unbiased, the paper) or N (maximum
        likelihood, scikit-learn's ``LinearDiscriminantAnalysis``).
    """

    name = "lda"
    min_mode = "gram"
    min_samples = 2
    fitted_arrays = ("coef_", "intercept_", "means_")
    fitted_scalars = ("shrinkage_", "shrinkage_method_", "jitter_")
    neg_inf_arrays = frozenset({"intercept_"})
    parameter_constraints: ClassVar[dict[str, Constraint]] = {
        "shrinkage": ShrinkageParam(),
        "covariance_divisor": Options(("n-c", "n")),
    }

    def _fitted_shapes(self, meta: StatsMeta, scalars: dict[str, Any]) -> dict[str, Shape]:
        c, d = meta.num_classes, meta.dim
        return {"coef_": (c, d), "intercept_": (c,), "means_": (c, d)}

    def __init__(
        self, shrinkage: Shrinkage = "auto", covariance_divisor: Literal["n-c", "n"] = "n-c"
    ) -> None:
        self.shrinkage = shrinkage
        self.covariance_divisor = covariance_divisor

    def _fit(self, moments: Moments) -> None:
        p = self.params_
        choice = choose_pooled_shrinkage(moments, p["shrinkage"], divisor=p["covariance_divisor"])
        self.means_ = moments.means.copy()
        fitted = _spectral_discriminant(moments, choice, p["covariance_divisor"])
        if fitted is None:  # a fixed coefficient, or no reusable reduction: one Cholesky
            cov = shrink(moments.pooled_covariance(p["covariance_divisor"]), choice.value,
                         overwrite=True)  # a new array: shrunk in place
            fitted = linear_discriminant(moments.means, cov, safe_log(moments.priors),
                                         "the LDA pooled covariance")
        self.coef_, self.intercept_, self.jitter_ = fitted
        self.shrinkage_ = choice.value
        self.shrinkage_method_ = choice.method

    def set_state(
        self, meta: StatsMeta, arrays: dict[str, Any], scalars: dict[str, Any]
    ) -> LDAHead:
        """Restore a fitted head.

        Files written before ``shrinkage_method_`` existed load as ``"unrecorded"``.
        """
        if isinstance(scalars, dict) and "shrinkage_method_" not in scalars:
            scalars = {**scalars, "shrinkage_method_": "unrecorded"}
        return super().set_state(meta, arrays, scalars)

    def _decision(self, Z: F64) -> F64:
        out: F64 = Z @ self.coef_.T + self.intercept_
        return out


__all__ = ["LDAHead", "lda_covariance", "lda_covariance_choice"]
