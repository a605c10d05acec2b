"""ClientStats: the additive, validated, mergeable value a client uploads once.

Holds sums and counts only (never means): per-class counts N_c, first moments A_c = Σ x,
and, by upload mode (method.md §1):

* ``full``   — per-class second moments S_c = Σ x xᵀ (B = Σ_c S_c and D_c = diag S_c derived);
* ``pooled`` — per-class diagonals D_c = Σ x⊙x and the global B = Σ x xᵀ;
* ``diag``   — per-class diagonals D_c only.

All arrays are float64 (counts int64) and read-only.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

import numpy as np
from numpy.typing import NDArray

from ghofl.errors import IncompatibleStatsError, StatsValidationError
from ghofl.stats.meta import Mode, StatsMeta

F64 = NDArray[np.float64]
I64 = NDArray[np.int64]

_SYM_RTOL = 1e-9


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
    """

    meta: StatsMeta
    counts: I64
    sums: F64
    sq_sums: F64 | None = None
    class_scatter: F64 | None = None
    scatter: F64 | None = None

    def __post_init__(self) -> None:
        _validate(self)
        for name in ("counts", "sums", "sq_sums", "class_scatter", "scatter"):
            arr = getattr(self, name)
            if arr is not None:
                arr.setflags(write=False)

    # ------------------------------------------------------------------ construction
    @classmethod
    def zeros(cls, meta: StatsMeta) -> ClientStats:
        """Return the identity of ``+`` for ``meta`` (a client with no samples)."""
        c, d = meta.num_classes, meta.dim
        return cls(
            meta,
            np.zeros(c, np.int64),
            np.zeros((c, d)),
            sq_sums=None if meta.mode == "full" else np.zeros((c, d)),
            class_scatter=np.zeros((c, d, d)) if meta.mode == "full" else None,
            scatter=np.zeros((d, d)) if meta.mode == "pooled" else None,
        )

    @classmethod
    def _trusted(
        cls,
        meta: StatsMeta,
        counts: I64,
        sums: F64,
        sq_sums: F64 | None = None,
        class_scatter: F64 | None = None,
        scatter: F64 | None = None,
    ) -> ClientStats:
        """Build without re-validating (for results of exact operations on valid values)."""
        obj = object.__new__(cls)
        for name, val in (
            ("meta", meta),
            ("counts", counts),
            ("sums", sums),
            ("sq_sums", sq_sums),
            ("class_scatter", class_scatter),
            ("scatter", scatter),
        ):
            if isinstance(val, np.ndarray):
                val.setflags(write=False)
            object.__setattr__(obj, name, val)
        return obj

    # ------------------------------------------------------------------ shape facts
    @property
    def mode(self) -> Mode:
        return self.meta.mode

    @property
    def num_classes(self) -> int:
        return self.meta.num_classes

    @property
    def dim(self) -> int:
        return self.meta.dim

    @property
    def n_samples(self) -> int:
        return int(self.counts.sum())

    @property
    def diag_sums(self) -> F64:
        """D_c, shape (C, d): stored, or diag(S_c) in ``full`` mode."""
        if self.sq_sums is not None:
            return self.sq_sums
        assert self.class_scatter is not None
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
        """The stored arrays by field name (``None`` for the ones this mode does not hold)."""
        return {
            "counts": self.counts,
            "sums": self.sums,
            "sq_sums": self.sq_sums,
            "class_scatter": self.class_scatter,
            "scatter": self.scatter,
        }

    # ------------------------------------------------------------------ algebra
    def check_compatible(self, other: ClientStats) -> None:
        """Raise :class:`IncompatibleStatsError` naming every field in which ``other`` differs."""
        if not isinstance(other, ClientStats):
            raise IncompatibleStatsError(
                f"can only combine ClientStats with ClientStats; got {type(other).__name__}"
            )
        diffs = self.meta.differences(other.meta)
        if diffs:
            raise IncompatibleStatsError(
                "cannot combine these statistics because they differ in "
                + "; ".join(diffs)
                + ". Every client must use the same encoder, projection, class list and upload "
                "mode (convert with ClientStats.to_mode to a common, lower mode if needed)."
            )

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
        if np.any(other.counts > self.counts):
            bad = np.flatnonzero(other.counts > self.counts)
            raise StatsValidationError(
                "cannot subtract statistics holding more samples than the left operand: "
                f"class {self.meta.classes[bad[0]]!r} has {self.counts[bad[0]]} on the left and "
                f"{other.counts[bad[0]]} on the right"
            )
        return self._combine(other, -1)

    def _combine(self, other: ClientStats, sign: int) -> ClientStats:
        def op(a: F64 | None, b: F64 | None) -> F64 | None:
            if a is None or b is None:
                return None
            return a + b if sign > 0 else a - b

        counts = self.counts + other.counts if sign > 0 else self.counts - other.counts
        # Sums of validated payloads are valid by construction; only removal is re-validated.
        make = ClientStats._trusted if sign > 0 else ClientStats
        out = make(
            self.meta,
            counts,
            np.asarray(op(self.sums, other.sums)),
            op(self.sq_sums, other.sq_sums),
            op(self.class_scatter, other.class_scatter),
            op(self.scatter, other.scatter),
        )
        if sign < 0:
            out = _zero_empty_classes(out)
        return out

    def allclose(self, other: ClientStats, rtol: float = 1e-10, atol: float = 0.0) -> bool:
        """Equality with tolerance: same metadata, identical counts, arrays within
        ``rtol`` relative to each array's largest magnitude (plus ``atol``)."""
        if self.meta.differences(other.meta) or not np.array_equal(self.counts, other.counts):
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
        """Convert to a lower upload mode (``full`` → ``pooled`` → ``diag``); exact."""
        order = {"full": 2, "pooled": 1, "diag": 0}
        if order[mode] > order[self.mode]:
            raise StatsValidationError(
                f"cannot convert statistics from mode {self.mode!r} to the richer mode {mode!r}: "
                "the missing second moments were never collected; recompute them on the client"
            )
        if mode == self.mode:
            return self
        meta = self.meta.with_mode(mode)
        return ClientStats(
            meta,
            self.counts.copy(),
            self.sums.copy(),
            sq_sums=self.diag_sums.copy(),
            scatter=None if mode == "diag" else self.total_scatter,
        )

    def __repr__(self) -> str:
        return (
            f"ClientStats(mode={self.mode!r}, dim={self.dim}, classes={self.num_classes}, "
            f"n={self.n_samples})"
        )


