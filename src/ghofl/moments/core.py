"""Moments: the first non-additive step. Only this module divides sums by counts.

From aggregated sums (method.md §2):
μ_c = A_c/N_c; π_c = N_c/N; within-class scatter W = B − Σ_c A_c A_cᵀ/N_c;
Σ_pool = W/(N − C); Σ_c = (S_c − A_c A_cᵀ/N_c)/(N_c − 1); diagonal variances
v_c = D_c/N_c − μ_c² (maximum likelihood, as Gaussian naive Bayes); total covariance
Σ_tot = (B − A Aᵀ/N)/(N − 1) with A = Σ_c A_c.
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass

import numpy as np
from numpy.typing import NDArray
from scipy.linalg import blas

from ghofl.errors import GhoflWarning as GhoflWarning  # re-exported: its home is ghofl.errors
from ghofl.errors import StatsValidationError, UnsupportedModeError
from ghofl.moments.estimated import EstimatedStats
from ghofl.stats.client_stats import ClientStats
from ghofl.stats.meta import StatsMeta

F64 = NDArray[np.float64]


@dataclass(frozen=True, eq=False)
class Moments:
    """Means, priors and covariances derived from aggregated :class:`ClientStats`.

    Attributes
    ----------
    meta : StatsMeta
    counts : ndarray of int64, shape (C,)
    priors : ndarray, shape (C,)
        π_c = N_c / N.
    means : ndarray, shape (C, d)
    class_vars : ndarray, shape (C, d)
        Maximum-likelihood per-class diagonal variances D_c/N_c − μ_c², clipped at 0
        (raises UnsupportedModeError in ``means`` and ``gram`` modes, which hold no per-class
        second moment).
    within_scatter : ndarray, shape (d, d), or None
        W = B − Σ_c N_c μ_c μ_cᵀ (``None`` in ``diag`` mode).
    total_scatter : ndarray, shape (d, d), or None
        B − N m mᵀ around the global mean m (``None`` in ``diag`` mode).
    scatter_dof : float or None
        Degrees of freedom of an estimated within-class scatter
        (:class:`~ghofl.moments.estimated.EstimatedStats`); ``None`` for exact sums, whose
        scatter has N − C (:meth:`pooled_dof`).
    class_dof_ : ndarray, shape (C,), or None
        Degrees of freedom of estimated class scatters; ``None``: N_c − 1 (:meth:`class_dof`).
    """

    meta: StatsMeta
    counts: NDArray[np.int64]
    priors: F64
    means: F64
    class_vars_: F64 | None
    within_scatter: F64 | None
    total_scatter: F64 | None
    stats: ClientStats
    scatter_dof: float | None = None
    class_dof_: F64 | None = None

    @property
    def n_samples(self) -> int:
        """Total number of samples N."""
        return int(self.counts.sum())

    @property
    def num_classes(self) -> int:
        """Number of classes C."""
        return int(self.counts.shape[0])

    @property
    def dim(self) -> int:
        """Embedding dimension d."""
        return int(self.means.shape[1])

    @property
    def global_mean(self) -> F64:
        """The global mean m = Σ_c π_c μ_c, shape (d,)."""
        out: F64 = self.priors @ self.means
        return out

    @property
    def class_vars(self) -> F64:
        """Per-class diagonal variances (C, d); need per-class second moments.

        Not in ``means`` or ``gram`` mode.
        """
        if self.class_vars_ is None:
            held = ("class counts, sums and the global B only" if self.total_scatter is not None
                    else "class counts and sums only")
            hint = ("Use a head that needs only the pooled scatter (lda, ridge, fed3r)"
                    if self.total_scatter is not None else "Use the 'ncm' head")
            raise UnsupportedModeError(
                "per-class variances need per-class second moments (upload mode 'diag', "
                f"'pooled' or 'full'); these statistics are mode {self.meta.mode!r}, which holds "
                f"{held}. {hint}, or recompute the client statistics with --mode pooled (or "
                "diag, or full)"
            )
        return self.class_vars_

    @property
    def is_estimated(self) -> bool:
        """Whether the second moments are an estimate with their own degrees of freedom."""
        return self.scatter_dof is not None

    def pooled_dof(self) -> float:
        """Degrees of freedom of the within-class scatter: N − C, or the estimate's."""
        if self.scatter_dof is not None:
            return float(self.scatter_dof)
        return float(self.n_samples - self.num_classes)

    def class_dof(self, c: int) -> float:
        """Degrees of freedom of class c's scatter: N_c − 1, or the estimate's."""
        if self.class_dof_ is not None:
            return float(self.class_dof_[c])
        return float(self.counts[c] - 1)

    @property
    def has_class_covariances(self) -> bool:
        """Whether the statistics hold per-class scatters (mode ``full``)."""
        return self.stats.class_scatter is not None

    def pooled_covariance(self, divisor: str = "n-c") -> F64:
        """Σ_pool = W / (N − C) (``"n-c"``, unbiased, the paper) or W / N (``"n"``, MLE)."""
        w = self._require_scatter(self.within_scatter, "the pooled covariance")
        n, c = self.n_samples, self.num_classes
        den = n - c if divisor == "n-c" else n
        if den <= 0:
            raise StatsValidationError(
                f"the pooled covariance needs more samples than classes; got N={n}, C={c}"
            )
        return w / den

    def total_covariance(self) -> F64:
        """Σ_tot = (B − N m mᵀ)/(N − 1): the covariance around the global mean (FedCGS)."""
        t = self._require_scatter(self.total_scatter, "the total covariance")
        if self.n_samples < 2:
            raise StatsValidationError("the total covariance needs at least 2 samples")
        return t / (self.n_samples - 1)

    def class_covariance(self, c: int, divisor: str = "n-1", out: F64 | None = None) -> F64:
        """Σ_c = (S_c − N_c μ_c μ_cᵀ)/(N_c − 1), shape (d, d) (``divisor="n"``: ÷N_c, MLE).

        Needs ``full`` statistics. A class with N_c = 1 falls back to the pooled covariance
        with a :class:`GhoflWarning`. ``out`` (d, d), C-contiguous float64: written with
        Σ_c and returned (no other (d, d) array is allocated), else a new array.
        """
        s = self.stats.class_scatter
        if s is None:
            raise UnsupportedModeError(
                "per-class covariances need upload mode 'full' (per-class second moments S_c); "
                f"these statistics are mode {self.meta.mode!r}. Recompute the client statistics "
                "with --mode full, or use a head that needs only pooled statistics"
            )
        n_c = int(self.counts[c])
        if n_c < 2:
            warnings.warn(
                f"class {self.meta.classes[c]!r} has {n_c} sample(s): its covariance cannot be "
                "estimated, using the pooled covariance instead",
                GhoflWarning,
                stacklevel=2,
            )
            pooled = self.pooled_covariance()
            if out is None:
                return pooled
            out[...] = pooled
            return out
        mu = self.means[c]
        cov = np.outer(mu, mu, out=out)  # s_c − n_c·μμᵀ, in place (the same values)
        cov *= -float(n_c)
        cov += s[c]
        cov /= n_c - 1 if divisor == "n-1" else n_c
        symmetrise(cov)
        return cov

    def validation_split(self) -> tuple[Moments, Moments] | None:
        """Moments of the fitting part and of the held-out part of the statistics.

        Needs statistics with a held-out section (clients computed them with
        ``holdout_fraction > 0``): the fitting part is total − held-out
        (:meth:`ClientStats.fitting_part <ghofl.stats.ClientStats.fitting_part>`), the
        held-out part ``stats.holdout``. Use it to score candidate hyperparameters (e.g.
        shrinkages) on held-out moments, then fit on the total (these moments).

        Classes may be empty in one part (a rare class all held out, or none of it): both
        moments are computed with ``allow_empty_classes=True``, so such a class has N_c = 0,
        prior 0, mean 0 and variances 0 in that part; a scorer should skip it (weight by the
        counts of the held-out part and fit only on classes with samples in the fitting part).

        Returns
        -------
        (fit, held) : tuple of Moments, or None
            ``None`` when the statistics have no held-out section, or when either part holds no
            sample at all (nothing to fit on or to score on; a :class:`GhoflWarning` says
            which). Both carry metadata with ``holdout_fraction`` 0.0 and no held-out section.
        """
        held = self.stats.holdout
        if held is None:
            return None
        fit = self.stats.fitting_part()
        for name, part in (("fitting", fit), ("held-out", held)):
            if part.n_samples == 0:
                warnings.warn(
                    f"the {name} part of the statistics holds no sample (the totals hold "
                    f"{self.n_samples}, the held-out section {held.n_samples}), so there is no "
                    "validation split; use a held-out fraction that leaves samples in both parts",
                    GhoflWarning,
                    stacklevel=2,
                )
                return None
        return (compute_moments(fit, allow_empty_classes=True),
                compute_moments(held, allow_empty_classes=True))

    def _require_scatter(self, m: F64 | None, what: str) -> F64:
        if m is None:
            raise UnsupportedModeError(
                f"{what} needs a second-moment matrix (upload mode 'pooled' or 'full'); these "
                f"statistics are mode {self.meta.mode!r}. Recompute the client statistics with "
                "--mode pooled or --mode full, or use the naive Bayes head ('nb')"
            )
        return m


