"""Versioned on-disk format of :class:`ClientStats` (file extension ``.ghs``).

Format: a `safetensors <https://github.com/huggingface/safetensors>`_ file. We chose it over
``npz`` because its header is plain JSON followed by raw little-endian buffers (no pickle, no
zip), it is readable from Rust/JS/C++ without numpy, it loads lazily tensor by tensor, and its
length-prefixed header makes truncation detectable before any data is trusted.

* header metadata: ``format = "ghofl.stats"``, ``schema_version``, ``meta`` (JSON of
  :class:`StatsMeta`, including the clipping bound ``clip_norm``), ``n_clipped`` (decimal
  count of clipped samples; absent in version-1 files, read as 0) and ``content_sha256``;
* tensors: the arrays of the mode's :class:`~ghofl.stats.schema.ModeSchema` under their
  ``stored_name``: ``counts`` int64 (C,), ``sums`` float64 (C, d), and by mode ``sq_sums``
  (C, d), ``class_scatter_triu`` (C, d(d+1)/2) and ``scatter_triu`` (d(d+1)/2,): symmetric
  matrices travel as their upper triangles in row-major order (``numpy.triu_indices``), which
  halves them.

Schema version 2 added ``clip_norm`` and ``n_clipped``; version-1 files still load (as unclipped
statistics, upgraded to the current version so they combine with new payloads).

Schema version 3 added two options; a file that uses neither is written exactly as version 2
(so older ghofl reads it):

* a held-out section (meta ``holdout_fraction`` f > 0): the same tensors again over the
  samples the client held out, named with the prefix ``holdout.`` (``holdout.counts``,
  ``holdout.sums``, ``holdout.class_scatter_triu``...), and the header entry
  ``holdout_n_clipped``;
* float32 transport (header entry ``transport_dtype = "float32"``; absent means float64):
  every float tensor is stored as ``F32`` (half the bytes); the counts stay ``I64``. Readers
  upcast to float64 and validate with a tolerance for the float32 rounding; accumulation and
  aggregation are always float64. A float64 file of sums that went through float32 before
  (the total of float32 payloads) says so in the header entry ``rounded_to = "float32"``, and
  is validated with the same tolerance.

Integrity: ``content_sha256`` (header metadata) is the lowercase hex SHA-256 of the canonical
JSON ``{"metadata": <header metadata without this key>, "tensors": <tensor table>}`` (keys
sorted, no spaces, UTF-8), followed by one NUL byte and the whole data section (every byte after
the header, i.e. the tensors in offset order): it covers the tensor bytes, their declared
dtypes, shapes and offsets, and every header value. Every file ghofl writes carries it, and a
file that does not match it is refused. Files written before the digest existed (older
ghofl; same schema versions) are still read, with a :class:`~ghofl.moments.core.GhoflWarning`
saying their bytes could not be verified. Adding the key did not change the schema version:
older ghofl ignores it and reads the new files.

Reading never trusts the file: it must be a regular file (FIFOs, devices and directories are
refused before opening for reading data); the header length, the header JSON (size, nesting
depth, no NaN/Infinity, no duplicate keys, bounded numbers), every tensor's dtype (an
allow-list), shape and byte span (contiguous, non-overlapping, covering exactly the rest of
the file) and the expected tensor names and shapes are checked before any tensor byte is
read, so a header that declares huge sizes is refused without allocating them.

Writes are atomic (:func:`ghofl.files.atomic_write`: a temporary file in the target folder,
then ``os.replace``); ``atomic_write`` is re-exported here for older imports.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import stat
import warnings
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
from numpy.typing import NDArray

from ghofl.errors import (
    GhoflError,
    GhoflWarning,
    StatsFormatError,
    StatsValidationError,
    WriteError,
)
from ghofl.files import atomic_write
from ghofl.stats._json import (
    MAX_HEADER_BYTES,
    MAX_JSON_VALUES,
    parse_json,
)
from ghofl.stats.client_stats import ClientStats
from ghofl.stats.meta import (
    HOLDOUT_SCHEMA_VERSION,
    MIN_SCHEMA_VERSION,
    SCHEMA_VERSION,
    StatsMeta,
)
from ghofl.stats.schema import HOLDOUT_PREFIX, pack_upper, schema_for, unpack_upper

__all__ = [
    "DIGEST_KEY",
    "FORMAT",
    "MAX_HEADER_BYTES",
    "MAX_JSON_VALUES",
    "MIN_SCHEMA_VERSION",
    "TensorInfo",
    "atomic_write",
    "check_transport_dtype",
    "expected_payload_nbytes",
    "load_stats",
    "pack_upper",
    "parse_json",
    "payload_nbytes",
    "read_safetensors",
    "read_stats_file",
    "rounding_name",
    "save_stats",
    "stats_from_tensors",
    "stats_tensors",
    "through_transport",
    "unpack_upper",
    "write_safetensors",
]

FORMAT = "ghofl.stats"
#: Header metadata keys of a statistics file (besides :data:`DIGEST_KEY`).
STATS_KEYS = frozenset({
    "format", "schema_version", "meta", "n_clipped", "holdout_n_clipped", "transport_dtype",
    "rounded_to",
})
#: Header key holding the SHA-256 (hex) of the data section.
DIGEST_KEY = "content_sha256"
#: Dtypes ghofl reads and writes, safetensors name to little-endian numpy dtype.
DTYPES: dict[str, np.dtype[Any]] = {"F64": np.dtype("<f8"), "I64": np.dtype("<i8")}
#: Dtypes of statistics files (float32 transport of the float sums adds ``F32``).
STATS_DTYPES: dict[str, np.dtype[Any]] = {**DTYPES, "F32": np.dtype("<f4")}
_NAMES = {v: k for k, v in STATS_DTYPES.items()}
#: Transport dtypes of the float arrays of statistics, by name.
TRANSPORT_DTYPES: dict[str, np.dtype[Any]] = {
    "float64": np.dtype(np.float64), "float32": np.dtype(np.float32),
}
#: Largest relative rounding error per entry of each transport dtype (unit roundoff).
_ROUNDING = {"float64": 0.0, "float32": 2.0**-24}


def rounding_name(rounding: float) -> str:
    """The transport dtype whose unit roundoff covers ``rounding`` (``"float64"`` for 0)."""
    for name, u in sorted(_ROUNDING.items(), key=lambda kv: kv[1]):
        if rounding <= u:
            return name
    raise StatsValidationError(  # pragma: no cover - only float32 rounds
        f"no transport dtype covers a rounding of {rounding:g}"
    )
_MAX_NDIM = 4
_CHUNK = 1 << 24


# ---------------------------------------------------------------------- tensors
def check_transport_dtype(dtype: Any) -> str:
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
    dtype = TRANSPORT_DTYPES[check_transport_dtype(transport_dtype)]
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
    schema = schema_for(meta.mode)
    layout = schema.stored_arrays(meta.has_holdout)
    stored = [name for _, name, _ in layout]
    missing = [name for name in stored if name not in t]
    if missing:
        raise StatsFormatError(
            f"statistics payload lacks the array {missing[0]!r}; it is corrupt (mode "
            f"{meta.mode!r} payloads{_with_holdout(meta)} hold {', '.join(stored)})"
        )
    extra = sorted(name for name in t if name not in stored)
    if extra:
        raise StatsFormatError(
            f"statistics payload of mode {meta.mode!r}{_with_holdout(meta)} holds unexpected "
            f"array(s) {', '.join(map(repr, extra))}; it holds exactly {', '.join(stored)}, so "
            "it is corrupt or its metadata names the wrong mode or held-out fraction"
        )
    if transport_dtype is None:
        found = np.asarray(t["sums"]).dtype.name
        transport_dtype = found if found in TRANSPORT_DTYPES else "float64"
    tname = check_transport_dtype(transport_dtype)
    sections: dict[str, dict[str, NDArray[Any]]] = {}
    for part, name, spec in layout:
        arr = np.asarray(t[name])
        want = TRANSPORT_DTYPES[tname] if spec.dtype.kind == "f" else spec.dtype
        if arr.dtype != want:
            raise StatsFormatError(
                f"array {name!r} has dtype {arr.dtype} but must be {want} (transport dtype "
                f"{tname}); the payload is corrupt"
            )
        # Symmetric arrays unpack straight into spec.dtype; the others are copied, so the
        # result holds no view of the (larger) buffer ``t``'s arrays may come from.
        sections.setdefault(part, {})[spec.name] = spec.unpack(arr, meta.num_classes, meta.dim,
                                                              spec.dtype)
    rounding = max(_ROUNDING[tname], _ROUNDING[check_transport_dtype(rounded_to)])
    holdout = None
    if meta.has_holdout:
        holdout = ClientStats.from_transport(meta.without_holdout(), sections[HOLDOUT_PREFIX],
                                             n_clipped=holdout_n_clipped, rounding=rounding,
                                             unpacked=True)
    return ClientStats.from_transport(meta, sections[""], n_clipped=n_clipped,
                                      holdout=holdout, rounding=rounding, unpacked=True)


def through_transport(stats: ClientStats, transport_dtype: Any = "float64") -> ClientStats:
    """``stats`` as a receiver reads them after transport in ``transport_dtype``.

    Unchanged for float64; for float32 every float sum rounded to float32 (and back to float64);
    validated as a received payload. What the in-process simulator uses to model float32 uploads.

    Raises
    ------
    StatsValidationError
        A sum is beyond the float32 range.
    """
    tname = check_transport_dtype(transport_dtype)
    if tname == "float64":
        return stats
    held = 0 if stats.holdout is None else stats.holdout.n_clipped
    return stats_from_tensors(stats.meta, stats_tensors(stats, tname), stats.n_clipped, held,
                              tname, rounding_name(stats.rounding))


def _with_holdout(meta: StatsMeta) -> str:
    return " with a held-out section" if meta.has_holdout else ""


def payload_nbytes(stats: ClientStats, transport_dtype: Any = "float64") -> int:
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

    full: N + A + C·d(d+1)/2; pooled: N + A + D + d(d+1)/2; diag: N + A + D (8 bytes each, 4
    for the float arrays under float32 transport), twice with a held-out section; see
    :meth:`~ghofl.stats.schema.ModeSchema.nbytes`.
    """
    dtype = TRANSPORT_DTYPES[check_transport_dtype(transport_dtype)]
    return schema_for(mode).nbytes(num_classes, dim, holdout=holdout, float_dtype=dtype)


