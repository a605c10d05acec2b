"""Versioned on-disk format of :class:`ClientStats` (file extension ``.ghs``).

Format: a `safetensors <https://github.com/huggingface/safetensors>`_ file. We chose it over
``npz`` because its header is plain JSON followed by raw little-endian buffers (no pickle, no
zip), it is readable from Rust/JS/C++ without numpy, it loads lazily tensor by tensor, and its
length-prefixed header makes truncation detectable before any data is trusted.

* header metadata: :class:`~ghofl.stats.header.StatsHeader` in its file spelling (declared,
  rendered and parsed there, shared with the Flower records): ``format = "ghofl.stats"``,
  ``schema_version``, ``meta`` (JSON of :class:`StatsMeta`, including the clipping bound
  ``clip_norm``), ``n_clipped`` (decimal count of clipped samples; absent in version-1
  files, read as 0), the optional entries below, and ``content_sha256``;
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
the file) and the expected tensor names, dtypes and shapes (the schema of the declared mode,
C, d and held-out section) are checked before any tensor byte is read or hashed, so a header
that declares huge sizes or an extra tensor is refused at the cost of the header, without
allocating or hashing them; :func:`read_stats_header` runs these checks alone.

Writes are atomic (:func:`ghofl.files.atomic_write`: a temporary file in the target folder,
then ``os.replace``); ``atomic_write`` is re-exported here for older imports, as are the names of
:mod:`ghofl.stats.container` (the safetensors container) and :mod:`ghofl.stats.transport` (the
arrays as they travel).
"""

from __future__ import annotations

import os
import re
import sys
import warnings
from collections.abc import Callable, Generator, Iterable, Iterator, Mapping
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from pathlib import Path
from typing import Any, TypeVar

import numpy as np
from numpy.typing import NDArray

from ghofl.errors import GhoflError, GhoflWarning, StatsFormatError
from ghofl.files import atomic_write
from ghofl.stats._json import (
    MAX_HEADER_BYTES,
    MAX_JSON_VALUES,
    parse_json,
)
from ghofl.stats.client_stats import ClientStats
from ghofl.stats.client_stats.packed import PackedStats
from ghofl.stats.container import (
    DIGEST_KEY,
    DTYPES,
    STATS_DTYPES,
    HeaderCheck,
    TensorInfo,
    header_digest,
    read_container,
    read_header,
    tensor_views,
    write_safetensors,
)
from ghofl.stats.header import FORMAT, StatsHeader, check_envelope, meta_from_entries
from ghofl.stats.meta import MIN_SCHEMA_VERSION, SCHEMA_VERSION, StatsMeta
from ghofl.stats.schema import pack_upper, unpack_upper
from ghofl.stats.transport import (
    DeclaredArray,
    check_declared_arrays,
    expected_payload_nbytes,
    payload_nbytes,
    rounding_name,
    stats_from_tensors,
    stats_tensors,
    through_transport,
    transport_dtype_name,
)

__all__ = [
    "DIGEST_KEY",
    "FORMAT",
    "MAX_HEADER_BYTES",
    "MAX_JSON_VALUES",
    "MIN_SCHEMA_VERSION",
    "TensorInfo",
    "atomic_write",
    "expected_payload_nbytes",
    "iter_packed_stats",
    "load_packed_stats",
    "load_stats",
    "pack_upper",
    "parse_json",
    "payload_nbytes",
    "read_safetensors",
    "read_stats_file",
    "read_stats_header",
    "rounding_name",
    "save_stats",
    "stats_from_tensors",
    "stats_tensors",
    "through_transport",
    "transport_dtype_name",
    "unpack_upper",
    "write_safetensors",
]


T = TypeVar("T")

#: Header metadata keys of a statistics file (besides :data:`DIGEST_KEY`): the file spelling
#: of :class:`~ghofl.stats.header.StatsHeader`.
STATS_KEYS = StatsHeader.keys("file")


# ---------------------------------------------------------------------- writing
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
    header = StatsHeader.of(stats, transport_dtype)
    return write_safetensors(path, stats_tensors(stats, header.transport_dtype),
                             header.to_entries("file"))


