"""The laws second moments obey, checked on validated arrays (split from ``client_stats``).

Sums of samples satisfy, per class, Cauchy–Schwarz N_c·D_c ≥ A_c² elementwise and positive
semi-definiteness of S_c − A_c A_cᵀ/N_c (mode ``full``) or of the pooled within-class scatter
(modes ``pooled`` and ``gram``), and in ``pooled`` mode diag(B) = Σ_c D_c.
``first_res``/``second_res`` are the magnitudes of the values a difference was computed from (0
for statistics built directly), whose float residue the checks tolerate.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

import numpy as np
from numpy.typing import NDArray

from ghofl.errors import StatsValidationError
from ghofl.stats._threads import first_failing, thread_count
from ghofl.stats.schema import sym_diagonal

if TYPE_CHECKING:
    from ghofl.stats.client_stats import ClientStats
    from ghofl.stats.client_stats.packed import PackedStats

F64 = NDArray[np.float64]
I64 = NDArray[np.int64]

__all__ = ["RESIDUE_RTOL", "check_gram_laws", "check_second_moment_laws"]

#: Relative size, with respect to the magnitude of the values a difference was computed from,
#: of the float residue it may carry: far above the rounding of millions of additions and
#: removals (each ~1.1e-16 relative), far below any genuine inconsistency.
RESIDUE_RTOL = 1e-9


def check_second_moment_laws(s: ClientStats | PackedStats, diag: F64, first_res: float,
                             second_res: float) -> None:
    """Refuse statistics whose second moments break a law of sums of samples.

    Parameters
    ----------
    s : ClientStats or PackedStats
        Statistics with a second moment (not mode ``means``); the symmetric matrices of
        :class:`~ghofl.stats.client_stats.packed.PackedStats` are checked packed.
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
        tr_b = sym_diagonal(s.scatter, s.dim, packed=s.scatter.ndim == 1)
        tr_d = diag.sum(axis=0)
        atol = (1e-8 * (1.0 + float(np.abs(tr_d).max(initial=0)))
                + RESIDUE_RTOL * s.num_classes * second_res)
        if not np.allclose(tr_b, tr_d, rtol=1e-8, atol=atol):
            raise StatsValidationError(
                f"diag(B) must equal Σ_c D_c in {s.meta.mode!r} statistics; the payload is corrupt "
                "or its parts come from different data"
            )



def check_gram_laws(s: ClientStats | PackedStats, second_res: float) -> None:
    """Refuse a global second moment B whose within-class scatter is not PSD (mode ``gram``).

    Parameters
    ----------
    s : ClientStats or PackedStats
        Statistics holding B but no per-class diagonal.
    second_res : float
        Residue magnitude of second moments (module docstring).
    """
    _check_psd(s, second_res)


def _class_scale(counts: I64, sums: F64, diag: F64) -> F64:
    """Per-class scale (C, 1) of the data: max(max|A_c|/N_c, sqrt(max D_c / N_c)).

    At least the smallest normal float; dividing by it (and D_c twice) keeps the moment checks in
    range whatever the magnitude of the values.
    """
    n = np.maximum(counts, 1).astype(np.float64)[:, None]
    first = np.max(np.abs(sums) / n, axis=1, initial=0.0)[:, None]
    second = np.sqrt(np.max(np.abs(diag) / n, axis=1, initial=0.0))[:, None]
    out: F64 = np.maximum(np.maximum(first, second), np.finfo(np.float64).tiny)
    return out


#: Relative tolerance of the positive semi-definiteness checks, per unit of dimension: a
#: matrix passes when M + tol·d·max(diag M, scale)·I has a Cholesky factor.
_PSD_RTOL = 1e-9

#: Flops (Σ d³/3 over the matrices) from which the PSD check runs its factorisations with one
#: BLAS thread each, one matrix per core at a time: below it, threads cost more than they save.
_ONE_THREAD_FLOPS = 1e9