# ---------------------------------------------------------------------- writing
def write_safetensors(
    path: str | os.PathLike[str], tensors: Mapping[str, NDArray[Any]], metadata: dict[str, str]
) -> int:
    """Write a safetensors file with a ``content_sha256`` header entry, atomically.

    Tensors are laid out in name order; the header is padded with spaces to a multiple of 8
    bytes (as the reference implementation does), so any safetensors reader can read it.
    Only float64, float32 and int64 arrays are written (:data:`STATS_DTYPES`).

    Returns
    -------
    int
        The size of the written file in bytes.

    Raises
    ------
    StatsFormatError
        An array has a dtype ghofl does not write.
    WriteError
        The file could not be written (disk full, permissions...); nothing is left behind
        and an existing file keeps its content.
    """
    arrays: list[tuple[str, NDArray[Any]]] = []
    for name in sorted(tensors):
        arr = np.asarray(tensors[name])
        dtype = arr.dtype.newbyteorder("<")
        if dtype not in _NAMES:
            raise StatsFormatError(
                f"cannot write array {name!r} of dtype {arr.dtype}; ghofl files hold only "
                f"{', '.join(str(d) for d in STATS_DTYPES.values())} arrays"
            )
        arrays.append((name, np.ascontiguousarray(arr, dtype=dtype).reshape(arr.shape)))
    table: dict[str, Any] = {}
    offset = 0
    for name, arr in arrays:
        table[name] = {
            "dtype": _NAMES[arr.dtype],
            "shape": list(arr.shape),
            "data_offsets": [offset, offset + arr.nbytes],
        }
        offset += arr.nbytes
    plain = {k: v for k, v in metadata.items() if k != DIGEST_KEY}
    digest = _header_digest(plain, table)
    for _, arr in arrays:
        digest.update(arr.reshape(-1).view(np.uint8).data)
    meta = {**plain, DIGEST_KEY: digest.hexdigest()}
    head = json.dumps({"__metadata__": meta, **table}, separators=(",", ":")).encode()
    head += b" " * (-len(head) % 8)

    def write(tmp: str) -> None:
        with open(tmp, "wb") as f:
            f.write(len(head).to_bytes(8, "little"))
            f.write(head)
            for _, arr in arrays:
                f.write(arr.reshape(-1).view(np.uint8).data)
            f.flush()
            os.fsync(f.fileno())

    try:
        atomic_write(path, write)
    except OSError as exc:
        if isinstance(exc, GhoflError):
            raise
        reason = exc.strerror or str(exc) or type(exc).__name__
        raise WriteError(
            f"could not write {str(path)!r} ({reason}); the previous file, if any, is "
            "unchanged and no temporary file is left; free disk space or choose another path"
        ) from exc
    return 8 + len(head) + offset