# ---------------------------------------------------------------------- reading
def read_safetensors(
    path: str | os.PathLike[str],
    expected_format: str,
    what: str,
    check: HeaderCheck | None = None,
    keys: frozenset[str] | None = None,
    dtypes: Mapping[str, np.dtype[Any]] = DTYPES,
) -> tuple[dict[str, str], dict[str, NDArray[Any]]]:
    """Read a ghofl safetensors file, trusting nothing in it.

    :func:`read_safetensors_into` returning the tensors themselves; the parameters, returns
    and errors are its own.
    """
    return read_safetensors_into(path, expected_format, what, lambda _, t: t, check, keys,
                                 dtypes, stacklevel=4)


def read_safetensors_into(
    path: str | os.PathLike[str],
    expected_format: str,
    what: str,
    build: Callable[[dict[str, str], dict[str, NDArray[Any]]], T],
    check: HeaderCheck | None = None,
    keys: frozenset[str] | None = None,
    dtypes: Mapping[str, np.dtype[Any]] = DTYPES,
    stacklevel: int = 3,
) -> tuple[dict[str, str], T]:
    """Read a ghofl safetensors file, trusting nothing in it, and build a value from it.

    ``build(header, tensors)`` (e.g. unpacking and validating statistics) runs while the data
    digest is computed in another thread (hashlib releases the GIL); the value is returned
    only once the digest matched, and a file whose digest does not match is refused as
    corrupt whatever ``build`` did (its error is raised only for a file that is intact).

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

    build : callable
        ``build(header, tensors)``: the value to return; ``tensors`` are the arrays (float64,
        float32 or int64, native byte order), views of one buffer.
    stacklevel : int, default 3
        Of the warning for a file without a digest.

    Returns
    -------
    header : dict of str to str
        The ``__metadata__`` section.
    value
        What ``build`` returned.

    Raises
    ------
    StatsFormatError
        Missing, not a regular file, truncated, oversized, foreign, corrupt (including a
        data digest mismatch) or of an unsupported version.
    """
    p = Path(path)
    checked = _header_check(p, expected_format, what, check, keys)
    header, table, data = read_container(p, what, dtypes, checked)
    expected = header.get(DIGEST_KEY)
    if expected is None:
        _warn_no_digest(p, stacklevel + 1)
        return header, build(header, tensor_views(data, table))
    h = _digest_of_header(header, table)
    with ThreadPoolExecutor(max_workers=1) as pool:  # hashlib releases the GIL
        hashed = pool.submit(h.update, data)
        try:
            built = build(header, tensor_views(data, table))
        except Exception:
            hashed.result()
            _check_digest(h.hexdigest(), expected, p)  # a changed file is refused as such
            raise
        hashed.result()
    _check_digest(h.hexdigest(), expected, p)
    return header, built


def _warn_no_digest(p: Path, stacklevel: int) -> None:
    warnings.warn(
        f"{str(p)!r} has no {DIGEST_KEY} integrity digest (it was written by an older "
        "ghofl), so its bytes could not be verified; re-save it with this ghofl to add one",
        GhoflWarning,
        stacklevel=stacklevel,
    )


def _digest_of_header(header: dict[str, str], table: dict[str, TensorInfo]) -> Any:
    """The SHA-256 state over a file's canonical header, to be updated with its data."""
    plain = {k: v for k, v in header.items() if k != DIGEST_KEY}
    canon = {name: {"dtype": t.dtype, "shape": list(t.shape),
                    "data_offsets": [t.begin, t.end]} for name, t in table.items()}
    return header_digest(plain, canon)


def _header_check(p: Path, expected_format: str, what: str, check: HeaderCheck | None,
                  keys: frozenset[str] | None) -> HeaderCheck:
    """The checks of a ghofl file's header: envelope, digest syntax, keys, then ``check``."""

    def checked(header: dict[str, str], table: dict[str, TensorInfo]) -> None:
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

    return checked


