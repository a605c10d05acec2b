"""FedCGS baseline (AAAI 2025) as its own code computes it (reference-notes §10).

A linear classifier with the TOTAL covariance around the global mean,
Σ_tot = (B − N m mᵀ)/(N − 1), class means and log priors, and no shrinkage:
g_c(x) = μ_cᵀ Σ_tot⁻¹ x − ½ μ_cᵀ Σ_tot⁻¹ μ_c + log(N_c/N). A tiny ridge is added only when
Σ_tot is singular, and reported (warning and the fitted ``jitter_``).
"""

from __future__ import annotations

from typing import Any

from ghofl.heads._linalg import F64, linear_discriminant, safe_log
from ghofl.heads.base import Head
from ghofl.moments.core import Moments
from ghofl.stats.meta import StatsMeta


class FedCGSHead(Head):
    """Total-covariance LDA with priors and no shrinkage (the FedCGS server)."""

    name = "fedcgs"
    min_mode = "gram"
    min_samples = 2
    fitted_arrays = ("coef_", "intercept_")
    fitted_scalars = ("jitter_",)
    neg_inf_arrays = frozenset({"intercept_"})

    def _fitted_shapes(
        self, meta: StatsMeta, scalars: dict[str, Any]
    ) -> dict[str, tuple[int, ...]]:
        return {"coef_": (meta.num_classes, meta.dim), "intercept_": (meta.num_classes,)}

    def __init__(self) -> None:
        pass

    def _fit(self, moments: Moments) -> None:
        self.coef_, self.intercept_, self.jitter_ = linear_discriminant(
            moments.means,
            moments.total_covariance(),
            safe_log(moments.priors),
            "the FedCGS total covariance",
        )

    def _decision(self, Z: F64) -> F64:
        out: F64 = Z @ self.coef_.T + self.intercept_
        return out
