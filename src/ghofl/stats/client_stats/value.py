"""ClientStats: the additive, validated, mergeable value a client uploads once.

Holds sums and counts only (never means): per-class counts N_c, first moments A_c = Σ x,
and, by upload mode (method.md §1):

* ``full``   — per-class second moments S_c = Σ x xᵀ (B = Σ_c S_c and D_c = diag S_c derived);
* ``pooled`` — per-class diagonals D_c = Σ x⊙x and the global B = Σ x xᵀ;
* ``gram``   — the global B only (Fed3R's upload);
* ``diag``   — per-class diagonals D_c only;
* ``means``  — no second moment.

All arrays are float64 (counts int64) and read-only. Which arrays a mode holds, their shapes
and how modes convert are defined once, in :mod:`ghofl.stats.schema`.

Held-out section: when ``meta.holdout_fraction`` is f > 0 the value also carries
:attr:`ClientStats.holdout`, the same sums over the samples the client held out (a seeded
per-sample split, :func:`~ghofl.stats.accumulate.holdout_mask`). The main arrays always hold
the sums over ALL samples; :meth:`ClientStats.fitting_part` is total − held-out. Addition,
subtraction, mode conversion, flattening and the file format act on both sections.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, ClassVar

import numpy as np
from numpy.typing import NDArray

from ghofl.errors import IncompatibleStatsError, StatsValidationError, UnsupportedModeError
from ghofl.stats.client_stats.laws import (
    Magnitude,
    check_array,
    check_cancelled,
    check_holdout_counts,
    check_no_overflow,
    check_removable,
    validate,
    zero_empty_classes,
)
from ghofl.stats.meta import Mode, StatsMeta
from ghofl.stats.schema import ARRAY_NAMES, schema_for, sym_diagonal

__all__ = ["ClientStats", "StatsShape", "check_combinable", "check_meta_combinable",
           "validate_holdout"]

F64 = NDArray[np.float64]
I64 = NDArray[np.int64]

class StatsShape:
    """What statistics are, read off their metadata and counts.

    Shared by :class:`ClientStats` and :class:`~ghofl.stats.client_stats.packed.PackedStats`.
    """

    #: Whether the symmetric matrices are packed triangles (PackedStats) or d × d (ClientStats).
    packed: ClassVar[bool] = False

    meta: StatsMeta
    counts: I64
    sq_sums: F64 | None
    class_scatter: F64 | None
    scatter: F64 | None
    _magnitude: Magnitude

    @property
    def diag_sums(self) -> F64:
        """D_c, shape (C, d): stored, or the diagonals of S_c in ``full`` mode (a copy)."""
        if self.sq_sums is not None:
            return self.sq_sums
        if self.class_scatter is None:
            held = ("class counts, sums and the global B" if self.scatter is not None
                    else "class counts and sums only")
            raise UnsupportedModeError(
                f"these are mode {self.mode!r} statistics ({held}): they hold no per-class "
                "sums of squares D_c; recompute the client statistics with --mode pooled "
                "(or diag, or full)"
            )
        return np.ascontiguousarray(sym_diagonal(self.class_scatter, self.dim, self.packed))

    @property
    def rounding(self) -> float:
        """Unit roundoff of the coarsest transport these sums went through.

        That includes any payload added into them: 2⁻²⁴ after float32 transport, 0.0 for
        float64 all the way. Files and stores record it so that re-reading them tolerates that
        rounding.
        """
        return self._magnitude.rounding

    def arrays(self) -> dict[str, Any]:
        """The stored arrays by field name (``None`` for the ones this mode does not hold).

        The main section only; the held-out one is ``self.holdout.arrays()``. Packed
        statistics give their triangles.
        """
        return {name: getattr(self, name) for name in ARRAY_NAMES}

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


@dataclass(frozen=True, eq=False)
class ClientStats(StatsShape):
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
        D_c = Σ_{y=c} x⊙x; stored in ``pooled`` and ``diag`` modes, ``None`` otherwise.
    class_scatter : ndarray of float64, shape (C, d, d), or None
        S_c = Σ_{y=c} x xᵀ; stored in ``full`` mode only.
    scatter : ndarray of float64, shape (d, d), or None
        B = Σ x xᵀ; stored in ``pooled`` and ``gram`` modes only.
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
    _magnitude: Magnitude = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        validate(self)
        object.__setattr__(self, "n_clipped", int(self.n_clipped))
        for name in ARRAY_NAMES:
            arr = getattr(self, name)
            if arr is not None:
                arr.setflags(write=False)
        object.__setattr__(self, "_magnitude", Magnitude.own(self))
        validate_holdout(self)

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
        magnitude: Magnitude | None = None,
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
        object.__setattr__(obj, "_magnitude", magnitude or Magnitude.own(obj))
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
        return cls._from_transport(meta, arrays, n_clipped, holdout, rounding, unpacked)

    @classmethod
    def _from_transport(
        cls,
        meta: StatsMeta,
        arrays: dict[str, Any],
        n_clipped: int = 0,
        holdout: ClientStats | None = None,
        rounding: float = 0.0,
        unpacked: bool = False,
        *,
        _finite_checked: bool = False,
    ) -> ClientStats:
        """:meth:`from_transport`, for :mod:`ghofl.stats.transport` only.

        ``_finite_checked``: the float arrays' finiteness was checked already, on their packed
        triangles (:func:`~ghofl.stats.client_stats.laws.check_finite`), so it is not checked
        again; every other check runs. Not public: a caller must not switch validation off.
        """
        if rounding <= 0.0 and not unpacked and not _finite_checked:
            return cls(meta, n_clipped=n_clipped, holdout=holdout, **arrays)
        for name, arr in arrays.items():  # dtypes, shapes and finiteness before anything else
            check_array(name, arr, schema_for(meta.mode).spec(name).shape(meta.num_classes,
                                                                          meta.dim),
                         schema_for(meta.mode).spec(name).dtype, finite=not _finite_checked)
        obj = cls._trusted(meta, n_clipped=n_clipped, holdout=holdout, **arrays)
        magnitude: Magnitude | None = None
        if rounding > 0.0:
            magnitude = obj._magnitude.after_transport(rounding, meta.dim)
            object.__setattr__(obj, "_magnitude", magnitude)
        validate(obj, magnitude, check_symmetry=not unpacked, arrays_checked=True)
        validate_holdout(obj)
        return obj

    @property
    def total_scatter(self) -> F64 | None:
        """B = Σ x xᵀ, shape (d, d): stored, Σ_c S_c in ``full`` mode, ``None`` without it."""
        if self.scatter is not None:
            return self.scatter
        if self.class_scatter is not None:
            return np.asarray(self.class_scatter.sum(axis=0))
        return None

    def unpack(self) -> ClientStats:
        """These statistics, as they are (``PackedStats.unpack`` gives them for packed ones)."""
        return self

    # ------------------------------------------------------------------ held-out section
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
        check_combinable(self.meta, other)

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
        check_removable(self, other, "")
        if self.holdout is not None and other.holdout is not None:
            check_removable(self.holdout, other.holdout, "in the held-out section: ")
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
            check_no_overflow(self, other, arrays)
            return ClientStats._trusted(
                self.meta, n_clipped=n_clipped, magnitude=magnitude, holdout=holdout, **arrays
            )
        # Removal is re-validated. Classes left empty must hold exactly zero sums: what remains
        # there is float residue, checked to be residue and zeroed BEFORE validating. The checks
        # then tolerate the rounding the difference inherits from the values it came from.
        check_cancelled(self.meta, arrays, magnitude)
        result = ClientStats._trusted(
            self.meta, n_clipped=n_clipped, magnitude=magnitude, holdout=holdout,
            **zero_empty_classes(self.meta, arrays),
        )
        validate(result, magnitude)
        if holdout is not None:
            check_holdout_counts(result, holdout)
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
        """Convert to a mode these statistics contain; exact.

        ``full`` → ``pooled`` → ``gram`` or ``diag`` → ``means`` (:meth:`ModeSchema.supports`).

        Each array of the target mode is read from its schema ``source`` attribute (e.g.
        ``sq_sums`` from :attr:`diag_sums`, ``scatter`` from :attr:`total_scatter`).
        """
        target = schema_for(mode)
        if not schema_for(self.mode).supports(target.mode):
            raise StatsValidationError(
                f"cannot convert statistics from mode {self.mode!r} to mode {mode!r}, which holds "
                f"second moments that mode {self.mode!r} never collected; recompute them on the "
                f"client with --mode {mode}"
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
        validate(out, self._magnitude)  # exact conversion of a valid value: a cheap recheck
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

def check_combinable(meta: StatsMeta | None, other: object) -> None:
    """Raise :class:`IncompatibleStatsError` unless ``other`` can be combined with ``meta``.

    ``other`` must be :class:`ClientStats` with metadata ``meta`` (any metadata when ``meta``
    is None, e.g. for an empty total); the error names every field in which it differs.
    """
    if not isinstance(other, ClientStats):
        raise IncompatibleStatsError(
            f"can only combine ClientStats with ClientStats; got {type(other).__name__}"
        )
    check_meta_combinable(meta, other.meta)


def check_meta_combinable(meta: StatsMeta | None, other: StatsMeta) -> None:
    """Raise :class:`IncompatibleStatsError` naming every field in which ``other`` differs.

    Nothing when ``meta`` is None (e.g. for an empty total).
    """
    diffs = [] if meta is None else meta.differences(other)
    if diffs:
        raise IncompatibleStatsError(
            "cannot combine these statistics because they differ in "
            + "; ".join(diffs)
            + ". Every client must use the same encoder, projection, class list, clipping "
            "bound and upload mode (convert with ClientStats.to_mode to a common, lower mode "
            "if needed)."
        )

def validate_holdout(s: ClientStats) -> None:
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
    check_holdout_counts(s, h)
    s.fitting_part()  # raises StatsValidationError when total − held-out is not valid