def save_stats(
    stats: ClientStats, path: str | os.PathLike[str], transport_dtype: Any = "float64"
) -> int:
    """Write ``stats`` to ``path`` atomically (with a data digest); return the file size.

    ``transport_dtype="float32"`` stores the float sums as float32 (half the bytes; header
    entry ``transport_dtype``). Sums that went through float32 transport before (e.g. the
    total of float32 payloads) and are written as float64 record it in the header entry
    ``rounded_to = "float32"``, so re-reading them tolerates that rounding. The schema
    version written is the oldest that holds the content: 2 without a held-out section, with
    float64 and no such rounding, else 3.
    """
    tname = check_transport_dtype(transport_dtype)
    version = stats.meta.written_version()
    meta = {
        "format": FORMAT,
        "schema_version": "",
        "meta": json.dumps(stats.meta.to_dict(), sort_keys=True),
        "n_clipped": str(stats.n_clipped),
    }
    if stats.holdout is not None:
        meta["holdout_n_clipped"] = str(stats.holdout.n_clipped)
    if tname != "float64":
        meta["transport_dtype"] = tname
        version = max(version, HOLDOUT_SCHEMA_VERSION)
    rounded = rounding_name(max(stats.rounding, _ROUNDING[tname]))
    if rounded != tname:  # e.g. a float64 total of float32-transported payloads
        meta["rounded_to"] = rounded
        version = max(version, HOLDOUT_SCHEMA_VERSION)
    meta["schema_version"] = str(version)
    return write_safetensors(path, stats_tensors(stats, tname), meta)


