"""The safetensors container of ghofl files: writing, and reading that trusts nothing.

A file is an 8-byte little-endian header length, a JSON header (``__metadata__`` strings and a
table of every tensor's dtype, shape and data offsets) and the data section; ghofl adds the
``content_sha256`` entry (:data:`DIGEST_KEY`). The checks here are structural (a regular file,
header size and JSON, dtypes, shapes, byte spans); the format tag, the schema version and the
digest are checked by :func:`ghofl.stats.codec.read_safetensors`.
"""

from __future__ import annotations

import hashlib
import json
import os
import stat
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
from numpy.typing import NDArray

from ghofl.errors import GhoflError, StatsFormatError, WriteError
from ghofl.files import atomic_write
from ghofl.stats._json import MAX_HEADER_BYTES, parse_json

__all__ = [
    "DIGEST_KEY",
    "DTYPES",
    "DTYPE_NAMES",
    "STATS_DTYPES",
    "HeaderCheck",
    "TensorInfo",
    "header_digest",
    "read_container",
    "read_header",
    "tensor_views",
    "write_safetensors",
]


#: Header key holding the SHA-256 (hex) of the data section.
DIGEST_KEY = "content_sha256"
#: Dtypes ghofl reads and writes, safetensors name to little-endian numpy dtype.
DTYPES: dict[str, np.dtype[Any]] = {"F64": np.dtype("<f8"), "I64": np.dtype("<i8")}
#: Dtypes of statistics files (float32 transport of the float sums adds ``F32``).
STATS_DTYPES: dict[str, np.dtype[Any]] = {**DTYPES, "F32": np.dtype("<f4")}
#: Safetensors name of each dtype of :data:`STATS_DTYPES` (little-endian numpy dtype to name).
DTYPE_NAMES: dict[np.dtype[Any], str] = {v: k for k, v in STATS_DTYPES.items()}
_MAX_NDIM = 4
_CHUNK = 1 << 24


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
        if dtype not in DTYPE_NAMES:
            raise StatsFormatError(
                f"cannot write array {name!r} of dtype {arr.dtype}; ghofl files hold only "
                f"{', '.join(str(d) for d in STATS_DTYPES.values())} arrays"
            )
        arrays.append((name, np.ascontiguousarray(arr, dtype=dtype).reshape(arr.shape)))
    table: dict[str, Any] = {}
    offset = 0
    for name, arr in arrays:
        table[name] = {
            "dtype": DTYPE_NAMES[arr.dtype],
            "shape": list(arr.shape),
            "data_offsets": [offset, offset + arr.nbytes],
        }
        offset += arr.nbytes
    plain = {k: v for k, v in metadata.items() if k != DIGEST_KEY}
    digest = header_digest(plain, table)
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


@dataclass(frozen=True)
class TensorInfo:
    """One tensor as declared by a safetensors header (checked against the file)."""

    dtype: str
    shape: tuple[int, ...]
    begin: int
    end: int


#: Check of the header before any data is read: ``(metadata, tensors)``; raises GhoflError.
HeaderCheck = Callable[[dict[str, str], dict[str, TensorInfo]], None]


def tensor_views(data: NDArray[np.uint8], table: Mapping[str, TensorInfo]
                 ) -> dict[str, NDArray[Any]]:
    """The tensors of ``table`` in the data section ``data`` (:func:`read_container`).

    Views of ``data`` in native byte order where it is little-endian (copies otherwise), by
    name, with the dtypes and shapes the table declares.
    """
    return {name: _tensor(data, t) for name, t in table.items()}