def _check_psd(s: ClientStats | PackedStats, second_res: float) -> None:
    """Check that second moments are sums of x xᵀ (positive semi-definite scatters).

    Per class, S_c − A_c A_cᵀ/N_c ⪰ 0 (mode ``full``); the pooled within-class scatter
    B − Σ_c A_c A_cᵀ/N_c ⪰ 0 (modes ``pooled`` and ``gram``).

    Tested with one Cholesky factorisation per matrix (d³/3 flops, about a tenth of an
    eigendecomposition) of the matrix, scaled to unit magnitude, plus a relative ridge
    ``_PSD_RTOL·d`` (plus the inherited residue of a difference): it succeeds for every
    matrix whose smallest eigenvalue is above −ridge, i.e. rounding, and fails for a genuine
    negative direction. Each matrix is centred into a reused Fortran-ordered buffer and
    factorised in place (LAPACK ``potrf``, which reports failure without raising), so the
    check allocates one d × d matrix per thread whatever C. Large checks factorise one matrix
    per core at a time (:func:`~ghofl.stats._threads.first_failing`; the factorisation,
    :func:`ghofl.stats.lapack.potrf`, runs without the GIL), each with one BLAS thread:
    factorisations of this size gain little from a second BLAS thread and lose an order of
    magnitude when the machine's other cores are busy. The matrix refused is the first in class
    order, as a loop would find it; only it pays for an eigenvalue computation, for the message.

    Two exact shortcuts accept a matrix without its factorisation; whatever they do not accept
    is factorised, so every refusal and its message is the factorisation's. A class without
    samples whose S_c is exactly zero passes (the zero matrix is PSD; one pass over S_c). A
    matrix of n ≤ :data:`_LOW_RANK_STEPS` samples, n ≤ d / :data:`_LOW_RANK_RATIO` (rank < n),
    passes when :func:`_low_rank_ok` proves it: about d²·n flops instead of d³/3. SciPy's
    LAPACK is loaded before the BLAS threads are limited, so that the limit applies to it in a
    fresh process too.
    """
    from threadpoolctl import threadpool_limits

    from ghofl.stats.lapack import load_lapack

    load_lapack()  # a library loaded inside threadpool_limits would escape the limit
    d = s.dim
    mats = _psd_matrices(s)
    scales, ridges = [0.0] * len(mats), [0.0] * len(mats)

    def ok(i: int, buf: F64) -> bool:
        _, m, sums, counts = mats[i]
        if _is_zero_class(m, counts):
            return True
        scales[i] = _centre_into(buf, m, sums, counts, second_res)
        ridges[i] = (_PSD_RTOL * d
                     + RESIDUE_RTOL * (1 + s.num_classes) * second_res / scales[i])
        steps = int(np.sum(counts))  # a centred sum of n samples has rank < n
        if steps <= _LOW_RANK_STEPS and _LOW_RANK_RATIO * steps <= d:
            if _low_rank_ok(buf, steps, ridges[i]):
                return True
            _centre_into(buf, m, sums, counts, second_res)  # overwritten: the factorisation's
        return _ridged_factor_ok(buf, ridges[i])

    def scratch() -> F64:
        return np.empty((d, d), order="F")

    if len(mats) * float(d) ** 3 / 3.0 < _ONE_THREAD_FLOPS:
        bad = first_failing(len(mats), ok, scratch)
    else:
        with threadpool_limits(limits=1, user_api="blas"):
            bad = first_failing(len(mats), ok, scratch, thread_count(len(mats)))
    if bad is not None:
        what, m, sums, counts = mats[bad]
        low = _smallest_eigenvalue(d, m, sums, counts, second_res)
        scale, ridge = scales[bad], ridges[bad]
        raise StatsValidationError(
            f"{what} minus its mean part (A Aᵀ/N) is not positive semi-definite (checked "
            f"to a relative tolerance of {ridge:.1g}, scale {scale:.3g}): its smallest "
            f"eigenvalue is {low:.3g} times the scale, below −{ridge:.1g}; sums of x xᵀ "
            "always are positive semi-definite, so the payload is corrupt or its parts "
            "come from different data"
        )


def _psd_matrices(s: ClientStats | PackedStats) -> list[tuple[str, F64, F64, F64]]:
    """(name, M, A rows, N) of each matrix to check (views, no copy)."""
    counts = s.counts.astype(np.float64)
    if s.class_scatter is not None:
        return [(f"the second moment S_c of class {s.meta.classes[c]!r}", s.class_scatter[c],
                 s.sums[c : c + 1], counts[c : c + 1]) for c in range(s.num_classes)]
    if s.scatter is not None:
        return [("the second moment B", s.scatter, s.sums, counts)]
    return []


#: Most samples of a matrix that :func:`_check_psd` first tests with :func:`_low_rank_ok`
#: (the steps of its pivoted factorisation; each costs a pass over the factor so far).
_LOW_RANK_STEPS = 160
#: ... when d is at least this many times the samples (below, a factorisation is as cheap).
_LOW_RANK_RATIO = 8