def compute_moments(stats: ClientStats, allow_empty_classes: bool = False) -> Moments:
    """Derive :class:`Moments` from aggregated statistics.

    Parameters
    ----------
    stats : ClientStats
        The aggregate over all clients.
    allow_empty_classes : bool, default False
        A class with N_c = 0 cannot be modelled; by default this raises
        :class:`StatsValidationError` naming the class.
    """
    counts = stats.counts
    n = int(counts.sum())
    if n == 0:
        raise StatsValidationError(
            "the statistics hold no samples at all; aggregate the client payloads first"
        )
    empty = np.flatnonzero(counts == 0)
    if empty.size and not allow_empty_classes:
        names = ", ".join(repr(stats.meta.classes[i]) for i in empty[:5])
        raise StatsValidationError(
            f"class(es) {names} have no samples in the aggregate, so no head can model them; "
            "collect data for them, or drop them from the class list on every client"
        )
    safe = np.maximum(counts, 1).astype(np.float64)
    means = stats.sums / safe[:, None]
    class_vars = None
    if stats.sq_sums is not None or stats.class_scatter is not None:  # not 'means', 'gram'
        class_vars = np.maximum(stats.diag_sums / safe[:, None] - means**2, 0.0)
    b = stats.total_scatter
    within = total = None
    if b is not None:
        between = class_between(stats.sums, safe)
        within = symmetrise(np.subtract(b, between, out=between))
        a = stats.sums.sum(axis=0)
        outer = np.outer(a, a)
        outer /= n
        total = symmetrise(np.subtract(b, outer, out=outer))
    dof, class_dof = (
        (stats.scatter_dof, stats.class_dof) if isinstance(stats, EstimatedStats) else (None, None)
    )
    return Moments(
        meta=stats.meta,
        counts=counts,
        priors=counts / n,
        means=means,
        class_vars_=class_vars,
        within_scatter=within,
        total_scatter=total,
        stats=stats,
        scatter_dof=dof,
        class_dof_=class_dof,
    )