# ---------------------------------------------------------------------- reading
@dataclass(frozen=True)
class TensorInfo:
    """One tensor as declared by a safetensors header (checked against the file)."""

    dtype: str
    shape: tuple[int, ...]
    begin: int
    end: int


#: Check of the header before any data is read: ``(metadata, tensors)``; raises GhoflError.
HeaderCheck = Callable[[dict[str, str], dict[str, TensorInfo]], None]


def read_safetensors(
    path: str | os.PathLike[str],
    expected_format: str,
    what: str,
    check: HeaderCheck | None = None,
    keys: frozenset[str] | None = None,
    dtypes: Mapping[str, np.dtype[Any]] = DTYPES,
) -> tuple[dict[str, str], dict[str, NDArray[Any]]]:
    """Read a ghofl safetensors file, trusting nothing in it.

    Parameters
    ----------
    path : path-like
        A regular file.
    expected_format : str
        The ``format`` tag the header must hold.
    what : str
        What the file is, for messages (``"statistics"``, ``"head"``).
    keys : frozenset of str, optional
        The metadata keys the format may hold (besides the digest); any other key is
        refused (so a damaged digest key cannot pass the file off as an older one).
    check : callable, optional
        Called with the header metadata and the declared tensors after the structural checks
        and before any data is read (e.g. to require exact names and shapes).
    dtypes : mapping of str to dtype, default :data:`DTYPES`
        The safetensors dtypes accepted (statistics files also accept ``F32``).

    Returns
    -------
    header : dict of str to str
        The ``__metadata__`` section.
    tensors : dict of str to ndarray
        The arrays (float64 or int64, native byte order).

    Raises
    ------
    StatsFormatError
        Missing, not a regular file, truncated, oversized, foreign, corrupt (including a
        data digest mismatch) or of an unsupported version.
    """
    p = Path(path)
    fd = _open_regular(p, what)
    with os.fdopen(fd, "rb") as f:
        size = os.fstat(f.fileno()).st_size
        header, table, data_start = _read_header(f, p, size, what, dtypes)
        _check_header(header, p, expected_format, what)
        unknown = sorted(k for k in header if keys is not None and k not in keys | {DIGEST_KEY})
        if unknown:
            raise StatsFormatError(
                f"{str(p)!r} has the unknown header key {unknown[0][:40]!r} (a ghofl {what} file "
                f"holds {', '.join(sorted(keys or ()))} and {DIGEST_KEY}); it is corrupt, "
                "re-create it with ghofl"
            )
        if check is not None:
            check(header, table)
        data = _read_data(f, p, size - data_start, what)
    expected = header.get(DIGEST_KEY)
    if expected is None:
        warnings.warn(
            f"{str(p)!r} has no {DIGEST_KEY} integrity digest (it was written by an older "
            "ghofl), so its bytes could not be verified; re-save it with this ghofl to add one",
            GhoflWarning,
            stacklevel=3,
        )
    else:
        plain = {k: v for k, v in header.items() if k != DIGEST_KEY}
        canon = {name: {"dtype": t.dtype, "shape": list(t.shape),
                        "data_offsets": [t.begin, t.end]} for name, t in table.items()}
        h = _header_digest(plain, canon)
        h.update(data)
        actual = h.hexdigest()
        if actual != expected:
            raise StatsFormatError(
                f"{str(p)!r} is corrupt: the SHA-256 of its content is {actual[:16]}… but its "
                f"header records {expected[:16]}…; its bytes changed after ghofl wrote it; "
                "re-create or re-download the file"
            )
    tensors = {name: _tensor(data, t) for name, t in table.items()}
    return header, tensors