def sum_stats(items: Iterable[ClientStats]) -> ClientStats:
    """Add statistics one at a time (memory independent of how many there are).

    Raises :class:`StatsValidationError` when ``items`` is empty.
    """
    total: ClientStats | None = None
    for i, s in enumerate(items):
        if total is None:
            total = s
            continue
        try:
            total = total + s
        except IncompatibleStatsError as exc:
            raise IncompatibleStatsError(f"payload #{i} (0-based): {exc}") from exc
    if total is None:
        raise StatsValidationError(
            "cannot sum an empty collection of statistics; give at least one"
        )
    return total


def _zero_empty_classes(s: ClientStats) -> ClientStats:
    """After exact subtraction, classes with N_c = 0 must hold exactly zero sums."""
    empty = s.counts == 0
    if not np.any(empty):
        return s

    def zeroed(a: F64 | None) -> F64 | None:
        if a is None:
            return None
        out = np.array(a)
        out[empty] = 0.0
        return out

    return ClientStats(
        s.meta,
        s.counts.copy(),
        np.asarray(zeroed(s.sums)),
        zeroed(s.sq_sums),
        zeroed(s.class_scatter),
        None if s.scatter is None else s.scatter.copy(),
    )


# ---------------------------------------------------------------------- validation
def _validate(s: ClientStats) -> None:
    c, d, mode = s.meta.num_classes, s.meta.dim, s.meta.mode
    _check_array("counts", s.counts, (c,), np.int64)
    if np.any(s.counts < 0):
        raise StatsValidationError(
            f"class counts must be non-negative; got {s.counts.min()} for class "
            f"{s.meta.classes[int(np.argmin(s.counts))]!r}"
        )
    _check_array("sums", s.sums, (c, d), np.float64)
    expected = {
        "full": ("class_scatter",),
        "pooled": ("sq_sums", "scatter"),
        "diag": ("sq_sums",),
    }[mode]
    shapes = {"sq_sums": (c, d), "class_scatter": (c, d, d), "scatter": (d, d)}
    for name, shape in shapes.items():
        arr = getattr(s, name)
        if name in expected:
            if arr is None:
                raise StatsValidationError(
                    f"mode {mode!r} statistics must hold {name}; it is missing"
                )
            _check_array(name, arr, shape, np.float64)
        elif arr is not None:
            raise StatsValidationError(
                f"mode {mode!r} statistics must not hold {name} (it belongs to another mode); "
                "pass None or change the mode"
            )
    if s.class_scatter is not None:
        _check_symmetric("class_scatter", s.class_scatter)
    if s.scatter is not None:
        _check_symmetric("scatter", s.scatter)
    diag = s.diag_sums
    if np.any(diag < -_tol(diag)):
        raise StatsValidationError(
            "sums of squares (D_c or diag S_c) must be non-negative; the payload is corrupt"
        )
    empty = s.counts == 0
    if np.any(empty) and (np.any(s.sums[empty] != 0) or np.any(diag[empty] != 0)):
        cls = s.meta.classes[
            int(np.flatnonzero(empty & (np.abs(s.sums).sum(1) + diag.sum(1) > 0))[0])
        ]
        raise StatsValidationError(
            f"class {cls!r} has zero samples but non-zero sums; the payload is corrupt"
        )
    # Cauchy–Schwarz: N_c D_c >= A_c² elementwise (variance is non-negative).
    slack = s.counts[:, None] * diag - s.sums**2
    if np.any(slack < -1e-6 * (s.counts[:, None] * diag + s.sums**2 + 1.0)):
        raise StatsValidationError(
            "per-class sums of squares are smaller than the squared sums allow (N_c·D_c < A_c²): "
            "the payload is corrupt or its parts come from different data"
        )
    if mode == "pooled" and s.scatter is not None:
        tr_b = np.diagonal(s.scatter)
        tr_d = diag.sum(axis=0)
        if not np.allclose(
            tr_b, tr_d, rtol=1e-8, atol=1e-8 * (1.0 + float(np.abs(tr_d).max(initial=0)))
        ):
            raise StatsValidationError(
                "diag(B) must equal Σ_c D_c in 'pooled' statistics; the payload is corrupt "
                "or its parts come from different data"
            )


