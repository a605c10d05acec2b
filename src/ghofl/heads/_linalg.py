"""Small float64 linear-algebra helpers shared by the closed-form heads."""

from __future__ import annotations

import functools
import os
import threading
import warnings
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import AbstractContextManager, contextmanager, nullcontext
from typing import Any, TypeVar

import numpy as np
from numpy.typing import NDArray
from scipy.linalg import LinAlgError, cholesky, solve_triangular

from ghofl.errors import StatsValidationError
from ghofl.moments.core import GhoflWarning
from ghofl.stats.lapack import potrf, trtri

F64 = NDArray[np.float64]
R = TypeVar("R")
#: multiply-adds up to which a product runs on one BLAS thread (:func:`small_product_threads`):
#: about 1.5 ms on one core of a 2-core Xeon, so two threads could save under a millisecond
ONE_THREAD_MACS = 1 << 24
#: bytes of the float64 buffer, one per worker, into which :func:`project_rows` casts each block
#: of rows of an ``X`` that is not float64 (51 rows at d = 1,280): it stays in a core's L2 cache,
#: and for k ≤ 15 a block's product (rows·d·k ≤ 10⁶ multiply-adds) takes OpenBLAS's unpacked
#: small-matrix kernel, about twice as fast here (10,000 × 1,280 float32 rows, k = 9, one
#: thread: 12 ms in 512 KiB blocks, 18-20 ms in 1-4 MiB blocks, on a 2-core Xeon)
PROJECT_BLOCK_BYTES = 512 * 2**10


def stable_cholesky(cov: F64, what: str, release_gil: bool = False) -> tuple[F64, float]:
    """Lower Cholesky factor of ``cov`` (d, d), adding the smallest diagonal jitter needed.

    The jitter that makes it positive definite starts at 1e-10·tr(Σ)/d, ×10 per try,
    at most 1e-2·tr(Σ)/d. ``release_gil``: factorise without holding the GIL
    (:func:`ghofl.stats.lapack.potrf`; SciPy's LAPACK wrappers hold it), for factorisations
    run in a thread pool (:func:`class_map`); it reads the lower triangle and returns L in
    Fortran order.

    Returns ``(L, jitter)``; a non-zero jitter is reported with a :class:`GhoflWarning`.
    """
    d = cov.shape[0]
    scale = _factor_scale(cov, what)
    jitter = 0.0
    for step in range(10):
        try:
            m = cov if jitter == 0.0 else cov + jitter * np.eye(d)
            L: F64 = (_nogil_cholesky(m) if release_gil
                      else np.asarray(cholesky(m, lower=True, check_finite=False),
                                      dtype=np.float64))
            if not np.all(np.isfinite(L)):
                raise LinAlgError("non-finite factor")
        except (LinAlgError, np.linalg.LinAlgError):
            jitter = scale * 10.0 ** (step - 10)
            continue
        _warn_jitter(what, jitter)
        return L, jitter
    raise LinAlgError(f"{what} is not positive definite even with a ridge of {jitter:.3g}")


def _factor_scale(cov: F64, what: str) -> float:
    """max(tr(Σ)/d, tiny), the unit of the jitter; refuses a ``cov`` with non-finite entries."""
    if not np.all(np.isfinite(cov)):
        raise StatsValidationError(
            f"{what} has non-finite entries: the features' scale over- or underflows float64 "
            "(e.g. values near 1e-160 or 1e+160); rescale the embeddings (standardise them) "
            "and recompute the statistics"
        )
    scale: float = max(float(np.trace(cov)) / cov.shape[0], float(np.finfo(float).tiny))
    return scale


def _warn_jitter(what: str, jitter: float) -> None:
    if jitter:
        warnings.warn(
            f"{what} is singular; added a ridge of {jitter:.3g} to its diagonal "
            "(use shrinkage > 0 to avoid this)",
            GhoflWarning,
            stacklevel=4,
        )


def _nogil_cholesky(m: F64) -> F64:
    """Lower Cholesky factor of ``m`` (its lower triangle read), Fortran-ordered, zeros above."""
    a = np.array(m, dtype=np.float64, order="F")
    if potrf(a, lower=True) != 0:
        raise LinAlgError("not positive definite")
    _zero_upper(a)
    return a


def _zero_upper(a: F64) -> None:
    """Zero the strict upper triangle of the Fortran-ordered ``a`` (d, d), column by column."""
    for j in range(1, a.shape[0]):
        a[:j, j] = 0.0