def _tensor(data: NDArray[np.uint8], t: TensorInfo) -> NDArray[Any]:
    dtype = STATS_DTYPES[t.dtype]
    n = _prod(t.shape)
    if n == 0:
        return np.zeros(t.shape, dtype.newbyteorder("="))
    arr = np.frombuffer(data, dtype, n, t.begin).reshape(t.shape)
    return arr.astype(dtype.newbyteorder("="), copy=False)


def _header_digest(metadata: dict[str, str], table: dict[str, Any]) -> Any:
    """SHA-256 state after the canonical header JSON and the NUL separator."""
    canon = json.dumps({"metadata": metadata, "tensors": table}, sort_keys=True,
                       separators=(",", ":"), ensure_ascii=False)
    return hashlib.sha256(canon.encode("utf-8", "surrogatepass") + b"\0")


def _open_regular(p: Path, what: str) -> int:
    try:
        st = os.stat(p)
    except FileNotFoundError:
        raise StatsFormatError(f"{what} file {str(p)!r} does not exist; check the path") from None
    if stat.S_ISDIR(st.st_mode):
        raise StatsFormatError(f"{what} path {str(p)!r} is a directory; give a file")
    if not stat.S_ISREG(st.st_mode):
        raise StatsFormatError(
            f"{what} path {str(p)!r} is not a regular file (a FIFO, device or socket); "
            "give a file written by ghofl"
        )
    fd = os.open(p, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0))
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):  # replaced between stat and open
            raise StatsFormatError(
                f"{what} path {str(p)!r} is not a regular file; give a file written by ghofl"
            )
    except BaseException:
        os.close(fd)
        raise
    return fd