def _low_rank_ok(a: F64, steps: int, ridge: float) -> bool:
    """Whether the symmetric A (lower triangle of ``a``) provably has A + ridge·I ≻ 0.

    A certificate for matrices of low rank, of about d²·``steps`` flops: L (d, k ≤ ``steps``)
    takes k steps of a pivoted Cholesky factorisation of A (columns of largest remaining
    diagonal, stopping once it is below ridge / (8d)), and ``a`` is overwritten with the lower
    triangle of R = A − L Lᵀ (BLAS ``syrk``). Since L Lᵀ ⪰ 0 for any L, λ_min(A) ≥ λ_min(R) ≥
    −‖R‖_∞; the certificate holds when ‖R‖_∞ (LAPACK ``dlansy``) plus a bound on the
    rounding of computing it, (k + d + 2)·ε·(‖R‖_∞ + 2‖|L||L|ᵀ‖_∞), is at most ridge / 2. Its
    correctness does not depend on how L was chosen; a matrix it does not prove (a negative
    direction, a larger rank, NaN) is left to the factorisation, which decides as before (it
    accepts everything this proves, with a margin of ridge / 2).

    Parameters
    ----------
    a : ndarray, shape (d, d), Fortran-ordered
        Lower triangle read and overwritten; the strict upper triangle is left as it was.
    steps : int
        Most columns of L.
    ridge : float
        The tolerance of the factorisation test (:func:`_ridged_factor_ok`).
    """
    from ghofl.stats.lapack import norm_inf_sym, syrk

    d = a.shape[0]
    res = np.array(np.diagonal(a))  # remaining diagonal of A − L Lᵀ
    cols: F64 = np.zeros((d, steps), order="F")
    k, stop = 0, ridge / (8.0 * d)
    with np.errstate(all="ignore"):  # inf or NaN (entries beyond the scale) prove nothing
        while k < steps:
            p = int(np.argmax(res))
            pivot = float(res[p])
            if not pivot > stop:  # NaN included
                break
            col = np.concatenate((a[p, :p], a[p:, p]))  # column p of A (row p, then down)
            if k:
                col -= cols[:, :k] @ cols[p, :k]
            col /= math.sqrt(pivot)
            cols[:, k] = col
            res -= col * col
            res[p] = 0.0
            k += 1
        low = cols[:, :k]
        syrk(a, low, -1.0, lower=True)
        norm = norm_inf_sym(a, lower=True)
        outer = float(np.max(np.abs(low) @ np.abs(low).sum(axis=0), initial=0.0))
        rounding = (k + d + 2) * float(np.finfo(np.float64).eps) * (norm + 2.0 * outer)
        return bool(norm + rounding <= ridge / 2.0)


def _is_zero_class(m: F64, counts: F64) -> bool:
    """Whether ``m`` is exactly zero and belongs to classes without samples (``counts`` all 0).

    The zero matrix is positive semi-definite: no factorisation is needed to accept it. Classes
    with samples are not scanned (their matrices are factorised anyway).
    """
    return not np.any(counts) and not np.any(m)


def _centre_into(out: F64, m: F64, sums: F64, counts: F64, floor: float) -> float:
    """Write (M − Σ_c A_c A_cᵀ/N_c) / σ² into ``out``; return σ² = max(max diag M, floor).

    ``out`` (d, d) is Fortran-ordered; the result is its lower triangle (what every step of
    the check reads). ``m`` is the symmetric M (d, d), or its packed upper triangle
    (d(d+1)/2,) in row-major order (:func:`~ghofl.stats.schema.pack_upper`), as a payload
    carries it.

    A full M: ``out`` receives Mᵀ / σ² (one contiguous pass), whose lower triangle is the
    upper triangle of M. A packed M: row i of its triangle is column i of ``out`` from the
    diagonal down (one contiguous copy per row); the strict upper triangle of ``out`` is not
    written. Then the rank-k update of the lower triangle. Entries have magnitude ≤ 1
    (Cauchy–Schwarz, checked before, bounds A_c²/N_c by the diagonal), so nothing overflows.
    """
    from ghofl.stats.lapack import syrk

    d = out.shape[0]
    packed = m.ndim == 1
    sigma2 = max(float(np.max(sym_diagonal(m, d, packed), initial=0.0)), floor,
                 float(np.finfo(np.float64).tiny))
    inv = 1.0 / sigma2
    with np.errstate(over="ignore"):  # off-diagonal entries far beyond the diagonal: inf,
        if packed:  # which the factorisation refuses
            cols, start = out.T, 0
            for i in range(d):
                np.multiply(m[start : start + d - i], inv, out=cols[i, i:])
                start += d - i
        else:
            np.multiply(m, inv, out=out.T)
    keep = counts > 0
    if np.any(keep):  # out -= Wᵀ W, rows w_c = A_c / σ / sqrt(N_c): one rank-k update in place
        w = (sums[keep] / np.sqrt(sigma2)) / np.sqrt(counts[keep])[:, None]
        syrk(out, np.asfortranarray(w.T), -1.0, lower=True)
    return sigma2


def _ridged_factor_ok(a: F64, ridge: float) -> bool:
    """Whether the symmetric matrix ``a`` plus ``ridge``·I has a Cholesky factor.

    ``a`` holds the lower triangle (Fortran order) and is overwritten. A non-finite entry of the
    factor reaches a later pivot through its square, and LAPACK reports a non-positive or NaN pivot:
    a factor reported complete is finite.
    """
    from ghofl.stats.lapack import potrf

    a[np.diag_indices(a.shape[0])] += ridge
    info = potrf(a, lower=True)  # in place, without the GIL: the pool's threads overlap
    return info == 0 and bool(np.all(np.isfinite(np.diagonal(a))))


def _smallest_eigenvalue(d: int, m: F64, sums: F64, counts: F64, floor: float) -> float:
    """Smallest eigenvalue of (M − Σ_c A_c A_cᵀ/N_c) / σ² (for the message of a refusal).

    ``m``: as :func:`_centre_into` takes it (d × d, or packed).
    """
    from scipy.linalg import eigvalsh

    buf: F64 = np.empty((d, d), order="F")
    _centre_into(buf, m, sums, counts, floor)
    if not np.all(np.isfinite(np.tril(buf))):
        return -math.inf
    return float(eigvalsh(buf, lower=True, subset_by_index=[0, 0], check_finite=False)[0])