def inverse_factor_into(out: F64, fill: Callable[[F64], object], what: str) -> tuple[float, float]:
    """Overwrite ``out`` with P = L⁻ᵀ, L the lower Cholesky factor of the matrix ``fill`` writes.

    ``fill(out)`` writes a symmetric Σ (d, d) into the C-contiguous float64 ``out``; Σ is
    factorised, Σ = L Lᵀ, and L inverted in place (LAPACK ``dpotrf``, ``dtrtri``, without the
    GIL: :mod:`ghofl.stats.lapack`), so that ``out`` ends as the upper-triangular L⁻ᵀ (zeros
    below the diagonal) and no other (d, d) array is allocated. The jitter is
    :func:`stable_cholesky`'s: when Σ is not positive definite, ``fill`` is called again and the
    jitter added to its diagonal.

    Returns
    -------
    (half_log_det, jitter) : (float, float)
        Σ log diag L (of the jittered matrix) and the jitter added (a :class:`GhoflWarning`
        when non-zero).
    """
    fill(out)
    scale = _factor_scale(out, what)
    lower = out.T  # Fortran-ordered; Σ symmetric: its lower triangle is Σ's
    jitter = 0.0
    for step in range(10):
        if jitter:
            fill(out)
            out[np.diag_indices(out.shape[0])] += jitter
        diag = np.diagonal(lower)
        if potrf(lower, lower=True) == 0 and np.all(np.isfinite(diag)):
            break
        jitter = scale * 10.0 ** (step - 10)
    else:
        raise LinAlgError(f"{what} is not positive definite even with a ridge of {jitter:.3g}")
    _warn_jitter(what, jitter)
    half_log_det = float(np.sum(np.log(diag)))
    if trtri(lower, lower=True) != 0:  # pragma: no cover - the factor's diagonal is positive
        raise LinAlgError(f"the Cholesky factor of {what} could not be inverted")
    _zero_upper(lower)
    return half_log_det, jitter


def chol_solve(L: F64, B: F64) -> F64:
    """Solve (L Lᵀ) X = B for X given the lower Cholesky factor ``L``."""
    y = solve_triangular(L, B, lower=True, check_finite=False)
    out: F64 = solve_triangular(L.T, y, lower=False, check_finite=False)
    return out


def linear_discriminant(means: F64, cov: F64, log_priors: F64, what: str) -> tuple[F64, F64, float]:
    """Coefficients of a shared-covariance Gaussian classifier.

    g_c(x) = xᵀ W_c + b_c with W = Σ⁻¹ μᵀ (d, C) and b_c = −½ μ_cᵀ W_c + log π_c.

    Returns ``(coef (C, d), intercept (C,), jitter)``.
    """
    with one_blas_thread():  # threads spinning against a loaded machine cost more than they gain
        L, jitter = stable_cholesky(cov, what)
        w = chol_solve(L, means.T)  # (d, C)
    intercept = -0.5 * np.einsum("cd,dc->c", means, w) + log_priors
    return np.ascontiguousarray(w.T), intercept, jitter


def safe_log(p: F64) -> F64:
    with np.errstate(divide="ignore"):
        out: F64 = np.log(p)
    return out


def worker_count(tasks: int) -> int:
    """Threads for ``tasks`` independent per-class factorisations: the usable CPUs, at most.

    ``GHOFL_NUM_THREADS`` (a positive integer) overrides the CPU count.
    """
    env = os.environ.get("GHOFL_NUM_THREADS", "").strip()
    affinity = getattr(os, "sched_getaffinity", None)
    usable = len(affinity(0)) if affinity is not None else (os.cpu_count() or 1)
    cpus = int(env) if env.isdigit() and int(env) > 0 else usable
    return max(1, min(cpus, tasks))


def one_blas_thread() -> AbstractContextManager[object]:
    """A block in which numpy's and SciPy's BLAS/LAPACK run one thread (``threadpoolctl``).

    For factorisations of d ≈ 10³: two OpenBLAS threads gain at most 2× on an idle 2-core
    machine and lose many times that on a loaded one, the threads spinning against other
    processes.
    """
    from threadpoolctl import threadpool_limits

    limits: AbstractContextManager[object] = threadpool_limits(limits=1, user_api="blas")
    return limits


@functools.cache
def _blas_controller() -> Any:
    """One ``threadpoolctl.ThreadpoolController`` for the process (building one costs ~0.2 ms).

    It sees the BLAS libraries loaded when first called, numpy's among them.
    """
    from threadpoolctl import ThreadpoolController

    return ThreadpoolController()


#: held by the one thread inside :func:`small_product_threads`'s limit
_LIMIT_LOCK = threading.Lock()


@contextmanager
def small_product_threads(macs: float) -> Iterator[None]:
    """One BLAS thread for a product of at most :data:`ONE_THREAD_MACS` multiply-adds, else as is.

    On a small product a second OpenBLAS thread gains little on an idle machine and loses a
    scheduler time slice (several ms) whenever the other core is busy, e.g. with another
    library's spinning OpenMP threads (PyTorch's after each of its operations); large products
    keep every BLAS thread. The limit is ``threadpoolctl``'s, through a cached controller (the
    block costs microseconds). OpenBLAS's setting is process-wide, and ``threadpoolctl``
    restores what it read on entry, so one thread at a time sets it: a thread that finds it
    held runs as it finds the BLAS, instead of reading another's limit as the original.
    """
    if macs > ONE_THREAD_MACS or not _LIMIT_LOCK.acquire(blocking=False):
        yield
        return
    try:
        with _blas_controller().limit(limits=1, user_api="blas"):
            yield
    finally:
        _LIMIT_LOCK.release()