def _corrupt(p: Path, what: str, reason: str) -> StatsFormatError:
    return StatsFormatError(
        f"{str(p)!r} is not a readable ghofl {what} file (it is truncated, corrupt or of "
        f"another format: {reason}); re-create it with ghofl"
    )


def _read_exact(f: Any, n: int) -> bytes:
    out = bytearray()
    while len(out) < n:
        chunk = f.read(min(n - len(out), _CHUNK))
        if not chunk:
            break
        out += chunk
    return bytes(out)


def _read_header(
    f: Any, p: Path, size: int, what: str, dtypes: Mapping[str, np.dtype[Any]] = DTYPES
) -> tuple[dict[str, str], dict[str, TensorInfo], int]:
    prefix = _read_exact(f, 8)
    if len(prefix) < 8:
        raise _corrupt(p, what, f"the file is {size} bytes long, shorter than the 8-byte "
                       "header length")
    n = int.from_bytes(prefix, "little")
    if n > MAX_HEADER_BYTES:
        raise _corrupt(p, what, f"the header declares {n} bytes, more than the "
                       f"{MAX_HEADER_BYTES} allowed")
    if 8 + n > size:
        raise _corrupt(p, what, f"the header declares {n} bytes but the file holds only "
                       f"{size - 8} after the length")
    raw = _read_exact(f, n)
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise _corrupt(p, what, f"the header is not UTF-8 ({exc.reason})") from None
    try:
        doc = parse_json(text, "the header", "re-create it with ghofl")
    except StatsFormatError as exc:
        raise _corrupt(p, what, str(exc).split(";")[0]) from None
    if not isinstance(doc, dict):
        raise _corrupt(p, what, f"the header is a JSON {type(doc).__name__}, not an object")
    meta = doc.pop("__metadata__", {})
    if not isinstance(meta, dict) or not all(isinstance(v, str) for v in meta.values()):
        raise _corrupt(p, what, "the header metadata is not an object of strings")
    table = {name: _tensor_info(name, entry, p, what, dtypes) for name, entry in doc.items()}
    data_size = size - 8 - n
    end = 0
    for name, t in sorted(table.items(), key=lambda kv: (kv[1].begin, kv[1].end)):
        if t.begin != end:
            how = "overlaps another" if t.begin < end else "leaves a gap before it"
            raise _corrupt(p, what, f"tensor {name!r} starts at byte {t.begin} and {how}")
        end = t.end
    if end != data_size:
        raise _corrupt(p, what, f"the tensors declare {end} bytes of data but the file holds "
                       f"{data_size}")
    return meta, table, 8 + n


def _tensor_info(
    name: str, entry: Any, p: Path, what: str, dtypes: Mapping[str, np.dtype[Any]] = DTYPES
) -> TensorInfo:
    if not isinstance(entry, dict) or set(entry) != {"dtype", "shape", "data_offsets"}:
        raise _corrupt(p, what, f"tensor {name!r} is not described by dtype, shape and "
                       "data_offsets")
    dtype, shape, offsets = entry["dtype"], entry["shape"], entry["data_offsets"]
    if not isinstance(dtype, str) or dtype not in dtypes:
        raise _corrupt(p, what, f"tensor {name!r} has dtype {str(dtype)[:20]!r}; ghofl files "
                       f"hold only {', '.join(dtypes)}")
    if not (isinstance(shape, list) and len(shape) <= _MAX_NDIM
            and all(_is_count(s) for s in shape)):
        raise _corrupt(p, what, f"tensor {name!r} has shape {str(shape)[:60]}; expected a list "
                       f"of at most {_MAX_NDIM} non-negative integers")
    if not (isinstance(offsets, list) and len(offsets) == 2 and all(_is_count(o) for o in offsets)
            and offsets[0] <= offsets[1]):
        raise _corrupt(p, what, f"tensor {name!r} has data_offsets {str(offsets)[:60]}; expected "
                       "[begin, end] with 0 <= begin <= end")
    nbytes = _prod(tuple(shape)) * dtypes[dtype].itemsize
    if offsets[1] - offsets[0] != nbytes:
        raise _corrupt(p, what, f"tensor {name!r} of shape {tuple(shape)} needs {nbytes} bytes "
                       f"but spans {offsets[1] - offsets[0]}")
    return TensorInfo(dtype, tuple(shape), offsets[0], offsets[1])


