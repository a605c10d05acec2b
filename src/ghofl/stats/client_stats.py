"""ClientStats: the additive, validated, mergeable value a client uploads once.

Holds sums and counts only (never means): per-class counts N_c, first moments A_c = Σ x,
and, by upload mode (method.md §1):

* ``full``   — per-class second moments S_c = Σ x xᵀ (B = Σ_c S_c and D_c = diag S_c derived);
* ``pooled`` — per-class diagonals D_c = Σ x⊙x and the global B = Σ x xᵀ;
* ``diag``   — per-class diagonals D_c only.

All arrays are float64 (counts int64) and read-only. Which arrays a mode holds, their shapes
and how modes convert are defined once, in :mod:`ghofl.stats.schema`.

Held-out section: when ``meta.holdout_fraction`` is f > 0 the value also carries
:attr:`ClientStats.holdout`, the same sums over the samples the client held out (a seeded
per-sample split, :func:`~ghofl.stats.accumulate.holdout_mask`). The main arrays always hold
the sums over ALL samples; :meth:`ClientStats.fitting_part` is total − held-out. Addition,
subtraction, mode conversion, flattening and the file format act on both sections.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from numpy.typing import NDArray

from ghofl.errors import (
    IncompatibleStatsError,
    StatsOverflowError,
    StatsValidationError,
    UnsupportedModeError,
)
from ghofl.stats._laws import RESIDUE_RTOL, check_second_moment_laws
from ghofl.stats.meta import Mode, StatsMeta
from ghofl.stats.schema import ARRAY_NAMES, schema_for

F64 = NDArray[np.float64]
I64 = NDArray[np.int64]

_SYM_RTOL = 1e-9
#: Rows per strip of the symmetry check.
_SYM_STRIP = 64


@dataclass(frozen=True, eq=False)
class ClientStats:
    """Sufficient statistics of one client (or of an aggregate of clients).

    Parameters
    ----------
    meta : StatsMeta
        Mode, dimension, class names, encoder and projection.
    counts : ndarray of int64, shape (C,)
        N_c, samples per class.
    sums : ndarray of float64, shape (C, d)
        A_c = Σ_{y=c} x.
    sq_sums : ndarray of float64, shape (C, d), or None
        D_c = Σ_{y=c} x⊙x; stored in ``pooled`` and ``diag`` modes, ``None`` in ``full``.
    class_scatter : ndarray of float64, shape (C, d, d), or None
        S_c = Σ_{y=c} x xᵀ; stored in ``full`` mode only.
    scatter : ndarray of float64, shape (d, d), or None
        B = Σ x xᵀ; stored in ``pooled`` mode only.
    n_clipped : int, default 0
        Number of samples whose norm exceeded the clipping bound ``meta.clip_norm`` and were
        scaled down to it; additive like the counts, 0 ≤ n_clipped ≤ Σ_c N_c.
    holdout : ClientStats or None
        The held-out section: statistics of the held-out samples only (a subset of the
        samples the main arrays sum over), in the same mode; its metadata is ``meta`` with
        ``holdout_fraction`` 0.0 (:meth:`StatsMeta.without_holdout`) and it has no held-out
        section of its own. Required exactly when ``meta.holdout_fraction > 0``. Validation
        checks it as statistics of its own, its counts (and n_clipped) against the totals per
        class, and that total − held-out (:meth:`fitting_part`) is valid statistics too.
    """

    meta: StatsMeta
    counts: I64
    sums: F64
    sq_sums: F64 | None = None
    class_scatter: F64 | None = None
    scatter: F64 | None = None
    n_clipped: int = 0
    holdout: ClientStats | None = None
    _magnitude: _Magnitude = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        _validate(self)
        object.__setattr__(self, "n_clipped", int(self.n_clipped))
        for name in ARRAY_NAMES:
            arr = getattr(self, name)
            if arr is not None:
                arr.setflags(write=False)
        object.__setattr__(self, "_magnitude", _Magnitude.own(self))
        _validate_holdout(self)

    # ------------------------------------------------------------------ construction
    @classmethod
    def zeros(cls, meta: StatsMeta) -> ClientStats:
        """Return the identity of ``+`` for ``meta``: a client with no samples.

        The held-out section is present and empty when ``meta.holdout_fraction > 0``.
        """
        arrays: dict[str, Any] = schema_for(meta.mode).zeros(meta.num_classes, meta.dim)
        holdout = cls.zeros(meta.without_holdout()) if meta.has_holdout else None
        return cls(meta, holdout=holdout, **arrays)

    @classmethod
    def _trusted(
        cls,
        meta: StatsMeta,
        counts: I64,
        sums: F64,
        sq_sums: F64 | None = None,
        class_scatter: F64 | None = None,
        scatter: F64 | None = None,
        n_clipped: int = 0,
        magnitude: _Magnitude | None = None,
        holdout: ClientStats | None = None,
    ) -> ClientStats:
        """Build without re-validating (for results of exact operations on valid values).

        ``magnitude``: of the operands the value was computed from (default: its own).
        """
        obj = object.__new__(cls)
        for name, val in (
            ("meta", meta),
            ("counts", counts),
            ("sums", sums),
            ("sq_sums", sq_sums),
            ("class_scatter", class_scatter),
            ("scatter", scatter),
            ("n_clipped", int(n_clipped)),
            ("holdout", holdout),
        ):
            if isinstance(val, np.ndarray):
                val.setflags(write=False)
            object.__setattr__(obj, name, val)
        object.__setattr__(obj, "_magnitude", magnitude or _Magnitude.own(obj))
        return obj

    @classmethod
    def from_transport(
        cls,
        meta: StatsMeta,
        arrays: dict[str, Any],
        n_clipped: int = 0,
        holdout: ClientStats | None = None,
        rounding: float = 0.0,
        unpacked: bool = False,
    ) -> ClientStats:
        """Build and validate statistics whose float arrays were rounded in transport.

        The client's float arrays went through e.g. float32, with relative error at most
        ``rounding`` per entry.

        With ``rounding = 0`` this is ``ClientStats(meta, n_clipped=..., holdout=...,
        **arrays)``. Otherwise the checks (symmetry, Cauchy–Schwarz, positive
        semi-definiteness, diag B = Σ D_c, and later differences such as
        :meth:`fitting_part`) tolerate a perturbation of 4·d·``rounding`` relative to the
        magnitude of the values, which bounds the effect of rounding every entry.

        Parameters
        ----------
        meta : StatsMeta
        arrays : dict of str to ndarray
            The mode's arrays by name (float64 after upcasting).
        n_clipped : int, default 0
        holdout : ClientStats, optional
            The held-out section (built by this method too).
        rounding : float, default 0.0
            Unit roundoff of the transport dtype (2⁻²⁴ for float32).
        unpacked : bool, default False
            The symmetric arrays were rebuilt from their upper triangles
            (:func:`~ghofl.stats.schema.unpack_upper`), so they are symmetric by
            construction and not compared with their transposes (every other check runs).
        """
        if rounding <= 0.0 and not unpacked:
            return cls(meta, n_clipped=n_clipped, holdout=holdout, **arrays)
        for name, arr in arrays.items():  # dtypes, shapes and finiteness before anything else
            _check_array(name, arr, schema_for(meta.mode).spec(name).shape(meta.num_classes,
                                                                          meta.dim),
                         schema_for(meta.mode).spec(name).dtype)
        obj = cls._trusted(meta, n_clipped=n_clipped, holdout=holdout, **arrays)
        magnitude: _Magnitude | None = None
        if rounding > 0.0:
            k = max(1.0, 4.0 * meta.dim * rounding / _RESIDUE_RTOL)
            own = obj._magnitude
            magnitude = _Magnitude(own.first * k, own.second * k, rounding)
            object.__setattr__(obj, "_magnitude", magnitude)
        _validate(obj, magnitude, check_symmetry=not unpacked)
        _validate_holdout(obj)
        return obj

    # ------------------------------------------------------------------ shape facts
    @property
    def mode(self) -> Mode:
        """Upload mode (``meta.mode``)."""
        return self.meta.mode

    @property
    def num_classes(self) -> int:
        """Number of classes C (``meta.num_classes``)."""
        return self.meta.num_classes

    @property
    def dim(self) -> int:
        """Embedding dimension d (``meta.dim``)."""
        return self.meta.dim

    @property
    def n_samples(self) -> int:
        """Total number of samples: the sum of the class counts."""
        return int(self.counts.sum())

    @property
    def diag_sums(self) -> F64:
        """D_c, shape (C, d): stored, or diag(S_c) in ``full`` mode."""
        if self.sq_sums is not None:
            return self.sq_sums
        if self.class_scatter is None:
            raise UnsupportedModeError(
                "these are mode 'means' statistics (class counts and sums only): they hold no "
                "sums of squares D_c; recompute the client statistics with --mode diag or richer"
            )
        return np.ascontiguousarray(np.diagonal(self.class_scatter, axis1=1, axis2=2))

    @property
    def total_scatter(self) -> F64 | None:
        """B = Σ x xᵀ, shape (d, d): stored, Σ_c S_c in ``full`` mode, ``None`` in ``diag``."""
        if self.scatter is not None:
            return self.scatter
        if self.class_scatter is not None:
            return np.asarray(self.class_scatter.sum(axis=0))
        return None

    def arrays(self) -> dict[str, Any]:
        """The stored arrays by field name (``None`` for the ones this mode does not hold).

        The main section only; the held-out one is ``self.holdout.arrays()``.
        """
        return {name: getattr(self, name) for name in ARRAY_NAMES}

    # ------------------------------------------------------------------ held-out section
    @property
    def rounding(self) -> float:
        """Unit roundoff of the coarsest transport these sums went through.

        That includes any payload added into them: 2⁻²⁴ after float32 transport, 0.0 for
        float64 all the way. Files and stores record it so that re-reading them tolerates that
        rounding.
        """
        return self._magnitude.rounding

    @property
    def holdout_fraction(self) -> float:
        """``meta.holdout_fraction`` (0.0: no held-out section)."""
        return self.meta.holdout_fraction

    def without_holdout(self) -> ClientStats:
        """The sums over all samples without the held-out section (metadata fraction 0.0).

        Statistics of clients that held out different fractions combine after this (and
        heads that do not use held-out data see plain statistics).
        """
        if self.holdout is None:
            return self
        arrays: dict[str, Any] = {name: getattr(self, name) for name in schema_for(self.mode).names}
        return ClientStats._trusted(
            self.meta.without_holdout(), n_clipped=self.n_clipped, magnitude=self._magnitude,
            **arrays,
        )

    def fitting_part(self) -> ClientStats:
        """Total − held-out: the statistics of the samples that were not held out.

        Returns
        -------
        ClientStats
            Metadata :meth:`StatsMeta.without_holdout`, no held-out section; classes whose
            samples were all held out have N_c = 0 and zero sums (validated; the float residue
            of the difference is tolerated as in ``a − b``).

        Raises
        ------
        StatsValidationError
            There is no held-out section, or it is not a part of the totals.
        """
        if self.holdout is None:
            raise StatsValidationError(
                "these statistics have no held-out section (holdout_fraction is 0); compute "
                "them with holdout_fraction > 0 (ghofl client-stats --holdout 0.2) to fit on "
                "one part and score on the other"
            )
        cached: ClientStats | None = self.__dict__.get("_fitting")
        if cached is not None:  # immutable value: computed (and validated) once
            return cached
        try:
            fit = self.without_holdout() - self.holdout
        except StatsValidationError as exc:
            raise StatsValidationError(
                f"the held-out section is not a part of the totals (total − held-out is not "
                f"valid statistics: {exc}); the payload is corrupt"
            ) from exc
        object.__setattr__(self, "_fitting", fit)
        return fit

    # ------------------------------------------------------------------ algebra
    def check_compatible(self, other: ClientStats) -> None:
        """Raise :class:`IncompatibleStatsError` naming every field in which ``other`` differs."""
        _check_compatible(self.meta, other)

    def __add__(self, other: ClientStats) -> ClientStats:
        self.check_compatible(other)
        return self._combine(other, 1)

    def __radd__(self, other: object) -> ClientStats:
        if isinstance(other, int) and other == 0:  # support builtin sum()
            return self
        return NotImplemented

    def __sub__(self, other: ClientStats) -> ClientStats:
        """Exact removal of ``other`` (e.g. a client that withdraws). Counts must stay >= 0."""
        self.check_compatible(other)
        _check_removable(self, other, "")
        if self.holdout is not None and other.holdout is not None:
            _check_removable(self.holdout, other.holdout, "in the held-out section: ")
        return self._combine(other, -1)

    def _combine(self, other: ClientStats, sign: int) -> ClientStats:
        op = np.add if sign > 0 else np.subtract
        with np.errstate(over="ignore", invalid="ignore"):  # overflow is checked below
            arrays = self._apply(op, other)
        holdout = None
        if self.holdout is not None and other.holdout is not None:
            holdout = self.holdout._combine(other.holdout, sign)
        return self._finish(other, sign, arrays, holdout)

    def _apply(self, op: Any, other: ClientStats) -> dict[str, Any]:
        return {
            name: op(getattr(self, name), getattr(other, name))
            for name in schema_for(self.mode).names
        }

    def _finish(self, other: ClientStats, sign: int, arrays: dict[str, Any],
                holdout: ClientStats | None = None) -> ClientStats:
        n_clipped = self.n_clipped + sign * other.n_clipped
        magnitude = self._magnitude + other._magnitude
        if sign > 0:  # sums of validated payloads are valid by construction, unless they overflow
            _check_no_overflow(self, other, arrays)
            return ClientStats._trusted(
                self.meta, n_clipped=n_clipped, magnitude=magnitude, holdout=holdout, **arrays
            )
        # Removal is re-validated. Classes left empty must hold exactly zero sums: what remains
        # there is float residue, checked to be residue and zeroed BEFORE validating. The checks
        # then tolerate the rounding the difference inherits from the values it came from.
        _check_cancelled(self.meta, arrays, magnitude)
        result = ClientStats._trusted(
            self.meta, n_clipped=n_clipped, magnitude=magnitude, holdout=holdout,
            **_zero_empty_classes(self.meta, arrays),
        )
        _validate(result, magnitude)
        if holdout is not None:
            _check_holdout_counts(result, holdout)
        return result

    def allclose(self, other: ClientStats, rtol: float = 1e-10, atol: float = 0.0) -> bool:
        """Equality with tolerance.

        Same metadata, identical counts, arrays within ``rtol`` relative to each array's
        largest magnitude (plus ``atol``).
        """
        if self.meta.differences(other.meta) or not np.array_equal(self.counts, other.counts):
            return False
        if self.n_clipped != other.n_clipped:
            return False
        if (self.holdout is None) != (other.holdout is None):
            return False
        if self.holdout is not None and other.holdout is not None and not (
            self.holdout.allclose(other.holdout, rtol=rtol, atol=atol)
        ):
            return False
        for name, a in self.arrays().items():
            b = other.arrays()[name]
            if (a is None) != (b is None):
                return False
            if a is None or name == "counts":
                continue
            scale = max(
                float(np.max(np.abs(a), initial=0.0)), float(np.max(np.abs(b), initial=0.0))
            )
            if float(np.max(np.abs(a - b), initial=0.0)) > atol + rtol * scale:
                return False
        return True

    def to_mode(self, mode: Mode) -> ClientStats:
        """Convert to a lower upload mode (``full`` → ``pooled`` → ``diag``); exact.

        Each array of the target mode is read from its schema ``source`` attribute (e.g.
        ``sq_sums`` from :attr:`diag_sums`, ``scatter`` from :attr:`total_scatter`).
        """
        target = schema_for(mode)
        if not schema_for(self.mode).supports(target.mode):
            raise StatsValidationError(
                f"cannot convert statistics from mode {self.mode!r} to the richer mode {mode!r}: "
                "the missing second moments were never collected; recompute them on the client"
            )
        if target.mode == self.mode:
            return self
        arrays: dict[str, Any] = {
            spec.name: np.array(getattr(self, spec.source)) for spec in target.arrays
        }
        holdout = None if self.holdout is None else self.holdout.to_mode(mode)
        out = ClientStats._trusted(
            self.meta.with_mode(target.mode), n_clipped=self.n_clipped, holdout=holdout,
            **arrays,
        )
        _validate(out, self._magnitude)  # exact conversion of a valid value: a cheap recheck
        object.__setattr__(out, "_magnitude", self._magnitude)  # same values, same history
        return out

    def __repr__(self) -> str:
        held = "" if self.holdout is None else (
            f", holdout_fraction={self.holdout_fraction:g}, n_holdout={self.holdout.n_samples}"
        )
        return (
            f"ClientStats(mode={self.mode!r}, dim={self.dim}, classes={self.num_classes}, "
            f"n={self.n_samples}{held})"
        )


def sum_stats(items: Iterable[ClientStats]) -> ClientStats:
    """Add statistics one at a time, in place (:class:`StatsTotal`).

    The memory is the running total plus the payload being added, however many there are.

    Equal, bit for bit, to ``items[0] + items[1] + ...`` added left to right.

    Raises
    ------
    StatsValidationError
        ``items`` is empty.
    IncompatibleStatsError, StatsOverflowError
        As :meth:`StatsTotal.add`, naming the 0-based index of the offending payload.
    """
    total = StatsTotal()
    for s in items:
        total.add(s)
    return total.result()


class StatsTotal:
    """Running total of payloads added in place: bounded-memory server aggregation.

    The first payload is copied once; every later one is added into that copy (``numpy.add``
    with ``out=``), so aggregating any number of payloads holds the total and the payload being
    added, never the intermediate sums ``a + b`` allocates (a third payload's worth at C = 200,
    d = 1280 in mode ``full``: 2.6 GB). The payloads are never modified. The result equals,
    bit for bit, the left-to-right sum ``p0 + p1 + ...`` (same additions, same order).

    Every payload is checked as ``+`` checks it: same metadata (:class:`IncompatibleStatsError`
    naming every difference) and no overflow (:class:`StatsOverflowError`); a refused payload
    leaves the total unchanged, so the caller may skip it and go on. The sum of valid payloads
    is valid by construction, so the total is not re-validated.

    Examples
    --------
    >>> total = StatsTotal()
    >>> for payload in payloads:          # doctest: +SKIP
    ...     total.add(payload)
    >>> aggregate = total.result()        # doctest: +SKIP
    """

    def __init__(self) -> None:
        self._count = 0
        self._meta: StatsMeta | None = None
        self._arrays: dict[str, Any] = {}
        self._n_clipped = 0
        self._magnitude = _Magnitude(0.0, 0.0)
        self._holdout: StatsTotal | None = None
        self._result: ClientStats | None = None  # shares the arrays: copy them before an add

    def __len__(self) -> int:
        """Number of payloads added."""
        return self._count

    @property
    def meta(self) -> StatsMeta | None:
        """Metadata of the total (``None`` before the first payload)."""
        return self._meta

    def add(self, stats: ClientStats) -> None:
        """Add one payload to the total (in place; ``stats`` is not modified).

        Raises
        ------
        IncompatibleStatsError
            ``stats`` is not :class:`ClientStats` or its metadata differs from the total's;
            the message starts with ``payload #i (0-based)`` and names every difference.
        StatsOverflowError
            The sum would overflow the int64 counts or float64 sums; the total is unchanged.
        """
        i = self._count
        try:
            _check_compatible(self._meta, stats)
        except IncompatibleStatsError as exc:
            raise IncompatibleStatsError(f"payload #{i} (0-based): {exc}") from exc
        if self._meta is None:
            self._start(stats)
            self._count = 1
            return
        try:
            self._check_addable(stats)
        except StatsOverflowError as exc:
            raise StatsOverflowError(
                f"cannot add payload #{i} (0-based) to the total of the payloads before it: {exc}"
            ) from exc
        self._add(stats)
        self._count += 1

    def result(self) -> ClientStats:
        """The total as :class:`ClientStats`.

        No copy, and the same object until the next :meth:`add`, which copies the arrays
        first, so a result never changes.

        Raises
        ------
        StatsValidationError
            No payload was added.
        """
        if self._meta is None:
            raise StatsValidationError(
                "cannot sum an empty collection of statistics; give at least one"
            )
        if self._result is None:
            holdout = None if self._holdout is None else self._holdout.result()
            self._result = ClientStats._trusted(
                self._meta, n_clipped=self._n_clipped, magnitude=self._magnitude,
                holdout=holdout, **self._arrays,
            )
        return self._result

    # ------------------------------------------------------------------ internals
    def _start(self, s: ClientStats) -> None:
        self._meta = s.meta
        self._arrays = {name: np.array(getattr(s, name)) for name in schema_for(s.mode).names}
        self._n_clipped = s.n_clipped
        self._magnitude = s._magnitude
        if s.holdout is not None:
            self._holdout = StatsTotal()
            self._holdout._start(s.holdout)

    def _check_addable(self, s: ClientStats) -> None:
        _check_addable(self._arrays, self._n_clipped, self._magnitude, s)
        if self._holdout is not None and s.holdout is not None:
            self._holdout._check_addable(s.holdout)

    def _add(self, s: ClientStats) -> None:
        if self._result is not None:
            self._own()
        for name, arr in self._arrays.items():
            np.add(arr, getattr(s, name), out=arr)
        self._n_clipped += s.n_clipped
        self._magnitude = self._magnitude + s._magnitude
        if self._holdout is not None and s.holdout is not None:
            self._holdout._add(s.holdout)

    def _own(self) -> None:
        self._arrays = {name: np.array(arr) for name, arr in self._arrays.items()}
        self._result = None
        if self._holdout is not None:
            self._holdout._own()


def check_addable(total: ClientStats, other: ClientStats) -> None:
    """Raise what ``total + other`` would raise, without computing the sum (no allocation).

    Raises
    ------
    IncompatibleStatsError
        The metadata differ (the message names every difference).
    StatsOverflowError
        The sum would overflow the int64 counts or the float64 sums.
    """
    _check_compatible(total.meta, other)
    arrays = {name: getattr(total, name) for name in schema_for(total.mode).names}
    _check_addable(arrays, total.n_clipped, total._magnitude, other)
    if total.holdout is not None and other.holdout is not None:
        check_addable(total.holdout, other.holdout)


def _check_compatible(meta: StatsMeta | None, other: object) -> None:
    """Raise :class:`IncompatibleStatsError` unless ``other`` is compatible with ``meta``.

    ``other`` must be :class:`ClientStats` with metadata ``meta``; the error names every field
    in which it differs.
    """
    if not isinstance(other, ClientStats):
        raise IncompatibleStatsError(
            f"can only combine ClientStats with ClientStats; got {type(other).__name__}"
        )
    diffs = [] if meta is None else meta.differences(other.meta)
    if diffs:
        raise IncompatibleStatsError(
            "cannot combine these statistics because they differ in "
            + "; ".join(diffs)
            + ". Every client must use the same encoder, projection, class list, clipping "
            "bound and upload mode (convert with ClientStats.to_mode to a common, lower mode "
            "if needed)."
        )


#: Magnitudes below which a sum of two values cannot overflow float64 (a wide margin over
#: the rounding of the bounds).
_SAFE_MAGNITUDE = float(np.finfo(np.float64).max) / 4.0


def _check_addable(arrays: dict[str, Any], n_clipped: int, magnitude: _Magnitude,
                   b: ClientStats) -> None:
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


def _check_removable(left: ClientStats, right: ClientStats, where: str) -> None:
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


def _validate_holdout(s: ClientStats) -> None:
    """Validate the held-out section of ``s``.

    It must be present exactly when ``meta.holdout_fraction > 0``, be statistics with the
    metadata :meth:`StatsMeta.without_holdout`, hold at most the totals' samples per class,
    and be a part of them (total − held-out is valid statistics).
    """
    h = s.holdout
    if s.meta.has_holdout and h is None:
        raise StatsValidationError(
            f"meta.holdout_fraction is {s.meta.holdout_fraction:g} but the statistics have no "
            "held-out section; pass holdout=<statistics of the held-out samples>, or set "
            "holdout_fraction 0"
        )
    if h is None:
        return
    if not s.meta.has_holdout:
        raise StatsValidationError(
            "the statistics have a held-out section but meta.holdout_fraction is 0; set the "
            "fraction the client held out in StatsMeta(holdout_fraction=f), or pass holdout=None"
        )
    if not isinstance(h, ClientStats):
        raise StatsValidationError(
            f"the held-out section must be ClientStats; got {type(h).__name__}"
        )
    if h.holdout is not None:
        raise StatsValidationError(
            "the held-out section must not have a held-out section of its own; its metadata "
            "must have holdout_fraction 0"
        )
    diffs = s.meta.without_holdout().differences(h.meta)
    if diffs:
        raise StatsValidationError(
            "the held-out section's metadata must equal the statistics' metadata with "
            "holdout_fraction 0 (StatsMeta.without_holdout()); it differs in " + "; ".join(diffs)
        )
    _check_holdout_counts(s, h)
    s.fitting_part()  # raises StatsValidationError when total − held-out is not valid


def _check_holdout_counts(s: ClientStats, h: ClientStats) -> None:
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


def _zero_empty_classes(meta: StatsMeta, arrays: dict[str, Any]) -> dict[str, Any]:
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


def _check_cancelled(meta: StatsMeta, arrays: dict[str, Any], residue: _Magnitude) -> None:
    """Refuse a difference in which a class lost all its samples but not its sums.

    Such a right operand was not part of the left (only float residue may be left to zero).
    """
    empty = arrays["counts"] == 0
    if not np.any(empty):
        return
    sums = arrays["sums"]
    left = (np.abs(sums) > _RESIDUE_RTOL * residue.first).any(axis=1)
    diag = arrays.get("sq_sums")
    if diag is None and "class_scatter" in arrays:
        diag = np.diagonal(arrays["class_scatter"], axis1=1, axis2=2)
    if diag is not None:  # mode 'means' holds no second moment
        left |= (np.abs(diag) > _RESIDUE_RTOL * residue.second).any(axis=1)
    bad = np.flatnonzero(empty & left)
    if bad.size:
        raise StatsValidationError(
            f"cannot subtract these statistics: class {meta.classes[int(bad[0])]!r} has no "
            "sample left but its sums do not cancel, so the right operand was not part of the "
            "left one; subtract only statistics that were added to the total"
        )


#: Float residue a difference may carry, relative to the magnitudes it was computed from.
_RESIDUE_RTOL = RESIDUE_RTOL


@dataclass(frozen=True)
class _Magnitude:
    """Upper bounds of the magnitudes a value of statistics was computed from.

    Float rounding of a sum or difference is of the order of ε times the magnitudes of its
    operands, and a chain of them carries the rounding of every step; when most of an entry
    cancels (a class that empties, a large client removed from a small rest) that residue can
    dwarf the entry. Each :class:`ClientStats` therefore carries, privately, the sum of the
    magnitudes of the payloads it was computed from (its own for a payload built directly, the
    sum of its operands' for ``a + b`` and ``a − b``), and validation of a difference accepts
    deviations up to :data:`_RESIDUE_RTOL` times it on top of its usual tolerances.

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
    def own(cls, s: ClientStats) -> _Magnitude:
        """The magnitudes of ``s`` itself (O(C·d))."""
        with np.errstate(over="ignore"):  # inf for values near the float range: no residue
            first = float(np.max(np.abs(s.sums), initial=0.0))
            if s.meta.mode == "means":
                return cls(first=first, second=0.0)
            return cls(
                first=first,
                second=float(np.max(np.abs(s.diag_sums).sum(axis=0), initial=0.0)),
            )

    def __add__(self, other: _Magnitude) -> _Magnitude:
        return _Magnitude(self.first + other.first, self.second + other.second,
                          max(self.rounding, other.rounding))


# ---------------------------------------------------------------------- validation
def _validate(s: ClientStats, residue: _Magnitude | None = None,
              check_symmetry: bool = True) -> None:
    """Check shapes, dtypes and the laws that sums of samples obey.

    ``residue``: magnitudes of the values the difference ``s`` was computed from, whose
    rounding the checks tolerate (``None`` for statistics built directly).
    ``check_symmetry``: False for matrices symmetric by construction (unpacked triangles).
    """
    res = _Magnitude(0.0, 0.0) if residue is None else residue
    c, d, mode = s.meta.num_classes, s.meta.dim, s.meta.mode
    schema = schema_for(mode)
    for spec in schema.arrays:
        arr = getattr(s, spec.name)
        if arr is None:
            raise StatsValidationError(
                f"mode {mode!r} statistics must hold {spec.name}; it is missing"
            )
        _check_array(spec.name, arr, spec.shape(c, d), spec.dtype)
        if spec.symmetric and check_symmetry:
            _check_symmetric(spec.name, arr, _RESIDUE_RTOL * res.second)
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
    if mode == "means":
        _check_empty_classes(s, s.sums)
        return
    diag = s.diag_sums
    if np.any(diag < -(_tol(diag) + _RESIDUE_RTOL * res.second)):
        raise StatsValidationError(
            "sums of squares (D_c or diag S_c) must be non-negative; the payload is corrupt"
        )
    _check_empty_classes(s, s.sums, diag)
    check_second_moment_laws(s, diag, res.first, res.second)

def _check_empty_classes(s: ClientStats, *arrays: F64) -> None:
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


def _check_no_overflow(a: ClientStats, b: ClientStats, arrays: dict[str, Any]) -> None:
    """Refuse a sum whose int64 counts wrapped or whose floats overflowed to inf."""
    _check_counts_addable(a.counts, a.n_clipped, b.counts, b.n_clipped)
    for name, arr in arrays.items():
        if arr.dtype.kind == "f" and not all(np.all(np.isfinite(x)) for x in _slabs(arr)):
            raise StatsOverflowError(_float_overflow_message(name))


def _check_n_clipped(s: ClientStats) -> None:
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


def _check_array(name: str, arr: Any, shape: tuple[int, ...], dtype: np.dtype[Any]) -> None:
    if not isinstance(arr, np.ndarray):
        raise StatsValidationError(f"{name} must be a numpy array; got {type(arr).__name__}")
    if arr.shape != shape:
        raise StatsValidationError(f"{name} must have shape {shape}; got {arr.shape}")
    if arr.dtype != dtype:
        raise StatsValidationError(
            f"{name} must have dtype {np.dtype(dtype).name}; got {arr.dtype.name}"
        )
    if arr.dtype.kind == "f" and not all(np.all(np.isfinite(x)) for x in _slabs(arr)):
        raise StatsValidationError(
            f"{name} contains NaN or infinite values; the embeddings fed to the client were not "
            "finite, or the payload is corrupt"
        )


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