def read_container(
    p: Path, what: str, dtypes: Mapping[str, np.dtype[Any]], check: HeaderCheck,
    buffer: NDArray[np.uint8] | None = None,
) -> tuple[dict[str, str], dict[str, TensorInfo], NDArray[np.uint8]]:
    """Read a safetensors file, trusting nothing in it; the digest is left to the caller.

    The file must be a regular file; its header length, JSON, dtypes (of ``dtypes``), shapes
    and byte spans (contiguous, covering exactly the rest of the file) are checked, then
    ``check(metadata, tensors)`` runs, all before any data byte is read.

    Parameters
    ----------
    p : Path
        The file.
    what : str
        What the file is, for messages (``"statistics"``, ``"head"``).
    dtypes : mapping of str to dtype
        The safetensors dtypes accepted.
    check : callable
        The caller's checks of the header; raises to refuse the file.
    buffer : ndarray of uint8, shape (m,), optional
        Where to read the data section when it holds at least its n bytes (``data`` is then
        ``buffer[:n]``, and every tensor view keeps ``buffer`` alive); else a new array. The
        caller must not read or write it while the file is read.

    Returns
    -------
    metadata : dict of str to str
        The ``__metadata__`` section.
    tensors : dict of str to TensorInfo
        The declared tensors.
    data : ndarray of uint8, shape (n,)
        The data section (:func:`tensor_views` reads the tensors out of it).

    Raises
    ------
    StatsFormatError
        Missing, not a regular file, truncated, oversized or structurally corrupt.
    """
    fd = _open_regular(p, what)
    with os.fdopen(fd, "rb") as f:
        size = os.fstat(f.fileno()).st_size
        metadata, table, data_start = _read_header(f, p, size, what, dtypes)
        check(metadata, table)
        data = _read_data(f, p, size - data_start, what, buffer)
    return metadata, table, data


def read_header(
    p: Path, what: str, dtypes: Mapping[str, np.dtype[Any]], check: HeaderCheck
) -> tuple[dict[str, str], dict[str, TensorInfo]]:
    """The checked header of a safetensors file; no byte of the data section is read.

    :func:`read_container` without the data: the same structural checks, then ``check``.
    What a reader runs before hashing or reading a file whose header may declare sizes
    that its format's schema does not allow.

    Returns
    -------
    metadata : dict of str to str
        The ``__metadata__`` section.
    tensors : dict of str to TensorInfo
        The declared tensors.

    Raises
    ------
    StatsFormatError
        As :func:`read_container` (and whatever ``check`` raises).
    """
    fd = _open_regular(p, what)
    with os.fdopen(fd, "rb") as f:
        size = os.fstat(f.fileno()).st_size
        metadata, table, _ = _read_header(f, p, size, what, dtypes)
    check(metadata, table)
    return metadata, table


def _tensor(data: NDArray[np.uint8], t: TensorInfo) -> NDArray[Any]:
    dtype = STATS_DTYPES[t.dtype]
    n = _prod(t.shape)
    if n == 0:
        return np.zeros(t.shape, dtype.newbyteorder("="))
    arr = np.frombuffer(data, dtype, n, t.begin).reshape(t.shape)
    return arr.astype(dtype.newbyteorder("="), copy=False)


def header_digest(metadata: dict[str, str], table: dict[str, Any]) -> Any:
    """SHA-256 state after the canonical header JSON and the NUL separator.

    Feeding it the data section gives the ``content_sha256`` of a file with header
    ``metadata`` (without :data:`DIGEST_KEY`) and tensor ``table`` (name -> ``dtype``,
    ``shape``, ``data_offsets``, as in the file's header).
    """
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


def _read_header(
    f: Any, p: Path, size: int, what: str, dtypes: Mapping[str, np.dtype[Any]] = DTYPES
) -> tuple[dict[str, str], dict[str, TensorInfo], int]:
    prefix = f.read(8)
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
    doc = _parse_header(f, n, p, what)
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


def _parse_header(f: Any, n: int, p: Path, what: str) -> Any:
    """The JSON of the ``n``-byte header at ``f``'s position, in about twice ``n`` of memory.

    The bytes are read into one buffer (no chunks joined), decoded, and dropped before the
    JSON is parsed: at most the bytes and their text, then the text and what it parses to,
    are alive at once.
    """
    raw = f.read(n)  # one allocation of n bytes
    if len(raw) != n:
        raise _corrupt(p, what, f"the header ended after {len(raw)} of {n} bytes")
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise _corrupt(p, what, f"the header is not UTF-8 ({exc.reason})") from None
    del raw
    try:
        return parse_json(text, "the header", "re-create it with ghofl")
    except StatsFormatError as exc:
        raise _corrupt(p, what, str(exc).split(";")[0]) from None


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


def _read_data(f: Any, p: Path, n: int, what: str,
               buffer: NDArray[np.uint8] | None = None) -> NDArray[np.uint8]:
    """The ``n`` bytes of the data section, read straight into one uninitialised buffer.

    ``buffer[:n]`` when ``buffer`` holds at least ``n`` bytes, else a new array. No zero
    fill, no joined copies: the tensors are views of it.
    """
    data = buffer[:n] if buffer is not None and buffer.size >= n else np.empty(n, np.uint8)
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