def _is_count(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool) and v >= 0


def _prod(shape: tuple[int, ...]) -> int:
    out = 1
    for s in shape:
        out *= s
    return out


def _read_data(f: Any, p: Path, n: int, what: str) -> NDArray[np.uint8]:
    """The ``n`` bytes of the data section, read straight into one uninitialised buffer.

    No zero fill, no joined copies: the tensors are views of it.
    """
    data = np.empty(n, dtype=np.uint8)
    view = memoryview(data.data)
    got = 0
    while got < n:
        k = f.readinto(view[got : got + _CHUNK])
        if not k:
            break
        got += k
    view.release()
    if got != n:
        raise _corrupt(p, what, f"the data section ended after {got} of {n} bytes")
    return data


def _check_header(header: dict[str, str], p: Path, expected: str, what: str) -> None:
    fmt = header.get("format")
    if fmt != expected:
        raise StatsFormatError(
            f"{str(p)!r} is not a ghofl {what} file (format tag {fmt!r}, expected {expected!r})"
        )
    raw = header.get("schema_version", "-1")
    version = int(raw) if re.fullmatch(r"-?[0-9]{1,9}", raw) else -1
    if version > SCHEMA_VERSION:
        raise StatsFormatError(
            f"{str(p)!r} uses {what} schema version {version}, newer than this ghofl supports "
            f"({SCHEMA_VERSION}); upgrade ghofl"
        )
    if version < MIN_SCHEMA_VERSION:
        raise StatsFormatError(
            f"{str(p)!r} uses {what} schema version {version}, older than this ghofl supports "
            f"({MIN_SCHEMA_VERSION}); re-create it with the current ghofl"
        )
    digest = header.get(DIGEST_KEY)
    if digest is not None and not re.fullmatch(r"[0-9a-f]{64}", digest):
        raise StatsFormatError(
            f"{str(p)!r} has a malformed {DIGEST_KEY} header ({digest[:80]!r}); expected 64 "
            "lowercase hex digits; the file is corrupt, re-create it with ghofl"
        )


def header_meta(header: dict[str, str], path: str | os.PathLike[str]) -> StatsMeta:
    """The :class:`StatsMeta` of the ``meta`` header entry, parsed defensively."""
    raw = header.get("meta")
    if raw is None:
        raise StatsFormatError(f"{str(path)!r} has a missing or corrupt metadata header "
                               "(no 'meta' entry); re-create it with ghofl")
    try:
        meta_dict = parse_json(raw, "the metadata header")
    except StatsFormatError as exc:
        raise StatsFormatError(f"{str(path)!r} has a missing or corrupt metadata header: "
                               f"{exc}") from exc
    return StatsMeta.from_dict(meta_dict)


def load_stats(path: str | os.PathLike[str]) -> ClientStats:
    """Read and validate statistics written by :func:`save_stats`.

    The tensor names, dtypes and shapes are checked against the header metadata (mode, C,
    d, held-out section, transport dtype) before any data is read. Float32-transported sums
    are returned as float64.
    """
    return read_stats_file(path)[0]


def read_stats_file(path: str | os.PathLike[str]) -> tuple[ClientStats, str]:
    """:func:`load_stats`, also returning the file's transport dtype.

    ``"float64"`` or ``"float32"``.
    """
    state: dict[str, Any] = {}

    def check(header: dict[str, str], table: dict[str, TensorInfo]) -> None:
        meta = header_meta(header, path)
        state["meta"] = meta
        state["n_clipped"] = _header_count(header, "n_clipped", path)
        state["holdout_n_clipped"] = _header_count(header, "holdout_n_clipped", path)
        if "holdout_n_clipped" in header and not meta.has_holdout:
            raise StatsFormatError(
                f"{str(path)!r} has the header entry holdout_n_clipped but no held-out "
                "section (its metadata has no holdout_fraction); it is corrupt, re-create it "
                "with ghofl"
            )
        state["transport"] = _header_transport(header, path)
        state["rounded_to"] = _header_transport(header, path, "rounded_to")
        _check_stats_layout(meta, table, path, state["transport"])

    _, tensors = read_safetensors(path, FORMAT, "statistics", check, STATS_KEYS, STATS_DTYPES)
    try:
        stats = stats_from_tensors(state["meta"], tensors, state["n_clipped"],
                                   state["holdout_n_clipped"], state["transport"],
                                   state["rounded_to"])
    except StatsFormatError as exc:
        raise StatsFormatError(f"{str(path)!r} holds malformed statistics: {exc}") from exc
    return stats, state["transport"]