def project_rows(X: NDArray[Any], V: F64, check_finite: bool = False) -> tuple[F64, bool]:
    """The float64 product ``X V`` and whether it shows ``X`` finite.

    Parameters
    ----------
    X : ndarray of shape (n, d)
        Real or integer inputs, any dtype and layout. A float64 ``X`` that is C- or
        Fortran-contiguous is multiplied as it is (``X @ V``, under
        :func:`small_product_threads`). Any other ``X`` (float32, float16, integers, strided
        views) is never converted as a whole: its blocks of rows are cast to float64 in a
        buffer of :data:`PROJECT_BLOCK_BYTES` per worker and multiplied into the matching rows
        of ``X V``, the blocks spread over :func:`worker_count` threads (numpy's casts and BLAS
        release the GIL; no process-wide BLAS limit is taken). The block
        boundaries depend on ``n`` and ``d`` only, so the result does not depend on the number
        of threads.
    V : ndarray of shape (d, k)
        float64 projection.
    check_finite : bool, default False
        Whether to compute the flag. A NaN or an infinity in row i of ``X`` makes row i of
        ``X V`` NaN or infinite (IEEE arithmetic; the float64 cast keeps them) when no row of
        ``V`` is all zeros: each entry of ``X`` then meets a non-zero factor, even in a BLAS
        that skips zero ones. So a finite ``X V`` and no zero row of ``V`` prove ``X``
        finite, at the cost of a pass over the (n, k) product instead of one over ``X``.

    Returns
    -------
    z : ndarray of shape (n, k)
        ``X V`` in float64: ``np.asarray(X, np.float64) @ V`` up to the rounding of the
        product's summation order.
    finite : bool
        True without ``check_finite``. With it, False when ``X`` may hold a NaN or an
        infinity, or an entry of ``X V`` overflowed, or ``V`` has a zero row: check ``X``
        itself.
    """
    n, d = X.shape
    if X.dtype == np.float64 and (X.flags.c_contiguous or X.flags.f_contiguous):
        with small_product_threads(float(n) * d * V.shape[1]):
            z: F64 = X @ V
    else:
        z = _project_blocks(X, V)
    if not check_finite:
        return z, True
    return z, bool(np.isfinite(z).all()) and bool(np.any(V != 0.0, axis=1).all())


def _project_blocks(X: NDArray[Any], V: F64) -> F64:
    """``X V`` (n, k) for any real ``X`` (n, d), cast to float64 block of rows by block.

    Block b holds rows [b·r, (b + 1)·r), r = :data:`PROJECT_BLOCK_BYTES` // (8 d); worker w
    of :func:`worker_count` takes a contiguous run of blocks and casts each into its own
    (r, d) buffer, then writes the block's product into ``z`` in place, under the caller's
    :func:`numpy.errstate` (callback included). No BLAS thread limit is set: a block's
    product (at most 65,536·k multiply-adds) runs on OpenBLAS's single-threaded small-matrix
    kernel for k ≤ 15, and setting the process-wide limit per block cost more than the
    product (10 ms on 10,000 rows), while holding it for the whole call could leave BLAS
    limited for the process when another thread set its own limit meanwhile.
    """
    n, d = X.shape
    rows = max(1, PROJECT_BLOCK_BYTES // (8 * max(d, 1)))
    blocks = -(-n // rows)
    z: F64 = np.empty((n, V.shape[1]), dtype=np.float64)
    workers = worker_count(blocks)
    # the caller's np.errstate, its callback included: pool threads do not inherit it
    errors, callback = np.geterr(), np.geterrcall()

    def run(w: int) -> None:
        first, last = blocks * w // workers, blocks * (w + 1) // workers
        if first == last:
            return
        buf = np.empty((min(rows, n - first * rows), d), dtype=np.float64)
        with np.errstate(**errors), (nullcontext() if callback is None
                                     else np.errstate(call=callback)):
            for b in range(first, last):
                s, e = b * rows, min((b + 1) * rows, n)
                np.copyto(buf[: e - s], X[s:e], casting="unsafe")
                np.matmul(buf[: e - s], V, out=z[s:e])

    if workers == 1:
        run(0)
    else:
        with ThreadPoolExecutor(max_workers=workers) as pool:
            list(pool.map(run, range(workers)))
    return z


def class_map(fn: Callable[[int], R], n: int) -> list[R]:
    """``[fn(0), ..., fn(n − 1)]`` with one BLAS thread per call, the calls in a thread pool.

    For loops of independent per-class factorisations of size d ≈ 10³: numpy's LAPACK calls
    release the GIL (SciPy's wrappers hold it: prefer ``numpy.linalg`` in ``fn``), so
    :func:`worker_count` single-threaded calls use every core, where one call at a time
    with multi-threaded BLAS synchronises its threads at every block, which a loaded machine
    makes far slower.
    The first exception, in class order, is raised.
    """
    workers = worker_count(n)
    with one_blas_thread():
        if workers == 1:
            return [fn(c) for c in range(n)]
        with ThreadPoolExecutor(max_workers=workers) as pool:
            return list(pool.map(fn, range(n)))