def _check_array(name: str, arr: Any, shape: tuple[int, ...], dtype: type) -> None:
    if not isinstance(arr, np.ndarray):
        raise StatsValidationError(f"{name} must be a numpy array; got {type(arr).__name__}")
    if arr.shape != shape:
        raise StatsValidationError(f"{name} must have shape {shape}; got {arr.shape}")
    if arr.dtype != dtype:
        raise StatsValidationError(
            f"{name} must have dtype {np.dtype(dtype).name}; got {arr.dtype.name}"
        )
    if arr.dtype.kind == "f" and not np.all(np.isfinite(arr)):
        raise StatsValidationError(
            f"{name} contains NaN or infinite values; the embeddings fed to the client were not "
            "finite, or the payload is corrupt"
        )


def _tol(a: F64) -> float:
    return 1e-9 * (1.0 + float(np.max(np.abs(a), initial=0.0)))


def _check_symmetric(name: str, m: F64) -> None:
    mats = m.reshape(-1, m.shape[-2], m.shape[-1])  # one matrix at a time: no (C, d, d) temporary
    dev = max(float(np.max(np.abs(a - a.T), initial=0.0)) for a in mats)
    if dev > _SYM_RTOL * (1.0 + float(np.max(np.abs(m), initial=0.0))):
        raise StatsValidationError(
            f"{name} must be symmetric; its largest asymmetry is {dev:.3g}; the payload is corrupt"
        )
