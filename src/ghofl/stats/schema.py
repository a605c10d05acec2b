"""One schema per upload mode: the single source of the rules of each mode.

A :class:`ModeSchema` says which arrays statistics of a mode hold (name, axes, dtype, magnitude
class, symmetry), which mode's statistics contain which (:meth:`ModeSchema.supports`, a partial
order: ``full`` > ``pooled`` > ``diag`` > ``means`` and ``pooled`` > ``gram`` > ``means``, with
``diag`` and ``gram`` incomparable), how the arrays travel (symmetric matrices as row-major upper
triangles) and how a payload flattens into one integer vector and one float vector (the layout
used by secure aggregation). Validation, zeros, mode
conversion, the file format, the byte counts and every "does mode X support head Y" check are
derived from :data:`SCHEMAS`.

Symbols: ``C`` is the number of classes, ``d`` the dimension of the statistics space.

================  ===============================================  ========================
mode              arrays                                           contains (converts to)
================  ===============================================  ========================
``full``          counts (C,), sums (C, d), class_scatter (C, d, d)    every mode
``pooled``        counts (C,), sums (C, d), sq_sums (C, d),            gram, diag, means
                  scatter (d, d)
``gram``          counts (C,), sums (C, d), scatter (d, d)             means
``diag``          counts (C,), sums (C, d), sq_sums (C, d)             means
``means``         counts (C,), sums (C, d)                             —
================  ===============================================  ========================

A mode contains another when every array of the other is one of its own or derived from one
(:data:`_DERIVED_FROM`: D_c = diag S_c and B = Σ_c S_c from ``class_scatter``).

``gram`` carries the global second moment B = Σ x xᵀ but no per-class diagonal D_c: Fed3R's
upload (the Gram matrix and the class sums) plus the C class counts, C + C·d + d(d+1)/2
numbers, from which
every head that needs only the pooled within-class scatter W = B − Σ_c A_c A_cᵀ/N_c or B itself
fits (``lda``, ``ridge``, ``fed3r``, ``fisher*``...); naive Bayes (D_c) and QDA (S_c) do not.

``means`` carries first moments only (FedNCM's and FedCOF's upload: class counts and sums, from
which the server forms class means): heads that need no second moment fit from it (``ncm``),
and per-client ``means`` payloads kept apart (not summed) feed FedCOF's covariance estimate
(:mod:`ghofl.moments.fedcof`).

Held-out section: statistics whose metadata has ``holdout_fraction > 0`` carry, besides the
arrays above (sums over ALL the client's samples), the same arrays over the held-out samples
only, named with the prefix :data:`HOLDOUT_PREFIX` (``holdout.counts``, ``holdout.sums``...,
and ``holdout.n_clipped`` in the integer vector). Every layout (:meth:`ModeSchema.stored_arrays`,
:meth:`ModeSchema.int_layout`, :meth:`ModeSchema.float_layout`, :meth:`ModeSchema.nbytes`,
:meth:`ModeSchema.flatten`) lists the main section first, then the held-out one.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from functools import cache
from types import MappingProxyType
from typing import TYPE_CHECKING, Any, Literal

import numpy as np
from numpy.typing import NDArray

from ghofl.errors import StatsFormatError, StatsValidationError
from ghofl.stats._pages import page_backed_empty
from ghofl.stats._threads import first_failing, thread_count
from ghofl.stats.meta import MODES, Mode, StatsMeta

if TYPE_CHECKING:
    from ghofl.stats.client_stats import ClientStats
    from ghofl.stats.client_stats.packed import PackedStats

__all__ = [
    "ARRAY_NAMES",
    "HOLDOUT_PREFIX",
    "SCHEMAS",
    "ArraySpec",
    "Kind",
    "ModeSchema",
    "Segment",
    "mode_supports",
    "modes_supporting",
    "pack_upper",
    "packed_diagonal",
    "parts",
    "schema_for",
    "sym_diagonal",
    "unpack_upper",
]

#: Magnitude class of an array per sample under an L2 clipping bound R:
#: ``count`` ≤ 1, ``first`` ≤ R, ``second`` ≤ R².
Kind = Literal["count", "first", "second"]

#: Prefix of the arrays (stored names, flat-vector segments) of the held-out section.
HOLDOUT_PREFIX = "holdout."

_INT64: np.dtype[Any] = np.dtype(np.int64)
_FLOAT64: np.dtype[Any] = np.dtype(np.float64)
_AXES = ("C", "d")


# ---------------------------------------------------------------------- upper triangles
def pack_upper(m: NDArray[Any]) -> NDArray[Any]:
    """Upper triangle of symmetric matrices, row-major (``numpy.triu_indices``).

    Parameters
    ----------
    m : ndarray, shape (..., d, d)

    Returns
    -------
    ndarray, shape (..., d(d+1)/2), C-contiguous, same dtype as ``m``.
    """
    d = m.shape[-1]
    out = np.empty((*m.shape[:-2], d * (d + 1) // 2), dtype=m.dtype)
    start = 0
    for i in range(d):  # row i of the triangle, from the diagonal on: one contiguous copy
        out[..., start : start + d - i] = m[..., i, i:]
        start += d - i
    return out


def packed_diagonal(d: int) -> NDArray[np.intp]:
    """Positions of the diagonal in a packed triangle of :func:`pack_upper` (read-only).

    Entry (i, i) is at i·d − i(i − 1)/2: row i of the triangle starts there.
    """
    return _packed_diagonal(d)


@cache
def _packed_diagonal(d: int) -> NDArray[np.intp]:
    i = np.arange(d, dtype=np.intp)
    out: NDArray[np.intp] = i * d - i * (i - 1) // 2
    out.setflags(write=False)
    return out


def sym_diagonal(m: NDArray[Any], d: int, packed: bool) -> NDArray[Any]:
    """Diagonals of symmetric matrices, full (..., d, d) or ``packed`` (..., d(d+1)/2).

    Full matrices give a view (``numpy.diagonal`` of the last two axes), packed triangles
    (:func:`pack_upper`) a copy. Shape (..., d).
    """
    if not packed:
        return np.diagonal(m, axis1=-2, axis2=-1)
    out: NDArray[Any] = m[..., _packed_diagonal(d)]
    return out


def unpack_upper(packed: NDArray[Any], d: int, dtype: Any = None) -> NDArray[Any]:
    """Inverse of :func:`pack_upper`.

    Copies row by row into the upper triangle, then mirrors it in tiles of
    :data:`_TILE` columns, one matrix at a time (no index arrays, no temporary of the
    output's size): about the cost of writing the output once. A large stack is unpacked in
    blocks of matrices on every core.

    Parameters
    ----------
    packed : ndarray, shape (..., d(d+1)/2)
    d : int
    dtype : dtype, optional
        Of the result (default that of ``packed``; e.g. float64 for float32 transport,
        converted on the way).

    Returns
    -------
    ndarray, shape (..., d, d), symmetric, C-contiguous.

    Raises
    ------
    StatsFormatError
        The last axis of ``packed`` is not d(d+1)/2 long.
    """
    tri = d * (d + 1) // 2
    if packed.shape[-1:] != (tri,):
        got = packed.shape[-1] if packed.ndim else "no"
        raise StatsFormatError(
            f"packed symmetric matrix has {got} entries; expected d(d+1)/2 = {tri} for d={d}; "
            "the file is corrupt"
        )
    rows = packed.reshape(math.prod(packed.shape[:-1]), tri)
    # written once in full: on ordinary pages (:mod:`ghofl.stats._pages`)
    out = page_backed_empty((rows.shape[0], d, d), packed.dtype if dtype is None else dtype)
    below = [np.tri(min(_TILE, d - i0), k=-1, dtype=bool) for i0 in range(0, d, _TILE)]
    # Large stacks: blocks of matrices (a few per core) on every core; the copies release the GIL.
    threads = thread_count(rows.shape[0]) if out.size >= _THREADED_ENTRIES else 1
    step = max(1, -(-rows.shape[0] // (4 * threads)))
    blocks = [slice(b, b + step) for b in range(0, rows.shape[0], step)]

    def fill(k: int, _: None) -> bool:
        _unpack_into(out[blocks[k]], rows[blocks[k]], below)
        return True

    first_failing(len(blocks), fill, lambda: None, threads)
    return out.reshape(*packed.shape[:-1], d, d)


def _unpack_into(out: NDArray[Any], rows: NDArray[Any], below: list[NDArray[np.bool_]]) -> None:
    """:func:`unpack_upper` of the triangles ``rows`` (k, d(d+1)/2) into ``out`` (k, d, d)."""
    d = out.shape[-1]
    start = 0
    for i in range(d):  # row i of the triangle: its d − i entries from the diagonal on
        out[:, i, i:] = rows[:, start : start + d - i]
        start += d - i
    _mirror(out, below)


def _mirror(out: NDArray[Any], mask: list[NDArray[np.bool_]]) -> None:
    """Copy each matrix's upper triangle onto its lower one.

    ``mask[t]``: the entries of diagonal tile t to overwrite.
    """
    d = out.shape[-1]
    for m in out:
        for t, i0 in enumerate(range(0, d, _TILE)):
            i1 = min(i0 + _TILE, d)
            tile = m[i0:i1, i0:i1]
            np.copyto(tile, tile.T, where=mask[t])
            m[i1:, i0:i1] = m[i0:i1, i1:].T


#: Entries of the output from which :func:`unpack_upper` spreads its matrices over threads.
_THREADED_ENTRIES = 1 << 24


#: Columns per tile when :func:`unpack_upper` mirrors a triangle.
_TILE = 64


# ---------------------------------------------------------------------- one array
@dataclass(frozen=True)
class ArraySpec:
    """One array held by statistics of some mode.

    Parameters
    ----------
    name : str
        :class:`~ghofl.stats.ClientStats` attribute, e.g. ``"class_scatter"``.
    axes : tuple of str
        Axis symbols, ``"C"`` (classes) or ``"d"`` (dimension), e.g. ``("C", "d", "d")``.
    dtype : numpy.dtype
        ``int64`` or ``float64``.
    kind : {"count", "first", "second"}
        Magnitude class per sample: count ≤ 1, first ≤ R, second ≤ R² (R = L2 clip bound).
    symmetric : bool
        The last two axes are symmetric (both ``"d"``); the array travels and flattens as its
        row-major upper triangle.
    source : str
        ClientStats attribute that yields this array from statistics of this mode or of any
        richer mode (``"diag_sums"`` for ``sq_sums``, ``"total_scatter"`` for ``scatter``).
    """

    name: str
    axes: tuple[str, ...]
    dtype: np.dtype[Any]
    kind: Kind
    symmetric: bool
    source: str

    def __post_init__(self) -> None:
        bad = [a for a in self.axes if a not in _AXES]
        if bad or not self.axes:
            raise StatsValidationError(
                f"array spec {self.name!r} has axes {self.axes}; expected a non-empty tuple of "
                f"the symbols {', '.join(_AXES)}"
            )
        if self.symmetric and self.axes[-2:] != ("d", "d"):
            raise StatsValidationError(
                f"array spec {self.name!r} is marked symmetric but its last two axes are "
                f"{self.axes[-2:]}; a symmetric array must end with the axes ('d', 'd')"
            )

    @property
    def stored_name(self) -> str:
        """Name in files: ``<name>_triu`` for symmetric arrays, else ``name``."""
        return f"{self.name}_triu" if self.symmetric else self.name

    def shape(self, num_classes: int, dim: int) -> tuple[int, ...]:
        """Shape of the array for C = ``num_classes`` classes in dimension d = ``dim``."""
        sizes = {"C": num_classes, "d": dim}
        return tuple(sizes[a] for a in self.axes)

    def packed_shape(self, num_classes: int, dim: int) -> tuple[int, ...]:
        """Shape as it travels: (..., d(d+1)/2) for symmetric arrays, else :meth:`shape`."""
        full = self.shape(num_classes, dim)
        if not self.symmetric:
            return full
        return (*full[:-2], dim * (dim + 1) // 2)

    def packed_size(self, num_classes: int, dim: int) -> int:
        """Number of entries as it travels (product of :meth:`packed_shape`)."""
        return int(np.prod(self.packed_shape(num_classes, dim), dtype=np.int64))

    def pack(self, arr: NDArray[Any]) -> NDArray[Any]:
        """The array as it travels, C-contiguous.

        Parameters
        ----------
        arr : ndarray, shape :meth:`shape`

        Returns
        -------
        ndarray, shape :meth:`packed_shape` (the upper triangle when symmetric).
        """
        return pack_upper(arr) if self.symmetric else np.ascontiguousarray(arr)

    def check_packed(self, packed: Any, num_classes: int, dim: int) -> NDArray[Any]:
        """``packed`` as an array, after checking it has :meth:`packed_shape` for C and d.

        Raises
        ------
        StatsFormatError
            It has another shape.
        """
        arr = np.asarray(packed)
        expected = self.packed_shape(num_classes, dim)
        if arr.shape != expected:
            how = " (row-major upper triangles)" if self.symmetric else ""
            raise StatsFormatError(
                f"array {self.stored_name!r} must have shape {expected}{how} for "
                f"C={num_classes} classes and d={dim}; got {arr.shape}; the payload is corrupt "
                "or was written for another class list or dimension"
            )
        return arr

    def unpack(self, packed: NDArray[Any], num_classes: int, dim: int, dtype: Any = None
               ) -> NDArray[Any]:
        """Inverse of :meth:`pack`, after checking the packed shape.

        Parameters
        ----------
        packed : ndarray, shape :meth:`packed_shape`
        num_classes, dim : int
            C and d of the statistics.
        dtype : dtype, optional
            Convert to it; the result is then always a new array (never a view of
            ``packed``).

        Returns
        -------
        ndarray, shape :meth:`shape`, the dtype of ``packed`` by default (dtype is checked by
        :class:`~ghofl.stats.ClientStats` validation).

        Raises
        ------
        StatsFormatError
            ``packed`` does not have the packed shape for C and d.
        """
        arr = self.check_packed(packed, num_classes, dim)
        if self.symmetric:
            return unpack_upper(arr, dim, dtype)
        return arr if dtype is None else np.array(arr, dtype=dtype)


@dataclass(frozen=True)
class Segment:
    """Place of one array in a flattened vector: entries ``offset`` to ``offset + size``.

    Parameters
    ----------
    name : str
        Array name (ClientStats attribute, or ``"n_clipped"``).
    kind : {"count", "first", "second"}
        Magnitude class per sample of the entries.
    offset : int
        First index in the vector.
    size : int
        Number of entries.
    """

    name: str
    kind: Kind
    offset: int
    size: int

    @property
    def stop(self) -> int:
        """One past the last index in the vector."""
        return self.offset + self.size


def _layout(items: list[tuple[str, Kind, int]]) -> tuple[Segment, ...]:
    """Contiguous segments of the given (name, kind, size) in order."""
    out: list[Segment] = []
    offset = 0
    for name, kind, size in items:
        out.append(Segment(name, kind, offset, size))
        offset += size
    return tuple(out)


# ---------------------------------------------------------------------- one mode
@dataclass(frozen=True)
class ModeSchema:
    """Everything that depends on the upload mode.

    Parameters
    ----------
    mode : {"full", "pooled", "gram", "diag", "means"}
    arrays : tuple of ArraySpec
        In fixed order: counts, sums, then the mode's second-moment arrays. A mode supports
        every mode whose arrays it holds or derives (:meth:`supports`); its statistics convert
        to them exactly.
    """

    mode: Mode
    arrays: tuple[ArraySpec, ...]

    def has(self, name: str) -> bool:
        """Whether statistics of this mode hold the array ``name``."""
        return any(a.name == name for a in self.arrays)

    def spec(self, name: str) -> ArraySpec:
        """The :class:`ArraySpec` of ``name``; raises StatsValidationError if not held."""
        for a in self.arrays:
            if a.name == name:
                return a
        raise StatsValidationError(
            f"mode {self.mode!r} statistics hold no array {name!r}; they hold "
            f"{', '.join(self.names)}. Use the schema of a mode that holds it"
        )

    @property
    def names(self) -> tuple[str, ...]:
        """Names of the arrays held, in :attr:`arrays` order."""
        return tuple(a.name for a in self.arrays)

    @property
    def float_arrays(self) -> tuple[ArraySpec, ...]:
        """The float arrays (everything but the counts), in :attr:`arrays` order."""
        return tuple(a for a in self.arrays if a.dtype.kind == "f")

    def supports(self, required: Mode) -> bool:
        """Whether statistics of this mode contain those of ``required``.

        True when every array of ``required`` is held or derived from a held one
        (:data:`_DERIVED_FROM`); a partial order (``gram`` and ``diag`` contain ``means`` and
        neither contains the other).
        """
        return all(any(self.has(src) for src in _DERIVED_FROM[a.name])
                   for a in schema_for(required).arrays)

    # ------------------------------------------------------------------ sizes
    def stored_arrays(self, holdout: bool = False) -> tuple[tuple[str, str, ArraySpec], ...]:
        """Every array that travels, as ``(part, stored name, spec)``.

        ``part`` is ``""`` for the sums over all samples and :data:`HOLDOUT_PREFIX` for the
        held-out section (present when ``holdout``); the stored name is ``part +
        spec.stored_name``, e.g. ``"holdout.class_scatter_triu"``.
        """
        return tuple(
            (part, part + a.stored_name, a) for part in parts(holdout) for a in self.arrays
        )

    def int_layout(
        self, num_classes: int, dim: int, holdout: bool = False
    ) -> tuple[Segment, ...]:
        """Integer vector of a payload: counts (C,) then n_clipped (1,).

        With ``holdout``, followed by ``holdout.counts`` (C,) and ``holdout.n_clipped`` (1,).
        """
        items: list[tuple[str, Kind, int]] = []
        for part in parts(holdout):
            items += [(part + a.name, a.kind, a.packed_size(num_classes, dim))
                      for a in self._int_arrays]
            items.append((part + "n_clipped", "count", 1))
        return _layout(items)

    def float_layout(
        self, num_classes: int, dim: int, holdout: bool = False
    ) -> tuple[Segment, ...]:
        """Float vector of a payload: every float array packed, in :attr:`arrays` order.

        With ``holdout``, followed by the same arrays of the held-out section
        (``holdout.<name>``, same kinds: a held-out sample is bounded as any other).
        """
        return _layout([
            (part + a.name, a.kind, a.packed_size(num_classes, dim))
            for part in parts(holdout) for a in self.float_arrays
        ])

    def nbytes(
        self, num_classes: int, dim: int, holdout: bool = False, float_dtype: Any = None
    ) -> int:
        """Bytes of array data of one payload (symmetric arrays as upper triangles).

        Parameters
        ----------
        num_classes, dim : int
            C and d.
        holdout : bool, default False
            The payload carries a held-out section (every array twice).
        float_dtype : dtype, optional
            Transport dtype of the float arrays (``float32`` halves them); default float64.
        """
        fsize = _FLOAT64.itemsize if float_dtype is None else np.dtype(float_dtype).itemsize
        one = sum(
            a.packed_size(num_classes, dim) * (fsize if a.dtype.kind == "f" else a.dtype.itemsize)
            for a in self.arrays
        )
        return one * len(parts(holdout))

    def zeros(self, num_classes: int, dim: int) -> dict[str, NDArray[Any]]:
        """Zero arrays of every array held, by name (shapes :meth:`ArraySpec.shape`)."""
        return {a.name: np.zeros(a.shape(num_classes, dim), a.dtype) for a in self.arrays}

    @property
    def _int_arrays(self) -> tuple[ArraySpec, ...]:
        return tuple(a for a in self.arrays if a.dtype.kind != "f")

    # ------------------------------------------------------------------ flat vectors
    def flatten(self, stats: ClientStats | PackedStats
                ) -> tuple[NDArray[np.int64], NDArray[np.float64]]:
        """Flatten statistics of this mode (or of a richer one, converted exactly).

        Parameters
        ----------
        stats : ClientStats or PackedStats
            C classes, dimension d, mode supporting :attr:`mode`. Packed statistics of this
            mode are flattened as they are (their triangles are the flat layout's); of a
            richer mode, unpacked first.

        Returns
        -------
        ints : ndarray of int64, shape (C + 1,), or (2C + 2,) with a held-out section
            Layout :meth:`int_layout`: counts, then n_clipped (then those of the held-out
            section when ``stats.holdout`` is set).
        floats : ndarray of float64, shape (F,), or (2F,) with a held-out section
            Layout :meth:`float_layout`, F = Σ packed sizes of the float arrays.

        Raises
        ------
        StatsValidationError
            ``stats`` are of a poorer mode than this schema.
        """
        if not schema_for(stats.mode).supports(self.mode):
            raise StatsValidationError(
                f"cannot flatten mode {stats.mode!r} statistics with the {self.mode!r} schema: "
                f"they lack second moments that mode {self.mode!r} holds; use "
                f"schema_for({stats.mode!r}) or recompute the statistics with mode {self.mode!r}"
            )
        if stats.packed and stats.mode != self.mode:
            stats = stats.unpack()
        sections = [stats] if stats.holdout is None else [stats, stats.holdout]
        ints = np.concatenate([
            np.concatenate([*(np.ravel(getattr(s, a.source)) for a in self._int_arrays),
                            [s.n_clipped]])
            for s in sections
        ]).astype(np.int64, copy=False)
        pieces = [np.ravel(getattr(s, a.name) if s.packed else a.pack(getattr(s, a.source)))
                  for s in sections for a in self.float_arrays]
        floats = np.concatenate(pieces).astype(np.float64, copy=False)
        return ints, floats

    def unflatten_arrays(
        self, meta: StatsMeta, ints: NDArray[Any], floats: NDArray[Any]
    ) -> tuple[tuple[dict[str, NDArray[Any]], int], ...]:
        """The arrays and ``n_clipped`` of each section of flat vectors.

        The inverse of :meth:`flatten`; :func:`ghofl.stats.flat.unflatten_stats` builds the
        validated :class:`~ghofl.stats.client_stats.ClientStats` from them.

        Parameters
        ----------
        meta : StatsMeta
            Metadata of the statistics; its mode must be this schema's mode. With
            ``meta.holdout_fraction > 0`` the vectors hold the held-out section too.
        ints : ndarray of integers, shape (C + 1,) or (2C + 2,)
            Layout :meth:`int_layout` (``holdout=meta.has_holdout``).
        floats : ndarray of floats, shape (F,) or (2F,)
            Layout :meth:`float_layout` (``holdout=meta.has_holdout``).

        Returns
        -------
        tuple of (dict of str to ndarray, int)
            One ``(arrays by name, n_clipped)`` per section: the main one, then the held-out
            one when ``meta.has_holdout``. The arrays are copies (later changes to
            ``ints``/``floats`` do not affect them), not yet validated as statistics.

        Raises
        ------
        StatsValidationError
            Wrong mode, wrong dtype or wrong length of a vector.
        """
        if meta.mode != self.mode:
            raise StatsValidationError(
                f"cannot unflatten with the {self.mode!r} schema statistics whose metadata has "
                f"mode {meta.mode!r}; use schema_for({meta.mode!r}) or meta.with_mode"
                f"({self.mode!r})"
            )
        c, d = meta.num_classes, meta.dim
        ho = meta.has_holdout
        int_layout = self.int_layout(c, d, ho)
        float_layout = self.float_layout(c, d, ho)
        iv = _check_vector("integer", ints, "iu", int_layout, self.mode, c, d)
        fv = _check_vector("float", floats, "f", float_layout, self.mode, c, d)
        n_int, n_float = len(self._int_arrays) + 1, len(self.float_arrays)
        sections: list[tuple[dict[str, NDArray[Any]], int]] = []
        for i, _ in enumerate(parts(ho)):
            arrays: dict[str, NDArray[Any]] = {}
            iseg = int_layout[i * n_int : (i + 1) * n_int]
            for spec, seg in zip(self._int_arrays, iseg[:-1], strict=True):
                arrays[spec.name] = iv[seg.offset : seg.stop].astype(spec.dtype).reshape(
                    spec.shape(c, d)
                )
            fseg = float_layout[i * n_float : (i + 1) * n_float]
            for spec, seg in zip(self.float_arrays, fseg, strict=True):
                packed = fv[seg.offset : seg.stop].astype(spec.dtype)  # a copy: owned
                arrays[spec.name] = spec.unpack(packed.reshape(spec.packed_shape(c, d)), c, d)
            sections.append((arrays, int(iv[iseg[-1].offset])))
        return tuple(sections)


def _check_vector(
    what: str,
    vec: NDArray[Any],
    kinds: str,
    layout: tuple[Segment, ...],
    mode: str,
    c: int,
    d: int,
) -> NDArray[Any]:
    """Check a flat vector's dtype kind, dimensionality and length against ``layout``."""
    arr = np.asarray(vec)
    parts = ", ".join(f"{s.name} ({s.size},)" for s in layout)
    length = layout[-1].stop if layout else 0
    if arr.dtype.kind not in kinds:
        want = "an integer" if kinds == "iu" else "a floating-point"
        raise StatsValidationError(
            f"the {what} vector of mode {mode!r} statistics must have {want} dtype; got "
            f"{arr.dtype}; pass the vector returned by ModeSchema.flatten"
        )
    if arr.shape != (length,):
        raise StatsValidationError(
            f"the {what} vector of mode {mode!r} statistics for C={c} classes and d={d} must "
            f"have shape ({length},) ({parts}); got {arr.shape}; flatten and unflatten with the "
            "same mode, class list and dimension"
        )
    return arr


# ---------------------------------------------------------------------- the modes
def _spec(
    name: str, axes: tuple[str, ...], kind: Kind, symmetric: bool = False, source: str = ""
) -> ArraySpec:
    dtype = _INT64 if kind == "count" else _FLOAT64
    return ArraySpec(name, axes, dtype, kind, symmetric, source or name)


_COUNTS = _spec("counts", ("C",), "count")
_SUMS = _spec("sums", ("C", "d"), "first")
_SQ_SUMS = _spec("sq_sums", ("C", "d"), "second", source="diag_sums")
_CLASS_SCATTER = _spec("class_scatter", ("C", "d", "d"), "second", symmetric=True)
_SCATTER = _spec("scatter", ("d", "d"), "second", symmetric=True, source="total_scatter")

#: The arrays each array is held as or derived from (its :attr:`ArraySpec.source` reads it):
#: D_c = diag S_c and B = Σ_c S_c.
_DERIVED_FROM: Mapping[str, tuple[str, ...]] = MappingProxyType({
    "counts": ("counts",),
    "sums": ("sums",),
    "sq_sums": ("sq_sums", "class_scatter"),
    "class_scatter": ("class_scatter",),
    "scatter": ("scatter", "class_scatter"),
})

SCHEMAS: Mapping[Mode, ModeSchema] = MappingProxyType(
    {
        "full": ModeSchema("full", (_COUNTS, _SUMS, _CLASS_SCATTER)),
        "pooled": ModeSchema("pooled", (_COUNTS, _SUMS, _SQ_SUMS, _SCATTER)),
        "gram": ModeSchema("gram", (_COUNTS, _SUMS, _SCATTER)),
        "diag": ModeSchema("diag", (_COUNTS, _SUMS, _SQ_SUMS)),
        "means": ModeSchema("means", (_COUNTS, _SUMS)),
    }
)
if tuple(SCHEMAS) != MODES:  # pragma: no cover - guards edits of this table
    raise RuntimeError(f"SCHEMAS must define exactly the modes {MODES}; got {tuple(SCHEMAS)}")

#: Every array any mode holds, in canonical order (the fields of ClientStats).
ARRAY_NAMES: tuple[str, ...] = tuple(
    dict.fromkeys(a.name for s in SCHEMAS.values() for a in s.arrays)
)


def parts(holdout: bool) -> tuple[str, ...]:
    """Prefixes of the sections of a payload.

    ``("",)``, or ``("", "holdout.")`` when it carries a held-out section (the sums over all
    samples come first).
    """
    return ("", HOLDOUT_PREFIX) if holdout else ("",)


def schema_for(mode: str) -> ModeSchema:
    """The :class:`ModeSchema` of upload ``mode``.

    Raises
    ------
    StatsValidationError
        ``mode`` is not one of the modes of :data:`SCHEMAS`.
    """
    try:
        return SCHEMAS[mode]  # type: ignore[index]
    except (KeyError, TypeError):
        raise StatsValidationError(
            f"unknown upload mode {mode!r}; valid modes are {', '.join(SCHEMAS)}"
        ) from None


def mode_supports(mode: str, required: str) -> bool:
    """Whether statistics of ``mode`` contain those of ``required`` (e.g. a head's min_mode).

    Raises
    ------
    StatsValidationError
        Either mode is unknown.
    """
    return schema_for(mode).supports(schema_for(required).mode)


def modes_supporting(required: str) -> str:
    """The modes whose statistics contain ``required``'s, in words (``"pooled or full"``).

    For messages that name every upload mode a head or an operation can use.
    """
    names = [m for m in SCHEMAS if mode_supports(m, required)]
    return names[0] if len(names) == 1 else ", ".join(names[:-1]) + " or " + names[-1]
