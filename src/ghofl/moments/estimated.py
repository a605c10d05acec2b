"""Statistics whose second moments are estimates, with the degrees of freedom they really have.

Exact sums over N samples make the within-class scatter W = B − Σ_c A_c A_cᵀ/N_c a scatter with
N − C degrees of freedom and each class scatter S_c − A_c A_cᵀ/N_c one with N_c − 1: that is
what the data-driven shrinkage criteria (:mod:`ghofl.moments.selection`) read from the counts.
An estimate of the second moments built from fewer independent pieces, such as FedCOF's from
the spread of K_c client means (:mod:`ghofl.moments.fedcof`, K_c − 1 degrees of freedom per
class), is as noisy as a scatter of far fewer samples; read with N − C degrees of freedom the
criteria would see a covariance of N samples and shrink far too little.

:class:`EstimatedStats` is a :class:`~ghofl.stats.ClientStats` that carries those degrees of
freedom; :func:`~ghofl.moments.core.compute_moments` passes them on to the
:class:`~ghofl.moments.core.Moments`, whose :meth:`~ghofl.moments.core.Moments.pooled_dof` and
:meth:`~ghofl.moments.core.Moments.class_dof` every criterion reads. The value lives in memory
only: it is the server's estimate, not an upload. Adding or subtracting it is refused (an
estimate is not additive); converting it to a lower mode keeps the degrees of freedom; saving it
with :func:`~ghofl.stats.save_stats` writes plain statistics (the degrees of freedom are not in
the file format), so re-estimate from the clients' uploads instead of saving the estimate.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from numpy.typing import NDArray

from ghofl.errors import StatsValidationError
from ghofl.stats.client_stats import ClientStats
from ghofl.stats.meta import Mode

F64 = NDArray[np.float64]

__all__ = ["EstimatedStats", "pooled_effective_dof"]


def pooled_effective_dof(class_dof: F64, weights: F64) -> float:
    """Effective degrees of freedom of Σ_c w_c Σ̂_c for independent class estimates Σ̂_c.

    Satterthwaite's approximation: Σ̂_c of ν_c degrees of freedom has Var ∝ 1/ν_c, so the
    weighted sum is as noisy as one estimate with ν = (Σ_c w_c)² / Σ_c w_c²/ν_c degrees of
    freedom (Kish's effective sample size). Classes with ν_c = 0 (no estimate) or w_c = 0 are
    left out; equal ν_c = n − 1 and equal weights give Σ_c (n − 1), the exact N − C.

    Parameters
    ----------
    class_dof : ndarray, shape (C,)
        ν_c ≥ 0.
    weights : ndarray, shape (C,)
        w_c ≥ 0 (the pooled covariance weighs class c by N_c − 1).

    Returns
    -------
    float
        ν ≥ 0 (0 when no class has an estimate).
    """
    keep = (class_dof > 0) & (weights > 0)
    if not np.any(keep):
        return 0.0
    w = weights[keep].astype(np.float64)
    return float(np.sum(w) ** 2 / np.sum(w**2 / class_dof[keep]))


@dataclass(frozen=True, eq=False)
class EstimatedStats(ClientStats):
    """Statistics whose second moments are estimates with fewer degrees of freedom.

    Parameters
    ----------
    meta, counts, sums, sq_sums, class_scatter, scatter, n_clipped
        As :class:`~ghofl.stats.ClientStats` (no held-out section).
    scatter_dof : float ≥ 0, default 0.0
        Effective degrees of freedom of the within-class scatter (exact sums: N − C).
    class_dof : ndarray, shape (C,), optional
        Degrees of freedom of each class scatter (exact sums: N_c − 1); ``None`` = N_c − 1.
    """

    scatter_dof: float = 0.0
    class_dof: F64 | None = None

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.holdout is not None:
            raise StatsValidationError("estimated statistics carry no held-out section")
        dof = float(self.scatter_dof)
        if not np.isfinite(dof) or dof < 0:
            raise StatsValidationError(
                f"scatter_dof must be a finite number >= 0; got {self.scatter_dof!r}"
            )
        object.__setattr__(self, "scatter_dof", dof)
        if self.class_dof is not None:
            cd = np.array(self.class_dof, dtype=np.float64)
            if cd.shape != (self.num_classes,) or not np.all(np.isfinite(cd)) or np.any(cd < 0):
                raise StatsValidationError(
                    f"class_dof must hold {self.num_classes} finite numbers >= 0 (one per "
                    f"class); got shape {cd.shape}"
                )
            cd.setflags(write=False)
            object.__setattr__(self, "class_dof", cd)

    def _combine(self, other: ClientStats, sign: int) -> ClientStats:
        raise StatsValidationError(
            "estimated statistics (e.g. FedCOF's covariances from client means) are not "
            "additive: add or subtract the clients' uploads, then estimate again"
        )

    def to_mode(self, mode: Mode) -> ClientStats:
        """Convert to a lower mode, keeping the degrees of freedom (see ClientStats.to_mode)."""
        if mode == self.mode:
            return self
        out = ClientStats.to_mode(self, mode)
        return EstimatedStats(
            out.meta, counts=out.counts, sums=out.sums, sq_sums=out.sq_sums,
            class_scatter=out.class_scatter, scatter=out.scatter, n_clipped=out.n_clipped,
            scatter_dof=self.scatter_dof,
            class_dof=self.class_dof if out.class_scatter is not None else None,
        )

    def __repr__(self) -> str:
        return (
            f"EstimatedStats(mode={self.mode!r}, dim={self.dim}, classes={self.num_classes}, "
            f"n={self.n_samples}, scatter_dof={self.scatter_dof:g})"
        )