def class_between(sums: F64, counts: F64) -> F64:
    """Σ_c A_c A_cᵀ / N_c (d, d), C-ordered, for the class sums A (C, d) and counts N (C,).

    One GEMM through SciPy's BLAS, the library of every LAPACK call the heads make next: a
    product through NumPy's (a second OpenBLAS in the wheels) leaves its worker threads
    spinning for a while after it returns, and on a machine with few cores they take the
    cores the following factorisation runs on (BENCHMARKS.md "Cost of the data-driven
    shrinkage": a 1280-dimensional tridiagonal reduction 1.7x slower right after one).
    """
    scaled = np.asfortranarray(sums.T / counts)  # (d, C)
    out = blas.dgemm(1.0, scaled, np.asfortranarray(sums))  # (d, d), Fortran order
    res: F64 = out.T  # the C-ordered view; the product is symmetric up to rounding
    return res


def symmetrise(m: F64) -> F64:
    """Replace the square ``m`` (d, d) by ½(M + Mᵀ) in place, and return it.

    The same values as ``0.5 * (m + m.T)`` without its two (d, d) temporaries: the matrix is
    averaged with its transpose one pair of :data:`_SYM_TILE`-square tiles at a time.
    """
    d, t = m.shape[0], _SYM_TILE
    for i0 in range(0, d, t):
        i1 = min(i0 + t, d)
        tile = m[i0:i1, i0:i1]
        tile += tile.T  # numpy buffers the overlapping operand
        tile *= 0.5
        for j0 in range(i1, d, t):
            upper, lower = m[i0:i1, j0 : j0 + t], m[j0 : j0 + t, i0:i1]
            upper += lower.T
            upper *= 0.5
            lower[...] = upper.T
    return m


#: Side of the square tiles :func:`symmetrise` averages.
_SYM_TILE = 128
