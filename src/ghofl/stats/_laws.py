"""The laws second moments obey, checked on validated arrays (split from ``client_stats``).

Sums of samples satisfy, per class, Cauchy–Schwarz N_c·D_c ≥ A_c² elementwise and positive
semi-definiteness of S_c − A_c A_cᵀ/N_c (mode ``full``) or of the pooled within-class scatter
(mode ``pooled``), and in ``pooled`` mode diag(B) = Σ_c D_c. ``first_res``/``second_res`` are
the magnitudes of the values a difference was computed from (0 for statistics built directly),
whose float residue the checks tolerate.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING

import numpy as np
from numpy.typing import NDArray

from ghofl.errors import StatsValidationError

if TYPE_CHECKING:
    from ghofl.stats.client_stats import ClientStats

F64 = NDArray[np.float64]
I64 = NDArray[np.int64]

__all__ = ["RESIDUE_RTOL", "check_second_moment_laws"]

#: Relative size, with respect to the magnitude of the values a difference was computed from,
#: of the float residue it may carry: far above the rounding of millions of additions and
#: removals (each ~1.1e-16 relative), far below any genuine inconsistency.
RESIDUE_RTOL = 1e-9


def check_second_moment_laws(s: ClientStats, diag: F64, first_res: float,
                             second_res: float) -> None:
    """Refuse statistics whose second moments break a law of sums of samples.

    Parameters
    ----------
    s : ClientStats
        Statistics with a second moment (not mode ``means``).
    diag : ndarray, shape (C, d)
        Their per-class sums of squares D_c.
    first_res, second_res : float
        Residue magnitudes of first and second moments (module docstring).
    """
    # Cauchy–Schwarz: N_c D_c >= A_c² elementwise (variance is non-negative), compared in a
    # scaled domain so that values near the float64 range cannot overflow to inf/NaN and pass.
    n = s.counts[:, None].astype(np.float64)
    floor = max(first_res, float(np.sqrt(second_res)))  # residue magnitudes stay <= 1 too
    scale = np.maximum(_class_scale(s.counts, s.sums, diag), floor)
    a_hat = s.sums / scale
    d_hat = diag / scale / scale
    slack = n * d_hat - a_hat**2
    r_first, r_second = first_res / scale, second_res / scale / scale
    inherited = RESIDUE_RTOL * (n * r_second + 2.0 * np.abs(a_hat) * r_first)
    with np.errstate(over="ignore"):  # 1/scale² of tiny scales: capped at 1 below
        unit = np.minimum(1.0 / scale / scale, 1.0)  # the absolute tolerance 1, in scale
    if np.any(slack < -(1e-6 * (n * d_hat + a_hat**2 + unit) + inherited)):
        raise StatsValidationError(
            "per-class sums of squares are smaller than the squared sums allow (N_c·D_c < A_c²): "
            "the payload is corrupt or its parts come from different data"
        )
    _check_psd(s, second_res)
    if s.scatter is not None and s.sq_sums is not None:
        tr_b = np.diagonal(s.scatter)
        tr_d = diag.sum(axis=0)
        atol = (1e-8 * (1.0 + float(np.abs(tr_d).max(initial=0)))
                + RESIDUE_RTOL * s.num_classes * second_res)
        if not np.allclose(tr_b, tr_d, rtol=1e-8, atol=atol):
            raise StatsValidationError(
                f"diag(B) must equal Σ_c D_c in {s.meta.mode!r} statistics; the payload is corrupt "
                "or its parts come from different data"
            )



def _class_scale(counts: I64, sums: F64, diag: F64) -> F64:
    """Per-class scale (C, 1) of the data: max(max|A_c|/N_c, sqrt(max D_c / N_c)), at least
    the smallest normal float; dividing by it (and D_c twice) keeps the moment checks in
    range whatever the magnitude of the values."""
    n = np.maximum(counts, 1).astype(np.float64)[:, None]
    first = np.max(np.abs(sums) / n, axis=1, initial=0.0)[:, None]
    second = np.sqrt(np.max(np.abs(diag) / n, axis=1, initial=0.0))[:, None]
    out: F64 = np.maximum(np.maximum(first, second), np.finfo(np.float64).tiny)
    return out


#: Relative tolerance of the positive semi-definiteness checks, per unit of dimension: a
#: matrix passes when M + tol·d·max(diag M, scale)·I has a Cholesky factor.
_PSD_RTOL = 1e-9


def _check_psd(s: ClientStats, second_res: float) -> None:
    """Second moments are sums of x xᵀ: per class, S_c − A_c A_cᵀ/N_c ⪰ 0 (mode ``full``); the
    pooled within-class scatter B − Σ_c A_c A_cᵀ/N_c ⪰ 0 (mode ``pooled``).

    Tested with one Cholesky factorisation per matrix (d³/3 flops, about a tenth of an
    eigendecomposition) of the matrix, scaled to unit magnitude, plus a relative ridge
    ``_PSD_RTOL·d`` (plus the inherited residue of a difference): it succeeds for every
    matrix whose smallest eigenvalue is above −ridge, i.e. rounding, and fails for a genuine
    negative direction.
    """
    from scipy.linalg import LinAlgError, cholesky

    d = s.dim
    counts = s.counts.astype(np.float64)

    def mats() -> Iterator[tuple[str, tuple[F64, float]]]:  # one (d, d) matrix at a time
        if s.class_scatter is not None:
            for c in range(s.num_classes):
                yield (f"the second moment S_c of class {s.meta.classes[c]!r}",
                       _centred(s.class_scatter[c], s.sums[c : c + 1], counts[c : c + 1],
                                second_res))
        elif s.scatter is not None:
            yield "the second moment B", _centred(s.scatter, s.sums, counts, second_res)

    for what, (m, scale) in mats():
        ridge = _PSD_RTOL * d + RESIDUE_RTOL * (1 + s.num_classes) * second_res / scale
        m[np.diag_indices(d)] += ridge  # m is a fresh matrix of _centred: add the ridge in place
        try:
            L = cholesky(m, lower=True, check_finite=False)
            ok = bool(np.all(np.isfinite(L)))
        except LinAlgError:
            ok = False
        if not ok:
            raise StatsValidationError(
                f"{what} minus its mean part (A Aᵀ/N) is not positive semi-definite (checked "
                f"to a relative tolerance of {ridge:.1g}, scale {scale:.3g}): sums of x xᵀ "
                "always are, so the payload is corrupt or its parts come from different data"
            )


def _centred(m: F64, sums: F64, counts: F64, floor: float) -> tuple[F64, float]:
    """((M − Σ_c A_c A_cᵀ/N_c) / σ², σ²) with σ² = max(max diag M, floor): entries of
    magnitude ≤ 1 (Cauchy–Schwarz, checked before, bounds A_c²/N_c by the diagonal), so
    nothing overflows."""
    sigma2 = max(float(np.max(np.diagonal(m), initial=0.0)), floor,
                 float(np.finfo(np.float64).tiny))
    sigma = float(np.sqrt(sigma2))
    out: F64 = m / sigma / sigma
    for a, n in zip(sums, counts, strict=True):
        if n > 0:
            v = a / sigma
            out = out - np.outer(v, v) / n
    return out, sigma2