def _check_stats_layout(
    meta: StatsMeta, table: dict[str, TensorInfo], path: str | os.PathLike[str],
    transport: str = "float64",
) -> None:
    schema = schema_for(meta.mode)
    layout = schema.stored_arrays(meta.has_holdout)
    stored = [name for _, name, _ in layout]
    where = f"{str(path)!r} holds malformed statistics"
    for name in table:
        if name not in stored:
            raise StatsFormatError(
                f"{where}: statistics payload of mode {meta.mode!r}{_with_holdout(meta)} holds "
                f"unexpected array(s) {name!r}; it holds exactly {', '.join(stored)}, so it is "
                "corrupt or its metadata names the wrong mode or held-out fraction"
            )
    for _, name, spec in layout:
        t = table.get(name)
        if t is None:
            raise StatsFormatError(
                f"{where}: statistics payload lacks the array {name!r}; it is "
                f"corrupt (mode {meta.mode!r} payloads{_with_holdout(meta)} hold "
                f"{', '.join(stored)})"
            )
        dtype = TRANSPORT_DTYPES[transport] if spec.dtype.kind == "f" else spec.dtype
        want = _NAMES[dtype.newbyteorder("<")]
        if t.dtype != want:
            note = (f" (header transport_dtype {transport})"
                    if spec.dtype.kind == "f" and transport != "float64" else "")
            raise StatsFormatError(
                f"{where}: array {name!r} has dtype {t.dtype} but must be {want}{note}; the "
                "payload is corrupt (integers are never read as floats or back)"
            )
        expected = spec.packed_shape(meta.num_classes, meta.dim)
        if t.shape != expected:
            how = " (row-major upper triangles)" if spec.symmetric else ""
            raise StatsFormatError(
                f"{where}: array {name!r} must have shape {expected}{how} for "
                f"C={meta.num_classes} classes and d={meta.dim}; got {t.shape}; the payload is "
                "corrupt or was written for another class list or dimension"
            )


def _header_count(header: dict[str, str], key: str, path: str | os.PathLike[str]) -> int:
    """A count header value such as ``n_clipped`` (0 when absent, as in version-1 files)."""
    raw = header.get(key, "0")
    if not (raw.isascii() and raw.isdigit() and len(raw) <= 19):
        raise StatsFormatError(
            f"{str(path)!r} has header {key} {raw[:40]!r}; expected a non-negative decimal "
            "integer; the file is corrupt, re-create it with ghofl"
        )
    return int(raw)


def _header_transport(
    header: dict[str, str], path: str | os.PathLike[str], key: str = "transport_dtype"
) -> str:
    """The ``transport_dtype`` (or ``rounded_to``) header value (``"float64"`` when absent)."""
    raw = header.get(key)
    if raw is None:
        return "float64"
    if raw != "float32":  # float64 is never written: it is the default
        raise StatsFormatError(
            f"{str(path)!r} has header {key} {raw[:40]!r}; expected 'float32' (or "
            "no entry for float64); the file is corrupt, re-create it with ghofl"
        )
    version = header.get("schema_version", "")
    if version in ("1", "2"):
        raise StatsFormatError(
            f"{str(path)!r} has schema version {version} but a {key}, which version "
            f"{HOLDOUT_SCHEMA_VERSION} introduced; it is corrupt, re-create it with ghofl"
        )
    return raw
