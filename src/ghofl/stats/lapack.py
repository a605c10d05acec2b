"""LAPACK factorisations (and BLAS updates) called without the GIL, for per-matrix work in threads.

SciPy's Python wrappers of LAPACK (``scipy.linalg.lapack``) hold the GIL while they run, so a
pool of threads each factorising a d ≈ 10³ matrix runs them one at a time. These helpers call
the same routines (SciPy's LAPACK and BLAS, through the function pointers its public Cython
APIs ``scipy.linalg.cython_lapack`` and ``cython_blas`` export) by :mod:`ctypes`, which releases
the GIL for the call: the threads' factorisations run on every core, each in place on a
Fortran-ordered float64 array, with the results SciPy's wrappers give.
"""

from __future__ import annotations

import ctypes
from functools import cache
from typing import Any

import numpy as np
from numpy.typing import NDArray

__all__ = ["load_lapack", "norm_inf_sym", "potrf", "sygst", "syrk", "trtri"]

F64 = NDArray[np.float64]
_P = ctypes.c_void_p


@cache
def _routine(name: str, nargs: int, blas: bool = False, restype: Any = None) -> Any:
    """The ctypes function of SciPy's LAPACK (``blas``: BLAS) routine ``name``.

    ``nargs`` pointer arguments; ``restype``: the ctypes type of its result (``None``: void).
    """
    if blas:
        import scipy.linalg.cython_blas as module
    else:
        import scipy.linalg.cython_lapack as module

    capsule = module.__pyx_capi__[name]  # type: ignore[attr-defined]
    get_name = ctypes.pythonapi.PyCapsule_GetName
    get_name.restype, get_name.argtypes = ctypes.c_char_p, [ctypes.py_object]
    get_pointer = ctypes.pythonapi.PyCapsule_GetPointer
    get_pointer.restype, get_pointer.argtypes = _P, [ctypes.py_object, ctypes.c_char_p]
    address = get_pointer(capsule, get_name(capsule))
    return ctypes.CFUNCTYPE(restype, *([_P] * nargs))(address)


def load_lapack() -> None:
    """Load SciPy's BLAS and LAPACK library now (it is otherwise loaded at the first call).

    ``threadpoolctl.threadpool_limits`` limits the libraries loaded when it is entered: a
    caller that limits the BLAS threads around these routines loads the library first, or
    its first factorisations run with every BLAS thread, one set per pool thread.
    """
    _routine("dpotrf", 5)


def _square_f64(a: F64, what: str) -> int:
    if not (a.dtype == np.float64 and a.ndim == 2 and a.shape[0] == a.shape[1]
            and a.flags.f_contiguous and a.flags.writeable):
        raise ValueError(f"{what} must be a writeable, Fortran-ordered, square float64 array; "
                         f"got dtype {a.dtype}, shape {a.shape}")
    return int(a.shape[0])


def _ref(v: Any) -> Any:
    return ctypes.byref(v)


def potrf(a: F64, lower: bool = True) -> int:
    """Cholesky factor of ``a`` (d, d) in place (LAPACK ``dpotrf``); returns LAPACK's info.

    ``a`` is a writeable Fortran-ordered float64 array; its ``lower`` (else upper) triangle is
    read and overwritten with the factor, the other triangle left as it was. info > 0: the
    leading minor of that order is not positive definite.
    """
    n = ctypes.c_int(_square_f64(a, "the matrix to factorise"))
    info = ctypes.c_int(0)
    uplo = ctypes.c_char(b"L" if lower else b"U")
    if n.value:
        _routine("dpotrf", 5)(_ref(uplo), _ref(n), a.ctypes.data, _ref(n), _ref(info))
    return int(info.value)