def _check_digest(actual: str, expected: str, p: Path) -> None:
    if actual != expected:
        raise StatsFormatError(
            f"{str(p)!r} is corrupt: the SHA-256 of its content is {actual[:16]}… but its "
            f"header records {expected[:16]}…; its bytes changed after ghofl wrote it; "
            "re-create or re-download the file"
        )


def _check_header(header: dict[str, str], p: Path, expected: str, what: str) -> None:
    check_envelope(header, repr(str(p)), expected, what, SCHEMA_VERSION)
    digest = header.get(DIGEST_KEY)
    if digest is not None and not re.fullmatch(r"[0-9a-f]{64}", digest):
        raise StatsFormatError(
            f"{str(p)!r} has a malformed {DIGEST_KEY} header ({digest[:80]!r}); expected 64 "
            "lowercase hex digits; the file is corrupt, re-create it with ghofl"
        )


def header_meta(header: dict[str, str], path: str | os.PathLike[str]) -> StatsMeta:
    """The :class:`StatsMeta` of the ``meta`` header entry, parsed defensively.

    The ``meta`` field of :class:`~ghofl.stats.header.StatsHeader` in the file spelling (head
    files carry it too).
    """
    return meta_from_entries(header, "file", repr(str(path)))


def load_stats(path: str | os.PathLike[str]) -> ClientStats:
    """Read and validate statistics written by :func:`save_stats`.

    The tensor names, dtypes and shapes are checked against the header metadata (mode, C,
    d, held-out section, transport dtype) before any data is read. Float32-transported sums
    are returned as float64.
    """
    return read_stats_file(path)[0]


def read_stats_header(path: str | os.PathLike[str]) -> StatsHeader:
    """The header of a statistics file, checked against its schema; no data byte is read.

    Everything :func:`load_stats` checks before reading data: a regular file, the header's
    structure, format, version and keys, and the declared tensors (names, dtypes, shapes
    and byte ranges) against the schema of the declared mode, C, d and held-out section.
    What a command runs before it reads or hashes a payload's bytes, so that a file
    declaring a huge extra tensor is refused at the cost of its header.

    Raises
    ------
    StatsFormatError
        As :func:`load_stats` for a header that does not match its schema.
    """
    state: dict[str, StatsHeader] = {}
    p = Path(path)
    read_header(p, "statistics", STATS_DTYPES,
                _header_check(p, FORMAT, "statistics", _stats_check(path, state), STATS_KEYS))
    return state["header"]


def _stats_check(path: str | os.PathLike[str], state: dict[str, StatsHeader]) -> HeaderCheck:
    """The statistics header check: parse it into ``state["header"]``, then its layout."""

    def check(header: dict[str, str], table: dict[str, TensorInfo]) -> None:
        parsed = StatsHeader.from_entries(header, "file", repr(str(path)))
        state["header"] = parsed
        _check_stats_layout(parsed.meta, table, path, parsed.transport_dtype)

    return check


def read_stats_file(path: str | os.PathLike[str]) -> tuple[ClientStats, str]:
    """:func:`load_stats`, also returning the file's transport dtype.

    ``"float64"`` or ``"float32"``.
    """
    state: dict[str, StatsHeader] = {}
    check = _stats_check(path, state)

    def build(_: dict[str, str], tensors: dict[str, NDArray[Any]]) -> ClientStats:
        with _naming(path):
            return state["header"].stats_from(tensors)

    _, stats = read_safetensors_into(path, FORMAT, "statistics", build, check, STATS_KEYS,
                                     STATS_DTYPES)
    return stats, state["header"].transport_dtype


