"""The laws a ClientStats value obeys, and what its sums and differences refuse.

Validation (:func:`validate`: shapes, dtypes, finiteness, symmetry, non-negative counts and
sums of squares, empty classes, ``n_clipped``, then the second-moment laws of
:mod:`ghofl.stats._laws`), the float residue a difference may carry (:class:`Magnitude`),
and the checks of ``+`` and ``−`` (overflow, removing more than the left operand holds, sums
that do not cancel). The value itself is :mod:`ghofl.stats.client_stats.value`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np
from numpy.typing import NDArray

from ghofl.errors import StatsOverflowError, StatsValidationError
from ghofl.stats._laws import RESIDUE_RTOL, check_gram_laws, check_second_moment_laws
from ghofl.stats._threads import first_failing, thread_count
from ghofl.stats.meta import StatsMeta
from ghofl.stats.schema import ARRAY_NAMES, schema_for, sym_diagonal

if TYPE_CHECKING:
    from ghofl.stats.client_stats.packed import PackedStats
    from ghofl.stats.client_stats.value import ClientStats

F64 = NDArray[np.float64]
I64 = NDArray[np.int64]

__all__ = [
    "Magnitude", "check_array", "check_arrays_addable", "check_cancelled", "check_finite",
    "check_holdout_counts", "check_no_overflow", "check_removable", "validate",
    "zero_empty_classes",
]

_SYM_RTOL = 1e-9
#: Rows per strip of the symmetry check.
_SYM_STRIP = 64

@dataclass(frozen=True)
class Magnitude:
    """Upper bounds of the magnitudes a value of statistics was computed from.

    Float rounding of a sum or difference is of the order of ε times the magnitudes of its
    operands, and a chain of them carries the rounding of every step; when most of an entry
    cancels (a class that empties, a large client removed from a small rest) that residue can
    dwarf the entry. Each :class:`ClientStats` therefore carries, privately, the sum of the
    magnitudes of the payloads it was computed from (its own for a payload built directly, the
    sum of its operands' for ``a + b`` and ``a − b``), and validation of a difference accepts
    deviations up to :data:`RESIDUE_RTOL` times it on top of its usual tolerances.

    Attributes
    ----------
    first : float
        Bound on |A_c| entries.
    second : float
        Bound on second-moment entries: max_j Σ_c D_c[j] = max diag B, which bounds every
        entry of D_c, S_c and B (they are positive semi-definite).
    rounding : float
        Unit roundoff of the coarsest transport the values went through (2⁻²⁴ after float32
        transport, 0 for float64 all the way); ``first`` and ``second`` are then inflated to
        cover its rounding (:meth:`ClientStats.from_transport`).
    """

    first: float
    second: float
    rounding: float = 0.0

    @classmethod
    def own(cls, s: ClientStats | PackedStats) -> Magnitude:
        """The magnitudes of ``s`` itself (O(C·d))."""
        with np.errstate(over="ignore"):  # inf for values near the float range: no residue
            first = float(np.max(np.abs(s.sums), initial=0.0))
            if s.sq_sums is None and s.class_scatter is None:  # 'means', or 'gram': diag B
                b = s.scatter
                second = 0.0 if b is None else float(np.max(
                    np.abs(sym_diagonal(b, s.dim, packed=b.ndim == 1)), initial=0.0))
                return cls(first=first, second=second)
            return cls(
                first=first,
                second=float(np.max(np.abs(s.diag_sums).sum(axis=0), initial=0.0)),
            )

    def after_transport(self, rounding: float, dim: int) -> Magnitude:
        """These magnitudes inflated to cover rounding every entry to unit roundoff ``rounding``.

        Times max(1, 4·d·rounding / :data:`RESIDUE_RTOL`), so that the checks' residue
        tolerance covers a perturbation of 4·d·``rounding`` relative to the values
        (:meth:`ClientStats.from_transport`); ``rounding`` is recorded.
        """
        k = max(1.0, 4.0 * dim * rounding / RESIDUE_RTOL)
        return Magnitude(self.first * k, self.second * k, rounding)

    def __add__(self, other: Magnitude) -> Magnitude:
        return Magnitude(self.first + other.first, self.second + other.second,
                          max(self.rounding, other.rounding))

# ---------------------------------------------------------------------- validation
def validate(s: ClientStats | PackedStats, residue: Magnitude | None = None,
             check_symmetry: bool = True, arrays_checked: bool = False) -> None:
    """Check shapes, dtypes and the laws that sums of samples obey.

    ``residue``: magnitudes of the values the difference ``s`` was computed from, whose
    rounding the checks tolerate (``None`` for statistics built directly).
    ``check_symmetry``: False for matrices symmetric by construction (unpacked triangles).
    ``arrays_checked``: the arrays' shapes, dtypes and finiteness were checked already
    (:meth:`ClientStats.from_transport`); they are not checked again.
    :class:`~ghofl.stats.client_stats.packed.PackedStats` are checked with their symmetric
    matrices packed (shapes (C, d(d+1)/2) and (d(d+1)/2,); the laws read the triangles), and
    without ``check_symmetry``, which a triangle cannot break.
    """
    res = Magnitude(0.0, 0.0) if residue is None else residue
    c, d, mode = s.meta.num_classes, s.meta.dim, s.meta.mode
    schema = schema_for(mode)
    packed = s.packed
    for spec in schema.arrays:
        arr = getattr(s, spec.name)
        if arr is None:
            raise StatsValidationError(
                f"mode {mode!r} statistics must hold {spec.name}; it is missing"
            )
        if not arrays_checked:
            check_array(spec.name, arr, spec.packed_shape(c, d) if packed else spec.shape(c, d),
                        spec.dtype)
        if spec.symmetric and check_symmetry and not packed:
            _check_symmetric(spec.name, arr, RESIDUE_RTOL * res.second)
    for name in ARRAY_NAMES:
        if not schema.has(name) and getattr(s, name) is not None:
            raise StatsValidationError(
                f"mode {mode!r} statistics must not hold {name} (it belongs to another mode); "
                "pass None or change the mode"
            )
    if np.any(s.counts < 0):
        raise StatsValidationError(
            f"class counts must be non-negative; got {s.counts.min()} for class "
            f"{s.meta.classes[int(np.argmin(s.counts))]!r}"
        )
    _check_n_clipped(s)
    if s.sq_sums is None and s.class_scatter is None:  # 'means', 'gram': no D_c
        _check_empty_classes(s, s.sums)
        if s.scatter is not None:
            _check_gram(s, res)
        return
    diag = s.diag_sums
    if np.any(diag < -(_tol(diag) + RESIDUE_RTOL * res.second)):
        raise StatsValidationError(
            "sums of squares (D_c or diag S_c) must be non-negative; the payload is corrupt"
        )
    _check_empty_classes(s, s.sums, diag)
    check_second_moment_laws(s, diag, res.first, res.second)

def _check_gram(s: ClientStats | PackedStats, res: Magnitude) -> None:
    """The laws of a global second moment without per-class diagonals (mode ``gram``).

    diag B ≥ 0, B = 0 when no sample is held, and B − Σ_c A_c A_cᵀ/N_c ⪰ 0 (which implies
    Cauchy–Schwarz summed over the classes, diag B ≥ Σ_c A_c²/N_c).
    """
    assert s.scatter is not None
    diag = sym_diagonal(s.scatter, s.dim, packed=s.scatter.ndim == 1)
    if np.any(diag < -(_tol(diag) + RESIDUE_RTOL * res.second)):
        raise StatsValidationError(
            "the diagonal of B (sums of squares over all samples) must be non-negative; the "
            "payload is corrupt"
        )
    if s.n_samples == 0 and np.any(s.scatter != 0):
        raise StatsValidationError(
            "the statistics hold no sample but a non-zero B; the payload is corrupt"
        )
    check_gram_laws(s, res.second)


def _check_empty_classes(s: ClientStats | PackedStats, *arrays: F64) -> None:
    """Refuse a class with N_c = 0 and a non-zero entry in any of ``arrays`` (C, d)."""
    nonzero = np.zeros(s.meta.num_classes, dtype=bool)
    for arr in arrays:
        nonzero |= (arr != 0).any(axis=1)
    empty_with_sums = (s.counts == 0) & nonzero
    if np.any(empty_with_sums):
        cls = s.meta.classes[int(np.flatnonzero(empty_with_sums)[0])]
        raise StatsValidationError(
            f"class {cls!r} has zero samples but non-zero sums; the payload is corrupt"
        )

def _check_n_clipped(s: ClientStats | PackedStats) -> None:
    """0 ≤ n_clipped ≤ Σ_c N_c, and clipped samples need a recorded clipping bound."""
    n = s.n_clipped
    if isinstance(n, bool) or not isinstance(n, int | np.integer) or n < 0:
        raise StatsValidationError(
            f"n_clipped (the number of samples scaled down to the clipping bound) must be a "
            f"non-negative integer; got {n!r}; pass 0 when nothing was clipped"
        )
    total = sum(int(v) for v in s.counts)
    if total > np.iinfo(np.int64).max:
        raise StatsValidationError(
            f"the class counts add up to {total} samples, more than an int64 holds; the "
            "payload is corrupt"
        )
    if n > total:
        raise StatsValidationError(
            f"n_clipped is {n} but the statistics hold only {total} samples; at most every "
            "sample can be clipped, so the payload is corrupt"
        )
    if n > 0 and s.meta.clip_norm is None:
        raise StatsValidationError(
            f"n_clipped is {n} but meta.clip_norm is None: clipped statistics must record their "
            "clipping bound; set StatsMeta(clip_norm=R) or pass n_clipped=0"
        )

def check_array(name: str, arr: Any, shape: tuple[int, ...], dtype: np.dtype[Any],
                finite: bool = True) -> None:
    """Refuse ``arr`` unless it is a numpy array of ``shape`` and ``dtype``, finite if float.

    ``name`` is the array's name in the error (e.g. ``"sums"``); ``finite=False``: its
    finiteness was checked already (:func:`check_finite`), and is not checked again.
    """
    if not isinstance(arr, np.ndarray):
        raise StatsValidationError(f"{name} must be a numpy array; got {type(arr).__name__}")
    if arr.shape != shape:
        raise StatsValidationError(f"{name} must have shape {shape}; got {arr.shape}")
    if arr.dtype != dtype:
        raise StatsValidationError(
            f"{name} must have dtype {np.dtype(dtype).name}; got {arr.dtype.name}"
        )
    if finite:
        check_finite(name, arr)


def check_finite(name: str, arr: Any) -> None:
    """Refuse a float array ``arr`` holding NaN or ±inf (the message names it ``name``).

    One matrix (or, for a 2-D array, one row: e.g. one packed triangle) at a time.
    """
    if arr.dtype.kind == "f" and not _all_finite(arr if arr.ndim != 2 else arr[:, None, :]):
        raise StatsValidationError(
            f"{name} contains NaN or infinite values; the embeddings fed to the client were not "
            "finite, or the payload is corrupt"
        )

#: Entries from which :func:`_all_finite` spreads its matrices over threads.
_THREADED_ENTRIES = 1 << 24


def _all_finite(arr: F64) -> bool:
    """Whether every entry is finite, one matrix at a time (no full-size temporary).

    A large stack of matrices is checked on every core
    (:func:`~ghofl.stats._threads.first_failing`).
    """
    slabs = _slabs(arr)
    threads = thread_count(len(slabs)) if arr.size >= _THREADED_ENTRIES else 1
    return first_failing(len(slabs), lambda i, _: bool(np.isfinite(slabs[i]).all()),
                         lambda: None, threads) is None


def _tol(a: F64) -> float:
    return 1e-9 * (1.0 + float(np.max(np.abs(a), initial=0.0)))

def _check_symmetric(name: str, m: F64, atol: float = 0.0) -> None:
    """Refuse matrices (..., d, d) whose largest |M − Mᵀ| exceeds the tolerance.

    The tolerance is ``atol`` plus the relative one. The matrices are compared in strips of
    :data:`_SYM_STRIP` rows, one matrix at a time (no temporary beyond a strip).
    """
    mats = m.reshape(-1, m.shape[-2], m.shape[-1])
    dev, peak = 0.0, 0.0
    for a in mats:
        peak = max(peak, float(np.max(a, initial=0.0)), -float(np.min(a, initial=0.0)))
        for i0 in range(0, a.shape[0], _SYM_STRIP):  # rows i0:i1 right of the diagonal block
            i1 = min(i0 + _SYM_STRIP, a.shape[0])  # against columns i0:i1 below it
            diff = a[i0:i1, i0:] - a[i0:, i0:i1].T
            dev = max(dev, float(np.max(np.abs(diff, out=diff), initial=0.0)))
    if dev > atol + _SYM_RTOL * (1.0 + peak):
        raise StatsValidationError(
            f"{name} must be symmetric; its largest asymmetry is {dev:.3g}; the payload is corrupt"
        )

# ---------------------------------------------------------------------- sums and differences
#: Magnitudes below which a sum of two values cannot overflow float64 (a wide margin over
#: the rounding of the bounds).
_SAFE_MAGNITUDE = float(np.finfo(np.float64).max) / 4.0

def check_arrays_addable(arrays: dict[str, Any], n_clipped: int, magnitude: Magnitude,
                         b: ClientStats | PackedStats) -> None:
    """Refuse ``a + b`` (``a`` given by its arrays) when it would overflow.

    That is, when its int64 counts would wrap or its floats overflow to inf; checked before
    anything is added.

    The floats are safe without looking at them when the magnitude bounds of both operands
    (which bound every entry: |A_c| by ``first``, second moments by ``second``) add up to far
    below the float64 range; otherwise the sums are computed one slab at a time into a
    scratch buffer and checked.
    """
    _check_counts_addable(arrays["counts"], n_clipped, b.counts, b.n_clipped)
    m = b._magnitude
    if (magnitude.first + m.first < _SAFE_MAGNITUDE
            and magnitude.second + m.second < _SAFE_MAGNITUDE):
        return
    for name, arr in arrays.items():
        if arr.dtype.kind != "f":
            continue
        other = getattr(b, name)
        for x, y in zip(_slabs(arr), _slabs(other), strict=True):
            with np.errstate(over="ignore", invalid="ignore"):
                finite = bool(np.all(np.isfinite(np.add(x, y))))
            if not finite:
                raise StatsOverflowError(_float_overflow_message(name))

def check_no_overflow(a: ClientStats, b: ClientStats, arrays: dict[str, Any]) -> None:
    """Refuse a sum whose int64 counts wrapped or whose floats overflowed to inf."""
    _check_counts_addable(a.counts, a.n_clipped, b.counts, b.n_clipped)
    for name, arr in arrays.items():
        if arr.dtype.kind == "f" and not all(np.all(np.isfinite(x)) for x in _slabs(arr)):
            raise StatsOverflowError(_float_overflow_message(name))

def _slabs(arr: Any) -> Any:
    """The array in pieces of at most one matrix (for checks without a full-size temporary)."""
    return arr if arr.ndim == 3 else (arr,)

def _check_counts_addable(a_counts: I64, a_clipped: int, b_counts: I64, b_clipped: int) -> None:
    limit = np.iinfo(np.int64).max
    if (np.any(a_counts > limit - b_counts) or a_clipped > limit - b_clipped
            or sum(int(v) for v in a_counts) + sum(int(v) for v in b_counts) > limit):
        raise StatsOverflowError(
            f"adding these statistics overflows the int64 sample counts (more than {limit} "
            "samples in a class): a payload declares impossible counts, so it is corrupt; "
            "remove it from the aggregation"
        )

def _float_overflow_message(name: str) -> str:
    return (
        f"adding these statistics overflows float64 in {name} (a sum exceeds "
        "1.8e308): a payload holds values too large to aggregate; it is corrupt, or "
        "its embeddings must be rescaled (or clipped) on the clients"
    )

def check_removable(left: ClientStats, right: ClientStats, where: str) -> None:
    """Counts and n_clipped of ``right`` must not exceed those of ``left`` (``left − right``)."""
    if np.any(right.counts > left.counts):
        bad = np.flatnonzero(right.counts > left.counts)
        raise StatsValidationError(
            f"cannot subtract statistics holding more samples than the left operand: {where}"
            f"class {left.meta.classes[bad[0]]!r} has {left.counts[bad[0]]} on the left and "
            f"{right.counts[bad[0]]} on the right"
        )
    if right.n_clipped > left.n_clipped:
        raise StatsValidationError(
            "cannot subtract statistics holding more clipped samples than the left operand: "
            f"{where}n_clipped is {left.n_clipped} on the left and {right.n_clipped} on the right"
        )

def check_holdout_counts(s: ClientStats, h: ClientStats) -> None:
    """Refuse a held-out section ``h`` holding more samples (per class, or clipped) than ``s``."""
    if np.any(h.counts > s.counts):
        bad = int(np.flatnonzero(h.counts > s.counts)[0])
        raise StatsValidationError(
            f"the held-out section holds {h.counts[bad]} samples of class "
            f"{s.meta.classes[bad]!r} but the totals hold only {s.counts[bad]}; held-out "
            "samples are a subset of all samples, so the payload is corrupt"
        )
    if h.n_clipped > s.n_clipped:
        raise StatsValidationError(
            f"the held-out section has n_clipped {h.n_clipped} but the totals only "
            f"{s.n_clipped}; the payload is corrupt"
        )

def zero_empty_classes(meta: StatsMeta, arrays: dict[str, Any]) -> dict[str, Any]:
    """Zero, in place, the sums of classes left with no sample after exact subtraction.

    Classes with N_c = 0 must hold exactly zero sums: zero the per-class rows (arrays whose
    first axis is ``C``) of those classes, and every float array when no sample is left at all
    (B = Σ x xᵀ over no sample is 0).
    """
    empty = arrays["counts"] == 0
    if np.any(empty):
        nothing_left = bool(np.all(empty))
        for spec in schema_for(meta.mode).float_arrays:
            if nothing_left:
                arrays[spec.name][...] = 0.0
            elif spec.axes[0] == "C":
                arrays[spec.name][empty] = 0.0
    return arrays

def check_cancelled(meta: StatsMeta, arrays: dict[str, Any], residue: Magnitude) -> None:
    """Refuse a difference in which a class lost all its samples but not its sums.

    Such a right operand was not part of the left (only float residue may be left to zero).
    """
    empty = arrays["counts"] == 0
    if not np.any(empty):
        return
    sums = arrays["sums"]
    left = (np.abs(sums) > RESIDUE_RTOL * residue.first).any(axis=1)
    diag = arrays.get("sq_sums")
    if diag is None and "class_scatter" in arrays:
        diag = np.diagonal(arrays["class_scatter"], axis1=1, axis2=2)
    if diag is not None:  # modes 'means' and 'gram' hold no per-class second moment
        left |= (np.abs(diag) > RESIDUE_RTOL * residue.second).any(axis=1)
    elif "scatter" in arrays and np.all(empty):  # 'gram' with nothing left: B must cancel
        left |= bool(np.any(np.abs(np.diagonal(arrays["scatter"]))
                            > RESIDUE_RTOL * residue.second))
    bad = np.flatnonzero(empty & left)
    if bad.size:
        raise StatsValidationError(
            f"cannot subtract these statistics: class {meta.classes[int(bad[0])]!r} has no "
            "sample left but its sums do not cancel, so the right operand was not part of the "
            "left one; subtract only statistics that were added to the total"
        )