def trtri(a: F64, lower: bool = True) -> int:
    """Inverse of the triangular ``a`` (d, d) in place (LAPACK ``dtrtri``); returns info.

    Reads and overwrites the ``lower`` (else upper) triangle of the writeable Fortran-ordered
    float64 ``a``; the other triangle is left as it was. info > 0: a zero diagonal entry.
    """
    n = ctypes.c_int(_square_f64(a, "the triangular matrix to invert"))
    info = ctypes.c_int(0)
    uplo, diag = ctypes.c_char(b"L" if lower else b"U"), ctypes.c_char(b"N")
    if n.value:
        _routine("dtrtri", 6)(_ref(uplo), _ref(diag), _ref(n), a.ctypes.data, _ref(n),
                              _ref(info))
    return int(info.value)


def sygst(a: F64, chol_b: F64) -> int:
    """L⁻¹ A L⁻ᵀ into the lower triangle of ``a`` (d, d), B = L Lᵀ (LAPACK ``dsygst``, itype 1).

    ``a``: writeable, Fortran-ordered, symmetric float64, its lower triangle read and
    overwritten; ``chol_b``: the lower Cholesky factor L (d, d), Fortran-ordered (its lower
    triangle is read). Returns LAPACK's info.
    """
    n = ctypes.c_int(_square_f64(a, "the matrix to reduce"))
    if not (chol_b.dtype == np.float64 and chol_b.shape == a.shape and chol_b.flags.f_contiguous):
        raise ValueError(f"the factor must be a Fortran-ordered float64 array of shape {a.shape}; "
                         f"got dtype {chol_b.dtype}, shape {chol_b.shape}")
    info, itype = ctypes.c_int(0), ctypes.c_int(1)
    uplo = ctypes.c_char(b"L")
    if n.value:
        _routine("dsygst", 8)(_ref(itype), _ref(uplo), _ref(n), a.ctypes.data, _ref(n),
                              chol_b.ctypes.data, _ref(n), _ref(info))
    return int(info.value)


def syrk(c: F64, a: F64, alpha: float = -1.0, lower: bool = False) -> None:
    """``c += alpha · a aᵀ`` in the ``lower`` (else upper) triangle of ``c``, in place (``dsyrk``).

    ``c`` (d, d): writeable, Fortran-ordered float64; its other triangle is left as it was.
    ``a`` (d, k): Fortran-ordered float64.
    """
    n = ctypes.c_int(_square_f64(c, "the matrix to update"))
    if not (a.dtype == np.float64 and a.ndim == 2 and a.shape[0] == n.value
            and a.flags.f_contiguous):
        raise ValueError(f"the update must be a Fortran-ordered float64 array with {n.value} "
                         f"rows; got dtype {a.dtype}, shape {a.shape}")
    k = ctypes.c_int(a.shape[1])
    if n.value and k.value:
        uplo, trans = ctypes.c_char(b"L" if lower else b"U"), ctypes.c_char(b"N")
        lda = ctypes.c_int(max(1, n.value))
        al, beta = ctypes.c_double(alpha), ctypes.c_double(1.0)
        _routine("dsyrk", 10, blas=True)(_ref(uplo), _ref(trans), _ref(n), _ref(k), _ref(al),
                                         a.ctypes.data, _ref(lda), _ref(beta), c.ctypes.data,
                                         _ref(n))


def norm_inf_sym(a: F64, lower: bool = False) -> float:
    """Largest row sum of |entries| of the symmetric matrix held in one triangle of ``a``.

    LAPACK ``dlansy`` (norm ``"I"``), reading only the ``lower`` (else upper) triangle of the
    Fortran-ordered float64 ``a`` (d, d); NaN when an entry it reads is NaN. 0 for d = 0.
    """
    n = ctypes.c_int(_square_f64(a, "the symmetric matrix"))
    if not n.value:
        return 0.0
    work = np.empty(n.value)
    norm, uplo = ctypes.c_char(b"I"), ctypes.c_char(b"L" if lower else b"U")
    out = _routine("dlansy", 6, restype=ctypes.c_double)(
        _ref(norm), _ref(uplo), _ref(n), a.ctypes.data, _ref(n), work.ctypes.data)
    return float(out)