def load_packed_stats(path: str | os.PathLike[str]) -> PackedStats:
    """:func:`load_stats`, keeping the symmetric matrices packed, as the file holds them.

    For a server that only adds payloads: every check of :func:`load_stats` runs, with the
    same messages, on the packed triangles, and :class:`~ghofl.stats.StatsTotal` adds the
    result without unpacking it (``sum_stats(load_packed_stats(p) for p in paths)`` equals
    ``sum_stats(load_stats(p) for p in paths)`` bit for bit). :meth:`PackedStats.unpack`
    gives the :class:`ClientStats`. Statistics with noise levels in their header (a central
    DP release) are refused: read them with :func:`load_stats`.

    Raises
    ------
    StatsFormatError, StatsValidationError
        As :func:`load_stats`.
    """
    state: dict[str, StatsHeader] = {}
    check = _stats_check(path, state)

    def build(_: dict[str, str], tensors: dict[str, NDArray[Any]]) -> PackedStats:
        return _packed_build(path, state["header"], tensors)

    return read_safetensors_into(path, FORMAT, "statistics", build, check, STATS_KEYS,
                                 STATS_DTYPES)[1]


def iter_packed_stats(paths: Iterable[str | os.PathLike[str]]
                      ) -> Generator[PackedStats, None, None]:
    """:func:`load_packed_stats` of each file in turn, the next one read ahead.

    While one file is validated (its positive semi-definiteness checks run on every core),
    the next is read and its SHA-256 computed in a second thread. What ``sum_stats`` of many
    payload files runs fastest on::

        total = sum_stats(iter_packed_stats(paths))

    Every file gets every check of :func:`load_packed_stats`, with the same messages (naming
    the file as given), its digest compared before any of its values is checked, and the
    files are yielded in order. Memory: the payload being checked and the one being read;
    a caller that keeps the payload it was given (a loop variable) holds a third. Their data
    buffers are recycled: a file is read into the buffer of an earlier one once nothing
    references that buffer any more (no array of its payload is alive), so a caller that
    drops each payload, as ``sum_stats`` does, has three buffers allocated in all, not one per
    file (a fresh buffer costs a page fault per page, far more on a machine whose free memory
    is fragmented); a payload the caller keeps is never overwritten.

    A file that is refused raises in its turn, after the files before it were yielded; the
    exception carries a note naming the file and its place in ``paths``. The file being read
    ahead is then dropped, as it is when the caller stops early: nothing waits for it.

    Raises
    ------
    TypeError
        ``paths`` is one path (a string or path-like), not an iterable of them.
    StatsFormatError, StatsValidationError
        As :func:`load_packed_stats`, for the first file refused.
    """
    if isinstance(paths, str | bytes | os.PathLike):
        raise TypeError(
            f"iter_packed_stats takes an iterable of paths, not one path ({str(paths)!r}); "
            "pass [path]"
        )
    todo = list(paths)
    pool = ThreadPoolExecutor(max_workers=1)
    buffers: list[NDArray[np.uint8]] = []

    def read_ahead(path: str | os.PathLike[str]) -> Any:
        return pool.submit(_read_hashed_stats, path, _free_buffer(buffers, _file_size(path)))

    ahead = read_ahead(todo[0]) if todo else None
    try:
        for k, p in enumerate(todo):
            assert ahead is not None
            try:
                read = ahead.result()
                _keep_buffer(buffers, read[2])
                ahead = read_ahead(todo[k + 1]) if k + 1 < len(todo) else None
                stats = _packed_from_read(p, *read)
            except GhoflError as exc:
                exc.add_note(f"(payload file #{k} of {len(todo)}: {str(p)!r})")
                raise
            yield stats
    finally:
        if ahead is not None:
            ahead.cancel()
        pool.shutdown(wait=False, cancel_futures=True)


#: Data buffers :func:`iter_packed_stats` keeps for reuse: the file read ahead, the payload
#: being checked and the one its caller holds (a loop variable).
_RECYCLED_BUFFERS = 3


def _free_buffer(buffers: list[NDArray[np.uint8]], size: int | None = None
                 ) -> NDArray[np.uint8] | None:
    """The smallest buffer of ``buffers`` that nothing else references, or ``None``.

    Every array of a payload read into a buffer is a view holding a reference to it, so a
    buffer whose only references are the list's and this call's (CPython's reference count
    2) has no payload array alive and can be read into again. With ``size`` (the bytes of
    the file to read), only a buffer of at most twice that many bytes: a small payload the
    caller keeps never pins a much larger buffer.
    """
    free = [i for i in range(len(buffers)) if sys.getrefcount(buffers[i]) == 2
            and (size is None or buffers[i].size <= 2 * size)]
    return min((buffers[i] for i in free), key=lambda b: b.size, default=None)


