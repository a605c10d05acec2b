"""Statistics whose symmetric matrices stay packed: what a server adds without unpacking.

A payload carries S_c and B as their row-major upper triangles (d(d+1)/2 numbers each,
:func:`~ghofl.stats.schema.pack_upper`). :class:`~ghofl.stats.ClientStats` holds them as full
d × d matrices, so reading a payload into it unpacks (and mirrors) every triangle: at C = 10,
d = 1280 that writes 131 MB per payload, twice the bytes read. A server that only adds
payloads need not: :class:`PackedStats` is the same validated value with the triangles left as
they came, :class:`~ghofl.stats.StatsTotal` adds them so (half the bytes of a full add) and
unpacks the total once, in :meth:`~ghofl.stats.StatsTotal.result`.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, ClassVar

import numpy as np
from numpy.typing import NDArray

from ghofl.errors import StatsValidationError
from ghofl.stats.client_stats.laws import Magnitude, check_array, validate
from ghofl.stats.client_stats.value import ClientStats, StatsShape, validate_holdout
from ghofl.stats.meta import StatsMeta
from ghofl.stats.schema import ARRAY_NAMES, schema_for

__all__ = ["PackedStats"]

F64 = NDArray[np.float64]
I64 = NDArray[np.int64]


@dataclass(frozen=True, eq=False)
class PackedStats(StatsShape):
    """Validated statistics whose symmetric matrices are kept as packed upper triangles.

    The value a server reads a payload into when it only adds it: the laws checked are
    exactly those of :class:`~ghofl.stats.ClientStats` (Cauchy–Schwarz, positive
    semi-definite scatters, empty classes, ``n_clipped``...), on the packed triangles, with the
    same messages; :meth:`unpack` gives the :class:`~ghofl.stats.ClientStats`. Usually
    read, not built: :func:`~ghofl.stats.codec.load_packed_stats` (a file), :meth:`of` (a
    value in memory), :func:`~ghofl.stats.transport.packed_stats_from_tensors` (arrays as they
    travel). Built by hand, every array is checked (shapes, dtypes, finiteness) and every law
    above, and a held-out section as :class:`~ghofl.stats.ClientStats` checks it. All arrays
    are float64 (counts int64) and read-only.

    Parameters
    ----------
    meta : StatsMeta
    counts : ndarray of int64, shape (C,)
    sums : ndarray of float64, shape (C, d)
    sq_sums : ndarray of float64, shape (C, d), or None
    class_scatter : ndarray of float64, shape (C, d(d+1)/2), or None
        Row-major upper triangle of each S_c (mode ``full``).
    scatter : ndarray of float64, shape (d(d+1)/2,), or None
        Row-major upper triangle of B (modes ``pooled`` and ``gram``).
    n_clipped : int, default 0
    holdout : PackedStats or None
        The held-out section, packed too.

    Raises
    ------
    StatsValidationError
        The arrays do not form valid statistics (the message of ``ClientStats``).
    """

    meta: StatsMeta
    counts: I64
    sums: F64
    sq_sums: F64 | None = None
    class_scatter: F64 | None = None
    scatter: F64 | None = None
    n_clipped: int = 0
    holdout: PackedStats | None = None
    _magnitude: Magnitude = field(init=False, repr=False, compare=False)
    packed: ClassVar[bool] = True

    def __post_init__(self) -> None:
        validate(self)  # as ClientStats, in the same order: shapes (packed), dtypes, laws
        object.__setattr__(self, "n_clipped", int(self.n_clipped))
        object.__setattr__(self, "_magnitude", Magnitude.own(self))
        _freeze(self)
        if self.holdout is not None or self.meta.has_holdout:
            if self.holdout is not None and not isinstance(self.holdout, PackedStats):
                raise StatsValidationError(
                    f"the held-out section of PackedStats must be PackedStats; got "
                    f"{type(self.holdout).__name__}"
                )
            validate_holdout(self.unpack())  # the check of total − held-out needs matrices

    # ------------------------------------------------------------------ construction
    @classmethod
    def of(cls, stats: ClientStats) -> PackedStats:
        """``stats`` with its symmetric matrices packed (their upper triangles, new arrays).

        The other arrays are shared (both are read-only). Its held-out section is packed too;
        ``stats`` is valid, so nothing is re-checked.
        """
        holdout = None if stats.holdout is None else cls.of(stats.holdout)
        arrays = {spec.name: spec.pack(getattr(stats, spec.name))
                  for spec in schema_for(stats.mode).arrays}
        return cls._trusted(stats.meta, arrays, stats.n_clipped, stats._magnitude, holdout)

    @classmethod
    def _trusted(cls, meta: StatsMeta, arrays: dict[str, Any], n_clipped: int,
                 magnitude: Magnitude | None = None,
                 holdout: PackedStats | None = None) -> PackedStats:
        """Build without validating (``magnitude``: default the value's own)."""
        obj = object.__new__(cls)
        for name in ARRAY_NAMES:
            object.__setattr__(obj, name, arrays.get(name))
        object.__setattr__(obj, "meta", meta)
        object.__setattr__(obj, "n_clipped", int(n_clipped))
        object.__setattr__(obj, "holdout", holdout)
        object.__setattr__(obj, "_magnitude", magnitude or Magnitude.own(obj))
        _freeze(obj)
        return obj

    @classmethod
    def _from_transport(cls, meta: StatsMeta, arrays: dict[str, Any], n_clipped: int,
                        rounding: float) -> PackedStats:
        """Validate packed float64 arrays (finite already) as :class:`ClientStats` would.

        For :func:`~ghofl.stats.transport.packed_stats_from_tensors` only: ``arrays`` are the
        mode's arrays by field name, of their packed shapes, their finiteness checked on the
        way in; ``meta`` has no held-out section (a payload with one is validated as
        :class:`ClientStats`, whose check of total − held-out needs the matrices, then
        packed). ``rounding`` as :meth:`ClientStats.from_transport`.
        """
        schema = schema_for(meta.mode)
        c, d = meta.num_classes, meta.dim
        for name, arr in arrays.items():
            spec = schema.spec(name)
            check_array(name, arr, spec.packed_shape(c, d), spec.dtype, finite=False)
        obj = cls._trusted(meta, arrays, n_clipped)
        magnitude = None
        if rounding > 0.0:
            magnitude = obj._magnitude.after_transport(rounding, d)
            object.__setattr__(obj, "_magnitude", magnitude)
        validate(obj, magnitude, check_symmetry=False, arrays_checked=True)
        return obj

    # ------------------------------------------------------------------ views
    def unpack(self) -> ClientStats:
        """The :class:`ClientStats` of these statistics (the triangles unpacked; a copy)."""
        schema = schema_for(self.mode)
        arrays = {spec.name: spec.unpack(getattr(self, spec.name), self.num_classes,
                                         self.dim, spec.dtype)
                  for spec in schema.arrays}
        holdout = None if self.holdout is None else self.holdout.unpack()
        return ClientStats._trusted(self.meta, n_clipped=self.n_clipped,
                                    magnitude=self._magnitude, holdout=holdout, **arrays)

    def __repr__(self) -> str:
        held = "" if self.holdout is None else f", holdout n={self.holdout.n_samples}"
        return (f"PackedStats(mode={self.mode!r}, dim={self.dim}, classes={self.num_classes}, "
                f"n={self.n_samples}{held})")


def _freeze(s: PackedStats) -> None:
    for name in ARRAY_NAMES:
        arr = getattr(s, name)
        if isinstance(arr, np.ndarray):
            arr.setflags(write=False)
