"""The arrays of ClientStats as they travel: transport dtypes, packing and payload bytes.

:func:`stats_tensors` gives the stored arrays of a value (symmetric matrices as upper
triangles, float arrays in float64 or float32), :func:`stats_from_tensors` rebuilds and
validates the value from them, and :func:`payload_nbytes` counts their bytes. The file format
around them is :mod:`ghofl.stats.codec`.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any, NamedTuple

import numpy as np
from numpy.typing import NDArray

from ghofl.errors import StatsFormatError, StatsValidationError
from ghofl.stats.client_stats import ClientStats
from ghofl.stats.client_stats.laws import check_finite
from ghofl.stats.client_stats.packed import PackedStats
from ghofl.stats.meta import StatsMeta
from ghofl.stats.schema import HOLDOUT_PREFIX, ArraySpec, schema_for

__all__ = [
    "NUMPY_DTYPES",
    "TRANSPORT_DTYPES",
    "TRANSPORT_ROUNDING",
    "DeclaredArray",
    "check_array_names",
    "check_declared_arrays",
    "expected_payload_nbytes",
    "packed_stats_from_tensors",
    "payload_nbytes",
    "rounding_name",
    "stats_from_tensors",
    "stats_tensors",
    "through_transport",
    "transport_dtype_name",
]


#: Transport dtypes of the float arrays of statistics, by name.
TRANSPORT_DTYPES: dict[str, np.dtype[Any]] = {
    "float64": np.dtype(np.float64), "float32": np.dtype(np.float32),
}
#: Largest relative rounding error per entry of each transport dtype (unit roundoff).
TRANSPORT_ROUNDING: dict[str, float] = {"float64": 0.0, "float32": 2.0**-24}
#: Dtypes of the arrays of statistics by their numpy names (the Flower records' spelling).
NUMPY_DTYPES: dict[str, np.dtype[Any]] = {
    "float64": np.dtype("<f8"), "float32": np.dtype("<f4"), "int64": np.dtype("<i8"),
}


def rounding_name(rounding: float) -> str:
    """The transport dtype whose unit roundoff covers ``rounding`` (``"float64"`` for 0)."""
    for name, u in sorted(TRANSPORT_ROUNDING.items(), key=lambda kv: kv[1]):
        if rounding <= u:
            return name
    raise StatsValidationError(  # pragma: no cover - only float32 rounds
        f"no transport dtype covers a rounding of {rounding:g}"
    )


def transport_dtype_name(dtype: Any) -> str:
    """The name (``"float64"`` or ``"float32"``) of a transport dtype given by name or dtype.

    Raises
    ------
    StatsValidationError
        Any other dtype.
    """
    try:
        name = np.dtype(dtype).name if dtype is not None else "float64"
    except TypeError:
        name = str(dtype)
    if name not in TRANSPORT_DTYPES:
        raise StatsValidationError(
            f"the transport dtype of statistics must be one of {', '.join(TRANSPORT_DTYPES)}; "
            f"got {dtype!r}; float32 halves the bytes of the float sums (--transport-dtype)"
        )
    return name


def stats_tensors(
    stats: ClientStats, transport_dtype: Any = "float64"
) -> dict[str, NDArray[Any]]:
    """The arrays that travel for ``stats``, by stored name (symmetric ones packed).

    Parameters
    ----------
    stats : ClientStats
    transport_dtype : {"float64", "float32"}, default "float64"
        Dtype of the float arrays as they travel (the counts stay int64).

    Returns
    -------
    dict of str to ndarray
        One C-contiguous array per stored array of the mode
        (:meth:`~ghofl.stats.schema.ModeSchema.stored_arrays`: the held-out section's under
        ``holdout.<name>`` when ``stats.holdout`` is set), shape
        :meth:`~ghofl.stats.schema.ArraySpec.packed_shape`.

    Raises
    ------
    StatsValidationError
        A float sum is too large for float32 transport.
    """
    dtype = TRANSPORT_DTYPES[transport_dtype_name(transport_dtype)]
    out: dict[str, NDArray[Any]] = {}
    for part, stored, spec in schema_for(stats.mode).stored_arrays(stats.holdout is not None):
        section = stats if not part else stats.holdout
        arr = spec.pack(getattr(section, spec.name))
        if spec.dtype.kind == "f" and dtype != arr.dtype:
            arr = _to_transport(arr, dtype, stored)
        out[stored] = arr
    return out


def _to_transport(arr: NDArray[Any], dtype: np.dtype[Any], name: str) -> NDArray[Any]:
    peak = float(np.max(np.abs(arr), initial=0.0))
    if peak > float(np.finfo(dtype).max):
        raise StatsValidationError(
            f"{name} holds a value of magnitude {peak:.3g}, beyond the {dtype.name} range "
            f"({float(np.finfo(dtype).max):.3g}); transport these statistics as float64 "
            "(--transport-dtype float64) or clip the embeddings"
        )
    return np.ascontiguousarray(arr, dtype=dtype)


def stats_from_tensors(
    meta: StatsMeta,
    t: dict[str, NDArray[Any]],
    n_clipped: int = 0,
    holdout_n_clipped: int = 0,
    transport_dtype: Any = None,
    rounded_to: Any = "float64",
) -> ClientStats:
    """Rebuild :class:`ClientStats` from :func:`stats_tensors` output (validates).

    Parameters
    ----------
    meta : StatsMeta
        Metadata; its mode (and held-out fraction) decide which arrays ``t`` must hold.
    t : dict of str to ndarray
        Exactly the stored arrays of that mode, packed shapes.
    n_clipped : int, default 0
        Number of clipped samples (travels in the header, not as an array).
    holdout_n_clipped : int, default 0
        Number of clipped samples in the held-out section.
    transport_dtype : {"float64", "float32"}, optional
        Dtype the float arrays must have (``None``: that of ``t["sums"]``, float64 or
        float32). They are upcast to float64; float32 ones are validated with a tolerance
        for their rounding.
    rounded_to : {"float64", "float32"}, default "float64"
        Coarsest dtype the sums went through before (``"float32"`` for float64 sums of
        float32-transported payloads): validated with a tolerance for its rounding too.

    Raises
    ------
    StatsFormatError
        An array is missing, unexpected, of the wrong dtype or of the wrong packed shape.
    StatsValidationError
        The arrays do not form valid statistics.
    """
    layout = schema_for(meta.mode).stored_arrays(meta.has_holdout)
    tname = _checked_dtypes(meta, t, layout, transport_dtype)
    rounding = _rounding(tname, rounded_to)
    sections: dict[str, dict[str, NDArray[Any]]] = {}
    for part, name, spec in layout:
        # Symmetric arrays unpack straight into spec.dtype; the others are copied, so the
        # result holds no view of the (larger) buffer ``t``'s arrays may come from.
        sections.setdefault(part, {})[spec.name] = spec.unpack(np.asarray(t[name]),
                                                              meta.num_classes, meta.dim,
                                                              spec.dtype)
    # Finiteness on the packed arrays (half the entries of the symmetric ones), the held-out
    # section first as it is validated first below; not checked again on the unpacked ones.
    for _, name, spec in sorted(layout, key=lambda item: item[0] != HOLDOUT_PREFIX):
        check_finite(spec.name, np.asarray(t[name]))
    holdout = None
    if meta.has_holdout:
        holdout = ClientStats._from_transport(meta.without_holdout(), sections[HOLDOUT_PREFIX],
                                              n_clipped=holdout_n_clipped, rounding=rounding,
                                              unpacked=True, _finite_checked=True)
    return ClientStats._from_transport(meta, sections[""], n_clipped=n_clipped,
                                       holdout=holdout, rounding=rounding, unpacked=True,
                                       _finite_checked=True)


def packed_stats_from_tensors(
    meta: StatsMeta,
    t: dict[str, NDArray[Any]],
    n_clipped: int = 0,
    holdout_n_clipped: int = 0,
    transport_dtype: Any = None,
    rounded_to: Any = "float64",
    *,
    copy: bool = True,
) -> PackedStats:
    """:func:`stats_from_tensors`, keeping the symmetric matrices as they travel (packed).

    The same checks, in the same order, with the same messages, on the packed triangles; the
    result is :class:`~ghofl.stats.client_stats.packed.PackedStats`, what a server that only
    adds payloads reads them into (:class:`~ghofl.stats.StatsTotal` unpacks its total once).
    A payload with a held-out section is validated as :func:`stats_from_tensors` validates it
    (the check of total − held-out needs the matrices), then packed. Parameters, errors:
    :func:`stats_from_tensors`; ``copy=False`` (a reader's own buffer, which nothing else
    holds) keeps the float64 and int64 arrays of ``t`` as they are, made read-only, instead of
    copying them (float32 ones are always upcast into new arrays).
    """
    if meta.has_holdout:
        return PackedStats.of(stats_from_tensors(meta, t, n_clipped, holdout_n_clipped,
                                                 transport_dtype, rounded_to))
    layout = schema_for(meta.mode).stored_arrays(False)
    tname = _checked_dtypes(meta, t, layout, transport_dtype)
    arrays: dict[str, NDArray[Any]] = {}
    for _, name, spec in layout:
        arr = spec.check_packed(t[name], meta.num_classes, meta.dim)
        arrays[spec.name] = (arr if arr.dtype == spec.dtype and not copy
                             else arr.astype(spec.dtype))
    for field_name, arr in arrays.items():
        check_finite(field_name, arr)
    return PackedStats._from_transport(meta, arrays, n_clipped, _rounding(tname, rounded_to))


def _rounding(tname: str, rounded_to: Any) -> float:
    """Unit roundoff of the coarsest of the transport dtype and the earlier ``rounded_to``."""
    return max(TRANSPORT_ROUNDING[tname], TRANSPORT_ROUNDING[transport_dtype_name(rounded_to)])


def _checked_dtypes(meta: StatsMeta, t: Mapping[str, Any],
                    layout: tuple[tuple[str, str, ArraySpec], ...], transport_dtype: Any) -> str:
    """Refuse arrays other than the stored ones of ``meta``, or of another dtype.

    Returns the transport dtype's name (``transport_dtype``, or that of ``t["sums"]``).
    """
    check_array_names(meta, t)
    if transport_dtype is None:
        found = np.asarray(t["sums"]).dtype.name
        transport_dtype = found if found in TRANSPORT_DTYPES else "float64"
    tname = transport_dtype_name(transport_dtype)
    for _, name, spec in layout:
        arr = np.asarray(t[name])
        want = TRANSPORT_DTYPES[tname] if spec.dtype.kind == "f" else spec.dtype
        if arr.dtype != want:
            raise StatsFormatError(
                f"array {name!r} has dtype {arr.dtype} but must be {want} (transport dtype "
                f"{tname}); the payload is corrupt"
            )
    return tname


def through_transport(stats: ClientStats, transport_dtype: Any = "float64") -> ClientStats:
    """``stats`` as a receiver reads them after transport in ``transport_dtype``.

    Unchanged for float64; for float32 every float sum rounded to float32 (and back to float64);
    validated as a received payload. What the in-process simulator uses to model float32 uploads.

    Raises
    ------
    StatsValidationError
        A sum is beyond the float32 range.
    """
    tname = transport_dtype_name(transport_dtype)
    if tname == "float64":
        return stats
    held = 0 if stats.holdout is None else stats.holdout.n_clipped
    return stats_from_tensors(stats.meta, stats_tensors(stats, tname), stats.n_clipped, held,
                              tname, rounding_name(stats.rounding))


def check_array_names(meta: StatsMeta, names: Iterable[str], where: str = "") -> None:
    """Refuse a payload of ``meta`` whose arrays are not exactly the stored arrays of its mode.

    Parameters
    ----------
    meta : StatsMeta
        The payload's metadata; its mode and held-out fraction decide the stored arrays
        (:meth:`~ghofl.stats.schema.ModeSchema.stored_arrays`).
    names : iterable of str
        The stored names of the arrays the payload holds.
    where : str, default ""
        Prefix of the message, naming the payload (e.g. ``"'x.ghs' holds malformed
        statistics: "``).

    Raises
    ------
    StatsFormatError
        An array is missing (the first one named) or unexpected (all of them named).
    """
    stored = [name for _, name, _ in schema_for(meta.mode).stored_arrays(meta.has_holdout)]
    held = set(names)
    missing = [name for name in stored if name not in held]
    if missing:
        raise StatsFormatError(
            f"{where}statistics payload lacks the array {missing[0]!r}; it is corrupt (mode "
            f"{meta.mode!r} payloads{_with_holdout(meta)} hold {', '.join(stored)})"
        )
    extra = sorted(held.difference(stored))
    if extra:
        raise StatsFormatError(
            f"{where}statistics payload of mode {meta.mode!r}{_with_holdout(meta)} holds "
            f"unexpected array(s) {', '.join(map(repr, extra))}; it holds exactly "
            f"{', '.join(stored)}, so it is corrupt or its metadata names the wrong mode or "
            "held-out fraction"
        )


class DeclaredArray(NamedTuple):
    """One array of a payload as its header declares it, before any of its bytes is read.

    Attributes
    ----------
    dtype : str
        Its dtype in the payload's spelling (``"F64"`` in files, ``"float64"`` in records).
    shape : tuple of int
        Its declared shape.
    nbytes : int or None, default None
        The bytes the payload carries for it (``None``: checked by the container already).
    """

    dtype: str
    shape: tuple[int, ...]
    nbytes: int | None = None


def check_declared_arrays(
    meta: StatsMeta,
    declared: Mapping[str, DeclaredArray],
    *,
    transport: str = "float64",
    dtypes: Mapping[str, np.dtype[Any]] = NUMPY_DTYPES,
    where: str = "",
    overhead: int = 0,
) -> None:
    """Refuse a payload whose declared arrays are not those the schema of ``meta`` implies.

    Runs on the header alone, before any array byte is read or hashed: the names must be
    exactly the stored arrays of the mode (:func:`check_array_names`), each dtype that of
    the schema (float arrays in ``transport``), each shape the packed shape for C classes
    in dimension d, and each array's bytes at most its shape's plus ``overhead``.

    Parameters
    ----------
    meta : StatsMeta
        The payload's declared metadata (mode, C, d, held-out section).
    declared : mapping of str to DeclaredArray
        The arrays by stored name.
    transport : {"float64", "float32"}, default "float64"
        The declared transport dtype of the float arrays.
    dtypes : mapping of str to dtype, default :data:`NUMPY_DTYPES`
        The payload's dtype names (e.g. the safetensors ``F64``) to little-endian dtypes.
    where : str, default ""
        Prefix of the messages, naming the payload.
    overhead : int, default 0
        Bytes an array may carry beyond its data (e.g. an ``.npy`` header).

    Raises
    ------
    StatsFormatError
        An array is missing or unexpected, or of another dtype, shape or size; one line
        naming the array, what it must be and why the payload is refused.
    """
    check_array_names(meta, declared, where)
    names = {dtype: name for name, dtype in dtypes.items()}
    tdtype = TRANSPORT_DTYPES[transport_dtype_name(transport)]
    for _, name, spec in schema_for(meta.mode).stored_arrays(meta.has_holdout):
        t = declared[name]
        want_dtype = (tdtype if spec.dtype.kind == "f" else spec.dtype).newbyteorder("<")
        want = names.get(want_dtype, want_dtype.name)
        if t.dtype != want:
            note = (f" (header transport_dtype {transport})"
                    if spec.dtype.kind == "f" and transport != "float64" else "")
            raise StatsFormatError(
                f"{where}array {name!r} has dtype {str(t.dtype)[:20]} but must be {want}{note}; "
                "the payload is corrupt (integers are never read as floats or back)"
            )
        expected = spec.packed_shape(meta.num_classes, meta.dim)
        if tuple(t.shape) != expected:
            how = " (row-major upper triangles)" if spec.symmetric else ""
            raise StatsFormatError(
                f"{where}array {name!r} must have shape {expected}{how} for "
                f"C={meta.num_classes} classes and d={meta.dim}; got {str(tuple(t.shape))[:60]}; "
                "the payload is corrupt or was written for another class list or dimension"
            )
        limit = spec.packed_size(meta.num_classes, meta.dim) * want_dtype.itemsize + overhead
        if t.nbytes is not None and t.nbytes > limit:
            raise StatsFormatError(
                f"{where}array {name!r} carries {t.nbytes} bytes, more than the {limit} its "
                f"shape {expected} needs; the payload is corrupt or hostile"
            )


def _with_holdout(meta: StatsMeta) -> str:
    return " with a held-out section" if meta.has_holdout else ""


def payload_nbytes(stats: ClientStats | PackedStats, transport_dtype: Any = "float64") -> int:
    """Bytes of array data one client uploads for ``stats`` (excluding the small header).

    Held-out section included, float arrays in ``transport_dtype``.
    """
    return expected_payload_nbytes(stats.mode, stats.num_classes, stats.dim,
                                   holdout=stats.holdout is not None,
                                   transport_dtype=transport_dtype)


def expected_payload_nbytes(
    mode: str, num_classes: int, dim: int, holdout: bool = False,
    transport_dtype: Any = "float64",
) -> int:
    """Bytes of array data of a payload of ``mode`` for C classes in dimension d (no allocation).

    full: N + A + C·d(d+1)/2; pooled: N + A + D + d(d+1)/2; gram: N + A + d(d+1)/2; diag:
    N + A + D; means: N + A (8 bytes each, 4 for the float arrays under float32 transport),
    twice with a held-out section; see :meth:`~ghofl.stats.schema.ModeSchema.nbytes`.
    """
    dtype = TRANSPORT_DTYPES[transport_dtype_name(transport_dtype)]
    return schema_for(mode).nbytes(num_classes, dim, holdout=holdout, float_dtype=dtype)