def _file_size(path: str | os.PathLike[str]) -> int | None:
    """Bytes of the file ``path`` (``None`` when it cannot be read: its read then says why)."""
    try:
        return os.stat(path).st_size
    except OSError:
        return None


def _keep_buffer(buffers: list[NDArray[np.uint8]], data: NDArray[np.uint8]) -> None:
    """Keep the buffer ``data`` was read into, at most :data:`_RECYCLED_BUFFERS` in all.

    A new buffer replaces a free one when the list is full (a larger payload came); with
    none free it is not kept.
    """
    owner = data if data.base is None else data.base
    if any(b is owner for b in buffers) or not isinstance(owner, np.ndarray):
        return
    if len(buffers) >= _RECYCLED_BUFFERS:
        free = _free_buffer(buffers)
        if free is None:
            return
        del buffers[next(i for i, b in enumerate(buffers) if b is free)]
    buffers.append(owner)


def _read_hashed_stats(path: str | os.PathLike[str], buffer: NDArray[np.uint8] | None = None,
                       ) -> tuple[StatsHeader, dict[str, TensorInfo], Any, str | None, str]:
    """A statistics file's checked header, tensors and data, with its digests.

    The digest its header records (``None`` for a file of an older ghofl, which records
    none) and the SHA-256 of its content (``""`` when none is recorded). Messages name the
    file as ``path`` spells it. The data is read into ``buffer`` when it is large enough
    (:func:`~ghofl.stats.container.read_container`).
    """
    p = Path(path)
    state: dict[str, StatsHeader] = {}
    checked = _header_check(p, FORMAT, "statistics", _stats_check(path, state), STATS_KEYS)
    header, table, data = read_container(p, "statistics", STATS_DTYPES, checked, buffer)
    expected = header.get(DIGEST_KEY)
    if expected is None:
        return state["header"], table, data, None, ""
    h = _digest_of_header(header, table)
    h.update(data)
    return state["header"], table, data, expected, h.hexdigest()


def _packed_from_read(path: str | os.PathLike[str], header: StatsHeader,
                      table: dict[str, TensorInfo], data: Any, expected: str | None,
                      actual: str) -> PackedStats:
    """The statistics of a file read by :func:`_read_hashed_stats`, once its digest matched."""
    p = Path(path)
    if expected is None:
        _warn_no_digest(p, 4)
    else:
        _check_digest(actual, expected, p)
    return _packed_build(path, header, tensor_views(data, table))


def _packed_build(path: str | os.PathLike[str], header: StatsHeader,
                  tensors: dict[str, NDArray[Any]]) -> PackedStats:
    """:class:`PackedStats` of a file's header and tensors (a DP release refused)."""
    if header.noise_sigma:
        raise StatsFormatError(
            f"{str(path)!r} holds a differentially private release (noise levels in its "
            "header), not a payload to add; read it with load_stats"
        )
    with _naming(path):
        return header.packed_stats_from(tensors)


@contextmanager
def _naming(path: str | os.PathLike[str]) -> Iterator[None]:
    """Re-raise a :class:`StatsFormatError` of the arrays with the file named in it."""
    try:
        yield
    except StatsFormatError as exc:
        raise StatsFormatError(f"{str(path)!r} holds malformed statistics: {exc}") from exc


def _check_stats_layout(
    meta: StatsMeta, table: dict[str, TensorInfo], path: str | os.PathLike[str],
    transport: str = "float64",
) -> None:
    """The declared tensors against the mode's schema (:func:`check_declared_arrays`)."""
    declared = {name: DeclaredArray(t.dtype, t.shape) for name, t in table.items()}
    check_declared_arrays(meta, declared, transport=transport, dtypes=STATS_DTYPES,
                          where=f"{str(path)!r} holds malformed statistics: ")
