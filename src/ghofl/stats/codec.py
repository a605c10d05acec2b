"""Versioned on-disk format of :class:`ClientStats` (file extension ``.ghs``).

Format: a `safetensors <https://github.com/huggingface/safetensors>`_ file. We chose it over
``npz`` because its header is plain JSON followed by raw little-endian buffers (no pickle, no
zip), it is readable from Rust/JS/C++ without numpy, it loads lazily tensor by tensor, and its
length-prefixed header makes truncation detectable before any data is trusted.

* header metadata: ``format = "ghofl.stats"``, ``schema_version``, ``meta`` (JSON of
  :class:`StatsMeta`, including the clipping bound ``clip_norm``) and ``n_clipped`` (decimal
  count of clipped samples; absent in version-1 files, read as 0);
* tensors: the arrays of the mode's :class:`~ghofl.stats.schema.ModeSchema` under their
  ``stored_name``: ``counts`` int64 (C,), ``sums`` float64 (C, d), and by mode ``sq_sums``
  (C, d), ``class_scatter_triu`` (C, d(d+1)/2) and ``scatter_triu`` (d(d+1)/2,): symmetric
  matrices travel as their upper triangles in row-major order (``numpy.triu_indices``), which
  halves them.

Schema version 2 added ``clip_norm`` and ``n_clipped``; version-1 files still load (as unclipped
statistics, upgraded to the current version so they combine with new payloads).

Writes are atomic (:func:`ghofl.files.atomic_write`: a temporary file in the target folder,
then ``os.replace``); ``atomic_write`` is re-exported here for older imports.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from numpy.typing import NDArray

from ghofl.errors import GhoflError, StatsFormatError
from ghofl.files import atomic_write
from ghofl.stats.client_stats import ClientStats
from ghofl.stats.meta import MIN_SCHEMA_VERSION, SCHEMA_VERSION, StatsMeta
from ghofl.stats.schema import pack_upper, schema_for, unpack_upper

__all__ = [
    "FORMAT",
    "MIN_SCHEMA_VERSION",
    "atomic_write",
    "expected_payload_nbytes",
    "load_stats",
    "pack_upper",
    "payload_nbytes",
    "read_safetensors",
    "save_stats",
    "stats_from_tensors",
    "stats_tensors",
    "unpack_upper",
]

FORMAT = "ghofl.stats"


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


def save_stats(stats: ClientStats, path: str | os.PathLike[str]) -> int:
    """Write ``stats`` to ``path`` atomically; return the file size in bytes."""
    from safetensors.numpy import save_file

    meta = {
        "format": FORMAT,
        "schema_version": str(SCHEMA_VERSION),
        "meta": json.dumps(stats.meta.to_dict(), sort_keys=True),
        "n_clipped": str(stats.n_clipped),
    }
    tensors = stats_tensors(stats)
    atomic_write(path, lambda tmp: save_file(tensors, tmp, metadata=meta))
    return Path(path).stat().st_size


def read_safetensors(
    path: str | os.PathLike[str], expected_format: str, what: str
) -> tuple[dict[str, str], dict[str, NDArray[Any]]]:
    """Read a ghofl safetensors file, checking its format tag and schema version."""
    from safetensors import SafetensorError, safe_open

    p = Path(path)
    if not p.exists():
        raise StatsFormatError(f"{what} file {str(p)!r} does not exist; check the path")
    if p.is_dir():
        raise StatsFormatError(f"{what} path {str(p)!r} is a directory; give a file")
    try:
        with safe_open(str(p), framework="np") as f:
            header = f.metadata() or {}
            _check_header(header, p, expected_format, what)
            tensors = {k: f.get_tensor(k) for k in f.keys()}  # noqa: SIM118
    except (SafetensorError, OSError, ValueError) as exc:
        if isinstance(exc, GhoflError):
            raise
        raise StatsFormatError(
            f"{str(p)!r} is not a readable ghofl {what} file (it is truncated, corrupt or of "
            f"another format: {exc}); re-create it with ghofl"
        ) from exc
    return header, tensors


def _check_header(header: dict[str, str], p: Path, expected: str, what: str) -> None:
    fmt = header.get("format")
    if fmt != expected:
        raise StatsFormatError(
            f"{str(p)!r} is not a ghofl {what} file (format tag {fmt!r}, expected {expected!r})"
        )
    try:
        version = int(header.get("schema_version", "-1"))
    except ValueError:
        version = -1
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


def load_stats(path: str | os.PathLike[str]) -> ClientStats:
    """Read and validate statistics written by :func:`save_stats`."""
    header, tensors = read_safetensors(path, FORMAT, "statistics")
    try:
        meta_dict = json.loads(header["meta"])
    except (KeyError, json.JSONDecodeError) as exc:
        raise StatsFormatError(f"{str(path)!r} has a missing or corrupt metadata header") from exc
    meta = StatsMeta.from_dict(meta_dict)
    n_clipped = _header_n_clipped(header, path)
    try:
        return stats_from_tensors(meta, tensors, n_clipped)
    except StatsFormatError as exc:
        raise StatsFormatError(f"{str(path)!r} holds malformed statistics: {exc}") from exc


def _header_n_clipped(header: dict[str, str], path: str | os.PathLike[str]) -> int:
    """The ``n_clipped`` header value (0 when absent, as in version-1 files)."""
    raw = header.get("n_clipped", "0")
    if not (raw.isascii() and raw.isdigit()):
        raise StatsFormatError(
            f"{str(path)!r} has header n_clipped {raw!r}; expected a non-negative decimal "
            "integer; the file is corrupt, re-create it with ghofl"
        )
    return int(raw)
