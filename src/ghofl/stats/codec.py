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
import math
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

from ghofl.errors import GhoflError, StatsFormatError, WriteError
from ghofl.files import atomic_write
from ghofl.stats.client_stats import ClientStats
from ghofl.stats.meta import MIN_SCHEMA_VERSION, SCHEMA_VERSION, StatsMeta
from ghofl.stats.schema import pack_upper, schema_for, unpack_upper

__all__ = [
    "DIGEST_KEY",
    "FORMAT",
    "MAX_HEADER_BYTES",
    "MIN_SCHEMA_VERSION",
    "TensorInfo",
    "atomic_write",
    "expected_payload_nbytes",
    "load_stats",
    "pack_upper",
    "parse_json",
    "payload_nbytes",
    "read_safetensors",
    "save_stats",
    "stats_from_tensors",
    "stats_tensors",
    "unpack_upper",
    "write_safetensors",
]

FORMAT = "ghofl.stats"
#: Header metadata keys of a statistics file (besides :data:`DIGEST_KEY`).
STATS_KEYS = frozenset({"format", "schema_version", "meta", "n_clipped"})
#: Header key holding the SHA-256 (hex) of the data section.
DIGEST_KEY = "content_sha256"
#: Largest header accepted (the JSON between the length prefix and the data).
MAX_HEADER_BYTES = 100 * 1024 * 1024
#: Deepest JSON nesting accepted in a header or in a JSON value inside it.
MAX_JSON_DEPTH = 32
#: Longest decimal integer accepted in header JSON.
MAX_INT_DIGITS = 40
#: Dtypes ghofl reads and writes, safetensors name to little-endian numpy dtype.
DTYPES: dict[str, np.dtype[Any]] = {"F64": np.dtype("<f8"), "I64": np.dtype("<i8")}
_NAMES = {v: k for k, v in DTYPES.items()}
_MAX_NDIM = 4
_CHUNK = 1 << 24


# ---------------------------------------------------------------------- safe JSON
class _JSONRefused(ValueError):
    """Raised inside :func:`parse_json` hooks."""


def _refuse_constant(name: str) -> Any:
    raise _JSONRefused(f"the non-standard number {name}")


def _parse_int(text: str) -> int:
    digits = len(text.lstrip("-"))
    if digits > MAX_INT_DIGITS:
        raise _JSONRefused(f"an integer of {digits} digits (at most {MAX_INT_DIGITS})")
    return int(text)


def _parse_float(text: str) -> float:
    if len(text) > 64:
        raise _JSONRefused(f"a number written with {len(text)} characters (at most 64)")
    value = float(text)
    if not math.isfinite(value):
        raise _JSONRefused(f"the number {text} that overflows a float64")
    return value


