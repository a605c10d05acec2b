"""LDA: shared (pooled within-class) covariance with shrinkage (method.md §2)."""

from __future__ import annotations

from typing import Any, Literal

from ghofl.errors import ConfigError
from ghofl.heads._linalg import F64, linear_discriminant, safe_log
from ghofl.heads.base import Head
from ghofl.moments.core import Moments
from ghofl.moments.shrinkage import Shrinkage, check_shrinkage, resolve_shrinkage, shrink
from ghofl.stats.meta import StatsMeta

Shape = tuple[int, ...]


def lda_covariance(
    moments: Moments, shrinkage: Shrinkage, divisor: str = "n-c"
) -> tuple[F64, float]:
    """Shrunk pooled covariance Σ̃_pool (d, d) and the coefficient used.

    ``"auto"`` picks the OAS coefficient with n = N − C effective samples.
    """
    cov = moments.pooled_covariance(divisor)
    n_eff = moments.n_samples - moments.num_classes
    mle = (
        cov * ((moments.n_samples - moments.num_classes) / moments.n_samples)
        if divisor == "n-c"
        else cov
    )
    a = resolve_shrinkage(shrinkage, mle, n_eff)
    return shrink(cov, a), a


class LDAHead(Head):
    """Linear discriminant analysis fitted from pooled second moments.

    Parameters
    ----------
    shrinkage : float in [0, 1] or "auto", default 0.05
        Σ̃ = (1−a)Σ_pool + a·tr(Σ_pool)/d·I; ``"auto"`` = Oracle Approximating Shrinkage
        computed from the moments (no tuning data needed).
    covariance_divisor : {"n-c", "n"}, default "n-c"
        Divide the within-class scatter by N − C (unbiased, the paper) or N (maximum
        likelihood, scikit-learn's ``LinearDiscriminantAnalysis``).
    """

    name = "lda"
    min_mode = "pooled"
    fitted_arrays = ("coef_", "intercept_", "means_")
    fitted_scalars = ("shrinkage_", "jitter_")
    neg_inf_arrays = frozenset({"intercept_"})

    def _fitted_shapes(self, meta: StatsMeta, scalars: dict[str, Any]) -> dict[str, Shape]:
        c, d = meta.num_classes, meta.dim
        return {"coef_": (c, d), "intercept_": (c,), "means_": (c, d)}

    def __init__(
        self, shrinkage: Shrinkage = 0.05, covariance_divisor: Literal["n-c", "n"] = "n-c"
    ) -> None:
        self.shrinkage = shrinkage
        self.covariance_divisor = covariance_divisor

    def _validate_params(self) -> None:
        self.shrinkage = check_shrinkage("shrinkage", self.shrinkage)
        if self.covariance_divisor not in ("n-c", "n"):
            raise ConfigError(
                f"covariance_divisor must be 'n-c' or 'n'; got {self.covariance_divisor!r}"
            )

    def _fit(self, moments: Moments) -> None:
        cov, a = lda_covariance(moments, self.shrinkage, self.covariance_divisor)
        self.means_ = moments.means.copy()
        self.coef_, self.intercept_, self.jitter_ = linear_discriminant(
            moments.means, cov, safe_log(moments.priors), "the LDA pooled covariance"
        )
        self.shrinkage_ = a

    def _decision(self, Z: F64) -> F64:
        out: F64 = Z @ self.coef_.T + self.intercept_
        return out


__all__ = ["LDAHead", "lda_covariance"]
