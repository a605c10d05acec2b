"""One tridiagonal reduction of a covariance shared by every shrinkage candidate.

The candidates C(a) = (1 − a)·P + a·t·I of a symmetric P (d, d) share one reduction
P = Q T Qᵀ (LAPACK ``dsytrd``: Q a product of Householder reflectors, T symmetric tridiagonal):

    C(a) = Q M(a) Qᵀ,   M(a) = (1 − a)·T + a·t·I,

so for vectors Y (d, m) with Ỹ = QᵀY (one pass of the reflectors, O(d²m)):

- YᵀC(a)⁻¹Y = Ỹᵀ M(a)⁻¹ Ỹ and YᵀC(a)⁻¹ P C(a)⁻¹Y = Xᵀ T X with X = M(a)⁻¹Ỹ: a positive
  definite tridiagonal solve (LAPACK ``dptsv``), O(d·m) per candidate;
- C(a)⁻¹Y = Q M(a)⁻¹ Ỹ: the fitted solution, again O(d²m);
- the eigenvalues of P are those of T (``dsterf``, O(d²)).

The criteria of :mod:`ghofl.moments.criteria` need no more than these, so no eigenvector of P
is ever formed: the reduction is a third to a half of a full eigendecomposition
(``scipy.linalg.eigh``), whose back transformation of the eigenvectors costs as much again.
Solves are as accurate as a Cholesky solve of C(a) while C(a) is well conditioned
(:data:`MAX_CONDITION`); callers fall back to an eigendecomposition beyond it.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
from numpy.typing import NDArray
from scipy.linalg import lapack

F64 = NDArray[np.float64]
#: Largest condition number of M(a) = (1 − a)T + a·t·I for which the tridiagonal solves stand in
#: for the eigenvector formulas: their relative error is about MAX_CONDITION·ε ≈ 1e-6 at worst.
MAX_CONDITION = 1e10
#: A pair (gram of H = C(a)⁻¹ against the vectors, gram of H P H) for a candidate a and its
#: eigenvalues D(a) = (1 − a)·w + a·t.
Grams = Callable[[float, F64], tuple[F64, F64]]


@dataclass(frozen=True, eq=False)
class Tridiagonal:
    """P = Q T Qᵀ for a symmetric P (d, d), d ≥ 2 (module docstring).

    Attributes
    ----------
    reflectors : ndarray, shape (d − 1, d − 1), Fortran order
        The Householder vectors of Q below the diagonal (LAPACK ``dsytrd``, lower, rows 2..d).
    tau : ndarray, shape (d − 1,)
        Their scalar factors.
    diag : ndarray, shape (d,)
        The diagonal of T.
    offdiag : ndarray, shape (d − 1,)
        The sub-diagonal of T.
    eigvals : ndarray, shape (d,)
        The eigenvalues of P (of T), ascending, not clipped.
    trace : float
        tr(P), as read from P before the reduction.
    """

    reflectors: F64
    tau: F64
    diag: F64
    offdiag: F64
    eigvals: F64
    trace: float

    @property
    def dim(self) -> int:
        """The dimension d."""
        return int(self.diag.shape[0])

    def _apply(self, y: F64, trans: str) -> F64:
        out = np.array(y, dtype=np.float64, order="F", copy=True)
        if out.ndim != 2 or out.shape[0] != self.dim:
            raise ValueError(f"expected vectors of shape ({self.dim}, m); got {y.shape}")
        lwork = max(1, out.shape[1]) * 64 + 65 * 64
        tail, _, info = lapack.dormqr("L", trans, self.reflectors, self.tau, out[1:], lwork)
        if info != 0:  # pragma: no cover - the arguments are checked above
            raise np.linalg.LinAlgError(f"applying the reflectors failed (LAPACK info {info})")
        out[1:] = tail
        res: F64 = out
        return res

    def project(self, y: F64) -> F64:
        """QᵀY for Y of shape (d, m); returns shape (d, m)."""
        return self._apply(y, "T")

    def expand(self, y: F64) -> F64:
        """QY for Y of shape (d, m); returns shape (d, m)."""
        return self._apply(y, "N")

    def solve(self, scale: float, shift: float, y: F64) -> F64 | None:
        """(scale·T + shift·I)⁻¹ Y for Y of shape (d, m); None when not positive definite."""
        _, _, x, info = lapack.dptsv(scale * self.diag + shift, scale * self.offdiag,
                                     np.array(y, dtype=np.float64, order="F", copy=True),
                                     overwrite_b=1)
        if info != 0:
            return None
        out: F64 = x
        return out

    def times(self, x: F64) -> F64:
        """T X for X of shape (d, m)."""
        out: F64 = self.diag[:, None] * x
        out[:-1] += self.offdiag[:, None] * x[1:]
        out[1:] += self.offdiag[:, None] * x[:-1]
        return out

    def condition(self, scale: float, shift: float) -> float:
        """Condition number of scale·T + shift·I from the eigenvalues (inf when singular)."""
        vals = scale * np.maximum(self.eigvals, 0.0) + shift
        lo, hi = float(np.min(vals)), float(np.max(vals))
        return hi / lo if lo > 0.0 else float("inf")


def tridiagonal(cov: F64, overwrite: bool = False) -> Tridiagonal | None:
    """Reduce a symmetric ``cov`` (d, d) to tridiagonal form; None when d < 2 or not finite.

    Reads the lower triangle of ``cov`` (its upper one for a C-ordered array, the same matrix
    when it is symmetric). ``overwrite``: ``cov`` may be destroyed (no copy of a C- or
    Fortran-contiguous array is made).
    """
    d = cov.shape[0]
    if d < 2 or not np.all(np.isfinite(np.diag(cov))):
        return None
    trace = float(np.trace(cov))
    a = cov.T if cov.flags.c_contiguous else cov  # Fortran order: no copy in the wrapper
    lwork = int(lapack.dsytrd_lwork(d, lower=1)[0])
    red, diag, off, tau, info = lapack.dsytrd(a, lower=1, lwork=max(lwork, d),
                                              overwrite_a=int(overwrite))
    if info != 0 or not (np.all(np.isfinite(diag)) and np.all(np.isfinite(off))):
        return None
    vals, info = lapack.dsterf(diag.copy(), off.copy())
    if info != 0:  # pragma: no cover - QL iteration failed to converge
        return None
    return Tridiagonal(np.asfortranarray(red[1:, : d - 1]), tau, diag, off, np.sort(vals),
                       trace)


def shrunk_solve(tri: Tridiagonal, a: float, target: float, y: F64,
                 scale: float = 1.0) -> F64 | None:
    """(scale·((1 − a)P + a·t·I))⁻¹ Y for Y (d, m); None when not well conditioned.

    Parameters
    ----------
    tri : Tridiagonal
        The reduction of P.
    a, target : float
        The coefficient and t.
    y : ndarray, shape (d, m)
    scale : float, default 1.0
        A positive factor of the whole matrix (e.g. another divisor of the same scatter).

    Returns
    -------
    ndarray, shape (d, m), or None when the matrix is not positive definite or its condition
    number exceeds :data:`MAX_CONDITION`.
    """
    lo, sh = scale * (1.0 - a), scale * a * target
    if not scale > 0.0 or tri.condition(lo, sh) > MAX_CONDITION:
        return None
    x = tri.solve(lo, sh, tri.project(y))
    return None if x is None else tri.expand(x)


def tridiagonal_grams(tri: Tridiagonal, target: float, vectors: F64) -> Grams:
    """The grams of the analytic error (:func:`ghofl.moments.criteria.analytic_error_grams`).

    For the rows μ_c of ``vectors`` (m, d) and a candidate a: (μ_cᵀ H μ_j) and
    (μ_cᵀ H P H μ_j), H = C(a)⁻¹, both (m, m), from tridiagonal solves.
    """
    proj = tri.project(vectors.T)

    def grams(a: float, dvals: F64) -> tuple[F64, F64]:
        x = tri.solve(1.0 - a, a * target, proj)
        if x is None:
            raise np.linalg.LinAlgError(f"the shrunk covariance at a = {a:g} is not positive "
                                        "definite")
        return proj.T @ x, x.T @ tri.times(x)

    return grams


def grid_condition(tri: Tridiagonal, target: float, candidates: list[float]) -> float:
    """The largest condition number of M(a) over ``candidates`` (see :data:`MAX_CONDITION`)."""
    return max((tri.condition(1.0 - a, a * target) for a in candidates), default=1.0)


__all__ = [
    "MAX_CONDITION",
    "Grams",
    "Tridiagonal",
    "grid_condition",
    "shrunk_solve",
    "tridiagonal",
    "tridiagonal_grams",
]