def _no_duplicates(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, value in pairs:
        if key in out:
            raise _JSONRefused(f"the key {key!r} twice")
        out[key] = value
    return out


_STRING = re.compile(r'"(?:[^"\\]|\\.)*"', re.DOTALL)
_BRACKET = re.compile(r"[\[\]{}]")


def _json_depth(text: str) -> int:
    depth = deepest = 0
    for m in _BRACKET.finditer(_STRING.sub("", text)):
        if m.group() in "[{":
            depth += 1
            deepest = max(deepest, depth)
            if deepest > MAX_JSON_DEPTH:
                break
        else:
            depth -= 1
    return deepest


def parse_json(text: str, what: str, fix: str = "re-create it with ghofl") -> Any:
    """Parse JSON from a file header defensively.

    Refuses text longer than :data:`MAX_HEADER_BYTES`, nesting deeper than
    :data:`MAX_JSON_DEPTH`, NaN/Infinity, numbers that overflow a float64 or have more than
    :data:`MAX_INT_DIGITS` digits, and duplicate keys, with a :class:`StatsFormatError`
    naming ``what`` and ending with ``fix``.
    """
    if len(text) > MAX_HEADER_BYTES:
        raise StatsFormatError(
            f"{what} is {len(text)} characters long, more than the {MAX_HEADER_BYTES} "
            f"allowed; it is corrupt, {fix}"
        )
    depth = _json_depth(text)
    if depth > MAX_JSON_DEPTH:
        raise StatsFormatError(
            f"{what} nests JSON more than {MAX_JSON_DEPTH} levels deep; it is corrupt, {fix}"
        )
    try:
        return json.loads(
            text,
            parse_constant=_refuse_constant,
            parse_int=_parse_int,
            parse_float=_parse_float,
            object_pairs_hook=_no_duplicates,
        )
    except _JSONRefused as exc:
        raise StatsFormatError(f"{what} holds {exc}; it is corrupt, {fix}") from None
    except (ValueError, RecursionError) as exc:
        raise StatsFormatError(
            f"{what} is not valid JSON ({exc}); it is corrupt, {fix}"
        ) from None


# ---------------------------------------------------------------------- tensors
def stats_tensors(stats: ClientStats) -> dict[str, NDArray[Any]]:
    """The arrays that travel for ``stats``, by stored name (symmetric ones packed).

    Returns
    -------
    dict of str to ndarray
        One C-contiguous array per :class:`~ghofl.stats.schema.ArraySpec` of the mode, shape
        :meth:`~ghofl.stats.schema.ArraySpec.packed_shape`.
    """
    return {
        spec.stored_name: spec.pack(getattr(stats, spec.name))
        for spec in schema_for(stats.mode).arrays
    }


def stats_from_tensors(
    meta: StatsMeta, t: dict[str, NDArray[Any]], n_clipped: int = 0
) -> ClientStats:
    """Rebuild :class:`ClientStats` from :func:`stats_tensors` output (validates).

    Parameters
    ----------
    meta : StatsMeta
        Metadata; its mode decides which arrays ``t`` must hold.
    t : dict of str to ndarray
        Exactly the stored arrays of that mode, packed shapes.
    n_clipped : int, default 0
        Number of clipped samples (travels in the header, not as an array).

    Raises
    ------
    StatsFormatError
        An array is missing, unexpected, or of the wrong packed shape.
    StatsValidationError
        The arrays do not form valid statistics.
    """
    schema = schema_for(meta.mode)
    stored = [spec.stored_name for spec in schema.arrays]
    missing = [name for name in stored if name not in t]
    if missing:
        raise StatsFormatError(
            f"statistics payload lacks the array {missing[0]!r}; it is corrupt (mode "
            f"{meta.mode!r} payloads hold {', '.join(stored)})"
        )
    extra = sorted(name for name in t if name not in stored)
    if extra:
        raise StatsFormatError(
            f"statistics payload of mode {meta.mode!r} holds unexpected array(s) "
            f"{', '.join(map(repr, extra))}; it holds exactly {', '.join(stored)}, so it is "
            "corrupt or its metadata names the wrong mode"
        )
    arrays = {
        spec.name: spec.unpack(t[spec.stored_name], meta.num_classes, meta.dim)
        for spec in schema.arrays
    }
    return ClientStats(meta, n_clipped=n_clipped, **arrays)


def payload_nbytes(stats: ClientStats) -> int:
    """Bytes of array data one client uploads for ``stats`` (excluding the small header)."""
    return expected_payload_nbytes(stats.mode, stats.num_classes, stats.dim)


def expected_payload_nbytes(mode: str, num_classes: int, dim: int) -> int:
    """Bytes of array data of a payload of ``mode`` for C classes in dimension d (no allocation).

    full: N + A + C·d(d+1)/2; pooled: N + A + D + d(d+1)/2; diag: N + A + D (8 bytes each);
    see :meth:`~ghofl.stats.schema.ModeSchema.nbytes`.
    """
    return schema_for(mode).nbytes(num_classes, dim)


# ---------------------------------------------------------------------- writing
def write_safetensors(
    path: str | os.PathLike[str], tensors: Mapping[str, NDArray[Any]], metadata: dict[str, str]
) -> int:
    """Write a safetensors file with a ``content_sha256`` header entry, atomically.

    Tensors are laid out in name order; the header is padded with spaces to a multiple of 8
    bytes (as the reference implementation does), so any safetensors reader can read it.
    Only float64 and int64 arrays are written (:data:`DTYPES`).

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
                f"{', '.join(str(d) for d in DTYPES.values())} arrays"
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


def save_stats(stats: ClientStats, path: str | os.PathLike[str]) -> int:
    """Write ``stats`` to ``path`` atomically (with a data digest); return the file size."""
    meta = {
        "format": FORMAT,
        "schema_version": str(SCHEMA_VERSION),
        "meta": json.dumps(stats.meta.to_dict(), sort_keys=True),
        "n_clipped": str(stats.n_clipped),
    }
    return write_safetensors(path, stats_tensors(stats), meta)


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
        header, table, data_start = _read_header(f, p, size, what)
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
        from ghofl.moments.core import GhoflWarning

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


def _tensor(data: bytes, t: TensorInfo) -> NDArray[Any]:
    dtype = DTYPES[t.dtype]
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
    f: Any, p: Path, size: int, what: str
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
    table = {name: _tensor_info(name, entry, p, what) for name, entry in doc.items()}
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


def _tensor_info(name: str, entry: Any, p: Path, what: str) -> TensorInfo:
    if not isinstance(entry, dict) or set(entry) != {"dtype", "shape", "data_offsets"}:
        raise _corrupt(p, what, f"tensor {name!r} is not described by dtype, shape and "
                       "data_offsets")
    dtype, shape, offsets = entry["dtype"], entry["shape"], entry["data_offsets"]
    if dtype not in DTYPES:
        raise _corrupt(p, what, f"tensor {name!r} has dtype {str(dtype)[:20]!r}; ghofl files "
                       f"hold only {', '.join(DTYPES)}")
    if not (isinstance(shape, list) and len(shape) <= _MAX_NDIM
            and all(_is_count(s) for s in shape)):
        raise _corrupt(p, what, f"tensor {name!r} has shape {str(shape)[:60]}; expected a list "
                       f"of at most {_MAX_NDIM} non-negative integers")
    if not (isinstance(offsets, list) and len(offsets) == 2 and all(_is_count(o) for o in offsets)
            and offsets[0] <= offsets[1]):
        raise _corrupt(p, what, f"tensor {name!r} has data_offsets {str(offsets)[:60]}; expected "
                       "[begin, end] with 0 <= begin <= end")
    nbytes = _prod(tuple(shape)) * DTYPES[dtype].itemsize
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


def _read_data(f: Any, p: Path, n: int, what: str) -> bytes:
    data = _read_exact(f, n)
    if len(data) != n:
        raise _corrupt(p, what, f"the data section ended after {len(data)} of {n} bytes")
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
    d) before any data is read.
    """
    state: dict[str, Any] = {}

    def check(header: dict[str, str], table: dict[str, TensorInfo]) -> None:
        meta = header_meta(header, path)
        state["meta"] = meta
        state["n_clipped"] = _header_n_clipped(header, path)
        _check_stats_layout(meta, table, path)

    _, tensors = read_safetensors(path, FORMAT, "statistics", check, STATS_KEYS)
    try:
        return stats_from_tensors(state["meta"], tensors, state["n_clipped"])
    except StatsFormatError as exc:
        raise StatsFormatError(f"{str(path)!r} holds malformed statistics: {exc}") from exc


def _check_stats_layout(
    meta: StatsMeta, table: dict[str, TensorInfo], path: str | os.PathLike[str]
) -> None:
    schema = schema_for(meta.mode)
    stored = [spec.stored_name for spec in schema.arrays]
    where = f"{str(path)!r} holds malformed statistics"
    for name in table:
        if name not in stored:
            raise StatsFormatError(
                f"{where}: statistics payload of mode {meta.mode!r} holds unexpected array(s) "
                f"{name!r}; it holds exactly {', '.join(stored)}, so it is corrupt or its "
                "metadata names the wrong mode"
            )
    for spec in schema.arrays:
        t = table.get(spec.stored_name)
        if t is None:
            raise StatsFormatError(
                f"{where}: statistics payload lacks the array {spec.stored_name!r}; it is "
                f"corrupt (mode {meta.mode!r} payloads hold {', '.join(stored)})"
            )
        want = _NAMES[spec.dtype.newbyteorder("<")]
        if t.dtype != want:
            raise StatsFormatError(
                f"{where}: array {spec.stored_name!r} has dtype {t.dtype} but must be {want}; "
                "the payload is corrupt (integers are never read as floats or back)"
            )
        expected = spec.packed_shape(meta.num_classes, meta.dim)
        if t.shape != expected:
            how = " (row-major upper triangles)" if spec.symmetric else ""
            raise StatsFormatError(
                f"{where}: array {spec.stored_name!r} must have shape {expected}{how} for "
                f"C={meta.num_classes} classes and d={meta.dim}; got {t.shape}; the payload is "
                "corrupt or was written for another class list or dimension"
            )


def _header_n_clipped(header: dict[str, str], path: str | os.PathLike[str]) -> int:
    """The ``n_clipped`` header value (0 when absent, as in version-1 files)."""
    raw = header.get("n_clipped", "0")
    if not (raw.isascii() and raw.isdigit() and len(raw) <= 19):
        raise StatsFormatError(
            f"{str(path)!r} has header n_clipped {raw[:40]!r}; expected a non-negative decimal "
            "integer; the file is corrupt, re-create it with ghofl"
        )
    return int(raw)
